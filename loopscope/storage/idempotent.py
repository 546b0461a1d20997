"""Writes that a resent span does not repeat: the rows a batch would add that the store
holds already are left out of it before it is written.

``loopscope collect`` answers a request once its rows are in the file; a collector killed
between the commit and the answer gets the request again from the sender (OTLP senders
retry what was not acknowledged), after a restart that forgot which spans it had seen.
Every row's identity comes from its span: an event's id is the span's trace and span ids
and the row's kind (:data:`mapping.EVENT_ID_SQL`), a turn summary is the ``invoke_agent``
span's, a raw span is its trace and span ids. So a row is left out when the store has
one with the same identity, and so is the second of two in the same batch.

The lookup reads only the part of the table whose times overlap the batch's: a row's
time comes from its span too (an event's ``created_at``, a turn's ``timestamp``, a raw
span's ``start_time``), and DuckDB skips the row groups whose min/max exclude the range
(zone maps), so the cost follows the batch's time range, not the table's size. It is
done before the events are numbered, so the session counters count each row once.
"""

from __future__ import annotations

from typing import Any

import duckdb

from .mapping import EVENT_ID_SQL, Facts

__all__ = ["drop_stored", "fresh_spans_sql"]

_BATCH = "_loopscope_idempotent_batch"


def drop_stored(con: duckdb.DuckDBPyConnection, facts: Facts) -> int:
    """Leave out of ``facts`` the events and turn summaries the store holds already (and
    repeats within the batch). Returns how many rows were left out. ``con`` is a write
    block of the store (the file is not written to here)."""
    dropped = 0
    events = facts.event_table()
    if events is not None:
        stale = _stale(con, events, "created_us", "created_at", f"SELECT _pos, {EVENT_ID_SQL} AS key FROM b",
                       "SELECT id AS key FROM events")
        if stale:
            keep = [i not in stale for i in range(events.num_rows)]
            facts.events = _keep(events, keep)
            facts.sessions = [s for s, k in zip(facts.sessions, keep) if k]
            dropped += len(stale)
    turns = facts.turn_table()
    if turns is not None:
        stale = _stale(con, turns, "timestamp_us", "timestamp", "SELECT _pos, th || sh AS key FROM b",
                       "SELECT trace_id || span_id AS key FROM turns")
        if stale:
            keep = [i not in stale for i in range(turns.num_rows)]
            facts.turns = _keep(turns, keep)
            facts.turn_rows -= len(stale)
            dropped += len(stale)
    return dropped


def _stale(con: duckdb.DuckDBPyConnection, table: Any, time_field: str, time_column: str, keys_sql: str, stored_sql: str) -> set[int]:
    """Positions in ``table`` whose key the store has (its rows in the batch's time range)
    or an earlier row of the batch has."""
    import pyarrow as pa
    import pyarrow.compute as pc

    times = pc.min_max(table.column(time_field))
    lo, hi = times["min"].value, times["max"].value
    table = table.append_column("_pos", pa.array(range(table.num_rows), pa.int64()))
    if lo is None:  # no times: look through the whole table
        where = "TRUE"
    else:  # literals, not parameters: the range must be known when the scan is planned
        where = f"{time_column} BETWEEN make_timestamptz({int(lo)}) AND make_timestamptz({int(hi)})"
    con.register(_BATCH, table)
    try:
        rows = con.execute(f"""
            WITH b AS (SELECT *, lower(hex(trace_id)) AS th, lower(hex(span_id)) AS sh FROM {_BATCH}),
                 k AS ({keys_sql})
            SELECT _pos FROM k SEMI JOIN ({stored_sql} WHERE {where}) s USING (key)
            UNION ALL
            SELECT _pos FROM (SELECT _pos, row_number() OVER (PARTITION BY key ORDER BY _pos) AS n FROM k) WHERE n > 1
        """).fetchall()
    finally:
        con.unregister(_BATCH)
    return {r[0] for r in rows}


def _keep(table: Any, keep: list[bool]) -> list[Any]:
    import pyarrow as pa

    return table.filter(pa.array(keep, pa.bool_())).to_batches()  # type: ignore[no-any-return]


def fresh_spans_sql(batch: str, columns: str, lo_us: int | None, hi_us: int | None) -> str:
    """An ``INSERT INTO spans`` of the raw spans of the registered table ``batch`` that the
    ``spans`` table does not hold yet (same trace and span id), each once; ``lo_us`` /
    ``hi_us``: the least and greatest ``start_time`` in the batch (microseconds)."""
    where = "TRUE" if lo_us is None or hi_us is None else (
        f"start_time BETWEEN make_timestamptz({int(lo_us)}) AND make_timestamptz({int(hi_us)})"
    )
    return (
        f"INSERT INTO spans ({columns}) SELECT DISTINCT ON (b.trace_id, b.span_id) b.* FROM {batch} b "
        f"ANTI JOIN (SELECT trace_id, span_id FROM spans WHERE {where}) s ON b.trace_id = s.trace_id AND b.span_id = s.span_id"
    )
