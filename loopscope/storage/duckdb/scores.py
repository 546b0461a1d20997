"""Scores on a DuckDB file: what ``loopscope score TARGET`` names, a session's scores for its
timeline page, and the dashboard's Scores page (scores by agent, model and tool over time).

All of it reads the ``score_targets`` view (``views.py``) of a file that has ``scores``
(``m018_scores``); a file from before it has no scores, and each answer says so by being empty.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import duckdb

from ..errors import StoreError
from ..pages import json_safe
from ..pages import now_ms as _now_ms
from ..pages import since as _since
from ..results import ScoreTarget
from .schema import _has_tables

MAX_SCORES = 200
"""The most recent scores a Scores page lists (its sums count every score in range)."""


def has_scores(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the open file has the ``scores`` table (and its views) of ``m018_scores``."""
    return _has_tables(con, "scores")


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    cursor = con.execute(sql, list(params))
    names = [d[0] for d in cursor.description]
    return [{k: json_safe(v) if isinstance(v, float) else v for k, v in zip(names, row, strict=True)} for row in cursor.fetchall()]


# what ``loopscope score TARGET`` may name: exact ids first, then a turn's id by a unique prefix
_TARGETS = """
SELECT 'turn' AS kind, session_id, correlation_id AS turn_id, channel_id AS agent, trace_id, span_id,
       NULL AS response_id, NULL AS tool_call_id
FROM turns WHERE correlation_id = $ref OR span_id = $ref
UNION ALL
SELECT 'call', session_id, correlation_id, agent, trace_id, span_id, response_id, NULL
FROM model_calls WHERE response_id = $ref OR span_id = $ref
UNION ALL
SELECT 'tool', session_id, correlation_id, source_channel_id, trace_id, span_id, NULL, tool_call_id
FROM events WHERE type = 'tool_call_end' AND (tool_call_id = $ref OR span_id = $ref)
"""
_TURN_PREFIX = """
SELECT 'turn' AS kind, session_id, correlation_id, channel_id, trace_id, span_id, NULL, NULL
FROM turns WHERE starts_with(correlation_id, $ref)
"""


def score_target(con: duckdb.DuckDBPyConnection, ref: str) -> ScoreTarget | None:
    """The turn, model call or tool call ``ref`` names: a turn's correlation id (or a unique
    prefix of it), a response id, a tool call id, or a span id; None when nothing has it. An
    id more than one thing has is a :class:`StoreError` that says how to tell them apart."""
    found = {tuple(r) for r in con.execute(_TARGETS, {"ref": ref}).fetchall()}
    if not found and len(ref) >= 4:
        found = {tuple(r) for r in con.execute(_TURN_PREFIX, {"ref": ref}).fetchall()}
    if not found:
        return None
    if len(found) > 1:
        kinds = ", ".join(sorted({f"a {r[0]} of session {r[1]}" for r in found}))
        raise StoreError(f"{ref!r} names {len(found)} things ({kinds}): give a span id, or the turn's full correlation id")
    (row,) = found
    return ScoreTarget(*row)


_TURN_SCORES = """
SELECT id, epoch_ms(created_at) AS t, name, value, label, explanation, source, target, turn_id, tool, tool_call_id,
       call_position, response_id
FROM score_targets WHERE session_id = ? AND list_contains(?, turn_id)
ORDER BY created_at, id
"""


def turn_scores(con: duckdb.DuckDBPyConnection, session_id: str, turn_ids: Sequence[str]) -> list[dict[str, Any]]:
    """The scores of these turns of a session, and of their model calls and tool calls
    (``target``: turn, call, tool), oldest first: what a timeline page shows on each turn."""
    if not turn_ids or not has_scores(con):
        return []
    return _rows(con, _TURN_SCORES, [session_id, list(turn_ids)])


def page(con: duckdb.DuckDBPyConnection, range_: str | None = "all") -> dict[str, Any]:
    """The Scores page: per score name, and per name by agent, by model and by tool (count,
    mean value, each label's count), per day, and the most recent scores with what they score."""
    since = _since(range_)
    where, params = ("WHERE created_at >= to_timestamp(?)", [since]) if since is not None else ("", [])
    answer: dict[str, Any] = {"range": range_ or "all", "generated_at": _now_ms()}
    if not has_scores(con):
        return {**answer, "names": [], "by_agent": [], "by_model": [], "by_tool": [], "over_time": [], "recent": []}

    def summed(by: str) -> list[dict[str, Any]]:
        grouped = f", coalesce({by}, '') AS {by}" if by else ""
        return _rows(con, f"""
            SELECT name{grouped}, count(*) AS scores, avg(value) AS mean_value,
                   CAST(to_json(histogram(label) FILTER (WHERE label IS NOT NULL)) AS VARCHAR) AS labels
            FROM score_targets {where} GROUP BY ALL ORDER BY name{", 2" if by else ""}""", params)

    def labelled(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        import json

        for row in rows:
            row["labels"] = json.loads(row["labels"]) if row["labels"] else {}
        return rows

    answer["names"] = labelled(summed(""))
    answer["by_agent"] = labelled(summed("agent"))
    answer["by_model"] = labelled(summed("model"))
    answer["by_tool"] = [r for r in labelled(summed("tool")) if r["tool"]]
    answer["over_time"] = _rows(con, f"""
        SELECT epoch_ms(date_trunc('day', created_at)) AS day, name, count(*) AS scores, avg(value) AS mean_value
        FROM score_targets {where} GROUP BY ALL ORDER BY 1, 2""", params)
    answer["recent"] = _rows(con, f"""
        SELECT id, epoch_ms(created_at) AS t, name, value, label, explanation, source, target, session_id, turn_id,
               agent, model, tool, tool_call_id, call_position, found
        FROM score_targets {where} ORDER BY created_at DESC, id LIMIT {MAX_SCORES}""", params)
    return answer


__all__ = ["MAX_SCORES", "has_scores", "page", "score_target", "turn_scores"]
