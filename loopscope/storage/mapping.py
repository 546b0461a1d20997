"""The span-to-row mapping: GenAI spans in, activity events and turn summaries out.

It is a pure function of the span, so the same rows come out whether the span was
recorded in this process or received over OTLP. A tool call's start row comes from the
``execute_tool`` span's start; a text segment from a ``chat`` span's end; the turn
summary from the ``invoke_agent`` span's end.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from .. import _json, semconv as a
from ..models import RESPONSE_SEGMENT_SEPARATOR


class EventRow(NamedTuple):
    id: str
    session_id: str
    type: str
    created_us: int
    correlation_id: str | None
    source_channel_id: str | None
    source_provider: str | None
    source_framework: str | None
    status: str
    content: str
    trace_id: str
    span_id: str


class TurnRow(NamedTuple):
    correlation_id: str
    session_id: str
    channel_id: str | None
    parent_correlation_id: str | None
    response_content: str
    segments: str
    tool_calls_count: int
    round_count: int
    usage: str
    input_tokens: int | None
    output_tokens: int | None
    thinking: str
    loop_end_reason: str | None
    latency_ms: float
    streaming: bool
    timestamp_us: int
    declared_tools: str
    model: str | None
    provider: str | None
    error: str | None
    trace_id: str
    span_id: str


def _ids(span: Any) -> tuple[str, str]:
    ctx = span.context
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x")


def _json_text(value: Any) -> str:
    """Attribute text that should hold JSON; anything else is kept as a JSON string."""
    if isinstance(value, str):
        try:
            json.loads(value)
            return value
        except ValueError:
            return _json.dumps(value)
    return _json.dumps(value)


def _event(span: Any, attrs: Any, kind: str, suffix: str, created_ns: int, content: str, blocked: bool = False) -> EventRow:
    trace_id, span_id = _ids(span)
    return EventRow(
        id=f"{trace_id}{span_id}{suffix}",
        session_id=str(attrs.get(a.CONVERSATION_ID) or trace_id),
        type=kind,
        created_us=created_ns // 1000,
        correlation_id=attrs.get(a.TURN_ID),
        source_channel_id=attrs.get(a.AGENT_NAME),
        source_provider=attrs.get(a.PROVIDER),
        source_framework=attrs.get(a.FRAMEWORK),
        status="blocked" if blocked else "delivered",
        content=content,
        trace_id=trace_id,
        span_id=span_id,
    )


def _tool_content(attrs: Any, ended: bool, duration_ms: float | None = None) -> str:
    parts = [
        '{"type":"tool_call","tool_name":',
        _json.dumps(str(attrs.get(a.TOOL_NAME, ""))),
        ',"tool_id":',
        _json.dumps(str(attrs.get(a.TOOL_CALL_ID, ""))),
        ',"arguments":',
        _json_text(attrs[a.TOOL_CALL_ARGUMENTS]) if a.TOOL_CALL_ARGUMENTS in attrs else "null",
    ]
    if ended:
        outcome = attrs.get(a.TOOL_OUTCOME) or "served"
        status = attrs.get(a.TOOL_STATUS) or ("completed" if outcome == "served" else "failed")
        error = attrs.get(a.TOOL_ERROR)
        parts += [
            ',"result":',
            _json_text(attrs[a.TOOL_CALL_RESULT]) if a.TOOL_CALL_RESULT in attrs else "null",
            ',"status":',
            _json.dumps(status),
            ',"outcome":',
            _json.dumps(outcome),
            ',"duration_ms":',
            _json.dumps(duration_ms),
            ',"error":',
            _json.dumps(error),
            "}",
        ]
    else:
        parts.append(',"result":null,"status":"pending","outcome":null,"duration_ms":null,"error":null}')
    return "".join(parts)


def _text_content(body: str, role: str) -> str:
    return '{"type":"text","body":' + _json.dumps(body) + ',"role":' + _json.dumps(role) + "}"


def rows_on_start(span: Any) -> list[EventRow]:
    """Rows a span yields as it starts: a tool call's start, a turn's input message."""
    attrs = span.attributes
    if not attrs:
        return []
    op = attrs.get(a.OPERATION)
    if op == a.OP_EXECUTE_TOOL:
        return [_event(span, attrs, "tool_call_start", "s", span.start_time, _tool_content(attrs, False))]
    if op == a.OP_INVOKE_AGENT and a.TURN_INPUT in attrs:
        body = attrs[a.TURN_INPUT]
        return [
            _event(
                span, attrs, "message", "i", span.start_time,
                _text_content(body if isinstance(body, str) else _json.dumps(body), "user"),
                bool(attrs.get(a.TURN_INPUT_BLOCKED)),
            )
        ]
    return []


def rows_on_end(span: Any) -> tuple[list[EventRow], TurnRow | None]:
    """Rows a span yields as it ends: a tool call's end, a round's text, a turn summary."""
    attrs = span.attributes
    if not attrs:
        return [], None
    op = attrs.get(a.OPERATION)
    if op == a.OP_EXECUTE_TOOL:
        duration = (span.end_time - span.start_time) / 1e6
        return [_event(span, attrs, "tool_call_end", "e", span.end_time, _tool_content(attrs, True, round(duration, 3)))], None
    if op == a.OP_CHAT:
        text = attrs.get(a.ROUND_TEXT)
        if text:
            return [_event(span, attrs, "message", "m", span.end_time, _text_content(text, "assistant"), bool(attrs.get(a.ROUND_BLOCKED)))], None
        return [], None
    if op == a.OP_INVOKE_AGENT:
        return [], _turn_row(span, attrs)
    return [], None


def _turn_row(span: Any, attrs: Any) -> TurnRow:
    trace_id, span_id = _ids(span)
    usage = a.usage_from_attributes(attrs)
    segments = attrs.get(a.SEGMENTS)
    segment_list = _json.loads(segments) if segments else []
    return TurnRow(
        correlation_id=str(attrs.get(a.TURN_ID) or span_id),
        session_id=str(attrs.get(a.CONVERSATION_ID) or trace_id),
        channel_id=attrs.get(a.AGENT_NAME),
        parent_correlation_id=attrs.get(a.PARENT_TURN_ID),
        response_content=RESPONSE_SEGMENT_SEPARATOR.join(segment_list),
        segments=_json.dumps(segment_list),
        tool_calls_count=int(attrs.get(a.TOOL_CALLS_COUNT) or 0),
        round_count=int(attrs.get(a.ROUND_COUNT) or 0),
        usage=_json.dumps(usage),
        input_tokens=usage.get("input_tokens"),
        output_tokens=usage.get("output_tokens"),
        thinking=str(attrs.get(a.THINKING) or ""),
        loop_end_reason=attrs.get(a.LOOP_END_REASON) or None,
        latency_ms=round((span.end_time - span.start_time) / 1e6, 3),
        streaming=bool(attrs.get(a.STREAMING)),
        timestamp_us=span.end_time // 1000,
        declared_tools=_json_text(attrs.get(a.DECLARED_TOOLS) or "[]"),
        model=attrs.get(a.RESPONSE_MODEL) or attrs.get(a.REQUEST_MODEL),
        provider=attrs.get(a.PROVIDER),
        error=_error_text(span, attrs),
        trace_id=trace_id,
        span_id=span_id,
    )


def _error_text(span: Any, attrs: Any) -> str | None:
    if attrs.get(a.LOOP_END_REASON) != "error":
        return None
    description = getattr(span.status, "description", None)
    kind = attrs.get(a.ERROR_TYPE)
    return f"{kind}: {description}" if kind and description else (kind or description)
