"""Faults around the store and the exporter: a full disk, a store path that stops being
writable, an OTLP endpoint that refuses or hangs. The application's calls succeed
unchanged, loopscope says once and clearly what is wrong, and it recovers when the fault
clears. (A store file held by another process: tests/storage/test_live_reads.py.)"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider

import loopscope

ROOT = Path(__file__).resolve().parents[2]

DISK_FULL = textwrap.dedent(
    """
    import json, logging, os, resource, signal, sys, time
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing us
    logging.basicConfig(level=logging.WARNING, format="LOG %(message)s")
    import loopscope
    db = sys.argv[1]
    # the thread writer: the file-size limit below is this process's (a writer process has its own)
    pipeline = loopscope.configure(db, flush_interval=0.05, writer="thread")
    loopscope.flush()
    limit = os.path.getsize(db) + 64 * 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))  # the disk is full from here on
    answers = []
    for i in range(40):
        @loopscope.tool
        def big(i: int) -> str:
            return "x" * 100_000 + str(i)
        with loopscope.turn(session_id=f"full-{i}", input=f"question {i}") as t:
            with t.round() as rnd:
                rnd.response("calling", tool_calls=[{"id": f"c{i}", "name": "big", "arguments": {"i": i}}])
            answers.append(len(big(i)))
            t.generation(f"answer {i}", finish_reason="stop")
    flushed_while_full = loopscope.flush(timeout=1.0)
    deadline = time.monotonic() + 60  # a loaded machine: the writer may not have tried yet
    while pipeline.stats().failed_writes == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # space again
    flushed_after = loopscope.flush(timeout=30.0)
    stats = pipeline.stats()
    print(json.dumps({"answers": answers, "flushed_while_full": flushed_while_full, "flushed_after": flushed_after,
                      "dropped": stats.dropped, "queued": stats.queued}))
    loopscope.shutdown()
    """
)

# the faults are injected into the thread writer, in this process and its children (see conftest)
pytestmark = pytest.mark.usefixtures("thread_writer_everywhere")


def _child(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPSCOPE_")}
    env["LOOPSCOPE_WRITER"] = "thread"  # see _thread_writer
    return subprocess.run([sys.executable, "-c", script, *args], check=False, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_a_full_disk_keeps_events_in_memory_says_so_once_and_writes_them_later(tmp_path: Path) -> None:
    db = tmp_path / "full.duckdb"
    proc = _child(DISK_FULL, str(db))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["answers"] == [100_000 + len(str(i)) for i in range(40)]  # every call returned as usual
    assert report["flushed_while_full"] is False
    assert report["flushed_after"] is True and report["dropped"] == 0 and report["queued"] == 0
    problems = [line for line in proc.stderr.splitlines() if line.startswith("LOG") and "cannot write" in line]
    assert len(problems) == 1, proc.stderr  # said once, not once per batch
    assert str(db) in problems[0]
    assert any("works again" in line for line in proc.stderr.splitlines())
    store = loopscope.Store(str(db))
    for i in range(40):
        events = store.get_timeline(f"full-{i}")
        assert [e.type for e in events] == ["message", "message", "tool_call_start", "tool_call_end", "message"]
        assert [e.index for e in events] == [1, 2, 3, 4, 5]
        assert events[3].content.result == "x" * 100_000 + str(i)


def test_a_store_path_that_stops_being_a_file_recovers(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The file is moved away and a folder takes its place: loopscope keeps the events,
    warns once, and writes them when the path is usable again."""
    db = tmp_path / "moving.duckdb"
    loopscope.configure(db, tracer_provider=TracerProvider(), flush_interval=0.05)
    try:
        with loopscope.turn(session_id="before", input="one") as t:
            t.generation("ok", finish_reason="stop")
        assert loopscope.flush()
        db.rename(tmp_path / "elsewhere.duckdb")
        db.mkdir()
        caplog.clear()
        for i in range(3):
            with loopscope.turn(session_id="during", input=f"q{i}") as t:
                t.generation(f"a{i}", finish_reason="stop")
        assert loopscope.flush(timeout=1.0) is False
        problems = [r for r in caplog.records if "cannot write" in r.getMessage()]
        assert len(problems) == 1 and str(db) in problems[0].getMessage()
        db.rmdir()
        (tmp_path / "elsewhere.duckdb").rename(db)
        assert loopscope.flush(timeout=30.0)
    finally:
        loopscope.shutdown()
    store = loopscope.Store(str(db))
    assert [e.content.body for e in store.get_timeline("before")] == ["one", "ok"]
    assert [e.content.body for e in store.get_timeline("during")] == ["q0", "a0", "q1", "a1", "q2", "a2"]


class _Hanging:
    """A TCP endpoint that accepts connections and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.conns: list[socket.socket] = []
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)

    def close(self) -> None:
        self._stop = True
        self.sock.close()
        for c in self.conns:
            c.close()


def _refusing_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens here any more: connections are refused
    return f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("fault", ["refusing", "hanging"])
def test_an_otlp_endpoint_that_refuses_or_hangs_changes_nothing_for_the_app(tmp_path: Path, fault: str) -> None:
    hanging = _Hanging() if fault == "hanging" else None
    url = hanging.url if hanging else _refusing_url()
    db = tmp_path / "otlp.duckdb"
    try:
        loopscope.configure(db, tracer_provider=TracerProvider(), otlp_endpoint=url, flush_interval=0.05)
        responses = []
        for i in range(50):
            with loopscope.turn(session_id=f"s{i}", input="hi") as t:
                t.generation(f"answer {i}", finish_reason="stop")
            responses.append(t.response.response_content)
        assert responses == [f"answer {i}" for i in range(50)]
        started = time.monotonic()
        loopscope.shutdown()
        assert time.monotonic() - started < 20  # bounded, whatever the endpoint does
    finally:
        if hanging:
            hanging.close()
    store = loopscope.Store(str(db))
    assert len(store.list_sessions()) == 50  # the local store has everything


@pytest.fixture
def stuck_writer(monkeypatch) -> Iterator[threading.Event]:
    """Every store batch waits (up to 30 s) until the event it yields is set; set at the end."""
    from loopscope.storage.duckdb import writer as writer_module

    gate = threading.Event()
    original = writer_module.write_batch

    def stuck(*args, **kwargs):
        gate.wait(30)
        return original(*args, **kwargs)

    monkeypatch.setattr(writer_module, "write_batch", stuck)
    yield gate
    gate.set()


def test_a_stuck_writer_bounds_its_queue_by_count_and_counts_what_it_drops(tmp_path: Path, stuck_writer: threading.Event) -> None:
    """The writer cannot write for a while: the queue holds at most ``queue_size`` spans,
    the rest are dropped and counted, the app's calls run as usual, and what was kept is
    written when the writer gets going again. (A bound in spans, not in bytes.)"""
    gate = stuck_writer
    pipeline = loopscope.configure(tmp_path / "stuck.duckdb", tracer_provider=TracerProvider(), flush_interval=0.05, queue_size=200)
    try:
        peak = 0
        for i in range(5_000):  # 15,000 spans while nothing can be written
            with loopscope.turn(session_id=f"s{i}", input="q") as t:
                t.generation("a", finish_reason="stop")
            assert t.response.response_content == "a"
            peak = max(peak, pipeline.stats().queued)
        stats = pipeline.stats()
        # bounded: queue_size spans waiting, plus the rows of the one batch being written
        # (never more than what the queue held when it was taken); without the bound it
        # would hold all 15,000
        assert peak <= 1_000
        # counted as the store's rows (10,000 events and 5,000 turns sent): most of them dropped
        assert stats.dropped >= 8_500 and stats.dropped_turns >= 4_200, stats
        gate.set()
        assert loopscope.flush(timeout=30)
        stats = pipeline.stats()
        kept = stats.written_events + stats.written_turns
        # every event and turn written or counted dropped, none of them twice
        assert (stats.written_events + stats.dropped, stats.written_turns + stats.dropped_turns) == (10_000, 5_000)
    finally:
        gate.set()
        loopscope.shutdown()
    store = loopscope.Store(str(tmp_path / "stuck.duckdb"))
    _, rows = store.sql("SELECT (SELECT count(*) FROM events) + (SELECT count(*) FROM turns)")
    assert rows[0][0] == kept > 0
    assert pipeline.dropped()["store"] == stats.dropped


# -- issue 15: a stuck writer does not hold the exit; what is not written is counted ----------------

STUCK_AT_EXIT = """
    import sys, time
    import loopscope
    from loopscope.storage.duckdb import writer

    def stuck(*args, **kwargs):
        time.sleep(100)  # a write that does not end (a disk that stalls, say)

    writer.write_batch = stuck
    loopscope.configure(sys.argv[1], flush_interval=0.05)
    for i in range(20):
        with loopscope.turn(session_id=f"s{i}", input="q") as t:
            t.generation("a", finish_reason="stop")
    if sys.argv[2] == "shutdown":
        loopscope.shutdown()
        print("shut down")
"""


@pytest.mark.parametrize("how", ["exit", "shutdown"])
def test_a_writer_stuck_in_a_write_does_not_hold_the_exit_and_its_events_are_counted(tmp_path: Path, spawn, how: str) -> None:
    """The writer is inside a write that takes 100 s: the process still ends within the
    close bound (5 s, CLOSE_TIMEOUT; the wait below allows 30), at exit as after an
    explicit shutdown(), and `status` from another process counts what it held."""
    from loopscope.cli.status import read_status

    db = tmp_path / "stuck.duckdb"
    child = spawn("stuck", STUCK_AT_EXIT, db, how)
    assert child.wait(30) == 0, child.output()
    if how == "shutdown":
        assert "shut down" in child.out.read_text()
    assert "could not be stored" in child.err.read_text()
    status = read_status(str(db))
    # 20 turns of 2 events and a summary, none written: counted as the store's rows, exactly
    assert (status["totals"]["dropped_unwritable"], status["totals"]["turns_dropped_unwritable"]) == (40, 20), status
    assert any("40 events and 20 turns lost" in line for line in status["problems"]), status["problems"]


def _default_store_child(cwd: Path | str, endpoint: str, **env: str) -> subprocess.CompletedProcess[str]:
    script = textwrap.dedent(
        """
        import loopscope
        loopscope.instrument()
        for i in range(3):
            with loopscope.turn(session_id=f"s{i}", input="q") as t:
                t.generation("a", finish_reason="stop")
        loopscope.shutdown()
        print("ok")
        """
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPSCOPE_", "OTEL_"))}
    base.update(LOOPSCOPE_STRICT="1", PYTHONPATH=str(ROOT), OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, **env)
    return subprocess.run([sys.executable, "-c", script], check=False, env=base, cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("writer", ["default writer", "thread writer"])
@pytest.mark.parametrize("where", ["read-only working directory", "LOOPSCOPE_DB in a missing folder", "LOOPSCOPE_DB under a file"])
def test_a_default_store_that_cannot_be_written_turns_recording_off_once_and_export_still_works(
    tmp_path: Path, where: str, writer: str
) -> None:
    """instrument() and turn() with a default store that cannot be written: no exception
    reaches the app, one warning on stderr says recording to the store is off, and the
    spans still reach the OTLP receiver. (Tests run as root, whom permission bits do not
    stop: /proc takes no new files from anyone, a missing folder is not made, a file is
    no folder.)"""
    from fakes import otlp_receiver

    # the default writer (a process of its own) finds it in its child; the thread at configure()
    chosen = {"LOOPSCOPE_WRITER": "thread"} if writer == "thread writer" else {}
    receiver, server = otlp_receiver.start()
    try:
        if where == "read-only working directory":
            proc = _default_store_child("/proc", receiver.endpoint, **chosen)
        elif where == "LOOPSCOPE_DB in a missing folder":
            db = str(tmp_path / "missing" / "x.duckdb")
            proc = _default_store_child(tmp_path, receiver.endpoint, LOOPSCOPE_DB=db, **chosen)
        else:
            (tmp_path / "afile").write_text("x")
            proc = _default_store_child(tmp_path, receiver.endpoint, LOOPSCOPE_DB=str(tmp_path / "afile" / "x.duckdb"), **chosen)
        assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
        assert "Traceback" not in proc.stderr, proc.stderr
        warnings = [line for line in proc.stderr.splitlines() if "recording to the store is off" in line]
        assert len(warnings) == 1, proc.stderr
        # nothing promises a retry that will not come (the writer is stopped with recording off)
        assert "will retry" not in proc.stderr, proc.stderr
        assert receiver.wait_for(lambda r: sum(s.name.startswith("invoke_agent") for s in r.spans) >= 3), [s.name for s in receiver.spans]
    finally:
        server.shutdown()
        server.server_close()
    assert not (tmp_path / "missing").exists()  # a missing folder is never made


DISK_FULL_THEN_SOME_ROOM = textwrap.dedent(
    """
    import base64, json, os, resource, signal, sys, time
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing us
    import loopscope
    db = sys.argv[1]
    pipeline = loopscope.configure(db, flush_interval=0.05)
    loopscope.flush()
    base = os.path.getsize(db)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (base + 64 * 1024, hard))  # the disk is full from here on

    @loopscope.tool
    def big(i: int) -> str:
        return base64.b64encode(os.urandom(75_000)).decode()  # 100 KB that no compression shrinks

    for i in range(80):  # 8 MB of tool results that no compression shrinks much
        with loopscope.turn(session_id=f"full-{i}", input=f"question {i}") as t:
            with t.round() as rnd:
                rnd.response("calling", tool_calls=[{"id": f"c{i}", "name": "big", "arguments": {"i": i}}])
            big(i)
            t.generation(f"answer {i}", finish_reason="stop")
    loopscope.flush(timeout=2.0)
    deadline = time.monotonic() + 60  # a loaded machine: the writer may not have met the full disk yet
    while pipeline.stats().failed_writes == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    written_while_full = pipeline.stats().written_events
    # room again, for about half: DuckDB stores the 8 MB of base64 text in about 6 MB, and
    # a checkpoint needs room beside what it replaces (below 2.5 MB nothing fitted at all)
    resource.setrlimit(resource.RLIMIT_FSIZE, (base + 4_000_000, hard))
    loopscope.flush(timeout=20.0)
    loopscope.shutdown()
    stats = pipeline.stats()
    print(json.dumps({"written_while_full": written_while_full, "events": stats.written_events,
                      "turns": stats.written_turns, "dropped": stats.dropped}))
    """
)


def test_a_full_disk_with_some_room_again_writes_what_fits_and_counts_the_rest(tmp_path: Path) -> None:
    """After a full disk, room for part of what waits: the writer writes it in pieces,
    in order, instead of retrying one transaction that cannot fit, and at shutdown what
    still did not fit is counted, so that `status` (another process) reports it as lost,
    never as "kept and written later"."""
    from loopscope.cli.status import read_status

    db = tmp_path / "full.duckdb"
    proc = _child(DISK_FULL_THEN_SOME_ROOM, str(db))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    store = loopscope.Store(str(db))
    _, rows = store.sql("SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM turns), "
                        "(SELECT count(DISTINCT id) FROM events), (SELECT count(*) FROM model_calls)")
    events, turns, distinct, _calls = rows[0]
    # a commit DuckDB made durable before its checkpoint failed counts as written, not retried
    assert distinct == events, f"{events - distinct} events stored twice"
    assert events > report["written_while_full"]  # pieces were written once there was room
    assert (events, turns) == (report["events"], report["turns"])
    status = read_status(str(db))
    lost, lost_turns = status["totals"]["dropped_unwritable"], status["totals"]["turns_dropped_unwritable"]
    # 5 events and a summary per turn: each written or counted, as the store's rows
    assert lost > 0 and events + lost == 80 * 5 and turns + lost_turns == 80, status["totals"]
    assert not any("written later" in line for line in status["problems"]), status["problems"]
    assert any(f"{lost} events and {lost_turns} turn" in line and "lost" in line for line in status["problems"]), status["problems"]
    # whatever was written of a session is whole from its first event on: no gap
    _, sessions = store.sql("SELECT session_id, min(idx), max(idx), count(*) FROM events GROUP BY session_id")
    assert len(sessions) > 10
    assert all(low == 1 and high == n for _, low, high, n in sessions), [s for s in sessions if s[1] != 1 or s[2] != s[3]][:5]


def test_small_spans_with_a_stuck_writer_hold_about_the_byte_bound_in_memory(
    tmp_path: Path, stuck_writer: threading.Event, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many small turns while the writer cannot write: the spans the queue keeps take about
    ``queue_bytes`` of memory (what Python allocated for them, not an estimate), not several
    times it; the rest are refused and counted, and what was kept is written afterwards."""
    import gc
    import tracemalloc

    import pyarrow.compute  # noqa: F401 - imported by the writer's first batch: not the queue's memory

    from loopscope.storage.duckdb import writer as writer_module

    gate, entered = stuck_writer, threading.Event()
    stuck = writer_module.write_batch

    def entering(*args, **kwargs):
        entered.set()
        return stuck(*args, **kwargs)

    monkeypatch.setattr(writer_module, "write_batch", entering)
    bound = 2 << 20
    pipeline = loopscope.configure(tmp_path / "small.duckdb", tracer_provider=TracerProvider(), flush_interval=0.05, queue_bytes=bound)
    question = "what is the weather in Paris? " * 6
    try:
        with loopscope.turn(session_id="warm", input=question) as t:  # the writer's first batch: it stays stuck in it
            t.generation("a", finish_reason="stop")
        assert entered.wait(30)
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            for i in range(4_000):  # 12,000 spans of ~0.2 KB of text each
                with loopscope.turn(session_id=f"s{i}", input=question) as t:
                    t.generation("It is 21 C and dry.", finish_reason="stop")
            del t
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        stats = pipeline.stats()
        assert held < 2 * bound, f"{held / bound:.1f} x the bound held by the queue"
        assert stats.dropped > 0 and stats.queued < 4_000 * 3
        gate.set()
        assert loopscope.flush(timeout=60)
        stats = pipeline.stats()
    finally:
        gate.set()
        loopscope.shutdown()
    store = loopscope.Store(str(tmp_path / "small.duckdb"))
    _, rows = store.sql("SELECT count(*) FROM turns")
    assert 0 < rows[0][0] < 4_000
    assert pipeline.dropped()["store"] == stats.dropped


def test_one_mib_values_with_a_stuck_writer_stay_within_the_byte_bound_and_drops_are_counted(tmp_path: Path, stuck_writer: threading.Event) -> None:
    """Tool results of 1 MiB while the writer cannot write: the queue and the batch held
    stay within about twice ``queue_bytes`` (not 40 MiB), the rest is dropped and counted,
    and what was kept is written once the writer gets going."""
    gate = stuck_writer
    bound = 8 << 20
    pipeline = loopscope.configure(tmp_path / "big.duckdb", tracer_provider=TracerProvider(), flush_interval=0.05, queue_bytes=bound)

    @loopscope.tool
    def fetch(i: int) -> str:
        return chr(ord("a") + i % 26) * (1 << 20)

    try:
        peak = 0
        for i in range(40):
            with loopscope.turn(session_id=f"big-{i}", input="q"):
                assert len(fetch(i)) == 1 << 20
            peak = max(peak, pipeline.stats().queued_bytes)
        stats = pipeline.stats()
        assert peak <= 2 * bound + (2 << 20), peak
        assert stats.dropped > 0
        gate.set()
        assert loopscope.flush(timeout=30)
        stats = pipeline.stats()
    finally:
        gate.set()
        loopscope.shutdown()
    store = loopscope.Store(str(tmp_path / "big.duckdb"))
    _, rows = store.sql("SELECT count(*) FROM events WHERE type = 'tool_call_end'")
    assert 0 < rows[0][0] < 40
    assert pipeline.dropped()["store"] == stats.dropped
