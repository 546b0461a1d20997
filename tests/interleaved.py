"""What ``n`` interleaved conversations must leave in the store, whatever SDK ran them: one
turn each, its own events only, in order, with its own tool call. The conversations are the
concurrency tests' ``[conv-i]`` weather questions, each calling ``get_weather`` once with
``{"city": "city-i"}`` and the tool answering ``sunny in city-i``."""

from __future__ import annotations

from typing import Any

from loopscope import LoopEndReason


def assert_conversations_apart(store: Any, n: int, call_id: str) -> None:
    """``call_id``: the tool call id of conversation ``i``, as a format (``"call_c{i:02d}"``)."""
    turns = store.list_turns(limit=None)
    assert len(turns) == n
    seen = set()
    for turn in turns:
        events = store.get_timeline(turn.session_id)
        assert {e.correlation_id for e in events} == {turn.correlation_id}
        i = int(events[0].content.body.split("]")[0].removeprefix("[conv-"))
        seen.add(i)
        assert [e.type for e in events] == ["message", "message", "tool_call_start", "tool_call_end", "message"]
        assert events[2].content.tool_id == events[3].content.tool_id == call_id.format(i=i)
        assert (events[3].content.arguments, events[3].content.result) == ({"city": f"city-{i}"}, f"sunny in city-{i}")
        assert events[4].content.body == f"It is 21 °C and sunny in city-{i}."
        assert (turn.round_count, turn.tool_calls_count, turn.loop_end_reason) == (1, 1, LoopEndReason.COMPLETED)
    assert seen == set(range(n))
