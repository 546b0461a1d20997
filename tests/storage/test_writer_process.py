"""The store's writer in a process of its own (``configure(writer="process")``,
``LOOPSCOPE_WRITER=process``): the writer's promises, kept across the pipe, in both modes
where both apply. Real processes, real DuckDB files, real kills."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
from opentelemetry.sdk.trace import TracerProvider

import loopscope
import recorded
from loopscope._guard import clear_warning
from loopscope.cli.status import read_status
from loopscope.content.policy import ContentPolicy
from loopscope.ingest.writer_process import ProcessSpanWriter
from loopscope.storage.duckdb.writer import StoreWriter
from recorded import connect_when_free

MODES = ["thread", "process"]


def _turns(count: int, prefix: str = "s") -> None:
    for i in range(count):
        with loopscope.turn(session_id=f"{prefix}{i}", input=f"q{i}") as t:
            t.generation(f"a{i}", finish_reason="stop")


def _count(db: Path, table: str = "events") -> int:
    con = recorded.connect_when_free(db)
    try:
        return con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # type: ignore[index]
    finally:
        con.close()


def _gone(pid: int) -> bool:
    """Whether ``pid`` ended (no such process, or a zombie no one reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def _wait_gone(pid: int, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout  # a bound on the wait, not a measurement
    while not _gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("mode", MODES)
def test_flush_returns_once_the_rows_are_in_the_file(tmp_path: Path, mode: str) -> None:
    db = tmp_path / "flush.duckdb"
    pipeline = loopscope.configure(db, tracer_provider=TracerProvider(), writer=mode, flush_interval=3600)
    try:
        assert isinstance(pipeline.writer, ProcessSpanWriter if mode == "process" else StoreWriter)
        _turns(20)
        assert loopscope.flush()
        assert _count(db) == 40  # read by another connection: in the file, not in a queue
        assert _count(db, "turns") == 20
        stats = pipeline.stats()
        assert stats is not None and (stats.written_events, stats.written_turns, stats.queued) == (40, 20, 0)
    finally:
        loopscope.shutdown()


@pytest.mark.parametrize("mode", MODES)
def test_rows_recorded_without_a_pause_reach_the_file_without_a_flush(tmp_path: Path, mode: str) -> None:
    """Spans queued while the sender (or the thread writer) is at work are sent in their
    turn, not only at the next flush: another process sees every row, with no flush asked."""
    db = tmp_path / "stream.duckdb"
    loopscope.configure(db, tracer_provider=TracerProvider(), writer=mode)
    try:
        started, n = time.monotonic(), 0
        while time.monotonic() - started < 2.0:  # a steady stream: the queue is seldom empty
            _turns(1, prefix=f"t{n}-")
            n += 1
            time.sleep(0.002)
        deadline = time.monotonic() + 30  # a bound on the wait, not a measurement
        count = 0
        while count < 2 * n and time.monotonic() < deadline:
            time.sleep(0.2)
            try:
                count = _count(db)
            except duckdb.Error:
                count = 0  # the writer holds the file this moment
        assert count == 2 * n
    finally:
        loopscope.shutdown()


@pytest.mark.parametrize("mode", MODES)
def test_the_mode_comes_from_the_environment(tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOOPSCOPE_WRITER", mode)
    pipeline = loopscope.configure(tmp_path / "env.duckdb", tracer_provider=TracerProvider())
    try:
        assert isinstance(pipeline.writer, ProcessSpanWriter if mode == "process" else StoreWriter)
    finally:
        loopscope.shutdown()


def test_an_unknown_mode_is_refused_before_anything_changes(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'thread' or 'process'"):
        loopscope.configure(tmp_path / "bad.duckdb", tracer_provider=TracerProvider(), writer="fiber")
    assert not (tmp_path / "bad.duckdb").exists()


def test_a_content_hook_a_process_cannot_take_keeps_the_thread(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    policy = ContentPolicy(redact=lambda where, text: text.replace("secret", "[gone]"))
    # said once per process: an earlier test whose hook is a lambda under the default writer said it
    clear_warning("writer-process-options")
    pipeline = loopscope.configure(tmp_path / "hook.duckdb", tracer_provider=TracerProvider(), writer="process",
                                   content_policy=policy)
    try:
        assert isinstance(pipeline.writer, StoreWriter)
        with loopscope.turn(session_id="s", input="my secret") as t:
            t.generation("ok", finish_reason="stop")
        assert loopscope.flush()
    finally:
        loopscope.shutdown()
    assert "runs in a thread" in caplog.text
    bodies = [e.content.body for e in loopscope.Store(str(tmp_path / "hook.duckdb")).get_timeline("s")]
    assert bodies == ["my [gone]", "ok"]


@pytest.mark.parametrize("mode", MODES)
def test_a_full_queue_drops_spans_and_status_counts_them(tmp_path: Path, mode: str) -> None:
    """The application's queue is bounded as the thread writer's is (``queue_size``): past
    it spans are dropped, and the store's health record says how many."""
    db = tmp_path / "full.duckdb"
    pipeline = loopscope.configure(db, tracer_provider=TracerProvider(), writer=mode, queue_size=10, flush_interval=3600)
    try:
        _turns(40)  # ~80 spans at once: the sender ships after a quarter second, the thread writer after an hour
        assert loopscope.flush()
        stats = pipeline.stats()
        assert stats is not None and stats.dropped > 0
        dropped = stats.dropped
    finally:
        loopscope.shutdown()
    status = read_status(str(db))
    assert status["totals"]["dropped_queue_full"] == dropped, status["writers"]


EXIT_WITHOUT_SHUTDOWN = """
    import sys
    import loopscope
    from opentelemetry.sdk.trace import TracerProvider

    loopscope.configure(sys.argv[1], tracer_provider=TracerProvider(), writer=sys.argv[2], flush_interval=3600)
    for i in range(30):
        with loopscope.turn(session_id=f"s{i}", input="q") as t:
            t.generation("a", finish_reason="stop")
    print("recorded")  # and the script ends: no flush, no shutdown
"""


@pytest.mark.parametrize("mode", MODES)
def test_a_program_that_ends_without_shutdown_stores_its_rows(tmp_path: Path, spawn, mode: str) -> None:
    db = tmp_path / "exit.duckdb"
    assert spawn("app", EXIT_WITHOUT_SHUTDOWN, db, mode).finish_ok(60).strip() == "recorded"
    assert _count(db) == 60
    assert _count(db, "turns") == 30


SHIPS_THEN_WAITS = """
    import sys, time
    import loopscope
    from opentelemetry.sdk.trace import TracerProvider

    pipeline = loopscope.configure(sys.argv[1], tracer_provider=TracerProvider(), writer="process", flush_interval=3600)
    for i in range(int(sys.argv[2])):
        with loopscope.turn(session_id=f"s{i}", input="q") as t:
            t.generation("a", finish_reason="stop")
    # stats() is answered after the child read every span queued before it, or gives up after a
    # second (STATS_WAIT) with the child's last counters: under load the child may still be
    # starting, so ask until it answers (its answer is the sync, not the counters)
    deadline = time.monotonic() + 60
    while True:
        pipeline.writer.stats()
        if pipeline.writer._answered.is_set() or time.monotonic() > deadline:
            break
    print(pipeline.writer.child_pid(), flush=True)
    time.sleep(120)
"""


def test_the_writer_process_writes_what_it_received_when_the_application_is_killed(tmp_path: Path, spawn) -> None:
    """SIGKILL to the application: its writer process sees its stdin end, writes the rows
    of every span it received (none had been written: the interval is an hour) and exits."""
    db = tmp_path / "killed.duckdb"
    app = spawn("app", SHIPS_THEN_WAITS, db, 25)
    deadline = time.monotonic() + 60
    while not app.out.read_text().strip():
        assert app.running() and time.monotonic() < deadline, app.output()
        time.sleep(0.05)
    child = int(app.out.read_text().split()[0])
    assert not _gone(child)
    app.kill()
    assert _wait_gone(child), "the writer process outlived its application"
    assert _count(db) == 50
    assert _count(db, "turns") == 25
    status = read_status(str(db))
    assert status["totals"]["dropped_unwritable"] == 0 and status["totals"]["dropped_queue_full"] == 0


FORKS = """
    import os, sys
    import duckdb
    import loopscope
    from opentelemetry.sdk.trace import TracerProvider

    pipeline = loopscope.configure(sys.argv[1], tracer_provider=TracerProvider(), writer="process", flush_interval=3600)
    with loopscope.turn(session_id="parent-0", input="q") as t:
        t.generation("a", finish_reason="stop")
    assert loopscope.flush()
    pid = os.fork()
    if pid == 0:  # the fork records to a writer process of its own, never into the parent's pipe
        for i in range(3):
            with loopscope.turn(session_id=f"fork-{i}", input="q") as t:
                t.generation("a", finish_reason="stop")
        ok = loopscope.flush()
        loopscope.shutdown()
        os._exit(0 if ok else 3)
    for i in range(1, 4):
        with loopscope.turn(session_id=f"parent-{i}", input="q") as t:
            t.generation("a", finish_reason="stop")
    assert loopscope.flush()
    _, status = os.waitpid(pid, 0)
    print("fork", os.waitstatus_to_exitcode(status))
    loopscope.shutdown()
"""


def test_a_fork_of_the_application_gets_a_writer_process_of_its_own(tmp_path: Path, spawn) -> None:
    db = tmp_path / "fork.duckdb"
    assert spawn("app", FORKS, db).finish_ok(90).strip() == "fork 0"
    con = connect_when_free(db)
    sessions = sorted(r[0] for r in con.execute("SELECT session_id FROM turns").fetchall())
    con.close()
    assert sessions == sorted([f"parent-{i}" for i in range(4)] + [f"fork-{i}" for i in range(3)])
    assert _count(db) == 14


ZERO_CODE_APP = """
import os
import loopscope
import loopscope.pipeline

with loopscope.turn(session_id="zero-code", input="q") as t:
    t.generation("a", finish_reason="stop")
assert loopscope.flush()
writer = loopscope.pipeline.active().writer
pid = writer.child_pid()
children = []
for entry in os.listdir("/proc"):
    if entry.isdigit():
        try:
            with open(f"/proc/{entry}/stat") as stat:
                if int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                    children.append(entry)
        except OSError:
            pass
print(type(writer).__name__, len(children))
"""


def test_loopscope_run_does_not_instrument_the_writer_process(tmp_path: Path) -> None:
    """Zero-code mode puts its ``sitecustomize`` on PYTHONPATH: the writer process (run with
    ``-I``) must not start loopscope in itself (a writer of its own, a writer process of its
    own's, and so on)."""
    script = tmp_path / "app.py"
    script.write_text(ZERO_CODE_APP)
    db = tmp_path / "zero.duckdb"
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "LOOPSCOPE_"))}
    env.update(LOOPSCOPE_WRITER="process", LOOPSCOPE_DB=str(db), PYTHONPATH=str(root))
    done = subprocess.run([sys.executable, "-m", "loopscope", "run", "--", sys.executable, str(script)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split() == ["ProcessSpanWriter", "0"]
    assert _count(db, "turns") == 1
    assert _count(db, "loopscope_writers") == 1  # the writer process's row alone
