"""OpenAI's wire: Chat Completions (``POST /v1/chat/completions``) and Responses (``POST /v1/responses``), JSON
or ``stream: true`` Server-Sent Events, as the API reference and the openai SDK's types describe them. Chat
Completions is also what OpenAI-compatible servers speak; ``wires/groq.py`` and ``wires/mistral.py`` are its
variants."""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import Any

from ..script import CANONICAL_STOP, Reply
from .base import Frame, Renderer, Route, Wire, arg_pieces, content_text, pieces

CHAT = "chat"
RESPONSES = "responses"

_CHAT_STOP = {"stop", "length", "tool_calls", "content_filter", "function_call"}

_OPENAI_ERRORS = {
    400: ("invalid_request_error", None, "Invalid request."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided."),
    403: ("invalid_request_error", "unsupported_country_region_territory", "Forbidden."),
    404: ("invalid_request_error", "model_not_found", "The model does not exist."),
    429: ("requests", "rate_limit_exceeded", "Rate limit reached for requests. Please try again later."),
    500: ("server_error", None, "The server had an error while processing your request."),
    503: ("server_error", None, "The engine is currently overloaded, please try again later."),
}

def _responses_status(reply: Reply) -> tuple[str, dict[str, str] | None]:
    stop = reply.stop or ("tool_calls" if reply.calls else "stop")
    if stop == "max_output_tokens":
        return "incomplete", {"reason": "max_output_tokens"}
    canonical = CANONICAL_STOP.get(stop)
    if canonical == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if canonical == "content_filter":
        return "incomplete", {"reason": "content_filter"}
    if canonical is None:
        raise ValueError(f"unknown stop reason {stop!r}")
    return "completed", None


class OpenAIRenderer(Renderer):
    """Chat Completions and Responses bodies and SSE frames."""

    def error_body(self, status: int) -> dict[str, Any]:
        r = self.reply
        etype, code, msg = _OPENAI_ERRORS.get(status, ("server_error" if status >= 500 else "invalid_request_error",
                                                      None, f"HTTP {status}"))
        return {"error": {"message": r.error_message or msg, "type": r.error_type or etype, "param": None,
                          "code": code}}

    def stream_error_frame(self, seq: int) -> Frame:
        r = self.reply
        msg = r.error_message or "The server had an error while streaming the response."
        if self.api == CHAT:
            return None, {"error": {"message": msg, "type": r.error_type or "server_error", "param": None,
                                    "code": None}}
        return "error", {"type": "error", "code": r.error_type or "server_error", "message": msg, "param": None,
                         "sequence_number": seq}

    def json_body(self) -> dict[str, Any]:
        return self._chat_json() if self.api == CHAT else self._responses_json()

    def frames(self) -> list[Frame]:
        return self._chat_frames() if self.api == CHAT else self._responses_frames()

    # ---- Chat Completions -----------------------------------------------------------------------------------------

    def _chat_usage(self) -> dict[str, Any]:
        u = self.usage
        return {
            "prompt_tokens": u.input_tokens,
            "completion_tokens": u.output_tokens,
            "total_tokens": u.input_tokens + u.output_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens, "cache_write_tokens": u.cache_creation_tokens,
                                      "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens, "audio_tokens": 0,
                                          "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
            **self.reply.usage_extra,
        }

    def _chat_content(self) -> str | None:
        if self.reply.text is not None:
            return self.reply.text
        return None if self.reply.calls else ""

    def _chat_choice(self, reply: Reply, index: int, call_ids: Sequence[str]) -> dict[str, Any]:
        content = reply.text if reply.text is not None else (None if reply.calls or reply.refusal else "")
        message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": reply.refusal,
                                   "annotations": []}
        if reply.calls:
            message["tool_calls"] = [
                {**({} if tc.omit_id else {"id": cid}), "type": "function",
                 "function": {"name": tc.name, "arguments": tc.arguments_json}}
                for cid, tc in zip(call_ids, reply.calls)
            ]
        return {"index": index, "message": message, "logprobs": None, "finish_reason": self.stop(_CHAT_STOP, reply=reply)}

    def _other_call_ids(self, index: int, reply: Reply) -> list[str]:
        return [tc.id or f"call_fake_{self.n:05d}_c{index}_{i}" for i, tc in enumerate(reply.calls)]

    def _chat_json(self) -> dict[str, Any]:
        choices = [self._chat_choice(self.reply, 0, self.call_ids)]
        choices += [self._chat_choice(c, i, self._other_call_ids(i, c)) for i, c in enumerate(self.reply.choices, 1)]
        return {
            "id": f"chatcmpl-fake{self.n:05d}",
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self._chat_usage(),
            "service_tier": "default",
            "system_fingerprint": "fp_fake",
        }

    def _chat_frames(self) -> list[Frame]:
        opts = self.body.get("stream_options") or {}
        include_usage = bool(opts.get("include_usage"))
        base: dict[str, Any] = {"id": f"chatcmpl-fake{self.n:05d}", "object": "chat.completion.chunk",
                                "created": self.created, "model": self.model, "service_tier": "default",
                                "system_fingerprint": "fp_fake"}

        def chunk(delta: dict[str, Any], finish: str | None = None, index: int = 0) -> Frame:
            data = {**base, "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}]}
            if include_usage:
                data["usage"] = None
            return None, data

        frames: list[Frame] = []
        for index, (r, call_ids) in enumerate(
            [(self.reply, self.call_ids)] + [(c, self._other_call_ids(i, c)) for i, c in enumerate(self.reply.choices, 1)]
        ):
            content = r.text if r.text is not None else (None if r.calls or r.refusal else "")
            frames.append(chunk({"role": "assistant", "content": "" if content is not None else None, "refusal": None},
                                index=index))
            frames += [chunk({"content": p}, index=index) for p in pieces(r.text or "", r.chunk_size)]
            frames += [chunk({"refusal": p}, index=index) for p in pieces(r.refusal or "", r.chunk_size)]
            for i, (cid, tc) in enumerate(zip(call_ids, r.calls)):
                frames.append(chunk({"tool_calls": [
                    {"index": i, **({} if tc.omit_id else {"id": cid}), "type": "function",
                     "function": {"name": tc.name, "arguments": ""}}]},
                    index=index))
                repeated = {"id": cid, "type": "function"} if r.repeat_call_fields else {}
                named = {"name": tc.name} if r.repeat_call_fields else {}
                frames += [chunk({"tool_calls": [{"index": i, **repeated, "function": {**named, "arguments": p}}]},
                                 index=index)
                           for p in arg_pieces(tc.arguments_json, r.chunk_size)]
            frames.append(chunk({}, self.stop(_CHAT_STOP, reply=r), index=index))
        if include_usage:
            frames.append((None, {**base, "choices": [], "usage": self._chat_usage()}))
        frames.append((None, "[DONE]"))
        return frames

    # ---- Responses ------------------------------------------------------------------------------------------------

    def _responses_usage(self) -> dict[str, Any]:
        u = self.usage
        return {
            "input_tokens": u.input_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_tokens, "cache_write_tokens": u.cache_creation_tokens},
            "output_tokens": u.output_tokens,
            "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
            "total_tokens": u.input_tokens + u.output_tokens,
            **self.reply.usage_extra,
        }

    def _responses_items(self) -> list[dict[str, Any]]:
        r = self.reply
        items: list[dict[str, Any]] = []
        if r.refusal is not None:
            items.append({"id": f"msg_fake_{self.n:05d}", "type": "message", "status": "completed",
                          "role": "assistant", "content": [{"type": "refusal", "refusal": r.refusal}]})
        elif r.text or not r.calls:
            items.append({"id": f"msg_fake_{self.n:05d}", "type": "message", "status": "completed",
                          "role": "assistant",
                          "content": [{"type": "output_text", "text": r.text or "", "annotations": [],
                                       "logprobs": []}]})
        for i, (cid, tc) in enumerate(zip(self.call_ids, r.calls)):
            items.append({"id": f"fc_fake_{self.n:05d}_{i}", "type": "function_call", "status": "completed",
                          "call_id": cid, "name": tc.name, "arguments": tc.arguments_json})
        return items

    def _response_obj(self, status: str, output: list[dict[str, Any]], *, final: bool) -> dict[str, Any]:
        b = self.body
        incomplete = _responses_status(self.reply)[1] if final else None
        return {
            "id": f"resp_fake_{self.n:05d}",
            "object": "response",
            "created_at": self.created,
            "status": status,
            "background": False,
            "completed_at": int(time.time()) if final and status == "completed" else None,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": b.get("instructions"),
            "max_output_tokens": b.get("max_output_tokens"),
            "max_tool_calls": b.get("max_tool_calls"),
            "model": self.model,
            "output": output,
            "parallel_tool_calls": b.get("parallel_tool_calls", True),
            "previous_response_id": b.get("previous_response_id"),
            "reasoning": {"effort": None, "summary": None},
            "service_tier": "default",
            "store": b.get("store", True),
            "temperature": b.get("temperature", 1.0),
            "text": b.get("text") or {"format": {"type": "text"}, "verbosity": "medium"},
            "tool_choice": b.get("tool_choice", "auto"),
            "tools": b.get("tools") or [],
            "top_p": b.get("top_p", 1.0),
            "truncation": b.get("truncation", "disabled"),
            "usage": self._responses_usage() if final else None,
            "user": None,
            "metadata": b.get("metadata") or {},
        }

    def _responses_json(self) -> dict[str, Any]:
        status, _ = _responses_status(self.reply)
        return self._response_obj(status, self._responses_items(), final=True)

    def _responses_frames(self) -> list[Frame]:
        r = self.reply
        frames: list[Frame] = []
        seq = itertools.count()

        def ev(kind: str, **data: Any) -> None:
            frames.append((kind, {"type": kind, "sequence_number": next(seq), **data}))

        ev("response.created", response=self._response_obj("in_progress", [], final=False))
        ev("response.in_progress", response=self._response_obj("in_progress", [], final=False))
        items = self._responses_items()
        for idx, item in enumerate(items):
            if item["type"] == "message" and item["content"][0]["type"] == "refusal":
                refusal = item["content"][0]["refusal"]
                ev("response.output_item.added", output_index=idx,
                   item={**item, "status": "in_progress", "content": []})
                part = {"type": "refusal", "refusal": ""}
                ev("response.content_part.added", item_id=item["id"], output_index=idx, content_index=0, part=part)
                for p in pieces(refusal, r.chunk_size):
                    ev("response.refusal.delta", item_id=item["id"], output_index=idx, content_index=0, delta=p)
                ev("response.refusal.done", item_id=item["id"], output_index=idx, content_index=0, refusal=refusal)
                ev("response.content_part.done", item_id=item["id"], output_index=idx, content_index=0,
                   part={**part, "refusal": refusal})
            elif item["type"] == "message":
                text = item["content"][0]["text"]
                ev("response.output_item.added", output_index=idx,
                   item={**item, "status": "in_progress", "content": []})
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                ev("response.content_part.added", item_id=item["id"], output_index=idx, content_index=0, part=part)
                for p in pieces(text, r.chunk_size):
                    ev("response.output_text.delta", item_id=item["id"], output_index=idx, content_index=0, delta=p,
                       logprobs=[])
                ev("response.output_text.done", item_id=item["id"], output_index=idx, content_index=0, text=text,
                   logprobs=[])
                ev("response.content_part.done", item_id=item["id"], output_index=idx, content_index=0,
                   part={**part, "text": text})
            else:
                ev("response.output_item.added", output_index=idx,
                   item={**item, "status": "in_progress", "arguments": ""})
                for p in arg_pieces(item["arguments"], r.chunk_size):
                    ev("response.function_call_arguments.delta", item_id=item["id"], output_index=idx, delta=p)
                ev("response.function_call_arguments.done", item_id=item["id"], output_index=idx,
                   name=item["name"], arguments=item["arguments"])
            ev("response.output_item.done", output_index=idx, item=item)
        status, _ = _responses_status(r)
        terminal = "response.completed" if status == "completed" else "response.incomplete"
        ev(terminal, response=self._response_obj(status, items, final=True))
        return frames


class OpenAIWire(Wire):
    name = "openai"
    # Azure OpenAI's deployment path is Chat Completions too (LiteLLM's azure route)
    routes = (Route("/v1/chat/completions", CHAT), Route(r"/openai/deployments/[^/]+/chat/completions", CHAT),
              Route("/v1/responses", RESPONSES))
    renderer = OpenAIRenderer

    def first_user_text(self, api: str, body: Any) -> str:
        if api != RESPONSES:
            return super().first_user_text(api, body)
        items = body.get("input") if isinstance(body, dict) else None
        if isinstance(items, str):
            return items
        for item in items or ():
            if isinstance(item, dict) and item.get("role") == "user":
                return content_text(item.get("content"))
        return ""

    def tool_results(self, api: str, body: Any) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if not isinstance(body, dict):
            return out
        if api == RESPONSES:
            items = body.get("input")
            for it in items if isinstance(items, list) else ():
                if isinstance(it, dict) and it.get("type") == "function_call_output":
                    out.append({"id": it.get("call_id"), "content": it.get("output")})
            return out
        for m in body.get("messages") or ():
            if isinstance(m, dict) and m.get("role") == "tool":
                out.append({"id": m.get("tool_call_id"), "content": m.get("content")})
        return out
