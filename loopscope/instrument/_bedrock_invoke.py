"""The bedrock adapter's InvokeModel bodies: the model's own request and answer, as JSON.

``invoke_model`` sends the body the model's provider defines and answers with that provider's
body. Read here: Anthropic's Messages body (``anthropic_version: bedrock-2023-05-31``; its
answer a Messages message, its stream the Messages events) and Meta Llama's (``prompt``,
``max_gen_len``; answered ``generation``, ``prompt_token_count``, ``generation_token_count``,
``stop_reason``). A streamed answer is ``chunk`` events, each ``{"bytes": one JSON event}``;
the last carries ``amazon-bedrock-invocationMetrics``, the token counts Bedrock measured,
which stand in where the body gives none. Another provider's body is recorded as a call of
that model without its content. What the answer is is read from the answer itself (its
``generation`` or its ``content``), so the request's reading need not be kept for it.
"""

from __future__ import annotations

from typing import Any

from .. import _json
from ..models import ToolCall
from ..recorder.adapter import (
    Finish,
    FinishMap,
    InputMessage,
    ModelCall,
    ModelRequest,
    ModelResponse,
    Part,
    Reasoning,
    Text,
    ToolCallRequest,
    ToolCallResponse,
    ToolResults,
    provider_at,
    request_parameters,
    usage,
)
from . import _read as r

PROVIDER = "aws.bedrock"
"""``gen_ai.provider.name`` of Amazon Bedrock (the GenAI conventions' value)."""

FINISH = FinishMap({
    # Converse's stopReason
    "end_turn": Finish.STOP,
    "stop_sequence": Finish.STOP,
    "tool_use": Finish.TOOL_CALL,
    "max_tokens": Finish.LENGTH,
    "model_context_window_exceeded": Finish.LENGTH,
    "guardrail_intervened": Finish.CONTENT_FILTER,
    "content_filtered": Finish.CONTENT_FILTER,
    "malformed_model_output": Finish.ERROR,
    "malformed_tool_use": Finish.ERROR,
    # Anthropic's stop_reason beside those, Meta Llama's stop_reason
    "pause_turn": Finish.STOP,
    "refusal": Finish.REFUSAL,
    "stop": Finish.STOP,
    "length": Finish.LENGTH,
})
"""Bedrock's stop reasons (Converse's, and those of the bodies InvokeModel answers with)."""

METRICS = "amazon-bedrock-invocationMetrics"


def bedrock_usage(reported: Any) -> dict[str, int] | None:
    """Converse's ``usage``: its ``inputTokens`` leave the cache (read and written) out, as Anthropic's do."""
    if not isinstance(reported, dict):
        return None
    return usage(input=reported.get("inputTokens"), output=reported.get("outputTokens"),
                 cache_read=reported.get("cacheReadInputTokens"), cache_write=reported.get("cacheWriteInputTokens"),
                 input_includes_cache=False)


def _anthropic_usage(reported: Any) -> dict[str, int] | None:
    if not isinstance(reported, dict):
        return None
    return usage(input=reported.get("input_tokens"), output=reported.get("output_tokens"),
                 cache_read=reported.get("cache_read_input_tokens"),
                 cache_write=reported.get("cache_creation_input_tokens"), input_includes_cache=False)


# -- the request ----------------------------------------------------------------------------


def _object(data: Any) -> dict[str, Any] | None:
    """A JSON object in text or bytes; None for anything else (a file the SDK reads itself is left alone)."""
    if not isinstance(data, (bytes, bytearray, str)):
        return None
    try:
        found = _json.parse(data if isinstance(data, str) else data.decode("utf-8", "replace"))
    except ValueError:  # not JSON: a body this adapter cannot read
        return None
    return found if isinstance(found, dict) else None


def _anthropic_part(block: Any) -> Any:
    kind = r.get(block, "type")
    if kind == "text":
        return Text(r.get(block, "text") or "")
    if kind == "tool_use":
        return ToolCallRequest(r.get(block, "name"), r.get(block, "input"), id=r.get(block, "id"))
    if kind == "tool_result":
        return ToolCallResponse(_result_content(r.get(block, "content")), id=r.get(block, "tool_use_id"))
    if kind == "thinking":
        return Reasoning(r.get(block, "thinking") or "")
    return Part(kind if isinstance(kind, str) else "unknown")


def _result_content(content: Any) -> Any:
    """A ``tool_result``'s content: its text, or the text of its blocks."""
    return content if not isinstance(content, list) else r.text_of(content)


def _messages(body: dict[str, Any], results: ToolResults) -> tuple[list[InputMessage], str | None]:
    messages, input_text = [], None
    for message in body.get("messages") or ():
        role, content = r.get(message, "role"), r.get(message, "content")
        if role == "assistant":
            results.model_spoke()
        if isinstance(content, str):
            messages.append(InputMessage(role, [Text(content)]))
            input_text = content if role == "user" else input_text
            continue
        blocks = content if isinstance(content, list) else []
        messages.append(InputMessage(role, [_anthropic_part(block) for block in blocks]))
        if role != "user":
            continue
        for block in blocks:
            call_id = r.get(block, "tool_use_id")
            if r.get(block, "type") == "tool_result" and results.wanted(call_id):
                results.add(call_id, _result_content(r.get(block, "content")), bool(r.get(block, "is_error")))
        text = "".join(r.get(b, "text") or "" for b in blocks if r.get(b, "type") == "text")
        input_text = text or input_text
    return messages, input_text


def invoke_request(params: dict[str, Any], server: dict[str, Any], stream: bool) -> ModelRequest:
    """An InvokeModel request, from its body: Anthropic's Messages or Meta Llama's prompt."""
    body, model = _object(params.get("body")), params.get("modelId")
    provider = provider_at(PROVIDER, server)
    if body is None:
        return ModelRequest(provider, model, stream=stream, parameters=request_parameters(provider=PROVIDER, server=server))
    prompt = body.get("prompt")
    if isinstance(prompt, str) and "messages" not in body:  # Meta Llama's body (its prompt template and all)
        return ModelRequest(provider, model, input_text=prompt, stream=stream,
                            input_messages=[InputMessage("user", [Text(prompt)])],
                            parameters=request_parameters(provider=PROVIDER, temperature=body.get("temperature"),
                                                          top_p=body.get("top_p"), max_tokens=body.get("max_gen_len"),
                                                          server=server))
    results = ToolResults()
    messages, input_text = _messages(body, results)
    system = body.get("system")
    return ModelRequest(
        provider,
        model,
        tools=body.get("tools"),  # Anthropic's tool dicts, as they are
        tool_results=results.results,
        input_text=input_text,
        stream=stream,
        parameters=request_parameters(
            provider=PROVIDER,
            temperature=body.get("temperature"),
            top_p=body.get("top_p"),
            top_k=body.get("top_k"),
            max_tokens=body.get("max_tokens"),
            stop=body.get("stop_sequences"),
            tool_choice=r.tool_choice(body.get("tool_choice")),
            thinking=body.get("thinking"),
            system_instructions=system if isinstance(system, (str, list)) else None,
            server=server,
        ),
        input_messages=messages,
        messages=body.get("messages"),
    )


# -- the answer -----------------------------------------------------------------------------


def finish_invoke(data: bytes, response_id: str | None, call: ModelCall) -> None:
    """End the call with an ``invoke_model`` answer's body (Anthropic's message, Meta's generation)."""
    body = _object(data)
    if body is None:
        call.finish(ModelResponse(response_id=response_id))
        return
    if "generation" in body:
        stop = body.get("stop_reason")
        call.finish(ModelResponse(
            text=body.get("generation"), finish_reason=stop, finish=FINISH(stop), response_id=response_id,
            usage=usage(input=body.get("prompt_token_count"), output=body.get("generation_token_count")),
            provider_usage={k: body[k] for k in ("prompt_token_count", "generation_token_count") if k in body},
        ))
        return
    texts, calls, thinking = [], [], []
    for block in body.get("content") or ():
        kind = r.get(block, "type")
        if kind == "text":
            texts.append(r.get(block, "text") or "")
        elif kind == "tool_use":
            calls.append(ToolCall(id=str(r.get(block, "id")), name=str(r.get(block, "name")), arguments=r.get(block, "input")))
        elif kind == "thinking":
            thinking.append(r.get(block, "thinking") or "")
    stop = body.get("stop_reason")
    call.finish(ModelResponse(
        text="".join(texts) or None, tool_calls=calls, thinking="\n".join(thinking) or None,
        finish_reason=stop, finish=FINISH(stop), response_id=body.get("id") or response_id, model=body.get("model"),
        usage=_anthropic_usage(body.get("usage")), provider_usage=body.get("usage"),
    ))


class InvokeEvents:
    """Accumulates an ``invoke_model_with_response_stream``'s chunks (each the model's JSON event)."""

    def __init__(self, response_id: str | None) -> None:
        self.response_id = response_id
        self.model: str | None = None
        self.blocks: dict[Any, dict[str, Any]] = {}  # tool uses and thinking, by content block index
        self.stop: str | None = None
        self.reported: dict[str, Any] = {}  # the body's token counts, as it gave them
        self.metrics: dict[str, Any] | None = None

    def add(self, event: Any, call: ModelCall, /) -> None:
        data = _object(r.get(r.get(event, "chunk"), "bytes"))
        if data is None:
            return
        if isinstance(data.get(METRICS), dict):
            self.metrics = data[METRICS]
        if "generation" in data:  # Meta Llama's
            call.delta(data.get("generation") or "")
            self.stop = data.get("stop_reason") or self.stop
            for key in ("prompt_token_count", "generation_token_count"):
                if isinstance(data.get(key), int):
                    self.reported[key] = data[key]
            return
        kind = data.get("type")
        if kind == "content_block_delta":
            delta = data.get("delta") or {}
            if delta.get("type") == "text_delta":
                call.delta(delta.get("text") or "")
                return
            call.first_chunk()
            block = self.blocks.get(data.get("index"))
            if block is not None:
                block["parts"].append(delta.get("partial_json") or delta.get("thinking") or "")
        elif kind == "content_block_start":
            call.first_chunk()
            block = data.get("content_block") or {}
            if block.get("type") in ("tool_use", "thinking"):
                self.blocks[data.get("index")] = {**block, "parts": []}
        elif kind == "message_start":
            call.first_chunk()
            message = data.get("message") or {}
            self.response_id, self.model = message.get("id") or self.response_id, message.get("model")
            self.reported.update(message.get("usage") or {})
        elif kind == "message_delta":
            self.stop = (data.get("delta") or {}).get("stop_reason") or self.stop
            self.reported.update(data.get("usage") or {})  # its counts are totals: they replace message_start's

    def finish(self, call: ModelCall, /) -> None:
        response = self.partial()
        ordered = [block for _, block in sorted(self.blocks.items(), key=lambda i: i[0] if isinstance(i[0], int) else 0)]
        response.tool_calls = [ToolCall(id=str(b.get("id")), name=str(b.get("name")),
                                        arguments=r.arguments("".join(b["parts"]) or "{}"))
                               for b in ordered if b["type"] == "tool_use"]
        response.thinking = "\n".join("".join(b["parts"]) for b in ordered if b["type"] == "thinking") or None
        call.finish(response)

    def partial(self) -> ModelResponse:
        reported, metrics = self.reported, self.metrics or {}
        if "generation_token_count" in reported or "prompt_token_count" in reported:
            counts = usage(input=reported.get("prompt_token_count"), output=reported.get("generation_token_count"))
        elif reported:
            counts = _anthropic_usage(reported)
        else:  # what Bedrock measured: its input count is the whole prompt
            counts = usage(input=metrics.get("inputTokenCount"), output=metrics.get("outputTokenCount")) or None
        return ModelResponse(usage=counts, finish_reason=self.stop, finish=FINISH(self.stop),
                             response_id=self.response_id, model=self.model,
                             provider_usage={**reported, **({METRICS: self.metrics} if self.metrics else {})} or None)
