"""Content search, the store-wide tool call list and the filters built on them, as ClickHouse SQL
over loopscope's derived tables (issue 35): what :meth:`~.reader.ClickHouseReader.search`,
:meth:`~.reader.ClickHouseReader.tool_calls` and a turn, call, session or timeline ``--search``
read.

The same scan as the DuckDB store's (``storage/duckdb/search.py``): a case-insensitive
``positionCaseInsensitiveUTF8`` over each row's text (messages, tool names, arguments, results
and errors of the events; the model calls' output messages and errors), no index. The needle is
bound as a parameter (``{needle:String}``), never spliced. A value too large for a DuckDB row is
cut into parts there; here a row holds it whole, so it is found in place."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..matching import needle_of, snippet
from ..results import SearchHit, ToolCallRow
from .tables import (
    CALLS,
    EVENT_TEXT,
    IN_IDS,
    MANY_ROWS,
    MATCH,
    TOOL_CALLS,
    at,
    ids_param,
    json_of,
    us_of,
    where_of,
)

if TYPE_CHECKING:
    from .reader import ClickHouseReader

CALL_TEXT = ("concatWithSeparator(char(31), coalesce(output_messages, ''), coalesce(error_type, ''), coalesce(error, ''), "
             "coalesce(refusal, ''))")
"""A model call's searchable text: what it generated, its error and refusal (not its input
messages, which repeat the turn's events and may hold blocked input)."""

TOOL_CALL_TEXT = "concatWithSeparator(char(31), tool, arguments, result, coalesce(error, ''))"
"""A tool call's searchable text (``loopscope_tool_calls``)."""

TOOL_NOT_SERVED = "coalesce(nullIf(outcome, ''), if(status = 'completed', 'served', NULL), 'failed') != 'served'"
"""A tool call that ended other than served (``loopscope_tool_calls``: every call there has ended)."""


def event_match() -> str:
    """The events (not blocked) whose text holds the needle."""
    return MATCH.format(text=EVENT_TEXT)


def matches_sql() -> str:
    """``(session_id, turn_id)`` of every event and model call whose text holds the needle
    (bound as ``needle``: :func:`~loopscope.storage.matching.needle_of`'s)."""
    return (f"SELECT session_id, coalesce(correlation_id, '') AS turn_id FROM loopscope_events "
            f"WHERE status != 'blocked' AND {event_match()} UNION DISTINCT "
            f"SELECT session_id, coalesce(correlation_id, '') AS turn_id FROM loopscope_model_calls "
            f"WHERE {MATCH.format(text=CALL_TEXT)}")


# an event's fields, in the order a hit names the first that holds the needle; a tool call's end
# repeats its name and arguments, which its start names: the end is a hit by its result or error
_EVENT_FIELDS = ("text", "tool", "arguments", "result", "error")
_EVENT_HITS = f"""SELECT id, session_id, correlation_id, idx, type, toUnixTimestamp64Micro(created_at),
    nullIf(JSONExtractString(content, 'tool_name'), ''), JSONExtractString(content, 'body'),
    JSONExtractString(content, 'tool_name'), JSONExtractRaw(content, 'arguments'), JSONExtractRaw(content, 'result'),
    JSONExtractString(content, 'error')
FROM (ROWS) WHERE status != 'blocked' AND {event_match()}
ORDER BY created_at DESC, idx DESC LIMIT {{limit:UInt64}}"""

_CALL_HITS = """SELECT session_id, correlation_id, toUnixTimestamp64Micro(started_at),
    if(positionCaseInsensitiveUTF8(coalesce(output_messages, ''), {{needle:String}}) > 0, 'output', 'error') AS field,
    if(field = 'output', output_messages,
       concatWithSeparator(' ', coalesce(error_type, ''), coalesce(error, ''), coalesce(refusal, ''))) AS text
FROM {calls} ORDER BY started_at DESC, span_id LIMIT {{limit:UInt64}}"""


def hits(reader: ClickHouseReader, text: str, session_id: str | None = None, limit: int = 50) -> list[SearchHit]:
    """Where ``text`` (any case) is found: events and model calls, newest first, at most ``limit``
    (the DuckDB store's rules: a model call is a hit only for a turn none of whose events is)."""
    needle = needle_of(text)
    params: dict[str, Any] = {"needle": needle, "limit": int(limit)}
    in_session = ""
    if session_id is not None:
        in_session, params["session_id"] = " AND session_id = {session_id:String}", session_id
    # the sessions of the newest ``limit`` matches only are numbered (as recent_events picks them)
    picked = (f"(SELECT DISTINCT session_id FROM (SELECT session_id FROM loopscope_events WHERE status != 'blocked' AND "
              f"{event_match()}{in_session} ORDER BY created_at DESC, session_id DESC, at DESC, seq DESC, id DESC "
              "LIMIT {limit:UInt64}))")
    found: list[SearchHit] = []
    for row in reader.rows(_EVENT_HITS.replace("ROWS", MANY_ROWS.format(sessions=picked), 1), params):
        event_id, session, turn, index, kind, created_us, tool, *fields = row
        field = next((name for name, value in zip(_EVENT_FIELDS, fields) if value and needle in value.lower()
                      and not (name in ("tool", "arguments") and kind == "tool_call_end")), None)
        if field is None:
            continue  # a tool call's end that matched by its name or arguments only: its start is the hit
        value = fields[_EVENT_FIELDS.index(field)]
        found.append(SearchHit(session, turn, kind, int(index), event_id, tool, field, snippet(value, needle), at(created_us)))
    turns_found = {(h.session_id, h.turn_id) for h in found}
    calls = CALLS.format(where=where_of([MATCH.format(text=CALL_TEXT) + in_session]))
    for session, turn, started_us, field, value in reader.rows(_CALL_HITS.format(calls=calls), params):
        if (session, turn) in turns_found:
            continue
        turns_found.add((session, turn))
        found.append(SearchHit(session, turn, "model_call", None, None, None, field, snippet(value or "", needle),
                               at(started_us)))
    found.sort(key=lambda h: (h.at.timestamp() if h.at else 0.0, h.index or 0), reverse=True)
    return found[:limit]


_TOOL_CALL_SELECT = """session_id, turn_id, agent, tool, call_id, outcome, status, toUnixTimestamp64Micro(started_at),
    toUnixTimestamp64Micro(ended_at), duration_ms, arguments, result, error, span_id"""
_TOOL_INDICES = f"""SELECT session_id, span_id, type, idx FROM ({MANY_ROWS.format(sessions=IN_IDS % 'sessions')})
WHERE type IN ('tool_call_start', 'tool_call_end') AND span_id IN {IN_IDS % 'spans'}"""


def tool_calls(
    reader: ClickHouseReader, session_id: str | None = None, *, tool: str | None = None, failed: bool = False,
    slowest: bool = False, since: datetime | None = None, text: str | None = None, limit: int | None = 50,
) -> list[ToolCallRow]:
    """Tool calls, newest first (``slowest``: longest first), with their start and end rows'
    indices in the session's timeline (numbered for the sessions of the calls picked only)."""
    if limit is not None and limit < 0:
        raise ValueError("limit must not be negative")
    clauses: list[str] = []
    params: dict[str, Any] = {}
    for column, value in (("session_id", session_id), ("tool", tool)):
        if value is not None:
            clauses.append(f"{column} = {{{column}:String}}")
            params[column] = value
    if failed:
        clauses.append(TOOL_NOT_SERVED)
    if since is not None:
        clauses.append("started_at >= fromUnixTimestamp64Micro({since:Int64}, 'UTC')")
        params["since"] = us_of(since)
    if text:
        clauses.append(MATCH.format(text=TOOL_CALL_TEXT))
        params["needle"] = needle_of(text)
    order = "duration_ms DESC, started_at DESC, call_id" if slowest else "started_at DESC, span_id DESC"
    sql = f"SELECT {_TOOL_CALL_SELECT} FROM {TOOL_CALLS.format(where=where_of(clauses))} ORDER BY {order}"
    if limit is not None:
        sql += " LIMIT {limit:UInt64}"
        params["limit"] = int(limit)
    rows = reader.rows(sql, params)
    indices: dict[tuple[str, str, str], int] = {}
    if rows:
        indices = {(str(r[0]), str(r[1]), str(r[2])): int(r[3]) for r in reader.rows(_TOOL_INDICES, {
            "sessions": ids_param(sorted({r[0] for r in rows})), "spans": ids_param([r[13] for r in rows])})}
    return [ToolCallRow(
        session_id=r[0], turn_id=r[1], agent=r[2], tool=r[3], call_id=r[4], outcome=r[5] or None, status=r[6],
        started_at=at(r[7]), ended_at=at(r[8]), duration_ms=r[9], arguments=json_of(r[10]), result=json_of(r[11]),
        error=r[12], start_index=indices.get((r[0], r[13], "tool_call_start")),
        end_index=indices.get((r[0], r[13], "tool_call_end")),
    ) for r in rows]


__all__ = ["CALL_TEXT", "TOOL_CALL_TEXT", "TOOL_NOT_SERVED",
           "event_match", "hits", "matches_sql", "tool_calls"]
