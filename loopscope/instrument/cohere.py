"""The cohere SDK: v2 Chat calls (``ClientV2.chat``, ``chat_stream``, and their async twins) as rounds.

Wrapped on the SDK's raw v2 clients (``RawV2Client`` / ``AsyncRawV2Client``), which the
user-facing ``V2Client`` looks up at each call: ``ClientV2.__init__`` binds its own
``chat`` and ``chat_stream`` into the instance (an argument check, an experimental-feature
warning), so a wrapper on ``V2Client`` would miss the clients made before ``instrument()``
and keep recording those made before ``uninstrument()``. ``chat`` gives an ``HttpResponse``
whose ``data`` is the answer; ``chat_stream`` is a context manager whose response's ``data``
is the event generator: the call starts when it is entered, and its events are read through
the kit's stream proxy.

Cohere's words: the text before tool calls is the answer's ``tool_plan`` (recorded as the
round's text); tool results are ``tool`` messages with ``tool_call_id``; usage counts
``tokens`` (what is recorded: the conventions count tokens) beside ``billed_units`` (kept in
the provider's usage, as all its figures). Importing this module imports no SDK.
"""

from __future__ import annotations

import functools
from typing import Any

from ..recorder.adapter import (
    Finish,
    FinishMap,
    ModelCall,
    ModelRequest,
    ModelResponse,
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
from ._calls import async_call, streamed, sync_call
from ._patch import Patch, wrap
from ._streams import Gathered, StreamedCalls, closes_inner_stream, proxy_stream

PROVIDER = "cohere"
FINISH = FinishMap(
    {
        "COMPLETE": Finish.STOP,
        "STOP_SEQUENCE": Finish.STOP,
        "MAX_TOKENS": Finish.LENGTH,
        "TOOL_CALL": Finish.TOOL_CALL,
        "ERROR": Finish.ERROR,
        "TIMEOUT": Finish.ERROR,  # the generation ran out of Cohere's time: an answer that failed
        # the v1 API's words, which some gateways still send
        "ERROR_TOXIC": Finish.CONTENT_FILTER,
        "ERROR_LIMIT": Finish.LENGTH,
        "USER_CANCEL": Finish.STOP,
    }
)


# -- the request ------------------------------------------------------------------------


def _texts(content: Any, kind: str) -> list[str]:
    """A content list's items of ``kind`` (``text``, ``thinking``): their text."""
    if not isinstance(content, (list, tuple)):
        return []
    found = [r.get(item, kind) for item in content if r.get(item, "type") == kind]
    return [t for t in found if isinstance(t, str) and t]


def _text(content: Any) -> str | None:
    """A message content's text: a string, or its ``text`` items joined."""
    return content if content is None or isinstance(content, str) else "".join(_texts(content, "text")) or None


def _result(content: Any) -> Any:
    """A tool message's content as the model is sent it: a string, the text or the
    documents' data of its items (one item: that value)."""
    if content is None or isinstance(content, str) or not isinstance(content, (list, tuple)):
        return content
    values = []
    for item in content:
        kind = r.get(item, "type")
        if kind == "text":
            values.append(r.get(item, "text"))
        elif kind == "document":
            document = r.get(item, "document")
            data = r.get(document, "data")
            values.append(data if data is not None else r.get(document, "id"))
    return values[0] if len(values) == 1 else values


def _calls(calls: Any) -> list[ToolCallRequest]:
    return [
        ToolCallRequest(str(r.get(r.get(c, "function"), "name")), r.arguments(r.get(r.get(c, "function"), "arguments")), r.get(c, "id"))
        for c in calls or ()
    ]


def _request(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any], stream: bool = False) -> ModelRequest:
    messages = RequestMessages()
    kwargs = {key: value for key, value in kwargs.items() if value is not Ellipsis}  # the SDK's "not given"
    given = kwargs.get("messages")
    for message in given if isinstance(given, (list, tuple)) else ():
        role, content = r.get(message, "role"), r.get(message, "content")
        if role == "tool":
            messages.add("tool", [messages.result(r.get(message, "tool_call_id"), _result(content))])
            continue
        text = _text(content)
        parts: list[Any] = []
        if role == "assistant":
            parts += [Reasoning(t) for t in _texts(content, "thinking")]
            plan = r.get(message, "tool_plan")
            if isinstance(plan, str) and plan:
                parts.append(Text(plan))
        if text:
            parts.append(Text(text))
        if role == "assistant":
            parts += _calls(r.get(message, "tool_calls"))
        messages.add(str(role), parts, text)  # a user message's text is the input text
    choice = kwargs.get("tool_choice")
    output = kwargs.get("response_format")
    output_type = r.get(output, "type")
    thinking: Any = kwargs.get("thinking")  # a dict or the SDK's Thinking
    server = server_of(instance._client_wrapper.get_base_url())
    parameters = request_parameters(
        provider=PROVIDER,
        temperature=kwargs.get("temperature"),
        top_p=kwargs.get("p"),
        top_k=kwargs.get("k"),
        max_tokens=kwargs.get("max_tokens"),
        stop=kwargs.get("stop_sequences"),
        seed=kwargs.get("seed"),
        frequency_penalty=kwargs.get("frequency_penalty"),
        presence_penalty=kwargs.get("presence_penalty"),
        logprobs=kwargs.get("logprobs"),
        tool_choice=choice.lower() if isinstance(choice, str) else None,  # REQUIRED, NONE
        output_type={"text": "text", "json_object": "json"}.get(output_type) if isinstance(output_type, str) else None,
        thinking=thinking.model_dump(exclude_none=True) if r.is_model(thinking) else thinking,
        server=server,
        other={key: kwargs.get(key) for key in ("safety_mode", "strict_tools", "priority")},
    )
    return messages.request(
        provider_at(PROVIDER, server),
        kwargs.get("model"),
        tools=kwargs.get("tools"),
        stream=stream,
        parameters=parameters,
        messages=given if isinstance(given, (list, tuple)) else None,
    )


# -- the answer -------------------------------------------------------------------------


def _usage(reported: Any) -> dict[str, int]:
    """Recorded: ``tokens`` (what the model read and wrote; its input counts the cached
    tokens), not ``billed_units`` (what is charged, which may leave tokens out)."""
    tokens = r.get(reported, "tokens")
    return usage(
        input=r.count(r.get(tokens, "input_tokens")),
        output=r.count(r.get(tokens, "output_tokens")),
        cache_read=r.count(r.get(reported, "cached_tokens")),
    )


def _response(reason: Any, reported: Any, **found: Any) -> ModelResponse:
    return ModelResponse(
        finish_reason=reason,
        finish=FINISH(reason),
        usage=_usage(reported) if reported is not None else None,
        provider_usage=r.reported_json(reported),
        **found,
    )


def _finish(answer: Any, model_call: ModelCall) -> None:
    message = r.get(answer, "message")
    content = r.get(message, "content")
    model_call.finish(
        _response(
            r.get(answer, "finish_reason"),
            r.get(answer, "usage"),
            text=_text(content) or r.get(message, "tool_plan") or None,  # the plan: the text before the calls
            tool_calls=_calls(r.get(message, "tool_calls")),  # read as calls (id, name, arguments)
            thinking="".join(_texts(content, "thinking")) or None,
            response_id=r.get(answer, "id"),
        )
    )


class _Events(Gathered):
    """Reads the v2 stream's events: text and the tool plan as streamed text, tool calls
    from their start and argument deltas, the end (reason, usage, error) at ``message-end``."""

    final_events = frozenset({"message-end"})

    def __init__(self) -> None:
        super().__init__()
        self.pieces = StreamedCalls()  # the tool calls, from their start and argument deltas
        self.reported: Any = None
        self.error: str | None = None

    def add(self, event: Any, model_call: ModelCall) -> None:
        kind = r.get(event, "type")
        message = r.get(r.get(event, "delta"), "message")
        if kind in ("content-delta", "content-start"):
            content = r.get(message, "content")
            text, thought = r.get(content, "text"), r.get(content, "thinking")
            if text:
                model_call.delta(text)
                return
            if thought:
                self.thinking.append(thought)
        elif kind == "tool-plan-delta":
            plan = r.get(message, "tool_plan")
            if plan:
                model_call.delta(plan)
                return
        elif kind == "tool-call-start":
            call = r.get(message, "tool_calls")
            function = r.get(call, "function")
            self.pieces.start(r.get(event, "index"), r.get(call, "id"), r.get(function, "name"), r.get(function, "arguments"))
        elif kind == "tool-call-delta":
            self.pieces.more(r.get(event, "index"), r.get(r.get(r.get(message, "tool_calls"), "function"), "arguments"))
        elif kind == "message-start":
            self.response_id = r.get(event, "id")
        elif kind == "message-end":
            delta = r.get(event, "delta")
            self.reason, self.reported, self.error = r.get(delta, "finish_reason"), r.get(delta, "usage"), r.get(delta, "error")
            self.finish(model_call)  # complete now, even if the reader stops before the stream's end
            return
        model_call.first_chunk()

    def finish(self, model_call: ModelCall) -> None:
        response = self.partial()
        response.tool_calls = self.pieces.calls()
        response.thinking = "".join(self.thinking) or None
        response.error = self.error or None  # a failure mid-answer: message-end says it
        model_call.finish(response)

    def partial(self) -> ModelResponse:
        return _response(self.reason, self.reported, response_id=self.response_id)


def _deliver(result: Any, model_call: ModelCall) -> Any:
    _finish(r.get(result, "data"), model_call)
    return result


# -- chat_stream: a context manager whose response holds the events ------------------------


class _StreamManager:
    """``RawV2Client.chat_stream(...)`` as the SDK made it (not entered yet): the model call
    starts when it is entered, its events are read through our proxy (the response's
    ``data``), and it ends, at the latest, when the manager is left: the SDK's async
    generator reads the events with ``async for``, which leaves them unclosed when the user
    closes it early, but it leaves this manager then."""

    _exit = staticmethod(closes_inner_stream("stream"))
    _aexit = staticmethod(closes_inner_stream("stream", is_async=True))

    def __init__(self, manager: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self._manager = manager
        self._describe = functools.partial(streamed(_request), instance, args, kwargs)
        self.stream: Any = None  # our proxy of the events, once entered

    def _deliver(self, response: Any, model_call: ModelCall) -> Any:
        self.stream = proxy_stream(response.data, model_call, _Events())
        response._data = self.stream
        return response

    def __enter__(self) -> Any:
        return sync_call(self._describe, self._deliver)(lambda: self._manager.__enter__(), None, (), {})

    def __exit__(self, *exc_info: object) -> Any:
        return self._exit(self._manager.__exit__, self, exc_info, {})

    async def __aenter__(self) -> Any:
        return await async_call(self._describe, self._deliver)(lambda: self._manager.__aenter__(), None, (), {})

    async def __aexit__(self, *exc_info: object) -> Any:
        return await self._aexit(self._manager.__aexit__, self, exc_info, {})


def _chat_stream(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return _StreamManager(wrapped(*args, **kwargs), instance, args, kwargs)


# -- patching ---------------------------------------------------------------------------


def patch() -> list[Patch]:
    from cohere.v2 import raw_client

    patches = [
        wrap(raw_client.RawV2Client, "chat", sync_call(_request, _deliver)),
        wrap(raw_client.RawV2Client, "chat_stream", _chat_stream),
        wrap(raw_client.AsyncRawV2Client, "chat", async_call(_request, _deliver)),
        wrap(raw_client.AsyncRawV2Client, "chat_stream", _chat_stream),
    ]
    return [p for p in patches if p is not None]
