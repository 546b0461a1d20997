"""Reading a store from another process while an agent writes it, and what survives a crash.

Each test runs a small script in a child process (its own interpreter, its own writer)
and reads the same DuckDB file from the test process. Children are bounded in time and
killed at teardown if they are still running.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import duckdb
import pytest
from opentelemetry.sdk.trace import TracerProvider

import loopscope
from children import Child, hold
from loopscope import EventFilter, EventStatus

EVERY = EventFilter(include_blocked=True)
STARTUP = 20.0  # seconds a child may take to import loopscope and get going (slow CI)


def wait_until(check: Callable[[], Any], timeout: float, what: str, child: Child | None = None) -> Any:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            result = check()
        except loopscope.StoreError as exc:  # no file or no schema yet
            result, last_error = None, exc
        if result:
            return result
        if child is not None and not child.running():
            pytest.fail(f"child exited while waiting for {what}\n{child.output()}")
        if time.monotonic() >= deadline:
            extra = child.output() if child is not None else ""
            pytest.fail(f"timed out after {timeout}s waiting for {what} (last error: {last_error})\n{extra}")
        time.sleep(0.02)


def types(events) -> list[str]:
    return [e.type for e in events]


# -- a reader in another process sees an agent's work as it happens -------------------------

SLOW_TOOL_AGENT = """
    import pathlib, sys, time
    import loopscope

    db, marker = sys.argv[1], pathlib.Path(sys.argv[2])
    loopscope.configure(db, flush_interval=0.05)
    loopscope.flush(60)  # configure() does not wait for a writer process's start: the reads below have 3 s

    @loopscope.tool
    def slow(seconds: float) -> str:
        marker.write_text("sleeping")
        time.sleep(seconds)
        return "woke"

    with loopscope.turn(session_id="live", agent="worker", input="go", tools=[slow]) as t:
        t.generation("calling slow", tool_calls=[{"id": "c1", "name": "slow", "arguments": {"seconds": 3}}])
        slow(3)
        t.generation("done")
    loopscope.shutdown()
"""


def test_reader_sees_a_pending_tool_call_while_the_tool_runs(tmp_path, spawn):
    db, marker = tmp_path / "live.duckdb", tmp_path / "sleeping"
    agent = spawn("agent", SLOW_TOOL_AGENT, db, marker)
    wait_until(marker.exists, STARTUP, "the tool to start", agent)
    store = loopscope.Store(str(db))

    def started():
        events = store.list_events("live")
        return events if "tool_call_start" in types(events) else None

    events = wait_until(started, 2.0, "the tool_call_start row", agent)
    assert agent.running(), "the read must happen while the tool still sleeps"
    assert types(events) == ["message", "message", "tool_call_start"]
    start = events[-1]
    assert start.status is EventStatus.DELIVERED
    assert (start.content.tool_name, start.content.status, start.content.result) == ("slow", "pending", None)
    assert start.content.arguments == {"seconds": 3}
    assert store.list_turns("live") == []  # the turn has not ended yet

    agent.finish_ok()
    events = store.list_events("live")
    assert types(events) == ["message", "message", "tool_call_start", "tool_call_end", "message"]
    assert [e.index for e in events] == [1, 2, 3, 4, 5]
    assert events[2] == start  # a stored row never changes
    end = events[3]
    assert (end.content.tool_id, end.content.status, end.content.outcome, end.content.result) == (start.content.tool_id, "completed", "served", "woke")
    assert end.content.duration_ms >= 2900
    (turn,) = store.list_turns("live")
    assert turn.loop_end_reason is loopscope.LoopEndReason.COMPLETED
    assert turn.tool_calls_count == 1


# -- durability: the exit flush --------------------------------------------------------------

EXITING_AGENT = """
    import json, sys
    import loopscope

    provider = None
    if sys.argv[2] == "own-provider":
        # an application's provider that does not shut down at exit: loopscope must still flush
        from opentelemetry.sdk.trace import TracerProvider
        provider = TracerProvider(shutdown_on_exit=False)
    # an hour between flushes: nothing reaches the file unless the exit flush writes it
    pipeline = loopscope.configure(sys.argv[1], flush_interval=3600, tracer_provider=provider)

    @loopscope.tool
    def add(a: int, b: int) -> int:
        return a + b

    with loopscope.turn(session_id="durable", agent="calc", input="1+2?", tools=[add]) as t:
        t.generation("adding", tool_calls=[{"id": "c1", "name": "add", "arguments": {"a": 1, "b": 2}}])
        add(1, 2)
        t.generation("3")
    with loopscope.turn(session_id="durable", agent="calc", input="secret", input_blocked=True) as t2:
        t2.generation("refused")
    print(json.dumps({
        "written_before_exit": pipeline.stats().written_events,
        "turns": [t.correlation_id, t2.correlation_id],
        "response": t.response.response_content,
    }))
    # no shutdown(): the interpreter exits normally
"""


@pytest.mark.parametrize("provider", ["default-provider", "own-provider"])
def test_events_survive_a_normal_exit_without_shutdown(tmp_path, spawn, provider):
    db = tmp_path / "durable.duckdb"
    child = spawn("exiting", EXITING_AGENT, db, provider)
    report = json.loads(child.finish_ok())
    assert report["written_before_exit"] == 0
    store = loopscope.Store(str(db))
    events = store.list_events("durable", limit=None, event_filter=EVERY)
    assert types(events) == ["message", "message", "tool_call_start", "tool_call_end", "message", "message", "message"]
    assert [e.index for e in events] == list(range(1, 8))
    assert [e.content.body for e in store.get_conversation("durable")] == ["1+2?", "adding", "3", "secret", "refused"]
    assert events[5].status is EventStatus.BLOCKED
    assert events[3].content.result == 3
    turns = store.list_turns("durable")
    assert [t.correlation_id for t in turns] == report["turns"]
    assert turns[0].response_content == report["response"]
    (session,) = store.list_sessions()
    assert (session.session_id, session.event_count, session.turn_count) == ("durable", 7, 2)


# -- crash: SIGKILL in the middle of writing ------------------------------------------------

LOOPING_AGENT = """
    import sys, time
    import loopscope

    loopscope.configure(sys.argv[1], flush_interval=0.02)

    @loopscope.tool
    def step(n: int) -> int:
        return n

    deadline = time.monotonic() + 30  # bounded even if nobody kills us
    n = 0
    while time.monotonic() < deadline:
        for session in ("k1", "k2", "k3"):
            with loopscope.turn(session_id=session, agent="loop", input=f"{session}-{n}", tools=[step]) as t:
                t.generation("step", tool_calls=[{"id": f"{session}-{n}", "name": "step", "arguments": {"n": n}}])
                step(n)
                t.generation(f"done {n}", blocked=n % 7 == 3)
        n += 1
        time.sleep(0.001)
"""


def test_sigkill_leaves_a_readable_gap_free_prefix(tmp_path, spawn):
    db = tmp_path / "killed.duckdb"
    agent = spawn("looping", LOOPING_AGENT, db)
    store = loopscope.Store(str(db))
    wait_until(lambda: store.get_event_count("k3") >= 100, STARTUP, "rows from the looping agent", agent)
    time.sleep(0.1)  # let it be in the middle of something
    os.kill(agent.pid, signal.SIGKILL)
    assert agent.wait(10) == -signal.SIGKILL
    # a writer in a process of its own (LOOPSCOPE_WRITER=process) outlives the agent to write
    # what it had received: the rows are read once the file stopped growing
    counted, deadline = -1, time.monotonic() + 30
    while (now := store.sql("SELECT count(*) FROM events")[1][0][0]) != counted and time.monotonic() < deadline:
        counted = now
        time.sleep(1.0)

    sessions = {s.session_id: s for s in store.list_sessions()}
    assert set(sessions) == {"k1", "k2", "k3"}
    for session_id, info in sessions.items():
        events = store.list_events(session_id, limit=None, event_filter=EVERY)
        assert len(events) >= 100
        assert [e.index for e in events] == list(range(1, len(events) + 1)), session_id
        assert info.event_count == len(events) == store.get_event_count(session_id)
        assert {e.session_id for e in events} == {session_id}
        # the prefix is made of whole rows, in the order the agent produced them
        assert events[0].content.body == f"{session_id}-0"
        assert types(events[:5]) == ["message", "message", "tool_call_start", "tool_call_end", "message"]
        assert any(e.status is EventStatus.BLOCKED for e in events)

    # the file opens for writing too, and a new writer continues the indices
    con = duckdb.connect(str(db))
    con.close()
    loopscope.configure(db, tracer_provider=TracerProvider(), flush_interval=0.05)
    try:
        # opening it closed the turn the kill interrupted (if any): every turn has its
        # summary, no tool call is left pending (tests/hardening/test_recovery.py)
        (unended,) = store.sql("SELECT count(DISTINCT correlation_id) FROM events WHERE correlation_id NOT IN "
                               "(SELECT correlation_id FROM turns)")[1][0]
        assert unended == 0
        assert store.sql("SELECT count(*) FROM tool_calls WHERE status = 'pending'")[1] == [(0,)]
        before = store.get_event_count("k1")  # the interrupted turn's pending call may have ended here
        with loopscope.turn(session_id="k1", agent="after", input="after the crash") as t:
            t.generation("still here")
        after = store.list_events("k1", limit=2, newest_first=True)
    finally:
        loopscope.shutdown()
    assert [e.index for e in after] == [before + 1, before + 2]
    assert [e.content.body for e in after] == ["after the crash", "still here"]


# -- a foreign process holding the file -----------------------------------------------------


def test_a_held_file_raises_store_locked_error_naming_the_holder(recording, tmp_path, spawn):
    with loopscope.turn(session_id="s", agent="a", input="first") as t:
        t.generation("one")
    assert loopscope.flush()
    held = hold(spawn, recording.db, tmp_path, give_up=20, timeout=STARTUP)
    holder = held.holder

    store = loopscope.Store(str(recording.db), lock_timeout=0.5)
    with pytest.raises(loopscope.StoreLockedError) as info:
        store.list_events("s")
    assert not isinstance(info.value, duckdb.Error)
    message = str(info.value)
    assert f"process {holder.pid}" in message
    assert str(recording.db) in message
    with pytest.raises(loopscope.StoreLockedError):
        store.get_conversation("s")

    # meanwhile the writer keeps what it cannot write
    recording.pipeline.writer.lock_timeout = 0.2  # fail fast while the file is held
    with loopscope.turn(session_id="s", agent="a", input="second") as t:
        t.generation("two")
    assert loopscope.flush(timeout=10) is False
    stats = recording.pipeline.stats()
    assert stats.failed_writes >= 1
    assert stats.queued == 4  # two messages, one model call and one turn summary, held in memory
    assert stats.dropped == 0

    held.release()
    assert loopscope.flush(timeout=10) is True
    stats = recording.pipeline.stats()
    assert (stats.queued, stats.dropped) == (0, 0)
    events = store.list_events("s")
    assert [e.content.body for e in events] == ["first", "one", "second", "two"]
    assert [e.index for e in events] == [1, 2, 3, 4]
    assert len(store.list_turns("s")) == 2


WRITER_WHILE_HELD = """
    import json, pathlib, sys, time
    import loopscope

    db, recorded, release = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
    pipeline = loopscope.configure(db, flush_interval=0.05)  # the file is held: must not fail
    pipeline.writer.lock_timeout = 0.3
    with loopscope.turn(session_id="held", agent="a", input="while held") as t:
        t.generation("answer")
    flushed_while_held = loopscope.flush(timeout=10)
    held = pipeline.stats()
    recorded.write_text("recorded")
    deadline = time.monotonic() + 20
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    pipeline.writer.lock_timeout = 5.0
    loopscope.shutdown()
    done = pipeline.stats()
    print(json.dumps({
        "flushed_while_held": flushed_while_held,
        "queued_while_held": held.queued,
        "failed_writes": done.failed_writes,
        "queued": done.queued,
        "dropped": done.dropped,
        "written_events": done.written_events,
    }))
"""


def test_a_writer_in_another_process_keeps_events_until_the_lock_clears(tmp_path, spawn):
    db = tmp_path / "held.duckdb"
    held = hold(spawn, db, tmp_path, give_up=20, timeout=STARTUP)
    recorded = tmp_path / "recorded"
    writer = spawn("writer", WRITER_WHILE_HELD, db, recorded, held.release_file)
    wait_until(recorded.exists, STARTUP, "the writer to record while the file is held", writer)
    with pytest.raises(loopscope.StoreLockedError):
        loopscope.Store(str(db), lock_timeout=0.2).list_events("held")

    held.release()
    report = json.loads(writer.finish_ok())
    assert report["flushed_while_held"] is False
    assert report["queued_while_held"] == 4  # two messages, a model call and a turn summary
    assert report["failed_writes"] >= 1
    assert (report["queued"], report["dropped"], report["written_events"]) == (0, 0, 2)
    store = loopscope.Store(str(db))
    events = store.list_events("held")
    assert [(e.index, e.content.body) for e in events] == [(1, "while held"), (2, "answer")]
    assert len(store.list_turns("held")) == 1
