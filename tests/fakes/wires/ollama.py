"""Ollama's native chat wire, as the ollama SDK calls it (``ollama.Client(host=server.url)``), written from
Ollama's API reference (``docs/api.md``, "Generate a chat completion"):

- ``POST /api/chat``: with ``"stream": false`` one JSON object; streaming is the default (``stream``
  absent or true): newline-delimited JSON (``application/x-ndjson``), one object a line, each with
  ``done: false`` and a piece of ``message.content``, then one with ``done: true``, ``done_reason`` and
  the counts.

A message's ``tool_calls`` are ``[{"function": {"name", "arguments": {...}}}]``: arguments an object, no
call ids; a streamed call comes whole in one line. Tool results are ``{"role": "tool", "content",
"tool_name"}``. ``done_reason`` is ``stop`` for text and tool calls alike, ``length`` at ``num_predict``.
Usage: ``prompt_eval_count`` (input), ``eval_count`` (output), with durations in nanoseconds. Errors:
``{"error": "message"}`` as the HTTP body, and as a stream's failing line, which the SDK raises as
``ollama.ResponseError``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from .base import NDJSON, Frame, Renderer, Route, Wire, pieces

CHAT = "ollama_chat"

_DONE = {"stop", "length", "load", "unload"}
_FROM_NEUTRAL = {"stop": "stop", "tool_calls": "stop", "length": "length", "content_filter": "stop"}
_ERRORS = {400: "invalid request", 404: "model 'fake' not found, try pulling it first",
           500: "llama runner process has terminated: exit status 2", 503: "server busy, please try again"}


class OllamaRenderer(Renderer):
    def _stamp(self) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime(self.created))

    def _line(self, message: dict[str, Any], *, done: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "created_at": self._stamp(), "message": message, "done": done}
        if done:
            u = self.usage
            out.update({"done_reason": self.stop(_DONE, _FROM_NEUTRAL), "total_duration": 412_000_000,
                        "load_duration": 12_000_000, "prompt_eval_count": u.input_tokens,
                        "prompt_eval_duration": 100_000_000, "eval_count": u.output_tokens,
                        "eval_duration": 300_000_000, **self.reply.usage_extra})
        return out

    def _calls(self) -> list[dict[str, Any]]:
        return [{"function": {"name": tc.name, "arguments": tc.arguments_dict}} for tc in self.reply.calls]

    def json_body(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.reply.text or ""}
        if self.reply.calls:
            message["tool_calls"] = self._calls()
        return self._line(message, done=True)

    def frames(self) -> list[Frame]:
        r = self.reply
        frames: list[Frame] = [(None, self._line({"role": "assistant", "content": p}, done=False))
                               for p in pieces(r.text or "", r.chunk_size)]
        if r.calls:
            frames.append((None, self._line({"role": "assistant", "content": "", "tool_calls": self._calls()},
                                            done=False)))
        frames.append((None, self._line({"role": "assistant", "content": ""}, done=True)))
        return frames

    def error_body(self, status: int) -> dict[str, Any]:
        return {"error": self.reply.error_message or _ERRORS.get(status, f"HTTP {status}")}

    def stream_error_frame(self, seq: int) -> Frame:
        return None, {"error": self.reply.error_message or "an error was encountered while running the model"}


class OllamaWire(Wire):
    name = "ollama"
    routes = (Route("/api/chat", CHAT),)
    renderer = OllamaRenderer
    framing = NDJSON

    def is_stream(self, api: str, params: Mapping[str, str], body: Any) -> bool:
        return isinstance(body, dict) and body.get("stream", True) is not False  # Ollama streams by default

    def tool_results(self, api: str, body: Any) -> list[dict[str, Any]]:
        return [{"id": None, "name": m.get("tool_name"), "content": m.get("content")}
                for m in (body.get("messages") if isinstance(body, dict) else None) or ()
                if isinstance(m, dict) and m.get("role") == "tool"]
