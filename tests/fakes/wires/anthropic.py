"""Anthropic's wire: Messages (``POST /v1/messages``, JSON or ``stream: true`` Server-Sent Events) and its
token count (``POST /v1/messages/count_tokens``, answered without consuming a reply), as the API reference
and the anthropic SDK's types describe them."""

from __future__ import annotations

from typing import Any

from .base import Frame, Renderer, Route, Wire, arg_pieces, pieces

MESSAGES = "messages"
COUNT_TOKENS = "count_tokens"

_MESSAGES_STOP = {"end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal",
                  "model_context_window_exceeded"}
_FROM_NEUTRAL = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens", "content_filter": "refusal"}

_ANTHROPIC_ERRORS = {
    400: ("invalid_request_error", "Invalid request."),
    401: ("authentication_error", "invalid x-api-key"),
    403: ("permission_error", "Forbidden."),
    404: ("not_found_error", "Not found."),
    413: ("request_too_large", "Request exceeds the maximum allowed number of bytes."),
    429: ("rate_limit_error", "Number of requests has exceeded your rate limit."),
    500: ("api_error", "Internal server error"),
    529: ("overloaded_error", "Overloaded"),
}



class AnthropicRenderer(Renderer):
    """Messages bodies and SSE frames."""

    call_id_prefix = "toolu_fake"

    def error_body(self, status: int) -> dict[str, Any]:
        r = self.reply
        etype, msg = _ANTHROPIC_ERRORS.get(status, ("api_error" if status >= 500 else "invalid_request_error",
                                                    f"HTTP {status}"))
        return {"type": "error", "error": {"type": r.error_type or etype, "message": r.error_message or msg},
                "request_id": self.request_id}

    def stream_error_frame(self, seq: int) -> Frame:
        r = self.reply
        msg = r.error_message or "The server had an error while streaming the response."
        return "error", {"type": "error", "error": {"type": r.error_type or "overloaded_error", "message": msg},
                         "request_id": self.request_id}

    def json_body(self) -> dict[str, Any]:
        return self._messages_json()

    def frames(self) -> list[Frame]:
        return self._messages_frames()

    # ---- Anthropic Messages ---------------------------------------------------------------------------------------

    def _messages_usage(self, *, start: bool = False) -> dict[str, Any]:
        u = self.usage
        return {
            "input_tokens": u.input_tokens,
            "cache_creation_input_tokens": u.cache_creation_tokens,
            "cache_read_input_tokens": u.cached_tokens,
            "output_tokens": min(1, u.output_tokens) if start else u.output_tokens,
            "service_tier": "standard",
            **({} if start else self.reply.usage_extra),
        }

    def _messages_blocks(self) -> list[dict[str, Any]]:
        r = self.reply
        blocks: list[dict[str, Any]] = []
        if r.text:
            blocks.append({"type": "text", "text": r.text})
        for cid, tc in zip(self.call_ids, r.calls):
            blocks.append({"type": "tool_use", "id": cid, "name": tc.name, "input": tc.arguments_dict})
        return blocks

    def _stop_details(self) -> dict[str, Any] | None:
        """Anthropic's ``stop_details`` of a refusal with an explanation (``Reply.refusal``), else None."""
        r = self.reply
        if r.refusal is None or self.stop(_MESSAGES_STOP, _FROM_NEUTRAL) != "refusal":
            return None
        return {"type": "refusal", "category": r.refusal_category, "explanation": r.refusal}

    def _message_obj(self, content: list[dict[str, Any]], *, final: bool) -> dict[str, Any]:
        message = {
            "id": f"msg_fake_{self.n:05d}",
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": self.stop(_MESSAGES_STOP, _FROM_NEUTRAL) if final else None,
            "stop_sequence": None,
            "usage": self._messages_usage(start=not final),
        }
        details = self._stop_details() if final else None
        if details is not None:
            message["stop_details"] = details
        return message

    def _messages_json(self) -> dict[str, Any]:
        return self._message_obj(self._messages_blocks(), final=True)

    def _messages_frames(self) -> list[Frame]:
        r = self.reply
        start = {"type": "message_start", "message": self._message_obj([], final=False)}
        frames: list[Frame] = [("message_start", start), ("ping", {"type": "ping"})]
        for idx, block in enumerate(self._messages_blocks()):
            if block["type"] == "text":
                frames.append(("content_block_start", {"type": "content_block_start", "index": idx,
                                                       "content_block": {"type": "text", "text": ""}}))
                frames += [("content_block_delta", {"type": "content_block_delta", "index": idx,
                                                    "delta": {"type": "text_delta", "text": p}})
                           for p in pieces(block["text"], r.chunk_size)]
            else:
                tc = r.calls[idx - (1 if r.text else 0)]
                frames.append(("content_block_start", {"type": "content_block_start", "index": idx,
                                                       "content_block": {**block, "input": {}}}))
                # like the real API: an empty partial_json first, then fragments of the JSON text
                args = tc.arguments_json
                frames += [("content_block_delta", {"type": "content_block_delta", "index": idx,
                                                    "delta": {"type": "input_json_delta", "partial_json": p}})
                           for p in ["", *arg_pieces(args, r.chunk_size)]]
            frames.append(("content_block_stop", {"type": "content_block_stop", "index": idx}))
        usage = self._messages_usage()
        usage.pop("service_tier")
        delta: dict[str, Any] = {"stop_reason": self.stop(_MESSAGES_STOP, _FROM_NEUTRAL), "stop_sequence": None}
        details = self._stop_details()
        if details is not None:
            delta["stop_details"] = details
        frames.append(("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}))
        frames.append(("message_stop", {"type": "message_stop"}))
        return frames


class AnthropicWire(Wire):
    name = "anthropic"
    routes = (Route("/v1/messages", MESSAGES), Route("/v1/messages/count_tokens", COUNT_TOKENS))
    renderer = AnthropicRenderer
    request_id_header = "request-id"

    def tool_results(self, api: str, body: Any) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if not isinstance(body, dict):
            return out
        for m in body.get("messages") or ():
            content = m.get("content") if isinstance(m, dict) else None
            for block in content if isinstance(content, list) else ():
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    out.append({"id": block.get("tool_use_id"), "content": block.get("content"),
                                "is_error": bool(block.get("is_error"))})
        return out

    def direct(self, api: str, body: dict[str, Any], raw: bytes) -> Any | None:
        return {"input_tokens": max(1, len(raw) // 4)} if api == COUNT_TOKENS else None
