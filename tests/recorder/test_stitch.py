"""Stitching model calls into turns, as adapters drive it, without any SDK."""

from __future__ import annotations

import time

import loopscope
from loopscope import LoopEndReason
from loopscope.cli.status import read_status
from loopscope.models import ToolCall
from loopscope.recorder import stitch
from loopscope.recorder.adapter import ModelRequest, ModelResponse, ToolResult, start_model_call


def begin_generation(**request):
    return start_model_call(ModelRequest(**request))


def call(results=(), **finish):
    generation = begin_generation(provider="fake", model="m", tools=[{"name": "lookup"}], tool_results=results, input_text="hi")
    generation.finish(ModelResponse(**finish))
    return generation


def test_calls_with_results_join_one_turn(recording):
    first = call(text="Looking.", tool_calls=[ToolCall(id="c1", name="lookup", arguments={"k": 1})], usage={"input_tokens": 5})
    time.sleep(0.02)
    second = call([ToolResult("c1", {"v": 2})], text="Found 2.", finish_reason="stop", usage={"input_tokens": 7})
    assert first.turn is second.turn and first.turn.ended
    summary = first.turn.response
    assert (summary.loop_end_reason, summary.round_count, summary.tool_calls_count) == (LoopEndReason.COMPLETED, 1, 1)
    assert summary.usage == {"input_tokens": 12} and summary.segments == ["Looking.", "Found 2."]
    events = recording.store.get_timeline(summary.session_id)
    assert [e.type for e in events] == ["message", "message", "tool_call_start", "tool_call_end", "message"]
    end = events[3].content
    assert (end.result, end.outcome) == ({"v": 2}, "served") and end.duration_ms >= 15


def test_interleaved_conversations_match_by_call_id(recording):
    a1 = call(text="A", tool_calls=[ToolCall(id="a", name="lookup")])
    b1 = call(text="B", tool_calls=[ToolCall(id="b", name="lookup")])
    b2 = call([ToolResult("b", "rb")], text="B done")
    a2 = call([ToolResult("a", "ra", is_error=True)], text="A done")
    assert a1.turn is a2.turn and b1.turn is b2.turn and a1.turn is not b1.turn
    assert a1.turn.session_id != b1.turn.session_id
    ends = {e.content.tool_id: e.content for e in recording.store.get_timeline(a1.turn.session_id) if e.type == "tool_call_end"}
    assert (ends["a"].outcome, ends["a"].error) == ("failed", "ra")


def test_session_context_names_the_conversation(recording):
    with loopscope.session("conv-7"):
        generation = call(text="hello")
    assert generation.turn.session_id == "conv-7"


def test_unanswered_calls_end_unserved_after_idle_time(recording):
    stitch.set_idle_timeout(0.1)
    try:
        generation = call(tool_calls=[ToolCall(id="x", name="lookup")])
        deadline = time.monotonic() + 5
        while not generation.turn.ended and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stitch.set_idle_timeout(stitch.DEFAULT_IDLE_TIMEOUT)
    assert generation.turn.response.loop_end_reason == LoopEndReason.UNFINISHED
    end = next(e for e in recording.store.get_timeline(generation.turn.session_id) if e.type == "tool_call_end")
    assert end.content.outcome == "unserved"


def test_shutdown_ends_open_turns(recording):
    generation = call(tool_calls=[ToolCall(id="y", name="lookup")])
    loopscope.shutdown()
    assert generation.turn.response.loop_end_reason == LoopEndReason.UNFINISHED
    [turn] = loopscope.Store(str(recording.db)).list_turns(generation.turn.session_id)
    assert turn.loop_end_reason == LoopEndReason.UNFINISHED


def test_decorated_tool_serves_the_started_call_once(recording):
    @loopscope.tool
    def lookup(k: int) -> int:
        return k * 10

    first = call(tool_calls=[ToolCall(id="d1", name="lookup", arguments={"k": 4})])
    assert lookup(4) == 40
    call([ToolResult("d1", "40")], text="forty")  # the result message no longer ends anything
    ends = [e.content for e in recording.store.get_timeline(first.turn.session_id) if e.type == "tool_call_end"]
    assert [(c.tool_id, c.result) for c in ends] == [("d1", 40)]
    assert first.turn.response.tool_calls_count == 1 and first.turn.response.round_count == 1


def test_inside_a_hand_turn_calls_become_its_rounds(recording):
    with loopscope.turn(session_id="h", agent="mine") as t:
        call(text="one", tool_calls=[ToolCall(id="h1", name="lookup")])
        call([ToolResult("h1", 1)], text="two")
    assert t.response.segments == ["one", "two"] and t.response.tool_calls_count == 1
    assert len(recording.store.list_turns("h")) == 1


def test_inside_a_hand_round_the_call_fills_it(recording):
    with loopscope.turn(session_id="r") as t:
        with t.round(model="m") as rnd:
            call(text="filled")
        assert rnd.text == "filled"
    chats = [s for s in recording.spans() if s.attributes.get("gen_ai.operation.name") == "chat"]
    assert len(chats) == 1 and t.response.segments == ["filled"]


def test_failed_and_abandoned_calls_end_their_turn(recording):
    generation = begin_generation(provider="fake", model="m")
    error = ConnectionError("reset")
    generation.fail(error)
    assert generation.turn.response.loop_end_reason == LoopEndReason.ERROR
    dropped = begin_generation(provider="fake", model="m", stream=True)
    dropped.delta("par")
    dropped.abandon()
    dropped.abandon()  # once only
    assert dropped.turn.response.loop_end_reason == LoopEndReason.CANCELLED
    assert dropped.turn.response.segments == ["par"]


def test_unanswered_turns_past_the_bound_end_unserved_and_counted(recording):
    """A program that never answers tool calls holds at most ``max_open`` turns: the one idle
    the longest ends at once, as the idle timeout would end it, and is counted."""
    before = stitch.cut_turns()
    stitch.set_max_open(3)
    try:
        calls = [call(tool_calls=[ToolCall(id=f"u{i}", name="lookup")]) for i in range(5)]
    finally:
        stitch.set_max_open(stitch.MAX_OPEN_TURNS)
    assert [c.turn.ended for c in calls] == [True, True, False, False, False]
    assert stitch.cut_turns() - before == 2
    assert calls[0].turn.response.loop_end_reason == LoopEndReason.UNFINISHED
    end = next(e for e in recording.store.get_timeline(calls[0].turn.session_id) if e.type == "tool_call_end")
    assert (end.content.tool_id, end.content.outcome) == ("u0", "unserved")
    assert not stitch.wants_result("u0") and stitch.wants_result("u4")
    loopscope.shutdown()  # the rest end as the process ends: unserved, not cut
    status = read_status(str(recording.db))
    assert status["unserved_cut"] == 2
    assert any(line.startswith("2 tool calls ended unserved because more stitched turns waited") for line in status["problems"])


def test_the_turn_answered_last_is_cut_last(recording):
    stitch.set_max_open(2)
    try:
        first = call(tool_calls=[ToolCall(id="o1", name="lookup")])
        second = call(tool_calls=[ToolCall(id="o2", name="lookup")])
        again = call([ToolResult("o1", "r")], tool_calls=[ToolCall(id="o1b", name="lookup")])  # the first goes on
        third = call(tool_calls=[ToolCall(id="o3", name="lookup")])
    finally:
        stitch.set_max_open(stitch.MAX_OPEN_TURNS)
    assert again.turn is first.turn
    assert (first.turn.ended, second.turn.ended, third.turn.ended) == (False, True, False)
    loopscope.flush()
    assert second.turn.response.loop_end_reason == LoopEndReason.UNFINISHED
