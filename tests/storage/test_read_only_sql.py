"""SQL given to ``Store.sql`` / ``loopscope sql`` reads the store and nothing else.

Each attack below once worked (issue 15): it wrote a file, read a system file, listed the
home folder, deleted rows of another store or of the store itself, or tried to download an
extension. Now each fails with a clear error and changes nothing: no file appears or
changes anywhere under the test's folder, both stores keep every row, and no extension is
installed. ``loopscope export --parquet`` still writes its files, through its own path.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pytest

import loopscope
from children import hold
from loopscope.cli import main
from loopscope.storage.duckdb.connection import command_line
from recorded import connect_when_free


def _record(db: Path) -> None:
    loopscope.configure(db, flush_interval=0.05)
    try:
        for n in range(3):
            with loopscope.turn(session_id=f"s{n}", agent="a", input=f"question {n}") as t:
                with loopscope.tool("lookup", arguments={"q": n}, call_id=f"c{n}") as call:
                    call.set_result({"found": n})
                t.generation(f"answer {n}")
    finally:
        loopscope.shutdown()


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small store recorded once, copied for each test (attacks may not share one)."""
    db = tmp_path_factory.mktemp("template") / "template.duckdb"
    _record(db)
    connect_when_free(db).close()  # a writer process the close's bound left writing is done
    assert not Path(f"{db}.wal").exists()
    return db


@dataclass
class Scene:
    folder: Path
    store: Path  # the store the SQL runs on
    other: Path  # another store beside it
    secret: Path  # a file that is not the store
    victim: Path  # where a write would land

    def counts(self) -> tuple[int, int]:
        """Rows of ``events`` in the store and in the other store (read with DuckDB alone)."""
        found = []
        for db in (self.store, self.other):
            con = connect_when_free(db)
            try:
                found.append(con.execute("SELECT count(*) FROM events").fetchone()[0])
            finally:
                con.close()
        return found[0], found[1]

    def files(self) -> dict[str, tuple[int, int]]:
        """Every file under the folder, with its size and modification time."""
        return {
            str(p.relative_to(self.folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(self.folder.rglob("*"))
        }


@pytest.fixture
def scene(template: Path, tmp_path: Path) -> Scene:
    store, other = tmp_path / "store.duckdb", tmp_path / "other.duckdb"
    shutil.copy(template, store)
    shutil.copy(template, other)
    secret = tmp_path / "secret.txt"
    secret.write_text("the password is hunter2\n")
    return Scene(tmp_path, store, other, secret, tmp_path / "written.csv")


def _extension_files() -> set[str]:
    """Extensions installed for this user (INSTALL puts them under ~/.duckdb/extensions)."""
    root = Path.home() / ".duckdb" / "extensions"
    return {str(p) for p in root.rglob("*.duckdb_extension")} if root.exists() else set()


def _spill_folder_swap(scene: Scene) -> str:
    """DuckDB's spill folder beside the store (made by a query that spills) is a folder
    DuckDB lets SQL write: a read-write database made there can be the default while the
    store is detached and attached again read-write."""
    spill = scene.folder / "store.duckdb.tmp"
    spill.mkdir(exist_ok=True)
    return (
        f"ATTACH '{spill / 'x.duckdb'}' AS x (READ_WRITE); USE x; DETACH store; "
        f"ATTACH '{scene.store}' AS mine (READ_WRITE); DELETE FROM mine.events"
    )


# (name, SQL given the scene, what DuckDB may say besides the refusal: None = a SQLRefusedError)
Attack = tuple[str, Callable[[Scene], str], str | None]

ATTACKS: list[Attack] = [
    ("copy_to_a_file", lambda s: f"COPY (SELECT * FROM events) TO '{s.victim}'", None),
    ("export_database", lambda s: f"EXPORT DATABASE '{s.folder / 'exported'}'", None),
    ("read_text_of_a_file", lambda s: f"SELECT content FROM read_text('{s.secret}')", None),
    ("read_csv_of_a_system_file", lambda s: "SELECT * FROM read_csv('/etc/passwd')", None),
    ("glob_of_the_home_folder", lambda s: "SELECT * FROM glob('~/*')", None),
    ("glob_of_a_folder", lambda s: f"SELECT * FROM glob('{s.folder}/*')", None),
    (
        "attach_another_store_read_write_and_delete",
        lambda s: f"ATTACH '{s.other}' AS o (READ_WRITE); DELETE FROM o.events",
        None,
    ),
    (
        "attach_another_store_detach_the_store_reattach_it_read_write_and_delete",
        lambda s: f"ATTACH '{s.other}' AS o (READ_WRITE); USE o; DETACH store; "
        f"ATTACH '{s.store}' AS mine (READ_WRITE); DELETE FROM mine.events",
        None,
    ),
    ("attach_a_new_database_in_the_spill_folder_and_swap_the_store", _spill_folder_swap, None),
    # a repository on loopback: nothing could be downloaded even if INSTALL went ahead
    ("install_an_extension", lambda s: "INSTALL httpfs FROM 'http://127.0.0.1:9'", None),
    ("load_an_extension", lambda s: "LOAD httpfs", None),
    ("load_an_extension_file", lambda s: f"LOAD '{s.folder / 'evil.duckdb_extension'}'", None),
    (
        "set_external_access_back_on_then_copy",
        lambda s: f"SET enable_external_access = true; COPY (SELECT 1) TO '{s.victim}'",
        "configuration has been locked",
    ),
    (
        "reset_external_access_then_copy",
        lambda s: f"RESET enable_external_access; COPY (SELECT 1) TO '{s.victim}'",
        "configuration has been locked",
    ),
    (
        "allow_a_folder_then_copy",
        lambda s: f"SET allowed_directories = ['{s.folder}/']; COPY (SELECT 1) TO '{s.victim}'",
        "configuration has been locked",
    ),
    # these three were refused before too (the database is read-only): they stay so
    ("delete_from_the_store", lambda s: "DELETE FROM events", "read-only mode"),
    ("attach_an_in_memory_database", lambda s: "ATTACH ':memory:' AS m; USE m; DETACH store", "read-only mode"),
    (
        # the store's own path may be attached again (read-only): the file is then never
        # free to be attached read-write
        "attach_the_store_twice_detach_one_reattach_read_write_and_delete",
        lambda s: f"ATTACH '{s.store}' AS again; USE again; DETACH store; "
        f"ATTACH '{s.store}' AS mine (READ_WRITE); DELETE FROM mine.events",
        "already attached",
    ),
]


def _refused(scene: Scene, run: Callable[[str], object], sql: str, said: str | None) -> None:
    """``run(sql)`` fails as expected and leaves every file, row and extension as it was."""
    before_files, before_counts, before_extensions = scene.files(), scene.counts(), _extension_files()
    expected: type[BaseException] = loopscope.SQLRefusedError if said is None else duckdb.Error
    with pytest.raises(expected) as info:
        run(sql)
    if said is None:
        assert "reads" in str(info.value) and str(scene.store) in str(info.value)
        assert "Permission Error" in str(info.value)
    else:
        assert said in str(info.value)
    assert "hunter2" not in str(info.value)
    # nothing changed: the folder (the spill folder the attack made aside), both stores, extensions
    shutil.rmtree(scene.folder / "store.duckdb.tmp", ignore_errors=True)
    before_files = {k: v for k, v in before_files.items() if not k.startswith("store.duckdb.tmp")}
    assert scene.files() == before_files
    assert scene.counts() == before_counts
    assert _extension_files() == before_extensions


@pytest.mark.parametrize(("name", "attack", "said"), ATTACKS, ids=[a[0] for a in ATTACKS])
def test_store_sql_refuses_and_changes_nothing(scene: Scene, name: str, attack: Callable[[Scene], str], said: str | None) -> None:
    sql = attack(scene)
    store = loopscope.Store(str(scene.store))
    _refused(scene, store.sql, sql, said)
    # the store still answers
    assert store.sql("SELECT count(*) FROM events")[1] == [(scene.counts()[0],)]


def test_async_store_sql_refuses_too(scene: Scene) -> None:
    store = loopscope.AsyncStore(str(scene.store))
    sql = f"ATTACH '{scene.other}' AS o (READ_WRITE); DELETE FROM o.events"
    _refused(scene, lambda q: asyncio.run(store.sql(q)), sql, None)


CLI_ATTACKS = [a for a in ATTACKS if a[0] in {
    "copy_to_a_file", "read_text_of_a_file", "attach_another_store_read_write_and_delete",
    "attach_another_store_detach_the_store_reattach_it_read_write_and_delete", "set_external_access_back_on_then_copy",
}]


@pytest.mark.parametrize(("name", "attack", "said"), CLI_ATTACKS, ids=[a[0] for a in CLI_ATTACKS])
def test_loopscope_sql_refuses_in_one_line_and_changes_nothing(
    scene: Scene, capsys: pytest.CaptureFixture[str], name: str, attack: Callable[[Scene], str], said: str | None
) -> None:
    sql = attack(scene)
    before_files, before_counts = scene.files(), scene.counts()
    code = main(["sql", sql, "--db", str(scene.store)])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("loopscope: error: ")
    assert ("refused: SQL on the loopscope store reads" in lines[0]) if said is None else (said in lines[0])
    assert "hunter2" not in err
    assert scene.files() == before_files
    assert scene.counts() == before_counts


def test_reading_the_store_still_works(scene: Scene, capsys: pytest.CaptureFixture[str]) -> None:
    store = loopscope.Store(str(scene.store))
    names, rows = store.sql("SELECT tool, calls FROM tool_stats")
    assert names == ["tool", "calls"] and rows == [("lookup", 3)]
    # temporary views and tables live in memory and go with the query
    _, rows = store.sql("CREATE TEMP TABLE t AS SELECT count(*) AS n FROM events; SELECT n FROM t")
    assert rows == [(scene.counts()[0],)]
    assert main(["sql", "SELECT count(*) AS n FROM turns", "--db", str(scene.store), "--json"]) == 0
    assert '"n": 3' in capsys.readouterr().out


def test_export_parquet_still_writes_its_files(scene: Scene, capsys: pytest.CaptureFixture[str]) -> None:
    before = scene.counts()
    out = scene.folder / "parquet"
    assert main(["export", "--parquet", str(out), "--db", str(scene.store)]) == 0, capsys.readouterr().err
    for table in ("events", "turns", "tool_calls"):
        files = list((out / table).glob("date=*/*.parquet"))
        assert files, table
    con = duckdb.connect()
    try:
        exported = con.execute(f"SELECT count(*) FROM read_parquet('{out}/events/*/*.parquet')").fetchone()[0]
    finally:
        con.close()
    assert exported == before[0]
    assert scene.counts() == before


# -- the store-locked message -----------------------------------------------------------------


def test_the_locked_message_names_the_holders_command_line(scene: Scene, spawn) -> None:
    with hold(spawn, scene.store, scene.folder, give_up=20, timeout=20) as held:
        holder = held.holder
        store = loopscope.Store(str(scene.store), lock_timeout=0.2)
        with pytest.raises(loopscope.StoreLockedError) as info:
            store.list_events("s0")
        message = str(info.value)
        assert f"process {holder.pid} (" in message
        assert "holder.py" in message and str(scene.store) in message  # its script and arguments
        assert "a duckdb shell, a notebook" not in message


def test_a_command_line_that_cannot_be_read_is_none() -> None:
    # a process that is gone: the message falls back to the process id alone
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert command_line(gone.pid) is None
    assert command_line(os.getpid()) is not None
