"""Groq's chat wire, as the groq SDK calls it (``Groq(base_url=server.url)``: ``POST /openai/v1/chat/completions``),
written from Groq's API reference: OpenAI's Chat Completions (wires/openai.py) with Groq's additions:

- ``usage`` adds its timings (``queue_time``, ``prompt_time``, ``completion_time``, ``total_time``, seconds);
- every response carries ``x_groq: {"id": "req_..."}``; in a stream the first chunk has it, and the chunk with
  the ``finish_reason`` has ``x_groq.usage`` (the call's usage, whatever ``stream_options`` says) beside it;
- errors are OpenAI's ``{"error": {"message", "type", "code"}}`` (the SDK raises ``groq.RateLimitError``, ...),
  and so is a stream's failing ``data:`` line (``groq.APIError``).
"""

from __future__ import annotations

from typing import Any

from .base import Frame, Route
from .openai import CHAT as _OPENAI_CHAT
from .openai import OpenAIRenderer, OpenAIWire

CHAT = "groq_chat"


class GroqRenderer(OpenAIRenderer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.api = _OPENAI_CHAT  # OpenAI's Chat Completions rendering, with the additions below

    def _chat_usage(self) -> dict[str, Any]:
        return {**super()._chat_usage(), "queue_time": 0.012, "prompt_time": 0.004, "completion_time": 0.031,
                "total_time": 0.035}

    def _x_groq(self) -> dict[str, Any]:
        return {"id": f"req_fake{self.n:05d}"}

    def json_body(self) -> dict[str, Any]:
        return {**super().json_body(), "x_groq": self._x_groq()}

    def frames(self) -> list[Frame]:
        frames = super().frames()
        out: list[Frame] = []
        for i, (event, data) in enumerate(frames):
            if isinstance(data, dict) and data.get("choices"):
                if i == 0:
                    data = {**data, "x_groq": self._x_groq()}
                elif data["choices"][0].get("finish_reason") is not None:
                    data = {**data, "x_groq": {**self._x_groq(), "usage": self._chat_usage()}}
            out.append((event, data))
        return out


class GroqWire(OpenAIWire):
    name = "groq"
    routes = (Route("/openai/v1/chat/completions", CHAT),)
    renderer = GroqRenderer

    def first_user_text(self, api: str, body: Any) -> str:
        return super().first_user_text(_OPENAI_CHAT, body)

    def tool_results(self, api: str, body: Any) -> list[dict[str, Any]]:
        return super().tool_results(_OPENAI_CHAT, body)
