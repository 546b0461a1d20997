"""Writes attach the store file to a database kept for it in this process (opening a
DuckDB database costs 15-25 ms, attaching a file 2 ms): each block still holds the file
only while it runs, runs on one DuckDB thread, and leaves the file complete (no WAL)
unless it asked to keep its rows in the WAL."""

from __future__ import annotations

import os
import subprocess
import sys

import duckdb
import pytest

from loopscope.storage.duckdb import connection
from loopscope.storage.duckdb.connection import open_store


def _setting(con: duckdb.DuckDBPyConnection, name: str) -> str:
    return str(con.execute(f"SELECT current_setting('{name}')").fetchone()[0])


def _sum(db: str) -> int:
    con = duckdb.connect(db, read_only=True)
    try:
        return con.execute("SELECT sum(a) FROM t").fetchone()[0]
    finally:
        con.close()


def test_a_block_writes_on_one_thread_and_leaves_no_wal(tmp_path):
    db = str(tmp_path / "s.duckdb")
    with open_store(db, read_only=False) as con:
        assert _setting(con, "threads") == "1"
        con.execute("CREATE TABLE t (a INTEGER)")
        con.execute("BEGIN TRANSACTION; INSERT INTO t VALUES (1); COMMIT")
        assert not os.path.exists(db + ".wal")  # the commit checkpointed
    assert _sum(db) == 1


def test_a_block_may_leave_its_rows_in_the_wal_and_the_next_one_checkpoints_them(tmp_path):
    db = str(tmp_path / "s.duckdb")
    with open_store(db, read_only=False) as con:
        con.execute("CREATE TABLE t (a INTEGER)")
    with open_store(db, read_only=False, checkpoint=False) as con:
        con.execute("BEGIN TRANSACTION; INSERT INTO t VALUES (1); COMMIT")
    assert os.path.getsize(db + ".wal") > 0  # on disk, not in the file proper yet
    assert _sum(db) == 1  # a reader replays it
    with open_store(db, read_only=False) as con:  # the default again: commits checkpoint
        con.execute("BEGIN TRANSACTION; INSERT INTO t VALUES (2); COMMIT")
    assert not os.path.exists(db + ".wal")
    assert _sum(db) == 3


def test_the_file_is_free_for_another_process_between_blocks(tmp_path):
    db = str(tmp_path / "s.duckdb")
    probe = "import duckdb, sys; duckdb.connect(sys.argv[1], read_only=True).close()"
    with open_store(db, read_only=False) as con:
        con.execute("CREATE TABLE t (a INTEGER)")
        held = subprocess.run([sys.executable, "-c", probe, db], capture_output=True, text=True, timeout=60, check=False)
        assert held.returncode != 0 and "lock" in held.stderr.lower()
    free = subprocess.run([sys.executable, "-c", probe, db], capture_output=True, text=True, timeout=60, check=False)
    assert free.returncode == 0, free.stderr


def test_a_failed_block_leaves_nothing_behind(tmp_path):
    db = str(tmp_path / "s.duckdb")
    with open_store(db, read_only=False) as con:
        con.execute("CREATE TABLE t (a INTEGER PRIMARY KEY)")
    with pytest.raises(duckdb.ConstraintException), open_store(db, read_only=False) as con:
        con.execute("BEGIN TRANSACTION")
        con.execute("INSERT INTO t VALUES (1)")
        con.execute("INSERT INTO t VALUES (1)")
    with open_store(db, read_only=False) as con:  # attached again: no transaction, no alias left
        assert con.execute("SELECT count(*) FROM t").fetchone() == (0,)
        names = {row[0] for row in con.execute("SELECT database_name FROM duckdb_databases()").fetchall()}
        assert len(names - {"memory", "system", "temp"}) == 1


def test_each_file_has_its_own_database(tmp_path):
    one, two = str(tmp_path / "one.duckdb"), str(tmp_path / "two.duckdb")
    for path, table in ((one, "a"), (two, "b")):
        with open_store(path, read_only=False) as con:
            con.execute(f"CREATE TABLE {table} (x INTEGER)")
    with open_store(one, read_only=False) as con:
        tables = {row[0] for row in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    assert tables == {"a"}
    assert connection._writer_home(one).database() is not connection._writer_home(two).database()
