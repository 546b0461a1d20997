"""Writes that a resent span does not repeat: the rows a batch would add that the store
holds already are left out of it before it is written.

``loopscope collect`` answers a request once its rows are in the file; a collector killed
between the commit and the answer gets the request again from the sender (OTLP senders
retry what was not acknowledged), after a restart that forgot which spans it had seen.
Every row's identity comes from its span: an event's id is the span's trace and span ids
and a letter for the row's kind (as :data:`rows.EVENTS_SQL` makes it), a turn summary is the ``invoke_agent``
span's, a model call the ``chat`` span's, a raw span is its trace and span ids. So a row is left out when the store has
one with the same identity, and so is the second of two in the same batch.

The lookup reads only the part of the table whose times overlap the batch's: a row's
time comes from its span too (an event's ``created_at``, a turn's ``timestamp``, a model
call's ``ended_at``, a raw span's ``start_time``), and DuckDB skips the row groups whose min/max exclude the range
(zone maps), so the cost follows the batch's time range, not the table's size. It is
done before the events are numbered, so the session counters count each row once.
"""

from __future__ import annotations

from typing import Any

import duckdb

from ..rows import EVENT_TYPES, INPUT_MESSAGE, MODEL_ERROR, STATE_DELTA, STATE_SNAPSHOT, TOOL_END, TOOL_START, Facts

__all__ = ["drop_stored", "fresh_spans_sql"]

# an event id's last letter, by the fact's code, as rows.EVENTS_SQL makes it
_SUFFIX = {code: "m" for code in EVENT_TYPES} | {
    TOOL_START: "s", TOOL_END: "e", INPUT_MESSAGE: "i", STATE_SNAPSHOT: "x", STATE_DELTA: "x", MODEL_ERROR: "f",
}


def drop_stored(con: duckdb.DuckDBPyConnection, facts: Facts) -> int:
    """Leave out of ``facts`` the events, model calls and turn summaries the store holds already (and
    repeats within the batch). Returns how many rows were left out. ``con`` is a write
    block of the store (the file is not written to here)."""
    dropped = 0
    events = facts.event_table()
    if events is not None:
        suffix = _SUFFIX
        traces, spans, codes = (events.column(name).to_pylist() for name in ("trace_id", "span_id", "code"))
        keys = [t.hex() + s.hex() + suffix[c] for t, s, c in zip(traces, spans, codes)]
        keep = _fresh(con, keys, events.column("created_us"), "events", "id", "created_at")
        if keep is not None:
            facts.events = _kept(events, keep)
            facts.sessions = [s for s, k in zip(facts.sessions, keep) if k]
            dropped += len(keep) - sum(keep)
    calls = facts.call_table()
    if calls is not None:
        keep = _fresh_by_span(con, calls, "ended_us", "model_calls", "ended_at")
        if keep is not None:
            facts.calls = _kept(calls, keep)
            facts.call_rows = sum(keep)
            dropped += len(keep) - sum(keep)
    turns = facts.turn_table()
    if turns is not None:
        keep = _fresh_by_span(con, turns, "timestamp_us", "turns", "timestamp")
        if keep is not None:
            facts.turns = _kept(turns, keep)
            facts.turn_rows = sum(keep)
            dropped += len(keep) - sum(keep)
    return dropped


def _fresh_by_span(con: duckdb.DuckDBPyConnection, facts: Any, time_field: str, table: str, time_column: str) -> list[bool] | None:
    """:func:`_fresh` for facts one span makes one row of (a turn summary, a model call):
    their identity is the span's trace and span ids."""
    traces, spans = (facts.column(name).to_pylist() for name in ("trace_id", "span_id"))
    keys = [t.hex() + s.hex() for t, s in zip(traces, spans)]
    return _fresh(con, keys, facts.column(time_field), table, "trace_id || span_id", time_column)


def _fresh(con: duckdb.DuckDBPyConnection, keys: list[str], times: Any, table: str, key_sql: str, time_column: str) -> list[bool] | None:
    """Which of ``keys`` to keep: those the store does not hold (among its rows in the
    range of ``times``) and an earlier one of the batch is not; None: all of them."""
    import pyarrow.compute as pc

    bounds = pc.min_max(times)  # pyright: ignore[reportAttributeAccessIssue]  # pyarrow.compute makes its functions at import
    lo, hi = bounds["min"].value, bounds["max"].value
    # literals, not parameters: the range must be known when the scan is planned (zone maps)
    where = "TRUE" if lo is None else f"{time_column} BETWEEN make_timestamptz({int(lo)}) AND make_timestamptz({int(hi)})"
    found = con.execute(
        f"SELECT k FROM (SELECT {key_sql} AS k FROM {table} WHERE {where}) WHERE k IN (SELECT unnest(?::VARCHAR[]))", [keys]
    ).fetchall()
    seen = {row[0] for row in found}
    if not seen and len(set(keys)) == len(keys):
        return None
    keep = []
    for key in keys:
        keep.append(key not in seen)
        seen.add(key)
    return keep


def _kept(table: Any, keep: list[bool]) -> list[Any]:
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
