"""Content search and the store-wide tool call list on a DuckDB file (issue 35): the SQL
behind :meth:`~loopscope.storage.queries.Reader.search`, the content part of a session or
turn search, and :meth:`~loopscope.storage.queries.Reader.tool_calls`.

The search is a plain case-insensitive scan (``contains(lower(text), needle)``) over the
stored text: messages, tool names, arguments, results and errors of the event log
(:data:`~loopscope.storage.policy.EVENT_TEXT`), the model calls' output messages (what they
generated) and errors (:data:`CALL_TEXT`), and the parts of values too large for a row
(``loopscope_values``; a match across two parts is not found). A model call is a hit only
for a turn none of whose events is (its messages repeat the turn's). No full-text index: the
duckdb wheel has no ``fts`` extension built in, installing one needs the network, and an
index DuckDB's ``fts`` builds is not kept up to date by inserts (it would be rebuilt whole
by the writer after every batch). A read never writes, so it builds none either.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from ..matching import SNIPPET_CHARS, needle_of, snippet
from ..pages import json_or_text
from ..policy import EVENT_TEXT
from ..results import SearchHit, ToolCallRow
from .engine import duckdb
from .schema import has_model_calls

CALL_TEXT = "concat_ws(chr(31), CAST(output_messages AS VARCHAR), error_type, error, refusal)"
"""A model call's searchable text (SQL over ``model_calls`` or ``model_call_summaries``): what
it generated (output messages), its error and refusal. Not its input messages: they repeat
the turn's history, which the events hold (the user's input among them), and may hold input
a guardrail blocked, which the events keep out of reads."""

TOOL_CALL_TEXT = (
    "concat_ws(chr(31), tool, CAST(arguments AS VARCHAR), CAST(result AS VARCHAR), error)"
)
"""A tool call's searchable text (SQL over the ``tool_calls`` view)."""

_PARTS = "loopscope_values"


def has_parts(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the file has the table of large values' parts (``m017_value_parts``)."""
    row = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = ? AND database_name = current_database()", [_PARTS]
    ).fetchone()
    return bool(row and row[0])


def _raw_safe(needle: str) -> bool:
    """Whether ``needle`` reads the same in an event's stored JSON text as in its fields: printable
    ASCII without the characters JSON escapes (a quote, a backslash). Then a row whose fields
    hold it holds it in its raw text too, and the cheap scan of the raw text (one string per
    row, ~5x faster than taking the fields apart) can pick the rows the exact test looks at."""
    return needle.isascii() and needle.isprintable() and '"' not in needle and "\\" not in needle


def event_match(needle: str) -> tuple[str, list[str]]:
    """SQL that keeps the events whose text (:data:`~loopscope.storage.policy.EVENT_TEXT`)
    holds ``needle`` (lower case), and its parameters: the exact test, after a scan of the
    raw JSON text where that finds every such row (:func:`_raw_safe`)."""
    exact = f"contains(lower({EVENT_TEXT}), ?)"
    if _raw_safe(needle):
        return f"contains(lower(CAST(content AS VARCHAR)), ?) AND {exact}", [needle, needle]
    return exact, [needle]


def matches_sql(con: duckdb.DuckDBPyConnection, needle: str) -> tuple[str, list[str]]:
    """SQL selecting ``(session_id, turn_id)`` of every event, model call and large value
    whose text holds ``needle`` (:func:`needle_of`'s), and its parameters."""
    match, params = event_match(needle)
    parts = [f"SELECT session_id, correlation_id AS turn_id FROM events WHERE status <> 'blocked' AND {match}"]
    if has_model_calls(con):
        parts.append(f"SELECT session_id, correlation_id AS turn_id FROM model_calls WHERE contains(lower({CALL_TEXT}), ?)")
        params.append(needle)
    if has_parts(con):
        parts.append(
            f"SELECT session_id, correlation_id AS turn_id FROM events WHERE status <> 'blocked' "
            f"AND id IN (SELECT id FROM {_PARTS} WHERE contains(lower(text), ?))"
        )
        params.append(needle)
    return " UNION ".join(parts), params


def _aware(value: datetime | None) -> datetime | None:
    return value.replace(tzinfo=timezone.utc) if value is not None and value.tzinfo is None else value


# an event's fields, in the order a hit names the first that holds the needle; a tool call's
# end repeats its name and arguments, which its start names: the end is a hit by its result or error
_EVENT_FIELDS = ("text", "tool", "arguments", "result", "error")
_EVENT_HITS = """
SELECT id, session_id, correlation_id, idx, type, timezone('UTC', created_at),
       json_extract_string(content, '$.tool_name'),
       json_extract_string(content, '$.body'), json_extract_string(content, '$.tool_name'),
       CAST(json_extract(content, '$.arguments') AS VARCHAR), CAST(json_extract(content, '$.result') AS VARCHAR),
       json_extract_string(content, '$.error')
FROM events
WHERE status <> 'blocked' AND {match}{session}
ORDER BY created_at DESC, idx DESC
LIMIT ?
"""

# a model call's text can be a long history: the SQL cuts the piece around the match
_CALL_HITS = """
SELECT session_id, correlation_id, timezone('UTC', started_at), field, piece, cut_before, cut_after
FROM (
    SELECT *, substr(t, greatest(1, strpos(lower(t), ?) - {pad}), {width}) AS piece,
           strpos(lower(t), ?) - {pad} > 1 AS cut_before, strpos(lower(t), ?) - {pad} + {width} <= length(t) AS cut_after
    FROM (
        SELECT session_id, correlation_id, started_at, span_id,
               CASE WHEN contains(lower(CAST(output_messages AS VARCHAR)), ?) THEN 'output' ELSE 'error' END AS field,
               CASE field WHEN 'output' THEN CAST(output_messages AS VARCHAR)
                          ELSE concat_ws(' ', error_type, error, refusal) END AS t
        FROM model_calls
        WHERE contains(lower({text}), ?){session}
        ORDER BY started_at DESC, span_id
        LIMIT ?
    )
)
"""

_PART_HITS = """
SELECT e.id, e.session_id, e.correlation_id, e.idx, e.type, timezone('UTC', e.created_at),
       json_extract_string(e.content, '$.tool_name'), p.text
FROM (SELECT id, min_by(text, part) AS text FROM {parts} WHERE contains(lower(text), ?) GROUP BY id) p
JOIN events e ON e.id = p.id
WHERE e.status <> 'blocked'{session}
ORDER BY e.created_at DESC
LIMIT ?
"""


def hits(con: duckdb.DuckDBPyConnection, text: str, session_id: str | None = None, limit: int = 50) -> list[SearchHit]:
    """Where ``text`` (any case) is found: events, model calls and large values, newest
    first, at most ``limit``."""
    needle = needle_of(text)
    session_sql, session_params = (" AND session_id = ?", [session_id]) if session_id is not None else ("", [])
    found: list[SearchHit] = []
    match, match_params = event_match(needle)
    for row in con.execute(
        _EVENT_HITS.format(match=match, session=session_sql), [*match_params, *session_params, limit]
    ).fetchall():
        event_id, session, turn, index, kind, at, tool, *fields = row
        field = next(
            (name for name, value in zip(_EVENT_FIELDS, fields) if value and needle in value.lower()
             and not (name in ("tool", "arguments") and kind == "tool_call_end")),
            None,
        )
        if field is None:
            continue  # a tool call's end that matched by its name or arguments only: its start is the hit
        value = fields[_EVENT_FIELDS.index(field)]
        found.append(SearchHit(session, turn, kind, index, event_id, tool, field, snippet(value, needle), _aware(at)))
    if has_model_calls(con):
        # a model call's messages repeat its turn's events (the history it was sent, the text and
        # calls it answered): a turn whose events matched is found by them; of a turn found only by
        # its model calls (content kept on the calls alone), one call, the newest
        turns_found = {(h.session_id, h.turn_id) for h in found}
        sql = _CALL_HITS.format(pad=SNIPPET_CHARS * 2, width=SNIPPET_CHARS * 4 + len(needle), text=CALL_TEXT, session=session_sql)
        for session, turn, at, field, piece, cut_before, cut_after in con.execute(
            sql, [needle] * 5 + [*session_params, limit]
        ).fetchall():
            if (session, turn) in turns_found:
                continue
            turns_found.add((session, turn))
            text_around = snippet(piece or "", needle, cut_before=bool(cut_before), cut_after=bool(cut_after))
            found.append(SearchHit(session, turn, "model_call", None, None, None, field, text_around, _aware(at)))
    if has_parts(con):
        sql = _PART_HITS.format(parts=_PARTS, session=session_sql.replace("session_id", "e.session_id"))
        seen = {h.event_id for h in found}
        for event_id, session, turn, index, kind, at, tool, part in con.execute(sql, [needle, *session_params, limit]).fetchall():
            if event_id not in seen:
                found.append(SearchHit(session, turn, kind, index, event_id, tool, "content", snippet(part, needle), _aware(at)))
    epoch = datetime.min.replace(tzinfo=timezone.utc)
    found.sort(key=lambda h: (h.at or epoch, h.index or 0), reverse=True)
    return found[:limit]


TOOL_CALL_COLUMNS = (
    "session_id, turn_id, agent, tool, call_id, outcome, status, timezone('UTC', started_at), "
    "timezone('UTC', ended_at), duration_ms, arguments, result, error, start_index, end_index"
)
"""The ``tool_calls`` columns a tool call read selects, in :class:`ToolCallRow`'s order."""

TOOL_NOT_SERVED = (
    "end_index IS NOT NULL AND coalesce(outcome, CASE WHEN status = 'completed' THEN 'served' END, 'failed') <> 'served'"
)
"""A tool call that ended other than served (SQL over the ``tool_calls`` view)."""


def tool_call_sql(
    session_id: str | None = None, *, tool: str | None = None, failed: bool = False, slowest: bool = False,
    since: datetime | None = None, text: str | None = None, limit: int | None = 50,
    sessions: Sequence[str] | None = None,
) -> tuple[str, list[Any]]:
    """The ``tool_calls`` read :meth:`~loopscope.storage.queries.Reader.tool_calls` makes:
    its SQL and parameters (newest first, or longest first with ``slowest``); ``sessions``:
    only these sessions' calls (a filter the view takes to its scan of the tool rows)."""
    if limit is not None and limit < 0:
        raise ValueError("limit must not be negative")
    clauses: list[str] = []
    params: list[Any] = []
    for column, value in (("session_id", session_id), ("tool", tool)):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    if sessions is not None:
        clauses.append("list_contains(?, session_id)")
        params.append(list(sessions))
    if failed:
        clauses.append(TOOL_NOT_SERVED)
    if since is not None:
        clauses.append("coalesce(started_at, ended_at) >= ?")
        params.append(since)
    if text:
        clauses.append(f"contains(lower({TOOL_CALL_TEXT}), ?)")
        params.append(needle_of(text))
    where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
    order = (
        "duration_ms DESC NULLS LAST, started_at DESC, call_id" if slowest
        else "coalesce(started_at, ended_at) DESC, start_index DESC, call_id"
    )
    sql = f"SELECT {TOOL_CALL_COLUMNS} FROM tool_calls {where} ORDER BY {order}"
    if limit is not None:
        sql += f" LIMIT {int(limit)}"
    return sql, params


def ended_calls_sql(
    tool_columns: bool, *, tool: str | None = None, failed: bool = False, slowest: bool = False,
    session_id: str | None = None, since: datetime | None = None, limit: int = 50,
) -> tuple[str, list[Any]]:
    """The keys ``(session_id, turn_id, call_id)`` of the ``limit`` ended tool calls a
    failed or slowest list shows, from the end rows alone (a top-N over one scan of them,
    ms where the ``tool_calls`` view groups every tool row first: 0.7 s at 1 M events); the
    view then reads those calls alone (:func:`tool_call_sql` with ``keys``)."""
    from .views import tool_rows

    clauses = ["type = 'tool_call_end'"]
    params: list[Any] = []
    for column, value in (("session_id", session_id), ("tool", tool)):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    if failed:
        clauses.append("coalesce(outcome, CASE WHEN status = 'completed' THEN 'served' END, 'failed') <> 'served'")
    if since is not None:
        clauses.append("created_at >= ?")
        params.append(since)
    order = "duration_ms DESC NULLS LAST, created_at DESC" if slowest else "created_at DESC, idx DESC"
    sql = (
        f"SELECT session_id, turn_id, call_id FROM ({tool_rows(tool_columns)}) "
        f"WHERE {' AND '.join(clauses)} ORDER BY {order} LIMIT {int(limit)}"
    )
    return sql, params


def tool_call_row(row: Sequence[Any]) -> ToolCallRow:
    """A row of :data:`TOOL_CALL_COLUMNS` as a :class:`ToolCallRow` (JSON parsed, times UTC)."""
    (session, turn, agent, tool, call_id, outcome, status, started, ended, ms, arguments, result, error,
     start_index, end_index) = row
    return ToolCallRow(
        session_id=session, turn_id=turn, agent=agent, tool=tool, call_id=call_id, outcome=outcome, status=status,
        started_at=_aware(started), ended_at=_aware(ended), duration_ms=ms, arguments=json_or_text(arguments),
        result=json_or_text(result), error=error, start_index=start_index, end_index=end_index,
    )


__all__ = [
    "CALL_TEXT", "SNIPPET_CHARS", "TOOL_CALL_COLUMNS", "TOOL_CALL_TEXT", "TOOL_NOT_SERVED", "ended_calls_sql",
    "event_match", "has_parts", "hits", "matches_sql", "needle_of", "snippet", "tool_call_row", "tool_call_sql",
]
