"""The raw copies of received spans: the ``spans`` table, as they came (``loopscope collect``
keeps every span it receives there). The store's writer inserts them in the transaction of
the rows made of the same spans (:meth:`~loopscope.storage.duckdb.writer.StoreWriter.end_bundle`),
so that a collector killed at any moment keeps both or neither."""

from __future__ import annotations

from typing import Any

from .. import scrub
from .idempotent import fresh_spans_sql

# -- the raw spans ---------------------------------------------------------------------------


RAW_TABLE = "_loopscope_raw_spans"
"""The name the Arrow table of :func:`raw_table` is registered under for :func:`raw_insert_sql`."""


def raw_table(rows: list[tuple[Any, ...]], scrubber: scrub.Scrubber) -> Any:
    """The raw span rows (tuples in :data:`RAW_COLUMNS`' order) as an Arrow table, their
    text masked by ``scrubber`` (a sender other than loopscope sends what it has)."""
    import pyarrow as pa

    columns = list(zip(*rows))
    us = pa.timestamp("us", tz="UTC")
    text = pa.string()
    masked = scrubber.masked
    return pa.table(
        [
            pa.array(columns[0], text), pa.array(columns[1], text), pa.array(columns[2], text), pa.array(columns[3], text),
            pa.array(columns[4], text), pa.array(columns[5], us), pa.array(columns[6], us), pa.array(columns[7], pa.float64()),
            pa.array(columns[8], text), masked(pa.array(columns[9], text), "text"), masked(pa.array(columns[10], text), "attributes"),
            pa.array(columns[11], text), masked(pa.array(columns[12], text)), pa.array(columns[13], text), pa.array(columns[14], text), pa.array(columns[15], text),
            pa.array(columns[16], text), pa.array(columns[17], text), pa.array(columns[18], text), pa.array(columns[19], us),
        ],
        names=list(RAW_COLUMNS),
    )


def raw_insert_sql(rows: list[tuple[Any, ...]]) -> str:
    """The insert of :data:`RAW_TABLE` into ``spans``, leaving out the spans the table holds
    already: a span resent after a crash is not kept twice (idempotent.py)."""
    starts = [row[5] for row in rows if row[5] is not None]
    return fresh_spans_sql(RAW_TABLE, ", ".join(RAW_COLUMNS), min(starts, default=None), max(starts, default=None))


def raw_size(rows: list[tuple[Any, ...]]) -> int:
    """About the bytes ``rows`` hold (their JSON texts, and a fixed share for the rest)."""
    return sum(len(row[10]) + len(row[11]) + len(row[12]) + 512 for row in rows)


RAW_COLUMNS = (
    "trace_id", "span_id", "parent_span_id", "name", "kind", "start_time", "end_time", "duration_ms", "status_code",
    "status_message", "attributes", "resource", "events", "links", "scope_name", "scope_version", "service_name", "role",
    "framework", "received_at",
)
