"""The web dashboard's data on a DuckDB file: JSON-ready dicts, the pages the query API
answers (:meth:`~loopscope.storage.queries.Reader.page_overview` and the others; the
dashboard's HTTP layer calls them through :mod:`loopscope.dashboards.web.api`).

Each function opens the store file read-only for the duration of the call (one short
connection, several queries) and lets go of it again, so an agent keeps writing while
the dashboard reads. Times are epoch milliseconds (UTC); the browser formats them.

``overview(store)`` is the main page's data (headline totals and the most recently
active sessions); it reads only the small ``sessions`` table and the ``turns`` table,
never the whole event log. The analytics functions scan the event log within a time
range.

The queries use the base tables (``events``, ``turns``, ``sessions``), so they work on
every store whatever views it carries.

JSON has no NaN or infinity: wherever one would be (a figure the store computes, a tool
result such as ``{"mean": NaN}`` recorded as Python's ``json`` writes it), the answers
hold ``null``, as ``loopscope ... --json`` does for recorded values (:func:`json_safe`).
Numeric parameters are whole numbers within bounds (``limit`` 1..:data:`MAX_PAGE`,
``offset`` 0..:data:`MAX_OFFSET`, ``after``/``before`` 0..:data:`MAX_INDEX`); anything
else is an :class:`ApiError` (HTTP 400).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import duckdb

from ..pages import (
    LIVE_SECONDS,
    MAX_CONTENT_CHARS,
    RANGES,
    ApiError,
    declared_page,
    json_safe,
    page_args,
    timeline_limit,
)
from ..pages import content_of as _content
from ..pages import loads as _loads
from ..pages import now_ms as _now_ms
from ..pages import since as _since
from ..policy import EventFilter
from .connection import open_store
from .replay import SessionMark, read_after
from .schema import check_readable, has_model_calls, has_tool_columns
from .scores import turn_scores
from .values import fill_dicts
from .views import tool_rows

__all__ = [
    "MAX_CONTENT_CHARS",
    "RANGES",
    "ApiError",
    "declared_vs_used",
    "event",
    "json_safe",
    "overview",
    "sessions",
    "timeline",
    "tool_analytics",
    "turn_analytics",
]

_BUCKETS = (1, 10, 60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86_400, 7 * 86_400, 30 * 86_400)
_MAX_BUCKETS = 60
OUTCOMES = ("served", "failed", "refused", "blocked", "cancelled", "unserved")


class Store(Protocol):
    """What the pages read a file through: :class:`~loopscope.storage.duckdb.queries.DuckDBReader`
    (or :class:`~loopscope.storage.duckdb.store.Store`, which has the same)."""

    path: str
    lock_timeout: float
    keep_open: bool

    def _flush_own(self) -> None: ...


# -- reading ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _reading(store: Store) -> Iterator[duckdb.DuckDBPyConnection]:
    """One read-only connection for the ``with`` block, as :class:`Store` reads do."""
    store._flush_own()  # a dashboard inside the recording process sees everything
    with open_store(store.path, read_only=True, timeout=store.lock_timeout, keep=store.keep_open) as con:
        check_readable(con)
        yield con


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    cursor = con.execute(sql, list(params))
    names = [d[0] for d in cursor.description]
    return [dict(zip(names, _finite(row), strict=True)) for row in cursor.fetchall()]


def _finite(row: Sequence[Any]) -> list[Any]:
    # JSON has no NaN or infinity (a list or struct column may hold them too)
    return [json_safe(v) if isinstance(v, (float, list, dict)) else v for v in row]


def _bucket(con: duckdb.DuckDBPyConnection, since: float | None) -> tuple[int, int | None]:
    """A bucket width (seconds) giving at most ~60 buckets over the data in range, and its start."""
    row = con.execute("SELECT epoch(min(first_at)), epoch(max(last_at)) FROM sessions").fetchone()
    first, last = row or (None, None)
    if first is None or last is None:
        return 60, None
    start = max(first, since) if since is not None else first
    span = max(0.0, float(last) - float(start))
    width = next((b for b in _BUCKETS if span / b <= _MAX_BUCKETS), _BUCKETS[-1])
    return width, int(start)


def _time_clause(since: float | None, column: str = "created_at") -> tuple[str, list[Any]]:
    if since is None:
        return "", []
    return f" AND {column} >= to_timestamp(?)", [since]


# -- what turns cost ---------------------------------------------------------------------------

# Each turn's model calls, joined to ``turns t`` as ``c``: a turn's cost is the sum of its
# calls' costs, and a turn without call rows (an older writer, a foreign turn) has its own
# price, as the ``turn_summaries`` view says. A call with tokens but no price is counted,
# never priced at $0.
_CALLS_PER_TURN = """
LEFT JOIN (
    SELECT session_id AS c_session, correlation_id AS c_turn, count(*) AS c_calls, sum(cost_usd) AS c_cost,
           count(*) FILTER (WHERE cost_usd IS NULL AND (input_tokens IS NOT NULL OR output_tokens IS NOT NULL))
               AS c_unpriced
    FROM model_calls {where} GROUP BY ALL
) c ON c.c_session = t.session_id AND c.c_turn = t.correlation_id"""


_USAGE_UNPRICED = "CASE WHEN t.input_tokens IS NOT NULL OR t.output_tokens IS NOT NULL THEN 1 ELSE 0 END"


def _turn_costs(con: duckdb.DuckDBPyConnection, where: str = "") -> dict[str, str]:
    """SQL for a turn's model calls, cost and calls without a price (``calls``, ``cost``,
    ``unpriced``) over ``turns t``, and the ``join`` they need. A file from before model
    calls were stored has no calls and no prices: a turn with usage counts as one call
    without a price, as the views read such a file."""
    if not has_model_calls(con):
        return {"join": "", "calls": "0", "cost": "CAST(NULL AS DOUBLE)", "unpriced": _USAGE_UNPRICED}
    return {
        "join": _CALLS_PER_TURN.format(where=where),
        "calls": "coalesce(t.model_call_count, c.c_calls, 0)",
        "cost": "CASE WHEN c.c_calls > 0 THEN c.c_cost ELSE t.cost_usd END",
        "unpriced": """CASE WHEN c.c_calls > 0 THEN c.c_unpriced
                    WHEN t.cost_usd IS NULL AND (t.input_tokens IS NOT NULL OR t.output_tokens IS NOT NULL) THEN 1
                    ELSE 0 END""",
    }


# -- sessions ---------------------------------------------------------------------------------

_SESSION_PAGE_SQL = """
WITH page AS (
    SELECT session_id, last_index, first_at, last_at FROM sessions
    {where}
    ORDER BY last_at DESC NULLS LAST, session_id
    LIMIT ? OFFSET ?
)
SELECT
    p.session_id,
    p.last_index AS event_count,
    epoch_ms(p.first_at) AS first_at,
    epoch_ms(p.last_at) AS last_at,
    count(t.correlation_id) AS turns,
    list_sort(list_distinct(list(t.channel_id))) AS agents,
    list_sort(list_distinct(list(t.model))) AS models,
    coalesce(sum(t.input_tokens), 0) AS input_tokens,
    coalesce(sum(t.output_tokens), 0) AS output_tokens,
    coalesce(sum(t.tool_calls_count), 0) AS tool_calls,
    arg_max(t.loop_end_reason, t.timestamp) AS last_loop_end_reason,
    count(t.correlation_id) FILTER (WHERE t.loop_end_reason IS DISTINCT FROM 'completed') AS not_completed,
    sum({calls}) AS model_calls,
    sum({cost}) AS cost_usd,
    coalesce(sum({unpriced}), 0) AS unpriced_calls
FROM page p LEFT JOIN turns t ON t.session_id = p.session_id{join}
GROUP BY p.session_id, p.last_index, p.first_at, p.last_at
ORDER BY p.last_at DESC NULLS LAST, p.session_id
"""


def _session_page(
    con: duckdb.DuckDBPyConnection, query: str | None, limit: int, offset: int
) -> tuple[list[dict[str, Any]], int]:
    where, params = "", []
    if query and query.strip():
        from .search import matches_sql

        needle = query.strip().lower()
        content, match_params = matches_sql(con, needle)  # and the sessions whose content holds it (issue 35)
        where = f"""WHERE contains(lower(session_id), ?) OR session_id IN (
            SELECT session_id FROM turns
            WHERE contains(lower(coalesce(channel_id, '')), ?) OR contains(lower(coalesce(model, '')), ?)
        ) OR session_id IN (SELECT session_id FROM ({content}))"""
        params = [needle, needle, needle, *match_params]
    total_row = con.execute(f"SELECT count(*) FROM sessions {where}", params).fetchone()
    costs = _turn_costs(con, "WHERE session_id IN (SELECT session_id FROM page)")
    rows = _rows(con, _SESSION_PAGE_SQL.format(where=where, **costs), [*params, limit, offset])
    live_after = _now_ms() - LIVE_SECONDS * 1000
    for row in rows:
        row["agents"] = [a for a in row["agents"] or [] if a]
        row["models"] = [m for m in row["models"] or [] if m]
        row["live"] = bool(row["last_at"] and row["last_at"] >= live_after)
    return rows, int(total_row[0]) if total_row else 0


def sessions(store: Store, q: str | None = None, limit: int | None = None, offset: int | None = None) -> dict[str, Any]:
    """A page of sessions, most recently active first; ``q`` matches session id, agent or
    model, or the content of the session (storage/duckdb/search.py)."""
    limit, offset = page_args(limit, offset, 50)
    with _reading(store) as con:
        rows, total = _session_page(con, q, limit, offset)
    return {"sessions": rows, "total": total, "limit": limit, "offset": offset, "q": q or ""}


def overview(store: Store, limit: int = 50) -> dict[str, Any]:
    """The dashboard's first page: store-wide totals, loop end reasons, the most recent sessions."""
    with _reading(store) as con:
        totals = _rows(
            con,
            """SELECT count(*) AS sessions, coalesce(sum(last_index), 0) AS events,
                      epoch_ms(max(last_at)) AS last_at FROM sessions""",
        )[0]
        turn_totals = _rows(
            con,
            """SELECT count(*) AS turns,
                      coalesce(sum(tool_calls_count), 0) AS tool_calls,
                      coalesce(sum(input_tokens), 0) AS input_tokens,
                      coalesce(sum(output_tokens), 0) AS output_tokens,
                      quantile_cont(latency_ms, 0.5) AS latency_p50_ms,
                      quantile_cont(latency_ms, 0.95) AS latency_p95_ms
               FROM turns""",
        )[0]
        reasons = _rows(
            con,
            """SELECT coalesce(loop_end_reason, 'unknown') AS reason, count(*) AS turns
               FROM turns GROUP BY 1 ORDER BY 2 DESC, 1""",
        )
        costs = _rows(con, _COST_TOTALS_SQL)[0] if has_model_calls(con) else {
            "model_calls": 0, "cost_usd": None, "unpriced_calls": 0}
        recent, total = _session_page(con, None, limit, 0)
    totals.update(turn_totals)
    totals.update(costs)
    return {
        "store": store.path,
        "generated_at": _now_ms(),
        "totals": totals,
        "loop_end_reasons": reasons,
        "sessions": recent,
        "sessions_total": total,
    }


# the store's model calls and what they cost (the view counts a turn without call rows by its own cost)
_COST_TOTALS_SQL = "SELECT model_calls, cost_usd, unpriced_calls FROM cost_totals"


# -- a session's timeline ---------------------------------------------------------------------

_EVENT_COLUMNS = """id, idx AS "index", type, epoch_ms(created_at) AS t, correlation_id, status,
       source_channel_id AS agent, source_provider AS provider, source_framework AS framework,
       content"""
_EVENT_SQL = "SELECT " + _EVENT_COLUMNS + " FROM events WHERE {where} ORDER BY idx {order} LIMIT ?"

_TURN_SQL = """
SELECT correlation_id, session_id, channel_id AS agent, parent_correlation_id, tool_calls_count, round_count,
       usage, input_tokens, output_tokens, loop_end_reason, latency_ms, streaming,
       epoch_ms(timestamp) AS t, model, provider, error, declared_tools, trace_id
FROM turns WHERE session_id = ? AND list_contains(?, correlation_id)
ORDER BY timestamp, correlation_id
"""


_CALLS_SQL = """
SELECT correlation_id AS turn_id,
       coalesce(position, CAST(row_number() OVER (PARTITION BY correlation_id ORDER BY started_at, span_id) AS INTEGER))
           AS position,
       epoch_ms(started_at) AS started_at, epoch_ms(ended_at) AS ended_at, duration_ms,
       time_to_first_chunk_ms AS ttfc_ms, coalesce(response_model, request_model) AS model, provider, agent,
       input_tokens, output_tokens, cache_read_input_tokens, cache_creation_input_tokens, reasoning_tokens,
       cost_usd, outcome, finish_reasons, error_type, error, refusal, streaming, response_id, span_id
FROM model_calls WHERE session_id = ? AND list_contains(?, correlation_id)
ORDER BY started_at, span_id
"""
_TURN_COSTS_SQL = """
SELECT t.correlation_id, coalesce(t.model_call_count, c.calls, 0) AS model_calls,
       CASE WHEN c.calls > 0 THEN c.cost ELSE t.cost_usd END AS cost_usd,
       CASE WHEN c.calls > 0 THEN c.unpriced
            WHEN t.cost_usd IS NULL AND (t.input_tokens IS NOT NULL OR t.output_tokens IS NOT NULL) THEN 1
            ELSE 0 END AS unpriced_calls
FROM turns t LEFT JOIN (
    SELECT correlation_id, count(*) AS calls, sum(cost_usd) AS cost,
           count(*) FILTER (WHERE cost_usd IS NULL AND (input_tokens IS NOT NULL OR output_tokens IS NOT NULL)) AS unpriced
    FROM model_calls
    WHERE session_id = ? AND list_contains(?, correlation_id) GROUP BY correlation_id
) c ON c.correlation_id = t.correlation_id
WHERE t.session_id = ? AND list_contains(?, t.correlation_id)
"""


def _call_row(row: dict[str, Any]) -> dict[str, Any]:
    try:
        reasons = _loads(row["finish_reasons"]) if row["finish_reasons"] else []
    except ValueError:
        reasons = []
    row["finish_reasons"] = reasons if isinstance(reasons, list) else []
    return row


def _event_row(row: dict[str, Any], clip: bool = True) -> dict[str, Any]:
    row["content"], row["truncated"] = _content(row["content"], clip)
    return row


def _turn_row(row: dict[str, Any]) -> dict[str, Any]:
    for key in ("usage", "declared_tools"):
        try:
            row[key] = _loads(row[key]) if row[key] else None
        except ValueError:
            row[key] = None
    row["declared_tools"] = [d.get("name") for d in row["declared_tools"] or [] if isinstance(d, dict)]
    return row


def timeline(
    store: Store,
    session_id: str,
    *,
    after_index: int | None = None,
    before_index: int | None = None,
    limit: int | None = None,
    include_blocked: bool = False,
    turn_ids: Sequence[str] = (),
) -> dict[str, Any]:
    """One page of a session's timeline and the summaries of the turns on it.

    Without a cursor the page holds the newest ``limit`` events; ``after_index`` the
    events after it (live updates), ``before_index`` those just before it (earlier
    history). Events are always ascending by index. ``turns`` holds the summaries of the
    finished turns among the page's events and ``turn_ids`` (turns the page still shows
    as running); a running turn has no summary yet.

    ``model_calls`` holds the model calls of the same turns (finished or running), for a
    waterfall on one time axis beside the tool calls, ordered by start::

        {"turn_id": str, "position": int (1-based in the turn), "started_at": ms,
         "ended_at": ms, "duration_ms": float, "ttfc_ms": float | None (streams),
         "model": str | None, "provider": str | None, "agent": str | None,
         "input_tokens", "output_tokens", "cache_read_input_tokens",
         "cache_creation_input_tokens", "reasoning_tokens": int | None,
         "cost_usd": float | None (None: no price known), "outcome": str | None
         (completed, truncated, refusal, content_filter, error, cancelled),
         "finish_reasons": [str], "error_type": str | None, "error": str | None,
         "refusal": str | None, "streaming": bool | None, "response_id": str | None, "span_id": str}

    ``scores`` holds the scores of the same turns, of their model calls and of their tool calls
    (``storage/duckdb/scores.py``: ``target`` turn, call or tool, ``turn_id``, ``tool_call_id``,
    ``call_position``, name, value, label, explanation, source), oldest first.

    Each turn summary gains ``model_calls`` (how many), ``cost_usd`` (their sum; a turn
    without call rows, its own price) and ``unpriced_calls`` (calls with tokens but no
    price, left out of the sum). A file from before model calls has none.

    ``cursor`` is the ``after_index`` of the next live page (None for a ``before_index``
    page): pages after an index are read with :func:`loopscope.storage.duckdb.replay.read_after`,
    the query ``Store.replay`` and ``loopscope tail --follow`` follow a log with, so the
    cursor also passes rows the page leaves out (blocked ones) and nothing lands twice
    or in neither page.
    """
    limit = timeline_limit(limit, after_index, before_index)
    clauses, params = EventFilter(include_blocked=include_blocked).where()
    clauses.insert(0, "session_id = ?")
    params.insert(0, session_id)
    descending = after_index is None
    if before_index is not None:
        clauses.append("idx < ?")
        params.append(before_index)
    with _reading(store) as con:
        info = _rows(
            con,
            """SELECT last_index, first_at, last_at, epoch_ms(first_at) AS first_ms, epoch_ms(last_at) AS last_ms
               FROM sessions WHERE session_id = ?""",
            [session_id],
        )
        if info and info[0]["first_at"] is not None and info[0]["last_at"] is not None:
            # the session's time span lets DuckDB skip the row groups of other times
            clauses.append("created_at BETWEEN ? AND ?")
            params.extend([info[0]["first_at"], info[0]["last_at"]])
        if after_index is not None:
            mark = SessionMark(info[0]["last_index"], info[0]["first_at"], info[0]["last_at"]) if info else None
            after = read_after(
                con, session_id, after_index, columns=_EVENT_COLUMNS,
                event_filter=EventFilter(include_blocked=include_blocked), limit=limit, mark=mark,
            )
            events = [_event_row(dict(zip(after.names, _finite(r), strict=True))) for r in after.rows]
            more, cursor = after.more, after.cursor
        else:
            sql = _EVENT_SQL.format(where=" AND ".join(clauses), order="DESC" if descending else "ASC")
            events = [_event_row(r) for r in fill_dicts(con, _rows(con, sql, [*params, limit + 1]))]
            more = len(events) > limit
            events = events[:limit]
            events.reverse()
            # the newest page reaches the end of the log as this read saw it
            cursor = (info[0]["last_index"] if info else 0) if before_index is None else None
        wanted = sorted({e["correlation_id"] for e in events if e["correlation_id"]} | set(turn_ids))
        turns = [_turn_row(r) for r in _rows(con, _TURN_SQL, [session_id, wanted])] if wanted else []
        calls: list[dict[str, Any]] = []
        if wanted and has_model_calls(con):
            calls = [_call_row(r) for r in _rows(con, _CALLS_SQL, [session_id, wanted])]
            costs = {r["correlation_id"]: r for r in _rows(con, _TURN_COSTS_SQL, [session_id, wanted, session_id, wanted])}
        else:
            costs = {}
        # the page's turns' scores (and their calls' and tools'), from the session's stretch of the log
        stretch = (info[0]["first_at"], info[0]["last_at"]) if info else (None, None)
        scores = turn_scores(con, session_id, wanted, *stretch)
        for turn in turns:
            cost = costs.get(turn["correlation_id"], {})
            turn["model_calls"], turn["cost_usd"] = cost.get("model_calls", 0), cost.get("cost_usd")
            turn["unpriced_calls"] = cost.get("unpriced_calls", 0)
    session = info[0] if info else None
    return {
        "session_id": session_id,
        "found": session is not None,
        "last_index": session["last_index"] if session else 0,
        "first_at": session["first_ms"] if session else None,
        "last_at": session["last_ms"] if session else None,
        "events": events,
        "turns": turns,
        "model_calls": calls,
        "scores": scores,
        # more history before the page (newest/before pages) or more events after it (after pages)
        "more_before": more if descending else None,
        "more_after": more if not descending else None,
        "cursor": cursor,
        "generated_at": _now_ms(),
    }


def event(store: Store, event_id: str) -> dict[str, Any] | None:
    """One event in full (a timeline page cuts long contents)."""
    with _reading(store) as con:
        rows = fill_dicts(con, _rows(con, _EVENT_SQL.format(where="id = ?", order="ASC"), [event_id, 1]))
    return _event_row(rows[0], clip=False) if rows else None


# -- analytics --------------------------------------------------------------------------------

def _tool_rows(con: duckdb.DuckDBPyConnection) -> str:
    """The tool rows with their fields (``tool``, ``outcome``, ``duration_ms``, ...): from
    the tool columns where the file has them, else from the ``content`` JSON."""
    return tool_rows(has_tool_columns(con))


def tool_analytics(store: Store, range_: str | None = "all", tool: str | None = None) -> dict[str, Any]:
    """Per tool: calls, running, share by outcome, duration percentiles, last seen; calls over time.

    One pass over the tool rows: the per-tool figures and the per-bucket ones are two
    grouping sets of the same scan. A call counts once, by its start row (or by its end
    row when starts were not stored); ``running`` is started calls not ended yet.
    """
    since = _since(range_)
    time_sql, time_params = _time_clause(since)
    end = "type = 'tool_call_end'"
    outcome_columns = ", ".join(f"count(*) FILTER (WHERE {end} AND outcome = '{o}') AS {o}" for o in OUTCOMES)
    known = ", ".join(f"'{o}'" for o in OUTCOMES)
    with _reading(store) as con:
        width, start = _bucket(con, since)
        rows = _rows(
            con,
            f"""WITH r AS (
                    SELECT type, created_at, tool, outcome, duration_ms AS ms,
                           epoch_ms(time_bucket(to_seconds(?), created_at, to_timestamp(?))) AS t
                    FROM ({_tool_rows(con)}) WHERE true{time_sql}
                )
                SELECT grouping(tool) AS per_bucket, tool, t, outcome,
                       count(*) FILTER (WHERE type = 'tool_call_start') AS started,
                       count(*) FILTER (WHERE {end}) AS ended,
                       {outcome_columns},
                       count(*) FILTER (WHERE {end} AND outcome NOT IN ({known})) AS other,
                       quantile_cont(ms, [0.5, 0.95, 0.99]) FILTER (WHERE {end}) AS q,
                       max(ms) FILTER (WHERE {end}) AS max_ms, avg(ms) FILTER (WHERE {end}) AS avg_ms,
                       epoch_ms(max(created_at)) AS last_seen,
                       count(*) FILTER (WHERE {end} AND (? IS NULL OR tool = ?)) AS bucket_calls
                FROM r
                GROUP BY GROUPING SETS ((tool), (t, outcome))""",
            [width, start or 0, *time_params, tool, tool],
        )
    per_tool, over_time = [], []
    for row in rows:
        if row["per_bucket"]:
            if row["ended"] and row["bucket_calls"]:
                over_time.append({"t": row["t"], "outcome": row["outcome"] or "unknown", "calls": row["bucket_calls"]})
            continue
        q = row.pop("q") or [None, None, None]
        calls = max(row["started"], row["ended"])
        failures = row["ended"] - row["served"]
        per_tool.append(
            {
                "tool": row["tool"],
                "calls": calls,
                "running": calls - row["ended"],
                "ended": row["ended"],
                **{o: row[o] for o in OUTCOMES},
                "other": row["other"],
                "p50_ms": q[0],
                "p95_ms": q[1],
                "p99_ms": q[2],
                "max_ms": row["max_ms"],
                "avg_ms": row["avg_ms"],
                "last_seen": row["last_seen"],
                "failures": failures,
                "failure_share": failures / row["ended"] if row["ended"] else None,
            }
        )
    per_tool.sort(key=lambda r: (-r["calls"], r["tool"] or ""))
    over_time.sort(key=lambda r: (r["t"], r["outcome"]))
    return {
        "range": range_ or "all",
        "tool": tool,
        "bucket_seconds": width,
        "tools": per_tool,
        "outcomes": list(OUTCOMES),
        "over_time": over_time,
        "generated_at": _now_ms(),
    }


def turn_analytics(store: Store, range_: str | None = "all") -> dict[str, Any]:
    """Loop end reasons (in all and over time), tokens by model and over time, latency, slowest turns."""
    since = _since(range_)
    time_sql, time_params = _time_clause(since, "timestamp")
    where = f"WHERE true{time_sql}"
    with _reading(store) as con:
        width, start = _bucket(con, since)
        costs = _turn_costs(con)
        priced = f"turns t{costs['join']} {where}"
        reasons = _rows(
            con,
            f"""SELECT coalesce(loop_end_reason, 'unknown') AS reason, count(*) AS turns,
                       count(*) / sum(count(*)) OVER () AS share
                FROM turns {where} GROUP BY 1 ORDER BY 2 DESC, 1""",
            time_params,
        )
        over_time = _rows(
            con,
            f"""SELECT epoch_ms(time_bucket(to_seconds(?), timestamp, to_timestamp(?))) AS t,
                       coalesce(loop_end_reason, 'unknown') AS reason, count(*) AS turns,
                       coalesce(sum(input_tokens), 0) AS input_tokens, coalesce(sum(output_tokens), 0) AS output_tokens,
                       quantile_cont(latency_ms, 0.95) AS p95_ms
                FROM turns {where} GROUP BY ALL ORDER BY 1, 2""",
            [width, start or 0, *time_params],
        )
        models = _rows(
            con,
            f"""SELECT coalesce(model, '(unknown)') AS model, coalesce(provider, '') AS provider, count(*) AS turns,
                       coalesce(sum(input_tokens), 0) AS input_tokens, coalesce(sum(output_tokens), 0) AS output_tokens,
                       avg(coalesce(input_tokens, 0) + coalesce(output_tokens, 0)) AS avg_tokens,
                       sum({costs['calls']}) AS model_calls, sum({costs['cost']}) AS cost_usd,
                       coalesce(sum({costs['unpriced']}), 0) AS unpriced_calls
                FROM {priced} GROUP BY 1, 2
                ORDER BY sum(coalesce(input_tokens, 0) + coalesce(output_tokens, 0)) DESC, 1""",
            time_params,
        )
        latency = _rows(
            con,
            f"""SELECT coalesce(channel_id, '(no agent)') AS agent, count(*) AS turns,
                       quantile_cont(latency_ms, 0.5) AS p50_ms, quantile_cont(latency_ms, 0.95) AS p95_ms,
                       quantile_cont(latency_ms, 0.99) AS p99_ms, max(latency_ms) AS max_ms,
                       avg(round_count) AS avg_rounds, avg(tool_calls_count) AS avg_tool_calls,
                       avg({costs['calls']}) AS avg_model_calls
                FROM {priced} GROUP BY ROLLUP (channel_id) ORDER BY grouping(channel_id) DESC, turns DESC""",
            time_params,
        )
        slowest = _rows(
            con,
            f"""SELECT correlation_id, session_id, channel_id AS agent, model, loop_end_reason, latency_ms,
                       round_count, tool_calls_count, input_tokens, output_tokens, epoch_ms(timestamp) AS t,
                       {costs['calls']} AS model_calls, {costs['cost']} AS cost_usd, {costs['unpriced']} AS unpriced_calls
                FROM {priced} ORDER BY latency_ms DESC NULLS LAST LIMIT 10""",
            time_params,
        )
    # ROLLUP's grand total comes first: name it
    if latency:
        latency[0]["agent"] = "all agents"
    return {
        "range": range_ or "all",
        "bucket_seconds": width,
        "loop_end_reasons": reasons,
        "over_time": over_time,
        "models": models,
        "latency": latency,
        "slowest": slowest,
        "generated_at": _now_ms(),
    }


def declared_vs_used(store: Store, range_: str | None = "all") -> dict[str, Any]:
    """Per agent: each tool declared in its turns, in how many turns, and how often it was called.

    Tools declared but never called cost prompt tokens every turn; tools called but not
    declared point at a mismatch between what the model is offered and what runs.
    """
    since = _since(range_)
    turn_time, time_params = _time_clause(since, "timestamp")
    event_time, event_params = _time_clause(since)
    with _reading(store) as con:
        rows = _rows(
            con,
            f"""WITH t AS (
                    SELECT coalesce(channel_id, '') AS agent, declared_tools FROM turns WHERE true{turn_time}
                ),
                agent_turns AS (SELECT agent, count(*) AS turns FROM t GROUP BY agent),
                declared AS (
                    SELECT agent, tool, count(*) AS turns_declared
                    FROM (SELECT agent, unnest(list_distinct(json_extract_string(declared_tools, '$[*].name'))) AS tool
                          FROM t WHERE declared_tools IS NOT NULL)
                    GROUP BY ALL
                ),
                used AS (
                    SELECT coalesce(agent, '') AS agent, tool, count(*) AS calls,
                           count(DISTINCT turn_id) AS turns_used
                    FROM ({_tool_rows(con)}) WHERE type = 'tool_call_start'{event_time}
                    GROUP BY ALL
                )
                SELECT coalesce(d.agent, u.agent) AS agent, coalesce(d.tool, u.tool) AS tool,
                       coalesce(d.turns_declared, 0) AS turns_declared, coalesce(u.calls, 0) AS calls,
                       coalesce(u.turns_used, 0) AS turns_used, coalesce(a.turns, 0) AS agent_turns
                FROM declared d FULL JOIN used u ON d.agent = u.agent AND d.tool = u.tool
                LEFT JOIN agent_turns a ON a.agent = coalesce(d.agent, u.agent)
                ORDER BY 1, calls DESC, turns_declared DESC, 2""",
            [*time_params, *event_params],
        )
    return declared_page(rows, range_)
