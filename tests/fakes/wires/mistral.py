"""Mistral's chat wire, as the mistralai SDK calls it (``Mistral(api_key=..., server_url=server.mistral_url)``,
which is the server's ``/mistral`` prefix: the path itself is OpenAI's), written from Mistral's API reference of
``POST /v1/chat/completions``:

- JSON: ``{id, object: "chat.completion", model, created, usage, choices: [{index, message, finish_reason}]}``,
  the message's ``tool_calls`` ``[{id, type: "function", function: {name, arguments}, index}]`` with Mistral's
  9-character ids and arguments as a JSON string;
- ``"stream": true``: SSE ``data:`` chunks ``chat.completion.chunk``, text in pieces, each tool call whole in
  one delta (Mistral does not split arguments), the last chunk with ``finish_reason`` and ``usage``, then
  ``data: [DONE]``.

``finish_reason``: ``stop``, ``length``, ``model_length``, ``tool_calls``, ``error``. Usage: ``prompt_tokens``,
``completion_tokens``, ``total_tokens`` (no details). Errors: ``{"object": "error", "message", "type",
"param", "code"}``; the SDK raises ``errors.SDKError`` for any 4xx/5xx but 422 (``HTTPValidationError``,
``{"detail": [...]}``). A stream's failing chunk is that error object, which the SDK cannot read as a chunk
(``errors.ResponseValidationError``).
"""

from __future__ import annotations

from typing import Any

from .base import Frame, Route, pieces
from .openai import OpenAIRenderer, OpenAIWire

CHAT = "mistral_chat"

_FINISH = {"stop", "length", "model_length", "tool_calls", "error"}
_FROM_NEUTRAL = {"stop": "stop", "tool_calls": "tool_calls", "length": "length", "content_filter": "stop"}
_ERRORS = {400: ("invalid_request_error", "Invalid model: fake"), 401: ("authentication_error", "Unauthorized"),
           404: ("invalid_request_error", "Not Found"), 429: ("rate_limited", "Requests rate limit exceeded"),
           500: ("internal_server_error", "Internal server error"), 503: ("service_unavailable",
                                                                           "Service unavailable")}


class MistralRenderer(OpenAIRenderer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.call_ids = [tc.id if tc.id is not None else f"fk{self.n:05d}{i:02d}"[:9].ljust(9, "x")
                         for i, tc in enumerate(self.reply.calls)]

    def _usage(self) -> dict[str, Any]:
        u = self.usage
        return {"prompt_tokens": u.input_tokens, "completion_tokens": u.output_tokens,
                "total_tokens": u.input_tokens + u.output_tokens, **self.reply.usage_extra}

    def _calls(self) -> list[dict[str, Any]]:
        return [{"id": cid, "type": "function", "function": {"name": tc.name, "arguments": tc.arguments_json},
                 "index": i} for i, (cid, tc) in enumerate(zip(self.call_ids, self.reply.calls))]

    def json_body(self) -> dict[str, Any]:
        r = self.reply
        message: dict[str, Any] = {"role": "assistant", "content": r.text or "", "prefix": False}
        if r.calls:
            message["tool_calls"] = self._calls()
        return {"id": f"fake{self.n:05d}", "object": "chat.completion", "model": self.model, "created": self.created,
                "usage": self._usage(),
                "choices": [{"index": 0, "message": message, "finish_reason": self.stop(_FINISH, _FROM_NEUTRAL)}]}

    def frames(self) -> list[Frame]:
        r = self.reply
        base = {"id": f"fake{self.n:05d}", "object": "chat.completion.chunk", "created": self.created,
                "model": self.model}

        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> Frame:
            return None, {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}

        frames = [chunk({"role": "assistant", "content": ""})]
        frames += [chunk({"content": p}) for p in pieces(r.text or "", r.chunk_size)]
        if r.calls:
            frames.append(chunk({"tool_calls": self._calls()}))
        frames.append(chunk({"content": ""}, self.stop(_FINISH, _FROM_NEUTRAL), usage=self._usage()))
        frames.append((None, "[DONE]"))
        return frames

    def _error(self, status: int) -> dict[str, Any]:
        etype, msg = _ERRORS.get(status, ("internal_server_error" if status >= 500 else "invalid_request_error",
                                          f"HTTP {status}"))
        return {"object": "error", "message": self.reply.error_message or msg, "type": self.reply.error_type or etype,
                "param": None, "code": str(status)}

    def error_body(self, status: int) -> dict[str, Any]:
        if status == 422:
            return {"detail": [{"type": "missing", "loc": ["body", "model"], "msg": self.reply.error_message or
                                "Field required", "input": None}]}
        return self._error(status)

    def stream_error_frame(self, seq: int) -> Frame:
        return None, self._error(500)


class MistralWire(OpenAIWire):
    name = "mistral"
    routes = (Route("/mistral/v1/chat/completions", CHAT),)
    renderer = MistralRenderer

    def tool_results(self, api: str, body: Any) -> list[dict[str, Any]]:
        return [{"id": m.get("tool_call_id"), "name": m.get("name"), "content": m.get("content")}
                for m in (body.get("messages") if isinstance(body, dict) else None) or ()
                if isinstance(m, dict) and m.get("role") == "tool"]
