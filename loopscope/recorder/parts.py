"""Typed message parts: the request's and the answer's messages in the GenAI message schema.

The shapes of OpenTelemetry's ``opentelemetry-util-genai`` (``InputMessage`` /
``OutputMessage`` with ``Text``, ``ToolCall``, ``ToolCallResponse``, ``Reasoning`` parts),
so an adapter writes ``InputMessage("user", [Text("hi")])`` instead of the schema's
dicts. ``ModelRequest.input_messages`` takes a list of them (the recorder turns them into
the schema's JSON, ``gen_ai.input.messages``); a dict list or its JSON text still works, for
the adapters that make the text themselves on the hot path. A part of any other kind is
``Part("image")``: its type only (content the schema has no place for is not recorded).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Text:
    """Text the role said (``{"type": "text", "content"}``)."""

    content: str
    type: str = "text"


@dataclass(slots=True)
class ToolCallRequest:
    """A tool call the model asked for (``{"type": "tool_call", "id", "name", "arguments"}``);
    util-genai's ``ToolCall`` (named apart from :class:`loopscope.models.ToolCall`)."""

    name: str
    arguments: Any = None
    id: str | None = None
    type: str = "tool_call"


@dataclass(slots=True)
class ToolCallResponse:
    """A tool's result sent back to the model (``{"type": "tool_call_response", "id", "response"}``)."""

    response: Any
    id: str | None = None
    type: str = "tool_call_response"


@dataclass(slots=True)
class Reasoning:
    """The model's reasoning (thinking) text (``{"type": "reasoning", "content"}``)."""

    content: str
    type: str = "reasoning"


@dataclass(slots=True)
class Part:
    """A part of another kind (an image, a document, a server tool's block), by its type."""

    type: str


MessagePart = Text | ToolCallRequest | ToolCallResponse | Reasoning | Part


@dataclass(slots=True)
class InputMessage:
    """One message of a request: its role (``system``, ``user``, ``assistant``, ``tool``) and parts."""

    role: str
    parts: Sequence[MessagePart] = field(default_factory=list)


@dataclass(slots=True)
class OutputMessage:
    """One answer: its parts and its finish reason."""

    role: str
    parts: Sequence[MessagePart] = field(default_factory=list)
    finish_reason: str = "stop"


def part_dict(part: Any) -> dict[str, Any]:
    """One part in the GenAI schema (a dict given is taken as it is)."""
    kind = type(part)
    if kind is Text or kind is Reasoning:
        return {"type": part.type, "content": part.content}
    if kind is ToolCallRequest:
        return {"type": "tool_call", "id": part.id, "name": part.name, "arguments": part.arguments}
    if kind is ToolCallResponse:
        return {"type": "tool_call_response", "id": part.id, "response": part.response}
    if kind is Part:
        return {"type": part.type}
    if isinstance(part, dict):
        return part
    return {"type": str(getattr(part, "type", None) or type(part).__name__)}


def message_dict(message: Any) -> dict[str, Any]:
    """One message in the GenAI schema (a dict given is taken as it is)."""
    if isinstance(message, (InputMessage, OutputMessage)):
        out: dict[str, Any] = {"role": message.role, "parts": [part_dict(p) for p in message.parts]}
        if isinstance(message, OutputMessage):
            out["finish_reason"] = message.finish_reason
        return out
    return message


def genai_messages(messages: Any) -> list[dict[str, Any]] | str | None:
    """``ModelRequest.input_messages`` as the recorder keeps it: typed messages become the
    schema's dicts; dicts and JSON text stay as they are."""
    if type(messages) is list and messages and type(messages[0]) is not dict:
        return [message_dict(m) for m in messages]
    return messages


__all__ = [
    "InputMessage",
    "MessagePart",
    "OutputMessage",
    "Part",
    "Reasoning",
    "Text",
    "ToolCallRequest",
    "ToolCallResponse",
    "genai_messages",
    "message_dict",
    "part_dict",
]
