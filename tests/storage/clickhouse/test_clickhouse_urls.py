"""The ClickHouse engine's URLs (docs/clickhouse.md): which engine a store's name asks for, where each
form points, and a clear error for what is not one, or for a store that holds no loopscope data."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from loopscope.storage.clickhouse.runner import parse, readonly
from loopscope.storage.errors import StoreError
from loopscope.storage.queries import engine_of, open_reader

pytestmark = pytest.mark.stack("clickhouse")


def test_each_url_form_names_its_target() -> None:
    for url in ("clickhouse://h/db", "CLICKHOUSES://h", "chdb:///tmp/x"):
        assert engine_of(url) == "clickhouse"
    assert engine_of("./store.duckdb") == engine_of("/tmp/chdb.duckdb") == "duckdb"
    server = parse("clickhouse://ana:s%40cret@db.example:9000/agents")
    assert (server.host, server.port, server.database, server.user, server.password, server.secure, server.in_process) == (
        "db.example", 9000, "agents", "ana", "s@cret", False, False)
    assert (parse("clickhouse://db.example").port, parse("clickhouse://db.example").database) == (8123, "default")
    assert (parse("clickhouses://db.example/x").port, parse("clickhouses://db.example/x").secure) == (8443, True)
    local = parse("chdb://data/ch?database=agents")
    assert local.in_process and local.path == os.path.abspath("data/ch") and local.database == "agents"
    assert parse(local.url) == local  # the URL a reader names is the same store again
    assert parse("chdb:///tmp/x").path == "/tmp/x"
    for bad in ("chdb://", "clickhouse://", "clickhouse://h:port/db", "clickhouse://h/a/b", "postgres://h/db"):
        with pytest.raises(StoreError):
            parse(bad)


def test_read_only_sql_keeps_the_statement_and_adds_the_setting() -> None:
    assert readonly(" SELECT 1 ; ") == "SELECT 1\nSETTINGS readonly = 1"


def test_a_store_not_prepared_says_so_and_is_not_ready(tmp_path: Path) -> None:
    reader = open_reader(f"chdb://{tmp_path}/empty")
    try:
        assert reader.ready() is False
        with pytest.raises(StoreError, match="holds no loopscope data yet"):
            reader.sessions()
    finally:
        reader.close()  # type: ignore[attr-defined]


def test_init_makes_a_chdb_store_ready_once_with_its_retention(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``loopscope init`` on a chDB directory: the schema made with the retention asked for, ready to
    read and empty; run again, nothing changes and it says so."""
    from loopscope.cli import main

    url = f"chdb://{tmp_path}/ch"
    assert main(["init", "--db", url, "--ttl-days", "3"]) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"made loopscope's schema on {url}: otel_traces") and "rows kept 3 days" in said
    reader = open_reader(url)
    try:
        assert reader.ready() and reader.sessions() == [] and reader.status().events == 0
        _, rows = reader.sql("SELECT name FROM system.tables WHERE database = currentDatabase() "
                             "AND position(create_table_query, 'toIntervalDay(3)') > 0 ORDER BY name")
        kept = {r[0] for r in rows}
        assert {"otel_traces", "loopscope_events", "loopscope_turns", "loopscope_sessions"} <= kept
    finally:
        reader.close()  # type: ignore[attr-defined]
    assert main(["init", "--db", url, "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again == {"store": url, "engine": "clickhouse", "schema_version": 0, "ttl_days": 0, "action": "unchanged",
                     "sessions": 0, "events": 0}
    assert main(["init", "--db", url]) == 0
    assert "nothing changed" in capsys.readouterr().out


def test_the_clickhouse_reader_answers_every_query_of_the_protocol() -> None:
    """A reader missing one of the protocol's queries is, to the dashboard, not a reader at all
    (``isinstance`` of a runtime-checkable protocol): it opened a new one for every request and
    kept chDB's directory open. Every named query the CLI and the dashboard make is here."""
    from loopscope.storage.clickhouse.reader import ClickHouseReader
    from loopscope.storage.queries import Reader

    queries = sorted(n for n in dir(Reader) if not n.startswith("_") and callable(getattr(Reader, n)))
    assert len(queries) > 30
    assert [n for n in queries if not callable(getattr(ClickHouseReader, n, None))] == []
