"""Foreign GenAI spans -> spans with loopscope's canonical attributes.

Other instrumentations describe the same things with other attributes:

* the official OpenTelemetry GenAI instrumentations (``gen_ai.*``; content in
  ``gen_ai.input.messages`` / ``gen_ai.output.messages``, or in older releases in span
  events such as ``gen_ai.user.message`` and ``gen_ai.choice``);
* OpenLLMetry (Traceloop): the same ``gen_ai.*`` names in current releases, and
  ``gen_ai.prompt.N.*`` / ``gen_ai.completion.N.*`` with ``llm.request.type`` in older
  ones; ``traceloop.span.kind`` (``agent``, ``workflow``, ``tool``) with
  ``traceloop.entity.name`` / ``.input`` / ``.output`` for the decorated functions;
* OpenInference (Arize): ``openinference.span.kind`` (``LLM``, ``TOOL``, ``AGENT``,
  ``CHAIN``), ``llm.model_name``, ``llm.token_count.*``, ``llm.output_messages.N.message.*``,
  ``tool.name``, ``input.value`` / ``output.value``, ``session.id``;
* pydantic-ai: ``invoke_agent`` / ``agent run``, ``chat <model>``, ``execute_tool`` /
  ``running tool`` spans with ``gen_ai.*`` and ``tool_arguments`` / ``tool_response``,
  ``final_result``, ``gen_ai.aggregated_usage.*``. Its output tools (named in a call's
  ``model_request_parameters``; ``final_result`` for an ``output_type``) are how the model
  gives a structured output: declared with origin ``output``, and the call of one is the
  turn's answer (the assistant's message, the output the run returned), not a tool call;
  an output function's run (an ``execute_tool`` span) stays a tool call.

:func:`classify` tells what a span is (an agent run, a model call, a tool call, a
container such as a chain or workflow, or nothing loopscope maps), :func:`normalize`
rewrites one span alone, and :class:`Assembler` groups the spans of an agent run, so
that its model calls and tool calls join its turn (session, turn id, agent name) and its
turn summary counts them. Spans loopscope recorded itself (instrumentation scope
``loopscope``) pass through unchanged.

The result is a span-like :class:`~loopscope.ingest.spans.SpanRecord` that
:mod:`loopscope.ingest.mapping` reads like any span.
"""

from __future__ import annotations

import collections
import functools
import json
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import _json
from .. import semconv as a
from ..models import RESPONSE_SEGMENT_SEPARATOR
from ..storage.rows import END, START
from . import agents_bridges as bridges
from .spans import STATUS_ERROR, SpanRecord, is_own, record_of

AGENT, CONTAINER, CHAT, TOOL = "agent", "container", "chat", "tool"

# frameworks (the events' source_framework)
OTEL_GENAI, OPENLLMETRY, OPENINFERENCE, PYDANTIC_AI = "opentelemetry-genai", "openllmetry", "openinference", "pydantic-ai"


# -- what a span is ----------------------------------------------------------------------------

_OI_KINDS = {"LLM": CHAT, "TOOL": TOOL, "AGENT": AGENT, "CHAIN": CONTAINER}
_TL_KINDS = {"tool": TOOL, "agent": AGENT, "workflow": CONTAINER}
_GENAI_OPS = {
    "chat": CHAT, "text_completion": CHAT, "generate_content": CHAT, "completion": CHAT,
    "execute_tool": TOOL, "invoke_agent": AGENT, "invoke_workflow": CONTAINER,
}
_OPENLLMETRY_SCOPE = re.compile(r"^opentelemetry\.instrumentation\.[a-z_]+\.v\d+$|^traceloop\.")


def classify(span: Any) -> tuple[str | None, str | None]:
    """``(role, framework)``: role is ``agent``, ``container``, ``chat``, ``tool`` or None
    (a span loopscope does not map); framework names the instrumentation."""
    attrs = span.attributes or {}
    scope = getattr(getattr(span, "instrumentation_scope", None), "name", "") or ""
    oi = attrs.get("openinference.span.kind")
    if isinstance(oi, str):
        return _OI_KINDS.get(oi.upper()), OPENINFERENCE
    tl = attrs.get("traceloop.span.kind")
    if isinstance(tl, str):
        return _TL_KINDS.get(tl.lower()), OPENLLMETRY
    framework = PYDANTIC_AI if scope == "pydantic-ai" else OPENLLMETRY if _OPENLLMETRY_SCOPE.match(scope) else OTEL_GENAI
    op = attrs.get(a.OPERATION)
    if isinstance(op, str) and op in _GENAI_OPS:
        return _GENAI_OPS[op], framework
    request_type = attrs.get("llm.request.type")  # OpenLLMetry before the gen_ai.operation.name
    if request_type in ("chat", "completion"):
        return CHAT, OPENLLMETRY
    if scope == "pydantic-ai" or "agent_name" in attrs or "tool_arguments" in attrs:
        name = span.name or ""
        if name == "agent run" or name.endswith(" run") and "agent_name" in attrs:
            return AGENT, PYDANTIC_AI
        if name == "running tool" or name.startswith("running tool:") or "tool_arguments" in attrs:
            return TOOL, PYDANTIC_AI
    if (attrs.get("gen_ai.system") or attrs.get(a.PROVIDER)) and (
        "gen_ai.prompt.0.content" in attrs or "gen_ai.completion.0.content" in attrs
        or any(getattr(e, "name", "").startswith(("gen_ai.choice", "gen_ai.content.")) for e in (getattr(span, "events", None) or ()))
    ):
        return CHAT, framework
    return None, None


# -- reading values --------------------------------------------------------------------------------


def _loads(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def _text(value: Any) -> str | None:
    """A JSON-ish value as text: strings as they are, the rest as JSON."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return _json.dumps(value)


def _first(attrs: Mapping[str, Any], *keys: str) -> Any:
    for key in keys:
        value = attrs.get(key)
        if value is not None and value != "":
            return value
    return None


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return int(value)
    if isinstance(value, str):
        try:
            return int(float(value))
        except ValueError:
            return None
    return None


def _indexed(attrs: Mapping[str, Any], prefix: str) -> list[dict[str, Any]]:
    """Flattened lists (``prefix.0.role``, ``prefix.0.content``, ...) as a list of dicts of
    the rest of each key (``{"role": ..., "content": ...}``), in index order."""
    items: dict[int, dict[str, Any]] = {}
    start = len(prefix) + 1
    for key, value in attrs.items():
        if not key.startswith(prefix) or len(key) <= start or key[start - 1] != ".":
            continue
        head, _, rest = key[start:].partition(".")
        if not head.isdigit():
            continue
        items.setdefault(int(head), {})[rest] = value
    return [items[i] for i in sorted(items)]


# -- messages in the GenAI conventions' JSON (parts), and the older shapes ---------------------


@dataclass
class Messages:
    """What a model call's messages say, in loopscope's terms."""

    text: str = ""  # the assistant's text
    tool_calls: list[tuple[str | None, str, str | None]] = field(default_factory=list)  # (id, name, arguments JSON)
    user_text: str | None = None  # the last user text sent


def _parts_text(parts: Any) -> str:
    out = []
    for part in parts if isinstance(parts, list) else ():
        if isinstance(part, dict) and part.get("type") in ("text", None) and isinstance(part.get("content"), str):
            out.append(part["content"])
    return "".join(out)


def _content_text(content: Any) -> str:
    """OpenAI-style message content: a string, or a list of parts with text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p.get("text") or (p.get("content") if isinstance(p.get("content"), str) else "") or ""
            for p in content if isinstance(p, dict)
        )
    return ""


def _genai_output(value: Any, out: Messages) -> None:
    for message in _loads(value) or ():
        if not isinstance(message, dict) or message.get("role") not in ("assistant", None):
            continue
        out.text += _parts_text(message.get("parts"))
        for part in message.get("parts") or ():
            if isinstance(part, dict) and part.get("type") == "tool_call":
                out.tool_calls.append((part.get("id"), str(part.get("name") or ""), _text(part.get("arguments"))))


def _genai_last_user(value: Any) -> str | None:
    text = None
    for message in _loads(value) or ():
        if isinstance(message, dict) and message.get("role") == "user":
            found = _parts_text(message.get("parts"))
            if found:
                text = found
    return text


def _chat_messages(span: Any) -> Messages:
    attrs = span.attributes or {}
    out = Messages()
    if a.OUTPUT_MESSAGES in attrs:
        _genai_output(attrs[a.OUTPUT_MESSAGES], out)
    elif "llm.output_messages.0.message.role" in attrs or "llm.output_messages.0.message.content" in attrs:
        for message in _indexed(attrs, "llm.output_messages"):
            if message.get("message.role", "assistant") != "assistant":
                continue
            out.text += message.get("message.content") or "".join(
                str(v) for k, v in sorted(message.items()) if k.startswith("message.contents.") and k.endswith("message_content.text")
            )
            for call in _indexed(message, "message.tool_calls"):
                out.tool_calls.append((
                    call.get("tool_call.id"), str(call.get("tool_call.function.name") or ""), _text(call.get("tool_call.function.arguments")),
                ))
    elif "gen_ai.completion.0.content" in attrs or "gen_ai.completion.0.role" in attrs or "gen_ai.completion.0.tool_calls.0.name" in attrs:
        for message in _indexed(attrs, "gen_ai.completion"):
            if message.get("role", "assistant") != "assistant":
                continue
            out.text += _content_text(message.get("content"))
            for call in _indexed(message, "tool_calls"):
                out.tool_calls.append((call.get("id"), str(call.get("name") or ""), _text(call.get("arguments"))))
    else:
        _event_output(span, out)
    # the user's last text
    if a.INPUT_MESSAGES in attrs:
        out.user_text = _genai_last_user(attrs[a.INPUT_MESSAGES])
    elif "llm.input_messages.0.message.role" in attrs:
        for message in _indexed(attrs, "llm.input_messages"):
            if message.get("message.role") == "user":
                # its text whole, or in parts (a Responses input's input_text parts)
                text = message.get("message.content") or "".join(
                    str(v) for k, v in sorted(message.items()) if k.startswith("message.contents.") and k.endswith("message_content.text")
                )
                if text:
                    out.user_text = str(text)
    elif "gen_ai.prompt.0.role" in attrs or "gen_ai.prompt.0.content" in attrs:
        for message in _indexed(attrs, "gen_ai.prompt"):
            if message.get("role", "user") == "user" and message.get("content"):
                out.user_text = _content_text(_loads(message["content"]) if str(message["content"]).startswith("[") else message["content"])
    else:
        for event in getattr(span, "events", None) or ():
            if event.name == "gen_ai.user.message":
                text = _event_body_text(event.attributes)
                if text:
                    out.user_text = text
            elif event.name == "gen_ai.content.prompt":
                for message in _loads(event.attributes.get("gen_ai.prompt")) or ():
                    if isinstance(message, dict) and message.get("role") == "user":
                        out.user_text = _content_text(message.get("content")) or out.user_text
    return out


def _event_body(attributes: Mapping[str, Any]) -> Any:
    """The body of an event carried as a span event: in one JSON attribute, or flattened."""
    for key in ("gen_ai.event.content", "event.body", "body", "message"):
        if key in attributes:
            value = _loads(attributes[key])
            if value is not None:
                return value
    return dict(attributes)


def _event_body_text(attributes: Mapping[str, Any]) -> str:
    body = _event_body(attributes)
    if isinstance(body, dict):
        if "content" in body:
            return _content_text(body["content"])
        message = body.get("message")
        if isinstance(message, dict):
            return _content_text(message.get("content"))
    if isinstance(body, str):
        return body
    return ""


def _event_output(span: Any, out: Messages) -> None:
    for event in getattr(span, "events", None) or ():
        attributes = event.attributes or {}
        if event.name == "gen_ai.choice":
            body = _event_body(attributes)
            message = body.get("message") if isinstance(body, dict) else None
            if not isinstance(message, dict):
                message = {k[len("message."):]: v for k, v in attributes.items() if k.startswith("message.")} or body
            if isinstance(message, dict):
                out.text += _content_text(_loads(message.get("content")) if str(message.get("content", "")).startswith("[") else message.get("content"))
                for call in _loads(message.get("tool_calls")) or ():
                    if isinstance(call, dict):
                        function = call.get("function")
                        if not isinstance(function, dict):
                            function = call
                        out.tool_calls.append((call.get("id"), str(function.get("name") or ""), _text(function.get("arguments"))))
        elif event.name == "gen_ai.content.completion":
            for message in _loads(attributes.get("gen_ai.completion")) or ():
                if isinstance(message, dict) and message.get("role", "assistant") == "assistant":
                    out.text += _content_text(message.get("content"))


# -- model calls, tool calls, agent runs ------------------------------------------------------------


@dataclass
class Chat:
    text: str
    tool_calls: list[tuple[str | None, str, str | None]]  # the calls of tools that run (output tools' are in outputs)
    user_text: str | None
    request_model: str | None
    response_model: str | None
    provider: str | None
    usage: dict[str, int]
    finish_reasons: tuple[str, ...]
    declared: list[dict[str, Any]]
    streaming: bool
    outputs: list[tuple[str | None, str, str | None]] = field(default_factory=list)  # calls of output tools
    answer: str | None = None  # the structured output this call answered with (see Assembler._answers)
    response_id: str | None = None
    stream_said: bool | None = None  # whether the recording said the call streamed (else unknown)
    time_to_first_chunk: float | None = None  # seconds
    parameters: dict[str, Any] = field(default_factory=dict)  # the request's, as span attributes (gen_ai.request.*, ...)

    @property
    def said(self) -> str:
        """The round's text as the assistant's message: its text, then its structured output."""
        if self.answer is None:
            return self.text
        return self.text + RESPONSE_SEGMENT_SEPARATOR + self.answer if self.text else self.answer
    provider_usage: dict[str, int] | None = None  # the figures as read, when normalizing changed them


_USAGE_SOURCES = {
    "input_tokens": ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.token_count.prompt", "llm.usage.prompt_tokens"),
    "output_tokens": ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens", "llm.token_count.completion", "llm.usage.completion_tokens"),
    "cache_read_input_tokens": (
        "gen_ai.usage.cache_read.input_tokens", "gen_ai.usage.cache_read_input_tokens", "llm.token_count.prompt_details.cache_read",
    ),
    "cache_creation_input_tokens": (
        "gen_ai.usage.cache_creation.input_tokens", "gen_ai.usage.cache_write.input_tokens",  # the latest conventions' spelling
        "gen_ai.usage.cache_creation_input_tokens", "llm.token_count.prompt_details.cache_write",
    ),
    "reasoning_tokens": (
        "gen_ai.usage.reasoning.output_tokens", "gen_ai.usage.reasoning_tokens", "gen_ai.usage.details.reasoning_tokens",
        "llm.token_count.completion_details.reasoning",
    ),
}


def _usage(attrs: Mapping[str, Any], prefix: str | None = None) -> dict[str, int]:
    usage = {}
    for key, sources in _USAGE_SOURCES.items():
        if prefix is not None:
            sources = tuple(s.replace("gen_ai.usage.", prefix) for s in sources if s.startswith("gen_ai.usage."))
        value = _int(_first(attrs, *sources))
        if value is not None and (value or key in ("input_tokens", "output_tokens")):
            usage[key] = value
    return usage


def normalized_usage(usage: dict[str, int]) -> tuple[dict[str, int], dict[str, int] | None]:
    """``usage`` with its input tokens including the cached ones, and the figures as read
    when that changed them (else None).

    Instrumentations differ: some report Anthropic's ``input_tokens`` as the API gives them
    (the uncached rest only), others add the cached ones, as the GenAI conventions say.
    Input tokens fewer than the cache read and written are provably the uncached rest: the
    cached ones are added. More could be either; they are taken as normalized already.
    """
    cached = usage.get("cache_read_input_tokens", 0) + usage.get("cache_creation_input_tokens", 0)
    given = usage.get("input_tokens")
    if not cached or given is None or given >= cached:
        return usage, None
    return {**usage, "input_tokens": given + cached}, usage


def _output_tools(attrs: Mapping[str, Any]) -> frozenset[str]:
    """The names of the output tools a pydantic-ai model call was offered (its
    ``model_request_parameters``: ``output_tools``, ``final_result`` by default): calling
    one is how the model gives the run's structured output, not a tool that runs."""
    value = attrs.get("model_request_parameters")
    if not value:
        return frozenset()
    if isinstance(value, str):
        return _output_tools_of(value)  # every call of a run has the same text: parsed once
    return _output_tool_names(value)


@functools.lru_cache(maxsize=64)
def _output_tools_of(text: str) -> frozenset[str]:
    return _output_tool_names(_loads(text))


def _output_tool_names(parameters: Any) -> frozenset[str]:
    tools = parameters.get("output_tools") if isinstance(parameters, dict) else None
    return frozenset(t["name"] for t in tools or () if isinstance(t, dict) and isinstance(t.get("name"), str))


def _declared(attrs: Mapping[str, Any], outputs: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """The tools a model call was offered, as loopscope's declared-tool records (the
    output tools among them with origin ``output``)."""
    tools: list[Any] = []
    definitions = _loads(attrs.get(a.TOOL_DEFINITIONS))
    if isinstance(definitions, list):
        tools = definitions
    else:
        for item in _indexed(attrs, "llm.tools"):
            tools.append(_loads(item.get("tool.json_schema")))
        for item in _indexed(attrs, "llm.request.functions"):  # OpenLLMetry before gen_ai.tool.definitions
            tools.append({"name": item.get("name"), "description": item.get("description"), "parameters": _loads(item.get("parameters"))})
    out = []
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        if isinstance(tool.get("function"), dict):
            tool = tool["function"]
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            continue
        record: dict[str, Any] = {"name": name}
        if isinstance(tool.get("description"), str):
            record["description"] = tool["description"]
        parameters = tool.get("parameters", tool.get("input_schema"))
        if isinstance(parameters, dict):
            record["parameters"] = parameters
        record["origin"] = "output" if name in outputs else "always"
        out.append(record)
    return out


_PARAMETER_ATTRIBUTES = frozenset(a.REQUEST_PARAMETERS.values())
_NOT_PARAMETERS = frozenset((a.REQUEST_MODEL, a.REQUEST_STREAM))
_TTFC_SOURCES = (a.TIME_TO_FIRST_CHUNK, a.METRIC_TIME_TO_FIRST_CHUNK)  # pydantic-ai names it after the metric
_MESSAGES = (a.INPUT_MESSAGES, a.OUTPUT_MESSAGES, a.SYSTEM_INSTRUCTIONS)


def _request_parameters(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The request parameters a model call's span carries, under their attribute names:
    every ``gen_ai.request.*`` (but the model and streaming, which have columns of their
    own), the server, and the tool choice an SDK adapter underneath added."""
    return {
        key: value for key, value in attrs.items()
        if key in _PARAMETER_ATTRIBUTES or (key.startswith("gen_ai.request.") and key not in _NOT_PARAMETERS)
    }


def _reported_usage(attrs: Mapping[str, Any]) -> dict[str, Any] | None:
    """Every usage figure a span reports (``gen_ai.usage.*``), under its own names, its
    ``details.*`` (pydantic-ai's: what the provider's usage object itself held) nested."""
    out: dict[str, Any] = {}
    for key, value in attrs.items():
        if not key.startswith("gen_ai.usage.") or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        name = key[len("gen_ai.usage."):]
        if name.startswith("details."):
            out.setdefault("details", {})[name[len("details."):]] = value
        else:
            out[name] = value
    return out or None


def read_chat(span: Any) -> Chat:
    attrs = span.attributes or {}
    messages = _chat_messages(span)
    # the anthropic SDK's own span (anthropic.messages.create) says its one in anthropic.message.stop_reason
    reasons = attrs.get(a.RESPONSE_FINISH_REASONS) or attrs.get("llm.finish_reason") or attrs.get(ANTHROPIC_STOP_REASON) or ()
    if isinstance(reasons, str):
        listed = _loads(reasons) if reasons.startswith("[") else None  # logfire: the array as one JSON string
        reasons = tuple(r for r in listed if isinstance(r, str)) if isinstance(listed, list) else (reasons,)
    if not reasons:
        reasons = tuple(m.get("finish_reason") for m in _indexed(attrs, "gen_ai.completion") if m.get("finish_reason"))
    if not reasons:
        for event in getattr(span, "events", None) or ():
            if event.name == "gen_ai.choice":
                body = _event_body(event.attributes or {})
                reason = (event.attributes or {}).get("finish_reason") or (body.get("finish_reason") if isinstance(body, dict) else None)
                if reason:
                    reasons = (*reasons, reason)
    usage, provider_usage = normalized_usage(_usage(attrs))
    ttfc = _first(attrs, *_TTFC_SOURCES)
    stream = _first(attrs, a.REQUEST_STREAM, "gen_ai.is_streaming", "llm.is_streaming")
    if stream is None and "llm.invocation_parameters" in attrs:
        # OpenInference says it only in the request's parameters, as sent ({"stream": true})
        parameters = _loads(attrs["llm.invocation_parameters"])
        stream = parameters.get("stream") if isinstance(parameters, dict) else None
    pydantic_ai = _scope(span) == "pydantic-ai"
    if stream is None and ttfc is not None:
        stream = True  # pydantic-ai says a call streamed only by its time to the first chunk
    elif stream is None and pydantic_ai:
        stream = False  # ... and has one for every streamed answer
    if pydantic_ai:
        # pydantic-ai names the figures it read from the provider's usage object, and
        # says "stop" for a Responses answer that calls tools (its status is "completed")
        provider_usage = _reported_usage(attrs) or provider_usage
        if tuple(reasons) == ("stop",) and messages.tool_calls:
            reasons = ("tool_call",)
    output_tools = _output_tools(attrs)
    calls = [c for c in messages.tool_calls if c[1] not in output_tools]
    outputs = [c for c in messages.tool_calls if c[1] in output_tools] if output_tools else []
    return Chat(
        text=messages.text,
        tool_calls=calls,
        user_text=messages.user_text,
        request_model=_first(attrs, a.REQUEST_MODEL, "llm.model_name", "llm.request.model", "model_name"),
        response_model=_first(attrs, a.RESPONSE_MODEL, "llm.model_name", "llm.response.model"),
        provider=_first(attrs, a.PROVIDER, "gen_ai.system", "llm.provider", "llm.system"),
        usage=usage,
        finish_reasons=tuple(str(r) for r in reasons),
        declared=_declared(attrs, output_tools),
        streaming=bool(stream) if isinstance(stream, (bool, int)) else str(stream).lower() == "true",
        outputs=outputs,
        # alone (no agent run to say which output it accepted), the call's answer is what it sent
        answer=outputs[-1][2] if outputs else None,
        provider_usage=provider_usage,
        response_id=_text(_first(attrs, a.RESPONSE_ID, "llm.response.id")) or _openinference_response_id(attrs),
        stream_said=None if stream is None else bool(stream) if isinstance(stream, (bool, int)) else str(stream).lower() == "true",
        time_to_first_chunk=float(ttfc) if isinstance(ttfc, (int, float)) and not isinstance(ttfc, bool) else None,
        parameters=_request_parameters(attrs),
    )


def _openinference_response_id(attrs: Mapping[str, Any]) -> str | None:
    """OpenInference keeps the response's id only in the response itself (``output.value``,
    JSON: a Chat Completion's or a Response's ``id``)."""
    if attrs.get("output.mime_type") != "application/json" or "llm.output_messages.0.message.role" not in attrs:
        return None
    output = _loads(attrs.get("output.value"))
    found = output.get("id") if isinstance(output, dict) else None
    return found if isinstance(found, str) and found else None


def openinference_messages(attrs: Mapping[str, Any], reasons: tuple[str, ...]) -> dict[str, str]:
    """An OpenInference LLM span's flattened messages (``llm.input_messages.N.message.*``,
    ``llm.output_messages.N...``) in the GenAI conventions' JSON, under their attribute names:
    the model-call row's messages, as every other source gives them (read as the Agents
    SDK's OpenInference bridge's are)."""
    out: dict[str, str] = {}
    for prefix, key in (("llm.input_messages", a.INPUT_MESSAGES), ("llm.output_messages", a.OUTPUT_MESSAGES)):
        if f"{prefix}.0.message.role" in attrs:
            reason = (reasons[0] if reasons else None) if key == a.OUTPUT_MESSAGES else None
            out[key] = _json.dumps(bridges.oi_messages(attrs, prefix, reason))
    return out


def _scope(span: Any) -> str:
    return getattr(getattr(span, "instrumentation_scope", None), "name", "") or ""


@dataclass
class ToolCall:
    name: str
    call_id: str | None
    arguments: str | None
    result: str | None
    outcome: str
    error: str | None


def _error_text(span: Any) -> str | None:
    attrs = span.attributes or {}
    kind = attrs.get(a.ERROR_TYPE)
    description = getattr(getattr(span, "status", None), "description", None)
    for event in getattr(span, "events", None) or ():
        if event.name == "exception":
            kind = kind or event.attributes.get("exception.type")
            description = description or event.attributes.get("exception.message")
    if kind and description:
        return f"{kind}: {description}"
    return kind or description


def _failed(span: Any) -> bool:
    status = getattr(span, "status", None)
    code = getattr(status, "status_code", 0)
    return getattr(code, "value", code) == STATUS_ERROR or bool((span.attributes or {}).get(a.ERROR_TYPE))


def _entity_arguments(value: Any) -> str | None:
    """traceloop.entity.input (``{"args": [...], "kwargs": {...}}``) as the call's arguments."""
    data = _loads(value)
    if isinstance(data, dict) and set(data) <= {"args", "kwargs"}:
        args, kwargs = data.get("args") or [], data.get("kwargs") or {}
        if not args:
            return _json.dumps(kwargs)
        if not kwargs and len(args) == 1:
            return _text(args[0])
        return _json.dumps({"args": args, "kwargs": kwargs})
    return _text(value)


_REDACTED = "__REDACTED__"
"""OpenInference's stand-in for an input or output its TraceConfig hides (``OPENINFERENCE_HIDE_INPUTS``
/ ``_OUTPUTS``): content switched off, not the user's text."""
def _unredacted(value: Any) -> Any:
    return None if value == _REDACTED else value


def read_tool(span: Any) -> ToolCall:
    attrs = span.attributes or {}
    name = _first(attrs, a.TOOL_NAME, "tool.name", "traceloop.entity.name")
    if not name:
        span_name = span.name or ""
        message = attrs.get("logfire.msg") or ""
        if isinstance(message, str) and message.startswith("running tool: "):
            name = message[len("running tool: "):]
        elif span_name.startswith("execute_tool "):
            name = span_name[len("execute_tool "):]
        elif span_name.endswith(".tool"):
            name = span_name[: -len(".tool")]
        else:
            name = span_name
    if a.TOOL_CALL_ARGUMENTS in attrs or "tool_arguments" in attrs:
        arguments = _text(_first(attrs, a.TOOL_CALL_ARGUMENTS, "tool_arguments"))
    elif "traceloop.entity.input" in attrs:
        arguments = _entity_arguments(attrs["traceloop.entity.input"])
    else:
        arguments = _text(_unredacted(attrs.get("input.value")))
    result = _unredacted(_first(attrs, a.TOOL_CALL_RESULT, "tool_response", "traceloop.entity.output", "output.value"))
    failed = _failed(span)
    return ToolCall(
        name=str(name),
        call_id=_text(_first(attrs, a.TOOL_CALL_ID, "tool_call.id", "tool.call_id", "tool.id")),
        arguments=arguments,
        result=_text(result),
        outcome="failed" if failed else "served",
        error=_error_text(span) if failed else None,
    )


@dataclass
class AgentRun:
    name: str | None
    input: str | None
    output: str | None
    session: str | None
    usage: dict[str, int]
    model: str | None
    provider: str | None


def session_of(attrs: Mapping[str, Any]) -> str | None:
    value = _first(
        attrs, a.CONVERSATION_ID, "session.id", "traceloop.association.properties.session_id",
        "traceloop.association.properties.conversation_id", "traceloop.association.properties.thread_id",
    )
    return str(value) if value is not None else None


_MESSAGE_KEYS = (
    a.INPUT_MESSAGES, a.OUTPUT_MESSAGES, "llm.input_messages.0.message.role", "llm.input_messages.0.message.content",
    "llm.output_messages.0.message.role", "llm.output_messages.0.message.content",
    "gen_ai.prompt.0.role", "gen_ai.prompt.0.content", "gen_ai.completion.0.role", "gen_ai.completion.0.content",
)
_MESSAGE_EVENTS = frozenset({
    "gen_ai.user.message", "gen_ai.system.message", "gen_ai.assistant.message", "gen_ai.tool.message",
    "gen_ai.choice", "gen_ai.content.prompt", "gen_ai.content.completion",
})


def _captured(span: Any, chat: Chat) -> bool:
    """Whether a model call's messages were captured at all: any text or call read from it, or
    any attribute or event that holds messages (an instrumentation with content off sets none)."""
    if chat.text or chat.tool_calls or chat.outputs or chat.user_text is not None:
        return True
    attrs = span.attributes or {}
    if any(key in attrs for key in _MESSAGE_KEYS):
        return True
    return any(event.name in _MESSAGE_EVENTS for event in getattr(span, "events", None) or ())


def _user_text_withheld(attrs: Mapping[str, Any]) -> bool:
    """Whether a call's ``gen_ai.input.messages`` hold a user message whose parts are there
    without their content (pydantic-ai with ``include_content=False``: ``{"type": "text"}``)."""
    messages = _loads(attrs.get(a.INPUT_MESSAGES))
    if not isinstance(messages, list):
        return False
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "user":
            parts = message.get("parts")
            if isinstance(parts, list) and parts and all(isinstance(p, dict) and "content" not in p for p in parts):
                return True
    return False


ANTHROPIC_STOP_REASON = "anthropic.message.stop_reason"
"""Where the anthropic SDK's own ``anthropic.messages.create`` span keeps the message's stop
reason (it sets no ``gen_ai.response.finish_reasons``)."""

ASKED_TOOLS = frozenset({"tool_calls", "tool_call", "tool_use", "function_call"})
"""Finish reasons of a model call that asked for tools (each provider's spelling)."""


def answer_withheld(span: Any, chat: Chat) -> bool:
    """Whether a model call answered (it asked for no tool and did not fail) with a text its
    instrumentation did not capture: no message read from it at all, or an assistant message
    whose parts are there without their content (pydantic-ai with ``include_content=False``).
    Its row is then kept without text, as loopscope's own spans do."""
    if chat.said or chat.tool_calls or chat.outputs or set(chat.finish_reasons) & ASKED_TOOLS or _failed(span):
        return False
    if not _captured(span, chat):
        return True
    messages = _loads((span.attributes or {}).get(a.OUTPUT_MESSAGES))
    if not isinstance(messages, list):
        return False
    return any(
        isinstance(m, dict) and m.get("role", "assistant") == "assistant" and isinstance(m.get("parts"), list) and m["parts"]
        and all(isinstance(p, dict) and p.get("type") == "text" and "content" not in p for p in m["parts"])
        for m in messages
    )


def input_withheld(run: AgentRun, calls: list[tuple[Any, Chat]]) -> bool:
    """Whether an agent run had a user input its instrumentation did not capture (content
    off): a model call's input messages hold a user message without its content, or the run
    says nothing of its input or output and made model calls (each was asked something),
    none of which carries any message. Then its input is kept as a message row without
    text, as loopscope's own spans do (:data:`loopscope.semconv.CONTENT_WITHHELD`); a run
    with content on but no user text in it keeps no such row."""
    if run.input is not None or not calls:
        return False
    if any(_user_text_withheld(span.attributes or {}) for span, _ in calls):
        return True
    if run.output is not None:
        return False
    return not any(_captured(span, chat) for span, chat in calls)


def read_agent(span: Any) -> AgentRun:
    attrs = span.attributes or {}
    name = _first(attrs, a.AGENT_NAME, "agent_name", "agent.name", "traceloop.entity.name")
    if name is None and attrs.get("openinference.span.kind"):
        name = span.name
    text_in: str | None = None
    if a.INPUT_MESSAGES in attrs:
        text_in = _genai_last_user(attrs[a.INPUT_MESSAGES])
    elif "traceloop.entity.input" in attrs:
        data = _loads(attrs["traceloop.entity.input"])
        if isinstance(data, dict) and set(data) <= {"args", "kwargs"}:
            values = list(data.get("args") or []) + list((data.get("kwargs") or {}).values())
            strings = [v for v in values if isinstance(v, str)]
            text_in = strings[0] if len(strings) == 1 else _entity_arguments(attrs["traceloop.entity.input"])
        else:
            text_in = _text(attrs["traceloop.entity.input"])
    elif "input.value" in attrs:
        value = attrs["input.value"]
        if value != _REDACTED:
            text_in = value if attrs.get("input.mime_type") != "application/json" else _text(value)
    text_out: str | None = None
    if a.OUTPUT_MESSAGES in attrs:
        out = Messages()
        _genai_output(attrs[a.OUTPUT_MESSAGES], out)
        text_out = out.text or None
    else:
        value = _first(attrs, "final_result", "output.value", "traceloop.entity.output")
        if isinstance(value, str) and "traceloop.entity.output" in attrs and value is attrs.get("traceloop.entity.output"):
            decoded = _loads(value)
            value = decoded if isinstance(decoded, str) else value
        text_out = _text(value) if value != _REDACTED else None
    usage = _usage(attrs) or _usage(attrs, "gen_ai.aggregated_usage.")
    return AgentRun(
        name=str(name) if name is not None else None,
        input=text_in,
        output=text_out,
        session=session_of(attrs),
        usage=usage,
        model=_first(attrs, a.RESPONSE_MODEL, a.REQUEST_MODEL, "model_name", "llm.model_name"),
        provider=_first(attrs, a.PROVIDER, "gen_ai.system", "llm.provider", "llm.system"),
    )


# -- canonical attributes ------------------------------------------------------------------------------


def _context_attributes(session: str | None, turn_id: str | None, agent: str | None, framework: str | None) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    if session:
        attrs[a.CONVERSATION_ID] = session
    if turn_id:
        attrs[a.TURN_ID] = turn_id
    if agent:
        attrs[a.AGENT_NAME] = agent
    if framework:
        attrs[a.FRAMEWORK] = framework
    return attrs


def chat_attributes(span: Any, chat: Chat, session: str | None, turn_id: str | None, agent: str | None,
                    framework: str | None) -> dict[str, Any]:
    attrs = {a.OPERATION: a.OP_CHAT, **_context_attributes(session, turn_id, agent, framework)}
    if chat.provider:
        attrs[a.PROVIDER] = str(chat.provider)
    if chat.request_model:
        attrs[a.REQUEST_MODEL] = str(chat.request_model)
    if chat.response_model:
        attrs[a.RESPONSE_MODEL] = str(chat.response_model)
    if chat.response_id:
        attrs[a.RESPONSE_ID] = chat.response_id
    if chat.stream_said is not None:
        attrs[a.REQUEST_STREAM] = chat.stream_said
    if chat.time_to_first_chunk is not None:
        attrs[a.TIME_TO_FIRST_CHUNK] = chat.time_to_first_chunk
    attrs.update(chat.parameters)
    source = span.attributes or {}
    for key in _MESSAGES:  # in the GenAI conventions' JSON already: the call's messages as sent and answered
        value = source.get(key)
        if isinstance(value, str) and value:
            attrs[key] = value
    if a.INPUT_MESSAGES not in attrs and a.OUTPUT_MESSAGES not in attrs and (
            "llm.output_messages.0.message.role" in source or "llm.input_messages.0.message.role" in source):
        attrs.update(openinference_messages(source, chat.finish_reasons))
    said = chat.said
    if said:
        attrs[a.ROUND_TEXT] = said
    if chat.finish_reasons:
        attrs[a.RESPONSE_FINISH_REASONS] = chat.finish_reasons
    for key, value in chat.usage.items():
        attrs[a.USAGE_ATTRIBUTES[key]] = value
    if chat.provider_usage is not None:
        attrs[a.USAGE_PROVIDER] = _json.dumps(chat.provider_usage)
    if _failed(span):
        attrs[a.ERROR_TYPE] = (span.attributes or {}).get(a.ERROR_TYPE) or "error"
    return attrs


def tool_attributes(tool: ToolCall, call_id: str, session: str | None, turn_id: str | None, agent: str | None,
                    framework: str | None) -> dict[str, Any]:
    attrs = {
        a.OPERATION: a.OP_EXECUTE_TOOL,
        **_context_attributes(session, turn_id, agent, framework),
        a.TOOL_NAME: tool.name,
        a.TOOL_CALL_ID: call_id,
        a.TOOL_TYPE: "function",
        a.TOOL_OUTCOME: tool.outcome,
        a.TOOL_STATUS: "completed" if tool.outcome == "served" else "failed",
    }
    if tool.arguments is not None:
        attrs[a.TOOL_CALL_ARGUMENTS] = tool.arguments
    if tool.result is not None:
        attrs[a.TOOL_CALL_RESULT] = tool.result
    if tool.error:
        attrs[a.TOOL_ERROR] = tool.error
    return attrs


_TRUNCATED = {"length", "max_tokens", "max_output_tokens", "model_length"}


def agent_attributes(span: Any, run: AgentRun, session: str | None, turn_id: str, framework: str | None,
                     chats: list[Chat], tools: list[ToolCall], rounds_with_tools: int, *,
                     withheld: bool = False) -> dict[str, Any]:
    """The ``invoke_agent`` attributes of an agent run, with its turn summary made from the
    model calls and tool calls under it (in time order); ``withheld``: its user input was
    not captured (:func:`input_withheld`)."""
    segments = [c.said for c in chats if c.said]
    if not segments and run.output:
        segments = [run.output]
    usage: dict[str, int] = normalized_usage(dict(run.usage))[0]
    if not usage:
        for chat in chats:
            for key, value in chat.usage.items():
                usage[key] = usage.get(key, 0) + value
    declared: dict[str, dict[str, Any]] = {}
    for chat in chats:
        for tool in chat.declared:
            declared.setdefault(tool["name"], tool)
    failed = _failed(span)
    last = chats[-1] if chats else None
    if failed:
        reason = _failure_reason(span)
    elif last is not None and set(last.finish_reasons) & _TRUNCATED:
        reason = "truncated"
    else:
        reason = "completed"
    model = run.model or next((c.response_model or c.request_model for c in reversed(chats) if c.response_model or c.request_model), None)
    provider = run.provider or next((c.provider for c in chats if c.provider), None)
    definitions = [{k: v for k, v in t.items() if k != "origin"} for t in declared.values()]
    attrs = a.turn_attributes(
        reason,
        _json.dumps(segments),
        rounds_with_tools,
        len(tools),
        any(c.streaming for c in chats),
        _json.dumps(list(declared.values())),
        _json.dumps(definitions) if definitions else None,
        RESPONSE_SEGMENT_SEPARATOR.join(segments),
        "",
        str(model) if model else None,
        str(provider) if provider else None,
        usage,
        model_call_count=len(chats),
    )
    attrs.update({a.OPERATION: a.OP_INVOKE_AGENT, **_context_attributes(session, turn_id, run.name, framework)})
    user_input = run.input if run.input is not None else next((c.user_text for c in chats if c.user_text), None)
    if user_input is not None:
        attrs[a.TURN_INPUT] = user_input
    elif withheld:
        attrs[a.CONTENT_WITHHELD] = True  # the user's input: a row without its text
    if failed:
        attrs[a.ERROR_TYPE] = (span.attributes or {}).get(a.ERROR_TYPE) or "error"
    return attrs


_FAILURE_REASONS = {
    # pydantic-ai's exceptions (pydantic_ai.exceptions), by class name
    "RunTimedOut": "timeout",
    "RunCancelled": "cancelled",
    "CancelledError": "cancelled",
    "OutputTokenLimitExceeded": "truncated",
    "IncompleteToolCall": "truncated",
}


def _failure_reason(span: Any) -> str:
    """Why a failed agent run stopped, from the exception it recorded: a usage limit is
    ``max_rounds`` (pydantic-ai's ``request_limit``) or ``budget_exceeded`` (tokens, tool
    calls, cost), a cancelled or timed-out run says so, anything else is ``error``."""
    kind = (span.attributes or {}).get(a.ERROR_TYPE)
    message = ""
    for event in getattr(span, "events", None) or ():
        if event.name == "exception":
            kind = event.attributes.get("exception.type") or kind
            message = str(event.attributes.get("exception.message") or "")
    name = str(kind or "").rpartition(".")[2]
    if name == "UsageLimitExceeded":
        return "max_rounds" if "request_limit" in message else "budget_exceeded"
    return _FAILURE_REASONS.get(name, "error")


def normalize(span: Any) -> SpanRecord | None:
    """One foreign span alone as a span with loopscope's attributes (None when it is no
    GenAI span loopscope maps); a span of loopscope's own comes back as it is.

    Alone, a model call or tool call belongs to no turn (its session is its conversation id,
    else its trace); :class:`Assembler` joins the spans of an agent run instead.
    """
    if is_own(span):
        return record_of(span)
    record = bridges.repair(record_of(span))
    role, framework = classify(record)
    if role is None or role == CONTAINER:
        return None
    session = session_of(record.attributes)
    if role == CHAT:
        attrs = chat_attributes(record, read_chat(record), session, None, None, framework)
    elif role == TOOL:
        tool = read_tool(record)
        attrs = tool_attributes(tool, tool.call_id or f"{record.context.span_id:016x}", session, None, None, framework)
    else:
        run = read_agent(record)
        attrs = agent_attributes(record, run, run.session, f"{record.context.span_id:016x}", framework, [], [], 0)
    return record.replace(attributes=attrs)


# -- agent runs: the spans under them, together ----------------------------------------------------------


@dataclass
class _Buffered:
    span: SpanRecord
    role: str
    framework: str | None
    seq: int = 0  # arrival order in its trace


Held = list[Any]  # span ids and further such lists (a subtree's held spans, moved up whole)


@dataclass
class _Trace:
    """A trace's spans seen so far, and where their held spans wait.

    Each held span waits in the bucket of its nearest ancestor not seen yet (``below``):
    a span that arrives takes the bucket left under it, and either claims it (an agent run)
    or moves it, with itself, into its parent's (the bucket as one item: no copy). A span
    that arrives under one seen already goes where that one's went (``up``, with path
    compression). So an agent run finds its held spans in time linear in them, whatever
    the depth and order of the spans (the search up every held span's parents was
    quadratic in a chain)."""

    up: dict[int, int] = field(default_factory=dict)  # seen span id -> its parent, shortened as found
    seen: set[int] = field(default_factory=set)  # span ids seen
    below: dict[int, Held] = field(default_factory=dict)  # not-yet-seen span id -> held spans under it
    buffered: dict[int, _Buffered] = field(default_factory=dict)  # GenAI spans not yet mapped, in arrival order
    touched: float = 0.0
    seq: int = 0

    def sink(self, node: int) -> int:
        """Where held spans under ``node`` wait: its nearest ancestor not seen yet (or one
        that closes a loop of parent links)."""
        path = []
        up = self.up
        while node in up:
            path.append(node)
            node = up[node]
        for visited in path:  # path compression: the next search jumps straight there
            up[visited] = node
        return node

    def arrive(self, sid: int, parent: int | None, *, claim: bool) -> list[int]:
        """A span seen: the held spans under it, if it ``claim``s them (an agent run: in
        arrival order), else moved up to its parent's sink (and [] returned). Spans that
        arrive under it later go where its parent's would."""
        held = self.below.pop(sid, None)
        if sid not in self.seen:
            self.seen.add(sid)
            if parent is not None:
                target = self.sink(parent)
                if target != sid:  # else the parent links loop back here (hostile input): no link
                    self.up[sid] = target
        if claim:
            return self._flatten(held) if held is not None else []
        if sid in self.buffered:
            held = [sid] if held is None else held
            if held[-1] != sid:
                held.append(sid)
        if held is not None:
            self.below.setdefault(self.sink(sid), []).append(held)
        return []

    def _flatten(self, held: Held) -> list[int]:
        out: list[int] = []
        stack: list[Any] = [held]
        while stack:
            item = stack.pop()
            if type(item) is list:
                stack.extend(item)
            else:
                out.append(item)
        buffered = self.buffered
        found = [sid for sid in dict.fromkeys(out) if sid in buffered]
        found.sort(key=lambda sid: buffered[sid].seq)
        return found


class Assembler:
    """Groups foreign GenAI spans by agent run, then hands them on as rows to write.

    OTLP carries spans when they end, children before their parents: model calls and tool
    calls are held until the agent run above them ends (then they join its turn: its
    session, its turn id, its agent name, and its summary counts them), until their
    trace's root ends (no agent above them: they are mapped alone), or until nothing
    happened in their trace for ``idle_seconds``. Memory is bounded: past ``max_spans``
    held spans or ``max_traces`` traces followed, the oldest trace is mapped as it is.

    :meth:`add` takes one span and returns ``(kind, span)`` pairs (kind 0: started,
    1: ended) for :meth:`StoreWriter.submit`, in the order to write them.
    """

    def __init__(self, *, idle_seconds: float = 60.0, max_spans: int = 100_000, max_traces: int = 20_000,
                 clock: Any = time.monotonic, stitcher: Any = None) -> None:
        self.idle_seconds = idle_seconds
        # model calls under no agent run go to the stitcher (ingest/stitch_foreign.py), which
        # makes turns of them; without one each is mapped alone
        self.stitcher = stitcher
        self.max_spans = max_spans
        self.max_traces = max_traces
        self._clock = clock
        self._traces: collections.OrderedDict[int, _Trace] = collections.OrderedDict()
        self._held = 0
        # the anthropic SDK's own spans outside any trace held here (beside another
        # instrumentation's span of the same call, in a trace of its own): by response id,
        # until that span comes (then it is left out) or SDK_SPAN_WAIT seconds pass
        self._sdk_spans: collections.OrderedDict[str, tuple[SpanRecord, str | None, float]] = collections.OrderedDict()
        self._responses: collections.OrderedDict[str, None] = collections.OrderedDict()  # of calls mapped alone

    def tracks(self, trace_id: int) -> bool:
        """Whether spans of this trace are held (a span of loopscope's own there must be seen too)."""
        return trace_id in self._traces

    @property
    def held(self) -> int:
        """How many spans wait for their agent run (or their trace's end)."""
        return self._held

    def add(self, span: Any) -> list[tuple[int, Any]]:
        record = bridges.repair(record_of(span))  # openai-agents' OTel bridges: into shapes read below
        tid, sid = record.context.trace_id, record.context.span_id
        parent = record.parent.span_id if record.parent is not None and not record.parent.is_remote else None
        out: list[tuple[int, Any]] = []
        if is_own(record):
            # loopscope's own spans map as they are; an own turn also claims what another
            # instrumentation recorded inside it (the same model calls, seen twice)
            state = self._traces.get(tid)
            if state is not None:
                claim = (record.attributes or {}).get(a.OPERATION) == a.OP_INVOKE_AGENT
                for buffered_id in state.arrive(sid, parent, claim=claim):
                    del state.buffered[buffered_id]
                    self._held -= 1
                if parent is None:
                    out += self._release_trace(tid)
            return out
        role, framework = classify(record)
        state = self._traces.get(tid)
        if state is None:
            if role is None or (parent is None and role != AGENT):
                # nothing to group: a lone span, or a root with nothing held below it
                if role == CHAT:
                    return self._lone_chat(record, framework)
                return self._alone(record, role, framework) if role == TOOL else []
            state = self._traces[tid] = _Trace()
        self._traces.move_to_end(tid)
        state.touched = self._clock()
        if role in (CHAT, TOOL):
            if sid not in state.buffered:
                self._held += 1
            state.seq += 1
            state.buffered[sid] = _Buffered(record, role, framework, state.seq)
            state.arrive(sid, parent, claim=False)
        elif role == AGENT or (role == CONTAINER and parent is None):
            out += self._release_run(state, record, framework, container=role == CONTAINER, parent=parent)
        else:
            state.arrive(sid, parent, claim=False)
        if parent is None:
            out += self._release_trace(tid)
        while (self._held > self.max_spans or len(self._traces) > self.max_traces) and self._traces:
            out += self._release_trace(next(iter(self._traces)))
        return out

    def _lone_chat(self, record: SpanRecord, framework: str | None) -> list[tuple[int, Any]]:
        """A model call's span in no trace of its own: mapped alone, but one call once. The
        anthropic SDK's own span of a call (OpenLLMetry's span of it is no parent of it, but
        a root beside it) waits for the other (see :data:`SDK_SPAN_WAIT`); the other,
        richer, is mapped and the SDK's left out."""
        response_id = _text((record.attributes or {}).get(a.RESPONSE_ID))
        if response_id and record.name == ANTHROPIC_SDK_SPAN:
            if response_id in self._responses:
                return []  # another span of this call was mapped
            self._sdk_spans[response_id] = (record, framework, self._clock())
            return []
        if response_id:
            self._sdk_spans.pop(response_id, None)
            self._responses[response_id] = None
            while len(self._responses) > self.max_traces:
                self._responses.popitem(last=False)
        return self._alone(record, CHAT, framework)

    def _release_sdk_spans(self, before: float = math.inf) -> list[tuple[int, Any]]:
        """Map alone the SDK's spans held since before ``before`` (all by default), in order."""
        out: list[tuple[int, Any]] = []
        while self._sdk_spans:
            response_id, (record, framework, at) = next(iter(self._sdk_spans.items()))
            if at > before:
                break
            del self._sdk_spans[response_id]
            out += self._alone(record, CHAT, framework)
        return out

    def expire(self) -> list[tuple[int, Any]]:
        """Map the spans of traces idle for ``idle_seconds``, alone."""
        out: list[tuple[int, Any]] = self._release_sdk_spans(self._clock() - min(SDK_SPAN_WAIT, self.idle_seconds))
        now = self._clock()
        for tid in [t for t, s in self._traces.items() if now - s.touched >= self.idle_seconds]:
            out += self._release_trace(tid)
        if self.stitcher is not None:
            out += self.stitcher.expire()
        return out

    def drain(self) -> list[tuple[int, Any]]:
        """Map everything still held (at shutdown)."""
        out: list[tuple[int, Any]] = self._release_sdk_spans()
        for tid in list(self._traces):
            out += self._release_trace(tid)
        if self.stitcher is not None:
            out += self.stitcher.drain()
        return out

    # -- inside ------------------------------------------------------------------------------

    def _release_trace(self, tid: int) -> list[tuple[int, Any]]:
        state = self._traces.pop(tid, None)
        if state is None:
            return []
        out: list[tuple[int, Any]] = []
        held = sorted(state.buffered.values(), key=lambda b: b.span.end_time)
        self._held -= len(held)
        chats = [(item, read_chat(item.span)) for item in held if item.role == CHAT]
        kept = {id(item) for item, _ in _one_per_call(chats)} if len(chats) > 1 else None
        for item in held:
            if kept is None or item.role != CHAT or id(item) in kept:
                out += self._alone(item.span, item.role, item.framework)
        return out

    def _alone(self, record: SpanRecord, role: str | None, framework: str | None) -> list[tuple[int, Any]]:
        if role == CHAT and self.stitcher is not None:
            return self.stitcher.add(record, framework)
        session = session_of(record.attributes)
        if role == CHAT:
            return [(END, record.replace(attributes=chat_attributes(record, read_chat(record), session, None, None, framework)))]
        if role == TOOL:
            tool = read_tool(record)
            canon = record.replace(attributes=tool_attributes(tool, tool.call_id or f"{record.context.span_id:016x}", session, None, None, framework))
            return [(START, canon), (END, canon)]
        return []

    def _release_run(self, state: _Trace, agent: SpanRecord, framework: str | None, container: bool,
                     parent: int | None) -> list[tuple[int, Any]]:
        ids = state.arrive(agent.context.span_id, parent, claim=True)
        items = [state.buffered.pop(sid) for sid in ids]
        self._held -= len(items)
        if container and not items:
            return []  # a chain or workflow with no model or tool call under it
        run = read_agent(agent)
        chats: list[tuple[_Buffered, Chat]] = []
        tools: list[tuple[_Buffered, ToolCall]] = []
        for item in items:
            if item.role != CHAT:
                tools.append((item, read_tool(item.span)))
        chats = _one_per_call([(item, read_chat(item.span)) for item in items if item.role == CHAT])
        chats.sort(key=lambda c: c[0].span.end_time)
        tools.sort(key=lambda t: t[0].span.start_time)
        session = run.session or next(
            (s for s in (session_of(i.span.attributes) for i in items) if s), None
        ) or f"{agent.context.trace_id:032x}"
        turn_id = f"{agent.context.span_id:016x}"
        name = run.name
        framework = framework or next((i.framework for i in items), None)
        accepted = _answers([c for _, c in chats], run, agent)
        # tool spans without a call id get the id of the call the model asked for (same
        # name, the same arguments if they tell), else their span id; an output tool's call
        # (run by an output function) is matched too, but makes no tool round
        requested = [(chat_item.span.end_time, call) for chat_item, chat in chats for call in chat.tool_calls]
        output_calls = len(requested)
        requested += [(chat_item.span.end_time, call) for chat_item, chat in chats for call in chat.outputs]
        answered_at: int | None = None  # when the output function that made the run's output ended
        claimed: set[int] = set()
        echoed: list[tuple[str | None, str, str | None]] | None = None  # calls repeated in later requests, read once if needed
        echoed_claimed: set[int] = set()
        rounds = set()
        canon_tools = []
        for item, tool in tools:
            call_id = tool.call_id
            match = None
            for index, (at, (cid, cname, carguments)) in enumerate(requested):
                if index in claimed or cname != tool.name or at > item.span.start_time:
                    continue
                if call_id is not None and cid != call_id:
                    continue
                if match is None or (_same_json(carguments, tool.arguments) and not _same_json(requested[match][1][2], tool.arguments)):
                    match = index
            if match is not None:
                claimed.add(match)
                if match < output_calls:
                    rounds.add(requested[match][0])
                elif accepted is not None and requested[match][1] in accepted.outputs:
                    answered_at = item.span.end_time
                call_id = call_id or requested[match][1][0]
            else:
                # no model call's output names it: its id from the requests that followed
                # (an openai-agents bridge can lose a call from the response that made it),
                # its round the model call that ended last before it ran
                if call_id is None:
                    if echoed is None:
                        echoed = bridges.echoed_calls([chat_item.span for chat_item, _ in chats])
                    call_id = _echoed_id(echoed, tool, echoed_claimed)
                asked = _round_before(chats, item.span.start_time)
                if asked is not None:
                    rounds.add(asked)
            canon_tools.append((item, tool_attributes(tool, call_id or f"{item.span.context.span_id:016x}", session, turn_id, name, item.framework)))
        for chat_item, chat in chats:
            chat.finish_reasons = bridges.finish_reasons(chat_item.span, chat.finish_reasons, chat_item.span.end_time in rounds)
        rows: list[tuple[int, int, int, Any]] = []  # (time, order, kind, span)
        order = 0
        agent_attrs = agent_attributes(agent, run, session, turn_id, framework, [c for _, c in chats], [t for _, t in tools], len(rounds),
                                       withheld=input_withheld(run, [(item.span, chat) for item, chat in chats]))
        canon_agent = agent.replace(attributes=agent_attrs)
        rows.append((agent.start_time, -1, START, canon_agent))
        for item, attrs in canon_tools:
            canon = item.span.replace(attributes=attrs)
            order += 1
            rows.append((item.span.start_time, order, START, canon))
            order += 1
            rows.append((item.span.end_time, order, END, canon))
        last_chat = chats[-1][1] if chats and not _failed(agent) else None
        for position, (item, chat) in enumerate(chats, 1):
            order += 1
            # the answer an output function made is told after that function ran
            at = max(item.span.end_time, answered_at) if chat is accepted and answered_at is not None else item.span.end_time
            attrs = chat_attributes(item.span, chat, session, turn_id, name, item.framework)
            # as the bare path keeps them: the call's place in its turn, and whether it
            # streamed (not streamed where the span does not say)
            attrs[a.CALL_POSITION] = position
            attrs[a.REQUEST_STREAM] = chat.streaming
            attrs.update(bridges.call_details(item.span, chat.finish_reasons))
            if chat is last_chat and answer_withheld(item.span, chat):
                attrs[a.CONTENT_WITHHELD] = True  # the run's answer: a row without its text
            rows.append((at, order, END, item.span.replace(attributes=attrs)))
        rows.sort(key=lambda r: (r[0], r[1]))
        out = [(kind, span) for _, _, kind, span in rows]
        out.append((END, canon_agent))
        return out


def _one_per_call(chats: list[tuple[_Buffered, Chat]]) -> list[tuple[_Buffered, Chat]]:
    """``chats`` with one span per model call: two spans that give the same response id
    describe one call (the anthropic SDK's own ``anthropic.messages.create`` span under or
    beside another instrumentation's): the richer is kept (:func:`_richness`), in order."""
    # a model call's span inside another's is the same call seen twice (OpenInference's span,
    # without a response id, around the SDK's own)
    by_id = {item.span.context.span_id: (item, chat) for item, chat in chats}
    dropped: set[int] = set()
    for item, chat in chats:
        parent = item.span.parent
        outer = by_id.get(parent.span_id) if parent is not None else None
        if outer is not None and id(outer[0]) not in dropped:
            dropped.add(id(item) if _richness(*outer) >= _richness(item, chat) else id(outer[0]))
    if dropped:
        chats = [(item, chat) for item, chat in chats if id(item) not in dropped]
    best: dict[str, tuple[_Buffered, Chat]] = {}
    for item, chat in chats:
        if chat.response_id:
            other = best.get(chat.response_id)
            if other is None or _richness(item, chat) > _richness(*other):
                best[chat.response_id] = (item, chat)
    if len(best) == sum(1 for _, chat in chats if chat.response_id):
        return chats  # no call twice
    return [(item, chat) for item, chat in chats if not chat.response_id or best[chat.response_id][0] is item]


def _richness(item: _Buffered, chat: Chat) -> tuple[int, ...]:
    """What a model call's span says, to keep the richer of two spans of one call: its
    messages, finish reasons, declared tools, usage figures; then another instrumentation's
    span before the anthropic SDK's own (named for the API method, not the model call)."""
    attrs = item.span.attributes or {}
    messages = sum(1 for key in _MESSAGES if key in attrs) or int(bool(chat.text or chat.tool_calls or chat.user_text))
    return (messages, len(chat.finish_reasons), len(chat.declared), len(chat.usage), int(item.span.name != ANTHROPIC_SDK_SPAN))


ANTHROPIC_SDK_SPAN = "anthropic.messages.create"
"""The name of the anthropic SDK's own span of a Messages call (2.x, whenever a tracer provider exists)."""
SDK_SPAN_WAIT = 2.0
"""Seconds the anthropic SDK's own span of a call, in a trace of its own, waits for another
instrumentation's span of the same call (same response id) before it is mapped alone."""


def _echoed_id(echoed: list[tuple[str | None, str, str | None]], tool: ToolCall, claimed: set[int]) -> str | None:
    """The id of the unclaimed call of this tool repeated in a later request (the same
    arguments if they tell), which it then claims."""
    match = None
    for index, (cid, cname, carguments) in enumerate(echoed):
        if index in claimed or cname != tool.name:
            continue
        if match is None or (_same_json(carguments, tool.arguments) and not _same_json(echoed[match][2], tool.arguments)):
            match = index
    if match is None:
        return None
    claimed.add(match)
    return echoed[match][0]


def _round_before(chats: list[tuple[_Buffered, Chat]], start: int) -> int | None:
    """The end time (a round's key) of the model call that ended last before ``start``."""
    ends = [item.span.end_time for item, _ in chats if item.span.end_time <= start]
    return max(ends) if ends else None


def _answers(chats: list[Chat], run: AgentRun, agent: Any) -> Chat | None:
    """Which model call gave the run's structured output, now its ``answer``: the last one
    that called an output tool, answering with the output the run returned (validated, or
    made by an output function); an earlier call of an output tool was rejected (pydantic-ai
    asked again) and answers nothing, nor does any when the run failed. That call, or None."""
    accepted = None
    if not _failed(agent):
        accepted = next((c for c in reversed(chats) if c.outputs), None)
    for chat in chats:
        if chat is not accepted:
            chat.answer = None
    if accepted is not None and run.output is not None:
        accepted.answer = run.output
    return accepted


def _same_json(left: str | None, right: str | None) -> bool:
    if left == right:
        return True
    return _loads(left) == _loads(right) and _loads(left) is not None


__all__ = [
    "AGENT", "CHAT", "CONTAINER", "TOOL", "Assembler", "classify", "normalize", "read_agent", "read_chat", "read_tool",
]

