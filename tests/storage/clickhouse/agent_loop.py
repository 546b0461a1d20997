"""The agent loop the ClickHouse engine's tests record (one recording per module): three sessions of
tool loops through the hand API, with what a timeline and the analytics must get right."""

from __future__ import annotations

import pytest

import loopscope


@loopscope.tool
def lookup(key: str) -> str:
    if key.startswith("bad"):
        raise KeyError(key)
    return f"value of {key}"


@loopscope.tool
def convert(amount: int) -> int:
    if amount < 0:
        raise ValueError("negative amount")
    return amount * 2


DECLARED = [{"name": "lookup", "description": "look a key up"}, {"name": "convert"}, {"name": "unused"},
            {"type": "web_search_20250305", "name": "web_search"}]


def record_sessions() -> None:
    """Three sessions of a few turns: tool loops with failed tools, a blocked input, a failed
    model call, declared tools (one never called, one a server tool), text with quotes and
    non-ASCII."""
    for i in range(6):
        session = ("alpha", "beta", "gamma")[i % 3]
        agent = ("planner", "helper")[i % 2]
        with loopscope.turn(session_id=session, agent=agent, input=f"question {i}: \"ünïcode\"\nline",
                            correlation_id=f"turn-{i}", input_blocked=(i == 4)) as t:
            t.declare_tools(DECLARED, origin="always")
            t.generation(f"looking {i}", tool_calls=[{"id": f"c{i}a", "name": "lookup", "arguments": {"key": f"k{i}"}},
                                                     {"id": f"c{i}b", "name": "convert", "arguments": {"amount": i}}],
                         usage={"input_tokens": 10 + i, "output_tokens": 2}, model="scripted-1", provider="scripted")
            lookup(f"k{i}")
            convert(i)
            t.generation(f"again {i}", tool_calls=[{"id": f"c{i}c", "name": "lookup", "arguments": {"key": f"bad{i}"}}],
                         usage={"input_tokens": 20 + i, "output_tokens": 3}, model="scripted-1", provider="scripted")
            with pytest.raises(KeyError):
                lookup(f"bad{i}")
            if i == 2:
                with pytest.raises(ConnectionError), t.round("scripted-1", provider="scripted"):
                    raise ConnectionError("model down")
            t.generation(f"answer {i}", finish_reason="stop", usage={"input_tokens": 30 + i, "output_tokens": 4},
                         model="scripted-1", provider="scripted")


__all__ = ["DECLARED", "record_sessions"]
