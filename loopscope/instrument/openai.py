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


class _ChatChunks:
    """Accumulates ``chat.completion.chunk`` events into one response."""

    def __init__(self) -> None:
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, int] = {}
        self.reported_usage: Any = None  # the usage object as the provider sent it (provider_usage)
        self.response_id: str | None = None
        self.model: str | None = None
        self.refusal: list[str] = []
        self.others: dict[int, list[Any]] = {}  # index -> [texts, finish reason, refusals]: the answers after the first (n > 1)

    def add(self, chunk: Any, model_call: ModelCall) -> None:
        """One chunk; the SDK's own chunk model read directly, without a further frame per
        chunk: its fields are read as attributes (loads, not ``getattr`` calls: every chunk
        of every stream passes here), all of them before any is used. The SDK builds
        chunks without validation, so a field a provider left out can be missing: then the
        chunk (or the choice) is read the general way, which gives what ``getattr`` with a
        default would."""
        if type(chunk) is not _chunk_type:
            return self._add_general(chunk, model_call)
        try:
            response_id, model, usage, choices = chunk.id, chunk.model, chunk.usage, chunk.choices
        except AttributeError:
            return self._add_general(chunk, model_call)
        if not self.response_id:
            self.response_id = response_id
        if not self.model:
            self.model = model
        if usage is not None:
            self.usage = _chat_usage(usage)
            self.reported_usage = usage
        for choice in choices or ():
            if type(choice) is not _choice_type:
                self._add_choice(choice, model_call)  # a dict, or another object: the general way
                continue
            try:
                delta, index, reason = choice.delta, choice.index, choice.finish_reason
                content, refusal, calls = delta.content, delta.refusal, delta.tool_calls
            except AttributeError:  # a field left out, or a delta of another kind (a dict)
                self._add_choice(choice, model_call)
                continue
            if index != 0:
                self._add_other(choice)
                continue
            if content:
                model_call.round.text_delta(content)  # ModelCall.delta without its frame
            if refusal:
                self.refusal.append(refusal)
                model_call.delta(refusal)  # a refusal is what the model said (as a parsed one's text)
            if calls:
                self._add_choice_calls(delta, model_call)
            if reason:
                self.finish_reason = reason

    def _add_general(self, chunk: Any, model_call: ModelCall) -> None:
        self.response_id = self.response_id or r.get(chunk, "id")
        self.model = self.model or r.get(chunk, "model")
        usage = r.get(chunk, "usage")
        if usage is not None:
            self.usage = _chat_usage(usage)
            self.reported_usage = usage
        for choice in r.get(chunk, "choices") or []:
            self._add_choice(choice, model_call)

    def _add_other(self, choice: Any) -> None:
        """A chunk of an answer after the first (``n > 1``)."""
        slot = self.others.setdefault(r.get(choice, "index", 0), [[], None, []])
        delta = r.get(choice, "delta")
        content = r.get(delta, "content")
        if content:
            slot[0].append(content)
        refusal = r.get(delta, "refusal")
        if refusal:
            slot[0].append(refusal)
            slot[2].append(refusal)
        reason = r.get(choice, "finish_reason")
        if reason:
            slot[1] = reason

    def _add_choice(self, choice: Any, model_call: ModelCall) -> None:
        if r.get(choice, "index", 0) != 0:
            return self._add_other(choice)
        delta = r.get(choice, "delta")
        content = r.get(delta, "content")
        if content:
            model_call.delta(content)
        refusal = r.get(delta, "refusal")
        if refusal:
            self.refusal.append(refusal)
            model_call.delta(refusal)
        for part in r.get(delta, "tool_calls") or []:
            model_call.first_chunk()
            slot = self.calls.setdefault(r.get(part, "index", 0), {"id": None, "name": "", "arguments": []})
            slot["id"] = slot["id"] or r.get(part, "id")
            function = r.get(part, "function")
            if r.get(function, "name"):
                slot["name"] += r.get(function, "name")
            if r.get(function, "arguments"):
                slot["arguments"].append(r.get(function, "arguments"))
        if r.get(choice, "finish_reason"):
            self.finish_reason = r.get(choice, "finish_reason")

    def _add_choice_calls(self, delta: Any, model_call: ModelCall) -> None:
        for part in getattr(delta, "tool_calls", None) or ():
            if type(part) is dict:
                get = part.get
                index, call_id, function = get("index", 0), get("id"), get("function")
            else:
                index, call_id, function = getattr(part, "index", 0), getattr(part, "id", None), getattr(part, "function", None)
            if type(function) is dict:
                name, arguments = function.get("name"), function.get("arguments")
            else:
                name, arguments = getattr(function, "name", None), getattr(function, "arguments", None)
            model_call.first_chunk()
            slot = self.calls.setdefault(index, {"id": None, "name": "", "arguments": []})
            if not slot["id"]:
                slot["id"] = call_id
            if name:
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
        wrap(chat.Completions, "parse", sync_call(_chat_request, _deliver_chat, mark=False)),
        wrap(chat.AsyncCompletions, "create", async_call(_chat_request, _deliver_chat, mark=False)),
        wrap(chat.AsyncCompletions, "parse", async_call(_chat_request, _deliver_chat, mark=False)),
    ]


def _patch_chat_helpers(helpers: Any) -> list[Patch | None]:
    return [
        wrap(helpers.ChatCompletionStream, "close", closes_inner_stream("_raw_stream")),
        wrap(helpers.AsyncChatCompletionStream, "close", closes_inner_stream("_raw_stream", is_async=True)),
    ]
