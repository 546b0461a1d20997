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


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[dict[str, Any]]:
    cursor = con.execute(sql, params if isinstance(params, dict) else list(params))
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


# a session's scores: those of its rows (the scores that name it) and those that name no session
# (an id given as text, another instrumentation's), matched against that session's rows alone
_SESSION_SCORES = """
SELECT id, epoch_ms(created_at) AS t, name, value, label, explanation, source, target, turn_id, tool, tool_call_id,
       call_position, response_id
FROM ({targets})
WHERE session_id = $session AND list_contains($turns, turn_id)
ORDER BY created_at, id
"""


def _session_targets() -> str:
    from .views import score_targets

    return score_targets(
        scores="(SELECT * FROM scores WHERE session_id = $session OR session_id IS NULL)",
        turns="(SELECT * FROM turns WHERE session_id = $session)",
        model_calls="(SELECT * FROM model_calls WHERE session_id = $session)",
        events="(SELECT * FROM events WHERE session_id = $session AND type IN ('tool_call_start', 'tool_call_end') "
               "AND created_at BETWEEN $first AND $last)",
    )


def turn_scores(con: duckdb.DuckDBPyConnection, session_id: str, turn_ids: Sequence[str],
                first_at: Any = None, last_at: Any = None) -> list[dict[str, Any]]:
    """The scores of these turns of a session, and of their model calls and tool calls
    (``target``: turn, call, tool), oldest first: what a timeline page shows on each turn.
    ``first_at`` / ``last_at``: the session's first and last event times (its stretch of the
    log, as the page reads it), else the whole log is looked through."""
    if not turn_ids or not has_scores(con):
        return []
    if con.execute("SELECT count(*) FROM scores").fetchall()[0][0] == 0:
        return []  # the common case: a store nobody scored in
    return _rows(con, _SESSION_SCORES.format(targets=_session_targets()), {
        "session": session_id, "turns": list(turn_ids),
        "first": first_at if first_at is not None else _EARLIEST, "last": last_at if last_at is not None else _LATEST,
    })


_EARLIEST, _LATEST = "-infinity", "infinity"


def session_page(con: duckdb.DuckDBPyConnection, session_id: str, turn_ids: Sequence[str]) -> dict[str, Any]:
    """:func:`turn_scores` of a session's turns as the dashboard polls for them (``/api/scores?session=``)."""
    found = con.execute("SELECT first_at, last_at FROM sessions WHERE session_id = ?", [session_id]).fetchall()
    stretch = found[0] if found else (None, None)
    return {"session_id": session_id, "scores": turn_scores(con, session_id, turn_ids, *stretch), "generated_at": _now_ms()}


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


__all__ = ["MAX_SCORES", "has_scores", "page", "score_target", "session_page", "turn_scores"]
