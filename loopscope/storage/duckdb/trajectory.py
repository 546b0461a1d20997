"""A run's trajectory on a DuckDB file (``Reader.trajectory``, ``loopscope diff``): the session
or turn a reference names, and its steps in the order they happened, read from the views
``model_call_summaries``, ``tool_calls`` and ``turn_summaries``.

Within a turn the steps are ordered by start time (a tool call starts after the model call
that asked for it; calls that started together keep the model call first, then the store's
order); a turn that has ended closes with its ``end`` step; a session's turns follow each
other by their first step (a turn still running has no end step yet)."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from ..results import Trajectory, TrajectoryLookup, TrajectoryStep
from .engine import duckdb
from .schema import check_readable, has_model_calls

_MAX_CANDIDATES = 6

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
    return TrajectoryLookup(None, tuple(str(r[1]) for r in found[:_MAX_CANDIDATES]))


def read(con: duckdb.DuckDBPyConnection, kind: str, ident: str, session_id: str) -> Trajectory:
    """The steps of session ``session_id`` (``kind`` ``session``) or of its turn ``ident``."""
    turn = ident if kind == "turn" else None
    params = [session_id, turn, turn]
    steps: list[tuple[datetime | None, int, int, TrajectoryStep]] = []
    if has_model_calls(con):
        for n, r in enumerate(con.execute(_MODEL_CALLS, params).fetchall()):
            text, requested = _answer(r[3])
            steps.append((_aware(r[4]), 0, n, TrajectoryStep(
                kind="model_call", turn_id=r[0], name=r[1], result=text, status=r[2], error=r[9], requested=requested,
                started_at=_aware(r[4]), duration_ms=r[5], input_tokens=r[6], output_tokens=r[7], cost_usd=r[8],
            )))
    for n, r in enumerate(con.execute(_TOOL_CALLS, params).fetchall()):
        steps.append((_aware(r[7]), 1, n, TrajectoryStep(
            kind="tool_call", turn_id=r[0], name=r[1], call_id=r[2] or None, arguments=_parsed(r[3]),
            result=_parsed(r[4]), status=r[5], error=r[6], started_at=_aware(r[7]), duration_ms=r[8],
        )))
    ends: dict[str | None, TrajectoryStep] = {}
    first: dict[str | None, datetime | None] = {}
    for r in con.execute(_TURNS, params).fetchall():
        ends[r[0]] = TrajectoryStep(
            kind="end", turn_id=r[0], result=r[2] or None, status=r[1], error=r[3], started_at=_aware(r[5]),
            duration_ms=r[6], input_tokens=r[7], output_tokens=r[8], cost_usd=r[9],
        )
        first[r[0]] = _aware(r[4])
    by_turn: dict[str | None, list[tuple[datetime | None, int, int, TrajectoryStep]]] = {}
    for item in steps:
        by_turn.setdefault(item[3].turn_id, []).append(item)
    for turn_id, items in by_turn.items():
        start = min((t for t, *_ in items if t is not None), default=None)
        known = first.get(turn_id)
        first[turn_id] = start if known is None or (start is not None and start < known) else known
    floor = datetime.min.replace(tzinfo=timezone.utc)
    order = sorted(first, key=lambda t: (first[t] or floor, t or ""))
    out: list[TrajectoryStep] = []
    for turn_id in order:
        items = sorted(by_turn.get(turn_id, []), key=lambda i: (i[0] or floor, i[1], i[2]))
        out.extend(i[3] for i in items)
        if turn_id in ends:
            out.append(ends[turn_id])
    return Trajectory(kind=kind, id=ident, session_id=session_id, turn_ids=tuple(t for t in order if t), steps=tuple(out))


def _answer(messages: Any) -> tuple[str | None, tuple[str, ...]]:
    """A model call's answered text and the tools it asked for, from its ``output_messages``
    (the GenAI conventions' parts); none where content was not kept."""
    parsed = _parsed(messages)
    texts: list[str] = []
    tools: list[str] = []
    for message in parsed if isinstance(parsed, list) else []:
        for part in message.get("parts") or [] if isinstance(message, dict) else []:
            if not isinstance(part, dict):
                continue
            if part.get("type") == "text" and isinstance(part.get("content"), str):
                texts.append(part["content"])
            elif part.get("type") == "tool_call" and part.get("name"):
                tools.append(str(part["name"]))
    return ("\n".join(texts) if texts else None), tuple(tools)


def _parsed(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def _aware(value: datetime | None) -> datetime | None:
    return value.replace(tzinfo=timezone.utc) if value is not None and value.tzinfo is None else value


__all__ = ["lookup", "read"]
