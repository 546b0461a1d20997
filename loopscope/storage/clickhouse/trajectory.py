"""A run's trajectory on ClickHouse (``Reader.trajectory``, ``loopscope diff``): the session or
turn a reference names, and its model calls, tool calls and turn ends read from
``loopscope_model_calls``, ``loopscope_tool_calls`` and ``loopscope_turns`` (a resent copy left
out), put in order by :func:`loopscope.storage.trajectories.assemble` as on a DuckDB file. No
cost: ``cost_usd`` is None on every step (docs/clickhouse.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..results import Trajectory, TrajectoryLookup, TrajectoryStep
from ..trajectories import MAX_CANDIDATES, answer_of, assemble, parsed
from .tables import CALLS, TOOL_CALLS, TURNS, at

if TYPE_CHECKING:
    from .reader import ClickHouseReader

_IS_SESSION = ("SELECT 1 FROM loopscope_sessions WHERE session_id = {ref:String} "
               "UNION ALL SELECT 1 FROM loopscope_turns WHERE session_id = {ref:String} LIMIT 1")
_TURN_SESSION = ("SELECT session_id FROM loopscope_turns WHERE correlation_id = {ref:String} "
                 "UNION ALL SELECT session_id FROM loopscope_events WHERE correlation_id = {ref:String} LIMIT 1")
_PREFIXED = """SELECT DISTINCT kind, id FROM (
    SELECT 'session' AS kind, session_id AS id FROM loopscope_sessions WHERE startsWith(session_id, {ref:String})
    UNION ALL SELECT 'turn', correlation_id FROM loopscope_turns WHERE startsWith(correlation_id, {ref:String})
    UNION ALL SELECT 'turn', assumeNotNull(correlation_id) FROM loopscope_events
        WHERE correlation_id IS NOT NULL AND startsWith(correlation_id, {ref:String}))
ORDER BY kind, id LIMIT 7"""

_WHERE = "WHERE session_id = {session_id:String}"
_CALL_STEPS = """SELECT correlation_id, coalesce(response_model, request_model), outcome, output_messages,
    toUnixTimestamp64Micro(started_at), duration_ms, input_tokens, output_tokens, coalesce(error, refusal)
FROM {calls} ORDER BY started_at, coalesce(position, 0), span_id"""
_TOOL_STEPS = """SELECT turn_id, tool, call_id, arguments, result, coalesce(nullIf(outcome, ''), status), error,
    toUnixTimestamp64Micro(started_at), duration_ms FROM {tools} ORDER BY started_at, span_id"""
# a turn's answer: its last text segment (the text after its last tool call), else its whole text; its
# start as the DuckDB view has it (its end less its latency)
_TURN_ENDS = """SELECT correlation_id, loop_end_reason,
    if(JSONExtractString(segments, -1) != '', JSONExtractString(segments, -1), response_content), error,
    toUnixTimestamp64Micro(timestamp) - toInt64(round(latency_ms * 1000)), toUnixTimestamp64Micro(timestamp),
    latency_ms, input_tokens, output_tokens
FROM {turns} ORDER BY timestamp - toIntervalMicrosecond(toInt64(round(latency_ms * 1000))), correlation_id"""


def lookup(reader: ClickHouseReader, ref: str) -> TrajectoryLookup:
    """The trajectory ``ref`` names: a session id, a turn's correlation id, else a unique prefix of
    either; else the ids the prefix matched (none, or several)."""
    params = {"ref": ref}
    if reader.rows(_IS_SESSION, params):
        return TrajectoryLookup(read(reader, "session", ref, ref))
    found = reader.rows(_TURN_SESSION, params)
    if found and found[0][0] is not None:
        return TrajectoryLookup(read(reader, "turn", ref, str(found[0][0])))
    prefixed = reader.rows(_PREFIXED, params)
    if len(prefixed) == 1:
        ident = str(prefixed[0][1])
        return lookup(reader, ident) if ident != ref else TrajectoryLookup(None)
    return TrajectoryLookup(None, tuple(str(r[1]) for r in prefixed[:MAX_CANDIDATES]))


def read(reader: ClickHouseReader, kind: str, ident: str, session_id: str) -> Trajectory:
    """The steps of session ``session_id`` (``kind`` ``session``) or of its turn ``ident``."""
    params: dict[str, Any] = {"session_id": session_id}
    turn_where = ""
    if kind == "turn":
        params["turn"] = ident
        turn_where = " AND {column} = {{turn:String}}"
    calls = []
    for r in reader.rows(_CALL_STEPS.format(calls=CALLS.format(where=_WHERE + turn_where.format(column="correlation_id"))),
                         params):
        text, requested = answer_of(r[3])
        calls.append(TrajectoryStep(
            kind="model_call", turn_id=r[0], name=r[1], result=text, status=r[2], error=r[8], requested=requested,
            started_at=at(r[4]), duration_ms=r[5], input_tokens=r[6], output_tokens=r[7], cost_usd=None,
        ))
    tools = [TrajectoryStep(
        kind="tool_call", turn_id=r[0], name=r[1], call_id=r[2] or None, arguments=parsed(r[3] or None),
        result=parsed(r[4] or None), status=r[5], error=r[6], started_at=at(r[7]), duration_ms=r[8],
    ) for r in reader.rows(_TOOL_STEPS.format(tools=TOOL_CALLS.format(where=_WHERE + turn_where.format(column="turn_id"))),
                           params)]
    ends = [(at(r[4]), TrajectoryStep(
        kind="end", turn_id=r[0], result=r[2] or None, status=r[1], error=r[3], started_at=at(r[5]), duration_ms=r[6],
        input_tokens=r[7], output_tokens=r[8], cost_usd=None,
    )) for r in reader.rows(_TURN_ENDS.format(turns=TURNS.format(where=_WHERE + turn_where.format(column="correlation_id"))),
                            params)]
    return assemble(kind, ident, session_id, calls, tools, ends)


__all__ = ["lookup", "read"]
