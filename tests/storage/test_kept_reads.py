"""``Store(keep_open=True)``: the file stays attached between reads for a moment, and
every writer still gets it: ours in this process at once, a loopscope writer in another
process as soon as it asks (its marker), anything else once the reads pause."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import pytest
from opentelemetry.sdk.trace import TracerProvider

import loopscope
from loopscope.storage.duckdb import connection

WRITER = """
    import json, sys, time
    import loopscope

    db, started = sys.argv[1], sys.argv[2]
    pipeline = loopscope.configure(db, flush_interval=0.02)
    pipeline.writer.lock_timeout = 0.3  # kept out longer than this, a batch fails
    with loopscope.turn(session_id="busy", agent="a", input="first") as t:
        t.generation("one")
    loopscope.flush(timeout=10)
    open(started, "w").write("started")
    flushed = 0
    for n in range(60):
        with loopscope.turn(session_id="busy", agent="a", input=f"turn {n}") as t:
            t.generation(f"answer {n}")
        flushed += bool(loopscope.flush(timeout=10))
        time.sleep(0.01)
    loopscope.shutdown()
    stats = pipeline.stats()
    print(json.dumps({"flushed": flushed, "failed_writes": stats.failed_writes, "dropped": stats.dropped,
                      "written_events": stats.written_events}))
"""


def run_child(tmp_path: Path, name: str, code: str, *args: str) -> subprocess.Popen[str]:
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(code))
    env = {**os.environ, "LOOPSCOPE_STRICT": "1"}
    env.pop("LOOPSCOPE_DB", None)
    return subprocess.Popen([sys.executable, str(script), *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(child: subprocess.Popen[str], timeout: float = 60.0) -> str:
    try:
        out, err = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        out, err = child.communicate(timeout=10)
        pytest.fail(f"child did not finish\n{out}\n{err}")
    assert child.returncode == 0, f"child exited with {child.returncode}\n{out}\n{err}"
    return out


def test_a_writer_in_another_process_is_let_in_while_a_kept_reader_reads_on(tmp_path: Path) -> None:
    db = tmp_path / "busy.duckdb"
    started = tmp_path / "started"
    child = run_child(tmp_path, "writer", WRITER, str(db), str(started))
    deadline = time.monotonic() + 30
    while not started.exists():
        assert child.poll() is None and time.monotonic() < deadline, "the writer did not start"
        time.sleep(0.02)
    store = loopscope.Store(str(db), keep_open=True)
    reads = 0
    while child.poll() is None:  # read without a pause until the writer is done
        store.list_events("busy", limit=50, newest_first=True)
        reads += 1
    report = json.loads(finish(child))
    # never kept out for its 0.3 s lock timeout, though the reads hardly paused
    assert report == {"flushed": 60, "failed_writes": 0, "dropped": 0, "written_events": 122}
    # reads all along (here 30-40 on a quiet machine; a read lets a waiting writer go first
    # for up to 0.25 s, so a slow machine gets fewer: 8 once under load)
    assert reads >= 5
    events = store.list_events("busy", limit=None)
    assert [e.index for e in events] == list(range(1, 123))
    assert events[-1].content.body == "answer 59"


def test_our_own_writer_gets_the_file_from_a_kept_read_and_the_next_read_sees_its_rows(tmp_path: Path) -> None:
    db = tmp_path / "own.duckdb"
    loopscope.configure(db, tracer_provider=TracerProvider(), flush_interval=0.05)
    try:
        store = loopscope.Store(str(db), keep_open=True)
        with loopscope.turn(session_id="own", agent="a", input="one") as t:
            t.generation("first")
        assert [e.content.body for e in store.list_events("own")] == ["one", "first"]
        for n in range(3):  # each read is kept; each write takes the file from it
            with loopscope.turn(session_id="own", agent="a", input=f"more {n}") as t:
                t.generation(f"again {n}")
            assert loopscope.flush(timeout=10)
            assert store.list_events("own", limit=2, newest_first=True)[-1].content.body == f"again {n}"
    finally:
        loopscope.shutdown()
    assert loopscope.Store(str(db)).get_event_count("own") == 8


def one_turn(db: Path, session: str) -> None:
    """A store at ``db`` holding one turn (two events) of ``session``."""
    loopscope.configure(db, tracer_provider=TracerProvider(), flush_interval=0.05)
    with loopscope.turn(session_id=session, agent="a", input="hi") as t:
        t.generation("hello")
    loopscope.shutdown()


def assert_let_go(db: Path) -> None:
    """Any other program may open the file for writing again, soon: no attachment is kept."""
    deadline = time.monotonic() + 10
    while True:
        try:
            con = duckdb.connect(str(db))
            break
        except duckdb.Error:
            assert time.monotonic() < deadline, "a kept attachment was never let go"
            time.sleep(0.01)
    con.close()
    assert not connection._held


def test_a_kept_attachment_is_let_go_once_reads_pause(tmp_path: Path) -> None:
    db = tmp_path / "idle.duckdb"
    one_turn(db, "idle")
    store = loopscope.Store(str(db), keep_open=True)
    assert len(store.list_events("idle")) == 2
    assert_let_go(db)


def test_kept_page_reads_and_view_reads_in_turn_let_go_of_the_file_once_they_pause(tmp_path: Path) -> None:
    """A session's page (attached to a one-thread database of its own) and the views (to
    the shared one, every thread) one after the other: each reuses the other's kept
    attachment, and the file is let go once they pause, whichever database holds it."""
    from loopscope.storage.duckdb.reads import view_rows

    db = tmp_path / "turns.duckdb"
    one_turn(db, "both")
    store = loopscope.Store(str(db), keep_open=True)
    for _ in range(3):
        assert len(store.list_events("both")) == 2
        assert view_rows(str(db), "SELECT count(*) FROM turn_summaries", keep=True) == [(1,)]
        assert len(store.list_events("both", newest_first=True)) == 2
    assert_let_go(db)


def test_a_default_read_never_leaves_the_file_attached(tmp_path: Path) -> None:
    db = tmp_path / "plain.duckdb"
    one_turn(db, "plain")
    kept, plain = loopscope.Store(str(db), keep_open=True), loopscope.Store(str(db))
    kept.list_events("plain")
    assert plain.get_event_count("plain") == 2  # uses the kept attachment, and lets go of it
    duckdb.connect(str(db)).close()


def test_a_process_that_exits_right_after_a_kept_read_exits_cleanly(tmp_path: Path) -> None:
    db = tmp_path / "exit.duckdb"
    one_turn(db, "exit")
    code = """
        import sys
        import loopscope
        store = loopscope.Store(sys.argv[1], keep_open=True)
        for _ in range(20):
            store.list_events("exit")
        print(store.get_event_count("exit"))
    """
    for _ in range(3):
        assert finish(run_child(tmp_path, "exit", code, str(db))).strip() == "2"
