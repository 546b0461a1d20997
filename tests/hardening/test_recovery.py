"""Turns left open by a process killed with SIGKILL are closed at the next open for writing,
and only those: a turn open in a live process, or received by a collector, stays open.

Each agent runs in a child process (its own interpreter and writer) that is killed
while turns are in flight; the test process then opens the same file for writing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

import loopscope
from children import Child, collect_child, hold
from loopscope import EventFilter
from loopscope.cli import main as cli_main
from loopscope.models import RESPONSE_SEGMENT_SEPARATOR
from loopscope.storage.duckdb import recovery
from loopscope.storage.duckdb.connection import open_store
from loopscope.storage.duckdb.recovery import RECOVERED_NOTE
from tool_totals_check import assert_totals_exact

EVERY = EventFilter(include_blocked=True)
STARTUP = 30.0  # seconds a child may take to import loopscope and reach its marker (slow CI)
ROOT = Path(__file__).resolve().parents[2]


def wait_for(paths: list[Path], child: Child, timeout: float = STARTUP) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        if not child.running():
            pytest.fail(f"child exited before {[p.name for p in paths if not p.exists()]}\n{child.output()}")
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out waiting for {[p.name for p in paths if not p.exists()]}\n{child.output()}")
        time.sleep(0.02)


def sql(db: Path, query: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with open_store(str(db.resolve()), read_only=True) as con:
        return con.execute(query, params or []).fetchall()


def snapshot(db: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Every event and every turn summary, as stored."""
    events = sql(db, "SELECT id, session_id, idx, type, created_at, correlation_id, status, content::VARCHAR FROM events "
                     "ORDER BY session_id, idx")
    turns = sql(db, "SELECT correlation_id, session_id, loop_end_reason, response_content, segments::VARCHAR, tool_calls_count, "
                    "round_count, latency_ms, timestamp, error, span_id FROM turns ORDER BY session_id, correlation_id")
    return events, turns


def open_for_writing(db: Path) -> None:
    """What a process does when it starts recording into the file: configure, then stop."""
    loopscope.configure(db, tracer_provider=TracerProvider(), flush_interval=0.05)
    loopscope.shutdown()


# -- the agent that dies ------------------------------------------------------------------------

DYING_AGENT = """
    import pathlib, sys, threading, time
    import loopscope

    db, marks = sys.argv[1], pathlib.Path(sys.argv[2])
    loopscope.configure(db, flush_interval=0.02)

    def mark(name):
        assert loopscope.flush(timeout=20)  # what is recorded so far is in the file
        (marks / name).write_text("ok")

    @loopscope.tool
    def add(a: int, b: int) -> int:
        return a + b

    @loopscope.tool
    def hang(reason: str) -> None:
        mark(reason)
        time.sleep(120)  # killed long before

    def done_turns():
        for i in range(2):
            with loopscope.turn(session_id="calc", agent="calc", input=f"1+{i}?", tools=[add], provider="openai") as t:
                t.generation("Adding.", tool_calls=[{"id": f"a{i}", "name": "add", "arguments": {"a": 1, "b": i}}])
                add(1, i)
                t.generation(f"It is {1 + i}.", finish_reason="stop")

    def two_rounds_then_a_slow_tool():
        with loopscope.turn(session_id="calc", agent="calc", input="1+2, slowly?", tools=[add, hang], provider="openai") as t:
            t.generation("Checking.", tool_calls=[{"id": "a9", "name": "add", "arguments": {"a": 1, "b": 2}}])
            add(1, 2)
            t.generation("Now the slow part.", tool_calls=[{"id": "h1", "name": "hang", "arguments": {"reason": "slow"}}])
            hang("slow")

    def a_pending_lookup():
        with loopscope.turn(session_id="search", agent="finder", input="find it", tools=[hang]) as t:
            t.generation("Let me look.", tool_calls=[{"id": "h2", "name": "hang", "arguments": {"reason": "lookup"}}])
            hang("lookup")

    def text_so_far():
        with loopscope.turn(session_id="chat", agent="talker", input="tell me") as t:
            t.generation("Half an answer", finish_reason="stop")
            mark("text")
            time.sleep(120)

    done_turns()
    for target in (a_pending_lookup, text_so_far):
        threading.Thread(target=target, daemon=True).start()
    two_rounds_then_a_slow_tool()
"""
DYING_MARKS = ["slow", "lookup", "text"]


def kill_mid_turn(tmp_path: Path, spawn: Callable[..., Child], db: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir(exist_ok=True)
    agent = spawn("dying", DYING_AGENT, db, marks)
    wait_for([marks / m for m in DYING_MARKS], agent)
    # (with the thread writer, the application is the writer: its kill ends both)
    writers = [row[0] for row in sql(db, "SELECT pid FROM loopscope_writers WHERE app_pid = ? AND pid <> ?", [agent.pid] * 2)]
    agent.kill()
    # its writer process sees the pipe end and writes what it still held: the file is as the
    # dead application left it once that process is gone too
    deadline = time.monotonic() + STARTUP
    while any(map(_alive, writers)):
        assert time.monotonic() < deadline, f"writer process {writers} still runs"
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")  # a zombie no one reaps has ended


def test_turns_open_at_a_sigkill_are_closed_as_unfinished_at_the_next_open(tmp_path, spawn):
    db = tmp_path / "killed.duckdb"
    kill_mid_turn(tmp_path, spawn, db)
    store = loopscope.Store(str(db))
    before_events, before_turns = snapshot(db)
    assert len(before_turns) == 2  # the two complete turns; three were in flight
    (last_seen,) = [row[0] for row in sql(db, "SELECT last_seen FROM loopscope_writers")]  # its last batch
    pending = sql(db, "SELECT tool, call_id, session_id FROM tool_calls WHERE status = 'pending' ORDER BY call_id")
    assert pending == [("hang", "h1", "calc"), ("hang", "h2", "search")]

    open_for_writing(db)

    after_events, after_turns = snapshot(db)
    # everything flushed before the kill is intact, in place
    kept = {row[0]: row for row in after_events}
    assert all(kept[row[0]] == row for row in before_events)
    assert len(after_events) == len(before_events) + 2  # the two unserved ends, nothing else
    assert [t for t in after_turns if t[0] in {b[0] for b in before_turns}] == before_turns
    # indices still gap-free, each session's counter right
    for session in ("calc", "search", "chat"):
        indices = [e.index for e in store.list_events(session, limit=None, event_filter=EVERY)]
        assert indices == list(range(1, len(indices) + 1)), session
    counts = dict(sql(db, "SELECT session_id, last_index FROM sessions"))
    assert counts == {s: store.get_event_count(s) for s in ("calc", "search", "chat")}

    # the slow turn: two rounds of text, one tool served, one left pending -> unserved
    calc = store.list_events("calc", limit=None, event_filter=EVERY)
    slow_turn = calc[-1].correlation_id
    assert [e.type for e in calc if e.correlation_id == slow_turn] == [
        "message", "message", "tool_call_start", "tool_call_end", "message", "tool_call_start", "tool_call_end",
    ]
    ends = [e for e in calc if e.type == "tool_call_end" and e.correlation_id == slow_turn]
    assert [(e.content.tool_id, e.content.outcome, e.content.status) for e in ends] == [("a9", "served", "completed"),
                                                                                        ("h1", "unserved", "failed")]
    unserved = ends[-1]
    (start,) = [e for e in calc if e.type == "tool_call_start" and e.content.tool_id == "h1"]
    assert unserved.id == start.id[:-1] + "e" and unserved.content.tool_name == "hang"
    assert unserved.content.arguments == {"reason": "slow"} and unserved.content.result is None
    assert unserved.content.error == RECOVERED_NOTE
    assert unserved.index == calc[-1].index  # the last row of its session
    assert unserved.source == start.source and unserved.source.channel_id == "calc"
    # waiting from its start until the dead writer last wrote, the latest the file proves it alive
    assert unserved.content.duration_ms == pytest.approx((last_seen - start.created_at).total_seconds() * 1000, abs=0.01)
    assert unserved.content.duration_ms > 0

    (slow,) = store.list_turns("calc", correlation_id=slow_turn)
    assert slow.loop_end_reason is loopscope.LoopEndReason.UNFINISHED
    assert slow.error == RECOVERED_NOTE
    assert slow.segments == ["Checking.", "Now the slow part."]
    assert slow.response_content == RESPONSE_SEGMENT_SEPARATOR.join(["Checking.", "Now the slow part."])
    assert (slow.tool_calls_count, slow.round_count) == (1, 2)
    assert (slow.channel_id, slow.provider) == ("calc", "openai")
    first = next(e for e in calc if e.correlation_id == slow_turn)
    assert first.content.body == "1+2, slowly?"
    assert slow.span_id == first.span_id and slow.trace_id == first.trace_id  # the turn's own span
    assert slow.latency_ms == pytest.approx((last_seen - first.created_at).total_seconds() * 1000, abs=0.01)
    assert slow.timestamp == last_seen  # ended when its writer last wrote

    (lookup,) = store.list_turns("search")
    assert lookup.loop_end_reason is loopscope.LoopEndReason.UNFINISHED
    assert (lookup.segments, lookup.tool_calls_count, lookup.round_count) == (["Let me look."], 0, 1)
    search = store.list_events("search", limit=None)
    assert [e.type for e in search] == ["message", "message", "tool_call_start", "tool_call_end"]
    assert (search[-1].content.tool_id, search[-1].content.outcome) == ("h2", "unserved")

    (talk,) = store.list_turns("chat")
    assert talk.loop_end_reason is loopscope.LoopEndReason.UNFINISHED
    assert (talk.segments, talk.response_content, talk.tool_calls_count, talk.round_count) == (["Half an answer"], "Half an answer", 0, 0)
    assert talk.channel_id == "talker" and talk.error == RECOVERED_NOTE
    assert [e.type for e in store.list_events("chat", limit=None)] == ["message", "message"]  # no row invented

    # the views and the command line see them closed
    assert sql(db, "SELECT count(*) FROM tool_calls WHERE status = 'pending'") == [(0,)]
    assert sql(db, "SELECT outcome, count(*) FROM tool_calls GROUP BY 1 ORDER BY 1") == [("served", 3), ("unserved", 2)]
    reasons = dict(sql(db, "SELECT loop_end_reason, count(*) FROM turns GROUP BY 1"))
    assert reasons == {"completed": 2, "unfinished": 3}
    assert sql(db, "SELECT count(*) FROM loopscope_open_turns") == [(0,)]
    # the closing rows count in tool_stats's totals as any batch's do
    assert_totals_exact(db)


def test_closing_happens_once(tmp_path, spawn, capsys):
    db = tmp_path / "once.duckdb"
    kill_mid_turn(tmp_path, spawn, db)
    open_for_writing(db)
    closed = snapshot(db)
    open_for_writing(db)
    # a process that records something, too
    loopscope.configure(db, tracer_provider=TracerProvider(), flush_interval=0.05)
    try:
        with loopscope.turn(session_id="other", agent="later", input="hi") as t:
            t.generation("hello")
    finally:
        loopscope.shutdown()
    events, turns = snapshot(db)
    assert [e for e in events if e[1] != "other"] == closed[0]
    assert [t for t in turns if t[1] != "other"] == closed[1]

    assert cli_main(["--db", str(db), "turns", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert sorted((t["session_id"], t["loop_end_reason"]) for t in listed) == [
        ("calc", "completed"), ("calc", "completed"), ("calc", "unfinished"), ("chat", "unfinished"), ("other", "completed"),
        ("search", "unfinished"),
    ]
    assert {t["error"] for t in listed if t["loop_end_reason"] == "unfinished"} == {RECOVERED_NOTE}



def test_the_writer_closes_them_when_configure_could_not(tmp_path, spawn):
    db = tmp_path / "held.duckdb"
    kill_mid_turn(tmp_path, spawn, db)
    held = hold(spawn, db, tmp_path, give_up=30, timeout=STARTUP)
    pipeline = loopscope.configure(db, tracer_provider=TracerProvider(), flush_interval=0.05)  # held: nothing closed yet
    pipeline.writer.lock_timeout = 0.2  # fail fast while the file is held
    try:
        with loopscope.turn(session_id="calc", agent="later", input="again") as t:
            t.generation("fine", finish_reason="stop")
        assert loopscope.flush(timeout=10) is False
        held.release()
        pipeline.writer.lock_timeout = 5.0
        assert loopscope.flush(timeout=20)
        assert pipeline.stats().failed_writes >= 1  # the batch that closes them came after the holder
    finally:
        loopscope.shutdown()
    store = loopscope.Store(str(db))
    reasons = dict(sql(db, "SELECT loop_end_reason, count(*) FROM turns GROUP BY 1"))
    assert reasons == {"completed": 3, "unfinished": 3}
    calc = store.list_events("calc", limit=None)
    assert [e.index for e in calc] == list(range(1, len(calc) + 1))
    # the closing rows came first, then the batch that waited
    assert [(e.type, getattr(e.content, "body", None)) for e in calc[-3:]] == [
        ("tool_call_end", None), ("message", "again"), ("message", "fine"),
    ]


OPENER = """
    import pathlib, sys, time
    from opentelemetry.sdk.trace import TracerProvider
    import loopscope

    go = pathlib.Path(sys.argv[2])
    deadline = time.monotonic() + 30
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.001)
    loopscope.configure(sys.argv[1], tracer_provider=TracerProvider())
    loopscope.shutdown()
"""


def test_two_processes_opening_at_once_close_each_turn_once(tmp_path, spawn):
    db = tmp_path / "race.duckdb"
    kill_mid_turn(tmp_path, spawn, db)
    go = tmp_path / "go"
    openers = [spawn(f"opener{i}", OPENER, db, go) for i in range(2)]
    time.sleep(1.0)  # both interpreters are importing by now; ``go`` lets them race for the file
    go.write_text("go")
    for opener in openers:
        opener.finish_ok()
    reasons = sql(db, "SELECT session_id, loop_end_reason, count(*) FROM turns GROUP BY ALL ORDER BY ALL")
    assert reasons == [("calc", "completed", 2), ("calc", "unfinished", 1), ("chat", "unfinished", 1), ("search", "unfinished", 1)]
    assert sql(db, "SELECT call_id, count(*) FROM tool_calls WHERE outcome = 'unserved' GROUP BY 1 ORDER BY 1") == [("h1", 1), ("h2", 1)]
    assert sql(db, "SELECT count(*) FROM events WHERE type = 'tool_call_end' AND tool_outcome = 'unserved'") == [(2,)]


# -- a live process keeps its turns ---------------------------------------------------------------

LIVE_AGENT = """
    import pathlib, sys, time
    import loopscope

    db, holding, release = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
    loopscope.configure(db, flush_interval=0.02)

    @loopscope.tool
    def wait_for_release() -> str:
        assert loopscope.flush(timeout=20)
        holding.write_text("holding")
        deadline = time.monotonic() + 60
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        return "released"

    with loopscope.turn(session_id="live", agent="alive", input="wait", tools=[wait_for_release]) as t:
        t.generation("Waiting.", tool_calls=[{"id": "w1", "name": "wait_for_release", "arguments": {}}])
        wait_for_release()
        t.generation("Released.", finish_reason="stop")
    loopscope.shutdown()
"""


def test_a_turn_open_in_a_live_process_is_left_to_it(tmp_path, spawn):
    db = tmp_path / "shared.duckdb"
    holding, release = tmp_path / "holding", tmp_path / "release"
    live = spawn("live", LIVE_AGENT, db, holding, release)
    wait_for([holding], live)
    kill_mid_turn(tmp_path, spawn, db)  # a dead process's turns in the same file

    open_for_writing(db)
    assert live.running()
    store = loopscope.Store(str(db))
    assert store.list_turns("live") == []  # still open: its process is alive
    assert sql(db, "SELECT call_id, status FROM tool_calls WHERE session_id = 'live'") == [("w1", "pending")]
    assert len(store.list_turns("search")) == 1  # the dead one's were closed meanwhile
    assert sql(db, "SELECT count(*) FROM loopscope_open_turns") == [(1,)]

    release.write_text("go")
    live.finish_ok()
    (turn,) = store.list_turns("live")
    assert turn.loop_end_reason is loopscope.LoopEndReason.COMPLETED and turn.error is None
    assert turn.segments == ["Waiting.", "Released."]
    assert sql(db, "SELECT call_id, outcome FROM tool_calls WHERE session_id = 'live'") == [("w1", "served")]
    assert [e.index for e in store.list_events("live", limit=None)] == [1, 2, 3, 4, 5]
    assert sql(db, "SELECT count(*) FROM loopscope_open_turns") == [(0,)]
    open_for_writing(db)  # and nothing to close afterwards
    assert len(store.list_turns("live")) == 1


def test_a_reused_pid_is_not_taken_for_the_writer(tmp_path, spawn):
    db = tmp_path / "reused.duckdb"
    kill_mid_turn(tmp_path, spawn, db)
    sleeper = spawn("sleeper", "import time\ntime.sleep(60)\n")
    ((dead_start,),) = sql(db, "SELECT process_start FROM loopscope_writers")
    assert dead_start is not None  # Linux: the start time in clock ticks
    with open_store(str(db.resolve()), read_only=False) as con:
        # the dead writer's pid now names a live process (the sleeper), started at its own time
        con.execute("UPDATE loopscope_writers SET pid = ?", [sleeper.pid])
    me = recovery.this_process()
    host = (me.host, me.boot_id, me.pid_namespace)
    deadline = time.monotonic() + 10
    while (stat := recovery._stat(sleeper.pid)) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stat is not None
    assert recovery.is_gone(*host, sleeper.pid, dead_start) is True  # another process with that pid
    assert recovery.is_gone(*host, sleeper.pid, stat[1]) is False  # the writer itself, alive
    assert recovery.is_gone("another-host", *host[1:], 999_999_999, dead_start) is False  # nothing to prove it by
    open_for_writing(db)
    assert sql(db, "SELECT count(*) FROM turns WHERE loop_end_reason = 'unfinished'") == [(3,)]


def test_a_zombie_writer_is_dead(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 20
    me = recovery.this_process()
    try:
        start = None
        while time.monotonic() < deadline:
            stat = recovery._stat(proc.pid)
            if stat is not None and start is None:
                start = stat[1]
            if stat is not None and stat[0] == "Z":
                break
            time.sleep(0.005)
        else:
            pytest.fail("the child did not become a zombie")
        assert start is not None
        assert recovery.is_gone(me.host, me.boot_id, me.pid_namespace, proc.pid, start) is True  # exited, not reaped yet
    finally:
        proc.wait(10)
    assert recovery.is_gone(me.host, me.boot_id, me.pid_namespace, proc.pid, start) is True  # reaped: no such pid
    assert recovery.is_gone(me.host, me.boot_id, me.pid_namespace, me.pid, me.start) is False  # this very process


# -- turns a collector received are never closed by a writer -------------------------------------

EXPORTING_AGENT = """
    import pathlib, sys, time
    import loopscope

    endpoint, holding = sys.argv[1], pathlib.Path(sys.argv[2])
    pipeline = loopscope.configure(False, otlp_endpoint=endpoint, capture_content=True)

    @loopscope.tool
    def hang() -> None:
        pipeline.exporter.force_flush()  # the pending copies of the turn and of this call
        holding.write_text("holding")
        time.sleep(120)

    with loopscope.turn(session_id="remote", agent="far", input="go", tools=[hang]) as t:
        t.generation("Hanging.", tool_calls=[{"id": "r1", "name": "hang", "arguments": {}}])
        hang()
"""


def test_turns_received_by_a_collector_are_left_open(tmp_path, spawn):
    db = tmp_path / "collected.duckdb"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({"PYTHONPATH": str(ROOT), "LOOPSCOPE_STRICT": "1"})
    with collect_child(db, "--no-grpc", env=env) as collector:
        holding = tmp_path / "holding"
        agent = spawn("exporting", EXPORTING_AGENT, collector.http, holding)
        wait_for([holding], agent)
        deadline = time.monotonic() + 20
        while not db.exists() or not sql(db, "SELECT 1 FROM events WHERE type = 'tool_call_start'"):
            assert time.monotonic() < deadline, "the collector did not write the pending call"
            time.sleep(0.05)
        agent.kill()
        collector.kill()  # the collector dies too: its process is provably gone

    open_for_writing(db)
    assert sql(db, "SELECT count(*) FROM turns") == [(0,)]
    assert sql(db, "SELECT call_id, status FROM tool_calls") == [("r1", "pending")]
    assert sql(db, "SELECT count(*) FROM loopscope_open_turns") == [(0,)]
