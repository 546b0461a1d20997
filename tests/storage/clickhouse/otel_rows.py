"""chDB at hand for the tests: a session on a directory with the schema made, and finished SDK spans
inserted as the Collector's ``clickhouseexporter`` writes them (the conversion is the engine's:
``loopscope/storage/clickhouse/spans.py``, which the sink uses too)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from loopscope.storage.clickhouse.spans import as_string, go_float, json_each_row, row_of

__all__ = ["Local", "as_string", "go_float", "json_each_row", "row_of"]


class Local:
    """A chDB session on a directory (ClickHouse's engine in this process), with the schema made."""

    def __init__(self, path: str, ttl_days: int = 0) -> None:
        from chdb import session

        from loopscope.storage.clickhouse import ddl

        self.session = session.Session(path)
        self.version = self.value("SELECT version()")
        ddl.create(self.run, self.version, ttl_days=ttl_days)

    def run(self, sql: str) -> None:
        self.session.query(sql)

    def value(self, sql: str) -> Any:
        rows = self.rows(sql)
        return rows[0][0] if rows else None

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        result = self.session.query(sql, "JSONCompact")
        text = result.bytes().decode() if hasattr(result, "bytes") else str(result)
        if not text.strip():
            return []
        return [tuple(row) for row in json.loads(text)["data"]]

    def dicts(self, sql: str) -> list[dict[str, Any]]:
        result = self.session.query(sql, "JSON")
        text = result.bytes().decode() if hasattr(result, "bytes") else str(result)
        return list(json.loads(text)["data"]) if text.strip() else []

    def insert_spans(self, spans: Iterable[Any], table: str = "otel_traces") -> None:
        """The spans as the exporter inserts them: one ``INSERT`` for the batch."""
        body = json_each_row(row_of(span) for span in spans)
        self.session.query(f"INSERT INTO {table} SETTINGS session_timezone = 'UTC' FORMAT JSONEachRow\n{body}")

    def close(self) -> None:
        self.session.close()
