"""The turn model end to end: spans recorded, rows stored, summaries computed."""

from __future__ import annotations

import asyncio
import json

import pytest

import loopscope
from loopscope import LoopEndReason
from sample_tools import book, weather

WEATHER = {
    "type": "function",
    "function": {"name": "weather", "description": "Weather for a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}
BOOK = {"name": "book", "description": "Book a table", "input_schema": {"type": "object", "properties": {"when": {"type": "string"}}}}



def two_round_turn(session: str = "s1") -> loopscope.Turn:
    with loopscope.turn(session_id=session, agent="concierge", tools=[WEATHER], input="Dinner outside tonight?") as t:
        t.generation(
            "Let me check the weather.",
            tool_calls=[{"id": "c1", "name": "weather", "arguments": {"city": "Paris"}}],
            usage={"input_tokens": 100, "output_tokens": 10, "cache_read_input_tokens": 40},
            model="scripted-1",
            provider="scripted",
        )
        weather("Paris")
        t.generation(
            "Warm enough. Booking.",
            tool_calls=[{"id": "c2", "name": "book", "arguments": {"when": "never"}}, {"id": "c3", "name": "book", "arguments": {"when": "20:00"}}],
            tools=[WEATHER, BOOK],
            usage={"input_tokens": 150, "output_tokens": 12, "reasoning_tokens": 5},
        )
        with pytest.raises(LookupError):
            book("never")
        book("20:00")
        t.generation("Booked for 20:00.", finish_reason="stop", usage={"input_tokens": 200, "output_tokens": 6})
    return t


def test_two_tool_rounds_yield_rows_in_order(recording):
    t = two_round_turn()
    events = recording.store.get_timeline("s1")
    kinds = [(e.type, getattr(e.content, "tool_id", None) or getattr(e.content, "body", None)) for e in events]
    assert kinds == [
        ("message", "Dinner outside tonight?"),
        ("message", "Let me check the weather."),
        ("tool_call_start", "c1"),
        ("tool_call_end", "c1"),
        ("message", "Warm enough. Booking."),
        ("tool_call_start", "c2"),
        ("tool_call_end", "c2"),
        ("tool_call_start", "c3"),
        ("tool_call_end", "c3"),
        ("message", "Booked for 20:00."),
    ]
    assert [e.index for e in events] == list(range(1, 11))
    assert {e.correlation_id for e in events} == {t.correlation_id}
    assert events[0].content.role == "user" and events[1].content.role == "assistant"
    failed, served = events[6].content, events[8].content
    assert (failed.status, failed.outcome, failed.error) == ("failed", "failed", "LookupError: no table then")
    assert (served.status, served.outcome, served.result) == ("completed", "served", "booked 20:00")
    assert served.arguments == {"when": "20:00"} and served.duration_ms >= 0
    assert events[2].content.status == "pending" and events[2].content.result is None


def test_two_tool_rounds_summary(recording):
    t = two_round_turn()
    [stored] = recording.store.list_turns("s1")
    for summary in (t.response, stored):
        assert summary.segments == ["Let me check the weather.", "Warm enough. Booking.", "Booked for 20:00."]
        assert summary.response_content == loopscope.RESPONSE_SEGMENT_SEPARATOR.join(summary.segments)
        assert summary.tool_calls_count == 3
        assert summary.round_count == 2
        assert summary.loop_end_reason == LoopEndReason.COMPLETED
        assert summary.usage == {"input_tokens": 450, "output_tokens": 28, "cache_read_input_tokens": 40, "reasoning_tokens": 5}
        # the union of what was offered, first-declaration order: book first appeared in round two
        assert [(d.name, d.origin) for d in summary.declared_tools] == [("weather", "always"), ("book", "always")]
        assert summary.declared_tools[1].parameters == BOOK["input_schema"]
        assert (summary.model, summary.provider, summary.channel_id, summary.session_id) == ("scripted-1", "scripted", "concierge", "s1")
    assert stored.correlation_id == t.correlation_id
    assert stored.latency_ms >= 0 and stored.trace_id == t.response.trace_id


def test_answer_without_tools_has_zero_rounds(recording):
    with loopscope.turn(session_id="s") as t:
        t.generation("Hello!", finish_reason="stop")
    assert t.response.round_count == 0 and t.response.tool_calls_count == 0
    assert t.response.segments == ["Hello!"] and t.response.response_content == "Hello!"


def test_error_passes_through_unchanged_and_is_the_reason(recording):
    boom = ValueError("model exploded")
    with pytest.raises(ValueError) as caught, loopscope.turn(session_id="s") as t:
        t.generation("thinking", tool_calls=[{"id": "c9", "name": "weather", "arguments": {"city": "Oslo"}}])
        raise boom
    assert caught.value is boom
    assert t.response.loop_end_reason == LoopEndReason.ERROR
    assert t.response.error == "ValueError: model exploded"
    [stored] = recording.store.list_turns("s")
    assert stored.loop_end_reason == LoopEndReason.ERROR and stored.error == "ValueError: model exploded"
    # the call the model asked for never ran: it ends as unserved and is not counted
    end = recording.store.list_events("s", event_filter=loopscope.EventFilter(event_types=["tool_call_end"]))
    assert [(e.content.tool_id, e.content.outcome, e.content.status) for e in end] == [("c9", "unserved", "failed")]
    assert stored.tool_calls_count == 0 and stored.round_count == 0


def test_cancellation_is_cancelled(recording):
    started = asyncio.Event()

    async def agent() -> None:
        async with loopscope.turn(session_id="s", agent="slow") as t:
            holder.append(t)
            t.generation("working", tool_calls=[{"id": "c1", "name": "nap", "arguments": {}}])

            @loopscope.tool
            async def nap() -> None:
                started.set()
                await asyncio.sleep(30)

            await nap()

    holder: list[loopscope.Turn] = []

    async def main() -> None:
        task = asyncio.create_task(agent())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert holder[0].response.loop_end_reason == LoopEndReason.CANCELLED
    end = recording.store.list_events("s", event_filter=loopscope.EventFilter(event_types=["tool_call_end"]))
    assert [(e.content.outcome, e.content.status) for e in end] == [("cancelled", "failed")]


@pytest.mark.parametrize("reason", ["max_rounds", "timeout", "budget_exceeded", "force_stopped"])
def test_explicit_reason(recording, reason):
    with loopscope.turn(session_id="s") as t:
        t.generation("again", tool_calls=[{"id": "c1", "name": "weather", "arguments": {"city": "Rome"}}])
        weather("Rome")
        t.end(reason)
    assert t.response.loop_end_reason == LoopEndReason(reason)
    assert recording.store.list_turns("s")[0].loop_end_reason == LoopEndReason(reason)


def test_derived_reasons(recording):
    with loopscope.turn(session_id="s") as truncated:
        truncated.generation("cut off mid", finish_reason="length")
    with loopscope.turn(session_id="s") as empty:
        empty.generation("", finish_reason="stop")
    with loopscope.turn(session_id="s") as unfinished:
        unfinished.generation(tool_calls=[{"id": "x", "name": "weather", "arguments": {}}])
    with pytest.raises(TimeoutError), loopscope.turn(session_id="s") as timed_out:
        raise TimeoutError
    reasons = [truncated, empty, unfinished, timed_out]
    assert [t.response.loop_end_reason for t in reasons] == [
        LoopEndReason.TRUNCATED, LoopEndReason.EMPTY_RESPONSE, LoopEndReason.UNFINISHED, LoopEndReason.TIMEOUT,
    ]
    assert [t.loop_end_reason for t in recording.store.list_turns("s")] == [t.response.loop_end_reason for t in reasons]


def test_async_hand_api(recording):
    @loopscope.tool
    async def lookup(key: str) -> str:
        await asyncio.sleep(0)
        return key.upper()

    async def main() -> loopscope.Turn:
        async with loopscope.turn(session_id="a", agent="async-agent", tools=["lookup"]) as t:
            async with t.round(model="m", stream=True) as r:
                r.text_delta("Looking ")
                r.text_delta("up.")
                r.response(tool_calls=[{"id": "k1", "name": "lookup", "arguments": {"key": "x"}}])
            await lookup(key="x")
            async with t.round(model="m") as r:
                r.response("X it is.", finish_reason="stop")
        return t

    t = asyncio.run(main())
    assert t.response.segments == ["Looking up.", "X it is."] and t.response.streaming
    ends = [e for e in recording.store.get_timeline("a") if e.type == "tool_call_end"]
    assert ends[0].content.result == "X" and ends[0].content.tool_id == "k1"
    chat = [s for s in recording.spans() if s.attributes.get("gen_ai.operation.name") == "chat"]
    assert chat[0].attributes["gen_ai.response.time_to_first_chunk"] >= 0


def test_nested_turn_keeps_its_parent(recording):
    @loopscope.tool
    def research(topic: str) -> str:
        with loopscope.turn(agent="researcher") as sub:
            sub.generation(f"{topic} is fine.")
        return sub.response.response_content

    with loopscope.turn(session_id="n", agent="lead") as outer:
        outer.generation(tool_calls=[{"id": "r1", "name": "research", "arguments": {"topic": "x"}}])
        research("x")
        outer.generation("done")
    turns = {t.channel_id: t for t in recording.store.list_turns("n")}
    assert turns["researcher"].parent_correlation_id == outer.correlation_id
    assert turns["researcher"].session_id == "n" and turns["lead"].parent_correlation_id is None
    spans = {s.name: s for s in recording.spans()}
    assert spans["invoke_agent researcher"].parent.span_id == spans["execute_tool research"].context.span_id
    assert turns["lead"].tool_calls_count == 1


def test_tool_context_manager_refuse_block_and_ids(recording):
    with loopscope.turn(session_id="cm") as t:
        t.generation(tool_calls=[{"id": "a", "name": "search", "arguments": {"q": 1}}, {"id": "b", "name": "search", "arguments": {"q": 2}}])
        with loopscope.tool("search", call_id="b") as call:
            call.refuse("rate limited")
        with loopscope.tool("search") as call:
            call.block("guardrail")
        t.generation("sorry")
    ends = [e.content for e in recording.store.get_timeline("cm") if e.type == "tool_call_end"]
    assert [(c.tool_id, c.outcome, c.status, c.error, c.arguments) for c in ends] == [
        ("b", "refused", "failed", "rate limited", {"q": 2}),
        ("a", "blocked", "failed", "guardrail", {"q": 1}),
    ]


def test_tool_outside_a_turn_is_still_stored(recording):
    weather("Lima")
    # the tool's own span (not the last one: a turn another test left open may end meanwhile)
    [tool_span] = [s for s in recording.spans() if s.name == "execute_tool weather"]
    trace_id = format(tool_span.context.trace_id, "032x")
    [start, end] = recording.store.get_timeline(trace_id)
    assert (start.type, end.type, end.content.result) == ("tool_call_start", "tool_call_end", {"city": "Lima", "temp_c": 21})


def test_span_tree_matches_stored_rows(recording):
    t = two_round_turn()
    spans = recording.spans()
    by_id = {format(s.context.span_id, "016x"): s for s in spans}
    [agent] = [s for s in spans if s.attributes["gen_ai.operation.name"] == "invoke_agent"]
    assert agent.name == "invoke_agent concierge"
    children = [s for s in spans if s is not agent]
    assert all(s.parent.span_id == agent.context.span_id for s in children)
    assert sorted(s.name for s in children) == ["chat scripted-1"] * 3 + ["execute_tool book"] * 2 + ["execute_tool weather"]
    for event in recording.store.get_timeline("s1"):
        span = by_id[event.span_id]
        assert format(span.context.trace_id, "032x") == event.trace_id
        op = span.attributes["gen_ai.operation.name"]
        if event.type.startswith("tool_call"):
            assert op == "execute_tool"
            assert span.attributes["gen_ai.tool.call.id"] == event.content.tool_id
            assert span.attributes["gen_ai.tool.name"] == event.content.tool_name
            assert json.loads(span.attributes["gen_ai.tool.call.arguments"]) == event.content.arguments
        elif event.content.role == "assistant":
            assert op == "chat" and span.attributes["loopscope.round.text"] == event.content.body
        else:
            assert op == "invoke_agent"
        assert span.attributes["gen_ai.conversation.id"] == "s1"
    assert agent.attributes["loopscope.turn.loop_end_reason"] == "completed"
    assert agent.attributes["gen_ai.usage.input_tokens"] == 450
    assert json.loads(agent.attributes["loopscope.turn.segments"]) == t.response.segments
    [stored] = recording.store.list_turns("s1")
    assert (stored.trace_id, stored.span_id) == (format(agent.context.trace_id, "032x"), format(agent.context.span_id, "016x"))


def test_python_functions_are_declared_with_their_schema(recording):
    @loopscope.tool
    def forecast(city: str, days: int = 3) -> list:
        """Forecast for a city."""
        return []

    with loopscope.turn(session_id="d", tools=[forecast]) as t:
        t.generation("ok")
    [declared] = recording.store.list_turns("d")[0].declared_tools
    assert (declared.name, declared.description) == ("forecast", "Forecast for a city.")
    assert declared.parameters["required"] == ["city"]
    assert declared.parameters["properties"]["days"]["type"] == "integer"
