"""Amazon Bedrock Runtime through boto3: ``converse``, ``converse_stream``, ``invoke_model``
and ``invoke_model_with_response_stream`` as rounds of stitched turns.

Where it hooks. Every method of a boto3 client (``client.converse(...)``) is made by botocore
from the service's model and calls ``BaseClient._make_api_call(operation_name, api_params)``,
which runs botocore's event system for the call (``provide-client-params``, ``before-call``,
the request's signing, each retry's ``before-send``, ``after-call``) and returns the parsed
response or raises ``ClientError``. We wrap that one method on ``BaseClient`` itself and act
only for the ``bedrock-runtime`` service's four model operations:

- clients made before ``instrument()`` are recorded too: the class botocore makes for each
  service (its ``creating-client-class`` event) inherits the method, whereas a handler
  registered on a session's event emitter would miss the clients already made, and every
  ``boto3.Session`` made later would need one of its own;
- a call is recorded once: its retries run inside it;
- the round's span is current while botocore sends, so HTTP spans nest under it;
- what we read is what the user passed (``api_params``) and the parsed answer: the signed
  request (``Authorization``, ``X-Amz-*`` headers) and the credentials are never seen, and
  of the answer's ``ResponseMetadata`` only the request id is kept.

A streamed answer is the response's ``stream`` (Converse) or ``body`` (InvokeModel), a
botocore ``EventStream`` that the user iterates: it is replaced by our proxy. An
``invoke_model`` answer's ``StreamingBody`` is read, and the user gets a new one over the
same bytes. The model's own bodies of InvokeModel (Anthropic's Messages, Meta Llama's) are
read in ``_bedrock_invoke.py``. aiobotocore's async clients override ``_make_api_call`` and
are not recorded.
"""

from __future__ import annotations

from typing import Any

from .._guard import internal_error
from ..models import ToolCall
from ..recorder.adapter import (
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
    server_of,
)
from . import _read as r
from ._bedrock_invoke import FINISH, PROVIDER, InvokeEvents, bedrock_usage, finish_invoke, invoke_request
from ._calls import sync_call
from ._patch import Patch, wrap
from ._streams import StreamedCalls, proxy_stream

SERVICE = "bedrock-runtime"


# -- the request ----------------------------------------------------------------------------


def _call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``_make_api_call``'s operation name and parameters (botocore passes them by position)."""
    operation = args[0] if args else kwargs.get("operation_name")
    params: Any = args[1] if len(args) > 1 else kwargs.get("api_params")
    return operation, params if isinstance(params, dict) else {}


def _result_content(content: Any) -> Any:
    """A ``toolResult``'s content: its one JSON value, its text, or each block's JSON, text or kind."""
    if not isinstance(content, list):
        return content
    texts = [block["text"] for block in content if isinstance(block.get("text"), str)]
    values = [block["json"] for block in content if "json" in block]
    if len(values) == 1 and not texts and len(content) == 1:
        return values[0]
    if texts and len(texts) == len(content):
        return "".join(texts)
    return [block.get("json", block.get("text", {"type": next(iter(block), None)})) for block in content]


def _part(block: dict[str, Any]) -> Any:
    if isinstance(block.get("text"), str):
        return Text(block["text"])
    use = block.get("toolUse")
    if use is not None:
        return ToolCallRequest(use.get("name"), use.get("input"), id=use.get("toolUseId"))
    result = block.get("toolResult")
    if result is not None:
        return ToolCallResponse(_result_content(result.get("content")), id=result.get("toolUseId"))
    reasoning = block.get("reasoningContent")
    if reasoning is not None:
        return Reasoning(_reasoning_text(reasoning))
    return Part(r.kind(block))  # image, document, video, guardContent...


def _reasoning_text(reasoning: Any) -> str:
    """A ``reasoningContent`` block's text (``reasoningText.text``; a redacted one has none)."""
    text = r.get(r.get(reasoning, "reasoningText"), "text")
    return text if isinstance(text, str) else ""


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    """``toolConfig.tools``: each ``toolSpec`` as a tool (its ``inputSchema.json`` the parameters),
    a ``systemTool`` (run at Bedrock) by its name; ``cachePoint`` entries are no tools."""
    out = []
    for tool in tools if isinstance(tools, list) else ():
        spec = tool.get("toolSpec")
        if spec is not None:
            schema = spec.get("inputSchema")
            out.append({"name": spec.get("name"), "description": spec.get("description"),
                        "input_schema": schema.get("json") if isinstance(schema, dict) else None})
        elif isinstance(tool.get("systemTool"), dict):
            out.append({"name": tool["systemTool"].get("name"), "type": "system_tool"})
    return out or None


def _tool_choice(choice: Any) -> str | None:
    """``toolChoice``: ``{"auto": {}}``, ``{"any": {}}`` (a tool must be called) or ``{"tool": {"name"}}``."""
    if not isinstance(choice, dict):
        return None
    if "tool" in choice:
        return r.get(choice["tool"], "name")
    return "required" if "any" in choice else "auto" if "auto" in choice else None


def _system(system: Any) -> str | None:
    texts = [block["text"] for block in system or () if isinstance(block.get("text"), str)]
    return "\n".join(texts) or None


def _converse_request(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ModelRequest:
    operation, params = _call(args, kwargs)
    results = ToolResults()
    messages, input_text = [], None
    given = params.get("messages")
    for message in given if isinstance(given, list) else ():
        role, blocks = message.get("role"), message.get("content") or ()
        if role == "assistant":
            results.model_spoke()
        # a cachePoint marks where the prompt cache ends: no content of the message
        messages.append(InputMessage(role, [_part(block) for block in blocks if "cachePoint" not in block]))
        if role != "user":
            continue
        for block in blocks:
            result = block.get("toolResult")
            if result is not None and results.wanted(result.get("toolUseId")):
                results.add(result.get("toolUseId"), _result_content(result.get("content")), result.get("status") == "error")
        text = "".join(block["text"] for block in blocks if isinstance(block.get("text"), str))
        if text:  # a message of tool results alone is not the user speaking
            input_text = text
    config = params.get("inferenceConfig") or {}
    tool_config = params.get("toolConfig") or {}
    extra = dict(params.get("additionalModelRequestFields") or {})  # the model's own fields (Claude's top_k, thinking)
    latency = r.get(params.get("performanceConfig"), "latency")
    server = server_of(instance.meta.endpoint_url)
    return ModelRequest(
        provider_at(PROVIDER, server),
        params.get("modelId"),
        tools=_tools(tool_config.get("tools")),
        tool_results=results.results,
        input_text=input_text,
        stream=operation == "ConverseStream",
        parameters=request_parameters(
            provider=PROVIDER,
            temperature=config.get("temperature"),
            top_p=config.get("topP"),
            top_k=extra.pop("top_k", None),
            max_tokens=config.get("maxTokens"),
            stop=config.get("stopSequences"),
            tool_choice=_tool_choice(tool_config.get("toolChoice")),
            service_tier=r.get(params.get("serviceTier"), "type"),
            thinking=extra.pop("thinking", None),
            system_instructions=_system(params.get("system")),
            server=server,
            other={**extra, **({"performance_latency": latency} if latency else {})} or None,
        ),
        input_messages=messages,
        messages=given,
    )


def _invoke_request(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ModelRequest:
    operation, params = _call(args, kwargs)
    return invoke_request(params, server_of(instance.meta.endpoint_url), operation == "InvokeModelWithResponseStream")


# -- the answer -----------------------------------------------------------------------------


def _request_id(response: Any) -> str | None:
    """The answer's ``x-amzn-RequestId``, as botocore parsed it (``ResponseMetadata.RequestId``)."""
    return r.get(r.get(response, "ResponseMetadata"), "RequestId")


def _finish_converse(response: Any, call: ModelCall) -> Any:
    texts, calls, thinking = [], [], []
    for block in r.get(r.get(r.get(response, "output"), "message"), "content") or ():
        if isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif "toolUse" in block:
            use = block["toolUse"]
            calls.append(ToolCall(id=str(use.get("toolUseId")), name=str(use.get("name")), arguments=use.get("input")))
        elif "reasoningContent" in block:
            thinking.append(_reasoning_text(block["reasoningContent"]))
    stop, reported = response.get("stopReason"), response.get("usage")
    call.finish(ModelResponse(
        text="".join(texts) or None,
        tool_calls=calls,
        usage=bedrock_usage(reported),
        finish_reason=stop,
        finish=FINISH(stop),
        response_id=_request_id(response),
        thinking="".join(thinking) or None,
        provider_usage=reported,
    ))
    return response


class ConverseEvents:
    """Accumulates a ConverseStream's events (``{"contentBlockDelta": {...}}``...) into one answer."""

    final_events = frozenset({"metadata"})  # the stream's last event: the call ends as the user reads it

    def __init__(self, response_id: str | None) -> None:
        self.response_id = response_id
        self.uses = StreamedCalls()  # tool uses by content block index
        self.thinking: list[str] = []
        self.stop: str | None = None
        self.usage: Any = None

    def add(self, event: dict[str, Any], call: ModelCall, /) -> None:
        delta = event.get("contentBlockDelta")
        if delta is not None:
            part = delta.get("delta") or {}
            if isinstance(part.get("text"), str):
                call.delta(part["text"])
                return
            call.first_chunk()
            index = delta.get("contentBlockIndex")
            if index in self.uses and "toolUse" in part:
                self.uses.more(index, part["toolUse"].get("input"))
            elif "reasoningContent" in part:
                self.thinking.append(r.get(part["reasoningContent"], "text") or "")
        elif "contentBlockStart" in event:
            call.first_chunk()
            start = event["contentBlockStart"]
            use = r.get(start.get("start"), "toolUse")
            if use is not None:
                self.uses.start(start.get("contentBlockIndex"), str(use.get("toolUseId")), use.get("name"))
        elif "messageStart" in event:
            call.first_chunk()
        elif "messageStop" in event:
            self.stop = event["messageStop"].get("stopReason")
        elif "metadata" in event:
            self.usage = event["metadata"].get("usage")
            self.finish(call)  # complete now, even if the reader stops before the stream's end

    def finish(self, call: ModelCall, /) -> None:
        response = self.partial()
        response.tool_calls = self.uses.calls()
        response.thinking = "".join(self.thinking) or None
        call.finish(response)

    def partial(self) -> ModelResponse:
        return ModelResponse(usage=bedrock_usage(self.usage), finish_reason=self.stop, finish=FINISH(self.stop),
                             response_id=self.response_id, provider_usage=self.usage)


def _stream_converse(response: Any, call: ModelCall) -> Any:
    response["stream"] = proxy_stream(response["stream"], call, ConverseEvents(_request_id(response)))
    return response


def _finish_invoke(response: Any, call: ModelCall) -> Any:
    import io

    from botocore.response import StreamingBody

    try:
        data = response["body"].read()
    except Exception as exc:  # the connection broke: the user's read raises what ours did
        response["body"] = StreamingBody(_Broken(exc), None)
        call.fail(exc)
        return response
    response["body"] = StreamingBody(io.BytesIO(data), len(data))  # the user reads the same bytes
    finish_invoke(data, _request_id(response), call)
    return response


class _Broken:
    """A raw stream whose read raises what reading the answer's body raised."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def read(self, *_: Any) -> bytes:
        raise self.exc

    def close(self) -> None:
        pass


def _stream_invoke(response: Any, call: ModelCall) -> Any:
    response["body"] = proxy_stream(response["body"], call, InvokeEvents(_request_id(response)))
    return response


# -- patching -------------------------------------------------------------------------------

_OPERATIONS = {
    "Converse": sync_call(_converse_request, _finish_converse, mark=False),
    "ConverseStream": sync_call(_converse_request, _stream_converse, mark=False),
    "InvokeModel": sync_call(_invoke_request, _finish_invoke, mark=False),
    "InvokeModelWithResponseStream": sync_call(_invoke_request, _stream_invoke, mark=False),
}


def _is_bedrock(client: Any) -> bool:
    try:
        return client.meta.service_model.service_name == SERVICE
    except Exception:
        internal_error("bedrock client")
        return False


def _make_api_call(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``BaseClient._make_api_call``: a Bedrock model call is recorded, any other call goes on untouched."""
    handler = _OPERATIONS.get(args[0] if args else kwargs.get("operation_name"))  # type: ignore[arg-type]
    if handler is None or not _is_bedrock(instance):
        return wrapped(*args, **kwargs)
    return handler(wrapped, instance, args, kwargs)


def patch() -> list[Patch]:
    from botocore.client import BaseClient

    found = wrap(BaseClient, "_make_api_call", _make_api_call)
    return [found] if found is not None else []
