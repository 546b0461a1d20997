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
    assert main(["init", "--db", str(db), "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    assert made["action"] == "created" and made["engine"] == "duckdb" and made["from_version"] is None
    assert made["store"] == str(db.resolve()) and made["schema_version"] > 0 and db.exists()
    reader = open_reader(str(db))
    assert reader.ready() and reader.sessions() == [] and reader.status().schema_version == made["schema_version"]
    assert main(["init", "--db", str(db)]) == 0
    assert capsys.readouterr().out.strip() == f"{db.resolve()} is ready: schema version {made['schema_version']}, nothing to change"
    assert main(["init", "--db", str(db), "--ttl-days", "2"]) == 2
    assert "--ttl-days is for a ClickHouse store" in capsys.readouterr().err
    other = tmp_path / "other.duckdb"
    assert main(["init", "--db", str(other)]) == 0
    assert capsys.readouterr().out.startswith(f"created {other.resolve()}: an empty loopscope store, schema version")
