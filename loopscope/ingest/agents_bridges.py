"""The OpenAI Agents SDK's two OpenTelemetry bridges, read as loopscope reads the SDK in process.

Both bridges are ``TracingProcessor`` objects that turn the SDK's trace into OTel spans:

* the official ``opentelemetry-instrumentation-openai-agents-v2`` (scope
  ``opentelemetry.instrumentation.openai_agents``): ``invoke_agent`` / ``chat`` /
  ``execute_tool`` spans in the GenAI conventions, but its output messages hold a
  response's items as Python reprs in text parts (``ResponseFunctionToolCall(arguments=...,
  call_id=..., name=...)``, ``{'content': None, 'tool_calls': [...]}``); a response with text
  keeps only the text (the calls it made are gone); its execute_tool spans carry no call id;
  the SDK's trace root, named by the workflow (``Agent workflow``), is an ``invoke_agent``
  span with no agent name;
* OpenInference's ``openinference-instrumentation-openai-agents`` (scope
  ``openinference.instrumentation.openai_agents``): LLM, TOOL, AGENT and CHAIN spans, the
  trace root an AGENT span with no ``agent.name``; with ``hide_inputs`` / ``hide_outputs``
  values are ``__REDACTED__``; for the Responses API its ``llm.finish_reason`` is ``stop``
  also when the response asks for tools.

:func:`repair` rewrites one span of either bridge into the shapes
:mod:`loopscope.ingest.foreign` reads (the workflow root a container, so it makes no
empty turn; reprs parsed back into text and tool-call parts, never evaluated; redacted
values dropped, so a hidden value is missing rather than stored as the marker).
:func:`echoed_calls` finds the calls a model made in the requests that followed (where the
official bridge lost them from the response itself, the next request's input still has
them); :func:`call_details` gives a model call's row what the bridge's span says of it.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from typing import Any

from .. import _json
from .. import semconv as a
from .spans import SpanRecord

OTEL_BRIDGE = "opentelemetry.instrumentation.openai_agents"
OI_BRIDGE = "openinference.instrumentation.openai_agents"
BRIDGES = frozenset((OTEL_BRIDGE, OI_BRIDGE))
REDACTED = "__REDACTED__"  # openinference-instrumentation's mark for a hidden value
_MAX_REPR = 1 << 20  # reprs longer than this are left as they are: nothing parses them

Call = tuple[str | None, str, str | None]  # (call id, tool name, arguments JSON)


def bridge_of(span: Any) -> str | None:
    """The bridge's instrumentation scope if one of the two made this span, else None."""
    scope = getattr(getattr(span, "instrumentation_scope", None), "name", None)
    return scope if scope in BRIDGES else None


def repair(record: SpanRecord) -> SpanRecord:
    """A bridge's span in the shapes the foreign mapping reads; any other span as it is."""
    scope = record.instrumentation_scope.name
    if scope == OTEL_BRIDGE:
        attrs = _repair_otel(record.attributes or {})
    elif scope == OI_BRIDGE:
        attrs = _repair_oi(record.attributes or {})
    else:
        return record
    return record if attrs is None else record.replace(attributes=attrs)


# -- the official bridge ---------------------------------------------------------------------


def _repair_otel(attrs: Mapping[str, Any]) -> dict[str, Any] | None:
    changed: dict[str, Any] = {}
    if attrs.get(a.OPERATION) == a.OP_INVOKE_AGENT and not attrs.get(a.AGENT_NAME):
        # the SDK's trace (the workflow) around the agent runs, not a run of its own
        changed[a.OPERATION] = "invoke_workflow"
    for key in (a.INPUT_MESSAGES, a.OUTPUT_MESSAGES):
        value = attrs.get(key)
        if isinstance(value, str) and ("(" in value or "{'" in value):
            fixed = _fixed_messages(value)
            if fixed is not None:
                changed[key] = fixed
    if not changed:
        return None
    return {**attrs, **changed}


def _fixed_messages(value: str) -> str | None:
    """GenAI messages whose text parts are reprs, with those parts parsed (None: unchanged)."""
    try:
        messages = json.loads(value)
    except ValueError:
        return None
    if not isinstance(messages, list):
        return None
    changed = False
    for message in messages:
        parts = message.get("parts") if isinstance(message, dict) else None
        if not isinstance(parts, list):
            continue
        fixed: list[Any] = []
        for part in parts:
            content = part.get("content") if isinstance(part, dict) and part.get("type") == "text" else None
            parsed = _repr_parts(content) if isinstance(content, str) else None
            if parsed is None:
                fixed.append(part)
            else:
                fixed.extend(parsed)
                changed = True
        message["parts"] = fixed
    return _json.dumps(messages) if changed else None


def _repr_parts(text: str) -> list[dict[str, Any]] | None:
    """A text part that is a repr of a response item (``ResponseFunctionToolCall(...)``, an
    output text's or a chat message's dict) as GenAI parts; None when it is plain text.

    The repr is parsed (``ast``), never evaluated: only literals are read from it.
    """
    head = text[:48]
    if not (head.startswith("{'") or (head[:8] == "Response" and "(" in head)) or len(text) > _MAX_REPR:
        return None
    try:
        node = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if isinstance(node, ast.Dict):
        try:
            item = ast.literal_eval(node)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            return None
        return _dict_parts(item) if isinstance(item, dict) and _printed_item(item) else None
    if not isinstance(node, ast.Call) or node.args or not isinstance(node.func, ast.Name) or not node.func.id.startswith("Response"):
        return None
    parts: list[dict[str, Any]] = []
    _call_parts(node, parts)
    return parts


def _call_parts(node: ast.Call, parts: list[dict[str, Any]]) -> None:
    """The text and tool calls in the repr of a response item (a pydantic model's repr:
    ``Name(field=value, ...)``): a function call's fields, output texts' ``text``; the
    rest (reasoning, annotations, ids) is left out."""
    name = node.func.id if isinstance(node.func, ast.Name) else ""
    fields: dict[str, Any] = {}
    for keyword in node.keywords:
        value = keyword.value
        if isinstance(value, ast.Call):
            _call_parts(value, parts)
        elif isinstance(value, (ast.List, ast.Tuple)):
            for element in value.elts:
                if isinstance(element, ast.Call):
                    _call_parts(element, parts)
        elif isinstance(value, ast.Constant) and keyword.arg:
            fields[keyword.arg] = value.value
    if name == "ResponseFunctionToolCall" and isinstance(fields.get("name"), str):
        parts.append({"type": "tool_call", "id": fields.get("call_id"), "name": fields["name"],
                      "arguments": fields.get("arguments")})
    elif name == "ResponseOutputText" and isinstance(fields.get("text"), str):
        parts.append({"type": "text", "content": fields["text"]})


def _printed_item(item: dict[str, Any]) -> bool:
    """Whether a dict is one the bridge printed (a chat message, an output text), not text
    that happens to look like a dict (a tool's result, a model's answer)."""
    if "role" in item:
        return item["role"] == "assistant" and ("tool_calls" in item or "refusal" in item)
    return item.get("type") == "output_text" and "text" in item


def _dict_parts(item: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat message's or an output text's dict (as the bridge printed it) as GenAI parts."""
    parts: list[dict[str, Any]] = []
    text = item.get("content") if "role" in item else item.get("text")
    if isinstance(text, str) and text:
        parts.append({"type": "text", "content": text})
    for call in item.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            parts.append({"type": "tool_call", "id": call.get("id"), "name": function["name"],
                          "arguments": function.get("arguments")})
    return parts


# -- OpenInference's bridge ----------------------------------------------------------------------


def _repair_oi(attrs: Mapping[str, Any]) -> dict[str, Any] | None:
    kind = attrs.get("openinference.span.kind")
    root = isinstance(kind, str) and kind.upper() == "AGENT" and not attrs.get("agent.name")
    redacted = [k for k, v in attrs.items() if v == REDACTED]
    if not root and not redacted:
        return None
    fixed = {k: v for k, v in attrs.items() if v != REDACTED}
    if root:
        fixed["openinference.span.kind"] = "CHAIN"  # the SDK's trace (the workflow), not an agent run
    return fixed


# -- what a run's spans say together -------------------------------------------------------------


def echoed_calls(spans: list[Any]) -> list[Call]:
    """The tool calls the model made, as later requests repeat them (the assistant
    messages' tool calls in their input), each id once, in order."""
    out: list[Call] = []
    seen: set[str] = set()
    for span in spans:
        attrs = span.attributes or {}
        for call in _input_calls(attrs):
            if call[0] and call[0] not in seen:
                seen.add(call[0])
                out.append(call)
    return out


def _input_calls(attrs: Mapping[str, Any]) -> list[Call]:
    calls: list[Call] = []
    value = attrs.get(a.INPUT_MESSAGES)
    if isinstance(value, str) and '"tool_call"' in value:
        try:
            messages = json.loads(value)
        except ValueError:
            messages = None
        for message in messages if isinstance(messages, list) else ():
            if not isinstance(message, dict) or message.get("role") != "assistant":
                continue
            for part in message.get("parts") or ():
                if isinstance(part, dict) and part.get("type") == "tool_call" and isinstance(part.get("name"), str):
                    calls.append((_id(part.get("id")), part["name"], _arguments(part.get("arguments"))))
    prefix = "llm.input_messages."
    if any(k.startswith(prefix) and ".tool_calls." in k for k in attrs):
        found: dict[tuple[int, int], dict[str, Any]] = {}
        for key, item in attrs.items():
            if not key.startswith(prefix) or ".message.tool_calls." not in key:
                continue
            head, _, rest = key[len(prefix):].partition(".message.tool_calls.")
            index, _, field = rest.partition(".tool_call.")
            if head.isdigit() and index.isdigit():
                found.setdefault((int(head), int(index)), {})[field] = item
        for _, call in sorted(found.items()):
            if isinstance(call.get("function.name"), str):
                calls.append((_id(call.get("id")), call["function.name"], _arguments(call.get("function.arguments"))))
    return calls


def _id(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _arguments(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return _json.dumps(value)


def finish_reasons(span: Any, reasons: tuple[str, ...], asked_tools: bool) -> tuple[str, ...]:
    """A bridge's model call's finish reasons as loopscope's adapter gives them: the
    Responses API has none, so a response that asked for tools ended with ``tool_calls``
    (OpenInference says ``stop``; the official bridge says nothing)."""
    if asked_tools and bridge_of(span) is not None and reasons in ((), ("stop",)):
        return ("tool_calls",)
    return reasons


def call_details(span: Any, finish_reasons: tuple[str, ...] = ()) -> dict[str, Any]:
    """What a bridge's model-call span says of the call beyond what every chat span gives:
    the response id, and the messages in the GenAI schema (the official bridge's, repaired)."""
    scope = bridge_of(span)
    if scope is None:
        return {}
    attrs = span.attributes or {}
    out: dict[str, Any] = {}
    response_id = attrs.get(a.RESPONSE_ID)
    if response_id is None and scope == OI_BRIDGE:
        response_id = _oi_response_id(attrs.get("output.value"))
    if isinstance(response_id, str) and response_id:
        out[a.RESPONSE_ID] = response_id
    for key, prefix in ((a.INPUT_MESSAGES, "llm.input_messages"), (a.OUTPUT_MESSAGES, "llm.output_messages")):
        if isinstance(attrs.get(key), str):
            out[key] = attrs[key]
        elif scope == OI_BRIDGE and f"{prefix}.0.message.role" in attrs:
            reason = finish_reasons[0] if finish_reasons else None
            out[key] = _json.dumps(oi_messages(attrs, prefix, reason if key == a.OUTPUT_MESSAGES else None))
    return out


def oi_messages(attrs: Mapping[str, Any], prefix: str, reason: str | None) -> list[dict[str, Any]]:
    """OpenInference's flattened messages (``llm.input_messages.N.message.*``) in the GenAI
    conventions' schema, as loopscope's adapters store a call's messages: system messages
    are instructions, not messages (left out); the output (``reason`` given: its finish
    reason) is one assistant message, as the model gave it (OpenInference splits a
    response's text and its calls)."""
    items: dict[int, dict[str, Any]] = {}
    start = len(prefix) + 1
    for key, value in attrs.items():
        if key.startswith(prefix) and key[start - 1:start] == ".":
            head, _, rest = key[start:].partition(".message.")
            if head.isdigit() and rest:
                items.setdefault(int(head), {})[rest] = value
    output = reason is not None or prefix.endswith("output_messages")
    messages: list[dict[str, Any]] = []
    for index in sorted(items):
        fields = items[index]
        role = fields.get("role")
        if not isinstance(role, str) or role == "system":
            continue
        parts: list[dict[str, Any]] = []
        text = fields.get("content")
        if not isinstance(text, str):
            text = "".join(str(v) for k, v in sorted(fields.items()) if k.startswith("contents.") and k.endswith(".message_content.text"))
        if role == "tool":
            parts.append({"type": "tool_call_response", "id": fields.get("tool_call_id"), "response": text})
        elif text:
            parts.append({"type": "text", "content": text})
        calls: dict[int, dict[str, Any]] = {}
        for key, value in fields.items():
            head, _, rest = key.partition(".tool_call.")
            if head.startswith("tool_calls.") and head[len("tool_calls."):].isdigit():
                calls.setdefault(int(head[len("tool_calls."):]), {})[rest] = value
        for _, call in sorted(calls.items()):
            parts.append({"type": "tool_call", "id": call.get("id"), "name": call.get("function.name"),
                          "arguments": _loaded(call.get("function.arguments"))})
        if output and messages and messages[-1]["role"] == role:
            messages[-1]["parts"] += parts
            continue
        messages.append({"role": role, "parts": parts})
    if output and reason:
        for message in messages:
            message["finish_reason"] = reason
    return messages


def _loaded(value: Any) -> Any:
    """Arguments as the model sent them: JSON text parsed, anything else as it is."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _oi_response_id(value: Any) -> str | None:
    """The id of the Responses API response OpenInference put whole in ``output.value``."""
    if not isinstance(value, str) or not value.startswith("{"):
        return None
    try:
        data = json.loads(value)
    except ValueError:
        return None
    if isinstance(data, dict) and data.get("object") == "response" and isinstance(data.get("id"), str):
        return data["id"]
    return None


__all__ = ["BRIDGES", "OI_BRIDGE", "OTEL_BRIDGE", "bridge_of", "call_details", "echoed_calls", "finish_reasons", "oi_messages", "repair"]
