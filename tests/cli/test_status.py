"""``loopscope status``: the store at a glance, and what its writers dropped or failed to
write, read from another process than the one that wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from children import FELL_BACK, HOLDER

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60


def run(tmp_path: Path, name: str, code: str, *args: Any, wait: bool = True) -> subprocess.Popen[str]:
    """``code`` as a script in a fresh interpreter (strict mode), from ``tmp_path``."""
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(code))
    env = {**os.environ, "LOOPSCOPE_STRICT": "1"}
    env.pop("LOOPSCOPE_DB", None)
    proc = subprocess.Popen([sys.executable, str(script), *map(str, args)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if wait:
        out, err = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 0, f"{name} exited with {proc.returncode}\n{out}\n{err}"
        assert FELL_BACK not in err, f"{name}'s writer fell back to the thread\n{err}"
    return proc


def status(db: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """``loopscope status`` in its own process, as a user runs it."""
    env = {**os.environ}
    env.pop("LOOPSCOPE_DB", None)
    return subprocess.run([sys.executable, "-m", "loopscope", "--db", str(db), "status", *flags],
                          capture_output=True, text=True, timeout=TIMEOUT, env=env, cwd=ROOT, check=False)


def status_json(db: Path) -> dict[str, Any]:
    done = status(db, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


AGENT = """
    import sys
    import loopscope
    from opentelemetry.sdk.trace import TracerProvider

    db, turns, queue = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    # a long flush interval: the queue fills before the writer takes from it
    loopscope.configure(db, tracer_provider=TracerProvider(), queue_size=queue, flush_interval=5.0)

    @loopscope.tool
    def add(x: int, y: int) -> int:
        return x + y

    for i in range(turns):
        with loopscope.turn(session_id="s", agent="calc", input=f"{i} + 1?") as t:
            t.generation("adding", tool_calls=[{"id": f"c{i}", "name": "add", "arguments": {"x": i, "y": 1}}])
            add(i, 1)
            t.generation(str(i + 1), finish_reason="stop")
    loopscope.shutdown()
"""


def test_a_clean_store_says_nothing_was_dropped(tmp_path):
    db = tmp_path / "clean.duckdb"
    run(tmp_path, "agent", AGENT, db, 3, 10_000)
    done = status(db)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert f"store       {db}" in out
    assert "(schema " in out
    assert "1 sessions, 15 events, 3 turns, 3 tool calls" in out
    assert "nothing was dropped and no write failed" in out
    assert "dropped:" not in out
    report = status_json(db)
    assert (report["sessions"], report["events"], report["turns"], report["tool_calls"]) == (1, 15, 3, 3)
    assert report["size_bytes"] == db.stat().st_size + (os.path.getsize(f"{db}.wal") if os.path.exists(f"{db}.wal") else 0)
    assert report["problems"] == []
    [writer] = report["writers"]
    assert writer["alive"] == "stopped" and writer["stopped_at"] is not None
    assert (writer["events_written"], writer["turns_written"]) == (15, 3)
    assert (writer["dropped_queue_full"], writer["failed_writes"], writer["otlp_dropped"]) == (0, 0, 0)
    assert writer["host"] and writer["pid"] > 0 and writer["started_at"] <= writer["last_seen"]
    assert report["last_event_at"] is not None


def test_drops_from_a_tiny_queue_show_up_from_another_process(tmp_path):
    db = tmp_path / "drops.duckdb"
    run(tmp_path, "agent", AGENT, db, 20, 5)
    report = status_json(db)
    [writer] = report["writers"]
    # 20 turns give 100 events and 20 summaries; the queue held 5 of them at a time
    assert writer["events_written"] + writer["turns_written"] == report["events"] + report["turns"]
    # counted as the store counts rows: every event and every turn stored or dropped, none of them twice
    assert writer["dropped_queue_full"] == 100 - report["events"] > 0, report["problems"]
    assert writer["turns_dropped_queue_full"] == 20 - report["turns"]
    assert writer["queue_size"] == 5
    assert report["totals"]["dropped_queue_full"] == writer["dropped_queue_full"]
    assert report["totals"]["events_lost"] == 100 - report["events"]
    assert report["totals"]["turns_lost"] == 20 - report["turns"]
    out = status(db).stdout
    dropped, turns = writer["dropped_queue_full"], writer["turns_dropped_queue_full"]
    assert f"{dropped} events and {turns} turn{'' if turns == 1 else 's'} dropped: queue full" in out
    assert "raise queue_size" in out
    assert "nothing was dropped" not in out


WRITER = """
    import pathlib, sys, time
    import loopscope
    from opentelemetry.sdk.trace import TracerProvider

    db, recorded, release = sys.argv[1], pathlib.Path(sys.argv[2]), pathlib.Path(sys.argv[3])
    pipeline = loopscope.configure(db, tracer_provider=TracerProvider(), flush_interval=0.05)
    pipeline.writer.lock_timeout = 0.2  # fail fast while the file is held
    with loopscope.turn(session_id="held", agent="a", input="while held") as t:
        t.generation("answer")
    assert loopscope.flush(timeout=10) is False
    part = recorded.with_name("recorded.part")  # the test reads it as soon as it exists: write it whole
    part.write_text(str(pipeline.stats().failed_writes))
    part.replace(recorded)
    deadline = time.monotonic() + 30
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    pipeline.writer.lock_timeout = 10.0
    loopscope.shutdown()
"""


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not path.exists():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"child exited early ({proc.returncode})\n{out}\n{err}")
        assert time.monotonic() < deadline, f"timed out waiting for {path.name}"
        time.sleep(0.02)


def test_failed_writes_while_another_process_holds_the_file_show(tmp_path, children):
    db = tmp_path / "held.duckdb"
    holding, recorded, release = tmp_path / "holding", tmp_path / "recorded", tmp_path / "release"
    holder = run(tmp_path, "holder", HOLDER, db, holding, release, wait=False)
    children.append(holder)
    wait_for(holding, holder)
    writer = run(tmp_path, "writer", WRITER, db, recorded, release, wait=False)
    children.append(writer)
    wait_for(recorded, writer)
    failed_while_held = int(recorded.read_text())
    assert failed_while_held >= 1
    release.write_text("go")
    assert holder.wait(TIMEOUT) == 0
    out, err = writer.communicate(timeout=TIMEOUT)
    assert writer.returncode == 0, err
    assert FELL_BACK not in err, err

    report = status_json(db)
    [row] = report["writers"]
    assert row["failed_writes"] >= failed_while_held
    assert "lock" in row["last_error"].lower()  # DuckDB's word for a file another process holds
    assert row["last_error_at"] is not None and row["last_error_at"] <= row["last_seen"]
    assert row["dropped_queue_full"] == row["dropped_unwritable"] == 0
    assert report["events"] == 2 and report["turns"] == 1  # kept in memory, written once the file was free
    out = status(db).stdout
    assert f"{row['failed_writes']} write attempts failed" in out
    assert "the events were kept and written later" in out
    assert "nothing was dropped" not in out


def test_a_store_without_counters_and_a_missing_store(tmp_path):
    missing = status(tmp_path / "nope.duckdb")
    assert missing.returncode == 2 and "no loopscope store" in missing.stderr


def test_the_otlp_exporters_drops_are_kept_with_the_writers_counters(tmp_path, capsys):
    from opentelemetry.sdk.trace import TracerProvider

    import loopscope
    from fakes import otlp_receiver
    from loopscope.cli import main

    receiver, server = otlp_receiver.start()
    try:
        db = tmp_path / "otlp.duckdb"
        pipeline = loopscope.configure(db, tracer_provider=TracerProvider(), otlp_endpoint=receiver.endpoint, flush_interval=0.05)
        assert pipeline.exporter is not None
        pipeline.exporter.max_queue_size = 0  # the export queue counts itself full: every span is a drop
        with loopscope.turn(session_id="o", input="hi") as t:
            t.generation("hello", finish_reason="stop")
        loopscope.shutdown()
        dropped = pipeline.dropped()["otlp"]
    finally:
        server.shutdown()
    assert dropped >= 2
    assert main(["--db", str(db), "status", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    [writer] = report["writers"]
    assert writer["otlp_dropped"] == dropped and writer["dropped_queue_full"] == 0
    assert main(["--db", str(db), "status"]) == 0
    assert f"{dropped} spans dropped by the OTLP exporter: its queue was full" in capsys.readouterr().out


KILLED = """
    import os, signal, sys
    import loopscope
    from opentelemetry.sdk.trace import TracerProvider

    # the thread writer, killed with its process (a writer process would close cleanly: stopped)
    loopscope.configure(sys.argv[1], tracer_provider=TracerProvider(), flush_interval=0.05, writer="thread")
    with loopscope.turn(session_id="k", input="hi") as t:
        t.generation("hello", finish_reason="stop")
    assert loopscope.flush(timeout=20)
    os.kill(os.getpid(), signal.SIGKILL)  # no shutdown: the writer never says it stopped
"""


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL")
def test_a_killed_writer_shows_as_gone(tmp_path):
    db = tmp_path / "killed.duckdb"
    proc = run(tmp_path, "killed", KILLED, db, wait=False)
    proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == -9
    [writer] = status_json(db)["writers"]
    assert writer["alive"] == "gone" and writer["stopped_at"] is None
    assert writer["pid"] == proc.pid and writer["events_written"] == 2


NOTICES = """
    import sys
    import loopscope

    pipeline = loopscope.configure(sys.argv[1], flush_interval=0.05)  # OTLP to OTEL_EXPORTER_OTLP_ENDPOINT

    @loopscope.tool
    def add(x: int, y: int) -> int:
        pipeline.exporter.force_flush()  # a batch leaves while the turn and the tool run: each sends its start notice
        return x + y

    for i in range(2):
        with loopscope.turn(session_id="n", agent="calc", input=f"{i} + 1?") as t:
            t.generation("adding", tool_calls=[{"id": f"c{i}", "name": "add", "arguments": {"x": i, "y": 1}}])
            add(i, 1)
            t.generation(str(i + 1), finish_reason="stop")
    # no shutdown(): the process ends, and loopscope closes at exit
"""


def run_with_endpoint(tmp_path: Path, name: str, endpoint: str) -> Path:
    db = tmp_path / f"{name}.duckdb"
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(NOTICES))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({"LOOPSCOPE_STRICT": "1", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})
    env.pop("LOOPSCOPE_DB", None)
    done = subprocess.run([sys.executable, str(script), str(db)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT, check=False)
    assert done.returncode == 0, done.stderr
    assert FELL_BACK not in done.stderr, done.stderr
    return db


@pytest.mark.parametrize("logs_status", [200, 404, 405])
def test_start_notices_sent_or_refused_show_in_status(tmp_path, logs_status):
    from fakes import otlp_receiver

    receiver, server = otlp_receiver.start()
    receiver.logs_status = logs_status  # 404/405: a span-only backend (Phoenix, a collector without logs)
    try:
        db = run_with_endpoint(tmp_path, "agent", receiver.endpoint)
    finally:
        server.shutdown()
    assert len([s for s in receiver.spans if s.name.startswith(("invoke_agent", "execute_tool"))]) == 4
    report = status_json(db)
    [writer] = report["writers"]
    out = status(db).stdout
    assert report["problems"] == [] and "nothing was dropped and no write failed" in out  # notices lose nothing
    if logs_status == 200:
        # 2 turns and 2 tool calls: 4 notices, every one of them sent
        assert len(receiver.notices) == 4
        assert (writer["notices_sent"], writer["notices_refused"], writer["notices_failed"]) == (4, 0, 0)
        assert writer["notices_off"] is None and report["notices"] == {"sent": 4, "refused": 0, "failed": 0}
        assert report["notes"] == [] and "start notices" not in out
    else:
        # the first request is refused: notices are off for good, no more are made
        assert receiver.paths.count("/v1/logs") == 1 and not receiver.notices
        assert writer["notices_sent"] == 0 and writer["notices_refused"] >= 1 and writer["notices_failed"] == 0
        assert writer["notices_off"] == f"refused: HTTP {logs_status}"
        [note] = report["notes"]
        assert f"start notices off for good (pid {writer['pid']}" in note and f"HTTP {logs_status}" in note
        assert note in out and f"0 + {writer['notices_refused']} refused" in out
