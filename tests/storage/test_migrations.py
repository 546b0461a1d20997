"""Named migrations: a store file written before migrations had names (the fixtures of
tests/fixtures/stores/, made by that code) opens, migrates and keeps every row; a file
up to date costs one query and runs nothing; a file from a newer loopscope is refused
and left as it was."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import pytest

import loopscope
from loopscope.cli.status import read_status
from loopscope.storage.duckdb import schema
from loopscope.storage.duckdb.connection import open_store
from loopscope.storage.duckdb.schema import MIGRATIONS, SCHEMA_VERSION, migrate, schema_version
from loopscope.storage.errors import StoreError
from recorded import connect_when_free

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "stores"
NAMES = [m.name for m in MIGRATIONS]

# what each fixture's loopscope had, by schema version: the tables and how many rows
# make.py put in them (schema 3 predates agui_events and the writers' tables)
ROWS = {
    "events": 21, "turns": 5, "sessions": 4, "spans": 4,
    "agui_events": 5, "loopscope_writers": 2, "loopscope_open_turns": 1,
}
TABLES = {
    7: list(ROWS),
    6: list(ROWS),
    3: ["events", "turns", "sessions", "spans"],
}


def unpack(version: int, tmp_path: Path) -> Path:
    """A copy of the fixture of schema ``version``, to change freely."""
    target = tmp_path / f"schema{version}.duckdb"
    with gzip.open(FIXTURES / f"schema{version}.duckdb.gz", "rb") as src, target.open("wb") as out:
        shutil.copyfileobj(src, out)
    return target


def _columns(con: duckdb.DuckDBPyConnection, table: str) -> list[str]:
    return [r[0] for r in con.execute(
        "SELECT column_name FROM duckdb_columns() WHERE database_name = current_database() AND table_name = ? "
        "ORDER BY column_index", [table]
    ).fetchall()]


def _sorted(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return sorted(rows, key=repr)


def contents(path: Path, tables: list[str]) -> dict[str, tuple[list[str], list[tuple[Any, ...]]]]:
    """Every row of ``tables``, with the columns each table has now."""
    con = connect_when_free(path)
    try:
        out = {}
        for table in tables:
            names = _columns(con, table)
            out[table] = (names, _sorted(con.execute(f"SELECT {', '.join(names)} FROM {table}").fetchall()))
        return out
    finally:
        con.close()


def recorded(path: Path) -> list[tuple[str, bool]]:
    """The migrations the file records: (name, whether it says when it ran), in name order."""
    con = connect_when_free(path)
    try:
        return con.execute("SELECT name, applied_at IS NOT NULL FROM loopscope_migrations ORDER BY name").fetchall()
    finally:
        con.close()


def migrate_file(path: Path) -> int:
    """What a writer does when it opens the file: migrate it through ``open_store``."""
    with open_store(str(path), read_only=False, timeout=5.0) as con:
        return migrate(con)


def test_the_names_are_unique_and_in_order() -> None:
    assert NAMES == sorted(NAMES) and len(set(NAMES)) == len(NAMES) == SCHEMA_VERSION
    assert NAMES[0] == "m001_activity_log" and NAMES[-1] == "m018_scores"


@pytest.mark.parametrize("version", [7, 6, 3])
def test_a_store_written_before_named_migrations_migrates_without_loss(version: int, tmp_path: Path) -> None:
    path = unpack(version, tmp_path)
    con = connect_when_free(path)
    try:
        assert schema_version(con) == version
        assert con.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'loopscope_migrations'"
        ).fetchone() == (0,)  # written before the names
    finally:
        con.close()
    before = contents(path, TABLES[version])
    assert {table: len(rows) for table, (_, rows) in before.items()} == {t: ROWS[t] for t in TABLES[version]}

    assert migrate_file(path) == version

    # every row of every table survived, each column it had unchanged
    after = contents(path, TABLES[version])
    for table, (names, rows) in before.items():
        con = connect_when_free(path)
        try:
            kept = _sorted(con.execute(f"SELECT {', '.join(names)} FROM {table}").fetchall())
        finally:
            con.close()
        assert kept == rows, table
        assert set(names) <= set(after[table][0])
    # the first `version` migrations are recorded as the file had them (when they ran is
    # unknown), the rest ran now
    assert recorded(path) == [(name, index >= version) for index, name in enumerate(NAMES)]
    con = connect_when_free(path)
    try:
        assert schema_version(con) == SCHEMA_VERSION
    finally:
        con.close()

    # what a user sees of it
    status = read_status(str(path))
    assert (status["schema_version"], status["sessions"], status["events"], status["turns"], status["tool_calls"]) == (
        SCHEMA_VERSION, 4, 21, 5, 4,  # 3 recorded, 1 in the OTLP spans
    )
    assert len(status["writers"]) == (2 if version >= 6 else 0)
    store = loopscope.Store(str(path))
    timeline = store.get_timeline("s1")
    tool_ends = [e.content for e in timeline if e.type == "tool_call_end"]
    assert [(c.tool_id, c.status) for c in tool_ends] == [("c1", "completed"), ("c2", "failed"), ("c3", "completed")]
    otlp_session = "7b36dccb6a335d9192bc860c14c7e698"  # the session the OTLP spans were stored under (their trace id)
    assert {s.session_id for s in store.list_sessions()} == {"s1", "s2", "agui-thread", otlp_session}
    # the tool columns, filled from content where the file predates them (schema 3)
    _, rows = store.sql("SELECT tool, calls, failed FROM tool_stats ORDER BY tool")
    assert rows == [("book", 2, 1), ("get_weather", 1, 0), ("weather", 1, 0)]


def test_the_open_turn_and_its_writer_survive_the_migration(tmp_path: Path) -> None:
    path = unpack(6, tmp_path)
    migrate_file(path)
    con = connect_when_free(path)
    try:
        assert con.execute("SELECT correlation_id, session_id, agent FROM loopscope_open_turns").fetchall() == [
            ("turn-open", "s2", "helper"),
        ]
        # the writer that left it open: its row, with the counters m007 added (none yet)
        writer = con.execute(
            "SELECT w.pid, w.dropped_queue_full, w.stopped_at FROM loopscope_writers w "
            "JOIN loopscope_open_turns o USING (writer_id)"
        ).fetchall()
    finally:
        con.close()
    assert len(writer) == 1 and writer[0][0] > 0 and writer[0][1:] == (None, None)


def test_opening_twice_runs_nothing_the_second_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []

    def spied(step: schema.Migration) -> schema.Migration:
        def statements() -> list[str]:
            ran.append(step.name)
            return step.statements()

        return step._replace(statements=statements)

    monkeypatch.setattr(schema, "MIGRATIONS", [spied(m) for m in MIGRATIONS])
    path = unpack(3, tmp_path)
    assert migrate_file(path) == 3
    assert ran == NAMES[3:]
    first = recorded(path)

    ran.clear()
    with open_store(str(path), read_only=False, timeout=5.0) as con:
        counting = _Counting(con)
        assert migrate(counting) == SCHEMA_VERSION  # type: ignore[arg-type]
    assert ran == []
    assert counting.statements == 1  # the check every writer's open makes: one query
    assert recorded(path) == first


class _Counting:
    """A connection that counts the statements run through it."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con, self.statements = con, 0

    def execute(self, *args: Any) -> Any:
        self.statements += 1
        return self.con.execute(*args)

    def executemany(self, *args: Any) -> Any:
        self.statements += 1
        return self.con.executemany(*args)


def test_a_new_file_records_every_migration_with_when_it_ran(tmp_path: Path) -> None:
    path = tmp_path / "new.duckdb"
    assert migrate_file(path) == 0
    assert recorded(path) == [(name, True) for name in NAMES]
    assert migrate_file(path) == SCHEMA_VERSION


def test_a_migration_that_fails_leaves_neither_its_changes_nor_its_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = unpack(6, tmp_path)
    broken = MIGRATIONS[6]._replace(statements=lambda: [*MIGRATIONS[6].statements(), "SELECT * FROM no_such_table"])
    monkeypatch.setattr(schema, "MIGRATIONS", [*MIGRATIONS[:6], broken])
    with pytest.raises(duckdb.CatalogException):
        migrate_file(path)
    # the names of the file's six are recorded (their own transaction), the seventh not,
    # nor any of its columns
    assert recorded(path) == [(name, False) for name in NAMES[:6]]
    con = connect_when_free(path)
    try:
        assert "dropped_queue_full" not in _columns(con, "loopscope_writers")
        assert schema_version(con) == 6
    finally:
        con.close()
    monkeypatch.setattr(schema, "MIGRATIONS", MIGRATIONS)
    assert migrate_file(path) == 6
    assert recorded(path) == [(name, index >= 6) for index, name in enumerate(NAMES)]


def _from_a_newer_loopscope(path: Path, *, bump: bool) -> None:
    """What a loopscope with one more migration leaves in the file: its name, and (as it
    keeps the count too) the version one higher."""
    con = duckdb.connect(str(path))
    try:
        con.execute("INSERT INTO loopscope_migrations VALUES ('m008_from_the_future', now())")
        if bump:
            con.execute("UPDATE loopscope_meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION + 1)])
    finally:
        con.close()


@pytest.mark.parametrize("bump", [True, False], ids=["name-and-version", "name-only"])
def test_a_store_from_a_newer_loopscope_is_refused_for_writing_and_left_unchanged(bump: bool, tmp_path: Path) -> None:
    """Refused, not opened read-only either: what the unknown migration changed is unknown
    here, so rows written as this loopscope writes them could break the newer one's file
    (and writers that open a store expect to write to it)."""
    path = unpack(7, tmp_path)
    migrate_file(path)
    _from_a_newer_loopscope(path, bump=bump)
    before = path.read_bytes()
    with pytest.raises(StoreError, match=r"newer loopscope .*m008_from_the_future.*upgrade loopscope"):
        migrate_file(path)
    with pytest.raises(StoreError, match="newer loopscope"):  # the thread writer's check, in configure()
        loopscope.configure(path, writer="thread")
    loopscope.shutdown()
    # (the writer process's check runs in the background: tests/storage/test_writer_start.py)
    assert path.read_bytes() == before


def test_a_store_from_a_newer_loopscope_is_refused_for_reading(tmp_path: Path) -> None:
    path = unpack(7, tmp_path)
    migrate_file(path)
    _from_a_newer_loopscope(path, bump=True)
    store = loopscope.Store(str(path))
    with pytest.raises(StoreError, match="newer loopscope"):
        store.list_sessions()
    with pytest.raises(StoreError, match="newer loopscope"):
        read_status(str(path))
    # a session's reads check the version in the statement that finds the session's span
    session = next(iter(_sessions_of(path)))
    with pytest.raises(StoreError, match="newer loopscope"):
        store.list_events(session, newest_first=True)
    with pytest.raises(StoreError, match="newer loopscope"):
        store.get_event_count(session)


def test_a_reader_refuses_a_store_a_newer_loopscope_migrated_since_its_last_read(tmp_path: Path) -> None:
    """A session's reads skip the version check for a file unchanged since they last
    checked it; a migration changes the file, so the next read checks, and refuses."""
    path = unpack(7, tmp_path)
    migrate_file(path)
    store = loopscope.Store(str(path))
    session = next(iter(_sessions_of(path)))
    read = [e.id for e in store.list_events(session, newest_first=True)]
    assert read and [e.id for e in store.list_events(session, newest_first=True)] == read
    _from_a_newer_loopscope(path, bump=True)
    with pytest.raises(StoreError, match="newer loopscope"):
        store.list_events(session, newest_first=True)
    with pytest.raises(StoreError, match="newer loopscope"):
        loopscope.Store(str(path)).get_event_count(session)


# every kind of read a plain Store makes: its plain queries, the views (tool_stats among
# them), the turns, the model calls, and SQL on a sealed connection of its own
_READS = {
    "list_sessions": lambda store, session: store.list_sessions(),
    "list_turns": lambda store, session: store.list_turns(session),
    "model_calls": lambda store, session: store.model_calls(session),
    "tool_stats": lambda store, session: store._view_query("SELECT * FROM tool_stats"),
    "sql": lambda store, session: store.sql("SELECT * FROM loopscope_meta"),
    "list_events": lambda store, session: store.list_events(session, newest_first=True),
}

_NEWER_ELSEWHERE = f"""
import duckdb, sys
con = duckdb.connect(sys.argv[1])
con.execute("INSERT INTO loopscope_migrations VALUES ('m008_from_the_future', now())")
con.execute("UPDATE loopscope_meta SET value = '{SCHEMA_VERSION + 1}' WHERE key = 'schema_version'")
con.close()
"""


@pytest.mark.parametrize("read", [r for r in _READS if r != "sql"])  # Store.sql reads any version as it is
def test_every_read_sees_a_migration_another_process_made_since_the_last_one(read: str, tmp_path: Path) -> None:
    """Reads skip the schema check for a file unchanged since a read checked it; a newer
    loopscope's migration in another process changes the file, so the next read checks
    again and refuses it, whichever read it is."""
    path = unpack(7, tmp_path)
    migrate_file(path)
    store = loopscope.Store(str(path))
    session = _sessions_of(path)[0]
    for each in _READS.values():  # every kind of read has seen the file as it is
        each(store, session)
    subprocess.run([sys.executable, "-c", _NEWER_ELSEWHERE, str(path)], check=True, timeout=60)
    with pytest.raises(StoreError, match="newer loopscope"):
        _READS[read](store, session)


def test_a_read_of_an_unchanged_file_does_not_check_its_schema_again(tmp_path: Path) -> None:
    """What a read found in the file holds while the file is the same: its meta row taken
    away behind loopscope's back, the file's size and times put back as they were, leaves
    every read serving as before (a read that checked again would say the file holds no
    loopscope data); the next real write is checked again."""
    path = unpack(7, tmp_path)
    migrate_file(path)
    store = loopscope.Store(str(path))
    session = _sessions_of(path)[0]
    before = {name: each(store, session) for name, each in _READS.items()}
    seen = path.stat()
    con = duckdb.connect(str(path))
    try:
        con.execute("DELETE FROM loopscope_meta WHERE key = 'schema_version'")
    finally:
        con.close()
    assert path.stat().st_size == seen.st_size and not Path(f"{path}.wal").exists()
    os.utime(path, ns=(seen.st_atime_ns, seen.st_mtime_ns))
    after = {name: each(store, session) for name, each in _READS.items() if name != "sql"}
    assert after == {name: rows for name, rows in before.items() if name != "sql"}
    assert store.sql("SELECT count(*) FROM loopscope_meta WHERE key = 'schema_version'")[1] == [(0,)]
    os.utime(path)  # a write's new mtime: checked again
    with pytest.raises(StoreError, match="no loopscope data yet"):
        store.list_sessions()


def _sessions_of(path: Path) -> list[str]:
    con = connect_when_free(path)
    try:
        return [r[0] for r in con.execute("SELECT session_id FROM sessions").fetchall()]
    finally:
        con.close()


def test_a_session_read_of_a_store_without_data_says_so(tmp_path: Path) -> None:
    """A file with loopscope's tables but no schema version yet (no writer finished)."""
    path = unpack(7, tmp_path)
    migrate_file(path)
    con = duckdb.connect(str(path))
    try:
        session = con.execute("SELECT session_id FROM sessions LIMIT 1").fetchone()[0]
        con.execute("DELETE FROM loopscope_meta WHERE key = 'schema_version'")
    finally:
        con.close()
    with pytest.raises(StoreError, match="no loopscope data yet"):
        loopscope.Store(str(path)).list_events(session)


@pytest.mark.parametrize("version", [7, 6, 3])
def test_an_older_store_gains_model_calls_and_costs(version: int, tmp_path: Path) -> None:
    """Read as it is (read-only, not migrated), an older file answers the model-call reads
    and the cost columns of the views (no calls, its turns unpriced); migrated, it has the
    ``model_calls`` table and the turns' new columns, NULL for the rows it had."""
    path = unpack(version, tmp_path)
    store = loopscope.Store(str(path))
    assert store.model_calls() == []
    _, rows = store.sql("SELECT model_calls, cost_usd FROM turn_summaries ORDER BY turn_id")
    assert rows and all(r == (0, None) for r in rows)
    # its turns list as before, without the model-call count its turns table lacks
    assert [t.model_call_count for t in store.list_turns()] == [0] * len(rows)
    _, priced = store.sql("SELECT sum(unpriced_calls) FROM session_costs")
    _, with_usage = store.sql("SELECT count(*) FROM turns WHERE input_tokens IS NOT NULL OR output_tokens IS NOT NULL")
    assert priced == with_usage  # a turn with usage and no price is counted as a call without one
    _, none = store.sql("SELECT count(*) FROM model_call_summaries")
    assert none == [(0,)]
    con = connect_when_free(path)
    try:
        assert schema_version(con) == version  # reading changed nothing
    finally:
        con.close()

    migrate_file(path)
    con = connect_when_free(path)
    try:
        assert con.execute("SELECT count(*) FROM model_calls").fetchone() == (0,)
        assert con.execute("SELECT count(*) FROM turns WHERE model_call_count IS NULL AND cost_usd IS NULL").fetchone() == (5,)
    finally:
        con.close()
    assert store.model_calls() == []
    _, after = store.sql("SELECT model_calls, cost_usd FROM turn_summaries ORDER BY turn_id")
    assert after == rows
