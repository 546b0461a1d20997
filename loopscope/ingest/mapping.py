"""The span-to-row mapping: GenAI spans in loopscope's conventions in, facts out.

It is a pure function of the spans, so the same rows come out whether a span was
recorded in this process, received over OTLP or rebuilt by recovery. A tool call's
start row comes from the ``execute_tool`` span's start; a text segment from a ``chat``
span's end; the turn summary from the ``invoke_agent`` span's end. Other
instrumentations' spans reach it rewritten into loopscope's conventions
(:mod:`loopscope.ingest.foreign`).

:func:`collect` reads each span once and builds each row's values by name (a *fact*:
:func:`~loopscope.storage.rows.event_fact` and the like); :func:`add_spans` collects spans a chunk at a
time into a :class:`~loopscope.storage.rows.Facts` batch, which the store makes rows
from in SQL. Whatever the facts cannot express (a tool outcome that is not a string, a
round's text that is not a string) gets its content from the plain Python mapping at the
end of this module (:func:`_tool_content`, :func:`text_content`), carried in the fact as
an override, so every value gives the row it always gave.

``SPANS`` is this mapping as the writer takes it (:class:`~loopscope.storage.rows.SpanMapping`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from .. import _json, semconv as a
from .._guard import internal_error
from ..models import RESPONSE_SEGMENT_SEPARATOR
from ..storage.rows import (
    CHUNK, END, INPUT_MESSAGE, PAUSE_EVERY, ROUND_MESSAGE, START, STATE_DELTA, STATE_SNAPSHOT, TOOL_END,
    TOOL_START, Facts, event_fact, event_head, event_tail, turn_head, turn_tail,
)

try:  # the SDK's spans, read through their fields: the public properties cost a frame each
    from opentelemetry.attributes import BoundedAttributes
    from opentelemetry.sdk.trace import ReadableSpan, Span, _Span

    _probe = ReadableSpan("probe", attributes=BoundedAttributes(attributes={"k": "v"}), start_time=1, end_time=2)
    _FAST_TYPES: frozenset[type] = (
        frozenset({ReadableSpan, Span, _Span})
        if _probe._attributes._dict == {"k": "v"} and (_probe._start_time, _probe._end_time, _probe._context) == (1, 2, None)
        else frozenset()
    )
    _BOUNDED: type | None = BoundedAttributes
    del _probe
except Exception:  # another SDK version: the public properties, always right
    _FAST_TYPES, _BOUNDED = frozenset(), None


def _plain(attrs: Any) -> dict[str, Any]:
    """The attributes as a plain dict, so that every lookup is a C-level ``dict.get``."""
    if attrs is None:
        return {}
    if type(attrs) is dict:
        return attrs
    if _BOUNDED is not None and type(attrs) is _BOUNDED:
        return attrs._dict  # type: ignore[attr-defined, no-any-return]
    try:
        copied = attrs.copy()
    except Exception:
        copied = None
    return copied if type(copied) is dict else dict(attrs)


def collect(items: Iterable[tuple[int, Any]], events: list[tuple[Any, ...]], turns: list[tuple[Any, ...]],
            skip: frozenset[str] = frozenset()) -> int:
    """Append the facts of each ``(kind, span)`` pair (kind 0: started, 1: ended) to
    ``events`` and ``turns``, in order; rows of the event types in ``skip`` are left out.

    Returns how many rows were left out. A span whose facts cannot be read (a foreign
    span without times or ids, say) yields no row, and the failure is reported.
    """
    keep_start = "tool_call_start" not in skip
    keep_end = "tool_call_end" not in skip
    keep_message = "message" not in skip
    add = events.append
    excluded = 0
    fast, bounded = _FAST_TYPES, _BOUNDED
    # this loop runs per span over spans long gone cold: names are bound to locals once
    OPERATION, EXECUTE_TOOL, CHAT, INVOKE_AGENT = a.OPERATION, a.OP_EXECUTE_TOOL, a.OP_CHAT, a.OP_INVOKE_AGENT
    CONVERSATION_ID, TURN_ID, AGENT_NAME = a.CONVERSATION_ID, a.TURN_ID, a.AGENT_NAME
    PROVIDER, FRAMEWORK = a.PROVIDER, a.FRAMEWORK
    TOOL_NAME, TOOL_CALL_ID = a.TOOL_NAME, a.TOOL_CALL_ID
    TOOL_CALL_ARGUMENTS, TOOL_CALL_RESULT = a.TOOL_CALL_ARGUMENTS, a.TOOL_CALL_RESULT
    TOOL_OUTCOME, TOOL_STATUS, TOOL_ERROR = a.TOOL_OUTCOME, a.TOOL_STATUS, a.TOOL_ERROR
    ROUND_TEXT, ROUND_BLOCKED = a.ROUND_TEXT, a.ROUND_BLOCKED
    TURN_INPUT, TURN_INPUT_BLOCKED = a.TURN_INPUT, a.TURN_INPUT_BLOCKED
    STATE_KIND, STATE_VALUE, STATE_KINDS = a.STATE_KIND, a.STATE_VALUE, a.STATE_KINDS
    last_tid: Any = None
    trace = b""
    for kind, span in items:
        try:
            if type(span) in fast:
                attrs = span._attributes
                d = attrs._dict if type(attrs) is bounded else _plain(attrs)
                ctx = span._context
                tid = ctx[0]
                sid = ctx[1]
                sdk = True
            else:
                d = _plain(span.attributes)
                ctx = span.context
                tid = ctx.trace_id
                sid = ctx.span_id
                sdk = False
            # each time is read only where a row needs it: every value read is a cache miss
            if tid is not last_tid:  # the spans of a trace share its id: its bytes are made once
                trace = tid.to_bytes(16, "big")
                last_tid = tid
            get = d.get
            op = get(OPERATION)
            if op == EXECUTE_TOOL:
                if not (keep_start if kind == START else keep_end):
                    excluded += 1
                    continue
                name = get(TOOL_NAME, "")
                if type(name) is not str:
                    name = str(name)
                call_id = get(TOOL_CALL_ID, "")
                if type(call_id) is not str:
                    call_id = str(call_id)
                arguments = get(TOOL_CALL_ARGUMENTS)
                if arguments is not None and type(arguments) is not str:
                    arguments = _text_or_json(arguments)
                session = get(CONVERSATION_ID) or "%032x" % tid
                if kind == START:
                    add(event_fact(
                        code=TOOL_START, trace_id=trace, span_id=sid.to_bytes(8, "big"),
                        created_us=(span._start_time if sdk else span.start_time) // 1000,
                        session_id=session if type(session) is str else str(session),
                        correlation_id=get(TURN_ID), source_channel_id=get(AGENT_NAME), source_provider=get(PROVIDER),
                        source_framework=get(FRAMEWORK), blocked=False,
                        tool_name=name, tool_id=call_id, arguments=arguments,
                    ))
                    continue
                start, end = (span._start_time, span._end_time) if sdk else (span.start_time, span.end_time)
                duration = round((end - start) / 1e6, 3)
                result = get(TOOL_CALL_RESULT)
                if result is not None and type(result) is not str:
                    result = _text_or_json(result)
                outcome = get(TOOL_OUTCOME) or "served"
                status = get(TOOL_STATUS) or ("completed" if outcome == "served" else "failed")
                error = get(TOOL_ERROR)
                content = None
                if type(outcome) is not str or type(status) is not str or (error is not None and type(error) is not str):
                    content = _tool_content(d, True, duration)
                add(event_head(
                    code=TOOL_END, trace_id=trace, span_id=sid.to_bytes(8, "big"), created_us=end // 1000,
                    session_id=session if type(session) is str else str(session),
                    correlation_id=get(TURN_ID), source_channel_id=get(AGENT_NAME), source_provider=get(PROVIDER),
                    source_framework=get(FRAMEWORK), blocked=False,
                ) + event_tail(
                    tool_name=name, tool_id=call_id, arguments=arguments, result=result, tool_status=status,
                    outcome=outcome, error=error, duration_ms=duration, content=content,
                ))
            elif op == CHAT:
                if kind != END:
                    continue
                text = get(ROUND_TEXT)
                if not text:
                    continue
                if not keep_message:
                    excluded += 1
                    continue
                content = None
                if type(text) is not str:
                    content, text = text_content(text, "assistant"), ""
                session = get(CONVERSATION_ID) or "%032x" % tid
                add(event_fact(
                    code=ROUND_MESSAGE, trace_id=trace, span_id=sid.to_bytes(8, "big"),
                    created_us=(span._end_time if sdk else span.end_time) // 1000,
                    session_id=session if type(session) is str else str(session),
                    correlation_id=get(TURN_ID), source_channel_id=get(AGENT_NAME), source_provider=get(PROVIDER),
                    source_framework=get(FRAMEWORK), blocked=bool(get(ROUND_BLOCKED)),
                    body=text, content=content,
                ))
            elif op == INVOKE_AGENT:
                if kind == END:
                    start, end = (span._start_time, span._end_time) if sdk else (span.start_time, span.end_time)
                    turns.append(_turn_fact(span, d, tid, trace, sid, start, end))
                    continue
                if TURN_INPUT not in d:
                    continue
                if not keep_message:
                    excluded += 1
                    continue
                body = d[TURN_INPUT]
                if type(body) is not str:
                    body = str(body) if isinstance(body, str) else _json.dumps(body)
                session = get(CONVERSATION_ID) or "%032x" % tid
                add(event_fact(
                    code=INPUT_MESSAGE, trace_id=trace, span_id=sid.to_bytes(8, "big"),
                    created_us=(span._start_time if sdk else span.start_time) // 1000,
                    session_id=session if type(session) is str else str(session),
                    correlation_id=get(TURN_ID), source_channel_id=get(AGENT_NAME), source_provider=get(PROVIDER),
                    source_framework=get(FRAMEWORK), blocked=bool(get(TURN_INPUT_BLOCKED)),
                    body=body,
                ))
            elif STATE_KIND in d:  # a state snapshot or delta: no GenAI operation, ended at once
                if kind != END:
                    continue
                state_type = STATE_KINDS.get(get(STATE_KIND))
                value = get(STATE_VALUE)
                if state_type is None or value is None:
                    continue  # an unknown kind, or a value left out on export (content capture off)
                if state_type in skip:
                    excluded += 1
                    continue
                code = STATE_SNAPSHOT if state_type == "state_snapshot" else STATE_DELTA
                session = get(CONVERSATION_ID) or "%032x" % tid
                add(event_fact(
                    code=code, trace_id=trace, span_id=sid.to_bytes(8, "big"),
                    created_us=(span._end_time if sdk else span.end_time) // 1000,
                    session_id=session if type(session) is str else str(session),
                    correlation_id=get(TURN_ID), source_channel_id=get(AGENT_NAME), source_provider=get(PROVIDER),
                    source_framework=get(FRAMEWORK), blocked=False,
                    content=_state_content(code, value),
                ))
        except Exception:
            internal_error("span mapping")
    return excluded


def _state_content(code: int, value: Any) -> str:
    """A state row's content: ``{"snapshot": <object>}`` or ``{"delta": [<operations>]}``."""
    text = value if type(value) is str else _text_or_json(value)
    return ('{"snapshot":' if code == STATE_SNAPSHOT else '{"delta":') + _json_text(text) + "}"


def _text_or_json(value: Any) -> str:
    """Text for a JSON-holding attribute that is not a plain str: a str subclass's text,
    or any other value as JSON (which the SQL then keeps as it is)."""
    return str(value) if isinstance(value, str) else _json.dumps(value)


_scan_once = json.JSONDecoder().scan_once


def _segments(value: Any) -> tuple[str, str]:
    """The response text and the segments JSON of a turn's segments attribute."""
    if not value:
        return "", "[]"
    if type(value) is str:
        # json.loads runs Python frames around the C scanner: the scanner alone answers
        # the common case (a whole JSON list, no surrounding whitespace)
        try:
            segments, end = _scan_once(value, 0)
        except (StopIteration, ValueError):
            segments, end = None, -1
        if end == len(value) and type(segments) is list:
            text = RESPONSE_SEGMENT_SEPARATOR.join(segments)  # a TypeError for anything but strings, as ever
            if text.isascii() or _json._encodable(text):
                # a list of plain strings: its text is the very JSON json.dumps would give it
                return text, value
    segments = _json.loads(value)
    return RESPONSE_SEGMENT_SEPARATOR.join(segments), _json.dumps(segments)


def _turn_fact(span: Any, d: dict[str, Any], tid: int, trace: bytes, sid: int, start: int, end: int) -> tuple[Any, ...]:
    get = d.get
    correlation_id = get(a.TURN_ID)
    if not correlation_id:
        correlation_id = None  # the span id, in SQL
    elif type(correlation_id) is not str:
        correlation_id = str(correlation_id)
    session = get(a.CONVERSATION_ID) or "%032x" % tid
    response, segments = _segments(get(a.SEGMENTS))
    thinking = get(a.THINKING) or ""
    reason = get(a.LOOP_END_REASON) or None
    return turn_head(
        trace_id=trace,
        span_id=sid.to_bytes(8, "big"),
        correlation_id=correlation_id,
        session_id=session if type(session) is str else str(session),
        channel_id=get(a.AGENT_NAME),
        parent_correlation_id=get(a.PARENT_TURN_ID),
        response_content=response,
        segments=segments,
        tool_calls_count=int(get(a.TOOL_CALLS_COUNT) or 0),
        round_count=int(get(a.ROUND_COUNT) or 0),
    ) + turn_tail(
        # the usage values as they are: Arrow takes ints (and floats, truncated as int()
        # does); anything else fails the chunk's conversion and _clean reads it as
        # semconv.usage_from_attributes does
        input_tokens=get(a.USAGE_INPUT),
        output_tokens=get(a.USAGE_OUTPUT),
        cache_read_input_tokens=get(a.USAGE_CACHE_READ),
        cache_creation_input_tokens=get(a.USAGE_CACHE_CREATION),
        reasoning_tokens=get(a.USAGE_REASONING),
        usage=None,  # made in SQL
        thinking=thinking if type(thinking) is str else str(thinking),
        loop_end_reason=reason,
        latency_ms=round((end - start) / 1e6, 3),
        streaming=bool(get(a.STREAMING)),
        timestamp_us=end // 1000,
        declared_tools=_declared_text(get(a.DECLARED_TOOLS) or "[]"),
        model=get(a.RESPONSE_MODEL) or get(a.REQUEST_MODEL),
        provider=get(a.PROVIDER),
        error=_error_text(span, reason, get(a.ERROR_TYPE)) if reason == "error" else None,
    )


assert a.USAGE_ATTRIBUTES == {
    "input_tokens": a.USAGE_INPUT, "output_tokens": a.USAGE_OUTPUT, "cache_read_input_tokens": a.USAGE_CACHE_READ,
    "cache_creation_input_tokens": a.USAGE_CACHE_CREATION, "reasoning_tokens": a.USAGE_REASONING,
}, "_turn_fact reads every usage attribute into the turn fact's field of the same name"


_usage_value = a.usage_value  # a usage attribute as semconv.usage_from_attributes reads it


def _error_text(span: Any, reason: Any, kind: Any) -> str | None:
    description = getattr(span.status, "description", None)
    return f"{kind}: {description}" if kind and description else (kind or description)


# -- the plain Python mapping, for what the SQL does not cover ----------------------------------

def _json_text(value: Any) -> str:
    """Attribute text that should hold JSON; anything else is kept as a JSON string."""
    if isinstance(value, str):
        try:
            valid = _scan_once(value, 0)[1] == len(value)
        except (StopIteration, ValueError):
            valid = False
        if not valid:
            try:
                json.loads(value)
            except ValueError:
                return _json.dumps(value)
        return value
    return _json.dumps(value)


# Every turn of an agent declares the same tools, as equal (not identical) text: the texts
# found valid lately are remembered by value, a few dozen at most.
_valid_declared: dict[str, None] = {}


def _declared_text(value: Any) -> str:
    """:func:`_json_text` for a turn's declared tools, remembering the texts found valid.

    JSON whose strings hold escaped lone surrogates is valid to Python but not to DuckDB
    (no JSON column could hold it): it is kept as a JSON string instead."""
    if type(value) is str and value in _valid_declared:
        return value
    text = _json_text(value)
    if text is value:  # valid JSON as it was
        if "\\u" in text and not _json._encodable(json.dumps(json.loads(text), ensure_ascii=False)):
            return _json.dumps(text)
        if len(_valid_declared) >= 64:
            _valid_declared.clear()
        _valid_declared[text] = None
    return text


def _number(value: Any) -> str:
    """JSON for a duration: a finite float is its repr, exactly as ``json.dumps`` writes it."""
    if type(value) is float and value - value == 0.0:  # finite: inf - inf and nan - nan are nan
        return repr(value)
    return _json.dumps(value)


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


def text_content(body: Any, role: str) -> str:
    """The ``content`` JSON of a message row (AG-UI import makes its rows with it too)."""
    return '{"type":"text","body":' + _json.dumps(body) + ',"role":' + _json.dumps(role) + "}"


def add_spans(facts: Facts, items: list[tuple[int, Any]], skip: frozenset[str] = frozenset(),
              pause: Callable[[], Any] | None = None) -> None:
    """Add the rows of ``(kind, span)`` pairs (see :func:`collect`) to ``facts``.

    ``pause``, when given, is called after every :data:`PAUSE_EVERY` spans (a
    background thread passes a function that lets other threads take the GIL).
    """
    for i in range(0, len(items), CHUNK):
        events: list[tuple[Any, ...]] = []
        turns: list[tuple[Any, ...]] = []
        excluded = 0
        if pause is None:
            excluded += collect(items[i:i + CHUNK], events, turns, skip)
        else:
            for j in range(i, min(i + CHUNK, len(items)), PAUSE_EVERY):
                excluded += collect(items[j:j + PAUSE_EVERY], events, turns, skip)
                pause()
        facts.append(events, turns, excluded)


def facts_of(items: list[tuple[int, Any]]) -> Facts:
    """The facts of ``(kind, span)`` pairs, as a new batch."""
    facts = Facts()
    add_spans(facts, items)
    return facts


SPAN_BYTES = 256
"""What a queued span counts against the writer's byte bound beyond its text attributes."""


def span_size(span: Any) -> int:
    """What a queued span counts against the writer's byte bound: the lengths of its text
    attributes (the content: messages, tool arguments and results) and :data:`SPAN_BYTES`.
    Cheap: a span's own attribute dict, read once."""
    try:
        attributes = span._attributes
        values = attributes._dict.values() if type(attributes) is _BOUNDED else attributes.values()
    except AttributeError:
        return SPAN_BYTES  # not an SDK span: its size is unknown, the count bound holds it
    size = SPAN_BYTES
    for value in values:
        if type(value) is str:
            size += len(value)
    return size
