"""What the store's path may be (issue 30, "Doors"): a file that is not a loopscope store is
refused before anything is written to it, and nothing loopscope opens makes DuckDB reach the
network for an extension. A SQLite file made DuckDB download ``sqlite_scanner`` (5-9 s, and a
~/.duckdb/extensions folder); a DuckDB file of the user's silently got loopscope's tables (or,
with an ``events`` table of its own, a ``loopscope_migrations`` table); a FIFO held
``configure()`` for 46 s. Real files, real DuckDB, real processes."""

from __future__ import annotations

import errno
import hashlib
import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import duckdb
import pytest
from opentelemetry.sdk.trace import TracerProvider

import loopscope
from children import ROOT
from loopscope.storage.duckdb import health
from loopscope.storage.duckdb.connection import open_store
from recorded import connect_when_free

READS = (["sessions"], ["turns"], ["timeline", "s"], ["calls"], ["stats"], ["tools"], ["tail"], ["sql", "SELECT 1"],
         ["status"], ["export", "--parquet", "out"])
"""Every command that reads the store (``export`` writes elsewhere what it reads)."""


def _sqlite_file(path: Path) -> Path:
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE notes (body TEXT)")
    con.execute("INSERT INTO notes VALUES ('mine')")
    con.commit()
    con.close()
    return path


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _env(home: Path, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "LOOPSCOPE_"))}
    env.update(HOME=str(home), PYTHONPATH=str(ROOT), LOOPSCOPE_STRICT="1", **more)
    return env


# -- no extension loaded or installed ------------------------------------------------------------


APP = """
    import sys
    import loopscope

    try:
        loopscope.configure(sys.argv[1], writer=sys.argv[2])
    except loopscope.StoreError as exc:
        print("refused:", exc, flush=True)
    # the default path (LOOPSCOPE_DB) never raises: recording to it is off, and the app goes on
    loopscope.configure(writer=sys.argv[2])
    with loopscope.turn(session_id="s", input="q") as t:
        t.generation("a", finish_reason="stop")
    print("flushed", loopscope.flush(30), flush=True)
    loopscope.shutdown()
"""


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_a_sqlite_file_as_the_store_is_refused_without_fetching_an_extension(tmp_path: Path, writer: str) -> None:
    db = _sqlite_file(tmp_path / "notes.db")
    before = _digest(db)
    home = tmp_path / "home"
    home.mkdir()
    script = tmp_path / "app.py"
    script.write_text(__import__("textwrap").dedent(APP))
    done = subprocess.run([sys.executable, str(script), str(db), writer], capture_output=True, text=True, timeout=120,
                          env=_env(home, LOOPSCOPE_DB=str(db)), cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr
    assert "refused: cannot open the loopscope store" in done.stdout and "a SQLite database" in done.stdout, done.stdout
    assert "recording to the store is off" in done.stderr, done.stderr
    assert "download" not in done.stdout + done.stderr.lower()
    assert not (home / ".duckdb").exists()  # DuckDB looked for no extension
    assert _digest(db) == before


@pytest.mark.parametrize("command", READS, ids=lambda c: c[0])
def test_a_read_command_on_a_sqlite_file_says_so_without_fetching_an_extension(tmp_path: Path, command: list[str]) -> None:
    db = _sqlite_file(tmp_path / "notes.db")
    before = _digest(db)
    home = tmp_path / "home"
    home.mkdir()
    done = subprocess.run([sys.executable, "-m", "loopscope", "--db", str(db), *command], capture_output=True, text=True,
                          timeout=120, env=_env(home), cwd=tmp_path, check=False)
    assert done.returncode != 0
    assert "the file is a SQLite database" in done.stderr, done.stderr
    assert "download" not in done.stderr.lower()
    assert not (home / ".duckdb").exists()
    assert _digest(db) == before


def test_no_database_loopscope_opens_loads_or_installs_an_extension_by_itself(tmp_path: Path) -> None:
    db = tmp_path / "store.duckdb"
    loopscope.configure(db, tracer_provider=TracerProvider(), writer="thread")
    with loopscope.turn(session_id="s", input="q") as t:
        t.generation("a", finish_reason="stop")
    assert loopscope.flush()
    loopscope.shutdown()
    query = ("SELECT current_setting('autoload_known_extensions'), current_setting('autoinstall_known_extensions'), "
             "current_setting('allow_community_extensions')")
    blocks: list[dict[str, bool]] = [
        {"read_only": True}, {"read_only": True, "page": True}, {"read_only": True, "isolated": True},
        {"read_only": True, "isolated": True, "sealed": False}, {"read_only": False},
    ]
    for options in blocks:
        with open_store(str(db), **options) as con:
            assert con.execute(query).fetchall() == [(False, False, False)], options


# -- a file that is not a path to a file ---------------------------------------------------------


def _opened_for_reading(fifo: Path, action) -> tuple[BaseException | None, bool]:
    """Run ``action`` in a thread; whether it opened ``fifo`` for reading meanwhile (a reader
    makes a non-blocking open for writing succeed; closing that end lets the reader go on)."""
    raised: list[BaseException | None] = [None]

    def run() -> None:
        try:
            action()
        except BaseException as exc:  # handed to the test
            raised[0] = exc

    worker = threading.Thread(target=run)
    worker.start()
    opened = False
    while worker.is_alive():
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            assert exc.errno == errno.ENXIO  # no reader yet
            worker.join(0.01)
            continue
        opened = True
        os.close(fd)
        worker.join(0.01)
    worker.join()
    return raised[0], opened


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_a_fifo_as_the_store_is_refused_at_once_never_opened(tmp_path: Path, writer: str) -> None:
    fifo = tmp_path / "pipe.duckdb"
    os.mkfifo(fifo)
    raised, opened = _opened_for_reading(fifo, lambda: loopscope.configure(fifo, writer=writer, tracer_provider=TracerProvider()))
    loopscope.shutdown()
    assert not opened
    assert isinstance(raised, loopscope.StoreError) and "is a named pipe (FIFO), not a regular file" in str(raised), raised
    raised, opened = _opened_for_reading(fifo, lambda: loopscope.Store(str(fifo)).list_sessions())
    assert not opened
    assert isinstance(raised, loopscope.StoreError) and "named pipe" in str(raised), raised


def test_a_device_as_the_store_is_refused() -> None:
    with pytest.raises(loopscope.StoreError, match="is a device, not a regular file"):
        loopscope.configure("/dev/null", writer="thread", tracer_provider=TracerProvider())
    with pytest.raises(loopscope.StoreError, match="is a device"):
        loopscope.Store("/dev/null").list_sessions()


# -- a DuckDB file of the user's -----------------------------------------------------------------


def _users_database(path: Path, table: str = "notes") -> Path:
    con = duckdb.connect(str(path))
    try:
        con.execute(f"CREATE TABLE {table} (id INTEGER, body VARCHAR)")
        con.execute(f"INSERT INTO {table} VALUES (1, 'mine')")
    finally:
        con.close()
    return path


def _tables(path: Path) -> list[str]:
    con = connect_when_free(path)
    try:
        return sorted(r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall())
    finally:
        con.close()


@pytest.mark.parametrize("table", ["notes", "events"])
def test_a_duckdb_file_of_the_users_is_refused_and_left_as_it_was(tmp_path: Path, table: str) -> None:
    db = _users_database(tmp_path / "mine.duckdb", table)
    before = _digest(db)
    with pytest.raises(loopscope.StoreError, match=f"is not a loopscope store: it holds a database of its own \\({table}\\)"):
        loopscope.configure(db, writer="thread", tracer_provider=TracerProvider())
    assert _digest(db) == before
    assert _tables(db) == [table]  # no loopscope_migrations, no loopscope table
    with pytest.raises(loopscope.StoreError, match="is not a loopscope store"):  # and a read says what it is
        loopscope.Store(str(db)).list_sessions()


def test_the_writer_process_refuses_a_duckdb_file_of_the_users_and_counts_what_is_lost(tmp_path: Path) -> None:
    """configure() does not wait for the writer process (it opens no DuckDB): the child refuses
    the file, the application goes on and counts what it could not store."""
    db = _users_database(tmp_path / "mine.duckdb")
    before = _digest(db)
    loopscope.configure(db, writer="process", tracer_provider=TracerProvider())  # does not raise
    for i in range(5):
        with loopscope.turn(session_id=f"s{i}", input="q") as t:
            t.generation("a", finish_reason="stop")
    assert loopscope.flush(60) is False
    loopscope.shutdown()
    assert _digest(db) == before
    assert _tables(db) == ["notes"]
    [lost] = health.read_beside(str(db)).values()
    # counted as the store's rows: each turn's input and answer, and its summary
    events = lost["dropped_unwritable"] + lost["dropped_queue_full"]
    turns = lost.get("turns_dropped_unwritable", 0) + lost.get("turns_dropped_queue_full", 0)
    assert (events, turns) == (10, 5)
    assert "is not a loopscope store" in lost["last_error"]


@pytest.mark.parametrize("how", ["configure", "environment"])
@pytest.mark.parametrize("writer", ["thread", "process"])
def test_loopscope_tables_beside_the_users_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str,
                                                      writer: str) -> None:
    db = _users_database(tmp_path / "mine.duckdb")
    if how == "environment":
        monkeypatch.setenv("LOOPSCOPE_SHARE_DB", "1")
    loopscope.configure(db, writer=writer, tracer_provider=TracerProvider(), share_db=how == "configure")
    with loopscope.turn(session_id="s", input="q") as t:
        t.generation("a", finish_reason="stop")
    assert loopscope.flush(60)
    loopscope.shutdown()
    assert [e.content.body for e in loopscope.Store(str(db)).get_timeline("s")] == ["q", "a"]
    con = connect_when_free(db)
    try:
        assert con.execute("SELECT * FROM notes").fetchall() == [(1, "mine")]
    finally:
        con.close()


def test_sharing_still_refuses_a_file_whose_tables_loopscope_would_make(tmp_path: Path) -> None:
    db = _users_database(tmp_path / "mine.duckdb", "events")
    before = _digest(db)
    with pytest.raises(loopscope.StoreError, match="already has what loopscope would make \\(events\\)"):
        loopscope.configure(db, writer="thread", tracer_provider=TracerProvider(), share_db=True)
    assert _digest(db) == before


def test_an_empty_duckdb_file_is_loopscopes_to_use(tmp_path: Path) -> None:
    db = tmp_path / "empty.duckdb"
    duckdb.connect(str(db)).close()
    loopscope.configure(db, writer="thread", tracer_provider=TracerProvider())
    with loopscope.turn(session_id="s", input="q") as t:
        t.generation("a", finish_reason="stop")
    assert loopscope.flush()
    loopscope.shutdown()
    assert [e.content.body for e in loopscope.Store(str(db)).get_timeline("s")] == ["q", "a"]
