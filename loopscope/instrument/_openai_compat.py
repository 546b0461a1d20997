"""The OpenAI Chat Completions format, read once for every SDK and server that speaks it.

The openai SDK's ``chat.completions``, and the providers that answer in its format (Groq,
Mistral, DeepSeek, Together, OpenRouter, Ollama's and Gemini's OpenAI endpoints, vLLM, ...)
through their own SDKs or the openai one: the request (:func:`chat_request`), the response
(:func:`finish_completion`, :func:`completion_response`), the stream's chunks (:class:`ChatChunks`), and the usage
(:func:`chat_usage`). Plain functions of dicts and objects alike; an adapter gives its
provider's name and its client's server, and, if it has them, its SDK's chunk classes for
the fast path.

Importing this module imports no SDK (the openai adapter's import hook fires on ``openai``
only): an adapter of another SDK imports it without turning anything on or off.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..models import ToolCall
from ..recorder.adapter import (
    COMMON_FINISH,
    Choice,
    FinishMap,
    ModelCall,
    ModelRequest,
    ModelResponse,
    ToolResults,
    provider_at,
)
from ..recorder.adapter import usage as make_usage
from . import _history
from . import _read as r

FINISH = COMMON_FINISH
"""The format's finish reasons (``stop``, ``length``, ``tool_calls``, ``content_filter``,
``function_call``) in the kit's vocabulary; a provider with words of its own extends it."""


# -- Chat Completions -----------------------------------------------------------------


def chat_request(kwargs: dict[str, Any], *, provider: str, server: Mapping[str, Any] | None = None) -> ModelRequest:
    """A ``chat.completions.create`` request (its keyword arguments) by an SDK of ``provider``
    talking to ``server`` (:func:`~loopscope.recorder.adapter.server_of` of its base URL)."""
    messages = r.items(kwargs, "messages") or []
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
    # one, by position: the kit pairs them
    results = ToolResults()
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
            if results.wanted(call_id):
                text = content if type(content) is str else r.text_of(content)
                results.add(call_id, text or content)
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
        elif role == "assistant":
            results.model_spoke()
    request = _parameters(kwargs)
    if server:
        request.update(server)
    if not long:
        input_messages = r.messages_json(converted)
    else:
        input_messages = r.messages_json(converted, known)  # each new text made valid UTF-8 before it is kept
        _conversations.keep(messages, converted, known, found)
    return ModelRequest(
        provider_at(provider, server),
        kwargs.get("model"),
        function_tools(r.items(kwargs, "tools")),
        results.results,
        input_text,
        bool(kwargs.get("stream")),
        request,
        input_messages=input_messages,
        messages=messages,
    )


# 64: below, its messages' string-keyed cache (_read) already spares most of their encoding
conversations = _history.History(min_messages=64)
"""Long conversations' messages kept between calls (:mod:`._history`), for every provider of the format."""
_conversations = conversations


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


def function_tools(tools: Any) -> list[Any] | None:
    """The function tools a request offers (the format's other kinds run at the provider)."""
    if not tools or not isinstance(tools, (list, tuple)):
        return None
    return [t for t in tools if isinstance(t, dict) and t.get("type", "function") == "function"]


def chat_usage(usage: Any) -> dict[str, int]:
    """The format's usage: ``prompt_tokens`` count the cached ones, ``completion_tokens`` the reasoning."""
    if usage is None:
        return {}
    if type(usage) is not dict:  # the SDK's model: its fields are attributes, read without r.get's frames
        prompt = getattr(usage, "prompt_tokens_details", None)
        completion = getattr(usage, "completion_tokens_details", None)
        if type(prompt) is not dict and type(completion) is not dict:
            return make_usage(
                input=getattr(usage, "prompt_tokens", None),
                output=getattr(usage, "completion_tokens", None),
                cache_read=getattr(prompt, "cached_tokens", None),
                cache_write=getattr(prompt, "cache_write_tokens", None),
                reasoning=getattr(completion, "reasoning_tokens", None),
            )
    get = r.get
    prompt = get(usage, "prompt_tokens_details")
    completion = get(usage, "completion_tokens_details")
    return make_usage(
        input=get(usage, "prompt_tokens"),
        output=get(usage, "completion_tokens"),
        cache_read=get(prompt, "cached_tokens"),
        cache_write=get(prompt, "cache_write_tokens"),
        reasoning=get(completion, "reasoning_tokens"),
    )


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


def finish_completion(
    completion: Any, model_call: ModelCall, finish: FinishMap = FINISH, *, provider_usage: Any = None,
    thinking: str | None = None,
) -> None:
    """End ``model_call`` with a ``chat.completion`` (a dict or an SDK's model); ``finish``
    maps its finish reasons into the kit's vocabulary; ``provider_usage``: the provider's
    own figures where its ``usage`` is not all of them (Groq's ``x_groq``), else that usage;
    ``thinking``: the reasoning text a provider sends beside the format (Groq's ``reasoning``)."""
    model_call.finish(completion_response(completion, finish, provider_usage=provider_usage, thinking=thinking))


def completion_response(
    completion: Any, finish: FinishMap = FINISH, *, provider_usage: Any = None, thinking: str | None = None
) -> ModelResponse:
    """What a ``chat.completion`` (a dict or an SDK's model) said, read the way
    :func:`finish_completion` records it: for an adapter whose library adds figures of its own
    to the format (LiteLLM's cost), which it sets on the response before it finishes the call."""
    if r.is_model(completion):
        return _model_response(completion, finish, provider_usage, thinking)
    choices = r.get(completion, "choices") or []
    if not choices and r.get(completion, "error"):
        return _error_response(r.get(completion, "error"), completion)
    choice = choices[0] if choices else None
    message = r.get(choice, "message")
    refusal = r.get(message, "refusal")
    reported = r.get(completion, "usage")
    return ModelResponse(
        text=r.get(message, "content") or refusal,
        tool_calls=_message_calls(message),
        usage=chat_usage(reported),
        finish_reason=(reason := r.get(choice, "finish_reason")),
        finish=finish(reason),
        response_id=r.get(completion, "id"),
        model=r.get(completion, "model"),
        refusal=refusal or None,
        provider_usage=provider_usage or r.reported_json(reported),
        choices=_other_choices(choices) if len(choices) > 1 else (),
        thinking=thinking,
    )


def _model_response(completion: Any, finish: FinishMap, provider_usage: Any = None, thinking: str | None = None) -> ModelResponse:
    """:func:`completion_response` of the SDK's response model: its fields are attributes
    (``r.get`` is ``getattr`` for them), read without a Python call each."""
    choices = getattr(completion, "choices", None) or []
    if not choices and getattr(completion, "error", None):  # an error body parsed as a completion
        return _error_response(completion.error, completion)
    choice = choices[0] if choices else None
    if type(choice) is dict:
        return completion_response(dict(completion), finish, provider_usage=provider_usage, thinking=thinking)  # not the SDK's own shape
    message = getattr(choice, "message", None)
    if type(message) is dict:
        return completion_response(dict(completion), finish, provider_usage=provider_usage, thinking=thinking)
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
    return ModelResponse(
        text=getattr(message, "content", None) or refusal,
        tool_calls=calls,
        usage=chat_usage(reported),
        finish_reason=(reason := getattr(choice, "finish_reason", None)),
        finish=finish(reason),
        response_id=getattr(completion, "id", None),
        model=getattr(completion, "model", None),
        refusal=refusal or None,
        provider_usage=provider_usage or r.reported_json(reported),
        choices=_other_choices(choices) if len(choices) > 1 else (),
        thinking=thinking,
    )


# What a stream proxy keeps of a chunk as it hands it on (ChatChunks.capture): the chunk's
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
        (chat_usage(usage), usage) if usage is not None else None,
        tuple(_capture_choice(choice) for choice in r.get(chunk, "choices") or ()),
    )


class ChatChunks:
    """Accumulates ``chat.completion.chunk`` events into one response (a stream proxy's
    accumulator, see ``_streams.Accumulator``). ``chunk_types``: the SDK's chunk class and
    its choice class, read on a fast path (the openai SDK's; any other is read the general
    way); ``finish``: the provider's finish reasons in the kit's vocabulary."""

    chunk_types: tuple[Any, Any] = (None, None)

    def __init__(self, chunk_types: tuple[Any, Any] | None = None, finish: FinishMap = FINISH) -> None:
        if chunk_types is not None:
            self.chunk_types = chunk_types
        self.finish_map = finish
        self.calls: dict[Any, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, int] = {}
        self.reported_usage: Any = None  # the usage object as the provider sent it (provider_usage)
        self.response_id: str | None = None
        self.model: str | None = None
        self.refusal: list[str] = []
        self.others: dict[int, list[Any]] = {}  # index -> [texts, finish reason, refusals]: the answers after the first (n > 1)

    def capture(self, chunk: Any) -> _Captured:
        """What :meth:`add` reads of a chunk, taken as the stream proxy hands the chunk on
        (see ``_streams.Accumulator``): the SDK's own chunk model is read directly, its
        fields as attributes (loads, not ``getattr`` calls: every chunk of every stream
        passes here). The SDK builds chunks without validation, so a field a provider left
        out can be missing: then the chunk is read the general way, which gives what
        ``getattr`` with a default would."""
        chunk_type, choice_type = self.chunk_types
        if chunk_type is not None and type(chunk) is chunk_type:
            try:
                response_id, model, usage, choices = chunk.id, chunk.model, chunk.usage, chunk.choices
                if usage is not None:  # the last chunk's, once a stream
                    usage = (chat_usage(usage), usage)
                if not choices:
                    return (response_id, model, usage, ())
                if len(choices) == 1 and type(choice := choices[0]) is choice_type:  # the usual chunk
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
            finish=self.finish_map(self.finish_reason),
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


__all__ = [
    "FINISH", "ChatChunks", "chat_request", "chat_usage", "completion_response", "conversations", "finish_completion",
    "function_tools",
]
