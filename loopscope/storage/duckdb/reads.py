"""The store's common reads as plain rows: each read's SQL, run on a connection the caller
opened, its rows as tuples. :class:`~loopscope.storage.duckdb.store.Store` makes the public
models of them; the command line prints them as named tuples (:class:`TurnRow`), so that
``loopscope turns`` imports neither pydantic nor the models (nor more of DuckDB than its
engine: :mod:`loopscope.storage.duckdb.engine`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from ..pages import json_or_text
from ..policy import TurnFilter
from ..results import CallRow, TurnRow
from .connection import open_store
from .engine import duckdb
from .schema import MODEL_CALLS_SINCE, SCHEMA_VERSION, check_readable, missing_views

TURN_COLUMNS = (
    "channel_id, session_id, correlation_id, parent_correlation_id, response_content, segments, tool_calls_count, "
    "round_count, usage, thinking, loop_end_reason, latency_ms, streaming, timestamp, declared_tools, model, "
    "provider, error, trace_id, span_id, model_call_count"
)
"""The ``turns`` columns a turn read selects, in :class:`TurnRow`'s order. ``model_call_count``
is last: a file from before ``m009_model_calls`` has no such column (the read selects NULL
in its place), and a turn whose writer did not count its calls has NULL there (the read
counts its ``model_calls`` rows)."""
TURN_NAMES = tuple(c.strip() for c in TURN_COLUMNS.split(","))
TURN_JSON = ("segments", "usage", "declared_tools")
"""The ``turns`` columns stored as JSON text."""
# ``timestamp`` as UTC wall time (a plain TIMESTAMP), made aware again in Python: DuckDB
# hands a TIMESTAMPTZ to Python with a ``zoneinfo`` zone, and importing ``zoneinfo`` and
# reading the zone's file cost ``loopscope turns`` ~10 ms (a third of its reads)
_NAIVE_COLUMNS = TURN_COLUMNS.replace(", timestamp,", ", timezone('UTC', timestamp) AS timestamp,", 1)


def _json(text: Any) -> Any:
    return json.loads(text) if text else None


def turn_row(row: Sequence[Any]) -> TurnRow:
    """A ``turns`` row (:data:`TURN_COLUMNS`) as a :class:`TurnRow`."""
    data = dict(zip(TURN_NAMES, row, strict=True))
    return TurnRow(
        channel_id=data["channel_id"],
        session_id=data["session_id"],
        correlation_id=data["correlation_id"],
        parent_correlation_id=data["parent_correlation_id"],
        response_content=data["response_content"] or "",
        segments=_json(data["segments"]) or [],
        tool_calls_count=data["tool_calls_count"] or 0,
        round_count=data["round_count"] or 0,
        usage=_json(data["usage"]) or {},
        thinking=data["thinking"] or "",
        loop_end_reason=data["loop_end_reason"],
        latency_ms=data["latency_ms"] or 0,
        streaming=bool(data["streaming"]),
        timestamp=_aware(data["timestamp"]),
        declared_tools=_json(data["declared_tools"]) or [],
        model=data["model"],
        provider=data["provider"],
        error=data["error"],
        trace_id=data["trace_id"],
        span_id=data["span_id"],
        model_call_count=data["model_call_count"] or 0,
    )


def _aware(value: datetime | None) -> datetime | None:
    return value.replace(tzinfo=timezone.utc) if value is not None and value.tzinfo is None else value


def turn_rows(
    con: duckdb.DuckDBPyConnection,
    session_id: str | None = None,
    limit: int | None = 50,
    *,
    correlation_id: str | None = None,
    channel_id: str | None = None,
    loop_end_reason: str | None = None,
    after_time: datetime | None = None,
    newest_first: bool = False,
    utc_naive: bool = False,
    turn_filter: TurnFilter | None = None,
) -> list[tuple[Any, ...]]:
    """``turns`` rows (:data:`TURN_COLUMNS`), oldest first (``newest_first`` picks the most
    recent ``limit``): what :meth:`~loopscope.storage.duckdb.store.Store.list_turns` reads.
    ``utc_naive`` reads ``timestamp`` as UTC without a zone (no ``zoneinfo``), as
    :func:`turn_row` takes it."""
    clauses: list[str] = []
    params: list[Any] = []
    for column, value in (
        ("session_id", session_id), ("correlation_id", correlation_id),
        ("channel_id", channel_id), ("loop_end_reason", loop_end_reason),
    ):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    if after_time is not None:
        clauses.append("timestamp > ?")
        params.append(after_time)
    if turn_filter is not None:
        more, more_params = turn_filter_where(con, turn_filter)
        clauses += more
        params += more_params
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    order = "DESC" if newest_first else "ASC"
    sql = f"SELECT {_NAIVE_COLUMNS if utc_naive else TURN_COLUMNS} FROM turns {where} ORDER BY timestamp {order}, correlation_id"
    if limit is not None:
        sql += f" LIMIT {int(limit)}"
    if check_readable(con) < MODEL_CALLS_SINCE:
        # an older file read as it is: no model_call_count column, no model_calls rows
        sql = sql.replace("model_call_count", "NULL AS model_call_count", 1)
        rows = con.execute(sql, params).fetchall()
    else:
        rows = with_call_counts(con, con.execute(sql, params).fetchall())
    if newest_first:
        rows.reverse()
    return rows


def turn_filter_where(con: duckdb.DuckDBPyConnection, turn_filter: TurnFilter) -> tuple[list[str], list[Any]]:
    """SQL conditions on ``turns`` (joined with AND) and their parameters for ``turn_filter``."""
    clauses: list[str] = []
    params: list[Any] = []
    for column, value in (
        ("channel_id", turn_filter.agent), ("loop_end_reason", turn_filter.reason), ("model", turn_filter.model),
    ):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    if turn_filter.since is not None:
        clauses.append("timestamp >= ?")
        params.append(turn_filter.since)
    if turn_filter.min_cost is not None:
        # the cost the tables show (turn_summaries: the turn's model calls' sum, else its own price)
        clauses.append(
            "EXISTS (SELECT 1 FROM turn_summaries s WHERE s.session_id = turns.session_id "
            "AND s.turn_id = turns.correlation_id AND s.cost_usd >= ?)"
        )
        params.append(turn_filter.min_cost)
    if turn_filter.text:
        from .search import matches_sql, needle_of

        sql, match_params = matches_sql(con, needle_of(turn_filter.text))
        clauses.append(
            f"session_id || chr(31) || correlation_id IN (SELECT session_id || chr(31) || turn_id FROM ({sql}))"
        )
        params += match_params
    return clauses, params


def with_call_counts(con: duckdb.DuckDBPyConnection, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """``turns`` rows (:data:`TURN_COLUMNS`, the count last) with the turns whose writer
    left no model call count (a foreign turn from collected spans, a turn written before
    the count was) given the number of their ``model_calls`` rows, as the
    ``turn_summaries`` view counts them. Only those turns' calls are read, and only when
    the page has such a turn: the common page costs no second query."""
    uncounted = {r[2] for r in rows if r[-1] is None and r[2] is not None}
    if not uncounted:
        return rows
    counts = {
        (session, turn): calls
        for session, turn, calls in con.execute(
            "SELECT session_id, correlation_id, count(*) FROM model_calls WHERE list_contains(?, correlation_id) GROUP BY ALL",
            [sorted(uncounted)],
        ).fetchall()
    }
    return [r if r[-1] is not None else (*r[:-1], counts.get((r[1], r[2]), 0)) for r in rows]


def view_rows_on(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]] | None:
    """``sql``'s rows on ``con`` when its file has this loopscope's views; None for an
    older file (read, not migrated): :func:`view_rows` then runs it where they are given."""
    if check_readable(con) < SCHEMA_VERSION:
        return None
    return con.execute(sql, list(params)).fetchall()


def view_rows(
    path: str, sql: str, params: Sequence[Any] = (), *, timeout: float = 10.0, keep: bool = False
) -> list[tuple[Any, ...]]:
    """A query of the views: on a file of this schema, on the shared read-only attachment;
    on an older one, in a database of its own given this loopscope's views first
    (:func:`~loopscope.storage.duckdb.schema.missing_views`)."""
    return view_query(path, sql, params, timeout=timeout, keep=keep)[1]


def view_query(
    path: str, sql: str, params: Sequence[Any] = (), *, timeout: float = 10.0, keep: bool = False
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """:func:`view_rows` with the column names: ``(names, rows)``. For our own SQL (the
    attachment is not sealed as :meth:`~loopscope.storage.duckdb.store.Store.sql` is)."""
    with open_store(path, read_only=True, timeout=timeout, keep=keep) as con:
        if check_readable(con) >= SCHEMA_VERSION:
            cursor = con.execute(sql, list(params))
            return [d[0] for d in cursor.description or []], cursor.fetchall()
    with open_store(path, read_only=True, timeout=timeout, isolated=True) as con:
        for statement in missing_views(con):
            con.execute(statement)
        cursor = con.execute(sql, list(params))
        return [d[0] for d in cursor.description or []], cursor.fetchall()


class ViewReader:
    """Our own queries of one store's views, as the terminal commands run several in a row
    (``loopscope stats``, ``tools``): on the shared read-only attachment, kept between
    them (:func:`~loopscope.storage.duckdb.connection.open_store`'s ``keep``), where
    :meth:`Store.sql <loopscope.storage.duckdb.store.Store.sql>` starts a sealed DuckDB of its
    own per query (~20 ms each); rows as tuples, no pydantic."""

    def __init__(self, path: str, *, lock_timeout: float = 10.0) -> None:
        self.path = path
        self.lock_timeout = lock_timeout

    def sql(self, query: str, params: Sequence[Any] = ()) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Column names and rows of ``query`` (ours: not sealed)."""
        from ..recording import flush_own

        flush_own(self.path)  # what this process recorded is read too
        return view_query(self.path, query, params, timeout=self.lock_timeout, keep=True)


def session_of(con: duckdb.DuckDBPyConnection, requested: str | None) -> str | list[str]:
    """The session a command is about: the most recently active one (``requested`` None),
    the one named, or the one whose id starts with ``requested``; else the ids (at most
    six) that start with it: none, or several."""
    check_readable(con)
    if requested is None:
        row = con.execute("SELECT session_id FROM sessions ORDER BY last_at DESC, session_id LIMIT 1").fetchone()
        return [] if row is None else str(row[0])
    if con.execute("SELECT 1 FROM events WHERE session_id = ? LIMIT 1", [requested]).fetchone() is not None:
        return requested
    rows = con.execute(
        """SELECT session_id FROM (
               SELECT session_id FROM sessions UNION SELECT session_id FROM turns WHERE session_id IS NOT NULL
           ) WHERE starts_with(session_id, ?) ORDER BY session_id LIMIT 6""",
        [requested],
    ).fetchall()
    matches = [str(r[0]) for r in rows]
    if requested in matches or len(matches) == 1:
        return requested if requested in matches else matches[0]
    return matches


CALL_COLUMNS = (
    "session_id, turn_id, position, agent, provider, framework, model, request_model, response_model, response_id, "
    "finish_reasons, outcome, streaming, started_at, ended_at, duration_ms, time_to_first_chunk_ms, input_tokens, "
    "output_tokens, cache_read_input_tokens, cache_creation_input_tokens, reasoning_tokens, provider_usage, "
    "parameters, cost_usd, price_source, error_type, error, refusal, input_messages, output_messages, trace_id, span_id"
)
"""The ``model_call_summaries`` columns a model call read selects, in :func:`call_row`'s order."""
CALL_NAMES = tuple(c.strip() for c in CALL_COLUMNS.split(","))
USAGE_NAMES = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens", "reasoning_tokens")
"""The token counts a call's ``usage`` holds (those stored)."""
CALL_JSON = ("finish_reasons", "provider_usage", "parameters", "input_messages", "output_messages")
"""The ``model_call_summaries`` columns stored as JSON text."""
# the times as UTC wall time, made aware again in Python (see _NAIVE_COLUMNS)
_NAIVE_CALL_COLUMNS = CALL_COLUMNS.replace(
    "started_at, ended_at", "timezone('UTC', started_at) AS started_at, timezone('UTC', ended_at) AS ended_at", 1
)


def call_row(row: Sequence[Any]) -> CallRow:
    """A ``model_call_summaries`` row (:data:`CALL_COLUMNS`) as a :class:`CallRow`: the JSON
    columns parsed (text that is not JSON kept as it is), the stored token counts as one
    ``usage``, the finish reasons as text."""
    data = dict(zip(CALL_NAMES, row, strict=True))
    for key in CALL_JSON:
        data[key] = json_or_text(data[key])
    reasons, parameters = data["finish_reasons"], data["parameters"]
    return CallRow(
        session_id=data["session_id"],
        correlation_id=data["turn_id"],
        position=data["position"],
        agent=data["agent"],
        provider=data["provider"],
        framework=data["framework"],
        model=data["model"],
        request_model=data["request_model"],
        response_model=data["response_model"],
        response_id=data["response_id"],
        finish_reasons=[str(r) for r in reasons] if isinstance(reasons, list) else [],
        outcome=data["outcome"],
        streaming=data["streaming"],
        started_at=_aware(data["started_at"]),
        ended_at=_aware(data["ended_at"]),
        duration_ms=data["duration_ms"],
        time_to_first_chunk_ms=data["time_to_first_chunk_ms"],
        usage={key: data[key] for key in USAGE_NAMES if data[key] is not None},
        provider_usage=data["provider_usage"],
        parameters=parameters if isinstance(parameters, dict) else {},
        cost_usd=data["cost_usd"],
        price_source=data["price_source"],
        error_type=data["error_type"],
        error=data["error"],
        refusal=data["refusal"],
        input_messages=data["input_messages"],
        output_messages=data["output_messages"],
        trace_id=data["trace_id"],
        span_id=data["span_id"],
    )


def call_rows(
    path: str,
    session_id: str | None = None,
    correlation_id: str | None = None,
    *,
    model: str | None = None,
    provider: str | None = None,
    failed: bool = False,
    slowest: bool = False,
    limit: int | None = 50,
    since: datetime | None = None,
    text: str | None = None,
    with_messages: bool = False,
    timeout: float = 10.0,
    keep: bool = False,
    utc_naive: bool = False,
) -> list[tuple[Any, ...]]:
    """``model_call_summaries`` rows (:data:`CALL_COLUMNS`) of the store at ``path``: what
    :meth:`~loopscope.storage.duckdb.store.Store.model_calls` reads (its filters, its order).
    ``utc_naive`` reads the times as UTC without a zone (no ``zoneinfo``), as
    :func:`call_row` takes them."""
    if limit is not None and limit < 0:
        raise ValueError("limit must not be negative")
    clauses: list[str] = []
    params: list[Any] = []
    for column, value in (("session_id", session_id), ("turn_id", correlation_id), ("provider", provider)):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    if model is not None:
        clauses.append("(request_model = ? OR response_model = ?)")
        params += [model, model]
    if failed:
        clauses.append("(outcome = 'error' OR error_type IS NOT NULL)")
    if since is not None:
        clauses.append("started_at >= ?")
        params.append(since)
    if text:
        from .search import CALL_TEXT, needle_of

        clauses.append(f"contains(lower({CALL_TEXT}), ?)")
        params.append(needle_of(text))
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    columns = _NAIVE_CALL_COLUMNS if utc_naive else CALL_COLUMNS
    if not with_messages:
        columns = columns.replace("input_messages, output_messages", "NULL, NULL")
    if slowest:
        order = "duration_ms DESC NULLS LAST, started_at DESC, span_id"
    else:
        order = "started_at DESC, position DESC, span_id DESC"
    sql = f"SELECT {columns} FROM model_call_summaries {where} ORDER BY {order}"
    if limit is not None:
        sql += f" LIMIT {int(limit)}"
    rows = view_rows(path, sql, params, timeout=timeout, keep=keep)
    if not slowest:
        rows.reverse()
    return rows
