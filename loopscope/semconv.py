"""Attribute names on the spans loopscope emits and reads.

GenAI names follow the OpenTelemetry semantic conventions for generative AI; the
``loopscope.*`` names carry what those conventions do not have (yet): why the loop
ended, the turn's text segments, a tool call's outcome, where a declared tool came from.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, SupportsInt, cast

from . import _json

# operation names (gen_ai.operation.name values)
OP_INVOKE_AGENT = "invoke_agent"
OP_CHAT = "chat"
OP_EXECUTE_TOOL = "execute_tool"

# GenAI semantic conventions
OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
AGENT_NAME = "gen_ai.agent.name"
AGENT_ID = "gen_ai.agent.id"
CONVERSATION_ID = "gen_ai.conversation.id"
REQUEST_MODEL = "gen_ai.request.model"
REQUEST_STREAM = "gen_ai.request.stream"
RESPONSE_MODEL = "gen_ai.response.model"
RESPONSE_ID = "gen_ai.response.id"
RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
USAGE_INPUT = "gen_ai.usage.input_tokens"
USAGE_OUTPUT = "gen_ai.usage.output_tokens"
USAGE_CACHE_READ = "gen_ai.usage.cache_read.input_tokens"
USAGE_CACHE_CREATION = "gen_ai.usage.cache_creation.input_tokens"
USAGE_REASONING = "gen_ai.usage.reasoning.output_tokens"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
TOOL_DEFINITIONS = "gen_ai.tool.definitions"
SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
TOOL_DESCRIPTION = "gen_ai.tool.description"
TOOL_CALL_ARGUMENTS = "gen_ai.tool.call.arguments"
TOOL_CALL_RESULT = "gen_ai.tool.call.result"
ERROR_TYPE = "error.type"

# loopscope's own
TURN_ID = "loopscope.turn.id"
PARENT_TURN_ID = "loopscope.turn.parent_id"
FRAMEWORK = "loopscope.framework"
LOOP_END_REASON = "loopscope.turn.loop_end_reason"
SEGMENTS = "loopscope.turn.segments"
ROUND_COUNT = "loopscope.turn.round_count"
TOOL_CALLS_COUNT = "loopscope.turn.tool_calls_count"
DECLARED_TOOLS = "loopscope.turn.declared_tools"
THINKING = "loopscope.turn.thinking"
STREAMING = "loopscope.turn.streaming"
TURN_INPUT = "loopscope.turn.input"
TURN_INPUT_BLOCKED = "loopscope.turn.input_blocked"
ROUND_TEXT = "loopscope.round.text"
ROUND_BLOCKED = "loopscope.round.blocked"
TOOL_STATUS = "loopscope.tool.status"
TOOL_OUTCOME = "loopscope.tool.outcome"
TOOL_ERROR = "loopscope.tool.error"
CALL_POSITION = "loopscope.call.position"
"""On a ``chat`` span: the model call's place in its turn, from 1 (the turn's first model
call is 1). Not the round count: see :data:`ROUND_COUNT` and :data:`MODEL_CALL_COUNT`."""
CALL_OUTCOME = "loopscope.call.outcome"
"""On a ``chat`` span: how the model call ended, one of :data:`CALL_OUTCOMES`."""
CALL_OUTCOMES = ("completed", "truncated", "refusal", "content_filter", "error", "cancelled")
"""``completed``: the model answered (text, tool calls, or both); ``truncated``: cut at the
token limit; ``refusal``: the model refused (a structured-output refusal, Anthropic's
``refusal`` stop reason); ``content_filter``: the provider's filter withheld the answer;
``error``: the call raised, or an HTTP 200 carried an error body; ``cancelled``: the
stream was closed (or the call abandoned) before it ended."""
CALL_REFUSAL = "loopscope.call.refusal"
"""On a ``chat`` span: the model's refusal text (content: kept under the content policy;
:data:`CALL_OUTCOME` says ``refusal`` either way)."""
CALL_ERROR = "loopscope.call.error"
"""On a ``chat`` span: the error text of a call that failed, when the span status cannot
carry it (an HTTP 200 whose body is an error); the status description otherwise."""
USAGE_PROVIDER = "loopscope.usage.provider"
"""On a ``chat`` span: the provider's own usage figures as it reported them, JSON text
(``{"input_tokens": 3, "cache_read_input_tokens": 1111, ...}``). The ``gen_ai.usage.*``
attributes are normalized: input tokens include cached ones on every provider, as the
GenAI conventions say they SHOULD."""
REQUEST_TOOL_CHOICE = "loopscope.request.tool_choice"
"""On a ``chat`` span: the request's tool choice (``auto``, ``required``, a tool name...)."""
TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"
"""On a streamed ``chat`` span: seconds from the request to the first chunk."""
MODEL_CALL_COUNT = "loopscope.turn.model_call_count"
"""On an ``invoke_agent`` span: how many model calls the turn made. :data:`ROUND_COUNT`
keeps RoomKit's meaning (tool rounds: model calls that asked for tools)."""
USAGE_INVALID = "loopscope.usage.invalid"
"""On a ``chat`` (or ``invoke_agent``) span: the usage values the application reported that
are not token counts (see :func:`token_count`), as JSON text ``{"key": "<the value as
text>"}``; they are left out of the usage."""
STATE_KIND = "loopscope.state.kind"
"""On a ``state_snapshot`` / ``state_delta`` span (no ``gen_ai.operation.name``: it is not
a GenAI operation): ``snapshot`` or ``delta``."""
STATE_VALUE = "loopscope.state.value"
"""On a state span: the snapshot object, or the JSON Patch operations of a delta, as JSON
text. Content: exported only when content capture is on."""
STATE_KINDS = {"snapshot": "state_snapshot", "delta": "state_delta"}
"""``loopscope.state.kind`` values and the event types (and span names) they make."""
PENDING_FOR = "loopscope.pending_for"
"""On a zero-duration copy of a started ``invoke_agent`` / ``execute_tool`` span made at
its start (OTLP carries only ended spans): the real span's id, in hex. The exporter sends
it as a start notice (:data:`NOTICE_EVENT`, a log record); earlier versions sent it as a
span, which a collector still understands."""
PENDING_OPERATION = "loopscope.pending.operation"
"""On a pending copy: the real span's ``gen_ai.operation.name``, which the copy does not
carry itself (a tracing backend must not count it as a second agent run or tool call)."""
PENDING_SENT = "loopscope.pending_sent"
"""On a real span whose start notice was queued for export."""
NOTICE_EVENT = "loopscope.span.start"
"""The ``event_name`` of an OTLP log record that says a span started (a *start notice*,
see :mod:`loopscope.export.notices`): its ``trace_id`` / ``span_id`` are the span's, its
time the span's start, its attributes the span's start attributes."""
NOTICE_SPAN_NAME = "loopscope.span.name"
"""On a start notice: the started span's name."""
NOTICE_BEFORE = "loopscope.notice.before"
"""On a start notice: the span (trace id and span id in hex, 48 digits) that comes next in
the export batch both belong to (it ended after this span started); none when no span
follows it there (the span is still running). A collector writes the start rows right
before that span's rows, with them: the order the process saw, although notices and spans
travel in separate requests."""
NOTICE_AFTER = "loopscope.notice.after"
"""On a start notice that no span follows in a batch that has spans: the batch's last span
(as :data:`NOTICE_BEFORE`). A collector writes the start rows right after that span's."""

USAGE_ATTRIBUTES = {
    "input_tokens": USAGE_INPUT,
    "output_tokens": USAGE_OUTPUT,
    "cache_read_input_tokens": USAGE_CACHE_READ,
    "cache_creation_input_tokens": USAGE_CACHE_CREATION,
    "reasoning_tokens": USAGE_REASONING,
}
"""Usage keys of :class:`~loopscope.AIResponseEvent` and the span attributes that carry them."""


def turn_summary_attributes(summary: Any) -> dict[str, Any]:
    """The ``invoke_agent`` span attributes that carry a turn's :class:`AIResponseEvent`."""
    tools = summary.declared_tools
    return turn_attributes(
        summary.loop_end_reason.value if summary.loop_end_reason else "",
        _json.dumps(summary.segments),
        summary.round_count,
        summary.tool_calls_count,
        summary.streaming,
        _json.dumps([t.model_dump(exclude_none=True) for t in tools]),
        _json.dumps([t.model_dump(exclude={"origin"}, exclude_none=True) for t in tools]) if tools else None,
        summary.response_content,
        summary.thinking,
        summary.model,
        summary.provider,
        summary.usage,
        model_call_count=summary.model_call_count,
    )


def turn_attributes(
    loop_end_reason: str,
    segments_json: str,
    round_count: int,
    tool_calls_count: int,
    streaming: bool,
    declared_tools_json: str,
    tool_definitions_json: str | None,
    response_content: str,
    thinking: str,
    model: str | None,
    provider: str | None,
    usage: Mapping[str, int],
    *,
    model_call_count: int | None = None,
    input_messages_json: str | None = None,
) -> dict[str, Any]:
    """:func:`turn_summary_attributes` from the summary's plain values (the JSON ones encoded).

    ``input_messages_json``: what the agent was given, as ``gen_ai.input.messages``. The
    response is the output message, its ``finish_reason`` said by the loop end reason
    (:func:`turn_finish_reason`), as the GenAI message schema requires."""
    attributes: dict[str, Any] = {
        LOOP_END_REASON: loop_end_reason,
        SEGMENTS: segments_json,
        ROUND_COUNT: round_count,
        TOOL_CALLS_COUNT: tool_calls_count,
        STREAMING: streaming,
        DECLARED_TOOLS: declared_tools_json,
    }
    if tool_definitions_json is not None:
        attributes[TOOL_DEFINITIONS] = tool_definitions_json
    if input_messages_json is not None:
        attributes[INPUT_MESSAGES] = input_messages_json
    if response_content:
        attributes[OUTPUT_MESSAGES] = _output_text_json(response_content, turn_finish_reason(loop_end_reason))
    if thinking:
        attributes[THINKING] = thinking
    if model:
        attributes[RESPONSE_MODEL] = model
    if provider:
        attributes[PROVIDER] = provider
    for key, value in usage.items():
        attr = USAGE_ATTRIBUTES.get(key)
        if attr:
            attributes[attr] = value
    if model_call_count is not None:
        attributes[MODEL_CALL_COUNT] = model_call_count
    return attributes


_TURN_FINISH = {"completed": "stop", "truncated": "length", "content_filter": "content_filter", "error": "error"}


def turn_finish_reason(loop_end_reason: str) -> str:
    """A turn's output message's ``finish_reason``: the GenAI value where one fits the
    loop end reason (``completed`` -> ``stop``, ``truncated`` -> ``length``,
    ``content_filter``, ``error``), else the loop end reason itself (``max_rounds``...)."""
    return _TURN_FINISH.get(loop_end_reason) or loop_end_reason or "stop"


def _output_text_json(text: str, finish_reason: str) -> str:
    return _json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": text}], "finish_reason": finish_reason}])


def user_text_json(text: Any) -> str:
    """``gen_ai.input.messages`` of one user message with ``text`` (a turn's input)."""
    return _json.dumps([{"role": "user", "parts": [{"type": "text", "content": text if isinstance(text, str) else _json.to_text(text)}]}])


def system_instructions_json(value: Any) -> str | None:
    """``gen_ai.system_instructions`` (a list of parts) from a request's separate system
    prompt: a text (OpenAI Responses' ``instructions``, Anthropic's ``system``) or a list
    of text blocks (``{"type": "text", "text": ...}``); None when there is none."""
    if isinstance(value, str):
        return _json.dumps([{"type": "text", "content": value}]) if value else None
    if isinstance(value, (list, tuple)):
        parts = []
        for block in value:
            text = block.get("text") if isinstance(block, Mapping) else getattr(block, "text", block if isinstance(block, str) else None)
            if isinstance(text, str):
                parts.append({"type": "text", "content": text})
        return _json.dumps(parts) if parts else None
    return None


MAX_COUNT = (1 << 63) - 1
"""The largest token count (or other count) recorded: an int64, what a store column and an
OTLP integer value hold."""


def token_count(value: Any) -> int | None:
    """``value`` as a count when it unambiguously is one, else None.

    A whole number from 0 to :data:`MAX_COUNT`: an ``int`` (not a ``bool``), an integral
    ``float`` or ``Decimal`` (``12.0`` -> 12), or ASCII digits in text (``"12"`` -> 12).
    NaN, infinity, negative numbers, fractions (``12.5``), other text (``"n/a"``) and
    every other value give None.
    """
    if type(value) is int:
        return value if 0 <= value <= MAX_COUNT else None
    if isinstance(value, bool) or value is None:
        return None
    try:
        if isinstance(value, (str, bytes, bytearray)):
            text = value.strip()
            if not text.isdigit() or not text.isascii() or len(text) > 19:
                return None
            count = int(text)
        elif isinstance(value, numbers.Integral):
            count = int(value)
        elif isinstance(value, (numbers.Real, Decimal)):
            number = cast("SupportsInt", value)  # float, Decimal, Fraction: int() takes them (typeshed's Real does not say)
            if not math.isfinite(value) or value != int(number):
                return None
            count = int(number)
        else:
            return None
    except (TypeError, ValueError, OverflowError, ArithmeticError):
        return None
    return count if 0 <= count <= MAX_COUNT else None


def usage_value(value: Any) -> int | None:
    """A usage attribute of a span as the store reads it: an int as it is, a float cut to
    an int (as Arrow casts it), anything else (NaN and infinity too) None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return int(value)
    return None


def usage_from_attributes(attributes: Mapping[str, Any]) -> dict[str, int]:
    """Token usage keyed as :attr:`AIResponseEvent.usage` is, from GenAI attributes."""
    usage = {}
    for key, attr in USAGE_ATTRIBUTES.items():
        value = usage_value(attributes.get(attr))
        if value is not None:
            usage[key] = value
    return usage


REQUEST_PARAMETERS = {
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "top_k": "gen_ai.request.top_k",
    "max_tokens": "gen_ai.request.max_tokens",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
    "presence_penalty": "gen_ai.request.presence_penalty",
    "seed": "gen_ai.request.seed",
    "stop": "gen_ai.request.stop_sequences",
    "choice_count": "gen_ai.request.choice.count",
    "reasoning_effort": "gen_ai.request.reasoning.level",
    "tool_choice": REQUEST_TOOL_CHOICE,
    "service_tier": "gen_ai.request.service_tier",
    "server_address": "server.address",
    "server_port": "server.port",
}
"""Neutral request parameter names (what adapters report) and their span attributes."""


def request_attributes(request: Mapping[str, Any]) -> dict[str, Any]:
    """Span attributes for the request parameters an adapter reports; others are ignored."""
    out: dict[str, Any] = {}
    for key, value in request.items():
        if value is None:  # most parameters a request could set, it does not
            continue
        attr = REQUEST_PARAMETERS.get(key)
        if attr is None:
            if key == "system_instructions":  # content (under the content policy), in the GenAI schema
                instructions = system_instructions_json(value)
                if instructions is not None:
                    out[SYSTEM_INSTRUCTIONS] = instructions
            continue
        if isinstance(value, int) and not isinstance(value, bool) and not -MAX_COUNT - 1 <= value <= MAX_COUNT:
            out[attr] = _json.to_text(value)  # an OTLP integer is an int64: past it, the number as text
        elif isinstance(value, (str, bool, int, float)):
            out[attr] = value
        elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            out[attr] = tuple(value)
    return out
