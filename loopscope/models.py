"""The public data model: what a turn, a tool call and a stored event look like.

The shapes follow RoomKit's activity model so that its users read ours without a
glossary: a turn ends in one :class:`AIResponseEvent`, a tool call is recorded as a
start and an end :class:`ActivityEvent` carrying :class:`ToolCallContent`.
"""

from __future__ import annotations

from datetime import datetime, timezone
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# defined apart: the store's writer process maps spans with it without importing pydantic
from ._segments import RESPONSE_SEGMENT_SEPARATOR

__all__ = [
    "RESPONSE_SEGMENT_SEPARATOR",
    "AIResponseEvent",
    "ActivityEvent",
    "DeclaredTool",
    "EventSource",
    "EventStatus",
    "EventType",
    "LoopEndReason",
    "ModelCall",
    "SessionInfo",
    "TextContent",
    "ToolCall",
    "ToolCallContent",
]

ToolStatus = Literal["pending", "completed", "failed"]
ToolOutcome = Literal["served", "refused", "failed", "blocked", "unserved", "cancelled"]
ToolOrigin = Literal["always", "pinned", "sticky", "revealed", "output"]
"""Why a tool was offered: RoomKit's ``always`` / ``pinned`` / ``sticky`` / ``revealed``, or
``output``: a tool a framework adds to carry the run's structured output (pydantic-ai's
``final_result``). Calling an output tool is the model's answer: it is stored as the turn's
assistant message, not as a tool call, and ``declared_vs_used`` leaves output tools out."""


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


class LoopEndReason(str, Enum):
    """Why an agent's tool loop stopped."""

    COMPLETED = "completed"
    MAX_ROUNDS = "max_rounds"
    TIMEOUT = "timeout"
    BUDGET_EXCEEDED = "budget_exceeded"
    TRUNCATED = "truncated"
    EMPTY_RESPONSE = "empty_response"
    UNFINISHED = "unfinished"
    FORCE_STOPPED = "force_stopped"
    CANCELLED = "cancelled"
    ERROR = "error"
    REFUSAL = "refusal"
    """The model refused (ACP's ``refusal`` stop reason; a structured-output refusal)."""
    CONTENT_FILTER = "content_filter"
    """The provider's content filter withheld the answer (not an ACP reason: a provider's)."""
    CUT_OFF = "cut_off"
    """A stitched loop (zero-code) stopped after running tools, before the model saw their
    results, and the conversation went on: the next request carries those results and a new
    user message after them. The application's own rule stopped it (a round cap, a budget),
    which the requests do not say; not a RoomKit reason (a RoomKit loop names its rule)."""


class EventType(str, Enum):
    """The kinds of rows in the activity log. Stored as plain strings, so the set can grow.

    ``state_snapshot`` rows hold the application's whole state at that point as content
    ``{"snapshot": <the object>}`` (AG-UI's STATE_SNAPSHOT); ``state_delta`` rows hold a
    JSON Patch (RFC 6902) against the state before them as ``{"delta": [<operations>]}``
    (AG-UI's STATE_DELTA). The state is never stored apart from the log:
    :meth:`~loopscope.Store.derive_state` rebuilds it from these rows.

    ``model_error`` rows say that a model call failed (an HTTP error, a stream broken
    off, an error body), at its end, with content ``{"type": "model_error", "model",
    "error_type", "error", "duration_ms"}``; the call itself is a row of ``model_calls``.
    """

    MESSAGE = "message"
    TOOL_CALL_START = "tool_call_start"
    TOOL_CALL_END = "tool_call_end"
    STATE_SNAPSHOT = "state_snapshot"
    STATE_DELTA = "state_delta"
    MODEL_ERROR = "model_error"


class EventStatus(str, Enum):
    """Whether a row was delivered, or refused (blocked) and kept only for audit."""

    DELIVERED = "delivered"
    BLOCKED = "blocked"


class ToolCall(BaseModel):
    """A tool call as the model asked for it."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: Any = None


class ToolCallContent(BaseModel):
    """The content of ``tool_call_start`` and ``tool_call_end`` events."""

    type: Literal["tool_call"] = "tool_call"
    tool_name: str
    tool_id: str
    arguments: Any = None
    result: Any = None
    status: ToolStatus = "pending"
    outcome: ToolOutcome | None = None
    duration_ms: float | None = None
    error: str | None = None


class TextContent(BaseModel):
    """The content of a ``message`` event: one text segment and who said it."""

    type: Literal["text"] = "text"
    body: str
    role: str = "assistant"


class DeclaredTool(BaseModel):
    """One tool as the model was offered it, and why it was there."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    origin: ToolOrigin = "always"
    type: str | None = None
    """A server tool's type, as the provider names it (Anthropic's ``web_search_20250305``,
    OpenAI Responses' ``web_search_preview``): a tool the provider runs itself, whose uses
    are no tool calls of the application. None for a tool the application runs."""


class EventSource(BaseModel):
    """Who produced an event: the agent (channel), the model provider, the framework."""

    channel_id: str | None = None
    provider: str | None = None
    framework: str | None = None


class ActivityEvent(BaseModel):
    """One row of a session's activity log."""

    id: str
    session_id: str
    index: int
    type: str
    created_at: datetime
    correlation_id: str | None = None
    source: EventSource = Field(default_factory=EventSource)
    status: EventStatus = EventStatus.DELIVERED
    content: ToolCallContent | TextContent | dict[str, Any] = Field(union_mode="left_to_right")
    trace_id: str | None = None
    span_id: str | None = None


class AIResponseEvent(BaseModel):
    """The summary of one agent turn: what it said, what it did, and why it stopped."""

    channel_id: str | None = None
    session_id: str | None = None
    correlation_id: str | None = None
    parent_correlation_id: str | None = None
    response_content: str = ""
    segments: list[str] = Field(default_factory=list)
    tool_calls_count: int = 0
    round_count: int = 0
    """Tool rounds, as RoomKit counts them: the model calls whose tool calls ran (a turn
    of one call that asked for no tool has 0). :attr:`model_call_count` counts every call."""
    model_call_count: int = 0
    """How many model calls the turn made (a one-call turn has 1)."""
    usage: dict[str, int] = Field(default_factory=dict)
    thinking: str = ""
    loop_end_reason: LoopEndReason | None = None
    latency_ms: float = 0
    streaming: bool = False
    timestamp: datetime = Field(default_factory=_utcnow)
    declared_tools: list[DeclaredTool] = Field(default_factory=list)
    model: str | None = None
    provider: str | None = None
    error: str | None = None
    trace_id: str | None = None
    span_id: str | None = None


class SessionInfo(BaseModel):
    """A session as listed by :meth:`Store.list_sessions`."""

    session_id: str
    event_count: int
    turn_count: int
    first_at: datetime | None
    last_at: datetime | None
    agents: list[str] = Field(default_factory=list)


class ModelCall(BaseModel):
    """One model call (a ``chat`` span): a row of the store's ``model_calls``, as
    :meth:`Store.model_calls` returns it.

    ``position`` is the call's place in its turn, from 1 (numbered by start time where the
    recording did not say). ``usage`` is keyed as :attr:`AIResponseEvent.usage` is, with
    input tokens normalized to include cached ones on every provider; ``provider_usage``
    holds the provider's own figures as it reported them. ``outcome`` is one of
    ``completed``, ``truncated``, ``refusal``, ``content_filter``, ``error``,
    ``cancelled`` (None where the recording did not say). ``cost_usd`` is None when no
    price is known for the model (``price_source`` says where a price came from:
    ``genai-prices`` or ``override``). ``parameters`` are the request's (``temperature``,
    ``max_tokens``, ``tool_choice``, ``server_address``, ...). The messages are content,
    read only when asked for (``with_messages=True``).
    """

    session_id: str
    correlation_id: str | None = None
    position: int | None = None
    agent: str | None = None
    provider: str | None = None
    framework: str | None = None
    model: str | None = None
    """The response's model, else the request's."""
    request_model: str | None = None
    response_model: str | None = None
    response_id: str | None = None
    finish_reasons: list[str] = Field(default_factory=list)
    outcome: str | None = None
    streaming: bool | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    duration_ms: float | None = None
    time_to_first_chunk_ms: float | None = None
    usage: dict[str, int] = Field(default_factory=dict)
    provider_usage: Any = None
    parameters: dict[str, Any] = Field(default_factory=dict)
    cost_usd: float | None = None
    price_source: str | None = None
    error_type: str | None = None
    error: str | None = None
    refusal: str | None = None
    input_messages: Any = None
    output_messages: Any = None
    trace_id: str | None = None
    span_id: str | None = None
