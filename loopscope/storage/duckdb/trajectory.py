"""A run's trajectory on a DuckDB file (``Reader.trajectory``, ``loopscope diff``): the session
or turn a reference names, and its steps, read from the views ``model_call_summaries``,
``tool_calls`` and ``turn_summaries`` and put in the order they happened by
:func:`loopscope.storage.trajectories.assemble`."""

from __future__ import annotations

from datetime import datetime, timezone

from ..results import Trajectory, TrajectoryLookup, TrajectoryStep
from ..trajectories import MAX_CANDIDATES, answer_of, assemble, parsed
from .engine import duckdb
from .schema import check_readable, has_model_calls

_IS_SESSION = "SELECT 1 FROM sessions WHERE session_id = ? UNION ALL SELECT 1 FROM turns WHERE session_id = ? LIMIT 1"
_TURN_SESSION = """
SELECT session_id FROM turns WHERE correlation_id = ?
UNION ALL SELECT session_id FROM events WHERE correlation_id = ?
LIMIT 1
"""
_PREFIXED = """
SELECT DISTINCT kind, id FROM (
    SELECT 'session' AS kind, session_id AS id FROM sessions WHERE starts_with(session_id, ?)
    UNION ALL SELECT 'turn', correlation_id FROM turns WHERE starts_with(correlation_id, ?)
    UNION ALL SELECT 'turn', correlation_id FROM events
        WHERE correlation_id IS NOT NULL AND starts_with(correlation_id, ?)
)
ORDER BY kind, id
LIMIT 7
"""

# times as UTC wall time, made aware in Python (no zoneinfo: see reads._NAIVE_COLUMNS)
_MODEL_CALLS = """
SELECT turn_id, model, outcome, output_messages, timezone('UTC', started_at), duration_ms, input_tokens,
    output_tokens, cost_usd, coalesce(error, refusal)
FROM model_call_summaries
WHERE session_id = ? AND (? IS NULL OR turn_id = ?)
ORDER BY started_at, position
"""
_TOOL_CALLS = """
SELECT turn_id, tool, call_id, arguments, result, coalesce(outcome, status), error, timezone('UTC', started_at),
    duration_ms
FROM tool_calls
WHERE session_id = ? AND (? IS NULL OR turn_id = ?)
ORDER BY started_at, start_index
"""
# a turn's answer: its last text segment (the text after its last tool call), else its whole text
_TURNS = """
SELECT s.turn_id, s.loop_end_reason, coalesce(nullif(CAST(t.segments AS JSON)->>'$[#-1]', ''), s.response_content),
    s.error, timezone('UTC', s.started_at), timezone('UTC', s.ended_at), s.latency_ms, s.input_tokens, s.output_tokens,
    s.cost_usd
FROM turn_summaries s JOIN turns t ON t.correlation_id = s.turn_id AND t.session_id IS NOT DISTINCT FROM s.session_id
WHERE s.session_id = ? AND (? IS NULL OR s.turn_id = ?)
ORDER BY s.started_at, s.turn_id
"""


def lookup(con: duckdb.DuckDBPyConnection, ref: str) -> TrajectoryLookup:
    """The trajectory ``ref`` names: a session id, a turn's correlation id, else a unique
    prefix of either; else the ids the prefix matched (none, or several)."""
    check_readable(con)
    if con.execute(_IS_SESSION, [ref, ref]).fetchone() is not None:
        return TrajectoryLookup(read(con, "session", ref, ref))
    row = con.execute(_TURN_SESSION, [ref, ref]).fetchone()
    if row is not None and row[0] is not None:
        return TrajectoryLookup(read(con, "turn", ref, str(row[0])))
    found = con.execute(_PREFIXED, [ref, ref, ref]).fetchall()
    if len(found) == 1:
        ident = found[0][1]
        return lookup(con, str(ident)) if ident != ref else TrajectoryLookup(None)
    return TrajectoryLookup(None, tuple(str(r[1]) for r in found[:MAX_CANDIDATES]))


def read(con: duckdb.DuckDBPyConnection, kind: str, ident: str, session_id: str) -> Trajectory:
    """The steps of session ``session_id`` (``kind`` ``session``) or of its turn ``ident``."""
    turn = ident if kind == "turn" else None
    params = [session_id, turn, turn]
    calls: list[TrajectoryStep] = []
    if has_model_calls(con):
        for r in con.execute(_MODEL_CALLS, params).fetchall():
            text, requested = answer_of(r[3])
            calls.append(TrajectoryStep(
                kind="model_call", turn_id=r[0], name=r[1], result=text, status=r[2], error=r[9], requested=requested,
                started_at=_aware(r[4]), duration_ms=r[5], input_tokens=r[6], output_tokens=r[7], cost_usd=r[8],
            ))
    tools = [TrajectoryStep(
        kind="tool_call", turn_id=r[0], name=r[1], call_id=r[2] or None, arguments=parsed(r[3]),
        result=parsed(r[4]), status=r[5], error=r[6], started_at=_aware(r[7]), duration_ms=r[8],
    ) for r in con.execute(_TOOL_CALLS, params).fetchall()]
    ends = [(_aware(r[4]), TrajectoryStep(
        kind="end", turn_id=r[0], result=r[2] or None, status=r[1], error=r[3], started_at=_aware(r[5]),
        duration_ms=r[6], input_tokens=r[7], output_tokens=r[8], cost_usd=r[9],
    )) for r in con.execute(_TURNS, params).fetchall()]
    return assemble(kind, ident, session_id, calls, tools, ends)


def _aware(value: datetime | None) -> datetime | None:
    return value.replace(tzinfo=timezone.utc) if value is not None and value.tzinfo is None else value


__all__ = ["lookup", "read"]
