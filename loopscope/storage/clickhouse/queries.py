"""The reads the CLI and the dashboard make, as ClickHouse SQL over loopscope's derived tables
(:mod:`.ddl`): a session's timeline page, the turns list, tool statistics, the sessions list.

What the engine behind the query API will wrap. No client is imported: every function takes a
``run(sql, params)`` callable that runs one statement with ClickHouse's server-side parameters
(``{name:Type}`` in the SQL, ``params`` by name: chDB's ``Session.query(..., params=)`` and
clickhouse-connect's ``query(..., parameters=)`` both bind them, so no value is ever spliced into
the SQL) and returns the rows as sequences. Every function returns plain tuples; times are Unix
microseconds (``Int64``), the same on every client (a ``DateTime64``'s text differs between them).

Each read counts a row the Collector resent once (``FINAL``, or ``LIMIT 1 BY`` / distinct ids where
those cost less: a resent span makes the very same row) and reads a narrow range of its
table's sort key where it can: the timeline one session's rows (``loopscope_events`` is ordered by
session), tool statistics the durations table ordered by tool and time. Where the answer differs
from the DuckDB store's, the function says so.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

__all__ = ["EVENT_FIELDS", "TIMELINE_ROWS", "TURN_FIELDS", "Run", "sessions", "timeline_page", "tool_stats", "turns_list"]


class Run(Protocol):
    """Runs one statement with its named parameters; the result's rows."""

    def __call__(self, sql: str, params: Mapping[str, Any], /) -> Sequence[Sequence[Any]]: ...


EVENT_FIELDS = ("idx", "id", "type", "status", "created_us", "correlation_id", "source_channel_id", "source_provider",
                "source_framework", "content", "tool_name", "tool_call_id", "tool_status", "tool_outcome",
                "tool_duration_ms")
"""The fields of a timeline row, in order (:func:`timeline_page`)."""

_EVENT_SELECT = ("idx, id, type, status, toUnixTimestamp64Micro(created_at) AS created_us, correlation_id, "
                 "source_channel_id, source_provider, source_framework, content, tool_name, tool_call_id, "
                 "tool_status, tool_outcome, tool_duration_ms")


# one session's rows, numbered as ``loopscope_timeline`` numbers them (ddl.TIMELINE), with a copy of a
# row (a resent span, not merged away yet) dropped by ``LIMIT 1 BY id`` instead of ``FINAL``: a
# resent span makes the very same row, so either keeps the same rows, and ``FINAL`` merges every
# part's range of the session in order (77 vs 6 ms a page at 1M events, 23 parts)
TIMELINE_ROWS = """SELECT row_number() OVER (ORDER BY at, seq, id) AS idx, * FROM (
    SELECT * FROM loopscope_events WHERE session_id = {session_id:String} ORDER BY at, seq, id LIMIT 1 BY id)"""


def timeline_page(run: Run, session_id: str, offset: int = 0, limit: int | None = 50, *,
                  after_index: int | None = None, include_blocked: bool = False) -> list[tuple[Any, ...]]:
    """One page of a session's timeline, ascending by index (:data:`EVENT_FIELDS`): the rows from
    ``offset`` on, or with ``after_index`` the ``limit`` rows after that index (``offset`` then
    ignored), as ``Store.get_timeline`` pages. The indices are numbered at read time over every row of
    the session (as ``loopscope_timeline`` numbers them), blocked rows included, which are then left out unless
    ``include_blocked``: the same indices as the DuckDB store's writer gives."""
    if offset < 0 or (limit is not None and limit < 0):
        raise ValueError("offset and limit must not be negative")
    clauses: list[str] = []
    params: dict[str, Any] = {"session_id": session_id}
    if not include_blocked:
        clauses.append("status != 'blocked'")
    if after_index is not None:
        clauses.append("idx > {after_index:Int64}")
        params["after_index"] = int(after_index)
        offset = 0
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    sql = f"SELECT {_EVENT_SELECT} FROM ({TIMELINE_ROWS}) {where} ORDER BY idx"
    if limit is not None:
        sql += " LIMIT {limit:UInt64}"
        params["limit"] = int(limit)
    if offset:
        sql += " OFFSET {offset:UInt64}"
        params["offset"] = int(offset)
    return [tuple(row) for row in run(sql, params)]


TURN_FIELDS = ("correlation_id", "session_id", "channel_id", "timestamp_us", "loop_end_reason", "model", "provider",
               "tool_calls_count", "round_count", "input_tokens", "output_tokens", "latency_ms", "streaming", "error",
               "model_call_count")
"""The fields of a turn row, in order (:func:`turns_list`); ``timestamp_us`` is the turn's end."""


def turns_list(run: Run, limit: int | None = 50, *, session_id: str | None = None) -> list[tuple[Any, ...]]:
    """The newest ``limit`` turns (of one session, or all), newest first (:data:`TURN_FIELDS`), in
    the DuckDB store's order: by end time descending, then by turn id (``Store.list_turns(
    newest_first=True)`` gives the same rows, reversed)."""
    where, params = "", dict[str, Any]()
    if session_id is not None:
        where, params["session_id"] = "WHERE session_id = {session_id:String}", session_id
    sql = f"""SELECT correlation_id, session_id, channel_id, toUnixTimestamp64Micro(timestamp), loop_end_reason, model,
    provider, tool_calls_count, round_count, input_tokens, output_tokens, latency_ms, streaming, error, model_call_count
FROM loopscope_turns FINAL {where}
ORDER BY timestamp DESC, correlation_id"""
    if limit is not None:
        sql += " LIMIT {limit:UInt64}"
        params["limit"] = int(limit)
    return [tuple(row) for row in run(sql, params)]


def tool_stats(run: Run, since_us: int | None = None, until_us: int | None = None) -> list[tuple[Any, ...]]:
    """Per tool, most called first: ``(tool, calls, failures, p50_ms, p95_ms)`` over the calls that
    started in ``[since_us, until_us)`` (Unix microseconds; None: unbounded). ``failures`` are the
    calls not served (the DuckDB ``tool_stats`` view's ``finished - served``); the quantiles are
    continuous, interpolated between the two nearest durations as DuckDB's ``quantile_cont`` and
    ``numpy.percentile`` compute them (``quantilesExactInclusive``). Every row here is an ended call
    (the exporter writes ended spans only), so ``calls`` is the DuckDB view's ``finished``."""
    clauses: list[str] = []
    params: dict[str, Any] = {}
    if since_us is not None:
        clauses.append("started_at >= fromUnixTimestamp64Micro({since_us:Int64}, 'UTC')")
        params["since_us"] = int(since_us)
    if until_us is not None:
        clauses.append("started_at < fromUnixTimestamp64Micro({until_us:Int64}, 'UTC')")
        params["until_us"] = int(until_us)
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    sql = f"""SELECT tool, count() AS calls, countIf(outcome != 'served') AS failures,
    quantilesExactInclusive(0.5, 0.95)(duration_ms) AS q
FROM loopscope_tool_durations FINAL {where}
GROUP BY tool
ORDER BY calls DESC, tool
SETTINGS do_not_merge_across_partitions_select_final = 1"""
    return [(r[0], int(r[1]), int(r[2]), float(r[3][0]), float(r[3][1])) for r in run(sql, params)]


def sessions(run: Run, limit: int | None = 50) -> list[tuple[Any, ...]]:
    """Sessions, most recently active first: ``(session_id, event_count, turn_count, first_us,
    last_us, agents)`` (``Store.list_sessions``'s fields; agents sorted).

    The sessions are picked and ordered by ``loopscope_sessions`` (min / max of their spans' times,
    one row per session once merged), then only those sessions' rows are counted, each a range of
    the events' and turns' sort keys, by their distinct ids (a copy not merged away yet counts once,
    at a quarter of ``FINAL``'s cost). ``first_us`` / ``last_us`` are the first and last timeline
    rows' times, as the DuckDB store keeps them; the order is by the last span's end, which is the
    last turn's end rather than its last timeline row (two sessions active at the same moment may
    list in another order than the DuckDB store's)."""
    sql = """SELECT session_id, arraySort(groupUniqArrayArray(agents)) AS agents
FROM loopscope_sessions GROUP BY session_id
ORDER BY max(last_at) DESC, session_id"""
    params: dict[str, Any] = {}
    if limit is not None:
        sql += " LIMIT {limit:UInt64}"
        params["limit"] = int(limit)
    picked = [(str(r[0]), [str(x) for x in r[1]]) for r in run(sql, params)]
    if not picked:
        return []
    # the ids as one JSON text: a String binds the same on every client (an Array's text form does not)
    ids = {"ids": json.dumps([session for session, _ in picked])}
    events = {str(r[0]): (int(r[1]), int(r[2]), int(r[3])) for r in run(
        "SELECT session_id, uniqExact(id), toUnixTimestamp64Micro(min(created_at)), toUnixTimestamp64Micro(max(created_at)) "
        "FROM loopscope_events WHERE session_id IN (SELECT arrayJoin(JSONExtract({ids:String}, 'Array(String)'))) "
        "GROUP BY session_id", ids)}
    turns = {str(r[0]): int(r[1]) for r in run(
        "SELECT session_id, uniqExact(correlation_id, span_id) FROM loopscope_turns "
        "WHERE session_id IN (SELECT arrayJoin(JSONExtract({ids:String}, 'Array(String)'))) "
        "GROUP BY session_id", ids)}
    out = []
    for session, agents in picked:
        count, first, last = events.get(session, (0, None, None))
        out.append((session, count, turns.get(session, 0), first, last, agents))
    return out
