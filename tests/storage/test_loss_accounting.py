"""What ``loopscope status`` says was lost, against what the application sent and what the
store holds (issue 30): counted in the store's own rows (events and turns), never claimed for
rows that were stored, and never hidden by a record that found no room on a full disk.

Each application is a real openai SDK loop against the fake model server, in a child
interpreter: one call without tools is one turn of two events (the question, the answer),
so what it sent is known, and the store's rows plus what ``status`` counts lost must add up
to it exactly.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fakes.model_server import FakeModelServer

ROOT = Path(__file__).resolve().parents[2]
EVENTS_PER_CALL, TURNS_PER_CALL = 2, 1

CALLS = """
    import os, signal, sys, threading, time
    import loopscope, openai

    def calls(client, first, count):
        for i in range(first, first + count):
            client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": f"question {i}"}])

    def until(check, what):
        deadline = time.monotonic() + 60
        while not check():
            assert time.monotonic() < deadline, what
            time.sleep(0.02)

    def stored(db):
        try:
            return loopscope.Store(db).sql("SELECT count(*) FROM events")[1][0][0]
        except Exception:
            return -1  # the writer holds the file this moment

    def answered(writer):
        writer.stats()  # asks the writer process; its answer is read by the answers thread
        return writer._answered.is_set()
"""

KILLED_AFTER_IT_WROTE = CALLS + """
    from loopscope.ingest import writer_process

    db = sys.argv[2]
    pipeline = loopscope.configure(db=db, writer="process", flush_interval=0.05)
    loopscope.instrument()
    client = openai.OpenAI(base_url=sys.argv[1], api_key="sk-test", max_retries=0)
    writer = pipeline.writer
    assert writer.wait_started(60) == "process"
    # from now on the application hears nothing from its writer process: it writes, and is
    # killed before any word of it reaches the application (its counters are sent every half
    # second, and a kill comes when it comes)
    late, real = threading.Event(), writer_process.receive
    def never_told(stream):
        late.wait()
        return None  # its pipe's end, as the application reads it once the process is dead
    writer_process.receive = never_told
    until(lambda: answered(writer), "the writer process answered")  # the answers thread now waits in late_receive
    calls(client, 0, 20)
    until(lambda: stored(db) == 20 * 2, "every event stored")
    child = writer.child_pid()
    os.kill(child, signal.SIGKILL)  # it wrote everything, then died before saying so
    writer_process.receive = real  # the next writer process is heard as usual
    late.set()
    until(lambda: writer.child_pid() != child, "the application saw it end")
    loopscope.shutdown()
    print("done")
"""


KILLED_HOLDING_ROWS = CALLS + """
    db = sys.argv[2]
    pipeline = loopscope.configure(db=db, writer="process", flush_interval=3600)
    loopscope.instrument()
    client = openai.OpenAI(base_url=sys.argv[1], api_key="sk-test", max_retries=0)
    writer = pipeline.writer
    calls(client, 0, 20)
    assert loopscope.flush(60)
    calls(client, 20, 5)  # shipped to the writer process, which holds them: it writes at flushes only
    # answered once it read every span queued before the question: it holds them all
    until(lambda: answered(writer), "the writer process holds them")
    child = writer.child_pid()
    os.kill(child, signal.SIGKILL)
    until(lambda: writer.child_pid() != child, "the application saw it end")
    calls(client, 25, 5)  # a new writer process writes these
    assert loopscope.flush(60)
    loopscope.shutdown()
    print("done")
"""


def _app(tmp_path: Path, code: str, *args: str) -> None:
    script = tmp_path / "app.py"
    script.write_text(code.replace("\n    ", "\n").strip() + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "LOOPSCOPE_"))}
    env.update(LOOPSCOPE_STRICT="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(script), *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=180, check=False)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("done"), proc.stdout + proc.stderr


def _status(db: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPSCOPE_")}
    proc = subprocess.run([sys.executable, "-m", "loopscope", "status", "--db", str(db), *flags], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc


def _status_json(db: Path) -> dict:
    return json.loads(_status(db, "--json").stdout)


def test_a_writer_process_killed_after_it_wrote_everything_loses_nothing_in_status(
    tmp_path: Path, model_server: FakeModelServer
) -> None:
    """The writer process wrote every row, then was killed before its application heard so:
    `status` must not count those stored rows as lost (it said '60 events lost (pid …,
    writer exit -9)' with all of them in the store)."""
    db = tmp_path / "wrote.duckdb"
    _app(tmp_path, KILLED_AFTER_IT_WROTE, model_server.openai_base_url, str(db))
    status = _status_json(db)
    assert (status["events"], status["turns"]) == (20 * EVENTS_PER_CALL, 20 * TURNS_PER_CALL)
    assert status["problems"] == []
    assert (status["totals"]["events_lost"], status["totals"]["turns_lost"]) == (0, 0), status["writers"]
    assert "nothing was dropped and no write failed" in _status(db).stdout


def test_a_writer_process_killed_holding_rows_counts_exactly_those_in_events_and_turns(
    tmp_path: Path, model_server: FakeModelServer
) -> None:
    """Killed while it held five turns it had not written: `status` counts exactly their rows
    (10 events and 5 turns), what the store holds and what it counts lost adding up to what
    the application sent."""
    db = tmp_path / "held.duckdb"
    _app(tmp_path, KILLED_HOLDING_ROWS, model_server.openai_base_url, str(db))
    status = _status_json(db)
    sent = 30
    assert (status["events"], status["turns"]) == (25 * EVENTS_PER_CALL, 25 * TURNS_PER_CALL)
    totals = status["totals"]
    assert totals["dropped_unwritable"] == 5 * EVENTS_PER_CALL, status["problems"]
    assert (totals["events_lost"], totals["turns_lost"]) == (5 * EVENTS_PER_CALL, 5 * TURNS_PER_CALL), status["writers"]
    assert status["events"] + totals["events_lost"] == sent * EVENTS_PER_CALL
    assert status["turns"] + totals["turns_lost"] == sent * TURNS_PER_CALL
    text = _status(db).stdout
    assert "10 events and 5 turns lost: not written to the store" in text, text
    assert "exit status -9" in text


TINY_QUEUE = CALLS + """
    db = sys.argv[2]
    pipeline = loopscope.configure(db=db, writer="process", queue_size=5, flush_interval=3600)
    loopscope.instrument()
    client = openai.OpenAI(base_url=sys.argv[1], api_key="sk-test", max_retries=0)
    calls(client, 0, 40)  # faster than a queue of 5 spans is shipped and written
    loopscope.flush(60)
    loopscope.shutdown()
    print("done")
"""


def test_drops_of_a_full_queue_are_counted_in_events_and_turns_as_the_store_has_them(
    tmp_path: Path, model_server: FakeModelServer
) -> None:
    """A queue too small for the load drops spans (in the application and in the writer
    process): each counted as the rows it would have made, so that what the store holds and
    what `status` counts dropped add up to what the application sent, in events and in turns."""
    db = tmp_path / "tiny.duckdb"
    _app(tmp_path, TINY_QUEUE, model_server.openai_base_url, str(db))
    status = _status_json(db)
    totals = status["totals"]
    dropped = totals["dropped_queue_full"] + totals["dropped_unwritable"]
    assert dropped > 0, status["writers"]
    assert status["events"] + dropped == 40 * EVENTS_PER_CALL, status["problems"]
    assert status["events"] + totals["events_lost"] == 40 * EVENTS_PER_CALL, status["writers"]
    assert status["turns"] + totals["turns_lost"] == 40 * TURNS_PER_CALL, status["writers"]
    text = _status(db).stdout
    events, turns = totals["dropped_queue_full"], totals["turns_dropped_queue_full"]
    assert f"{events} events and {turns} turn{'' if turns == 1 else 's'} dropped: queue full" in text, text


KILLED_THREAD_WRITER = CALLS + """
    db = sys.argv[2]
    loopscope.configure(db=db, writer="thread", flush_interval=3600)
    loopscope.instrument()
    client = openai.OpenAI(base_url=sys.argv[1], api_key="sk-test", max_retries=0)
    calls(client, 0, 5)
    assert loopscope.flush(60)
    calls(client, 5, 5)  # held by the writer thread, which dies with the process
    print("done", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_writer_killed_without_a_record_is_said_to_have_ended_so(tmp_path: Path, model_server: FakeModelServer) -> None:
    """A writer that ended without closing the store and left no record of what it held is
    said to have done so, not reported as one that lost nothing."""
    db = tmp_path / "killed.duckdb"
    script = tmp_path / "app.py"
    script.write_text(KILLED_THREAD_WRITER.replace("\n    ", "\n").strip() + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "LOOPSCOPE_"))}
    env.update(LOOPSCOPE_STRICT="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(script), model_server.openai_base_url, str(db)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == -9 and proc.stdout.strip() == "done", proc.stdout + proc.stderr
    status = _status_json(db)
    assert status["events"] == 5 * EVENTS_PER_CALL
    [problem] = status["problems"]
    assert "ended without closing the store and left no record of what it had not written" in problem
    assert "10 events and 5 turns written" in problem
    assert "nothing was dropped" not in _status(db).stdout


FULL_DISK = CALLS + """
    db = sys.argv[2]
    pipeline = loopscope.configure(db=db, flush_interval=0.05)  # the default writer: a process of its own
    loopscope.instrument()
    client = openai.OpenAI(base_url=sys.argv[1], api_key="sk-test", max_retries=0)
    calls(client, 0, 5)
    assert loopscope.flush(60)
    with open(os.path.join(os.path.dirname(db), "filler"), "wb") as filler:  # the disk is full from here on
        try:
            while True:
                filler.write(bytes(1 << 16))
                filler.flush()
        except OSError:
            pass
    calls(client, 5, 100)
    print("flushed", loopscope.flush(timeout=2.0))
    loopscope.shutdown()
    print("done")
"""


def _namespaces() -> bool:
    """Whether this user can mount a small tmpfs of its own (a user and mount namespace)."""
    if shutil.which("unshare") is None:
        return False
    mount = "mount -t tmpfs -o size=1m tmpfs /mnt 2>/dev/null || mount -t tmpfs -o size=1m tmpfs /tmp"
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", mount], capture_output=True, timeout=30, check=False)
    return proc.returncode == 0


@pytest.mark.skipif(not _namespaces(), reason="no user namespace to mount a small tmpfs in (unshare -rm)")
def test_a_full_disk_is_counted_in_status_with_the_events_and_turns_it_cost(
    tmp_path: Path, model_server: FakeModelServer
) -> None:
    """The store on a disk that is full (a real ENOSPC: a 16 MiB tmpfs in a mount namespace of
    the test's own, filled up): the writer cannot write the rows, nor its row's last word,
    and its record beside the store must still get through (it said 'nothing was dropped and
    no write failed', with a 0-byte lost.json.<pid>.tmp left beside the store). `status`, run
    in the same namespace, counts every row the store lacks."""
    disk = tmp_path / "disk"
    disk.mkdir()
    script = tmp_path / "app.py"
    script.write_text(FULL_DISK.replace("\n    ", "\n").strip() + "\n")
    out, listing, err = tmp_path / "status.json", tmp_path / "listing", tmp_path / "app.err"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "LOOPSCOPE_"))}
    env.update(LOOPSCOPE_STRICT="1", PYTHONPATH=str(ROOT))
    shell = (
        'mount -t tmpfs -o size=16m tmpfs "$1" && "$2" "$3" "$4" "$1/store.duckdb" 2>"$7" >"$7.out" && '
        '"$2" -m loopscope status --db "$1/store.duckdb" --json >"$5" && ls -l "$1" >"$6"'
    )
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", shell, "sh", str(disk), sys.executable, str(script), model_server.openai_base_url,
         str(out), str(listing), str(err)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False,
    )
    assert proc.returncode == 0, proc.stderr + (err.read_text() if err.exists() else "")
    assert (tmp_path / "app.err.out").read_text().split() == ["flushed", "False", "done"], err.read_text()
    status = json.loads(out.read_text())
    totals = status["totals"]
    assert ".tmp" not in listing.read_text(), listing.read_text()  # no empty record left to stand for one
    assert totals["dropped_unwritable"] > 0, status["problems"]
    # every row the application sent is in the store or counted lost, in events and in turns
    assert status["events"] + totals["events_lost"] == 105 * EVENTS_PER_CALL, status["writers"]
    assert status["turns"] + totals["turns_lost"] == 105 * TURNS_PER_CALL, status["writers"]
    assert any("lost: not written to the store" in line for line in status["problems"]), status["problems"]
