"""The ClickHouse engine's URLs (docs/clickhouse.md): which engine a store's name asks for, where each
form points, and a clear error for what is not one, or for a store that holds no loopscope data."""

from __future__ import annotations

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
