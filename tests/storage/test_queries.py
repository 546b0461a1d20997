"""The query API of a store, against real DuckDB files.

Semantics follow RoomKit's ConversationStore: a page is always ascending by index;
``newest_first`` and ``before_index`` only choose which window the page holds.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider

import loopscope
from loopscope import EventFilter, EventStatus, EventType, LoopEndReason

MSGS = [f"msg{i}" for i in range(1, 8)]


def record_messages(session: str, texts, *, agent: str = "agent", blocked=(), input: str | None = None, input_blocked: bool = False):
    """One turn whose rounds say ``texts`` in order; those in ``blocked`` are stored blocked."""
    with loopscope.turn(session_id=session, agent=agent, input=input, input_blocked=input_blocked) as t:
        for text in texts:
            t.generation(text, blocked=text in blocked)
    return t


def record_tool_turn(session: str, *, agent: str = "agent", input: str = "question", provider: str | None = None):
    """A turn of 5 rows: the user input, "looking up" (asking for a tool), the tool's start
    and end, then "answer to <input>"."""

    @loopscope.tool
    def lookup(q: str) -> str:
        return q.upper()

    with loopscope.turn(session_id=session, agent=agent, input=input, tools=[lookup], provider=provider) as t:
        t.generation("looking up", tool_calls=[{"id": f"c-{agent}-{input}", "name": "lookup", "arguments": {"q": input}}])
        lookup(input)
        t.generation(f"answer to {input}")
    return t


def bodies(events) -> list[str]:
    return [e.content.body for e in events]


def indices(events) -> list[int]:
    return [e.index for e in events]


def types(events) -> list[str]:
    return [e.type for e in events]


# -- list_events: windows, offsets, cursors -------------------------------------------------


def recorded_once(folder: Path, record) -> loopscope.Store:
    """A store ``record()`` wrote, shut down after: the read-only tests of a module share it
    (one writer process started for them all, not one a test)."""
    db = folder / "store.duckdb"
    loopscope.configure(db, tracer_provider=TracerProvider(), flush_interval=0.05, capture_content=True)
    try:
        record()
        assert loopscope.flush()
    finally:
        loopscope.shutdown()
    return loopscope.Store(str(db))


@pytest.fixture(scope="module")
def seven(tmp_path_factory: pytest.TempPathFactory) -> loopscope.Store:
    """Seven messages in one turn of session ``s``; read only."""
    return recorded_once(tmp_path_factory.mktemp("seven"), lambda: record_messages("s", MSGS))


def test_seven_messages_newest_first_limit_five_is_the_tail_in_ascending_order(seven):
    page = seven.list_events("s", limit=5, newest_first=True)
    assert bodies(page) == ["msg3", "msg4", "msg5", "msg6", "msg7"]
    assert page[-1].content.body == "msg7"
    assert indices(page) == [3, 4, 5, 6, 7]


def test_default_page_is_the_oldest_window_ascending(seven):
    assert bodies(seven.list_events("s", limit=5)) == MSGS[:5]
    assert bodies(seven.list_events("s")) == MSGS
    assert bodies(seven.list_events("s", limit=None)) == MSGS


def test_offset_counts_from_the_oldest_end_by_default(seven):
    assert bodies(seven.list_events("s", offset=2, limit=3)) == ["msg3", "msg4", "msg5"]
    assert bodies(seven.list_events("s", offset=5, limit=5)) == ["msg6", "msg7"]
    assert seven.list_events("s", offset=7, limit=5) == []


def test_offset_counts_back_from_the_newest_end_under_newest_first(seven):
    # skip msg7 and msg6, then take three: still served ascending
    assert bodies(seven.list_events("s", offset=2, limit=3, newest_first=True)) == ["msg3", "msg4", "msg5"]
    assert bodies(seven.list_events("s", offset=5, limit=5, newest_first=True)) == ["msg1", "msg2"]
    assert seven.list_events("s", offset=7, limit=3, newest_first=True) == []
    # no limit: everything but the newest `offset`
    assert bodies(seven.list_events("s", offset=3, limit=None, newest_first=True)) == MSGS[:4]


def test_before_index_takes_the_limit_events_just_before_the_cursor(seven):
    assert bodies(seven.list_events("s", limit=3, before_index=6)) == ["msg3", "msg4", "msg5"]
    assert bodies(seven.list_events("s", limit=10, before_index=3)) == ["msg1", "msg2"]
    assert seven.list_events("s", limit=3, before_index=1) == []


def test_after_index_takes_the_limit_events_just_after_the_cursor(seven):
    assert bodies(seven.list_events("s", limit=3, after_index=2)) == ["msg3", "msg4", "msg5"]
    assert bodies(seven.list_events("s", limit=10, after_index=5)) == ["msg6", "msg7"]
    assert seven.list_events("s", limit=3, after_index=7) == []


def test_a_cursor_ignores_offset_and_newest_first(seven):
    assert bodies(seven.list_events("s", offset=4, limit=3, before_index=6, newest_first=True)) == ["msg3", "msg4", "msg5"]
    assert bodies(seven.list_events("s", offset=4, limit=3, before_index=6)) == ["msg3", "msg4", "msg5"]
    assert bodies(seven.list_events("s", offset=4, limit=3, after_index=2, newest_first=True)) == ["msg3", "msg4", "msg5"]
    assert bodies(seven.list_events("s", offset=4, limit=3, after_index=2)) == ["msg3", "msg4", "msg5"]


def test_both_cursors_together_raise_value_error(seven):
    with pytest.raises(ValueError):
        seven.list_events("s", after_index=1, before_index=5)
    with pytest.raises(ValueError):
        seven.list_events("s", after_index=0, before_index=0)


def test_negative_offset_or_limit_raise_value_error(seven):
    with pytest.raises(ValueError):
        seven.list_events("s", offset=-1)
    with pytest.raises(ValueError):
        seven.list_events("s", limit=-1)
    assert seven.list_events("s", limit=0) == []


def test_paging_backwards_and_forwards_with_cursors_covers_the_timeline_once(seven):
    pages = []
    page = seven.list_events("s", limit=3, newest_first=True)
    while page:
        pages.insert(0, page)
        page = seven.list_events("s", limit=3, before_index=page[0].index)
    assert [bodies(p) for p in pages] == [["msg1"], ["msg2", "msg3", "msg4"], ["msg5", "msg6", "msg7"]]

    forward, cursor = [], 0
    while True:
        page = seven.list_events("s", limit=3, after_index=cursor)
        if not page:
            break
        forward.append(bodies(page))
        cursor = page[-1].index
    assert forward == [["msg1", "msg2", "msg3"], ["msg4", "msg5", "msg6"], ["msg7"]]


def test_unknown_session_reads_empty(seven):
    assert seven.list_events("nobody") == []
    assert seven.get_conversation("nobody") == []
    assert seven.get_event_count("nobody") == 0


def test_pages_contain_only_the_asked_session(recording):
    record_messages("a", ["a1", "a2", "a3"])
    record_messages("b", ["b1", "b2"])
    record_messages("a", ["a4"])
    store = recording.store
    assert bodies(store.list_events("a")) == ["a1", "a2", "a3", "a4"]
    assert bodies(store.list_events("b", limit=1, newest_first=True)) == ["b2"]
    assert {e.session_id for e in store.list_events("a")} == {"a"}


def test_page_window_chosen_under_a_filter(recording):
    for n in range(1, 4):
        record_tool_turn("s", input=f"q{n}")  # 5 rows each
    store = recording.store
    ends = EventFilter(event_types=["tool_call_end"])
    assert [e.content.arguments for e in store.list_events("s", limit=2, newest_first=True, event_filter=ends)] == [
        {"q": "q2"}, {"q": "q3"},
    ]
    messages = EventFilter(event_types=[EventType.MESSAGE])
    all_messages = store.list_events("s", limit=None, event_filter=messages)
    assert bodies(all_messages) == ["q1", "looking up", "answer to q1", "q2", "looking up", "answer to q2", "q3", "looking up", "answer to q3"]
    # the two messages just before the last tool_call_end, skipping the tool rows in between
    last_end = store.list_events("s", limit=1, newest_first=True, event_filter=ends)[0]
    assert bodies(store.list_events("s", limit=2, before_index=last_end.index, event_filter=messages)) == ["q3", "looking up"]
    assert bodies(store.list_events("s", limit=2, after_index=last_end.index - 2, event_filter=messages)) == ["answer to q3"]
    # offset under newest_first counts back over the filtered rows only
    assert bodies(store.list_events("s", offset=1, limit=2, newest_first=True, event_filter=messages)) == ["q3", "looking up"]


# -- blocked rows ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def with_blocked(tmp_path_factory: pytest.TempPathFactory) -> loopscope.Store:
    """Ten messages of session ``s``, three of them blocked; read only."""
    texts = [f"m{i}" for i in range(1, 11)]
    return recorded_once(tmp_path_factory.mktemp("blocked"), lambda: record_messages("s", texts, blocked={"m3", "m8", "m9"}))


def test_blocked_rows_are_skipped_before_the_page_is_cut(with_blocked):
    store = with_blocked
    assert bodies(store.list_events("s", limit=5, newest_first=True)) == ["m4", "m5", "m6", "m7", "m10"]
    assert bodies(store.list_events("s", limit=5)) == ["m1", "m2", "m4", "m5", "m6"]
    assert bodies(store.list_events("s", limit=5, before_index=10)) == ["m2", "m4", "m5", "m6", "m7"]
    assert bodies(store.list_events("s", limit=3, after_index=2)) == ["m4", "m5", "m6"]
    assert bodies(store.list_events("s", offset=1, limit=3, newest_first=True)) == ["m5", "m6", "m7"]
    assert all(e.status is EventStatus.DELIVERED for e in store.list_events("s", limit=None))


def test_blocked_rows_are_served_with_include_blocked(with_blocked):
    store = with_blocked
    everything = EventFilter(include_blocked=True)
    page = store.list_events("s", limit=5, newest_first=True, event_filter=everything)
    assert bodies(page) == ["m6", "m7", "m8", "m9", "m10"]
    assert [e.status for e in page] == [EventStatus.DELIVERED, EventStatus.DELIVERED, EventStatus.BLOCKED, EventStatus.BLOCKED, EventStatus.DELIVERED]
    assert indices(store.list_events("s", limit=None, event_filter=everything)) == list(range(1, 11))


def test_get_event_answers_for_blocked_and_delivered_rows(with_blocked):
    store = with_blocked
    blocked = [e for e in store.list_events("s", limit=None, event_filter=EventFilter(include_blocked=True)) if e.status is EventStatus.BLOCKED]
    assert bodies(blocked) == ["m3", "m8", "m9"]
    for event in blocked:
        got = store.get_event(event.id)
        assert got is not None
        assert got == event
        assert got.status is EventStatus.BLOCKED
    delivered = store.list_events("s", limit=1)[0]
    assert store.get_event(delivered.id) == delivered
    assert store.get_event("no-such-event") is None


def test_blocked_user_input_is_stored_blocked(recording):
    record_messages("s", ["reply"], input="forbidden question", input_blocked=True)
    store = recording.store
    assert bodies(store.list_events("s")) == ["reply"]
    every = store.list_events("s", event_filter=EventFilter(include_blocked=True))
    assert bodies(every) == ["forbidden question", "reply"]
    assert every[0].content.role == "user"
    assert every[0].status is EventStatus.BLOCKED


# -- get_conversation ----------------------------------------------------------------------


def test_conversation_holds_messages_only_blocked_included(recording):
    record_tool_turn("s", input="q1")
    record_messages("s", ["blocked answer", "fine answer"], blocked={"blocked answer"}, input="q2")
    store = recording.store
    conversation = store.get_conversation("s")
    assert types(conversation) == ["message"] * 6
    assert bodies(conversation) == ["q1", "looking up", "answer to q1", "q2", "blocked answer", "fine answer"]
    assert conversation[4].status is EventStatus.BLOCKED
    assert indices(conversation) == sorted(indices(conversation))


def test_conversation_is_the_most_recent_limit_ascending(recording):
    record_tool_turn("s", input="q1")
    record_tool_turn("s", input="q2")
    store = recording.store
    assert bodies(store.get_conversation("s", limit=4)) == ["answer to q1", "q2", "looking up", "answer to q2"]
    assert bodies(store.get_conversation("s", limit=1)) == ["answer to q2"]


def test_conversation_after_index_is_a_forward_cursor(recording):
    record_tool_turn("s", input="q1")  # idx 1 q1, 2 looking up, 3 start, 4 end, 5 answer
    record_tool_turn("s", input="q2")  # idx 6 q2, 7 looking up, 8 start, 9 end, 10 answer
    store = recording.store
    assert bodies(store.get_conversation("s", limit=2, after_index=2)) == ["answer to q1", "q2"]
    assert indices(store.get_conversation("s", limit=50, after_index=5)) == [6, 7, 10]
    assert bodies(store.get_conversation("s", limit=50, after_index=5)) == ["q2", "looking up", "answer to q2"]
    assert store.get_conversation("s", after_index=10) == []


def test_conversation_default_limit_is_fifty(recording):
    record_messages("s", [f"m{i}" for i in range(1, 61)])
    conversation = recording.store.get_conversation("s")
    assert len(conversation) == 50
    assert conversation[0].content.body == "m11"
    assert conversation[-1].content.body == "m60"


# -- get_event_count -----------------------------------------------------------------------


def test_count_without_filter_counts_every_row_blocked_included(with_blocked):
    assert with_blocked.get_event_count("s") == 10
    assert len(with_blocked.list_events("s", limit=None)) == 7


def test_count_under_a_filter_matches_what_list_events_serves_uncapped(recording):
    for n in range(1, 16):
        record_tool_turn("s", input=f"q{n}", agent="alpha" if n % 2 else "beta")  # 75 rows
    record_messages("s", ["hidden", "shown"], blocked={"hidden"})
    store = recording.store
    assert store.get_event_count("s") == 77
    assert len(store.list_events("s")) == 50  # the default page is capped...
    filters = [
        EventFilter(),
        EventFilter(include_blocked=True),
        EventFilter(event_types=["message"]),
        EventFilter(event_types=["message"], include_blocked=True),
        EventFilter(exclude_types=["message"]),
        EventFilter(event_types=["message", "tool_call_end"], exclude_types=["tool_call_end"]),
        EventFilter(source_channel_id="alpha"),
        EventFilter(source_channel_id="beta", event_types=[EventType.TOOL_CALL_START]),
        EventFilter(event_types=[]),
    ]
    for f in filters:
        served = store.list_events("s", limit=None, event_filter=f)
        assert store.get_event_count("s", f) == len(served), f  # ...the count is not
    assert store.get_event_count("s", EventFilter()) == 76
    assert store.get_event_count("s", EventFilter(include_blocked=True)) == 77
    assert store.get_event_count("s", EventFilter(event_types=["message"])) == 46


# -- EventFilter fields --------------------------------------------------------------------


def test_filter_event_types_and_exclude_types(recording):
    record_tool_turn("s")
    store = recording.store
    assert types(store.list_events("s")) == ["message", "message", "tool_call_start", "tool_call_end", "message"]
    assert types(store.list_events("s", event_filter=EventFilter(event_types=["tool_call_start", "tool_call_end"]))) == [
        "tool_call_start", "tool_call_end",
    ]
    assert types(store.list_events("s", event_filter=EventFilter(event_types=[EventType.TOOL_CALL_END]))) == ["tool_call_end"]
    assert types(store.list_events("s", event_filter=EventFilter(exclude_types=[EventType.MESSAGE]))) == [
        "tool_call_start", "tool_call_end",
    ]
    assert types(store.list_events("s", event_filter=EventFilter(event_types=["message", "tool_call_end"], exclude_types=["message"]))) == [
        "tool_call_end",
    ]
    start = store.list_events("s", event_filter=EventFilter(event_types=["tool_call_start"]))[0]
    assert start.content.status == "pending"
    end = store.list_events("s", event_filter=EventFilter(event_types=["tool_call_end"]))[0]
    assert (end.content.tool_name, end.content.result, end.content.status, end.content.outcome) == ("lookup", "QUESTION", "completed", "served")
    assert end.content.tool_id == start.content.tool_id


def test_filter_correlation_id_and_source_channel(recording):
    first = record_tool_turn("s", agent="alpha", input="q1")
    second = record_tool_turn("s", agent="beta", input="q2")
    store = recording.store
    by_turn = store.list_events("s", event_filter=EventFilter(correlation_id=second.correlation_id))
    assert bodies([e for e in by_turn if e.type == "message"]) == ["q2", "looking up", "answer to q2"]
    assert {e.correlation_id for e in by_turn} == {second.correlation_id}
    assert len(by_turn) == 5
    by_agent = store.list_events("s", event_filter=EventFilter(source_channel_id="alpha"))
    assert {e.correlation_id for e in by_agent} == {first.correlation_id}
    assert {e.source.channel_id for e in by_agent} == {"alpha"}
    assert len(by_agent) == 5
    assert store.list_events("s", event_filter=EventFilter(source_channel_id="gamma")) == []
    both = EventFilter(correlation_id=first.correlation_id, source_channel_id="beta")
    assert store.list_events("s", event_filter=both) == []


def test_filter_after_time_and_before_time(recording):
    record_tool_turn("s", input="early")
    time.sleep(0.01)
    boundary = datetime.now(timezone.utc)
    time.sleep(0.01)
    record_tool_turn("s", input="late")
    store = recording.store
    late = store.list_events("s", event_filter=EventFilter(after_time=boundary))
    early = store.list_events("s", event_filter=EventFilter(before_time=boundary))
    assert [e.content.body for e in late if e.type == "message"] == ["late", "looking up", "answer to late"]
    assert [e.content.body for e in early if e.type == "message"] == ["early", "looking up", "answer to early"]
    assert len(late) == len(early) == 5
    assert all(e.created_at > boundary for e in late)
    assert all(e.created_at < boundary for e in early)
    window = EventFilter(after_time=boundary, before_time=datetime.now(timezone.utc))
    assert indices(store.list_events("s", event_filter=window)) == [6, 7, 8, 9, 10]
    assert store.list_events("s", event_filter=EventFilter(after_time=datetime.now(timezone.utc))) == []


def test_filter_source_provider(recording):
    record_tool_turn("s", input="q1", provider="openai")
    record_tool_turn("s", input="q2", provider="anthropic")
    store = recording.store
    from_anthropic = store.list_events("s", event_filter=EventFilter(source_provider="anthropic", event_types=["message"]))
    assert bodies(from_anthropic) == ["q2", "looking up", "answer to q2"]


# -- turns and sessions --------------------------------------------------------------------


def test_list_turns_filters_and_order(recording):
    a1 = record_tool_turn("a", agent="alpha", input="q1")
    b1 = record_messages("b", ["hello"], agent="beta")
    a2 = record_messages("a", [], agent="beta")  # no generation: empty_response
    store = recording.store
    turns = store.list_turns()
    assert [t.correlation_id for t in turns] == [a1.correlation_id, b1.correlation_id, a2.correlation_id]
    assert [t.correlation_id for t in store.list_turns("a")] == [a1.correlation_id, a2.correlation_id]
    assert [t.correlation_id for t in store.list_turns(limit=2, newest_first=True)] == [b1.correlation_id, a2.correlation_id]
    assert [t.correlation_id for t in store.list_turns(limit=1)] == [a1.correlation_id]
    assert [t.correlation_id for t in store.list_turns(channel_id="beta")] == [b1.correlation_id, a2.correlation_id]
    assert [t.correlation_id for t in store.list_turns(loop_end_reason="empty_response")] == [a2.correlation_id]
    assert [t.correlation_id for t in store.list_turns(correlation_id=b1.correlation_id)] == [b1.correlation_id]
    assert [t.correlation_id for t in store.list_turns(after_time=turns[0].timestamp)] == [b1.correlation_id, a2.correlation_id]
    first = store.list_turns("a", limit=1)[0]
    assert first.loop_end_reason is LoopEndReason.COMPLETED
    assert first.tool_calls_count == 1
    assert first.response_content == a1.response.response_content
    assert first.channel_id == "alpha" and first.session_id == "a"
    assert [d.name for d in first.declared_tools] == ["lookup"]


def test_list_sessions_most_recent_first_with_counts(recording):
    record_tool_turn("old", agent="alpha")
    record_tool_turn("new", agent="alpha")
    record_messages("new", ["x", "y"], agent="beta", blocked={"x"})
    store = recording.store
    sessions = store.list_sessions()
    assert [s.session_id for s in sessions] == ["new", "old"]
    new, old = sessions
    assert (new.event_count, new.turn_count, new.agents) == (7, 2, ["alpha", "beta"])
    assert (old.event_count, old.turn_count, old.agents) == (5, 1, ["alpha"])
    assert new.event_count == store.get_event_count("new")
    assert new.first_at <= new.last_at
    assert old.last_at <= new.last_at
    assert [s.session_id for s in store.list_sessions(limit=1)] == ["new"]


# -- indices -------------------------------------------------------------------------------


def test_indices_are_sequential_per_session_across_turns_and_interleaved_sessions(recording):
    for n in range(3):
        record_tool_turn("a", input=f"a{n}")
        record_messages("b", [f"b{n}"], blocked={"b1"})
        loopscope.flush()  # several batches, not just one
        record_tool_turn("c", input=f"c{n}")
    # sessions interleaved inside one batch: a turn of another session nested in a turn
    with loopscope.turn(session_id="a", agent="outer") as outer:
        outer.generation("outer 1")
        with loopscope.turn(session_id="b", agent="inner") as inner:
            inner.generation("inner 1")
            outer.generation("outer 2")
            inner.generation("inner 2")
        outer.generation("outer 3")
    store = recording.store
    every = EventFilter(include_blocked=True)
    for session, expected in (("a", 15 + 3), ("b", 3 + 2), ("c", 15)):
        events = store.list_events(session, limit=None, event_filter=every)
        assert indices(events) == list(range(1, expected + 1)), session
        assert store.get_event_count(session) == expected
    assert bodies(store.list_events("b", limit=2, newest_first=True)) == ["inner 1", "inner 2"]
    assert bodies(store.list_events("a", limit=3, newest_first=True)) == ["outer 1", "outer 2", "outer 3"]
    assert {s.session_id: s.event_count for s in store.list_sessions()} == {"a": 18, "b": 5, "c": 15}


def test_indices_continue_across_shutdown_and_reconfigure(recording):
    record_tool_turn("s", input="q1")
    record_messages("t", ["t1"])
    loopscope.shutdown()
    loopscope.configure(recording.db, tracer_provider=TracerProvider(), flush_interval=0.05)
    record_tool_turn("s", input="q2")
    record_messages("t", ["t2"])
    # configure() again without shutdown re-targets the same file
    loopscope.configure(recording.db, tracer_provider=TracerProvider(), flush_interval=0.05)
    record_messages("s", ["last"])
    store = loopscope.Store(str(recording.db))
    assert indices(store.list_events("s", limit=None)) == list(range(1, 12))
    assert bodies(store.list_events("s", limit=1, newest_first=True)) == ["last"]
    assert [(e.index, e.content.body) for e in store.list_events("t")] == [(1, "t1"), (2, "t2")]
    assert [t.session_id for t in store.list_turns()] == ["s", "t", "s", "t", "s"]


# -- AsyncStore ----------------------------------------------------------------------------


def test_async_store_answers_like_store_inside_a_running_loop(recording):
    first = record_tool_turn("s", input="q1", agent="alpha")
    record_messages("s", ["m1", "m2", "m3"], blocked={"m2"})
    record_messages("other", ["o1"])
    store = recording.store
    blocked_id = next(e.id for e in store.list_events("s", limit=None, event_filter=EventFilter(include_blocked=True)) if e.status is EventStatus.BLOCKED)
    messages = EventFilter(event_types=["message"])

    async def main():
        asyncio.get_running_loop()  # we are inside the loop
        astore = loopscope.AsyncStore(str(recording.db))
        results = await asyncio.gather(
            astore.list_events("s"),
            astore.list_events("s", 1, 3, newest_first=True),
            astore.list_events("s", limit=2, before_index=5, event_filter=messages),
            astore.get_timeline("s"),
            astore.get_conversation("s", limit=3),
            astore.get_conversation("s", 50, 2),
            astore.get_event(blocked_id),
            astore.get_event_count("s"),
            astore.get_event_count("s", messages),
            astore.list_turns("s"),
            astore.list_turns(None, 1, newest_first=True),
            astore.list_sessions(),
            astore.sql("SELECT count(*) AS n FROM events WHERE session_id = ?", ["s"]),
        )
        return results

    got = asyncio.run(main())
    expected = [
        store.list_events("s"),
        store.list_events("s", 1, 3, newest_first=True),
        store.list_events("s", limit=2, before_index=5, event_filter=messages),
        store.get_timeline("s"),
        store.get_conversation("s", limit=3),
        store.get_conversation("s", 50, 2),
        store.get_event(blocked_id),
        store.get_event_count("s"),
        store.get_event_count("s", messages),
        store.list_turns("s"),
        store.list_turns(None, 1, newest_first=True),
        store.list_sessions(),
        store.sql("SELECT count(*) AS n FROM events WHERE session_id = ?", ["s"]),
    ]
    assert got == expected
    assert got[6].status is EventStatus.BLOCKED
    assert got[7] == 8
    assert got[12] == (["n"], [(8,)])
    assert got[9][0].correlation_id == first.correlation_id
    assert types(got[1]) == ["tool_call_end", "message", "message"]
    assert bodies(got[1][1:]) == ["answer to q1", "m1"]
    assert bodies(got[2]) == ["q1", "looking up"]


def test_async_store_sees_events_recorded_in_the_same_loop(recording):
    async def main():
        async with loopscope.turn(session_id="s", agent="a") as t:
            t.generation("async hello")
        astore = loopscope.AsyncStore(str(recording.db))
        return await astore.list_events("s")

    assert bodies(asyncio.run(main())) == ["async hello"]
