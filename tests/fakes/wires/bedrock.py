"""Amazon Bedrock Runtime's Converse wire, as boto3's ``bedrock-runtime`` client calls it (``endpoint_url=
server.url``, any credentials: the signature is recorded, never checked), written from the API reference of
``Converse`` and ``ConverseStream``:

- ``POST /model/{modelId}/converse``: JSON ``{output: {message: {role, content}}, stopReason, usage, metrics}``;
  content blocks ``{"text"}`` and ``{"toolUse": {toolUseId, name, input}}`` (input an object);
- ``POST /model/{modelId}/converse-stream``: the AWS event-stream binary framing (wires/eventstream.py):
  ``messageStart``, per block ``contentBlockStart`` (a tool use's id and name; none for text),
  ``contentBlockDelta`` (``{"text"}`` or ``{"toolUse": {"input": JSON fragment}}``), ``contentBlockStop``, then
  ``messageStop`` (``stopReason``) and ``metadata`` (``usage``, ``metrics``).

The model id is URL-encoded in the path (``anthropic.claude-...-v1%3A0``); ``RecordedRequest.model`` decodes it.
``stopReason``: ``end_turn``, ``tool_use``, ``max_tokens``, ``stop_sequence``, ``guardrail_intervened``,
``content_filtered``, ``model_context_window_exceeded``. Usage: ``inputTokens``, ``outputTokens``,
``totalTokens``, ``cacheReadInputTokens``, ``cacheWriteInputTokens``. Tool results come back in a user message:
``{"toolResult": {toolUseId, content: [{"json"} | {"text"}], status}}``. HTTP errors: ``{"message"}`` with the
error's name in ``x-amzn-ErrorType`` (boto3 raises ``client.exceptions.ThrottlingException``, ...); a failure
in a stream is an exception message (``modelStreamErrorException``), which botocore raises as
``EventStreamError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from .base import Frame, Renderer, Route, Wire, arg_pieces, pieces
from .eventstream import EVENTSTREAM, EXCEPTION

CONVERSE = "converse"
CONVERSE_STREAM = "converse_stream"

_STOP = {"end_turn", "tool_use", "max_tokens", "stop_sequence", "guardrail_intervened", "content_filtered",
         "model_context_window_exceeded"}
_FROM_NEUTRAL = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens",
                 "content_filter": "content_filtered"}
_ERRORS = {400: ("ValidationException", "The provided model identifier is invalid."),
           403: ("AccessDeniedException", "You don't have access to the model with the specified model ID."),
           404: ("ResourceNotFoundException", "Could not resolve the foundation model."),
           408: ("ModelTimeoutException", "Model has timed out in processing the request."),
           424: ("ModelErrorException", "The model encountered an error processing the request."),
           429: ("ThrottlingException", "Too many requests, please wait before trying again."),
           500: ("InternalServerException", "The server encountered an internal error."),
           503: ("ServiceUnavailableException", "The service is temporarily unable to handle the request.")}


class BedrockRenderer(Renderer):
    call_id_prefix = "tooluse_fake"

    def _stop(self) -> str:
        return self.stop(_STOP, _FROM_NEUTRAL)

    def _usage(self) -> dict[str, Any]:
        u = self.usage
        usage: dict[str, Any] = {"inputTokens": u.input_tokens, "outputTokens": u.output_tokens,
                                 "totalTokens": u.input_tokens + u.output_tokens}
        if u.cached_tokens or u.cache_creation_tokens:
            usage.update(cacheReadInputTokens=u.cached_tokens, cacheWriteInputTokens=u.cache_creation_tokens)
        return {**usage, **self.reply.usage_extra}

    def _blocks(self) -> list[dict[str, Any]]:
        r = self.reply
        blocks: list[dict[str, Any]] = [{"text": r.text}] if r.text or not r.calls else []
        blocks += [{"toolUse": {"toolUseId": cid, "name": tc.name, "input": tc.arguments_dict}}
                   for cid, tc in zip(self.call_ids, r.calls)]
        return blocks

    def json_body(self) -> dict[str, Any]:
        return {"output": {"message": {"role": "assistant", "content": self._blocks()}}, "stopReason": self._stop(),
                "usage": self._usage(), "metrics": {"latencyMs": 321}}

    def frames(self) -> list[Frame]:
        r = self.reply
        frames: list[Frame] = [("messageStart", {"role": "assistant"})]
        for i, block in enumerate(self._blocks()):
            if "text" in block:
                frames += [("contentBlockDelta", {"delta": {"text": p}, "contentBlockIndex": i})
                           for p in pieces(block["text"], r.chunk_size)]
            else:
                use = block["toolUse"]
                frames.append(("contentBlockStart", {"start": {"toolUse": {"toolUseId": use["toolUseId"],
                                                                           "name": use["name"]}},
                                                     "contentBlockIndex": i}))
                tc = r.calls[i - (len(self._blocks()) - len(r.calls))]
                frames += [("contentBlockDelta", {"delta": {"toolUse": {"input": p}}, "contentBlockIndex": i})
                           for p in arg_pieces(tc.arguments_json, r.chunk_size)]
            frames.append(("contentBlockStop", {"contentBlockIndex": i}))
        frames.append(("messageStop", {"stopReason": self._stop()}))
        frames.append(("metadata", {"usage": self._usage(), "metrics": {"latencyMs": 321}}))
        return frames

    def _name(self, status: int) -> tuple[str, str]:
        name, msg = _ERRORS.get(status, ("InternalServerException" if status >= 500 else "ValidationException",
                                         f"HTTP {status}"))
        return self.reply.error_type or name, self.reply.error_message or msg

    def error_body(self, status: int) -> dict[str, Any]:
        return {"message": self._name(status)[1]}

    def error_headers(self, status: int) -> dict[str, str]:
        return {"x-amzn-ErrorType": f"{self._name(status)[0]}:http://internal.amazon.com/coral/com.amazon.bedrock/"}

    def stream_error_frame(self, seq: int) -> Frame:
        name = self.reply.error_type or "modelStreamErrorException"
        msg = self.reply.error_message or "The model stream encountered an error."
        return EXCEPTION + name, {"message": msg, "originalStatusCode": 500}


class BedrockWire(Wire):
    name = "bedrock"
    routes = (Route(r"/model/(?P<model>[^/]+)/converse", CONVERSE),
              Route(r"/model/(?P<model>[^/]+)/converse-stream", CONVERSE_STREAM))
    renderer = BedrockRenderer
    framing = EVENTSTREAM
    request_id_header = "x-amzn-RequestId"

    def is_stream(self, api: str, params: Mapping[str, str], body: Any) -> bool:
        return api == CONVERSE_STREAM

    def model(self, api: str, params: Mapping[str, str], body: Any) -> str | None:
        return unquote(params["model"]) if "model" in params else None

    def first_user_text(self, api: str, body: Any) -> str:
        for m in (body.get("messages") if isinstance(body, dict) else None) or ():
            if isinstance(m, dict) and m.get("role") == "user":
                text = "".join(b["text"] for b in m.get("content") or () if isinstance(b, dict)
                               and isinstance(b.get("text"), str))
                if text:
                    return text
        return ""

    def tool_results(self, api: str, body: Any) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for m in (body.get("messages") if isinstance(body, dict) else None) or ():
            for b in (m.get("content") if isinstance(m, dict) else None) or ():
                result = b.get("toolResult") if isinstance(b, dict) else None
                if isinstance(result, dict):
                    out.append({"id": result.get("toolUseId"), "content": result.get("content"),
                                "is_error": result.get("status") == "error"})
        return out
