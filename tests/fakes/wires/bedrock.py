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

InvokeModel (``POST /model/{modelId}/invoke``) and InvokeModelWithResponseStream (``.../invoke-with-response-stream``)
carry the model's own body, written from the Bedrock model parameter references: Anthropic's Messages body
(``anthropic_version: bedrock-2023-05-31``: a Messages answer, or its stream events) and Meta Llama's (``prompt``,
``max_gen_len``; answered ``{generation, prompt_token_count, generation_token_count, stop_reason}``). A stream is the
event-stream framing's ``chunk`` events, each ``{"bytes": base64 of one JSON event}``; the last carries
``amazon-bedrock-invocationMetrics`` (``inputTokenCount``, ``outputTokenCount``, latencies).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from .anthropic import AnthropicRenderer
from .anthropic import AnthropicWire as _Anthropic
from .base import Frame, Renderer, Route, Wire, arg_pieces, content_text, pieces
from .eventstream import EVENTSTREAM, EXCEPTION

CONVERSE = "converse"
CONVERSE_STREAM = "converse_stream"
INVOKE = "invoke_model"
INVOKE_STREAM = "invoke_model_stream"
_STREAMS = (CONVERSE_STREAM, INVOKE_STREAM)
_LLAMA_FROM_NEUTRAL = {"stop": "stop", "tool_calls": "stop", "length": "length", "content_filter": "stop"}

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
        if self.api == INVOKE:
            return self._invoke_json()
        return {"output": {"message": {"role": "assistant", "content": self._blocks()}}, "stopReason": self._stop(),
                "usage": self._usage(), "metrics": {"latencyMs": 321}}

    def frames(self) -> list[Frame]:
        if self.api == INVOKE_STREAM:
            return self._invoke_frames()
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

    # ---- InvokeModel: the model's own body ----------------------------------------------------------------------

    def _anthropic(self) -> AnthropicRenderer | None:
        """The Anthropic Messages renderer when the request is an Anthropic body (None: Meta Llama's)."""
        if "anthropic_version" not in self.body and "messages" not in self.body:
            return None
        return AnthropicRenderer(self.server, self.api, self.body, self.reply, {"model": unquote(self.model)})

    def _llama_stop(self) -> str:
        return self.stop({"stop", "length"}, _LLAMA_FROM_NEUTRAL)

    def _metrics(self) -> dict[str, int]:
        u = self.usage
        return {"inputTokenCount": u.input_tokens, "outputTokenCount": u.output_tokens, "invocationLatency": 321,
                "firstByteLatency": 123}

    def _invoke_json(self) -> dict[str, Any]:
        anthropic = self._anthropic()
        if anthropic is not None:
            return anthropic.json_body()
        u = self.usage
        return {"generation": self.reply.text, "prompt_token_count": u.input_tokens,
                "generation_token_count": u.output_tokens, "stop_reason": self._llama_stop()}

    def _invoke_frames(self) -> list[Frame]:
        anthropic = self._anthropic()
        if anthropic is not None:
            events = [data for _, data in anthropic.frames() if data.get("type") != "ping"]
            events[-1] = {**events[-1], "amazon-bedrock-invocationMetrics": self._metrics()}
        else:
            u, parts = self.usage, pieces(self.reply.text, self.reply.chunk_size) or [""]
            events = [{"generation": p, "prompt_token_count": u.input_tokens if i == 0 else None,
                       "generation_token_count": i + 1, "stop_reason": None} for i, p in enumerate(parts)]
            events[-1].update(generation_token_count=u.output_tokens, stop_reason=self._llama_stop(),
                              **{"amazon-bedrock-invocationMetrics": self._metrics()})
        return [("chunk", {"bytes": base64.b64encode(json.dumps(e).encode()).decode()}) for e in events]

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
              Route(r"/model/(?P<model>[^/]+)/converse-stream", CONVERSE_STREAM),
              Route(r"/model/(?P<model>[^/]+)/invoke", INVOKE),
              Route(r"/model/(?P<model>[^/]+)/invoke-with-response-stream", INVOKE_STREAM))
    renderer = BedrockRenderer
    framing = EVENTSTREAM
    request_id_header = "x-amzn-RequestId"

    def is_stream(self, api: str, params: Mapping[str, str], body: Any) -> bool:
        return api in _STREAMS

    def model(self, api: str, params: Mapping[str, str], body: Any) -> str | None:
        return unquote(params["model"]) if "model" in params else None

    def first_user_text(self, api: str, body: Any) -> str:
        if isinstance(body, dict) and isinstance(body.get("prompt"), str):  # Meta Llama's body
            return body["prompt"]
        for m in (body.get("messages") if isinstance(body, dict) else None) or ():
            if isinstance(m, dict) and m.get("role") == "user":
                text = content_text(m.get("content"))
                if text:
                    return text
        return ""

    def tool_results(self, api: str, body: Any) -> list[dict[str, Any]]:
        if api in (INVOKE, INVOKE_STREAM):
            return _Anthropic().tool_results(api, body)
        out: list[dict[str, Any]] = []
        for m in (body.get("messages") if isinstance(body, dict) else None) or ():
            for b in (m.get("content") if isinstance(m, dict) else None) or ():
                result = b.get("toolResult") if isinstance(b, dict) else None
                if isinstance(result, dict):
                    out.append({"id": result.get("toolUseId"), "content": result.get("content"),
                                "is_error": result.get("status") == "error"})
        return out
