"""The openai SDK: Chat Completions and Responses calls as rounds of stitched turns."""

from __future__ import annotations

from typing import Any

from ..models import ToolCall
from ..recorder.adapter import (
    Choice,
    ModelCall,
    ModelRequest,
    ModelResponse,
    ToolResult,
    provider_of_server,
    result_value,
    wants_result,
)
from . import _history
from . import _read as r
from ._calls import async_call, sync_call
from ._patch import Patch, Registration, when_imported, wrap
from ._streams import AsyncStream, SyncStream, closes_inner_stream

PROVIDER = "openai"


# -- Chat Completions -----------------------------------------------------------------


def _chat_request(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ModelRequest:
    messages = r.items(kwargs, "messages") or []
    results = []
    input_text = None
    # the messages in the GenAI schema, as JSON text made in the one pass that reads them
    # anyway (see _read.messages_json: the common shapes without a dict or an encoder walk);
    # a long conversation's messages of an earlier request are not encoded again (_history)
    long = _conversations.applies(len(messages))
    if long:
        known, kept, found = _conversations.reuse(messages)
        converted = list(kept)
    else:
        known, converted, found = 0, [], None
    # results without an id (Gemini's endpoint) answer the last response's calls without
    # one, by position: only those after the last assistant message are read
    unnamed: list[ToolResult] | None = [] if wants_result("") else None
    for index, message in enumerate(messages):
        fresh = index >= known  # not one of an earlier request's messages, whose JSON is kept
        plain = type(message) is dict  # the common case: read without r.get's frame
        role = message.get("role") if plain else r.get(message, "role")
        content = message.get("content") if plain else r.get(message, "content")
        if role == "tool":
            call_id = message.get("tool_call_id") if plain else r.get(message, "tool_call_id")
            if fresh:
                if type(call_id) is str and type(content) is str:
                    converted.append(r.tool_result_json(call_id, content))
                else:
                    part = {"type": "tool_call_response", "id": call_id, "response": content}
                    converted.append(r.message_json({"role": "tool", "parts": [part]}))
            # only the results of calls still open are read (a long history holds many)
            if call_id and wants_result(call_id if type(call_id) is str else str(call_id)):
                text = content if type(content) is str else r.text_of(content)
                results.append(ToolResult(str(call_id), result_value(text or content)))
            elif not call_id and unnamed is not None:
                text = content if type(content) is str else r.text_of(content)
                unnamed.append(ToolResult("", result_value(text or content)))
            continue
        calls = (message.get("tool_calls") if plain else r.get(message, "tool_calls")) if role == "assistant" else None
        if fresh:
            if type(content) is str and type(role) is str and not calls:
                converted.append(r.text_message_json(role, content))
            elif type(calls) is list and (content is None or type(content) is str) and calls and (
                made := r.calls_message_json(content, calls)
            ) is not None:
                converted.append(made)  # the usual tool loop's assistant message, encoded once
            else:
                converted.append(_message_json(role, content, calls))
        if role == "user":
            input_text = content if type(content) is str else r.text_of(content)
        elif unnamed and role == "assistant":
            unnamed = []
    if unnamed:
        results += unnamed
    request = _parameters(kwargs)
    server = r.server(instance)
    request.update(server)
    if not long:
        input_messages = r.messages_json(converted)
    else:
        input_messages = r.messages_json(converted, known)  # each new text made valid UTF-8 before it is kept
        _conversations.keep(messages, converted, known, found)
    return ModelRequest(
        provider_of_server(PROVIDER, server.get("server_address"), server.get("server_port")) if server else PROVIDER,
        kwargs.get("model"),
        _function_tools(r.items(kwargs, "tools")),
        results,
        input_text,
        bool(kwargs.get("stream")),
        request,
        input_messages=input_messages,
        messages=messages,
    )


# 64: below, its messages' string-keyed cache (_read) already spares most of their encoding
_conversations = _history.History(min_messages=64)


def _message_json(role: Any, content: Any, calls: Any) -> str:
    """A message with parts other than one text (content parts, tool calls) as GenAI JSON text."""
    if content is None:
        parts = []
    elif type(content) is str:
        parts = [r.text_part_json(content)]
    else:
        parts = [r.message_json(part) for part in r.content_parts(content)]
    for call in calls or ():
        if type(call) is dict and type(function := call.get("function")) is dict:
            call_id, name, arguments = call.get("id"), function.get("name"), function.get("arguments")
        else:
            function = r.get(call, "function")
            call_id, name, arguments = r.get(call, "id"), r.get(function, "name"), r.get(function, "arguments")
        if type(call_id) is str and type(name) is str and type(arguments) is str:
            parts.append(r.tool_call_json(call_id, name, arguments))
        else:
            parts.append(r.message_json({"type": "tool_call", "id": call_id, "name": name, "arguments": arguments}))
    return '{"role":' + (r.string_json(role) if type(role) is str else r.message_json(role)) + ',"parts":[' + ",".join(parts) + "]}"


_PARAMETERS = (  # the request's parameters, in the order their span attributes take
    ("temperature", "temperature"),
    ("top_p", "top_p"),
    ("max_tokens", "max_tokens"),  # max_completion_tokens first, see below
    ("frequency_penalty", "frequency_penalty"),
    ("presence_penalty", "presence_penalty"),
    ("seed", "seed"),
    ("stop", "stop"),
    ("choice_count", "n"),
    ("reasoning_effort", "reasoning_effort"),
    ("tool_choice", "tool_choice"),
    ("service_tier", "service_tier"),
    ("response_format", "response_format"),  # with gen_ai.output.type, see below
    ("parallel_tool_calls", "parallel_tool_calls"),
    ("logprobs", "logprobs"),
    ("top_logprobs", "top_logprobs"),
    ("store", "store"),
)
_PARAMETER_KEYS = frozenset({key for _, key in _PARAMETERS} | {"max_completion_tokens"})
# the parameters a call sets -> those of _PARAMETERS to read, in order: a program sets the
# same few on every call (at most 2**12 sets of them, each a few entries)
_plans: dict[frozenset[str], tuple[tuple[str, str], ...]] = {}


def _parameters(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The request parameters a call sets (a call sets few of them: only those are read)."""
    present = _PARAMETER_KEYS.intersection(kwargs)
    request: dict[str, Any] = {}
    if not present:
        return request
    plan = _plans.get(present)
    if plan is None:
        plan = _plans[present] = tuple(
            (name, key)
            for name, key in _PARAMETERS
            if key in present or (name == "max_tokens" and "max_completion_tokens" in present)
        )
    for name, key in plan:
        if name == "max_tokens":
            request[name] = kwargs.get("max_completion_tokens") or kwargs.get("max_tokens")
        elif name == "stop":
            stop = kwargs["stop"]
            request[name] = [stop] if isinstance(stop, str) else stop
        elif name == "tool_choice":
            request[name] = r.tool_choice(kwargs[key])
        elif name == "response_format":
            request[name], request["output_type"] = r.output_format(kwargs[key])
        else:
            request[name] = kwargs[key]
    return request


def _function_tools(tools: Any) -> list[Any] | None:
    if not tools or not isinstance(tools, (list, tuple)):
        return None
    return [t for t in tools if isinstance(t, dict) and t.get("type", "function") == "function"]


_USAGE_KEYS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens", "reasoning_tokens")


def _chat_usage(usage: Any) -> dict[str, int]:
    if usage is None:
        return {}
    if type(usage) is not dict:  # the SDK's model: its fields are attributes, read without r.get's frames
        prompt = getattr(usage, "prompt_tokens_details", None)
        completion = getattr(usage, "completion_tokens_details", None)
        if type(prompt) is not dict and type(completion) is not dict:
            values: tuple[Any, ...] = (
                getattr(usage, "prompt_tokens", None),
                getattr(usage, "completion_tokens", None),
                getattr(prompt, "cached_tokens", None),
                getattr(prompt, "cache_write_tokens", None),
                getattr(completion, "reasoning_tokens", None),
            )
            return {
                key: value
                for key, value in zip(_USAGE_KEYS, values)
                if type(value) is int or (isinstance(value, int) and not isinstance(value, bool))
            }
    get = r.get
    prompt = get(usage, "prompt_tokens_details")
    completion = get(usage, "completion_tokens_details")
    out = {}
    for key, value in (
        ("input_tokens", get(usage, "prompt_tokens")),
        ("output_tokens", get(usage, "completion_tokens")),
        ("cache_read_input_tokens", get(prompt, "cached_tokens")),
        ("cache_creation_input_tokens", get(prompt, "cache_write_tokens")),
        ("reasoning_tokens", get(completion, "reasoning_tokens")),
    ):
        if type(value) is int or (isinstance(value, int) and not isinstance(value, bool)):
            out[key] = value
    return out


def _error_response(error: Any, completion: Any) -> ModelResponse:
    """An HTTP 200 whose body is an error (``{"error": {...}}``, no choices: some gateways answer so)."""
    if isinstance(error, str):
        text, kind = error, None
    else:
        text = r.get(error, "message")
        kind = r.get(error, "type") or r.get(error, "code")
        if not isinstance(text, str) or not text:
            text = r.json_text(error)
    return ModelResponse(
        error=text, error_type=str(kind) if kind else None, response_id=r.get(completion, "id"), model=r.get(completion, "model")
    )


def _message_calls(message: Any) -> list[ToolCall]:
    calls = []
    for call in r.get(message, "tool_calls") or []:
        function = r.get(call, "function")
        if function is not None:
            calls.append(ToolCall(id=str(r.get(call, "id") or ""), name=str(r.get(function, "name")), arguments=r.arguments(r.get(function, "arguments"))))
    return calls


def _other_choices(choices: Any) -> list[Choice]:
    """The answers after the first (``n > 1``), read the general way (they are rare)."""
    out = []
    for choice in list(choices)[1:]:
        message = r.get(choice, "message")
        refusal = r.get(message, "refusal")
        out.append(
            Choice(
                text=r.get(message, "content") or refusal,
                finish_reason=r.get(choice, "finish_reason"),
                tool_calls=_message_calls(message),
                refusal=refusal,
            )
        )
    return out


def _finish_completion(completion: Any, model_call: ModelCall) -> None:
    if r.is_model(completion):
        return _finish_model(completion, model_call)
    choices = r.get(completion, "choices") or []
    if not choices and r.get(completion, "error"):
        return model_call.finish(_error_response(r.get(completion, "error"), completion))
    choice = choices[0] if choices else None
    message = r.get(choice, "message")
    refusal = r.get(message, "refusal")
    reported = r.get(completion, "usage")
    usage = _chat_usage(reported)
    model_call.finish(
        ModelResponse(
            text=r.get(message, "content") or refusal,
            tool_calls=_message_calls(message),
            usage=usage,
            finish_reason=r.get(choice, "finish_reason"),
            response_id=r.get(completion, "id"),
            model=r.get(completion, "model"),
            refusal=refusal or None,
            provider_usage=r.reported_json(reported),
            choices=_other_choices(choices) if len(choices) > 1 else (),
        )
    )


def _finish_model(completion: Any, model_call: ModelCall) -> None:
    """:func:`_finish_completion` for the SDK's response model: its fields are attributes
    (``r.get`` is ``getattr`` for them), read without a Python call each."""
    choices = getattr(completion, "choices", None) or []
    if not choices and getattr(completion, "error", None):  # an error body parsed as a completion
        return model_call.finish(_error_response(completion.error, completion))
    choice = choices[0] if choices else None
    if type(choice) is dict:
        return _finish_completion(dict(completion), model_call)  # not the SDK's own shape: the general way
    message = getattr(choice, "message", None)
    if type(message) is dict:
        return _finish_completion(dict(completion), model_call)
    calls = []
    for call in getattr(message, "tool_calls", None) or []:
        if type(call) is dict:
            function, call_id = call.get("function"), call.get("id")
        else:
            function, call_id = getattr(call, "function", None), getattr(call, "id", None)
        if function is not None:
            if type(function) is dict:
                name, arguments = function.get("name"), function.get("arguments")
            else:
                name, arguments = getattr(function, "name", None), getattr(function, "arguments", None)
            calls.append(ToolCall(id=str(call_id or ""), name=str(name), arguments=r.arguments(arguments)))
    refusal = getattr(message, "refusal", None)
    reported = getattr(completion, "usage", None)
    usage = _chat_usage(reported)
    model_call.finish(
        ModelResponse(
            text=getattr(message, "content", None) or refusal,
            tool_calls=calls,
            usage=usage,
            finish_reason=getattr(choice, "finish_reason", None),
            response_id=getattr(completion, "id", None),
            model=getattr(completion, "model", None),
            refusal=refusal or None,
            provider_usage=r.reported_json(reported),
            choices=_other_choices(choices) if len(choices) > 1 else (),
        )
    )


# What a stream proxy keeps of a chunk as it hands it on (_ChatChunks.capture): the chunk's
# (id, model, usage, choices), each choice (index, content, refusal, finish reason, calls),
# each call fragment (index, id, name, arguments). Strings and numbers only (and the usage,
# read into a dict, beside the object as sent for provider_usage): the application may change
# the SDK's objects once it has them.
_Part = tuple[Any, Any, Any, Any]
_Delta = tuple[Any, Any, Any, Any, "list[_Part] | None"]
_Captured = tuple[Any, Any, "tuple[dict[str, int], Any] | None", "tuple[_Delta, ...]"]


def _call_parts(calls: Any) -> list[_Part]:
    """A delta's tool-call fragments as (index, id, name, arguments)."""
    out = []
    for part in calls:
        if type(part) is dict:
            index, call_id, function = part.get("index", 0), part.get("id"), part.get("function")
        else:
            index, call_id, function = getattr(part, "index", 0), getattr(part, "id", None), getattr(part, "function", None)
        if type(function) is dict:
            name, arguments = function.get("name"), function.get("arguments")
        else:
            name, arguments = getattr(function, "name", None), getattr(function, "arguments", None)
        out.append((index, call_id, name, arguments))
    return out


def _capture_choice(choice: Any) -> _Delta:
    """One choice of a chunk, read the general way (a dict, or an object missing a field)."""
    delta = r.get(choice, "delta")
    calls = r.get(delta, "tool_calls")
    return (
        r.get(choice, "index", 0),
        r.get(delta, "content"),
        r.get(delta, "refusal"),
        r.get(choice, "finish_reason"),
        _call_parts(calls) if calls else None,
    )


def _capture_general(chunk: Any) -> _Captured:
    usage = r.get(chunk, "usage")
    return (
        r.get(chunk, "id"),
        r.get(chunk, "model"),
        (_chat_usage(usage), usage) if usage is not None else None,
        tuple(_capture_choice(choice) for choice in r.get(chunk, "choices") or ()),
    )


class _ChatChunks:
    """Accumulates ``chat.completion.chunk`` events into one response."""

    def __init__(self) -> None:
        self.calls: dict[Any, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, int] = {}
        self.reported_usage: Any = None  # the usage object as the provider sent it (provider_usage)
        self.response_id: str | None = None
        self.model: str | None = None
        self.refusal: list[str] = []
        self.others: dict[int, list[Any]] = {}  # index -> [texts, finish reason, refusals]: the answers after the first (n > 1)

    @staticmethod
    def capture(chunk: Any) -> _Captured:
        """What :meth:`add` reads of a chunk, taken as the stream proxy hands the chunk on
        (see ``_streams.Accumulator``): the SDK's own chunk model is read directly, its
        fields as attributes (loads, not ``getattr`` calls: every chunk of every stream
        passes here). The SDK builds chunks without validation, so a field a provider left
        out can be missing: then the chunk is read the general way, which gives what
        ``getattr`` with a default would."""
        if type(chunk) is _chunk_type:
            try:
                response_id, model, usage, choices = chunk.id, chunk.model, chunk.usage, chunk.choices
                if usage is not None:  # the last chunk's, once a stream
                    usage = (_chat_usage(usage), usage)
                if not choices:
                    return (response_id, model, usage, ())
                if len(choices) == 1 and type(choice := choices[0]) is _choice_type:  # the usual chunk
                    delta = choice.delta
                    calls = delta.tool_calls
                    return (
                        response_id,
                        model,
                        usage,
                        ((choice.index, delta.content, delta.refusal, choice.finish_reason, _call_parts(calls) if calls else None),),
                    )
            except (AttributeError, TypeError):  # a field left out, a delta of another kind (a dict)
                pass
        return _capture_general(chunk)

    def add(self, captured: _Captured, model_call: ModelCall) -> None:
        """One chunk, as :meth:`capture` kept it."""
        response_id, model, usage, choices = captured
        if not self.response_id:
            self.response_id = response_id
        if not self.model:
            self.model = model
        if usage is not None:
            self.usage, self.reported_usage = usage
        for index, content, refusal, reason, calls in choices:
            if index != 0:
                self._add_other(index, content, refusal, reason)
                continue
            if content:
                model_call.round.text_delta(content)  # ModelCall.delta without its frame
            if refusal:
                self.refusal.append(refusal)
                model_call.delta(refusal)  # a refusal is what the model said (as a parsed one's text)
            if calls:
                self._add_calls(calls, model_call)
            if reason:
                self.finish_reason = reason

    def _add_other(self, index: Any, content: Any, refusal: Any, reason: Any) -> None:
        """A chunk of an answer after the first (``n > 1``)."""
        slot = self.others.setdefault(index, [[], None, []])
        if content:
            slot[0].append(content)
        if refusal:
            slot[0].append(refusal)
            slot[2].append(refusal)
        if reason:
            slot[1] = reason

    def _add_calls(self, calls: list[_Part], model_call: ModelCall) -> None:
        for index, call_id, name, arguments in calls:
            model_call.first_chunk()
            slot = self.calls.get(index)
            if slot is None:
                slot = self.calls[index] = {"id": None, "name": "", "arguments": []}
            if not slot["id"]:
                slot["id"] = call_id
            # a name comes whole in the call's first fragment; a gateway that repeats it in
            # every fragment (OpenRouter's) must not make it twice the name
            if name and name != slot["name"]:
                slot["name"] += name
            if arguments:
                slot["arguments"].append(arguments)

    def finish(self, model_call: ModelCall) -> None:
        calls = [
            ToolCall(id=str(slot["id"] or ""), name=slot["name"], arguments=r.arguments("".join(slot["arguments"])))
            for _, slot in sorted(self.calls.items())
        ]
        response = self.partial()
        response.tool_calls = calls
        model_call.finish(response)

    def partial(self) -> ModelResponse:
        """What the chunks said (all of it at the end; so far, for a stream closed early)."""
        usage = self.usage
        return ModelResponse(
            usage=usage,
            finish_reason=self.finish_reason,
            response_id=self.response_id,
            model=self.model,
            refusal="".join(self.refusal) if self.refusal else None,
            provider_usage=r.reported_json(self.reported_usage),
            choices=[
                Choice(text="".join(texts) or None, finish_reason=reason, refusal="".join(refusals) or None)
                for _, (texts, reason, refusals) in sorted(self.others.items())
            ]
            if self.others
            else (),
        )


try:
    from openai.types.chat import ChatCompletionChunk as _chunk_type
    from openai.types.chat.chat_completion_chunk import Choice as _choice_type
except ImportError:  # pragma: no cover - an SDK without them: every chunk the general way
    _chunk_type = _choice_type = None


def _deliver_chat(result: Any, model_call: ModelCall) -> Any:
    return _deliver(result, model_call, _finish_completion, _ChatChunks)


def _parse_answered(exc: BaseException) -> Any:
    """The completion ``parse()`` raises with when it cannot parse what the model answered
    (``LengthFinishReasonError``: cut at the token limit; ``ContentFilterFinishReasonError``:
    the provider's filter stopped it): the call was answered and billed, so the completion
    is recorded (its finish reason makes the outcome ``truncated`` / ``content_filter``)."""
    import openai

    if isinstance(exc, (openai.LengthFinishReasonError, openai.ContentFilterFinishReasonError)):
        return exc.completion  # None for a content filter error raised without one
    return None


# -- shared delivery ------------------------------------------------------------------


def _deliver(result: Any, model_call: ModelCall, finish_one: Any, chunks: Any) -> Any:
    if r.is_model(result):  # a parsed response: by far the most common (and
        finish_one(result, model_call)  # ``hasattr`` on a model for what it lacks is slow)
        return result
    import openai

    if isinstance(result, openai.Stream):
        return SyncStream(result, model_call, chunks())
    if isinstance(result, openai.AsyncStream):
        return AsyncStream(result, model_call, chunks())
    if hasattr(result, "http_response") and hasattr(result, "parse"):
        return _raw_response(result, model_call, finish_one, chunks)
    finish_one(result, model_call)
    return result


def _raw_response(result: Any, model_call: ModelCall, finish_one: Any, chunks: Any) -> Any:
    """``with_raw_response`` calls: the body is read when the user parses it."""
    from ._raw import RawResponse

    return RawResponse(result, model_call, lambda parsed: _deliver(parsed, model_call, finish_one, chunks))


# -- patching -------------------------------------------------------------------------


def patch() -> list[Registration]:
    # The SDK imports a resource at its first use (``client.chat``, ``client.responses``),
    # some at a cost (~0.3 s for the Responses stream events): each is wrapped then.
    registrations = [
        when_imported("openai.resources.chat.completions.completions", _patch_chat, "instrument openai"),
        # the stream() helpers read our stream proxy but close the HTTP response directly
        when_imported("openai.lib.streaming.chat._completions", _patch_chat_helpers, "instrument openai"),
    ]
    try:
        from . import _openai_responses
    except ImportError:  # the Responses adapter is optional
        pass
    else:
        registrations += _openai_responses.patch(_deliver)
    return registrations


def _patch_chat(chat: Any) -> list[Patch | None]:
    return [
        # the openai SDK emits no spans of its own: nothing needs the call marked
        wrap(chat.Completions, "create", sync_call(_chat_request, _deliver_chat, mark=False)),
        wrap(chat.Completions, "parse", sync_call(_chat_request, _deliver_chat, mark=False, answered=_parse_answered)),
        wrap(chat.AsyncCompletions, "create", async_call(_chat_request, _deliver_chat, mark=False)),
        wrap(chat.AsyncCompletions, "parse", async_call(_chat_request, _deliver_chat, mark=False, answered=_parse_answered)),
    ]


def _patch_chat_helpers(helpers: Any) -> list[Patch | None]:
    # the helper raises parse()'s errors as it reads the chunk that finishes the answer
    return [
        wrap(helpers.ChatCompletionStream, "close", closes_inner_stream("_raw_stream", answered=_parse_answered)),
        wrap(
            helpers.AsyncChatCompletionStream,
            "close",
            closes_inner_stream("_raw_stream", is_async=True, answered=_parse_answered),
        ),
    ]
