"""Cohere's v2 Chat wire, as the cohere SDK's ``ClientV2`` calls it (``base_url=server.url``), written from
the API reference of ``POST /v2/chat`` and its streaming events:

- ``"stream": false``: one JSON object ``{id, finish_reason, message, usage}``;
- ``"stream": true``: Server-Sent Events, ``event:`` the type and ``data:`` an object with the same
  ``type``: ``message-start``, then per text ``content-start`` / ``content-delta`` / ``content-end``, or
  for tool calls ``tool-plan-delta`` (the model's plan, the text before its calls), then per call
  ``tool-call-start`` (id and name) / ``tool-call-delta`` (argument fragments) / ``tool-call-end``, and
  ``message-end`` with ``finish_reason`` and ``usage``; no end marker.

A reply with tool calls puts its text in ``message.tool_plan`` (no ``content``), as the API does.
``finish_reason``: ``COMPLETE``, ``STOP_SEQUENCE``, ``MAX_TOKENS``, ``TOOL_CALL``, ``ERROR``, ``TIMEOUT``.
Usage: ``billed_units`` and ``tokens`` (``input_tokens``, ``output_tokens``) and ``cached_tokens``. Tool
results are ``{"role": "tool", "tool_call_id", "content"}``. HTTP errors: ``{"id", "message"}`` (the SDK
raises its ``TooManyRequestsError``, ``InternalServerError``, ... by status); a failure in the middle of a
stream ends it with ``message-end`` whose ``finish_reason`` is ``ERROR`` and ``delta.error`` the message
(the SDK hands that event to the user; it raises nothing).
"""

from __future__ import annotations

from typing import Any

from .base import Frame, Renderer, Route, Wire, arg_pieces, pieces

CHAT = "cohere_chat"

_FINISH = {"COMPLETE", "STOP_SEQUENCE", "MAX_TOKENS", "TOOL_CALL", "ERROR", "TIMEOUT"}
_FROM_NEUTRAL = {"stop": "COMPLETE", "tool_calls": "TOOL_CALL", "length": "MAX_TOKENS", "content_filter": "ERROR"}
_ERRORS = {400: "invalid request: message must be at least 1 token long", 401: "invalid api token",
           404: "model 'fake' not found", 422: "unprocessable entity", 429: "You are using a Trial key, which is "
           "limited to 10 API calls / minute.", 500: "internal server error, this has been reported to our "
           "developers", 503: "service unavailable"}


class CohereRenderer(Renderer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Cohere's ids name the function (get_weather_8h5r1q7z); a script's own ids are kept
        self.call_ids = [tc.id if tc.id is not None else f"{tc.name}_fake{self.n:05d}{i}"
                         for i, tc in enumerate(self.reply.calls)]

    def _finish(self) -> str:
        return self.stop(_FINISH, _FROM_NEUTRAL)

    def _usage(self) -> dict[str, Any]:
        u = self.usage
        tokens = {"input_tokens": u.input_tokens, "output_tokens": u.output_tokens}
        return {"billed_units": dict(tokens), "tokens": tokens, "cached_tokens": u.cached_tokens,
                **self.reply.usage_extra}

    def _call(self, i: int, *, arguments: str | None = None) -> dict[str, Any]:
        tc = self.reply.calls[i]
        return {"id": self.call_ids[i], "type": "function",
                "function": {"name": tc.name, "arguments": tc.arguments_json if arguments is None else arguments}}

    def json_body(self) -> dict[str, Any]:
        r = self.reply
        message: dict[str, Any] = {"role": "assistant"}
        if r.calls:
            if r.text:
                message["tool_plan"] = r.text
            message["tool_calls"] = [self._call(i) for i in range(len(r.calls))]
        else:
            message["content"] = [{"type": "text", "text": r.text or ""}]
        return {"id": f"fake-{self.n:05d}", "finish_reason": self._finish(), "message": message,
                "usage": self._usage()}

    def frames(self) -> list[Frame]:
        r = self.reply
        frames: list[Frame] = []

        def ev(kind: str, **data: Any) -> None:
            frames.append((kind, {"type": kind, **data}))

        ev("message-start", id=f"fake-{self.n:05d}",
           delta={"message": {"role": "assistant", "content": [], "tool_plan": "", "tool_calls": [], "citations": []}})
        if r.calls:
            for p in pieces(r.text or "", r.chunk_size):
                ev("tool-plan-delta", delta={"message": {"tool_plan": p}})
            for i, tc in enumerate(r.calls):
                ev("tool-call-start", index=i, delta={"message": {"tool_calls": self._call(i, arguments="")}})
                for p in arg_pieces(tc.arguments_json, r.chunk_size):
                    ev("tool-call-delta", index=i, delta={"message": {"tool_calls": {"function": {"arguments": p}}}})
                ev("tool-call-end", index=i)
        else:
            ev("content-start", index=0, delta={"message": {"content": {"type": "text", "text": ""}}})
            for p in pieces(r.text or "", r.chunk_size):
                ev("content-delta", index=0, delta={"message": {"content": {"text": p}}})
            ev("content-end", index=0)
        ev("message-end", id=f"fake-{self.n:05d}", delta={"finish_reason": self._finish(), "usage": self._usage()})
        return frames

    def error_body(self, status: int) -> dict[str, Any]:
        return {"id": f"fake-{self.n:05d}", "message": self.reply.error_message or _ERRORS.get(status, f"HTTP {status}")}

    def stream_error_frame(self, seq: int) -> Frame:
        msg = self.reply.error_message or "internal server error, this has been reported to our developers"
        return "message-end", {"type": "message-end", "id": f"fake-{self.n:05d}",
                               "delta": {"error": msg, "finish_reason": "ERROR", "usage": self._usage()}}


class CohereWire(Wire):
    name = "cohere"
    routes = (Route("/v2/chat", CHAT),)
    renderer = CohereRenderer

    def tool_results(self, api: str, body: Any) -> list[dict[str, Any]]:
        return [{"id": m.get("tool_call_id"), "content": m.get("content")}
                for m in (body.get("messages") if isinstance(body, dict) else None) or ()
                if isinstance(m, dict) and m.get("role") == "tool"]
