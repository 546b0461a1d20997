"""loopscope's readers never lag what the application recorded, though its writers wait
seconds between batches: a read first has every writer that holds rows write them
(storage/duckdb/wakeup.py). A plain DuckDB reader sees them only once the interval has passed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider

import loopscope
from loopscope.storage.duckdb import wakeup
from recorded import connect_when_free


def _turn(session: str) -> None:
    with loopscope.turn(session_id=session, input=f"question of {session}") as t:
        t.generation(f"answer to {session}", finish_reason="stop", model="m")


def _holders(db: Path) -> list[str]:
    return [name for name in os.listdir(db.parent) if ".loopscope-holding." in name]


def _held_turn(db: Path, session: str) -> None:
    """Record a turn and wait until the writer holds it (its FIFO is there): the spans have
    reached the writer. A flush is answered before the writer removes the FIFO of the batch
    it wrote, so the flushed batch's FIFO goes first: seen a moment later, it would stand for
    a turn it does not hold (and a writer process gets spans ~0.25 s after they end)."""
    deadline = time.monotonic() + 30
    while _holders(db):
        assert time.monotonic() < deadline, "the writer kept its FIFO after the flush wrote everything"
        time.sleep(0.01)
    _turn(session)
    while not _holders(db):
        assert time.monotonic() < deadline, "the writer never said it held rows"
        time.sleep(0.01)


def _plain_turns(db: Path) -> int:
    con = connect_when_free(db)
    try:
        return con.execute("SELECT count(*) FROM turns").fetchone()[0]
    finally:
        con.close()


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_a_read_has_the_writers_write_what_they_hold_first(tmp_path: Path, writer: str) -> None:
    db = tmp_path / "live.duckdb"
    # an interval no test waits out: only a read can bring the second turn into the file
    loopscope.configure(db, tracer_provider=TracerProvider(), flush_interval=600, writer=writer)
    try:
        _turn("first")
        assert loopscope.flush()
        _held_turn(db, "second")
        assert _plain_turns(db) == 1  # DuckDB itself reads the file as it is: the turn is held
        sessions = {s.session_id for s in loopscope.Store(str(db)).list_sessions()}
        assert sessions == {"first", "second"}
        assert _holders(db) == []  # written, and the writer no longer holds anything
        assert _plain_turns(db) == 2
    finally:
        loopscope.shutdown()


def test_the_cli_in_another_process_sees_what_the_application_just_recorded(tmp_path: Path) -> None:
    db = tmp_path / "cli.duckdb"
    loopscope.configure(db, tracer_provider=TracerProvider(), flush_interval=600)
    try:
        _turn("first")
        assert loopscope.flush()
        _held_turn(db, "just-now")
        shown = subprocess.run(
            [sys.executable, "-m", "loopscope", "sessions", "--db", str(db)], capture_output=True, text=True, timeout=120, check=False
        )
        assert shown.returncode == 0, shown.stderr
        assert "just-now" in shown.stdout and "first" in shown.stdout
    finally:
        loopscope.shutdown()


def test_a_fifo_left_by_a_writer_that_died_is_not_asked(tmp_path: Path) -> None:
    db = tmp_path / "dead.duckdb"
    loopscope.configure(db, tracer_provider=TracerProvider(), writer="thread")
    _turn("s")
    loopscope.shutdown()
    os.mkfifo(f"{db}{wakeup.SUFFIX}99999.deadbeef", 0o600)  # nobody reads it: a SIGKILLed writer's
    assert wakeup.ask(str(db)) == []
    assert [s.session_id for s in loopscope.Store(str(db)).list_sessions()] == ["s"]


def test_a_writer_process_killed_while_it_held_rows_leaves_no_fifo(tmp_path: Path) -> None:
    """A writer process killed (SIGKILL: no cleanup of its own) while it held rows: the
    application that sees it end removes its FIFO, which would otherwise stay beside the store
    for good (a program that opens every file there would wait on it)."""
    db = tmp_path / "killed.duckdb"
    pipeline = loopscope.configure(db, tracer_provider=TracerProvider(), flush_interval=600, writer="process")
    try:
        _turn("first")
        assert loopscope.flush()
        _held_turn(db, "second")
        pid = pipeline.writer.child_pid()
        [held] = _holders(db)
        assert held.split(".loopscope-holding.")[1].startswith(f"{pid}.")
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while _holders(db) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _holders(db) == []
    finally:
        loopscope.shutdown()


def test_only_our_writers_fifos_are_asked_never_a_link_or_a_file(tmp_path: Path) -> None:
    db = tmp_path / "links.duckdb"
    live = wakeup.Holding(str(db))
    assert live.open()
    fifo = live.path
    try:
        # a link to the live FIFO, and a regular file, planted under holding names
        os.symlink(live.path, f"{db}{wakeup.SUFFIX}1.link")
        Path(f"{db}{wakeup.SUFFIX}2.file").write_text("")
        assert wakeup.ask(str(db)) == [live.path]
        assert live.asked()  # the byte reached the writer
        assert not live.asked()  # once
    finally:
        live.close()
    assert not os.path.lexists(fifo)  # gone with the rows it stood for


def test_a_read_adds_no_file_beside_the_store(tmp_path: Path) -> None:
    db = tmp_path / "quiet.duckdb"
    loopscope.configure(db, tracer_provider=TracerProvider(), flush_interval=600, writer="thread")
    try:
        _turn("first")
        assert loopscope.flush()
        _held_turn(db, "second")
        before = set(os.listdir(tmp_path)) - set(_holders(db))
        assert len(loopscope.Store(str(db)).list_sessions()) == 2
        assert set(os.listdir(tmp_path)) - set(_holders(db)) <= before  # the FIFO went; nothing came
    finally:
        loopscope.shutdown()
