"""Scores and feedback: one evaluation of a turn, a model call or a tool call.

A score is the GenAI conventions' ``gen_ai.evaluation.result`` event. The conventions model it
as an event parented to the evaluated operation's span, but a score usually comes after that
span ended (a thumbs-up minutes later, from another process), and an ended span takes no more
events. So each score is a zero-duration span of its own, named ``gen_ai.evaluation.result``,
started as a child of the evaluated span (same trace, its parent the evaluated span's id: a
backend shows it under the operation it judges), carrying the event with the conventions'
attributes. The same attributes are on the span itself, where the store's mapping reads them
(and tracing backends search span attributes). Given only an id (a response id, a tool call id,
a turn's correlation id) the span is the root of a trace of its own, with the id in
``loopscope.score.target`` (and ``gen_ai.response.id`` where the id is known to be one): the
store matches it to its turn, call or tool by that id.
"""

from __future__ import annotations

import math
import numbers
import time
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from .. import semconv as a
from .context import current_round, current_turn, open_stitched_turn

SOURCES = ("human", "model", "code")
"""The usual sources of a score (any other word is kept as given)."""


class _Target:
    """What a score is about, as the span attributes and parent need it."""

    __slots__ = ("agent", "context", "kind", "response_id", "session_id", "target_id", "turn_id")

    def __init__(self) -> None:
        self.context: SpanContext | None = None
        self.kind: str | None = None
        self.target_id: str | None = None
        self.response_id: str | None = None
        self.session_id: str | None = None
        self.turn_id: str | None = None
        self.agent: str | None = None


def _span_context(trace_hex: Any, span_hex: Any) -> SpanContext | None:
    """A remote span context of hex ids (the store's ``trace_id`` / ``span_id``), or None."""
    try:
        tid, sid = int(str(trace_hex), 16), int(str(span_hex), 16)
    except (TypeError, ValueError):
        return None
    if not (0 < tid < 1 << 128 and 0 < sid < 1 << 64):
        return None
    return SpanContext(tid, sid, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))


def _of_turn(turn: Any, found: _Target) -> None:
    span = getattr(turn, "_span", None)
    if span is not None:
        found.context = span.get_span_context()
    found.kind, found.turn_id = "turn", turn.correlation_id
    found.session_id, found.agent = turn.session_id, turn.agent


def _resolve(target: Any) -> _Target:
    """The :class:`_Target` of what :func:`score` was given (see its docstring)."""
    from ..models import ActivityEvent, AIResponseEvent, ModelCall
    from .tool import ToolExecution
    from .turn import Round, Turn

    found = _Target()
    if target is None:
        current = trace.get_current_span()
        attrs = getattr(current, "attributes", None) or {}
        op = attrs.get(a.OPERATION) if hasattr(attrs, "get") else None
        turn = current_turn.get() or open_stitched_turn()
        if op in (a.OP_EXECUTE_TOOL, a.OP_CHAT, a.OP_INVOKE_AGENT) and current.is_recording():
            found.context = current.get_span_context()
            found.kind = {a.OP_EXECUTE_TOOL: "tool", a.OP_CHAT: "call", a.OP_INVOKE_AGENT: "turn"}[op]
            found.target_id = attrs.get(a.TOOL_CALL_ID) if op == a.OP_EXECUTE_TOOL else None
            if turn is not None:
                found.session_id, found.turn_id, found.agent = turn.session_id, turn.correlation_id, turn.agent
            return found
        rnd = current_round.get()
        if rnd is not None and getattr(rnd, "_span", None) is not None:
            return _resolve(rnd)
        if turn is None:
            raise ValueError("no turn, model call or tool call is current here: give the score a target "
                             "(a turn, its correlation id, a response id, a tool call id)")
        _of_turn(turn, found)
    elif isinstance(target, Turn):
        _of_turn(target, found)
    elif isinstance(target, Round):
        span = getattr(target, "_span", None)
        if span is None:
            raise ValueError("this round has not started: score it once its model call was made")
        found.context, found.kind = span.get_span_context(), "call"
        found.response_id = getattr(target, "response_id", None) or None
        turn = getattr(target, "turn", None) or getattr(target, "_turn", None)
        if turn is not None:
            found.session_id, found.turn_id, found.agent = turn.session_id, turn.correlation_id, turn.agent
    elif isinstance(target, ToolExecution):
        span = getattr(target, "_span", None)
        if span is None:
            raise ValueError("this tool call has not started: score it once it ran")
        found.context, found.kind, found.target_id = span.get_span_context(), "tool", target.call_id
        turn = getattr(target, "_turn", None)
        if turn is not None and hasattr(turn, "correlation_id"):
            found.session_id, found.turn_id, found.agent = turn.session_id, turn.correlation_id, turn.agent
    elif isinstance(target, AIResponseEvent):  # a turn's summary (turn.response, Store.turns())
        found.context = _span_context(target.trace_id, target.span_id)
        found.kind, found.turn_id, found.target_id = "turn", target.correlation_id, target.correlation_id
        found.session_id, found.agent = target.session_id, target.channel_id
    elif isinstance(target, ModelCall):
        found.context = _span_context(target.trace_id, target.span_id)
        found.kind, found.response_id = "call", target.response_id
        found.session_id, found.turn_id, found.agent = target.session_id, target.correlation_id, target.agent
    elif isinstance(target, ActivityEvent):  # a tool call's row (Store.tool_calls(), a timeline)
        tool_id = getattr(target.content, "tool_id", None)
        if tool_id is None:
            raise ValueError(f"a {target.type} event is no tool call: score its turn (its correlation_id) instead")
        found.context = _span_context(target.trace_id, target.span_id)
        found.kind, found.target_id, found.turn_id = "tool", tool_id, target.correlation_id
        found.session_id = target.session_id
    elif isinstance(target, SpanContext):
        found.context = target if target.is_valid else None
    elif isinstance(target, str):
        if not target:
            raise ValueError("a score's target id is empty")
        found.target_id = target
    elif isinstance(getattr(target, "id", None), str) and getattr(target, "model", None) is not None:
        # a provider's response object (openai's ChatCompletion or Response, anthropic's Message, ...)
        found.kind, found.response_id = "call", target.id
    else:
        raise TypeError(
            "score(target, ...): target is None (the current turn, model call or tool call), a Turn, Round or "
            "ToolExecution, a stored AIResponseEvent, ModelCall or tool call event, a provider's response object, "
            f"a SpanContext or an id as text; not {type(target).__name__}"
        )
    if found.context is not None and not found.context.is_valid:
        found.context = None
    return found


def _value(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"a score's value is a number, not {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"a score's value is a finite number, not {number}")
    return number


def _text(what: str, value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"a score's {what} is text, not {type(value).__name__}")
    return value


def score(
    target: Any = None,
    name: str = "",
    *,
    value: float | None = None,
    label: str | None = None,
    explanation: str | None = None,
    source: str = "human",
) -> None:
    """Record a score (an evaluation, a piece of feedback) of a turn, a model call or a tool call.

    ``target`` says what is scored: None for the turn, model call or tool call running here
    (the innermost); a :class:`~loopscope.Turn` (what ``loopscope.turn(...)`` yields, during
    or after it), a :class:`~loopscope.Round` or :class:`~loopscope.ToolExecution`; a stored
    :class:`~loopscope.AIResponseEvent` (``turn.response``, ``Store.turns()``),
    :class:`~loopscope.ModelCall` or tool call event; a provider's response object (anything
    with an ``id`` and a ``model``: openai's ``ChatCompletion``, anthropic's ``Message``); or
    an id as text (a turn's correlation id, a response id, a tool call id), which the store
    matches to what it names. ``name`` names the evaluation (``"helpful"``, ``"thumbs"``);
    ``value`` is a number, ``label`` a word (``"pass"``, ``"up"``), ``explanation`` free text:
    at least one of the three. ``source`` says who scored: ``human`` (default), ``model``,
    ``code``, or a word of yours.

    It is recorded as the GenAI conventions' ``gen_ai.evaluation.result`` event on a
    zero-duration span under the scored span (docs/scores.md): the store keeps it in
    ``scores``, and the OTLP export carries it to any backend. Bad arguments raise
    ``TypeError`` / ``ValueError``; nothing else does.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError("a score needs a name: score(target, 'helpful', value=1)")
    number = _value(value)
    label = _text("label", label)
    explanation = _text("explanation", explanation)
    if number is None and not label and not explanation:
        raise ValueError("a score needs a value, a label or an explanation")
    if not isinstance(source, str) or not source:
        raise TypeError("a score's source is a word such as 'human', 'model' or 'code'")
    found = _resolve(target)
    context = found.context
    attributes, event = a.score_attributes(
        name, value=number, label=label, explanation=explanation, source=source, kind=found.kind,
        target_id=found.target_id, response_id=found.response_id, session_id=found.session_id, turn_id=found.turn_id,
        agent=found.agent, trace_id=context.trace_id if context is not None else None,
        span_id=context.span_id if context is not None else None,
    )
    from . import settings

    # the evaluated span's child; without one, the root of a trace of its own (not a child of
    # whatever runs here: a score given an id is about that id only)
    parent = (trace.set_span_in_context(NonRecordingSpan(found.context)) if found.context is not None
              else otel_context.Context())
    now = time.time_ns()
    span = settings.tracer().start_span(a.EVALUATION_SPAN, context=parent, attributes=attributes, start_time=now)
    span.add_event(a.EVALUATION_EVENT, event, timestamp=now)
    span.end(end_time=now)


__all__ = ["SOURCES", "score"]
