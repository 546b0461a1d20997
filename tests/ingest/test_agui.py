"""AG-UI event streams into and out of a store, built from the real ``ag_ui.core`` models.

What a user sees after an import: the timeline (messages, tool starts and ends, state),
one turn summary per run, and the stream itself kept verbatim, so an export gives it
back event for event.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import pytest
from ag_ui.core import (
    ActivitySnapshotEvent,
    CustomEvent,
    Event,
    MessagesSnapshotEvent,
    RawEvent,
    ReasoningMessageChunkEvent,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedEvent,
    RunStartedEvent,
    StateDeltaEvent,
    StateSnapshotEvent,
    StepFinishedEvent,
    StepStartedEvent,
    TextMessageChunkEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    TokenUsage,
    Tool,
    ToolCallArgsEvent,
    ToolCallChunkEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
    UserMessage,
)
from ag_ui.core.events import RunFinishedCancelledOutcome, RunFinishedInterruptOutcome
from ag_ui.core.types import Interrupt, ToolMessage
from ag_ui.encoder import EventEncoder
from pydantic import TypeAdapter

import loopscope
from loopscope import LoopEndReason, Store
from loopscope.ingest.agui import AguiFormatError, export_session, import_stream
from recorded import connect_when_free

T0 = 1_767_000_000_000  # ms since the epoch
ENCODER = EventEncoder()
EVENTS = TypeAdapter(Event)


def sse(*events) -> str:
    return "".join(ENCODER.encode(e) for e in events)


def at(ms: int) -> datetime:
    return datetime.fromtimestamp((T0 + ms) / 1000, timezone.utc)


def stored_raw(db: Path, session: str) -> list[tuple[str | None, int, str, str]]:
    con = connect_when_free(db)
    try:
        return con.execute(
            "SELECT run_id, seq, type, raw FROM agui_events WHERE session_id = ? ORDER BY seq", [session]
        ).fetchall()
    finally:
        con.close()


def parse_sse(text: str) -> list[dict]:
    assert text.endswith("\n\n")
    return [json.loads(chunk.removeprefix("data: ")) for chunk in text.split("\n\n")[:-1]]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "store.duckdb"


def weather_run() -> list:
    """One run: a text, two interleaved tool calls, one result, a state snapshot, text chunks."""
    return [
        RunStartedEvent(
            thread_id="th-1", run_id="run-1", timestamp=T0,
            input=RunAgentInput(
                thread_id="th-1", run_id="run-1",
                messages=[UserMessage(id="u-1", content="Weather and time in Paris?")],
                tools=[Tool(name="weather", description="current weather", parameters={"type": "object"}),
                       Tool(name="clock", description="local time")],
            ),
        ),
        TextMessageStartEvent(message_id="m-1", role="assistant", timestamp=T0 + 10),
        TextMessageContentEvent(message_id="m-1", delta="Let me ", timestamp=T0 + 11),
        TextMessageContentEvent(message_id="m-1", delta="check.", timestamp=T0 + 12),
        TextMessageEndEvent(message_id="m-1", timestamp=T0 + 13),
        ToolCallStartEvent(tool_call_id="c-w", tool_call_name="weather", parent_message_id="m-1", timestamp=T0 + 20),
        ToolCallStartEvent(tool_call_id="c-t", tool_call_name="clock", timestamp=T0 + 21),
        ToolCallArgsEvent(tool_call_id="c-w", delta='{"city": ', timestamp=T0 + 22),
        ToolCallArgsEvent(tool_call_id="c-t", delta='{"tz": "CET"}', timestamp=T0 + 23),
        ToolCallArgsEvent(tool_call_id="c-w", delta='"Paris"}', timestamp=T0 + 24),
        ToolCallEndEvent(tool_call_id="c-t", timestamp=T0 + 25),
        ToolCallEndEvent(tool_call_id="c-w", timestamp=T0 + 26),
        ToolCallResultEvent(message_id="r-t", tool_call_id="c-t", content="14:05", timestamp=T0 + 30),
        ToolCallResultEvent(message_id="r-w", tool_call_id="c-w", content='{"temp": 21}', timestamp=T0 + 76),
        StateSnapshotEvent(snapshot={"city": "Paris", "steps": 2}, timestamp=T0 + 80),
        TextMessageChunkEvent(message_id="m-2", role="assistant", delta="21 °C, ", timestamp=T0 + 90),
        TextMessageChunkEvent(delta="14:05.", timestamp=T0 + 91),
        TextMessageEndEvent(message_id="m-2", timestamp=T0 + 92),
        RunFinishedEvent(
            thread_id="th-1", run_id="run-1", timestamp=T0 + 100,
            usage=[TokenUsage(provider="openai", model="gpt-5", input_tokens=120, output_tokens=30,
                              cached_input_tokens=100, reasoning_tokens=7)],
        ),
    ]


# -- the timeline and the turn -------------------------------------------------------------------


def test_interleaved_tool_calls_become_the_timeline_field_by_field(db):
    result = import_stream(sse(*weather_run()), db)
    assert (result.sessions, result.received, result.raw_events, result.runs, result.turns) == (["th-1"], 19, 19, 1, 1)

    events = Store(str(db)).get_timeline("th-1")
    assert [(e.index, e.type) for e in events] == [
        (1, "message"), (2, "message"), (3, "tool_call_start"), (4, "tool_call_start"),
        (5, "tool_call_end"), (6, "tool_call_end"), (7, "state_snapshot"), (8, "message"),
    ]
    user, said, clock_start, weather_start, clock_end, weather_end, state, answer = events
    assert (user.content.role, user.content.body, user.created_at) == ("user", "Weather and time in Paris?", at(0))
    assert (said.content.role, said.content.body, said.created_at) == ("assistant", "Let me check.", at(13))
    # a call's start row is written when its arguments are complete (TOOL_CALL_END)
    assert (clock_start.content.tool_name, clock_start.content.tool_id, clock_start.content.arguments) == ("clock", "c-t", {"tz": "CET"})
    assert (clock_start.content.status, clock_start.created_at) == ("pending", at(25))
    assert (weather_start.content.tool_name, weather_start.content.arguments, weather_start.created_at) == ("weather", {"city": "Paris"}, at(26))
    assert (clock_end.content.tool_id, clock_end.content.result, clock_end.content.status) == ("c-t", "14:05", "completed")
    assert (clock_end.content.outcome, clock_end.content.duration_ms, clock_end.created_at) == ("served", 5.0, at(30))
    assert (weather_end.content.result, weather_end.content.duration_ms) == ({"temp": 21}, 50.0)
    assert weather_end.id[:-1] == weather_start.id[:-1]  # start and end of one call share its ids, as spans do
    assert state.content == {"snapshot": {"city": "Paris", "steps": 2}}
    assert (answer.content.body, answer.created_at) == ("21 °C, 14:05.", at(92))
    assert {e.correlation_id for e in events} == {"run-1"}
    assert {e.session_id for e in events} == {"th-1"}
    assert {e.source.framework for e in events} == {"ag-ui"}
    assert len({e.id for e in events}) == 8
    _, calls = Store(str(db)).sql(
        "SELECT tool, call_id, turn_id, status, duration_ms, start_index, end_index FROM tool_calls ORDER BY start_index"
    )
    assert calls == [("clock", "c-t", "run-1", "completed", 5.0, 3, 5), ("weather", "c-w", "run-1", "completed", 50.0, 4, 6)]

    [turn] = Store(str(db)).list_turns("th-1")
    assert (turn.session_id, turn.correlation_id, turn.parent_correlation_id) == ("th-1", "run-1", None)
    assert turn.segments == ["Let me check.", "21 °C, 14:05."]
    assert turn.response_content == "Let me check.\n\n21 °C, 14:05."
    assert (turn.tool_calls_count, turn.round_count) == (2, 2)
    assert turn.usage == {"input_tokens": 120, "output_tokens": 30, "cache_read_input_tokens": 100, "reasoning_tokens": 7}
    assert (turn.model, turn.provider, turn.streaming) == ("gpt-5", "openai", True)
    assert (turn.loop_end_reason, turn.error, turn.latency_ms, turn.timestamp) == (LoopEndReason.COMPLETED, None, 100.0, at(100))
    assert [(t.name, t.description, t.parameters) for t in turn.declared_tools] == [
        ("weather", "current weather", {"type": "object"}), ("clock", "local time", None),
    ]


def test_tool_call_chunks_expand_like_the_typescript_client(db):
    stream = sse(
        RunStartedEvent(thread_id="th", run_id="r", timestamp=T0),
        ToolCallChunkEvent(tool_call_id="c-1", tool_call_name="search", delta='{"q":', timestamp=T0 + 1),
        RawEvent(event={"provider": "native"}, timestamp=T0 + 2),  # passes through: the chunk run stays open
        ToolCallChunkEvent(delta='"ag-ui"}', timestamp=T0 + 3),
        ToolCallChunkEvent(tool_call_id="c-2", tool_call_name="fetch", delta="{}", timestamp=T0 + 4),  # closes c-1
        TextMessageChunkEvent(message_id="m", delta="found it", timestamp=T0 + 5),  # closes c-2
        ToolCallResultEvent(message_id="x", tool_call_id="c-1", content="1 hit", timestamp=T0 + 9),  # closes m
        RunFinishedEvent(thread_id="th", run_id="r", timestamp=T0 + 10),
    )
    import_stream(stream, db)
    events = Store(str(db)).get_timeline("th")
    assert [(e.type, e.created_at) for e in events] == [
        ("tool_call_start", at(4)), ("tool_call_start", at(5)), ("message", at(9)), ("tool_call_end", at(9)),
    ]
    assert (events[0].content.tool_name, events[0].content.arguments) == ("search", {"q": "ag-ui"})
    assert (events[1].content.tool_name, events[1].content.arguments) == ("fetch", {})
    assert events[2].content.body == "found it"
    assert (events[3].content.tool_id, events[3].content.result, events[3].content.duration_ms) == ("c-1", "1 hit", 5.0)
    [turn] = Store(str(db)).list_turns("th")
    # c-2 got no result in its run: the loop stopped with a call open
    assert (turn.tool_calls_count, turn.round_count, turn.segments) == (2, 1, ["found it"])
    assert turn.loop_end_reason == LoopEndReason.UNFINISHED


def test_a_tool_result_in_a_later_run_ends_the_call_a_call_never_answered_stays_pending(db):
    first = sse(
        RunStartedEvent(thread_id="th", run_id="r1", timestamp=T0),
        ToolCallStartEvent(tool_call_id="ask", tool_call_name="confirm", timestamp=T0 + 1),
        ToolCallArgsEvent(tool_call_id="ask", delta='{"amount": 5}', timestamp=T0 + 2),
        ToolCallEndEvent(tool_call_id="ask", timestamp=T0 + 3),
        ToolCallStartEvent(tool_call_id="never", tool_call_name="notify", timestamp=T0 + 4),
        ToolCallEndEvent(tool_call_id="never", timestamp=T0 + 5),
        RunFinishedEvent(thread_id="th", run_id="r1", timestamp=T0 + 6),
    )
    later = sse(
        RunStartedEvent(thread_id="th", run_id="r2", timestamp=T0 + 1000),
        ToolCallResultEvent(message_id="res", tool_call_id="ask", content="yes", timestamp=T0 + 2003),
        TextMessageStartEvent(message_id="m", timestamp=T0 + 2004),
        TextMessageContentEvent(message_id="m", delta="Done.", timestamp=T0 + 2005),
        TextMessageEndEvent(message_id="m", timestamp=T0 + 2006),
        RunFinishedEvent(thread_id="th", run_id="r2", timestamp=T0 + 2010),
    )
    import_stream(first, db)  # the result comes in another import: the start is found in the store
    import_stream(later, db)
    store = Store(str(db))
    events = store.get_timeline("th")
    assert [(e.index, e.type, e.correlation_id) for e in events] == [
        (1, "tool_call_start", "r1"), (2, "tool_call_start", "r1"), (3, "tool_call_end", "r1"), (4, "message", "r2"),
    ]
    end = events[2].content
    assert (end.tool_name, end.tool_id, end.arguments, end.result, end.duration_ms) == ("confirm", "ask", {"amount": 5}, "yes", 2000.0)
    assert events[2].id[:-1] == events[0].id[:-1]
    assert not [e for e in events if e.type == "tool_call_end" and e.content.tool_id == "never"]
    r1, r2 = store.list_turns("th")
    assert (r1.correlation_id, r1.tool_calls_count, r1.loop_end_reason) == ("r1", 2, LoopEndReason.UNFINISHED)
    assert (r2.correlation_id, r2.tool_calls_count, r2.segments, r2.loop_end_reason) == ("r2", 0, ["Done."], LoopEndReason.COMPLETED)


def test_a_tool_message_in_a_later_runs_input_ends_the_call_failed_when_it_says_so(db):
    stream = sse(
        RunStartedEvent(thread_id="th", run_id="r1", timestamp=T0),
        ToolCallStartEvent(tool_call_id="c", tool_call_name="pay", timestamp=T0 + 1),
        ToolCallEndEvent(tool_call_id="c", timestamp=T0 + 2),
        RunFinishedEvent(thread_id="th", run_id="r1", timestamp=T0 + 3),
        RunStartedEvent(
            thread_id="th", run_id="r2", parent_run_id="r1", timestamp=T0 + 50,
            input=RunAgentInput(thread_id="th", run_id="r2", messages=[
                UserMessage(id="u1", content="pay it"),
                ToolMessage(id="t1", tool_call_id="c", content="", error="card declined"),
            ]),
        ),
        RunFinishedEvent(thread_id="th", run_id="r2", timestamp=T0 + 60),
    )
    import_stream(stream, db)
    events = Store(str(db)).get_timeline("th")
    assert [e.type for e in events] == ["tool_call_start", "message", "tool_call_end"]
    assert (events[1].content.role, events[1].content.body, events[1].correlation_id) == ("user", "pay it", "r2")
    end = events[2].content
    assert (end.status, end.outcome, end.error, end.duration_ms) == ("failed", "failed", "card declined", 48.0)
    _r1, r2 = Store(str(db)).list_turns("th")
    assert (r2.parent_correlation_id, r2.loop_end_reason) == ("r1", LoopEndReason.EMPTY_RESPONSE)


def test_history_in_a_runs_input_adds_only_the_new_user_message(db):
    def run(run_id: str, messages: list, ms: int) -> list:
        return [
            RunStartedEvent(thread_id="th", run_id=run_id, timestamp=T0 + ms,
                            input=RunAgentInput(thread_id="th", run_id=run_id, messages=messages)),
            TextMessageChunkEvent(message_id=f"a-{run_id}", delta=f"answer {run_id}", timestamp=T0 + ms + 1),
            RunFinishedEvent(thread_id="th", run_id=run_id, timestamp=T0 + ms + 2),
        ]

    first = [UserMessage(id="u1", content="one")]
    import_stream(sse(*run("r1", first, 0)), db)
    import_stream(sse(*run("r2", [*first, UserMessage(id="u2", content=[{"type": "text", "text": "two"}])], 100)), db)
    events = Store(str(db)).get_timeline("th")
    assert [(e.index, e.content.role, e.content.body) for e in events] == [
        (1, "user", "one"), (2, "assistant", "answer r1"), (3, "user", "two"), (4, "assistant", "answer r2"),
    ]


def test_an_error_run_and_other_endings_map_to_loop_end_reasons(db):
    stream = sse(
        RunStartedEvent(thread_id="th", run_id="boom", timestamp=T0),
        TextMessageChunkEvent(message_id="m", delta="Working", timestamp=T0 + 1),
        RunErrorEvent(message="model overloaded", code="rate_limit", timestamp=T0 + 40,
                      usage=[TokenUsage(input_tokens=9, output_tokens=1)]),
        RunStartedEvent(thread_id="th", run_id="stop", timestamp=T0 + 100),
        RunFinishedEvent(thread_id="th", run_id="stop", outcome=RunFinishedCancelledOutcome(), timestamp=T0 + 101),
        RunStartedEvent(thread_id="th", run_id="ask", timestamp=T0 + 200),
        TextMessageChunkEvent(message_id="q", delta="Approve?", timestamp=T0 + 201),
        RunFinishedEvent(thread_id="th", run_id="ask", timestamp=T0 + 202,
                         outcome=RunFinishedInterruptOutcome(interrupts=[Interrupt(id="i", reason="approval")])),
        RunStartedEvent(thread_id="th", run_id="quiet", timestamp=T0 + 300),
        RunFinishedEvent(thread_id="th", run_id="quiet", timestamp=T0 + 301),
        RunStartedEvent(thread_id="th", run_id="cut", timestamp=T0 + 400),
        TextMessageChunkEvent(message_id="c", delta="and then", timestamp=T0 + 405),
    )
    import_stream(stream, db)
    turns = {t.correlation_id: t for t in Store(str(db)).list_turns("th")}
    assert {k: t.loop_end_reason for k, t in turns.items()} == {
        "boom": LoopEndReason.ERROR, "stop": LoopEndReason.CANCELLED, "ask": LoopEndReason.UNFINISHED,
        "quiet": LoopEndReason.EMPTY_RESPONSE, "cut": LoopEndReason.UNFINISHED,
    }
    boom = turns["boom"]
    assert (boom.error, boom.segments, boom.usage, boom.latency_ms) == ("rate_limit: model overloaded", ["Working"], {"input_tokens": 9, "output_tokens": 1}, 40.0)
    assert turns["cut"].segments == ["and then"]  # the stream ended inside the run: what it said is kept
    assert all(t.error is None for k, t in turns.items() if k != "boom")


def test_thinking_events_are_read_as_reasoning_and_kept_as_they_came(db):
    legacy = [
        {"type": "RUN_STARTED", "threadId": "th", "runId": "r", "timestamp": T0},
        {"type": "THINKING_START", "title": "planning", "timestamp": T0 + 1},
        {"type": "THINKING_TEXT_MESSAGE_START", "timestamp": T0 + 2},
        {"type": "THINKING_TEXT_MESSAGE_CONTENT", "delta": "The user wants ", "timestamp": T0 + 3},
        {"type": "THINKING_TEXT_MESSAGE_CONTENT", "delta": "the weather.", "timestamp": T0 + 4},
        {"type": "THINKING_TEXT_MESSAGE_END", "timestamp": T0 + 5},
        {"type": "THINKING_END", "timestamp": T0 + 6},
        {"type": "TEXT_MESSAGE_CHUNK", "messageId": "m", "delta": "Sunny.", "timestamp": T0 + 7},
        {"type": "RUN_FINISHED", "threadId": "th", "runId": "r", "timestamp": T0 + 8},
    ]
    text = "\n".join(json.dumps(e) for e in legacy) + "\n"  # JSON lines
    import_stream(text, db)
    [turn] = Store(str(db)).list_turns("th")
    assert (turn.thinking, turn.segments, turn.round_count) == ("The user wants the weather.", ["Sunny."], 1)
    raw = stored_raw(db, "th")
    assert [r[2] for r in raw] == [e["type"] for e in legacy]
    assert [r[3] for r in raw] == text.splitlines()
    # reasoning chunks (1.0) fill the same field
    import_stream(sse(
        RunStartedEvent(thread_id="th2", run_id="r"),
        ReasoningMessageChunkEvent(message_id="rm", delta="hmm"),
        RunFinishedEvent(thread_id="th2", run_id="r"),
    ), db)
    assert Store(str(db)).list_turns("th2")[0].thinking == "hmm"


# -- verbatim events, round trip, idempotence ---------------------------------------------------


def everything_else() -> list:
    return [
        RunStartedEvent(thread_id="th", run_id="r", timestamp=T0),
        StepStartedEvent(step_name="plan", timestamp=T0 + 1),
        ActivitySnapshotEvent(message_id="act-1", activity_type="PLAN", content={"steps": ["a", "b"]}, timestamp=T0 + 2),
        CustomEvent(name="kaboo_session", value={"interrupt": None}, timestamp=T0 + 3),
        RawEvent(event={"id": "chunk_1"}, source="openai", timestamp=T0 + 4),
        MessagesSnapshotEvent(messages=[UserMessage(id="u", content="hi")], timestamp=T0 + 5),
        StateSnapshotEvent(snapshot={"todo": ["a"]}, timestamp=T0 + 6),
        StateDeltaEvent(delta=[{"op": "add", "path": "/todo/-", "value": "b"}], timestamp=T0 + 7),
        StepFinishedEvent(step_name="plan", timestamp=T0 + 8),
        RunFinishedEvent(thread_id="th", run_id="r", timestamp=T0 + 9),
    ]


def test_every_event_is_kept_verbatim_and_an_export_gives_the_stream_back(db):
    stream = sse(*weather_run(), *everything_else())
    import_stream(stream, db)
    assert export_session("th-1", str(db)) + export_session("th", str(db)) == stream
    raw = stored_raw(db, "th")
    assert [(r[0], r[1], r[2]) for r in raw] == [("r", i, e.type.value) for i, e in enumerate(everything_else(), 1)]
    assert [json.loads(r[3]) for r in raw] == [json.loads(e.model_dump_json(by_alias=True)) for e in everything_else()]
    # the state rows are the session's state, as the log says
    events = Store(str(db)).get_timeline("th")
    assert [(e.type, e.content) for e in events] == [
        ("state_snapshot", {"snapshot": {"todo": ["a"]}}),
        ("state_delta", {"delta": [{"op": "add", "path": "/todo/-", "value": "b"}]}),
    ]
    assert Store(str(db)).derive_state("th") == {"todo": ["a", "b"]}


def test_json_text_is_kept_exactly_as_it_came_spacing_and_key_order_included(db):
    lines = [
        '{"runId": "r",   "threadId": "th", "type": "RUN_STARTED"}',
        '{"type":"CUSTOM","name":"x","value":{"b":1,"a":[1.50, "\\u00e9"]}}',
        '{"type": "RUN_FINISHED", "threadId": "th", "runId": "r"}',
    ]
    import_stream("\r\n".join(lines).encode(), db)
    assert [r[3] for r in stored_raw(db, "th")] == lines
    assert export_session("th", str(db)) == "".join(f"data: {line}\n\n" for line in lines)


def test_a_json_array_of_events_and_sse_comments_are_read_too(db):
    array = '[\n  {"type": "RUN_STARTED", "threadId": "a", "runId": "r"},\n  {"type": "RUN_FINISHED", "threadId": "a", "runId": "r"}\n]'
    import_stream(array, db)
    assert [r[3] for r in stored_raw(db, "a")] == [
        '{"type": "RUN_STARTED", "threadId": "a", "runId": "r"}', '{"type": "RUN_FINISHED", "threadId": "a", "runId": "r"}',
    ]
    stream = ': keep-alive\nevent: message\nid: 1\ndata: {"type": "RUN_STARTED",\ndata:  "threadId": "b", "runId": "r"}\n\n'
    import_stream(stream, db)
    assert [r[3] for r in stored_raw(db, "b")] == ['{"type": "RUN_STARTED",\n "threadId": "b", "runId": "r"}']


def test_reimporting_a_stream_adds_nothing_and_a_longer_one_adds_only_its_new_runs(db):
    runs = sse(*weather_run())
    import_stream(runs, db)
    before = Store(str(db)).get_timeline("th-1")
    again = import_stream(runs, db)
    assert (again.raw_events, again.events, again.turns, again.skipped_runs) == (0, 0, 0, ["run-1"])
    assert Store(str(db)).get_timeline("th-1") == before
    assert len(Store(str(db)).list_turns("th-1")) == 1
    assert len(stored_raw(db, "th-1")) == 19

    more = runs + sse(
        RunStartedEvent(thread_id="th-1", run_id="run-2", timestamp=T0 + 500),
        TextMessageChunkEvent(message_id="m-3", delta="Anything else?", timestamp=T0 + 501),
        RunFinishedEvent(thread_id="th-1", run_id="run-2", timestamp=T0 + 502),
    )
    result = import_stream(more, db)
    assert (result.raw_events, result.events, result.turns, result.skipped_runs) == (3, 1, 1, ["run-1"])
    events = Store(str(db)).get_timeline("th-1")
    assert [e.index for e in events] == list(range(1, 10))
    assert events[:8] == before and events[8].content.body == "Anything else?"
    assert [r[1] for r in stored_raw(db, "th-1")] == list(range(1, 23))
    assert export_session("th-1", str(db)) == more


def test_a_stored_run_that_differs_is_refused_and_nothing_is_stored(db):
    import_stream(sse(*weather_run()), db)
    changed = weather_run()
    changed[2] = TextMessageContentEvent(message_id="m-1", delta="Let us ", timestamp=T0 + 11)
    extra = sse(RunStartedEvent(thread_id="th-new", run_id="x"), RunFinishedEvent(thread_id="th-new", run_id="x"))
    with pytest.raises(AguiFormatError, match=r"line 1: run 'run-1' of session 'th-1' is stored already"):
        import_stream(extra.replace("th-new", "th-1") and sse(*changed) + extra, db)
    assert len(stored_raw(db, "th-1")) == 19 and stored_raw(db, "th-new") == []
    assert [s.session_id for s in Store(str(db)).list_sessions()] == ["th-1"]


def test_indices_continue_the_sessions_own_gap_free_numbering(recording):
    with loopscope.turn(session_id="shared", agent="hand", input="hello") as t:
        t.generation("hi there")
    loopscope.flush()
    import_stream(sse(*weather_run()), recording.db, session="shared")
    with loopscope.turn(session_id="shared", agent="hand", input="bye") as t:
        t.generation("bye")
    store = recording.store
    events = store.get_timeline("shared")
    assert [e.index for e in events] == list(range(1, 13))
    assert [e.source.framework for e in events].count("ag-ui") == 8
    assert [e.content.body for e in events if e.type == "message"][:3] == ["hello", "hi there", "Weather and time in Paris?"]
    assert store.last_indices()["shared"] == 12
    assert sorted(t.correlation_id == "run-1" for t in store.list_turns("shared")) == [False, False, True]


# -- malformed input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"type": "RUN_STARTED", "threadId": "t", "runId": "r"}\n{"type": "CUSTOM", "name": "a", "value": 1}\n{"type": "CUSTOM", "name": \n',
         r"^line 3: not JSON \(Expecting value at column 28\)$"),
        ('{"type": "RUN_STARTED", "threadId": "t", "runId": "r"}\n\n{"type": "TELEPORT"}\n',
         r"^line 3: unknown AG-UI event type 'TELEPORT'$"),
        ('data: {"type": "RUN_STARTED", "threadId": "t", "runId": "r"}\n\ndata: {"type": "RUN_FINISHED", "threadId": "t", "runId": "r"}',
         r"^line 3: the SSE stream is truncated: its last event is not ended by a blank line$"),
        ('data: {"type": "RUN_STARTED", "threadId": "t", "runId": "r"}\n\ndata: {"type": "RUN_FINI\n\n',
         r"^line 3: not JSON \(Unterminated string"),
        ('data: {"type": "RUN_STARTED", "threadId": "t", "runId": "r"}\n\ndata: {"type": "TOOL_CALL_START", "toolCallId": "c"}\n\n',
         r"^line 3: invalid TOOL_CALL_START event \(toolCallName: Field required\)$"),
        ('{"type": "RUN_STARTED", "threadId": "t", "runId": "r"}\n[1]\n', r"^line 2: an AG-UI event is a JSON object, not list$"),
        ('{"type": "CUSTOM", "name": "a", "value": 1}\n', r"^line 1: CUSTOM before any RUN_STARTED, and no session was given"),
        ("hello\n", r"^line 1: neither SSE"),
        ('{"type": "RUN_STARTED", "threadId": "t", "runId": "r"}\n{"type": "CUSTOM", "name": "a", "value": ' + "9" * 5000 + "}\n",
         r"^line 2: not readable JSON \(Exceeds the limit"),
        ('data: {"type": "RUN_STARTED", "threadId": "t", "runId": "r"}\n\ndata: {"type": "CUSTOM", "name": "a", "value": ' + "9" * 5000
         + "}\n\n", r"^line 3: not readable JSON \(Exceeds the limit"),
    ],
)
def test_malformed_input_names_the_line_and_stores_nothing(db, text, message):
    import_stream(sse(*everything_else()), db)
    before = (Store(str(db)).get_timeline("th"), stored_raw(db, "th"), stored_raw(db, "t"))
    with pytest.raises(AguiFormatError, match=message):
        import_stream(text, db)
    assert (Store(str(db)).get_timeline("th"), stored_raw(db, "th"), stored_raw(db, "t")) == before
    assert [s.session_id for s in Store(str(db)).list_sessions()] == ["th"]


def test_events_from_objects_name_their_position(db):
    with pytest.raises(AguiFormatError, match=r"^event 2: invalid RUN_FINISHED event \(runId: Field required\)"):
        import_stream([RunStartedEvent(thread_id="t", run_id="r"), {"type": "RUN_FINISHED", "threadId": "t"}], db)
    twice = [RunStartedEvent(thread_id="t", run_id="r"), RunStartedEvent(thread_id="t", run_id="r")]
    with pytest.raises(AguiFormatError, match=r"^event 2: run 'r' of session 't' starts a second time in this stream$"):
        import_stream(twice, db)
    assert not db.exists()  # a stream refused is refused before the store file is even opened


# -- export of a session loopscope recorded itself ---------------------------------------------------


def test_export_of_a_hand_api_session_is_a_valid_agui_stream(recording):
    @loopscope.tool
    def lookup(q: str) -> str:
        return q.upper()

    with loopscope.turn(session_id="hand", agent="concierge", input="look it up", tools=[lookup]) as t:
        t.generation("Looking.", tool_calls=[{"id": "call-1", "name": "lookup", "arguments": {"q": "paris"}}],
                     usage={"input_tokens": 12, "output_tokens": 4})
        lookup("paris")
        t.generation("It is PARIS.")
    with pytest.raises(RuntimeError), loopscope.turn(session_id="hand", agent="concierge", input="again"):
        raise RuntimeError("tool server down")

    text = export_session("hand", str(recording.db))
    events = [EVENTS.validate_python(d) for d in parse_sse(text)]  # every event is a valid ag_ui.core event
    assert text == sse(*events)  # and is what ag_ui's own encoder writes for it
    assert [e.type.value for e in events] == [
        "RUN_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END",
        "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END",
        "TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT",
        "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END", "RUN_FINISHED",
        "RUN_STARTED", "TEXT_MESSAGE_START", "TEXT_MESSAGE_CONTENT", "TEXT_MESSAGE_END", "RUN_ERROR",
    ]
    turns = recording.store.list_turns("hand")
    start, user, said = events[0], events[2], events[5]
    assert (start.thread_id, start.run_id) == ("hand", turns[0].correlation_id)
    assert [tool.name for tool in start.input.tools] == ["lookup"]
    assert (events[1].role, user.delta, events[4].role, said.delta) == ("user", "look it up", "assistant", "Looking.")
    assert (events[7].tool_call_id, events[7].tool_call_name, json.loads(events[8].delta)) == ("call-1", "lookup", {"q": "paris"})
    result = events[10]
    assert (result.tool_call_id, result.content, result.metadata["loopscope"]["outcome"]) == ("call-1", "PARIS", "served")
    assert events[12].delta == "It is PARIS."
    finished = events[14]
    assert (finished.run_id, finished.usage[0].input_tokens, finished.usage[0].output_tokens) == (turns[0].correlation_id, 12, 4)
    assert (events[15].run_id, events[19].message) == (turns[1].correlation_id, turns[1].error)
    assert "tool server down" in events[19].message

    # and the export imports as a stream of its own, into another store
    other = recording.db.with_name("copy.duckdb")
    result = import_stream(text, other)
    assert (result.runs, result.turns) == (2, 2)
    copied = Store(str(other))
    assert [e.type for e in copied.get_timeline("hand")] == [e.type for e in recording.store.get_timeline("hand")]
    assert {t.correlation_id: t.loop_end_reason for t in copied.list_turns("hand")} == {
        turns[0].correlation_id: LoopEndReason.COMPLETED, turns[1].correlation_id: LoopEndReason.ERROR,
    }
    assert export_session("hand", str(other)) == text


def test_a_failed_turn_before_others_ends_in_run_finished_saying_so(recording):
    with pytest.raises(ValueError), loopscope.turn(session_id="flaky", agent="a", input="first"):
        raise ValueError("bad input")
    with loopscope.turn(session_id="flaky", agent="a", input="second") as t:
        t.generation("Fine now.")
    failed, ok = recording.store.list_turns("flaky")

    events = [EVENTS.validate_python(d) for d in parse_sse(export_session("flaky", str(recording.db)))]
    ends = [e for e in events if e.type.value in ("RUN_FINISHED", "RUN_ERROR")]
    # nothing may follow a RUN_ERROR in one stream: the earlier failure says so in its metadata
    assert [(e.type.value, e.run_id, e.metadata["loopscope"]) for e in ends] == [
        ("RUN_FINISHED", failed.correlation_id, {"loop_end_reason": "error", "error": "ValueError: bad input"}),
        ("RUN_FINISHED", ok.correlation_id, {"loop_end_reason": "completed"}),
    ]
    [alone] = [e for e in map(EVENTS.validate_python, parse_sse(
        export_session("flaky", str(recording.db), run_id=failed.correlation_id))) if e.type.value == "RUN_ERROR"]
    assert alone.message == "ValueError: bad input"

    copy = recording.db.with_name("copy.duckdb")
    import_stream(export_session("flaky", str(recording.db)), copy)
    assert {t.correlation_id: (t.loop_end_reason, t.error) for t in Store(str(copy)).list_turns("flaky")} == {
        failed.correlation_id: (LoopEndReason.ERROR, "ValueError: bad input"),
        ok.correlation_id: (LoopEndReason.COMPLETED, None),
    }


def test_recorded_state_is_exported_as_state_events(recording):
    with loopscope.turn(session_id="stateful", agent="planner", input="plan") as t:
        loopscope.state_snapshot({"todo": ["a"]})
        loopscope.state_delta([{"op": "add", "path": "/todo/-", "value": "b"}])
        t.generation("Planned.")
    text = export_session("stateful", str(recording.db))
    events = [EVENTS.validate_python(d) for d in parse_sse(text)]
    state = [e for e in events if e.type.value.startswith("STATE_")]
    dumped = [e.model_dump(mode="json", by_alias=True) for e in state]
    assert [(d["type"], d.get("snapshot"), d.get("delta")) for d in dumped] == [
        ("STATE_SNAPSHOT", {"todo": ["a"]}, None),
        ("STATE_DELTA", None, [{"op": "add", "path": "/todo/-", "value": "b"}]),
    ]
    copy = recording.db.with_name("copy.duckdb")
    import_stream(text, copy)
    assert Store(str(copy)).derive_state("stateful") == recording.store.derive_state("stateful") == {"todo": ["a", "b"]}


def test_exporting_an_unknown_session_says_so(db):
    import_stream(sse(*everything_else()), db)
    with pytest.raises(loopscope.StoreError, match="no session 'nope'"):
        export_session("nope", str(db))
