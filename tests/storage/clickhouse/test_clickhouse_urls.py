"""The ClickHouse engine's URLs (docs/clickhouse.md): which engine a store's name asks for, where each
form points, and a clear error for what is not one. Pure parsing: no engine runs."""

from __future__ import annotations

import os

import pytest

from loopscope.storage.clickhouse.runner import parse, readonly
from loopscope.storage.errors import StoreError
from loopscope.storage.queries import engine_of

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
