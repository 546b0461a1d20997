"""The ollama SDK: ``Client.chat`` and ``AsyncClient.chat`` (JSON and ``stream=True``) as rounds.

Ollama's native chat API (``/api/chat``). Its tool calls have no ids: the results sent back
(``tool`` messages, with a ``tool_name``) answer the calls of the last response by position,
which the kit's ``ToolResults`` pairs. ``done_reason`` is ``stop`` for text and tool calls
alike (a response with calls is recorded as ``tool_call``), ``length`` at ``num_predict``;
usage is ``prompt_eval_count`` / ``eval_count`` (the generated tokens, thinking included),
the durations (nanoseconds) go with them in the provider's usage. A stream is a generator of
``ChatResponse`` parts, the last with ``done: true`` and the counts.

The module-level ``ollama.chat`` is the bound ``chat`` of the package's default client, taken
when ``ollama`` was imported: it is bound again to the wrapped method (and put back by
``uninstrument()``). Importing this module imports no SDK.
"""

from __future__ import annotations

from typing import Any

from ..models import ToolCall
from ..recorder.adapter import (
    Finish,
    FinishMap,
    ModelCall,
    ModelRequest,
    ModelResponse,
    Part,
    Reasoning,
    RequestMessages,
    Text,
    ToolCallRequest,
    provider_at,
    request_parameters,
    server_of,
    usage,
)
from . import _read as r
from ._calls import async_call, sync_call
from ._patch import Patch, Registration, wrap
from ._streams import Gathered, answer_or_stream

PROVIDER = "ollama"
FINISH = FinishMap({"stop": Finish.STOP, "length": Finish.LENGTH, "load": Finish.STOP, "unload": Finish.STOP})
_DURATIONS = ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count", "eval_duration")
_OPTIONS = {"temperature", "top_p", "top_k", "num_predict", "seed", "stop", "presence_penalty", "frequency_penalty"}


# -- the request ------------------------------------------------------------------------


def _arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """``chat(model, messages, ...)``: both may be given by position."""
    model = args[0] if args else kwargs.get("model")
    messages = args[1] if len(args) > 1 else kwargs.get("messages")
    return model, messages


def _calls(calls: Any) -> list[ToolCallRequest]:
    return [
        ToolCallRequest(str(r.get(r.get(c, "function"), "name")), r.get(r.get(c, "function"), "arguments"))
        for c in calls or ()
    ]


def _request(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ModelRequest:
    model, given = _arguments(args, kwargs)
    source = given if isinstance(given, (list, tuple)) else ()
    messages = RequestMessages()
    for message in source:
        role, content = r.get(message, "role"), r.get(message, "content")
        if role == "tool":
            # no ids: the results after the last answer, in order
            messages.add("tool", [messages.result(None, content)])
            continue
        parts: list[Any] = []
        if role == "assistant":
            thinking = r.get(message, "thinking")
            if thinking:
                parts.append(Reasoning(thinking))
        if content:
            parts.append(Text(content))
        parts += [Part("image") for _ in r.get(message, "images") or ()]
        if role == "assistant":
            parts += _calls(r.get(message, "tool_calls"))
        messages.add(str(role), parts, content if isinstance(content, str) else None)  # a user's: the input text
    option = _options(kwargs.get("options")).get
    think, output = kwargs.get("think"), kwargs.get("format")
    server = server_of(instance._client.base_url)
    parameters = request_parameters(
        provider=PROVIDER,
        temperature=option("temperature"),
        top_p=option("top_p"),
        top_k=option("top_k"),
        max_tokens=option("num_predict"),
        seed=option("seed"),
        stop=option("stop"),
        presence_penalty=option("presence_penalty"),
        frequency_penalty=option("frequency_penalty"),
        logprobs=kwargs.get("logprobs"),
        top_logprobs=kwargs.get("top_logprobs"),
        reasoning_effort=think if isinstance(think, str) else None,  # "low", "medium", "high"
        thinking={"type": "enabled" if think else "disabled"} if isinstance(think, bool) else None,
        output_type="json" if output else None,  # "json", or a JSON schema
        server=server,
        other={
            "keep_alive": kwargs.get("keep_alive"),
            # the model's runtime options loopscope has no name for (num_ctx, mirostat, ...)
            **{k: v for k, v in _options(kwargs.get("options")).items() if k not in _OPTIONS},
        },
    )
    return messages.request(
        provider_at(PROVIDER, server),
        model if isinstance(model, str) else None,
        tools=kwargs.get("tools"),
        stream=kwargs.get("stream") is True,
        parameters=parameters,
        messages=given if isinstance(given, (list, tuple)) else None,
    )


def _options(options: Any) -> dict[str, Any]:
    """``options``: a dict or the SDK's ``Options``, the options set."""
    if isinstance(options, dict):
        return {k: v for k, v in options.items() if v is not None}
    return options.model_dump(exclude_none=True) if r.is_model(options) else {}


# -- the answer -------------------------------------------------------------------------


def _response(last: Any, calls: list[ToolCall], **found: Any) -> ModelResponse:
    """A response of the final part's (``done: true``) reason and counts."""
    reason = r.get(last, "done_reason")
    figures = {key: r.get(last, key) for key in _DURATIONS}
    reported = {key: value for key, value in figures.items() if value is not None}
    return ModelResponse(
        tool_calls=calls,
        finish_reason=reason,
        finish=FINISH.with_calls(reason, calls),  # Ollama says stop for tool calls too
        usage=usage(input=figures["prompt_eval_count"], output=figures["eval_count"]),
        provider_usage=reported or None,
        model=r.get(last, "model"),
        **found,
    )


def _tool_calls(calls: Any) -> list[ToolCall]:
    return [ToolCall(id="", name=c.name, arguments=c.arguments if c.arguments is not None else {}) for c in _calls(calls)]


def _finish(answer: Any, model_call: ModelCall) -> None:
    message = r.get(answer, "message")
    model_call.finish(
        _response(
            answer,
            _tool_calls(r.get(message, "tool_calls")),
            text=r.get(message, "content") or None,
            thinking=r.get(message, "thinking") or None,
        )
    )


class _Parts(Gathered):
    """Reads a stream's ``ChatResponse`` parts: text as it comes, thinking and whole tool
    calls gathered, the reason and counts of the last part."""

    def __init__(self, call: ModelCall | None = None) -> None:
        super().__init__(call)
        self.last: Any = None

    def add(self, part: Any, model_call: ModelCall) -> None:
        message = r.get(part, "message")
        text, thought, calls = r.get(message, "content"), r.get(message, "thinking"), r.get(message, "tool_calls")
        if thought:
            self.thinking.append(thought)
        if calls:
            self.calls += _tool_calls(calls)
        if r.get(part, "done"):
            self.last = part
        if text:
            model_call.delta(text)
        elif thought or calls:
            model_call.first_chunk()

    def partial(self) -> ModelResponse:
        return _response(self.last, self.calls, thinking="".join(self.thinking) or None)


_deliver = answer_or_stream(_finish, _Parts)  # stream=True: a generator of parts


# -- patching ---------------------------------------------------------------------------


def patch() -> list[Patch | Registration]:
    import ollama

    patches: list[Patch | Registration | None] = [
        wrap(ollama.Client, "chat", sync_call(_request, _deliver)),
        wrap(ollama.AsyncClient, "chat", async_call(_request, _deliver)),
    ]
    default = getattr(ollama, "_client", None)  # the package's default client (it shadows the module ollama._client)
    original = getattr(ollama, "chat", None)
    if isinstance(default, ollama.Client) and getattr(original, "__self__", None) is default:
        ollama.chat = default.chat  # the module's bound method, taken at import: bound again, wrapped

        def undo() -> None:
            ollama.chat = original

        patches.append(Registration(undo))
    return [p for p in patches if p is not None]
