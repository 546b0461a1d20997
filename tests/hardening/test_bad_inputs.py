"""Bad input from every side: odd Python values from the application (property-based),
huge values, thousands of tools, garbage from a provider. Each is stored readably or
refused with a clear reason, the user's call sees what it would see without loopscope,
and nothing else is lost."""

from __future__ import annotations

import datetime as dt
import decimal
import json
from typing import Any

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import loopscope
from loopscope import LoopEndReason, _json

from fakes.fixtures import model_server  # noqa: F401 - the fixture
from fakes.model_server import Reply

SURROGATES = st.sampled_from(["\ud800", "\udfff", "a\udc80b"])
TEXT = st.one_of(st.text(max_size=40), SURROGATES, st.just("nul\x00inside"), st.just("\u2028line\u2029sep"))
LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),  # past int64 too
    st.floats(allow_nan=True, allow_infinity=True),
    TEXT,
    st.binary(max_size=20),  # invalid UTF-8 among them
    st.datetimes(timezones=st.sampled_from([None, dt.timezone.utc])),
    st.decimals(allow_nan=False, allow_infinity=False, places=3),
    st.frozensets(st.integers(0, 9), max_size=4),
)
VALUES = st.recursive(
    LEAVES,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.tuples(children, children),
        st.dictionaries(st.one_of(TEXT, st.integers(0, 5)), children, max_size=4),
    ),
    max_leaves=12,
)


class Unprintable:
    def __repr__(self) -> str:
        raise ValueError("no repr for you")

    __str__ = __repr__


def test_any_value_as_arguments_result_and_text_is_stored_readably(recording) -> None:
    written: list[tuple[str, Any]] = []

    @loopscope.tool
    def echo(value: Any) -> Any:
        return value

    @settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(value=VALUES, text=TEXT)
    def record(value: Any, text: str) -> None:
        session = f"prop-{len(written)}"
        with loopscope.turn(session_id=session, input=text) as t:
            t.generation(text, tool_calls=[{"id": "c1", "name": "echo", "arguments": {"value": value}}])
            assert echo(value) is value  # the user's value comes back untouched
            t.generation(text, finish_reason="stop")
        written.append((session, value))

    record()
    assert loopscope.flush()
    store = recording.store
    for session, value in written:
        events = store.get_timeline(session)
        tools = [e for e in events if e.type.startswith("tool_call")]
        assert [e.type for e in tools] == ["tool_call_start", "tool_call_end"]
        end = tools[1].content
        # what was stored is exactly the readable JSON form of the value, nothing lost beside it
        readable = json.loads(_json.dumps(value))
        # compared as JSON text: a NaN is stored as NaN, and NaN != NaN
        assert json.dumps(end.result) == json.dumps(readable)
        assert json.dumps(end.arguments) == json.dumps({"value": readable})
        assert end.outcome == "served"


def test_values_that_refuse_to_print_or_loop_are_stored_readably(recording) -> None:
    cyclic: list[Any] = [1]
    cyclic.append(cyclic)

    @loopscope.tool
    def odd(a: Any, b: Any) -> Any:
        return {"a": a, "b": b}

    with loopscope.turn(session_id="odd") as t:
        t.generation(tool_calls=[{"id": "o1", "name": "odd", "arguments": None}])
        odd(Unprintable(), cyclic)
        t.generation("done", finish_reason="stop")
    end = [e for e in recording.store.get_timeline("odd") if e.type == "tool_call_end"][0].content
    assert end.result["a"].startswith("<unrepresentable Unprintable")
    assert end.result["b"] == [1, "<cycle>"]


def test_a_fifty_megabyte_result_is_stored_capped_with_its_size(recording) -> None:
    huge = "y" * 50_000_000

    @loopscope.tool
    def dump() -> str:
        return huge

    with loopscope.turn(session_id="huge") as t:
        t.generation(tool_calls=[{"id": "h1", "name": "dump", "arguments": {}}])
        assert dump() is huge
        t.generation("ok", finish_reason="stop")
    assert loopscope.flush(timeout=60)
    events = recording.store.get_timeline("huge")
    assert [e.type for e in events] == ["tool_call_start", "tool_call_end", "message"]
    result = events[1].content.result
    assert isinstance(result, str) and result.startswith("yyyy")
    assert len(result) < 2_000_000  # capped, with a marker that says how big it was
    assert "50000000" in result.replace(",", "").replace("_", "")
    assert events[2].content.body == "ok"  # the rest of the turn is all there


def test_thousands_of_tools_are_declared_in_order(recording) -> None:
    tools = [{"name": f"tool_{i:04d}", "description": f"tool number {i}", "parameters": {"type": "object"}} for i in range(5000)]
    with loopscope.turn(session_id="many", tools=tools) as t:
        t.generation("thinking", tool_calls=[{"id": "m1", "name": "tool_0042", "arguments": {}}])  # the turn's 5000
        t.generation("picked none", finish_reason="stop", tools=tools[:10] + [{"name": "late_tool"}])
    response = t.response
    assert [d.name for d in response.declared_tools] == [f"tool_{i:04d}" for i in range(5000)] + ["late_tool"]
    (stored,) = recording.store.list_turns("many")
    assert len(stored.declared_tools) == 5001
    assert stored.declared_tools[4999].description == "tool number 4999"


def _chat(server: Any, stream: bool) -> Any:
    client = openai.OpenAI(base_url=server.openai_base_url, api_key="sk-x", max_retries=0)
    result = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=stream)
    return list(result) if stream else result


GARBAGE = [
    ("json", False, b'{"id": "x", "choices": [{"message": '),  # cut short
    ("json", False, b"<html>502 Bad Gateway</html>"),
    ("sse", True, b"data: {not json at all\n\n"),
    ("sse", True, b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"par"}}]}\n\ndata: {"id":\n\n'),
]


@pytest.mark.parametrize(("kind", "stream", "body"), GARBAGE, ids=[f"{g[0]}-{i}" for i, g in enumerate(GARBAGE)])
def test_garbage_from_the_provider_reaches_the_user_as_it_would_without_loopscope(recording, model_server, kind, stream, body) -> None:  # noqa: F811
    model_server.queue(Reply(raw_body=body))
    with pytest.raises(Exception) as plain:  # noqa: PT011 - whatever the SDK raises, the same must come
        _chat(model_server, stream)
    loopscope.instrument(anthropic=False)
    try:
        model_server.queue(Reply(raw_body=body))
        with pytest.raises(Exception) as instrumented:  # noqa: PT011
            _chat(model_server, stream)
    finally:
        loopscope.uninstrument()
    assert type(instrumented.value) is type(plain.value)
    assert str(instrumented.value) == str(plain.value)
    assert loopscope.flush()
    (session,) = recording.store.list_sessions()
    (turn,) = recording.store.list_turns(session.session_id)
    assert turn.loop_end_reason is LoopEndReason.ERROR
    assert turn.error.startswith(type(plain.value).__qualname__)
    chats = [s for s in recording.spans() if s.attributes.get("gen_ai.operation.name") == "chat"]
    assert len(chats) == 1 and chats[0].end_time is not None  # the round ended, once


def test_decimal_and_datetime_keys_and_nan_in_usage_do_not_break_a_turn(recording) -> None:
    with loopscope.turn(session_id="usage") as t:
        t.generation("x", finish_reason="stop", usage={"input_tokens": 3, "output_tokens": decimal.Decimal(2)})  # type: ignore[dict-item]
    assert t.response.loop_end_reason is LoopEndReason.COMPLETED
    assert loopscope.flush()
    assert len(recording.store.list_turns("usage")) == 1
