"""Store files the tests make by hand, the way another program (or version) would leave them."""

from __future__ import annotations

from pathlib import Path

import duckdb

from loopscope.storage.duckdb.schema import SCHEMA_VERSION


def newer_store(path: Path) -> None:
    """A store a newer loopscope migrated: this one must neither write it nor read it as its own."""
    con = duckdb.connect(str(path))
    try:
        con.execute("CREATE TABLE loopscope_meta(key VARCHAR PRIMARY KEY, value VARCHAR)")
        con.execute("INSERT INTO loopscope_meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION + 1)])
    finally:
        con.close()
