"""The mistralai SDK: ``chat.complete`` / ``stream`` and their async twins as rounds of stitched turns.

Mistral's chat format is OpenAI's Chat Completions, read by the kit's reader
(:mod:`._openai_compat`); its SDK (Speakeasy's, not Stainless') hands pydantic models whose
unset fields are a sentinel, so requests, answers and stream events are read as the dicts
the models dump to, with Mistral's few differences translated here: ``random_seed`` is the
seed, content may be a list of chunks (text, and a reasoning model's ``thinking``: the round's thinking), tool
call arguments may be an object, a stream's chunk is an event's ``data``, and
``model_length`` means truncated. ``chat.parse`` goes through ``complete`` and is recorded
there.

With its telemetry on (``MISTRAL_SDK_TELEMETRY``, or the client's ``telemetry``), the SDK
starts a GenAI span of its own per request: beside our round that would be a second
model-call span, which our store would also count as another round. For the calls we
record it gives way (see :func:`_no_sdk_span`); calls we do not record keep it.

Importing this module imports no SDK: :func:`patch` runs once ``mistralai`` is imported.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .. import _json
from ..recorder.adapter import Finish, FinishMap, ModelCall, ModelRequest, ModelResponse, server_of
from ._calls import async_call, calling, sync_call
from ._openai_compat import ChatChunks, chat_request, finish_completion
from ._patch import Patch, Registration, when_imported, wrap
from ._streams import proxy_stream

PROVIDER = "mistral_ai"
FINISH = FinishMap({"stop": Finish.STOP, "tool_calls": Finish.TOOL_CALL, "length": Finish.LENGTH,
                    "model_length": Finish.LENGTH, "error": Finish.ERROR})
"""Mistral's finish reasons in the kit's vocabulary (``model_length``: the context window is full)."""

_OWN_PARAMETERS = ("safe_prompt", "prompt_mode", "min_tokens", "prediction", "guardrails", "top_k", "metadata")
"""Mistral's request parameters with no name in the reader (``top_k`` has one in the kit)."""


def _plain(value: Any) -> Any:
    """An SDK model as the dict it dumps to (its unset fields left out), a dict as it is."""
    dump = getattr(value, "model_dump", None)
    return dump(warnings=False) if dump is not None and not isinstance(value, dict) else value


def _text(content: Any) -> Any:
    """A content of chunks as its text (a reasoning model's ``thinking`` chunks apart: :func:`_thinking`)."""
    if not isinstance(content, list):
        return content
    texts = [part.get("text") for part in map(_plain, content) if isinstance(part, dict) and part.get("type") == "text"]
    return "".join(t for t in texts if isinstance(t, str)) or None


def _thinking(content: Any) -> str | None:
    """The text of a content's ``thinking`` chunks (a reasoning model's), if any."""
    if not isinstance(content, list):
        return None
    texts = []
    for part in map(_plain, content):
        if isinstance(part, dict) and part.get("type") == "thinking":
            inner = part.get("thinking")
            texts.append(inner if isinstance(inner, str) else _text(inner) or "")
    return "".join(texts) or None


def _message(message: Any) -> Any:
    """A message (request, answer or delta) in the reader's shape: text content, calls' arguments as JSON text."""
    message = _plain(message)
    if not isinstance(message, dict):
        return message
    out = dict(message)
    if isinstance(out.get("content"), list) and out.get("role") != "user":
        out["content"] = _text(out["content"])
    calls = out.get("tool_calls")
    if calls:
        out["tool_calls"] = [_call(call) for call in calls]
    return out


def _call(call: Any) -> Any:
    call = _plain(call)
    function = _plain(call.get("function")) if isinstance(call, dict) else None
    if isinstance(function, dict) and not isinstance(function.get("arguments"), (str, type(None))):
        return {**call, "function": {**function, "arguments": _json.dumps(function["arguments"])}}
    return call


def _choices(choices: Any, key: str) -> list[Any]:
    """An answer's or a chunk's choices, each message (``key``) read by :func:`_message`, the
    finish reason a plain text (the SDK's reason it does not know is a ``str`` subclass)."""
    out = []
    for choice in map(_plain, choices):
        reason = choice.get("finish_reason")
        out.append({**choice, key: _message(choice.get(key)), "finish_reason": None if reason is None else str(reason)})
    return out


def _describe(stream: bool) -> Any:
    def describe(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ModelRequest:
        for key in ("messages", "tools"):  # a one-shot iterable, read here, is put back whole for the SDK
            if isinstance(kwargs.get(key), Iterator):
                kwargs[key] = list(kwargs[key])
        kw = dict(kwargs)
        messages = kw.get("messages")
        if isinstance(messages, (list, tuple)):
            kw["messages"] = [_message(m) for m in messages]
        if isinstance(kw.get("tools"), (list, tuple)):
            kw["tools"] = [_plain(tool) for tool in kw["tools"]]
        if "random_seed" in kw:
            kw["seed"] = kw.pop("random_seed")
        kw["stream"] = stream
        url = kwargs.get("server_url")
        if not url:
            config = getattr(instance, "sdk_configuration", None)
            url = config.get_server_details()[0] if config is not None else None
        request = chat_request(kw, provider=PROVIDER, server=server_of(url))
        own = {key: _plain(kwargs[key]) for key in _OWN_PARAMETERS if kwargs.get(key) is not None}
        if own and isinstance(request.parameters, dict):
            request.parameters["other"] = own
        return request

    return describe


class _Chunks(ChatChunks):
    """The reader's chunk accumulator over Mistral's stream events: each event's ``data``,
    read as the dict it dumps to the moment the stream hands it on."""

    def __init__(self) -> None:
        super().__init__(finish=FINISH)
        self.thinking: list[str] = []

    def capture(self, event: Any) -> Any:
        chunk = _plain(getattr(event, "data", event))
        if isinstance(chunk, dict) and chunk.get("choices"):
            delta = _plain(chunk["choices"][0]).get("delta")
            thinking = _thinking(_plain(delta).get("content")) if delta is not None else None
            if thinking:
                self.thinking.append(thinking)
            chunk = {**chunk, "choices": _choices(chunk["choices"], "delta")}
        return super().capture(chunk)

    def partial(self) -> ModelResponse:
        response = super().partial()
        if self.thinking:
            response.thinking = "".join(self.thinking)
        return response


def _deliver(result: Any, model_call: ModelCall) -> Any:
    if hasattr(result, "generator") and hasattr(result, "response"):  # an EventStream / EventStreamAsync
        return proxy_stream(result, model_call, _Chunks())
    completion = _plain(result)
    thinking = None
    if isinstance(completion, dict) and completion.get("choices"):
        message = completion["choices"][0].get("message")
        thinking = _thinking(message.get("content")) if isinstance(message, dict) else None
        completion["choices"] = _choices(completion["choices"], "message")
    finish_completion(completion, model_call, FINISH, thinking=thinking)
    return result


# -- the SDK's own spans --------------------------------------------------------------------


def _no_sdk_span(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``get_traced_request_and_span`` (the SDK's tracing hook): no span of its own for a
    call we record (its hook then leaves the request and the response alone)."""
    if calling.get() is not None:
        request = kwargs.get("request", args[4] if len(args) > 4 else None)
        return request, None
    return wrapped(*args, **kwargs)


# -- patching -----------------------------------------------------------------------------------


def patch() -> list[Registration]:
    return [
        when_imported("mistralai.client.chat", _patch_chat, "instrument mistralai"),
        when_imported("mistralai.client._hooks.tracing", _patch_tracing, "instrument mistralai"),
    ]


def _patch_chat(chat: Any) -> list[Patch | None]:
    return [
        wrap(chat.Chat, "complete", sync_call(_describe(False), _deliver)),
        wrap(chat.Chat, "stream", sync_call(_describe(True), _deliver)),
        wrap(chat.Chat, "complete_async", async_call(_describe(False), _deliver)),
        wrap(chat.Chat, "stream_async", async_call(_describe(True), _deliver)),
    ]


def _patch_tracing(tracing: Any) -> list[Patch | None]:
    return [wrap(tracing, "get_traced_request_and_span", _no_sdk_span)]
