"""``loopscope init`` on a DuckDB path (docs/cli.md, "A store made ready"): the file created ready to
be written and read, empty; run again, unchanged; a retention refused (a DuckDB file keeps every
row). The ClickHouse side is in tests/storage/clickhouse/test_clickhouse_urls.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loopscope.cli import main
from loopscope.storage.queries import open_reader


def test_init_creates_a_duckdb_store_once_and_refuses_a_retention(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "new" / "store.duckdb"
    db.parent.mkdir()
    assert main(["init", "--db", str(db)]) == 0
    assert capsys.readouterr().out.startswith(f"created {db.resolve()}: an empty loopscope store, schema version")
    reader = open_reader(str(db))
    assert reader.ready() and reader.sessions() == []
    version = reader.status().schema_version
    assert main(["init", "--db", str(db), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "store": str(db.resolve()), "engine": "duckdb", "schema_version": version, "ttl_days": None, "action": "unchanged",
        "from_version": version,
    }
    assert main(["init", "--db", str(db), "--ttl-days", "2"]) == 2
    assert "--ttl-days is for a ClickHouse store" in capsys.readouterr().err
