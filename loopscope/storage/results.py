"""What the query API (:mod:`loopscope.storage.queries`) answers, engine-neutral: plain
named tuples and frozen dataclasses of Python values (no engine's types, no pydantic: the
terminal commands print them without importing the public models).

:class:`TurnRow` and :class:`CallRow` carry the fields of the public models
:class:`~loopscope.models.AIResponseEvent` and :class:`~loopscope.models.ModelCall` by the
same names, unvalidated; the queries that answer with the public models themselves say so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

Record = dict[str, Any]
"""One row of an analytics view by column name, in the view's column order (the order
``--json`` prints); the columns each view has are in docs/architecture.md's views."""


class TurnRow(NamedTuple):
    """A ``turns`` row with the fields of :class:`~loopscope.models.AIResponseEvent`, by
    the same names and with the same defaults for NULL, unvalidated: the JSON columns
    parsed, ``loop_end_reason`` the stored text, ``declared_tools`` plain dicts."""

    channel_id: str | None
    session_id: str | None
    correlation_id: str | None
    parent_correlation_id: str | None
    response_content: str
    segments: list[str]
    tool_calls_count: int
    round_count: int
    usage: dict[str, int]
    thinking: str
    loop_end_reason: str | None
    latency_ms: float
    streaming: bool
    timestamp: datetime | None
    declared_tools: list[Any]
    model: str | None
    provider: str | None
    error: str | None
    trace_id: str | None
    span_id: str | None
    model_call_count: int



class CallRow(NamedTuple):
    """A model call with the fields of :class:`~loopscope.models.ModelCall`, by the same
    names and with the same defaults for NULL, unvalidated (the model validates these)."""

    session_id: str
    correlation_id: str | None
    position: int | None
    agent: str | None
    provider: str | None
    framework: str | None
    model: str | None
    request_model: str | None
    response_model: str | None
    response_id: str | None
    finish_reasons: list[str]
    outcome: str | None
    streaming: bool | None
    started_at: datetime | None
    ended_at: datetime | None
    duration_ms: float | None
    time_to_first_chunk_ms: float | None
    usage: dict[str, int]
    provider_usage: Any
    parameters: dict[str, Any]
    cost_usd: float | None
    price_source: str | None
    error_type: str | None
    error: str | None
    refusal: str | None
    input_messages: Any
    output_messages: Any
    trace_id: str | None
    span_id: str | None


# -- search and tool calls (issue 35: content search, store-wide call lists) --------------------


class SearchHit(NamedTuple):
    """One place a content search matched: an event of a session's timeline (a message, a
    tool call's start or end) or a model call, with where in it the text was found
    (``field``: ``text``, ``tool``, ``arguments``, ``result``, ``error``, ``input``,
    ``output``, ``content`` for a value stored in parts) and the text around it."""

    session_id: str
    turn_id: str | None
    kind: str
    """``message``, ``tool_call_start``, ``tool_call_end`` (the event's type), or ``model_call``."""
    index: int | None
    """The event's index in its session's timeline (None for a model call)."""
    event_id: str | None
    tool: str | None
    field: str
    snippet: str
    at: datetime | None


class ToolCallRow(NamedTuple):
    """One tool call (the ``tool_calls`` view's row: its start and end rows together)."""

    session_id: str | None
    turn_id: str | None
    agent: str | None
    tool: str | None
    call_id: str | None
    outcome: str | None
    status: str | None
    started_at: datetime | None
    ended_at: datetime | None
    duration_ms: float | None
    arguments: Any
    result: Any
    error: str | None
    start_index: int | None
    end_index: int | None


TOOL_OUTCOMES = ("served", "failed", "refused", "blocked", "unserved", "cancelled")
"""How a finished tool call went, in the order the analytics count them (``tool_stats``'s columns)."""

LOSS_COUNTERS = ("dropped_queue_full", "dropped_unwritable", "turns_dropped_queue_full", "turns_dropped_unwritable",
                 "failed_writes", "otlp_dropped", "otlp_failed", "refused_requests", "refused_spans")
"""The counters of what a writer lost that a note beside the store may hold (what ``status`` adds up)."""


@dataclass(frozen=True)
class SessionLookup:
    """The session a command is about: ``session_id`` when one was found (the one named,
    the only one a prefix names, or the most recently active when none was asked for);
    else None, with the ids (at most six) the prefix matched (none, or several)."""

    session_id: str | None
    candidates: tuple[str, ...] = ()


@dataclass(frozen=True)
class Stats:
    """What ``loopscope stats`` shows: the store's totals, and the rows of the views it
    sums (``tool_stats``, ``turn_summaries``, ``loop_end_reasons``, ``model_usage``,
    ``cost_totals``)."""

    sessions: int
    turns: int
    events: int
    agents: int
    first_at: datetime | None
    last_at: datetime | None
    costs: Record
    """``cost_totals``: model_calls, cost_usd, unpriced_calls."""
    model_calls: list[Record]
    """``model_usage`` by model: calls, failed, cost_usd, unpriced_calls, avg_ms, p95_ms, avg_ttfc_ms."""
    tool_calls: Record
    """``tool_stats`` summed: calls, pending, finished, each outcome, failure_share, tools."""
    loop_end_reasons: list[Record]
    tokens: Record
    models: list[Record]

    def as_dict(self) -> dict[str, Any]:
        """The fields by name, in this order (what ``loopscope stats --json`` prints)."""
        return {
            "sessions": self.sessions, "turns": self.turns, "events": self.events, "agents": self.agents,
            "first_at": self.first_at, "last_at": self.last_at, "costs": self.costs,
            "model_calls": self.model_calls, "tool_calls": self.tool_calls,
            "loop_end_reasons": self.loop_end_reasons, "tokens": self.tokens, "models": self.models,
        }


@dataclass(frozen=True)
class StoreStatus:
    """What a store holds and what its writers reported (``loopscope status``): the
    counts, each writer's row (its counters of what it wrote, dropped and failed to
    write), and what the writers counted beside the store when they could not write it."""

    path: str
    size_bytes: int
    schema_version: int
    sessions: int
    events: int
    turns: int
    tool_calls: int
    model_calls: int
    last_event_at: datetime | None
    writers: list[Record]
    """One row per writer, by column name (the writers' table of the store)."""
    unserved_cut: int
    """Tool calls ended unserved because more stitched turns waited than are kept open."""
    beside: dict[str, Record] = field(default_factory=dict)
    """What writers counted outside the store (the file beside it), by writer id."""


class ScoreTarget(NamedTuple):
    """What ``loopscope score TARGET`` names in the store: a turn, a model call or a tool call
    (``kind``), with its ids as stored (hex span ids)."""

    kind: str  # turn, call, tool
    session_id: str | None
    turn_id: str | None
    agent: str | None
    trace_id: str | None
    span_id: str | None
    response_id: str | None
    tool_call_id: str | None


# -- trajectories (``loopscope diff``: one run's steps in order) ------------------------------

STEP_KINDS = ("model_call", "tool_call", "end")
"""What a trajectory step is: a model call, a tool call, or the end of a turn (its loop end reason)."""


@dataclass(frozen=True)
class TrajectoryStep:
    """One step of a run, in the order it happened: a model call (``name``: its model;
    ``result``: the text it answered; ``requested``: the tools it asked for; ``status``: its
    outcome), a tool call (``name``: the tool; ``arguments`` and ``result`` as recorded,
    JSON parsed; ``status``: its outcome, ``served`` ... or ``pending``), or a turn's end
    (``status``: the loop end reason; ``result``: the turn's answer; its duration, tokens and
    cost the turn's own totals)."""

    kind: str
    turn_id: str | None
    name: str | None = None
    call_id: str | None = None
    arguments: Any = None
    result: Any = None
    status: str | None = None
    error: str | None = None
    requested: tuple[str, ...] = ()
    started_at: datetime | None = None
    duration_ms: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None


@dataclass(frozen=True)
class Trajectory:
    """A session's or a turn's steps, in order (a session's turns oldest first, each ended by
    its ``end`` step once it has ended)."""

    kind: str
    """``session`` or ``turn``."""
    id: str
    """The session id, or the turn's correlation id."""
    session_id: str
    turn_ids: tuple[str, ...]
    steps: tuple[TrajectoryStep, ...]


@dataclass(frozen=True)
class TrajectoryLookup:
    """What a session id or turn correlation id (or a unique prefix of one) names: its
    trajectory, or None with the ids (at most six) the prefix matched (none, or several)."""

    trajectory: Trajectory | None
    candidates: tuple[str, ...] = ()


__all__ = [
    "LOSS_COUNTERS", "STEP_KINDS", "TOOL_OUTCOMES", "CallRow", "Record", "ScoreTarget", "SearchHit", "SessionLookup", "Stats",
    "StoreStatus",
    "ToolCallRow", "Trajectory", "TrajectoryLookup", "TrajectoryStep", "TurnRow",
]
