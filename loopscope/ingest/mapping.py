"""The span-to-row mapping: GenAI spans in loopscope's conventions in, facts out.

It is a pure function of the spans, so the same rows come out whether a span was
recorded in this process, received over OTLP or rebuilt by recovery. A tool call's
start row comes from the ``execute_tool`` span's start; a text segment from a ``chat``
span's end; the turn summary from the ``invoke_agent`` span's end. Other
instrumentations' spans reach it rewritten into loopscope's conventions
(:mod:`loopscope.ingest.foreign`).

:func:`collect` reads each span once and keeps a plain tuple of each row's values (a
*fact*), made of local names that are the row type's field names, in its order
(:class:`~loopscope.storage.rows.EventFact`, :class:`~loopscope.storage.rows.TurnFact`; a
test checks the names against the fields); :func:`add_spans` collects spans a chunk at a
time into a :class:`~loopscope.storage.rows.Facts` batch, which the store makes rows
from in SQL. Whatever the facts cannot express (a tool outcome that is not a string, a
round's text that is not a string) gets its content from the plain Python mapping at the
end of this module (:func:`_tool_content`, :func:`text_content`), carried in the fact as
an override, so every value gives the row it always gave.

``SPANS`` is this mapping as the writer takes it (:class:`~loopscope.storage.rows.SpanMapping`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from typing import Any

from .. import _json, _otel_sdk, pricing
from .. import semconv as a
from .._guard import internal_error
from .._segments import RESPONSE_SEGMENT_SEPARATOR
from ..storage.rows import (
    CHUNK,
    END,
    INPUT_MESSAGE,
    MODEL_ERROR,
    PAUSE_EVERY,
    ROUND_MESSAGE,
    START,
    STATE_DELTA,
    STATE_SNAPSHOT,
    TOOL_END,
    TOOL_START,
    Facts,
)


def _plain(attrs: Any) -> dict[str, Any]:
    """The attributes as a plain dict, so that every lookup is a C-level ``dict.get``."""
    if attrs is None:
        return {}
    if type(attrs) is dict:
        return attrs
    bounded = _otel_sdk.attributes_dict(attrs)  # an SDK span's attributes: their own dict
    if bounded is not None:
        return bounded
    try:
        copied = attrs.copy()
    except Exception:
        copied = None
    return copied if type(copied) is dict else dict(attrs)


def collect(items: Iterable[tuple[int, Any]], events: list[tuple[Any, ...]], turns: list[tuple[Any, ...]],
            skip: frozenset[str] = frozenset(), calls: list[tuple[Any, ...]] | None = None,
            fixes: list[tuple[Any, ...]] | None = None, scores: list[tuple[Any, ...]] | None = None) -> int:
    """Append the facts of each ``(kind, span)`` pair (kind 0: started, 1: ended) to
    ``events``, ``turns`` and ``calls`` (a model call per ended ``chat`` span; left out
    when None), in order; rows of the event types in ``skip`` are left out. ``fixes``
    gets the tool calls a ``tool_outcome_correction`` span says failed (a
    :class:`~loopscope.storage.rows.ToolFix` each; left out when None), ``scores`` the scores
    of ``gen_ai.evaluation.result`` spans (a :class:`~loopscope.storage.rows.ScoreFact` each).

    Returns how many rows were left out. A span whose facts cannot be read (a foreign
    span without times or ids, say) yields no row, and the failure is reported.
    """
    keep_start = "tool_call_start" not in skip
    keep_end = "tool_call_end" not in skip
    keep_message = "message" not in skip
    keep_error = "model_error" not in skip
    add = events.append
    excluded = 0
    fields = _otel_sdk.span_fields()  # the SDK's spans, read through their fields: no property frames
    fast, bounded, bounded_dict = fields.types, fields.bounded, fields.bounded_dict
    attributes_of, context_of, start_of, end_of = fields.attributes, fields.context, fields.start_time, fields.end_time
    # this loop runs per span over spans long gone cold: names are bound to locals once
    OPERATION, EXECUTE_TOOL, CHAT, INVOKE_AGENT = a.OPERATION, a.OP_EXECUTE_TOOL, a.OP_CHAT, a.OP_INVOKE_AGENT
    CONVERSATION_ID, TURN_ID, AGENT_NAME = a.CONVERSATION_ID, a.TURN_ID, a.AGENT_NAME
    PROVIDER, FRAMEWORK, TURN_PROVIDER = a.PROVIDER, a.FRAMEWORK, a.TURN_PROVIDER
    CALL_OUTCOME, ERROR_TYPE = a.CALL_OUTCOME, a.ERROR_TYPE
    TOOL_NAME, TOOL_CALL_ID = a.TOOL_NAME, a.TOOL_CALL_ID
    TOOL_CALL_ARGUMENTS, TOOL_CALL_RESULT = a.TOOL_CALL_ARGUMENTS, a.TOOL_CALL_RESULT
    TOOL_OUTCOME, TOOL_STATUS, TOOL_ERROR = a.TOOL_OUTCOME, a.TOOL_STATUS, a.TOOL_ERROR
    ROUND_TEXT, ROUND_BLOCKED = a.ROUND_TEXT, a.ROUND_BLOCKED
    TURN_INPUT, TURN_INPUT_BLOCKED, CONTENT_WITHHELD = a.TURN_INPUT, a.TURN_INPUT_BLOCKED, a.CONTENT_WITHHELD
    STATE_KIND, STATE_VALUE, STATE_KINDS = a.STATE_KIND, a.STATE_VALUE, a.STATE_KINDS
    TOOL_CORRECTION, EVALUATION_NAME = a.TOOL_CORRECTION, a.EVALUATION_NAME
    last_tid: Any = None
    trace_id = b""
    for kind, span in items:
        after = None  # a row that follows this span's own (a failed call's, after its text)
        try:
            if type(span) in fast:
                attrs = attributes_of(span)
                d = bounded_dict(attrs) if type(attrs) is bounded else _plain(attrs)
                ctx = context_of(span)
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
                trace_id = tid.to_bytes(16, "big")
                last_tid = tid
            get = d.get
            op = get(OPERATION)
            # each branch sets the fields of its row (named as EventFact's), or ends with no row
            if op == EXECUTE_TOOL:
                if not (keep_start if kind == START else keep_end):
                    excluded += 1
                    continue
                tool_name = get(TOOL_NAME, "")
                if type(tool_name) is not str:
                    tool_name = str(tool_name)
                tool_id = get(TOOL_CALL_ID, "")
                if type(tool_id) is not str:
                    tool_id = str(tool_id)
                arguments = get(TOOL_CALL_ARGUMENTS)
                if arguments is not None and type(arguments) is not str:
                    arguments = _text_or_json(arguments)
                blocked, body = False, None
                if kind == START:
                    code = TOOL_START
                    created_us = (start_of(span) if sdk else span.start_time) // 1000
                    result = tool_status = outcome = error = duration_ms = content = None
                else:
                    start, end = (start_of(span), end_of(span)) if sdk else (span.start_time, span.end_time)
                    code, created_us = TOOL_END, end // 1000
                    duration_ms = round((end - start) / 1e6, 3)
                    result = get(TOOL_CALL_RESULT)
                    if result is not None and type(result) is not str:
                        result = _text_or_json(result)
                    outcome = get(TOOL_OUTCOME) or "served"
                    tool_status = get(TOOL_STATUS) or ("completed" if outcome == "served" else "failed")
                    error = get(TOOL_ERROR)
                    content = None
                    if type(outcome) is not str or type(tool_status) is not str or (error is not None and type(error) is not str):
                        content = _tool_content(d, True, duration_ms)
            elif op == CHAT:
                if kind != END:
                    continue
                if calls is not None:
                    start, end = (start_of(span), end_of(span)) if sdk else (span.start_time, span.end_time)
                    calls.append(_call_fact(span, d, tid, trace_id, sid, start, end))
                outcome = get(CALL_OUTCOME)
                if outcome == "error" or (outcome is None and get(ERROR_TYPE)):  # the call failed: a row says so
                    if keep_error:
                        after = _error_fact(span, d, sdk, tid, trace_id, sid)
                    else:
                        excluded += 1
                body = get(ROUND_TEXT)
                if not body:
                    if not get(CONTENT_WITHHELD):
                        if after is not None:
                            events.append(after)
                        continue
                    body = ""  # said, not captured: the row without its text
                if not keep_message:
                    excluded += 1
                    if after is not None:
                        events.append(after)
                    continue
                content = None
                if type(body) is not str:
                    content, body = text_content(body, "assistant"), ""
                code = ROUND_MESSAGE
                created_us = (end_of(span) if sdk else span.end_time) // 1000
                blocked = bool(get(ROUND_BLOCKED))
                tool_name = tool_id = arguments = result = tool_status = outcome = error = duration_ms = None
            elif op == INVOKE_AGENT:
                if kind == END:
                    start, end = (start_of(span), end_of(span)) if sdk else (span.start_time, span.end_time)
                    turns.append(_turn_fact(span, d, tid, trace_id, sid, start, end))
                    continue
                if TURN_INPUT not in d:
                    if not get(CONTENT_WITHHELD):
                        continue
                    d = {**d, TURN_INPUT: ""}  # said, not captured: the row without its text
                if not keep_message:
                    excluded += 1
                    continue
                body = d[TURN_INPUT]
                if type(body) is not str:
                    body = str(body) if isinstance(body, str) else _json.dumps(body)
                code = INPUT_MESSAGE
                created_us = (start_of(span) if sdk else span.start_time) // 1000
                blocked = bool(get(TURN_INPUT_BLOCKED))
                tool_name = tool_id = arguments = result = tool_status = outcome = error = duration_ms = content = None
            elif STATE_KIND in d:  # a state snapshot or delta: no GenAI operation, ended at once
                if kind != END:
                    continue
                state_type = STATE_KINDS.get(d[STATE_KIND])  # present: checked above
                value = get(STATE_VALUE)
                if state_type is None or value is None:
                    continue  # an unknown kind, or a value left out on export (content capture off)
                if state_type in skip:
                    excluded += 1
                    continue
                code = STATE_SNAPSHOT if state_type == "state_snapshot" else STATE_DELTA
                created_us = (end_of(span) if sdk else span.end_time) // 1000
                blocked = False
                content = _state_content(code, value)
                tool_name = tool_id = arguments = result = tool_status = outcome = error = duration_ms = body = None
            elif TOOL_CORRECTION in d:  # a served tool call the next request marked failed: no row of its own
                if kind == END and fixes is not None and "tool_call_end" not in skip:
                    fixes.append(_fix(span, d, sdk, tid))
                continue
            elif EVALUATION_NAME in d:  # a score (loopscope.score, gen_ai.evaluation.result): a table of its own
                if kind == END and scores is not None:
                    scores.append(score_fact(span, d, sdk, tid, sid))
                continue
            else:
                continue
            session_id = get(CONVERSATION_ID) or f"{tid:032x}"
            if type(session_id) is not str:
                session_id = str(session_id)
            span_id = sid.to_bytes(8, "big")
            correlation_id, source_channel_id = get(TURN_ID), get(AGENT_NAME)
            source_provider, source_framework = get(PROVIDER), get(FRAMEWORK)
            if source_provider is None:  # an invoke_agent span carries it under loopscope.* (current conventions)
                source_provider = get(TURN_PROVIDER)
            # a plain tuple, in EventFact's field order: it costs a fifth of a call that names
            # them (tests/storage/test_rows.py checks that these names are its fields, in order)
            add((
                code, trace_id, span_id, created_us, session_id, correlation_id, source_channel_id, source_provider,
                source_framework, blocked, tool_name, tool_id, arguments, result, tool_status, outcome, error,
                duration_ms, body, content,
            ))
            if after is not None:
                events.append(after)
        except Exception:  # not the guard: a with block per span costs the writer's mapping more than this
            internal_error("span mapping")
    return excluded


def _error_fact(span: Any, d: dict[str, Any], sdk: bool, tid: int, trace_id: bytes, sid: int) -> tuple[Any, ...]:
    """The ``model_error`` row of a failed model call (a ``chat`` span whose outcome is
    ``error``), at its end: which model, what error, how long it took. The timeline and
    ``tail`` read the log, where the call would otherwise leave no trace (its
    ``model_calls`` row is not part of the log)."""
    get = d.get
    fields = _otel_sdk.span_fields()
    start, end = (fields.start_time(span), fields.end_time(span)) if sdk else (span.start_time, span.end_time)
    error_type = get(a.ERROR_TYPE)
    message = get(a.CALL_ERROR)
    if message is None:
        message = getattr(span.status, "description", None)
    content = _json.dumps({
        "type": "model_error",
        "model": get(a.RESPONSE_MODEL) or get(a.REQUEST_MODEL),
        "error_type": error_type if error_type is None or type(error_type) is str else str(error_type),
        "error": message if message is None or type(message) is str else str(message),
        "duration_ms": round((end - start) / 1e6, 3),
    })
    session_id = get(a.CONVERSATION_ID) or f"{tid:032x}"
    if type(session_id) is not str:
        session_id = str(session_id)
    # in EventFact's field order, named as its fields (tests/storage/test_rows.py)
    code, span_id, created_us, blocked = MODEL_ERROR, sid.to_bytes(8, "big"), end // 1000, False
    correlation_id, source_channel_id = get(a.TURN_ID), get(a.AGENT_NAME)
    source_provider, source_framework = get(a.PROVIDER), get(a.FRAMEWORK)
    tool_name = tool_id = arguments = result = tool_status = outcome = error = duration_ms = body = None
    return (
        code, trace_id, span_id, created_us, session_id, correlation_id, source_channel_id, source_provider,
        source_framework, blocked, tool_name, tool_id, arguments, result, tool_status, outcome, error,
        duration_ms, body, content,
    )


def _fix(span: Any, d: dict[str, Any], sdk: bool, tid: int) -> tuple[Any, ...]:
    """The :class:`~loopscope.storage.rows.ToolFix` of a ``tool_outcome_correction`` span: which
    call (its session, turn and id) is ``failed``, with what error, said when, and since when
    its row is (the span starts where the call's span ended)."""
    get = d.get
    session_id = get(a.CONVERSATION_ID) or f"{tid:032x}"
    correlation_id, tool_id, error = get(a.TURN_ID), get(a.TOOL_CALL_ID, ""), get(a.TOOL_ERROR)
    fields = _otel_sdk.span_fields()
    start, end = (fields.start_time(span), fields.end_time(span)) if sdk else (span.start_time, span.end_time)
    created_us, since_us = end // 1000, start // 1000
    return (
        session_id if type(session_id) is str else str(session_id),
        correlation_id if correlation_id is None or type(correlation_id) is str else str(correlation_id),
        tool_id if type(tool_id) is str else str(tool_id),
        "" if error is None else error if type(error) is str else str(error),
        created_us,
        since_us,
    )


def _optional_text(value: Any) -> str | None:
    return None if value is None or value == "" else value if type(value) is str else _json.to_text(value)


def _score_value(value: Any) -> float | None:
    """A score's value as a finite number (another instrumentation's may be text, ``"0.8"``), else None."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def score_fact(span: Any, d: dict[str, Any], sdk: bool, tid: int, sid: int) -> tuple[Any, ...]:
    """The :class:`~loopscope.storage.rows.ScoreFact` of a ``gen_ai.evaluation.result`` span
    (:func:`loopscope.score`'s, or one :mod:`loopscope.ingest.scores` made of another
    instrumentation's event): the evaluation's attributes and the ids of what it scores."""
    get = d.get
    seq = get(a.SCORE_SEQ)
    id = f"{tid:032x}{sid:016x}" + (f"-{seq}" if seq else "")  # named as the row's field
    created_us = (_otel_sdk.span_fields().end_time(span) if sdk else span.end_time) // 1000
    name = _optional_text(get(a.EVALUATION_NAME)) or ""
    value = _score_value(get(a.EVALUATION_SCORE_VALUE))
    label, explanation = _optional_text(get(a.EVALUATION_SCORE_LABEL)), _optional_text(get(a.EVALUATION_EXPLANATION))
    source = _optional_text(get(a.SCORE_SOURCE))
    target_kind = get(a.SCORE_TARGET_KIND)
    if target_kind not in a.SCORE_TARGET_KINDS:
        target_kind = None
    target_id, response_id = _optional_text(get(a.SCORE_TARGET)), _optional_text(get(a.RESPONSE_ID))
    trace_id, span_id = _optional_text(get(a.SCORE_TRACE_ID)), _optional_text(get(a.SCORE_SPAN_ID))
    session_id, correlation_id = _optional_text(get(a.CONVERSATION_ID)), _optional_text(get(a.TURN_ID))
    agent, error_type = _optional_text(get(a.AGENT_NAME)), _optional_text(get(a.ERROR_TYPE))
    # in ScoreFact's field order, named as its fields
    return (
        id, created_us, name, value, label, explanation, source, target_kind, target_id, trace_id, span_id,
        response_id, session_id, correlation_id, agent, error_type,
    )


def _state_content(code: int, value: Any) -> str:
    """A state row's content: ``{"snapshot": <object>}`` or ``{"delta": [<operations>]}``."""
    text = value if type(value) is str else _text_or_json(value)
    return ('{"snapshot":' if code == STATE_SNAPSHOT else '{"delta":') + _json_text(text) + "}"


def _text_or_json(value: Any) -> str:
    """Text for a JSON-holding attribute that is not a plain str: a str subclass's text,
    or any other value as JSON (which the SQL then keeps as it is)."""
    return str(value) if isinstance(value, str) else _json.dumps(value)


_scan_once = json.JSONDecoder().scan_once  # pyright: ignore[reportAttributeAccessIssue]  # set by JSONDecoder.__init__, not in the stubs


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


def _turn_fact(span: Any, d: dict[str, Any], tid: int, trace_id: bytes, sid: int, start: int, end: int) -> tuple[Any, ...]:
    get = d.get
    correlation_id = get(a.TURN_ID)
    if not correlation_id:
        correlation_id = None  # the span id, in SQL
    elif type(correlation_id) is not str:
        correlation_id = str(correlation_id)
    session_id = get(a.CONVERSATION_ID) or f"{tid:032x}"
    if type(session_id) is not str:
        session_id = str(session_id)
    response_content, segments = _segments(get(a.SEGMENTS))
    thinking = get(a.THINKING) or ""
    if type(thinking) is not str:
        thinking = str(thinking)
    loop_end_reason = get(a.LOOP_END_REASON) or None
    # the usage values as they are: Arrow takes ints (and floats, truncated as int()
    # does); anything else fails the chunk's conversion and _clean reads it as
    # semconv.usage_from_attributes does
    input_tokens, output_tokens = get(a.USAGE_INPUT), get(a.USAGE_OUTPUT)
    cache_read_input_tokens, cache_creation_input_tokens = get(a.USAGE_CACHE_READ), get(a.USAGE_CACHE_CREATION)
    if cache_creation_input_tokens is None:  # the current conventions' spelling, or loopscope's on the agent span
        cache_creation_input_tokens = get(a.TURN_CACHE_WRITE)
        if cache_creation_input_tokens is None:
            cache_creation_input_tokens = get(a.USAGE_CACHE_WRITE)
    if cache_read_input_tokens is None:  # on the agent span, the current conventions have none
        cache_read_input_tokens = get(a.TURN_CACHE_READ)
    reasoning_tokens = get(a.USAGE_REASONING)
    if reasoning_tokens is None:
        reasoning_tokens = get(a.TURN_REASONING)
    usage = None  # made in SQL
    span_id = sid.to_bytes(8, "big")
    channel_id, parent_correlation_id = get(a.AGENT_NAME), get(a.PARENT_TURN_ID)
    tool_calls_count, round_count = int(get(a.TOOL_CALLS_COUNT) or 0), int(get(a.ROUND_COUNT) or 0)
    latency_ms, streaming, timestamp_us = round((end - start) / 1e6, 3), bool(get(a.STREAMING)), end // 1000
    declared_tools = _declared_text(get(a.DECLARED_TOOLS) or "[]")
    model = get(a.RESPONSE_MODEL) or get(a.TURN_MODEL) or get(a.REQUEST_MODEL)
    provider = get(a.PROVIDER) or get(a.TURN_PROVIDER)
    error = _error_text(span, loop_end_reason, get(a.ERROR_TYPE)) if loop_end_reason == "error" else None
    model_call_count = get(a.MODEL_CALL_COUNT)
    if type(model_call_count) is not int:
        model_call_count = None  # the views count the turn's call rows
    # what the turn cost by its own usage: the views use it where the turn has no call rows
    cost_usd, price_source = _price(provider, model, input_tokens, output_tokens, cache_read_input_tokens,
                                    cache_creation_input_tokens, start // 1000)
    # in TurnFact's field order (tests/storage/test_rows.py checks these names against it)
    return (
        trace_id, span_id, correlation_id, session_id, channel_id, parent_correlation_id, response_content, segments,
        tool_calls_count, round_count, input_tokens, output_tokens, cache_read_input_tokens,
        cache_creation_input_tokens, reasoning_tokens, usage, thinking, loop_end_reason, latency_ms, streaming,
        timestamp_us, declared_tools, model, provider, error, model_call_count, cost_usd, price_source,
    )


_price = pricing.price

# finish reasons that say how a call ended, where the span does not (loopscope.call.outcome)
_FINISH_OUTCOMES = {
    "stop": "completed", "tool_calls": "completed", "tool_call": "completed", "end_turn": "completed", "tool_use": "completed",
    "stop_sequence": "completed", "function_call": "completed", "pause_turn": "completed", "completed": "completed",
    "length": "truncated", "max_tokens": "truncated", "max_output_tokens": "truncated", "incomplete": "truncated",
    "content_filter": "content_filter", "refusal": "refusal",
}
_REQUEST_PREFIX = "gen_ai.request."
_PARAMETER_NAMES = {attr: name for name, attr in a.REQUEST_PARAMETERS.items()}
_NOT_PARAMETERS = frozenset((a.REQUEST_MODEL, a.REQUEST_STREAM))
_JSON_PARAMETERS = a.JSON_PARAMETERS

# Spans of one recorder carry the same attribute names in the same order, call after
# call: which of them are request parameters is worked out once per such tuple of names.
_parameter_keys: dict[tuple[str, ...], tuple[tuple[str, str], ...]] = {}


def _parameter_keys_of(keys: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    found = []
    names = _PARAMETER_NAMES
    for key in keys:
        name = names.get(key)
        if name is None:
            if type(key) is not str or not key.startswith(_REQUEST_PREFIX) or key in _NOT_PARAMETERS:
                continue
            name = key[len(_REQUEST_PREFIX):]
        found.append((key, name))
    if len(_parameter_keys) >= 256:
        _parameter_keys.clear()
    made = _parameter_keys[keys] = tuple(found)
    return made


def _parameters(d: dict[str, Any]) -> str | None:
    """The request parameters of a chat span as JSON: every ``gen_ai.request.*`` attribute
    (but the model and streaming, which have columns), the tool choice and the server,
    named as adapters report them (``temperature``, ``max_tokens``, ``tool_choice``, ...)."""
    keys = tuple(d)
    wanted = _parameter_keys.get(keys)
    if wanted is None:
        wanted = _parameter_keys_of(keys)
    if not wanted:
        return None
    found = {}
    for key, name in wanted:
        value = d[key]
        if name in _JSON_PARAMETERS and type(value) is str:  # an object the span carries as JSON text
            try:
                value = _json.parse(value)
            except ValueError:
                pass
        found[name] = list(value) if type(value) is tuple else value
    return _json.dumps(found)


# finish reasons as their JSON text, by value (a few distinct tuples in all)
_reasons_json: dict[Any, str] = {}


def _finish_reasons(reasons: Any) -> str:
    text = _reasons_json.get(reasons) if type(reasons) is tuple else None
    if text is None:
        listed = [reasons] if isinstance(reasons, str) else list(reasons)
        text = _json.dumps(listed)
        if type(reasons) is tuple and len(_reasons_json) < 256:
            _reasons_json[reasons] = text
    return text


# the names _call_fact reads, bound once (a global is one lookup, a module attribute two)
_CONVERSATION_ID, _TURN_ID, _AGENT_NAME, _CALL_POSITION = a.CONVERSATION_ID, a.TURN_ID, a.AGENT_NAME, a.CALL_POSITION
_PROVIDER, _FRAMEWORK, _REQUEST_MODEL, _RESPONSE_MODEL = a.PROVIDER, a.FRAMEWORK, a.REQUEST_MODEL, a.RESPONSE_MODEL
_RESPONSE_ID, _FINISH_REASONS, _REQUEST_STREAM, _TTFC = a.RESPONSE_ID, a.RESPONSE_FINISH_REASONS, a.REQUEST_STREAM, a.TIME_TO_FIRST_CHUNK
_USAGE_INPUT, _USAGE_OUTPUT, _USAGE_CACHE_READ = a.USAGE_INPUT, a.USAGE_OUTPUT, a.USAGE_CACHE_READ
_USAGE_CACHE_CREATION, _USAGE_REASONING, _USAGE_PROVIDER = a.USAGE_CACHE_CREATION, a.USAGE_REASONING, a.USAGE_PROVIDER
_USAGE_CACHE_WRITE = a.USAGE_CACHE_WRITE
_SERVER_ADDRESS, _SERVER_PORT, _WEB_SEARCHES = a.SERVER_ADDRESS, a.SERVER_PORT, a.USAGE_WEB_SEARCHES
_ERROR_TYPE, _CALL_ERROR, _CALL_OUTCOME, _CALL_REFUSAL = a.ERROR_TYPE, a.CALL_ERROR, a.CALL_OUTCOME, a.CALL_REFUSAL
_INPUT_MESSAGES, _OUTPUT_MESSAGES = a.INPUT_MESSAGES, a.OUTPUT_MESSAGES


def _call_fact(span: Any, d: dict[str, Any], tid: int, trace_id: bytes, sid: int, start: int, end: int) -> tuple[Any, ...]:
    """The model call a ``chat`` span's end stands for (a :class:`~loopscope.storage.rows.CallFact`).
    Run once per model call on the writer's thread: every value is read once, plainly."""
    get = d.get
    session_id = get(_CONVERSATION_ID) or f"{tid:032x}"
    if type(session_id) is not str:
        session_id = str(session_id)
    span_id = sid.to_bytes(8, "big")
    correlation_id, agent = get(_TURN_ID), get(_AGENT_NAME)
    position = get(_CALL_POSITION)
    if type(position) is not int:
        position = None  # numbered by start time in the view
    provider, framework = get(_PROVIDER), get(_FRAMEWORK)
    request_model, response_model, response_id = get(_REQUEST_MODEL), get(_RESPONSE_MODEL), get(_RESPONSE_ID)
    reasons = get(_FINISH_REASONS)
    finish_reasons = None if reasons is None else _finish_reasons(reasons)
    streaming = get(_REQUEST_STREAM)
    if streaming is not None:
        streaming = bool(streaming)
    started_us, ended_us, duration_ms = start // 1000, end // 1000, round((end - start) / 1e6, 3)
    ttfc = get(_TTFC)
    time_to_first_chunk_ms = None
    if ttfc is not None and (type(ttfc) is float or type(ttfc) is int):
        time_to_first_chunk_ms = round(ttfc * 1000, 3)
    input_tokens, output_tokens = get(_USAGE_INPUT), get(_USAGE_OUTPUT)
    cache_read_input_tokens, cache_creation_input_tokens = get(_USAGE_CACHE_READ), get(_USAGE_CACHE_CREATION)
    if cache_creation_input_tokens is None:  # the latest conventions' spelling
        cache_creation_input_tokens = get(_USAGE_CACHE_WRITE)
    reasoning_tokens = get(_USAGE_REASONING)
    provider_usage = get(_USAGE_PROVIDER)
    if provider_usage is not None and type(provider_usage) is not str:
        provider_usage = _text_or_json(provider_usage)
    parameters = _parameters(d)
    error_type = get(_ERROR_TYPE)
    error = get(_CALL_ERROR)
    if error is None and error_type:
        error = getattr(span.status, "description", None)
    if error is not None and type(error) is not str:
        error = str(error)
    outcome = get(_CALL_OUTCOME)
    if outcome is None:  # a span from before the outcome attribute (or a foreign one): what it says
        if error_type:
            outcome = "error"
        elif reasons:
            outcome = _FINISH_OUTCOMES.get(reasons if type(reasons) is str else str(reasons[0]))
    refusal = get(_CALL_REFUSAL)
    input_messages, output_messages = get(_INPUT_MESSAGES), get(_OUTPUT_MESSAGES)
    if input_messages is not None and type(input_messages) is not str:
        input_messages = _text_or_json(input_messages)
    if output_messages is not None and type(output_messages) is not str:
        output_messages = _text_or_json(output_messages)
    cost_usd = price_source = None
    if input_tokens is not None or output_tokens is not None:  # nothing to price without usage
        # the model that answered, the requested one only when the response named none: a
        # gateway's answer from another model is never priced as the model asked for
        cost_usd, price_source = _price(provider, response_model or request_model, input_tokens, output_tokens,
                                        cache_read_input_tokens, cache_creation_input_tokens, started_us,
                                        get(_SERVER_ADDRESS), get(_SERVER_PORT), get(_WEB_SEARCHES))
    # in CallFact's field order (tests/storage/test_rows.py checks these names against it)
    return (
        trace_id, span_id, session_id, correlation_id, position, provider, framework, agent, request_model,
        response_model, response_id, finish_reasons, outcome, streaming, started_us, ended_us, duration_ms,
        time_to_first_chunk_ms, input_tokens, output_tokens, cache_read_input_tokens, cache_creation_input_tokens,
        reasoning_tokens, provider_usage, parameters, error_type, error, refusal, input_messages, output_messages,
        cost_usd, price_source,
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
        calls: list[tuple[Any, ...]] = []
        fixes, scores = facts.fixes, facts.scores  # rare: plain tuples, kept in order
        excluded = 0
        if pause is None:
            excluded += collect(items[i:i + CHUNK], events, turns, skip, calls, fixes, scores)
        else:
            for j in range(i, min(i + CHUNK, len(items)), PAUSE_EVERY):
                excluded += collect(items[j:j + PAUSE_EVERY], events, turns, skip, calls, fixes, scores)
                pause()
        facts.append(events, turns, excluded, calls)


def row_counts(kind: int, attributes: Any, skip: frozenset[str] = frozenset()) -> tuple[int, int]:
    """How many event rows and turn rows :func:`collect` makes of one ``(kind, span)`` whose
    attributes are ``attributes`` (rows of the event types in ``skip`` left out): what a
    writer counts as lost when it loses the span before its mapping, so that every loss is
    counted as the store would have held it (events and turns), never in spans. The same
    branches as :func:`collect`, reading only what decides whether a row is made
    (tests/ingest/test_mapping.py checks the two agree)."""
    d = _plain(attributes)
    get = d.get
    op = get(a.OPERATION)
    if op == a.OP_EXECUTE_TOOL:
        return (0 if ("tool_call_start" if kind == START else "tool_call_end") in skip else 1), 0
    if op == a.OP_CHAT:
        if kind != END:
            return 0, 0
        outcome = get(a.CALL_OUTCOME)
        failed = (outcome == "error" or (outcome is None and get(a.ERROR_TYPE))) and "model_error" not in skip
        text = bool(get(a.ROUND_TEXT) or get(a.CONTENT_WITHHELD)) and "message" not in skip
        return int(bool(failed)) + int(text), 0
    if op == a.OP_INVOKE_AGENT:
        if kind == END:
            return 0, 1
        return int((a.TURN_INPUT in d or bool(get(a.CONTENT_WITHHELD))) and "message" not in skip), 0
    if a.STATE_KIND in d:
        state_type = a.STATE_KINDS.get(d[a.STATE_KIND])
        if kind != END or state_type is None or get(a.STATE_VALUE) is None or state_type in skip:
            return 0, 0
        return 1, 0
    return 0, 0


def span_rows(kind: int, span: Any, skip: frozenset[str] = frozenset()) -> tuple[int, int]:
    """:func:`row_counts` of a span (an SDK span or any object with ``attributes``);
    (0, 0) for one whose attributes cannot be read."""
    try:
        return row_counts(kind, span.attributes, skip)
    except Exception:
        return 0, 0


def facts_of(items: list[tuple[int, Any]]) -> Facts:
    """The facts of ``(kind, span)`` pairs, as a new batch."""
    facts = Facts()
    add_spans(facts, items)
    return facts


SPAN_BYTES = 3_072
"""What a queued span counts against the writer's byte bound beyond its text attributes: an
SDK span of loopscope's holds ~2.9 KB besides its text (its attribute dict and their keys,
context, status, resource and scope references, its lock), measured with tracemalloc on the
spans of a two-call tool loop (3.4 KB a span in all, ~0.5 KB of it text). At 256 the
bound counted a quarter of what a queue of small spans held: 200k spans took 0.6-1 GB."""


def span_size(span: Any) -> int:
    """What a queued span counts against the writer's byte bound: the lengths of its text
    attributes (the content: messages, tool arguments and results) and :data:`SPAN_BYTES`.
    Cheap: a span's own attribute dict, read once."""
    values = _otel_sdk.attribute_values(span)
    if values is None:
        attributes = getattr(span, "attributes", None)
        if type(attributes) is not dict:
            return SPAN_BYTES  # no span of ours: its size is unknown, the count bound holds it
        values = attributes.values()  # a SpanRecord: a foreign span's, or one cut (big_values.py)
    size = SPAN_BYTES
    for value in values:
        if type(value) is str:
            size += len(value)
    return size
