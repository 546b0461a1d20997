"""``loopscope stats``, ``tools``, ``sessions --search``, ``tail`` (and ``--follow`` in another
process) and ``export --parquet``, on a store with a varied workload."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import duckdb
import pytest

import analytics_store as workload
import loopscope
from loopscope.cli import main
from loopscope.storage.duckdb.parquet import EXPORTS  # the export's SQL is the DuckDB engine's (the seam)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("analytics") / "store.duckdb"
    workload.record(path)
    return str(path)


def run(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def scalar(db: str, sql: str) -> Any:
    con = duckdb.connect(db, read_only=True)
    try:
        return con.execute(sql).fetchone()[0]
    finally:
        con.close()


def lines_after_rule(out: str) -> list[str]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("---")) + 1
    return [line for line in lines[start:] if line.strip()]


# -- stats ------------------------------------------------------------------------------------------


def test_stats_json(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "stats", "--db", db, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["sessions"] == 4 == scalar(db, "SELECT count(*) FROM sessions")
    assert data["turns"] == workload.TURNS
    assert data["events"] == scalar(db, "SELECT count(*) FROM events")
    assert data["agents"] == 3
    calls = data["tool_calls"]
    assert (calls["calls"], calls["finished"], calls["pending"], calls["served"]) == (21, 21, 0, 16)
    assert {o: calls[o] for o in ("failed", "refused", "blocked", "unserved", "cancelled")} == dict.fromkeys(
        ("failed", "refused", "blocked", "unserved", "cancelled"), 1
    )
    assert calls["failure_share"] == pytest.approx(5 / 21)
    assert {r["loop_end_reason"]: r["turns"] for r in data["loop_end_reasons"]} == workload.REASONS
    assert sum(r["share"] for r in data["loop_end_reasons"]) == pytest.approx(1)
    assert data["tokens"]["input_tokens"] == scalar(db, "SELECT sum(input_tokens) FROM turns")
    assert data["tokens"]["cache_read_input_tokens"] == 40 and data["tokens"]["reasoning_tokens"] == 5
    assert {m["model"] for m in data["models"]} == {"gpt-4o", "gpt-4o-mini", "claude-x"}


def test_stats_table(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "stats", "--db", db)
    assert code == 0, err
    assert out.startswith(f"Store {db}\n")
    tool_line = next(line for line in out.splitlines() if line.startswith("tool calls"))
    assert tool_line.split() == ["tool", "calls", "21", "finished", "21,", "running", "0;", "not", "served", "23.8%"]
    outcomes = out.split("Tool call outcomes")[1].split("Loop end reasons")[0]
    assert [line.split() for line in lines_after_rule(outcomes)] == [
        ["served", "16", "76.2%"], ["failed", "1", "4.8%"], ["refused", "1", "4.8%"], ["blocked", "1", "4.8%"],
        ["unserved", "1", "4.8%"], ["cancelled", "1", "4.8%"],
    ]
    assert "Loop end reasons" in out and "Models" in out
    reasons = out.split("Loop end reasons")[1].split("Models")[0]
    first = lines_after_rule(reasons)[0].split()
    assert first[:3] == ["completed", "3", "42.9%"]


def test_stats_on_a_missing_store_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "stats", "--db", tmp_path / "none.duckdb")
    assert code == 2 and out == "" and err.count("\n") == 1 and "no loopscope store" in err


# -- tools ------------------------------------------------------------------------------------------


def test_tools_json_is_the_tool_stats_view(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "tools", "--db", db, "--json")
    assert code == 0, err
    rows = json.loads(out)
    assert next(r["tool"] for r in rows) == "lookup_order"
    by_tool = {r["tool"]: r for r in rows}
    assert by_tool["lookup_order"]["calls"] == 14
    assert by_tool["book"]["cancelled"] == 1 and by_tool["book"]["failure_share"] == 0.5
    con = duckdb.connect(db, read_only=True)
    try:
        p95 = dict(con.execute("SELECT tool, p95_ms FROM tool_stats").fetchall())
    finally:
        con.close()
    assert {t: r["p95_ms"] for t, r in by_tool.items()} == pytest.approx(p95)


def test_tools_table_and_sorting(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "tools", "--db", db)
    assert code == 0, err
    assert all(len(line) <= 120 for line in out.splitlines())
    header = out.splitlines()[0].split()
    assert header == ["TOOL", "CALLS", "SERVED", "FAILED", "REFUSED", "BLOCKED", "UNSERVED", "CANCELLED", "NOT",
                      "SERVED", "P50", "P95", "P99", "LAST", "SEEN"]  # no RUNNING column: nothing runs
    rows = lines_after_rule(out)[:-1]
    assert rows[0].split()[:3] == ["lookup_order", "14", "14"]
    book = next(r for r in rows if r.startswith("book ")).split()
    assert book[1:8] == ["2", "1", "0", "0", "0", "0", "1"] and book[8] == "50.0%"
    assert all(row.endswith(" ago") for row in rows)
    assert out.splitlines()[-1].startswith("(durations in ms")
    code, out, err = run(capsys, "tools", "--db", db, "--sort", "failures", "--limit", "2")
    names = [line.split()[0] for line in lines_after_rule(out)[:-1]]
    assert len(names) == 2 and set(names) <= {"refund", "escalate", "fetch"}  # 100% not served
    code, out, err = run(capsys, "tools", "--db", db, "--sort", "name", "--json")
    assert [r["tool"] for r in json.loads(out)] == sorted(["lookup_order", "refund", "escalate", "search", "fetch", "book"])


def test_tools_declared(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "tools", "--declared", "--db", db)
    assert code == 0, err
    assert "offered but never called (3): " in out
    for agent, tool in workload.NEVER_CALLED:
        assert f"{tool} ({agent})" in out
    code, out, err = run(capsys, "tools", "--declared", "--agent", "support", "--db", db, "--json")
    rows = json.loads(out)
    assert {r["tool"] for r in rows} == set(workload.SUPPORT_TOOLS)
    assert rows[0]["tool"] == "translate" and rows[0]["turns_offered"] == 4 and rows[0]["calls"] == 0
    code, out, err = run(capsys, "tools", "--agent", "support", "--db", db)
    assert code == 2 and "--agent goes with --declared" in err


# -- sessions ---------------------------------------------------------------------------------------


def test_sessions_search_and_limit(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "sessions", "--db", db, "--search", "SUP", "--json")
    assert code == 0, err
    assert {s["session_id"] for s in json.loads(out)} == {"sup-1", "sup-2"}
    code, out, err = run(capsys, "sessions", "--db", db, "-s", "claude", "--json")  # a model
    assert [s["session_id"] for s in json.loads(out)] == ["res-1"]
    code, out, err = run(capsys, "sessions", "--db", db, "--search", "schedul")  # an agent
    assert [line.split()[0] for line in lines_after_rule(out)] == ["sch-1"]
    code, out, err = run(capsys, "sessions", "--db", db, "--search", "sup", "--limit", "1", "--json")
    assert [s["session_id"] for s in json.loads(out)] == ["sup-2"]  # the more recent one
    code, out, err = run(capsys, "sessions", "--db", db, "--search", "nobody")
    assert code == 0 and out.strip() == "no sessions match 'nobody'"


# -- tail -------------------------------------------------------------------------------------------


def test_tail_prints_the_newest_events(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    con = duckdb.connect(db, read_only=True)
    try:
        newest = con.execute("SELECT session_id, idx FROM events ORDER BY created_at DESC LIMIT 3").fetchall()[::-1]
        last_sup1 = con.execute("SELECT max(idx) FROM events WHERE session_id = 'sup-1'").fetchone()[0]
    finally:
        con.close()
    code, out, err = run(capsys, "tail", "-n", 3, "--db", db, "--json")
    assert code == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert [(e["session_id"], e["index"]) for e in events] == newest
    code, out, err = run(capsys, "tail", "sup-1", "-n", 2, "--db", db)
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["TIME", "IDX", "TYPE"]  # one session: no session column
    assert [line.split()[1] for line in lines[1:]] == [str(last_sup1 - 1), str(last_sup1)]
    code, out, err = run(capsys, "tail", "--db", db)
    assert code == 0 and len(out.splitlines()) == 11 and out.splitlines()[0].split()[:2] == ["TIME", "SESSION"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LOOPSCOPE_DB", "LOOPSCOPE_STRICT")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _reader(stream: Any, into: queue.Queue[str]) -> None:
    for line in stream:
        into.put(line)


def _wait_for(lines: queue.Queue[str], seen: list[str], predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate(seen):
            return True
        try:
            seen.append(lines.get(timeout=0.2))
        except queue.Empty:
            pass
    return predicate(seen)


class Follower:
    """``loopscope tail --follow --json`` in a child process, its output read line by line."""

    def __init__(self, db: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "loopscope", "tail", "--follow", "--json", "--interval", "0.1", "--db", str(db), *args],
            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.out_queue: queue.Queue[str] = queue.Queue()
        self.err_queue: queue.Queue[str] = queue.Queue()
        self.out: list[str] = []
        self.err: list[str] = []
        threading.Thread(target=_reader, args=(self.proc.stdout, self.out_queue), daemon=True).start()
        threading.Thread(target=_reader, args=(self.proc.stderr, self.err_queue), daemon=True).start()

    def stderr_says(self, text: str) -> None:
        assert _wait_for(self.err_queue, self.err, lambda s: any(text in x for x in s), 30), self.err

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(x) for x in self.out]

    def wait_events(self, predicate: Any) -> None:
        ok = _wait_for(self.out_queue, self.out, lambda s: predicate([json.loads(x) for x in s]), 30)
        assert ok, (self.out, self.err)

    def stop(self) -> int:
        """Ctrl-C, as a user would; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(20)
            time.sleep(0.1)  # the reader threads take the last lines
            while not self.err_queue.empty():  # what it said, for the failure message
                self.err.append(self.err_queue.get_nowait())
            return code
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            pytest.fail(f"tail --follow did not stop on Ctrl-C\n{self.out}\n{self.err}")


def test_tail_follow_sees_events_another_process_records(tmp_path: Path) -> None:
    db = tmp_path / "live.duckdb"
    loopscope.configure(db, flush_interval=0.05)
    follower = None
    try:
        with loopscope.turn(session_id="before", agent="a") as turn:
            turn.generation("one")
            turn.generation("two")
        loopscope.flush()
        follower = Follower(db, "-n", "1")
        follower.stderr_says("following")
        with loopscope.turn(session_id="live-1", agent="a", tools=[{"name": "probe"}]) as turn:
            turn.generation("probing", tool_calls=[{"id": "p1", "name": "probe", "arguments": {"n": 1}}])
            with loopscope.tool("probe", arguments={"n": 1}, call_id="p1") as call:
                call.set_result("ok")
            turn.generation("done")
        loopscope.flush()
        follower.wait_events(lambda events: sum(1 for e in events if e["session_id"] == "live-1") >= 4)
        with loopscope.turn(session_id="live-2", agent="b") as turn:
            turn.generation("a second session")
        loopscope.flush()
        follower.wait_events(lambda events: any(e["session_id"] == "live-2" for e in events))
    finally:
        loopscope.shutdown()
        code = follower.stop() if follower else 0
    assert code == 0, follower.err
    events = follower.events()
    before = [e for e in events if e["session_id"] == "before"]
    assert [(e["index"], e["content"]["body"]) for e in before] == [(2, "two")]  # -n 1: the newest old event, then new ones
    live = [e for e in events if e["session_id"] == "live-1"]
    assert [e["index"] for e in live] == list(range(1, len(live) + 1))
    assert [e["type"] for e in live][:4] == ["message", "tool_call_start", "tool_call_end", "message"]
    assert live[2]["content"]["outcome"] == "served"
    assert len({(e["session_id"], e["index"]) for e in events}) == len(events)  # nothing twice


def test_tail_follow_waits_for_a_store_that_does_not_exist_yet(tmp_path: Path) -> None:
    db = tmp_path / "later.duckdb"
    follower = Follower(db, "only-me")
    try:
        follower.stderr_says("waiting for a store")
        loopscope.configure(db, flush_interval=0.05)
        try:
            with loopscope.turn(session_id="someone-else", agent="a") as turn:
                turn.generation("not shown")
            with loopscope.turn(session_id="only-me", agent="a") as turn:
                turn.generation("shown")
            loopscope.flush()
            follower.wait_events(lambda events: any(e["session_id"] == "only-me" for e in events))
        finally:
            loopscope.shutdown()
    finally:
        code = follower.stop()
    assert code == 0, follower.err
    assert {e["session_id"] for e in follower.events()} == {"only-me"}


@pytest.mark.parametrize("session", ["shared", None], ids=["one-session", "all-sessions"])
def test_tail_follow_prints_a_session_in_index_order_when_a_later_row_was_made_earlier(tmp_path: Path, session: str | None) -> None:
    db = tmp_path / "order.duckdb"
    loopscope.configure(db, flush_interval=30)  # written by the flushes below only: one batch each
    follower = None
    try:
        with loopscope.turn(session_id="shared", agent="a", input="first"):
            pass
        loopscope.flush()
        follower = Follower(db, "-n", "0", *([session] if session else []))  # the new rows only
        follower.stderr_says("following")
        with loopscope.turn(session_id="shared", agent="b", input="now") as turn:
            turn.generation("answered now", finish_reason="stop")
        # a generation reported late (as another writer's batch would land): made an hour
        # ago, numbered after the rows above
        hour_ago = time.time_ns() - 3600 * 10**9
        with loopscope.turn(session_id="shared", agent="c") as turn:
            turn.generation("answered an hour ago", finish_reason="stop", start_time=hour_ago, end_time=hour_ago + 10**6)
        loopscope.flush()
        follower.wait_events(lambda events: len(events) >= 3)
    finally:
        loopscope.shutdown()
        code = follower.stop() if follower else 0
    assert code == 0, follower.err
    printed = [(e["index"], e["content"]["body"]) for e in follower.events()]
    assert printed == [(2, "now"), (3, "answered now"), (4, "answered an hour ago")]


# Several processes writing turns into one session at once: each numbers its batches' rows
# when it writes them, so a row made earlier in one process can get a higher index than a
# row made later in another.
SHARED_WRITER = """
    import sys, time
    import loopscope

    db, name, turns = sys.argv[1], sys.argv[2], int(sys.argv[3])
    loopscope.configure(db, flush_interval=0.02)
    for n in range(turns):
        with loopscope.turn(session_id="shared", agent=name, input=f"{name} asks {n}") as turn:
            turn.generation(f"{name} answers {n}", finish_reason="stop")
        time.sleep(0.005)
    loopscope.shutdown()
    print("finished", flush=True)
"""


@pytest.mark.parametrize("session", ["shared", None], ids=["one-session", "all-sessions"])
def test_tail_follow_over_a_session_several_processes_write_prints_its_indices_in_order(
    tmp_path: Path, spawn: Any, session: str | None
) -> None:
    db = tmp_path / "shared.duckdb"
    # every event is printed: those there when it starts (-n), then the ones that land
    follower = Follower(db, "-n", "100000", *([session] if session else []))
    try:
        follower.stderr_says("waiting for a store")
        writers = [spawn(f"writer-{i}", SHARED_WRITER, db, f"w{i}", 60) for i in range(3)]
        for writer in writers:
            assert writer.finish_ok(120).strip() == "finished"
        total = loopscope.Store(str(db)).last_indices()["shared"]
        assert total == 3 * 60 * 2  # every writer's every row is in the store
        follower.wait_events(lambda events: len(events) >= total)
    finally:
        code = follower.stop()
    assert code == 0, follower.err
    printed = [e["index"] for e in follower.events() if e["session_id"] == "shared"]
    # each index once, in increasing order: none skipped, none printed after a higher one
    assert printed == list(range(1, total + 1))


# -- export -----------------------------------------------------------------------------------------


def test_export_parquet_reads_back_with_the_same_counts(db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "export"
    code, out, err = run(capsys, "export", "--parquet", out_dir, "--db", db, "--json", "--progress")
    assert code == 0, err
    report = json.loads(out)  # the progress bar went to stderr
    assert "tool_calls" in err and "done" in err
    con = duckdb.connect()
    try:
        con.execute(f"ATTACH '{db}' AS store (READ_ONLY)")
        for table, day_column in (("events", "created_at"), ("turns", "timestamp"), ("tool_calls", "started_at")):
            files = f"{out_dir / table}/*/*.parquet"
            back = con.execute(
                f"SELECT count(*), count(DISTINCT date) FROM read_parquet('{files}', hive_partitioning = true)"
            ).fetchone()
            want = con.execute(
                f"SELECT count(*), count(DISTINCT timezone('UTC', {day_column})::DATE) FROM store.{table}"
            ).fetchone()
            assert back == want, table
            assert report["tables"][table]["rows"] == want[0] and report["tables"][table]["days"] == want[1]
            days = sorted(p.name for p in (out_dir / table).iterdir())
            assert days == [f"date={d}" for d in sorted(
                str(r[0]) for r in con.execute(f"SELECT DISTINCT timezone('UTC', {day_column})::DATE FROM store.{table}").fetchall()
            )]
            # the very rows of the store (JSON columns as text), in both directions
            con.execute("USE store")
            parquet = f"SELECT * EXCLUDE (date) FROM read_parquet('{files}', hive_partitioning = true)"
            stored = f"SELECT * EXCLUDE (date) FROM ({EXPORTS[table]})"
            assert con.execute(f"SELECT count(*) FROM ({parquet} EXCEPT ALL {stored})").fetchone()[0] == 0, table
            assert con.execute(f"SELECT count(*) FROM ({stored} EXCEPT ALL {parquet})").fetchone()[0] == 0, table
            con.execute("USE memory")
        served = con.execute(
            f"SELECT count(*) FROM read_parquet('{out_dir}/tool_calls/*/*.parquet', hive_partitioning = true) WHERE outcome = 'served'"
        ).fetchone()[0]
        assert served == 16
    finally:
        con.close()


def test_export_refuses_to_overwrite_unless_asked(db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "export"
    assert run(capsys, "export", "--parquet", out_dir, "--db", db, "--tables", "turns")[0] == 0
    code, out, err = run(capsys, "export", "--parquet", out_dir, "--db", db, "--tables", "turns")
    assert code == 2 and out == "" and "--overwrite" in err
    code, out, err = run(capsys, "export", "--parquet", out_dir, "--db", db, "--tables", "turns", "--overwrite")
    assert code == 0, err
    assert f"turns  {workload.TURNS:>12,} rows" in out
    assert not (out_dir / "events").exists()
    code, out, err = run(capsys, "export", "--parquet", out_dir, "--db", db, "--tables", "nope")
    assert code == 2 and "unknown table nope" in err
