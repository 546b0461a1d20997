"""The fake model server's wires: one module per provider API (routes, request reading, renderer, framing).

``WIRES`` lists them; :func:`route` finds the wire and API a request path is for. A new provider is a module
here with a :class:`~fakes.wires.base.Wire` subclass, added to ``WIRES``; the server needs no change.
"""

from __future__ import annotations

from .anthropic import AnthropicWire
from .base import Frame, Framing, Renderer, Route, Wire
from .bedrock import BedrockWire
from .cohere import CohereWire
from .gemini import GeminiWire
from .groq import GroqWire
from .mistral import MistralWire
from .ollama import OllamaWire
from .openai import OpenAIWire

__all__ = ["WIRES", "Frame", "Framing", "Renderer", "Route", "Wire", "route", "wire_named"]

WIRES: tuple[Wire, ...] = (OpenAIWire(), AnthropicWire(), GeminiWire(), OllamaWire(), CohereWire(), MistralWire(), GroqWire(), BedrockWire())


def route(path: str) -> tuple[Wire, str, dict[str, str]] | None:
    """``(wire, api, path parameters)`` of the first route that matches ``path`` (trailing ``/`` ignored)."""
    path = path.rstrip("/") or "/"
    for wire in WIRES:
        for r in wire.routes:
            params = r.match(path)
            if params is not None:
                return wire, r.api, params
    return None


def wire_named(name: str) -> Wire | None:
    return next((w for w in WIRES if w.name == name), None)
