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
    return "%032x" % ctx.trace_id, "%016x" % ctx.span_id


def _plain(attrs: Any) -> dict[str, Any]:
    """The attributes as a plain dict, so that every lookup below is a C-level ``dict.get``.

    An SDK span's ``attributes`` is a read-only view of ``BoundedAttributes``, whose
    ``get`` runs two Python frames per lookup; its ``copy()`` (reached through the view)
    is one plain ``dict.copy``. Any other mapping is copied the generic way.
    """
    if attrs is None:
        return {}
    try:
        copied = attrs.copy()
    except Exception:
        copied = None
    return copied if type(copied) is dict else dict(attrs)


# json.loads(text) runs three Python frames and two regex matches around the C scanner;
# calling the scanner directly answers the common case (a whole JSON value, no
# surrounding whitespace), and json.loads itself decides every other case.
_scan_once = json.JSONDecoder().scan_once

# The last attribute text found to be valid JSON. A tool call's arguments are checked for
# its start row and again, as the very same str object, for its end row: remembering the
# object (not its id, which could be reused) skips the second check. Strings are
# immutable, so whatever object sits here stays valid, whichever thread put it there.
_last_valid_json: str | None = None


def _json_text(value: Any) -> str:
    """Attribute text that should hold JSON; anything else is kept as a JSON string."""
    global _last_valid_json
    if isinstance(value, str):
        if value is _last_valid_json:
            return value
        try:
            valid = _scan_once(value, 0)[1] == len(value)
        except (StopIteration, ValueError):
            valid = False
        if not valid:
            try:
                json.loads(value)
            except ValueError:
                return _json.dumps(value)
        _last_valid_json = value
        return value
    return _json.dumps(value)


# Every turn of an agent declares the same tools, as equal (not identical) text: the texts
# found valid lately are remembered by value, a few dozen at most.
_valid_declared: dict[str, None] = {}


def _declared_text(value: Any) -> str:
    """:func:`_json_text` for a turn's declared tools, remembering the texts found valid."""
    if type(value) is str and value in _valid_declared:
        return value
    text = _json_text(value)
    if text is value:  # valid JSON as it was
        if len(_valid_declared) >= 64:
            _valid_declared.clear()
        _valid_declared[text] = None
    return text


def _number(value: Any) -> str:
    """JSON for a duration: a finite float is its repr, exactly as ``json.dumps`` writes it."""
    if type(value) is float and value - value == 0.0:  # finite: inf - inf and nan - nan are nan
        return repr(value)
    return _json.dumps(value)


def _event(span: Any, attrs: dict[str, Any], kind: str, suffix: str, created_ns: int, content: str, blocked: bool = False) -> EventRow:
    trace_id, span_id = _ids(span)
    get = attrs.get
    return EventRow(  # positional, in field order: a NamedTuple is built faster so, and this runs per row
        f"{trace_id}{span_id}{suffix}",  # id
        str(get(a.CONVERSATION_ID) or trace_id),  # session_id
        kind,  # type
        created_ns // 1000,  # created_us
        get(a.TURN_ID),  # correlation_id
        get(a.AGENT_NAME),  # source_channel_id
        get(a.PROVIDER),  # source_provider
        get(a.FRAMEWORK),  # source_framework
        "blocked" if blocked else "delivered",  # status
        content,
        trace_id,
        span_id,
    )


_MISSING: Any = object()


def _tool_content(attrs: dict[str, Any], ended: bool, duration_ms: float | None = None) -> str:
    get = attrs.get
    arguments = get(a.TOOL_CALL_ARGUMENTS, _MISSING)
    head = (
        '{"type":"tool_call","tool_name":'
        + _json.dumps(str(get(a.TOOL_NAME, "")))
        + ',"tool_id":'
        + _json.dumps(str(get(a.TOOL_CALL_ID, "")))
        + ',"arguments":'
        + ("null" if arguments is _MISSING else _json_text(arguments))
    )
    if not ended:
        return head + ',"result":null,"status":"pending","outcome":null,"duration_ms":null,"error":null}'
    outcome = get(a.TOOL_OUTCOME) or "served"
    status = get(a.TOOL_STATUS) or ("completed" if outcome == "served" else "failed")
    error = get(a.TOOL_ERROR)
    result = get(a.TOOL_CALL_RESULT, _MISSING)
    return "".join((
        head,
        ',"result":',
        "null" if result is _MISSING else _json_text(result),
        ',"status":',
        _json.dumps(status),
        ',"outcome":',
        _json.dumps(outcome),
        ',"duration_ms":',
        _number(duration_ms),
        ',"error":',
        "null" if error is None else _json.dumps(error),
        "}",
    ))


def _text_content(body: str, role: str) -> str:
    return '{"type":"text","body":' + _json.dumps(body) + ',"role":' + _json.dumps(role) + "}"


def rows_on_start(span: Any) -> list[EventRow]:
    """Rows a span yields as it starts: a tool call's start, a turn's input message."""
    attrs = _plain(span.attributes)
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
    attrs = _plain(span.attributes)
    op = attrs.get(a.OPERATION)
    if op == a.OP_EXECUTE_TOOL:
        end = span.end_time
        duration = (end - span.start_time) / 1e6
        return [_event(span, attrs, "tool_call_end", "e", end, _tool_content(attrs, True, round(duration, 3)))], None
    if op == a.OP_CHAT:
        text = attrs.get(a.ROUND_TEXT)
        if text:
            return [_event(span, attrs, "message", "m", span.end_time, _text_content(text, "assistant"), bool(attrs.get(a.ROUND_BLOCKED)))], None
        return [], None
    if op == a.OP_INVOKE_AGENT:
        return [], _turn_row(span, attrs)
    return [], None


def _turn_row(span: Any, attrs: dict[str, Any]) -> TurnRow:
    trace_id, span_id = _ids(span)
    get = attrs.get
    usage = a.usage_from_attributes(attrs)
    segments = get(a.SEGMENTS)
    segment_list = _json.loads(segments) if segments else []
    end = span.end_time
    return TurnRow(  # positional, in field order, as for events
        str(get(a.TURN_ID) or span_id),  # correlation_id
        str(get(a.CONVERSATION_ID) or trace_id),  # session_id
        get(a.AGENT_NAME),  # channel_id
        get(a.PARENT_TURN_ID),  # parent_correlation_id
        RESPONSE_SEGMENT_SEPARATOR.join(segment_list),  # response_content
        _json.dumps(segment_list),  # segments
        int(get(a.TOOL_CALLS_COUNT) or 0),  # tool_calls_count
        int(get(a.ROUND_COUNT) or 0),  # round_count
        _json.dumps(usage),  # usage
        usage.get("input_tokens"),  # input_tokens
        usage.get("output_tokens"),  # output_tokens
        str(get(a.THINKING) or ""),  # thinking
        get(a.LOOP_END_REASON) or None,  # loop_end_reason
        round((end - span.start_time) / 1e6, 3),  # latency_ms
        bool(get(a.STREAMING)),  # streaming
        end // 1000,  # timestamp_us
        _declared_text(get(a.DECLARED_TOOLS) or "[]"),  # declared_tools
        get(a.RESPONSE_MODEL) or get(a.REQUEST_MODEL),  # model
        get(a.PROVIDER),  # provider
        _error_text(span, attrs),  # error
        trace_id,
        span_id,
    )


def _error_text(span: Any, attrs: Any) -> str | None:
    if attrs.get(a.LOOP_END_REASON) != "error":
        return None
    description = getattr(span.status, "description", None)
    kind = attrs.get(a.ERROR_TYPE)
    return f"{kind}: {description}" if kind and description else (kind or description)
