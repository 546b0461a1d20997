"""What a writer loses is counted where another process can see it (issue 15): events of
processes that end while another holds the store, and rows that vanish from the file
after they were written (its WAL removed while the writer ran)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider

import loopscope
from children import ROOT, hold
from loopscope.cli.status import read_status

WRITER = """
    import sys
    import loopscope

    loopscope.configure(sys.argv[1], flush_interval=0.05)
    for i in range(int(sys.argv[2])):
        with loopscope.turn(session_id=f"{sys.argv[3]}-{i}", input="q") as t:
            t.generation("a", finish_reason="stop")
    print("flushed", loopscope.flush(timeout=3.0))  # all of it mapped, none of it written: the file is held
"""


def _status_text(db: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "LOOPSCOPE_DB"}
    done = subprocess.run([sys.executable, "-m", "loopscope", "--db", str(db), "status"], capture_output=True, text=True,
                          timeout=60, env=env, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_processes_that_end_while_another_holds_the_store_count_their_lost_events(tmp_path: Path, spawn, monkeypatch) -> None:
    """Two processes record while a third holds the file and end before it lets go: each
    counts what it could not write (beside the store, which it could not write either),
    and `status`, run later from another process, reports those events as lost. (A writer
    process would write on for ``close_timeout`` after its application ended, and so store
    them all once the file is let go: here it gives up at its application's close.)"""
    monkeypatch.setenv("LOOPSCOPE_CLOSE_TIMEOUT", "0")
    db = tmp_path / "held.duckdb"
    loopscope.configure(db, tracer_provider=TracerProvider())  # the store exists, with its schema
    loopscope.shutdown()
    with hold(spawn, db, tmp_path, timeout=30):
        writers = [spawn(f"writer{n}", WRITER, db, 25, f"w{n}") for n in range(2)]
        for writer in writers:
            assert writer.finish_ok(60).strip() == "flushed False"
    status = read_status(str(db))
    # 25 turns of 2 events and a summary each, per process: every event and turn counted, none written
    assert status["events"] == 0
    assert status["totals"]["dropped_unwritable"] == 2 * 25 * 2, status["writers"]
    assert status["totals"]["turns_dropped_unwritable"] == 2 * 25, status["writers"]
    text = _status_text(db)
    assert "nothing was dropped" not in text and "written later" not in text
    assert text.count("50 events and 25 turns lost") == 2, text


def test_rows_lost_with_a_removed_wal_are_counted_and_leave_no_index_gap(tmp_path: Path) -> None:
    """The WAL, which holds the last batches until a checkpoint, is deleted while the
    writer runs: the rows in it are gone. The writer sees that the file's last index of a
    session is below the one it wrote, counts the difference as lost (and says so in
    `status`), and numbers the session's next events on from what the file holds."""
    db = tmp_path / "wal.duckdb"
    pipeline = loopscope.configure(db, tracer_provider=TracerProvider(), flush_interval=0.05)
    try:
        for i in range(3):
            with loopscope.turn(session_id="s", input=f"q{i}") as t:
                t.generation(f"a{i}", finish_reason="stop")
        assert loopscope.flush()
        wal = Path(str(db) + ".wal")
        assert wal.exists()  # the batch is in the WAL (a small one is not checkpointed at once)
        wal.unlink()
        for i in range(3, 5):
            with loopscope.turn(session_id="s", input=f"q{i}") as t:
                t.generation(f"a{i}", finish_reason="stop")
        assert loopscope.flush()
    finally:
        loopscope.shutdown()
    status = read_status(str(db))
    assert status["totals"]["dropped_unwritable"] == 6, status["writers"]  # q0..a2: six events written, then gone
    assert any(".wal removed" in line for line in status["problems"]), status["problems"]
    assert pipeline.stats().lost_from_file == 6
    store = loopscope.Store(str(db))
    timeline = store.get_timeline("s")
    assert [e.content.body for e in timeline] == ["q3", "a3", "q4", "a4"]
    assert [e.index for e in timeline] == [1, 2, 3, 4]
    assert json.dumps(status, default=str)  # --json still prints it


def test_a_held_lock_of_the_file_beside_the_store_is_waited_for_a_bounded_time(tmp_path: Path) -> None:
    """A process stopped while it holds the lock of the lost-events file must not hold the
    exit of another: the count is given up (and only logged) after ``LOCK_WAIT``."""
    import fcntl

    from loopscope.storage.duckdb import health

    store = str(tmp_path / "s.duckdb")
    with open(health.beside_path(store) + ".lock", "a") as holder:
        fcntl.flock(holder, fcntl.LOCK_EX)  # another holder, as another process would be
        began = time.monotonic()
        assert health.record_beside(store, "w1", health.Counters(dropped_unwritable=3)) is False
        assert time.monotonic() - began < health.LOCK_WAIT + 5
        fcntl.flock(holder, fcntl.LOCK_UN)
    assert health.record_beside(store, "w1", health.Counters(dropped_unwritable=3)) is True
    assert health.read_beside(store)["w1"]["dropped_unwritable"] == 3
