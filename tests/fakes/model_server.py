"""A scripted fake model server that speaks the OpenAI and Anthropic wire formats (standard library only).

Endpoints, all ``POST``, JSON or ``stream: true`` Server-Sent Events:

- ``/v1/chat/completions``  OpenAI Chat Completions (``openai_base_url`` = ``http://127.0.0.1:PORT/v1``)
- ``/v1/responses``         OpenAI Responses
- ``/v1/messages``          Anthropic Messages (``anthropic_base_url`` = ``http://127.0.0.1:PORT``, no ``/v1``)
- ``/v1/messages/count_tokens`` answers ``{"input_tokens": N}`` without consuming a reply

A :class:`Reply` is provider-neutral (text, tool calls, stop reason, usage, faults); the server renders it in the
format of whichever endpoint was called, so one script drives any of the three APIs::

    server.queue(
        Reply(tool_calls=[ToolCall("get_weather", {"city": "Paris"})], usage=Usage(100, 20, cached_tokens=30)),
        Reply(text="21 °C, dry."),
        match="[conv-7]",          # substring of the first user message; omit for the global queue
    )

Which reply serves a request: the first script whose ``match`` fits the request and still has replies; if a script
matched but all matching ones are used up, the default reply; if none matched, the global queue (``match=None``),
then the default reply (``server.default_reply``: a fixed text, no tool calls).

Every request is recorded (``server.requests``) with its path, headers, parsed JSON body and the reply it got.

Streams use HTTP/1.1 chunked transfer encoding with one SSE frame per chunk, ended by the zero-length chunk, so
connections are kept alive and a deliberately aborted stream (``fail_mode="abort"``) is seen by the client as an
incomplete body rather than a clean end.
"""

from __future__ import annotations

import itertools
import json
import re
import socket
import socketserver
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

from typing_extensions import Self

__all__ = ["FakeModelServer", "RecordedRequest", "Reply", "Script", "ToolCall", "Usage"]

CHAT = "chat"
RESPONSES = "responses"
MESSAGES = "messages"
COUNT_TOKENS = "count_tokens"

DEFAULT_TEXT = "This is a fake reply."

STANDS_FOR = {"providers": {"127.0.0.1": "sdk"}}
"""``configure(prices=...)`` for a store whose calls go to this server: it stands for the
provider of the SDK that calls it (OpenAI for the openai SDK, Anthropic for anthropic), so
that its calls are recorded and priced as theirs. Without it, 127.0.0.1 is an unknown server
(recorded as the SDK's provider, not priced), as any local server is."""

# --------------------------------------------------------------------------------------------------------------------
# Script vocabulary
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class ToolCall:
    """One tool call the fake model makes. ``arguments`` is a dict (sent as JSON) or a raw JSON string."""

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)
    id: str | None = None  # generated per provider (call_..., toolu_...) when None; "" is sent as "" (Gemini's endpoint)
    omit_id: bool = False  # Chat Completions: the call has no "id" key at all (some OpenAI-compatible servers)

    @property
    def arguments_json(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, ensure_ascii=False)

    @property
    def arguments_dict(self) -> dict[str, Any]:
        """The arguments as a dict (Anthropic ``input``); a string that is not a JSON object gives ``{}``."""
        if isinstance(self.arguments, str):
            try:
                value = json.loads(self.arguments)
            except ValueError:
                return {}
            return value if isinstance(value, dict) else {}
        return dict(self.arguments)


_USAGE_ALIASES = {
    "prompt_tokens": "input_tokens",
    "completion_tokens": "output_tokens",
    "cache_read_input_tokens": "cached_tokens",
    "cache_creation_input_tokens": "cache_creation_tokens",
    "cache_write_tokens": "cache_creation_tokens",
}


@dataclass
class Usage:
    """Token counts, copied verbatim into each provider's usage object (no provider arithmetic is applied).

    - Chat Completions: ``prompt_tokens``, ``completion_tokens``, ``total_tokens`` (= input + output),
      ``prompt_tokens_details.cached_tokens`` / ``.cache_write_tokens``,
      ``completion_tokens_details.reasoning_tokens``.
    - Responses: ``input_tokens``, ``output_tokens``, ``total_tokens``, ``input_tokens_details.cached_tokens`` /
      ``.cache_write_tokens``, ``output_tokens_details.reasoning_tokens``.
    - Anthropic: ``input_tokens``, ``output_tokens``, ``cache_read_input_tokens`` (= cached_tokens),
      ``cache_creation_input_tokens`` (= cache_creation_tokens).
    """

    input_tokens: int = 12
    output_tokens: int = 7
    cached_tokens: int = 0
    cache_creation_tokens: int = 0
    reasoning_tokens: int = 0

    @classmethod
    def of(cls, value: Usage | Mapping[str, int] | None) -> Usage:
        if value is None:
            return cls()
        if isinstance(value, Usage):
            return value
        return cls(**{_USAGE_ALIASES.get(k, k): v for k, v in value.items()})


FailMode = Literal["error", "abort"]


@dataclass
class Reply:
    """One model response (or one fault), rendered in the format of the endpoint that is called.

    ``stop``: ``None`` derives it (``tool_calls`` when there are tool calls, else ``stop``). Neutral values are
    ``stop``, ``tool_calls``, ``length``, ``content_filter``; provider values are accepted too and passed through when
    native to the API called, else translated (``end_turn``->``stop``, ``tool_use``->``tool_calls``,
    ``max_tokens``/``max_output_tokens``->``length``, ``refusal``->``content_filter``, ...). For the Responses API
    ``length``/``content_filter`` give ``status: "incomplete"`` with ``incomplete_details.reason``.

    Faults:

    - ``status`` >= 400: an HTTP error with the provider's error body (see :meth:`error`);
    - ``fail_after=N``: a stream stops after N SSE frames, with the provider's in-stream error event
      (``fail_mode="error"``) or by dropping the connection mid-body (``fail_mode="abort"``). For a non-streaming
      request, ``"error"`` becomes an HTTP 500 and ``"abort"`` closes the connection without a response.
    - ``delay``: seconds before the response starts; ``chunk_delay``: seconds before each SSE frame;
      ``pauses``: further seconds before given frames (``{3: 0.4}``: frame 3, the first being 0), for uneven pacing.
    """

    text: str | None = None
    tool_calls: Sequence[ToolCall | tuple[Any, ...] | Mapping[str, Any]] = ()
    stop: str | None = None
    usage: Usage | Mapping[str, int] | None = None
    # fields added to the provider's usage object as they are (a provider's own: DeepSeek's
    # prompt_cache_hit_tokens, OpenRouter's cost, Anthropic's server_tool_use); Anthropic
    # streams them in message_delta's usage, as it does
    usage_extra: Mapping[str, Any] = field(default_factory=dict)
    model: str | None = None  # default: echo the request's model

    status: int = 200
    error_message: str | None = None
    error_type: str | None = None
    raw_body: Any = None  # str/bytes/JSON-able: sent verbatim with ``status`` instead of a rendered body
    headers: Mapping[str, str] = field(default_factory=dict)

    fail_after: int | None = None
    fail_mode: FailMode = "error"

    delay: float = 0.0
    chunk_delay: float | None = None  # None: the server's default
    pauses: Mapping[int, float] = field(default_factory=dict)  # frame index -> extra seconds before it
    chunk_size: int | None = None  # characters per text/argument delta; None: words for text, 12 for arguments

    # the model refuses: Chat ``message.refusal`` (content null), Responses a refusal part; Anthropic (with
    # ``stop="refusal"``): ``stop_details`` {"type": "refusal", "category", "explanation": refusal} on the message
    # and on the stream's message_delta
    refusal: str | None = None
    refusal_category: str | None = None  # Anthropic's ``stop_details.category`` (``cyber``, ``bio``, ...)
    choices: Sequence[Reply] = ()  # Chat Completions only: the answers after the first (``n > 1``), as indices 1..
    error_in_body: bool = False  # an HTTP 200 whose body is the provider's error JSON (some gateways answer so)
    # Chat Completions streams: every tool-call fragment repeats the call's id, type and function name, as
    # OpenRouter's gateway sends them (OpenAI sends them in the first fragment only)
    repeat_call_fields: bool = False

    def __post_init__(self) -> None:
        self.tool_calls = [_as_tool_call(tc) for tc in self.tool_calls]
        if self.stop is not None and self.stop not in _CANONICAL_STOP:
            raise ValueError(f"unknown stop reason {self.stop!r}; known: {sorted(_CANONICAL_STOP)}")
        if self.fail_mode not in ("error", "abort"):
            raise ValueError(f"fail_mode must be 'error' or 'abort', not {self.fail_mode!r}")

    @classmethod
    def error(
        cls,
        status: int = 500,
        message: str | None = None,
        *,
        type: str | None = None,  # the provider's error type
        retry_after: float | None = None,
        delay: float = 0.0,
    ) -> Reply:
        """An HTTP error with the provider's error JSON (OpenAI ``{"error": {...}}``, Anthropic ``{"type": "error",
        "error": {...}}``); ``retry_after`` adds a ``retry-after`` header."""
        headers = {"retry-after": str(retry_after)} if retry_after is not None else {}
        return cls(status=status, error_message=message, error_type=type, headers=headers, delay=delay)

    @classmethod
    def stream_failure(
        cls,
        after: int = 3,
        mode: FailMode = "error",
        *,
        text: str = "This reply is cut short by a failure in the middle of the stream",
        message: str | None = None,
        tool_calls: Sequence[ToolCall | tuple[Any, ...] | Mapping[str, Any]] = (),
    ) -> Reply:
        """A streamed reply that fails after ``after`` SSE frames (see the class doc)."""
        return cls(text=text, tool_calls=tool_calls, fail_after=after, fail_mode=mode, error_message=message)

    @classmethod
    def error_200(cls, message: str | None = None, *, type: str | None = None) -> Reply:
        """An HTTP 200 whose body is the provider's error JSON, with no choices or content (a gateway's way)."""
        return cls(error_message=message, error_type=type, error_in_body=True)

    @property
    def is_error(self) -> bool:
        return self.status >= 400

    @property
    def calls(self) -> list[ToolCall]:
        return list(self.tool_calls)  # type: ignore[arg-type] - normalised in __post_init__


def _as_tool_call(value: ToolCall | tuple[Any, ...] | Mapping[str, Any]) -> ToolCall:
    if isinstance(value, ToolCall):
        return value
    if isinstance(value, tuple):
        return ToolCall(*value)
    if isinstance(value, Mapping):
        args = value.get("arguments", value.get("input", value.get("args", {})))
        return ToolCall(name=value["name"], arguments=args, id=value.get("id"))
    raise TypeError(f"not a tool call: {value!r}")


Matcher = Callable[["RecordedRequest"], bool]


class Script:
    """Replies queued for requests that ``match`` (a substring of the first user message, or a predicate)."""

    def __init__(self, match: str | Matcher | None, replies: Iterable[Reply]) -> None:
        self.match = match
        if match is None:
            self.label = "global"
        else:
            self.label = match if isinstance(match, str) else getattr(match, "__name__", repr(match))
        self.pending: deque[Reply] = deque(replies)
        self.served: list[RecordedRequest] = []

    def matches(self, request: RecordedRequest) -> bool:
        if self.match is None:
            return True
        if isinstance(self.match, str):
            return self.match in request.first_user_text
        return bool(self.match(request))

    @property
    def remaining(self) -> int:
        return len(self.pending)

    def __repr__(self) -> str:
        return f"Script(match={self.label!r}, served={len(self.served)}, remaining={self.remaining})"


# --------------------------------------------------------------------------------------------------------------------
# Recorded requests
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class RecordedRequest:
    index: int  # arrival order, from 0
    api: str  # "chat" | "responses" | "messages" | "count_tokens" | "unknown"
    method: str
    path: str  # without the query string
    query: str
    headers: dict[str, str]  # lower-cased names
    body: Any  # parsed JSON, or None
    raw_body: bytes
    script: str | None = None  # label of the script that served it; "global", "default", or None (no reply)
    reply: Reply | None = None
    status: int | None = None  # HTTP status sent (200 for streams, even ones that fail later)

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and bool(self.body.get("stream"))

    @property
    def model(self) -> str | None:
        return self.body.get("model") if isinstance(self.body, dict) else None

    @property
    def first_user_text(self) -> str:
        """The text of the first user message (Chat ``messages``, Responses ``input``, Anthropic ``messages``)."""
        if not isinstance(self.body, dict):
            return ""
        items = self.body.get("messages") if self.api != RESPONSES else self.body.get("input")
        if isinstance(items, str):
            return items
        for item in items or ():
            if isinstance(item, dict) and item.get("role") == "user":
                return _content_text(item.get("content"))
        return ""

    @property
    def tool_results(self) -> list[dict[str, Any]]:
        """Tool results sent back to the model, normalised to ``{"id": call id, "content": ...}``, in order."""
        out: list[dict[str, Any]] = []
        if not isinstance(self.body, dict):
            return out
        if self.api == CHAT:
            for m in self.body.get("messages") or ():
                if isinstance(m, dict) and m.get("role") == "tool":
                    out.append({"id": m.get("tool_call_id"), "content": m.get("content")})
        elif self.api == RESPONSES:
            items = self.body.get("input")
            for it in items if isinstance(items, list) else ():
                if isinstance(it, dict) and it.get("type") == "function_call_output":
                    out.append({"id": it.get("call_id"), "content": it.get("output")})
        elif self.api == MESSAGES:
            for m in self.body.get("messages") or ():
                content = m.get("content") if isinstance(m, dict) else None
                for block in content if isinstance(content, list) else ():
                    if isinstance(block, dict) and block.get("type") == "tool_result":
                        out.append(
                            {"id": block.get("tool_use_id"), "content": block.get("content"),
                             "is_error": bool(block.get("is_error"))}
                        )
        return out


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


# --------------------------------------------------------------------------------------------------------------------
# Stop reasons
# --------------------------------------------------------------------------------------------------------------------

_NATIVE_STOP = {
    CHAT: {"stop", "length", "tool_calls", "content_filter", "function_call"},
    MESSAGES: {"end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal",
               "model_context_window_exceeded"},
}
_CANONICAL_STOP = {
    "stop": "stop", "end_turn": "stop", "stop_sequence": "stop", "pause_turn": "stop", "completed": "stop",
    "tool_calls": "tool_calls", "tool_use": "tool_calls", "function_call": "tool_calls",
    "length": "length", "max_tokens": "length", "max_output_tokens": "length", "incomplete": "length",
    "model_context_window_exceeded": "length",
    "content_filter": "content_filter", "refusal": "content_filter",
}
_FROM_CANONICAL = {
    CHAT: {"stop": "stop", "tool_calls": "tool_calls", "length": "length", "content_filter": "content_filter"},
    MESSAGES: {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens", "content_filter": "refusal"},
}


def _stop_for(api: str, reply: Reply) -> str:
    stop = reply.stop or ("tool_calls" if reply.calls else "stop")
    if api in _NATIVE_STOP and stop in _NATIVE_STOP[api]:
        return stop
    canonical = _CANONICAL_STOP.get(stop)
    if canonical is None:
        raise ValueError(f"unknown stop reason {stop!r}")
    if api == RESPONSES:
        return canonical
    return _FROM_CANONICAL[api][canonical]


def _responses_status(reply: Reply) -> tuple[str, dict[str, str] | None]:
    stop = reply.stop or ("tool_calls" if reply.calls else "stop")
    if stop == "max_output_tokens":
        return "incomplete", {"reason": "max_output_tokens"}
    canonical = _CANONICAL_STOP.get(stop)
    if canonical == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if canonical == "content_filter":
        return "incomplete", {"reason": "content_filter"}
    if canonical is None:
        raise ValueError(f"unknown stop reason {stop!r}")
    return "completed", None


# --------------------------------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------------------------------

_WORDS = re.compile(r"\S+\s*|\s+")


def _pieces(s: str, size: int | None) -> list[str]:
    if not s:
        return []
    if size:
        return [s[i : i + size] for i in range(0, len(s), size)]
    return _WORDS.findall(s)


def _arg_pieces(s: str, size: int | None) -> list[str]:
    size = size or 12
    return [s[i : i + size] for i in range(0, len(s), size)] if s else []


Frame = tuple["str | None", Any]  # (SSE event name or None, data: JSON-able or str)

_OPENAI_ERRORS = {
    400: ("invalid_request_error", None, "Invalid request."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided."),
    403: ("invalid_request_error", "unsupported_country_region_territory", "Forbidden."),
    404: ("invalid_request_error", "model_not_found", "The model does not exist."),
    429: ("requests", "rate_limit_exceeded", "Rate limit reached for requests. Please try again later."),
    500: ("server_error", None, "The server had an error while processing your request."),
    503: ("server_error", None, "The engine is currently overloaded, please try again later."),
}
_ANTHROPIC_ERRORS = {
    400: ("invalid_request_error", "Invalid request."),
    401: ("authentication_error", "invalid x-api-key"),
    403: ("permission_error", "Forbidden."),
    404: ("not_found_error", "Not found."),
    413: ("request_too_large", "Request exceeds the maximum allowed number of bytes."),
    429: ("rate_limit_error", "Number of requests has exceeded your rate limit."),
    500: ("api_error", "Internal server error"),
    529: ("overloaded_error", "Overloaded"),
}


class _Renderer:
    """Turns a Reply into one API's JSON body or SSE frames."""

    def __init__(self, server: FakeModelServer, api: str, body: dict[str, Any], reply: Reply) -> None:
        self.server = server
        self.api = api
        self.body = body
        self.reply = reply
        self.model = reply.model or str(body.get("model") or "fake-model")
        self.usage = Usage.of(reply.usage)
        self.created = int(time.time())
        n = server._next_id()
        self.n = n
        self.call_ids = [
            tc.id if tc.id is not None else (f"toolu_fake_{n:05d}_{i}" if api == MESSAGES else f"call_fake_{n:05d}_{i}")
            for i, tc in enumerate(reply.calls)
        ]

    # ---- errors -------------------------------------------------------------------------------------------------

    def error_body(self, status: int) -> dict[str, Any]:
        r = self.reply
        if self.api == MESSAGES or (self.api == COUNT_TOKENS):
            etype, msg = _ANTHROPIC_ERRORS.get(status, ("api_error" if status >= 500 else "invalid_request_error",
                                                        f"HTTP {status}"))
            return {"type": "error", "error": {"type": r.error_type or etype, "message": r.error_message or msg},
                    "request_id": f"req_fake_{self.n:05d}"}
        etype, code, msg = _OPENAI_ERRORS.get(status, ("server_error" if status >= 500 else "invalid_request_error",
                                                      None, f"HTTP {status}"))
        return {"error": {"message": r.error_message or msg, "type": r.error_type or etype, "param": None,
                          "code": code}}

    def stream_error_frame(self, seq: int) -> Frame:
        r = self.reply
        msg = r.error_message or "The server had an error while streaming the response."
        if self.api == CHAT:
            return None, {"error": {"message": msg, "type": r.error_type or "server_error", "param": None,
                                    "code": None}}
        if self.api == RESPONSES:
            return "error", {"type": "error", "code": r.error_type or "server_error", "message": msg, "param": None,
                             "sequence_number": seq}
        return "error", {"type": "error", "error": {"type": r.error_type or "overloaded_error", "message": msg},
                         "request_id": f"req_fake_{self.n:05d}"}

    # ---- JSON -----------------------------------------------------------------------------------------------------

    def json_body(self) -> dict[str, Any]:
        return {CHAT: self._chat_json, RESPONSES: self._responses_json, MESSAGES: self._messages_json}[self.api]()

    def frames(self) -> list[Frame]:
        return {CHAT: self._chat_frames, RESPONSES: self._responses_frames, MESSAGES: self._messages_frames}[
            self.api
        ]()

    # ---- Chat Completions -----------------------------------------------------------------------------------------

    def _chat_usage(self) -> dict[str, Any]:
        u = self.usage
        return {
            "prompt_tokens": u.input_tokens,
            "completion_tokens": u.output_tokens,
            "total_tokens": u.input_tokens + u.output_tokens,
            "prompt_tokens_details": {"cached_tokens": u.cached_tokens, "cache_write_tokens": u.cache_creation_tokens,
                                      "audio_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens, "audio_tokens": 0,
                                          "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0},
            **self.reply.usage_extra,
        }

    def _chat_content(self) -> str | None:
        if self.reply.text is not None:
            return self.reply.text
        return None if self.reply.calls else ""

    def _chat_choice(self, reply: Reply, index: int, call_ids: Sequence[str]) -> dict[str, Any]:
        content = reply.text if reply.text is not None else (None if reply.calls or reply.refusal else "")
        message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": reply.refusal,
                                   "annotations": []}
        if reply.calls:
            message["tool_calls"] = [
                {**({} if tc.omit_id else {"id": cid}), "type": "function",
                 "function": {"name": tc.name, "arguments": tc.arguments_json}}
                for cid, tc in zip(call_ids, reply.calls)
            ]
        return {"index": index, "message": message, "logprobs": None, "finish_reason": _stop_for(CHAT, reply)}

    def _other_call_ids(self, index: int, reply: Reply) -> list[str]:
        return [tc.id or f"call_fake_{self.n:05d}_c{index}_{i}" for i, tc in enumerate(reply.calls)]

    def _chat_json(self) -> dict[str, Any]:
        choices = [self._chat_choice(self.reply, 0, self.call_ids)]
        choices += [self._chat_choice(c, i, self._other_call_ids(i, c)) for i, c in enumerate(self.reply.choices, 1)]
        return {
            "id": f"chatcmpl-fake{self.n:05d}",
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self._chat_usage(),
            "service_tier": "default",
            "system_fingerprint": "fp_fake",
        }

    def _chat_frames(self) -> list[Frame]:
        opts = self.body.get("stream_options") or {}
        include_usage = bool(opts.get("include_usage"))
        base: dict[str, Any] = {"id": f"chatcmpl-fake{self.n:05d}", "object": "chat.completion.chunk",
                                "created": self.created, "model": self.model, "service_tier": "default",
                                "system_fingerprint": "fp_fake"}

        def chunk(delta: dict[str, Any], finish: str | None = None, index: int = 0) -> Frame:
            data = {**base, "choices": [{"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}]}
            if include_usage:
                data["usage"] = None
            return None, data

        frames: list[Frame] = []
        for index, (r, call_ids) in enumerate(
            [(self.reply, self.call_ids)] + [(c, self._other_call_ids(i, c)) for i, c in enumerate(self.reply.choices, 1)]
        ):
            content = r.text if r.text is not None else (None if r.calls or r.refusal else "")
            frames.append(chunk({"role": "assistant", "content": "" if content is not None else None, "refusal": None},
                                index=index))
            frames += [chunk({"content": p}, index=index) for p in _pieces(r.text or "", r.chunk_size)]
            frames += [chunk({"refusal": p}, index=index) for p in _pieces(r.refusal or "", r.chunk_size)]
            for i, (cid, tc) in enumerate(zip(call_ids, r.calls)):
                frames.append(chunk({"tool_calls": [
                    {"index": i, **({} if tc.omit_id else {"id": cid}), "type": "function",
                     "function": {"name": tc.name, "arguments": ""}}]},
                    index=index))
                repeated = {"id": cid, "type": "function"} if r.repeat_call_fields else {}
                named = {"name": tc.name} if r.repeat_call_fields else {}
                frames += [chunk({"tool_calls": [{"index": i, **repeated, "function": {**named, "arguments": p}}]},
                                 index=index)
                           for p in _arg_pieces(tc.arguments_json, r.chunk_size)]
            frames.append(chunk({}, _stop_for(CHAT, r), index=index))
        if include_usage:
            frames.append((None, {**base, "choices": [], "usage": self._chat_usage()}))
        frames.append((None, "[DONE]"))
        return frames

    # ---- Responses ------------------------------------------------------------------------------------------------

    def _responses_usage(self) -> dict[str, Any]:
        u = self.usage
        return {
            "input_tokens": u.input_tokens,
            "input_tokens_details": {"cached_tokens": u.cached_tokens, "cache_write_tokens": u.cache_creation_tokens},
            "output_tokens": u.output_tokens,
            "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
            "total_tokens": u.input_tokens + u.output_tokens,
            **self.reply.usage_extra,
        }

    def _responses_items(self) -> list[dict[str, Any]]:
        r = self.reply
        items: list[dict[str, Any]] = []
        if r.refusal is not None:
            items.append({"id": f"msg_fake_{self.n:05d}", "type": "message", "status": "completed",
                          "role": "assistant", "content": [{"type": "refusal", "refusal": r.refusal}]})
        elif r.text or not r.calls:
            items.append({"id": f"msg_fake_{self.n:05d}", "type": "message", "status": "completed",
                          "role": "assistant",
                          "content": [{"type": "output_text", "text": r.text or "", "annotations": [],
                                       "logprobs": []}]})
        for i, (cid, tc) in enumerate(zip(self.call_ids, r.calls)):
            items.append({"id": f"fc_fake_{self.n:05d}_{i}", "type": "function_call", "status": "completed",
                          "call_id": cid, "name": tc.name, "arguments": tc.arguments_json})
        return items

    def _response_obj(self, status: str, output: list[dict[str, Any]], *, final: bool) -> dict[str, Any]:
        b = self.body
        incomplete = _responses_status(self.reply)[1] if final else None
        return {
            "id": f"resp_fake_{self.n:05d}",
            "object": "response",
            "created_at": self.created,
            "status": status,
            "background": False,
            "completed_at": int(time.time()) if final and status == "completed" else None,
            "error": None,
            "incomplete_details": incomplete,
            "instructions": b.get("instructions"),
            "max_output_tokens": b.get("max_output_tokens"),
            "max_tool_calls": b.get("max_tool_calls"),
            "model": self.model,
            "output": output,
            "parallel_tool_calls": b.get("parallel_tool_calls", True),
            "previous_response_id": b.get("previous_response_id"),
            "reasoning": {"effort": None, "summary": None},
            "service_tier": "default",
            "store": b.get("store", True),
            "temperature": b.get("temperature", 1.0),
            "text": b.get("text") or {"format": {"type": "text"}, "verbosity": "medium"},
            "tool_choice": b.get("tool_choice", "auto"),
            "tools": b.get("tools") or [],
            "top_p": b.get("top_p", 1.0),
            "truncation": b.get("truncation", "disabled"),
            "usage": self._responses_usage() if final else None,
            "user": None,
            "metadata": b.get("metadata") or {},
        }

    def _responses_json(self) -> dict[str, Any]:
        status, _ = _responses_status(self.reply)
        return self._response_obj(status, self._responses_items(), final=True)

    def _responses_frames(self) -> list[Frame]:
        r = self.reply
        frames: list[Frame] = []
        seq = itertools.count()

        def ev(kind: str, **data: Any) -> None:
            frames.append((kind, {"type": kind, "sequence_number": next(seq), **data}))

        ev("response.created", response=self._response_obj("in_progress", [], final=False))
        ev("response.in_progress", response=self._response_obj("in_progress", [], final=False))
        items = self._responses_items()
        for idx, item in enumerate(items):
            if item["type"] == "message" and item["content"][0]["type"] == "refusal":
                refusal = item["content"][0]["refusal"]
                ev("response.output_item.added", output_index=idx,
                   item={**item, "status": "in_progress", "content": []})
                part = {"type": "refusal", "refusal": ""}
                ev("response.content_part.added", item_id=item["id"], output_index=idx, content_index=0, part=part)
                for p in _pieces(refusal, r.chunk_size):
                    ev("response.refusal.delta", item_id=item["id"], output_index=idx, content_index=0, delta=p)
                ev("response.refusal.done", item_id=item["id"], output_index=idx, content_index=0, refusal=refusal)
                ev("response.content_part.done", item_id=item["id"], output_index=idx, content_index=0,
                   part={**part, "refusal": refusal})
            elif item["type"] == "message":
                text = item["content"][0]["text"]
                ev("response.output_item.added", output_index=idx,
                   item={**item, "status": "in_progress", "content": []})
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                ev("response.content_part.added", item_id=item["id"], output_index=idx, content_index=0, part=part)
                for p in _pieces(text, r.chunk_size):
                    ev("response.output_text.delta", item_id=item["id"], output_index=idx, content_index=0, delta=p,
                       logprobs=[])
                ev("response.output_text.done", item_id=item["id"], output_index=idx, content_index=0, text=text,
                   logprobs=[])
                ev("response.content_part.done", item_id=item["id"], output_index=idx, content_index=0,
                   part={**part, "text": text})
            else:
                ev("response.output_item.added", output_index=idx,
                   item={**item, "status": "in_progress", "arguments": ""})
                for p in _arg_pieces(item["arguments"], r.chunk_size):
                    ev("response.function_call_arguments.delta", item_id=item["id"], output_index=idx, delta=p)
                ev("response.function_call_arguments.done", item_id=item["id"], output_index=idx,
                   name=item["name"], arguments=item["arguments"])
            ev("response.output_item.done", output_index=idx, item=item)
        status, _ = _responses_status(r)
        terminal = "response.completed" if status == "completed" else "response.incomplete"
        ev(terminal, response=self._response_obj(status, items, final=True))
        return frames

    # ---- Anthropic Messages ---------------------------------------------------------------------------------------

    def _messages_usage(self, *, start: bool = False) -> dict[str, Any]:
        u = self.usage
        return {
            "input_tokens": u.input_tokens,
            "cache_creation_input_tokens": u.cache_creation_tokens,
            "cache_read_input_tokens": u.cached_tokens,
            "output_tokens": min(1, u.output_tokens) if start else u.output_tokens,
            "service_tier": "standard",
            **({} if start else self.reply.usage_extra),
        }

    def _messages_blocks(self) -> list[dict[str, Any]]:
        r = self.reply
        blocks: list[dict[str, Any]] = []
        if r.text:
            blocks.append({"type": "text", "text": r.text})
        for cid, tc in zip(self.call_ids, r.calls):
            blocks.append({"type": "tool_use", "id": cid, "name": tc.name, "input": tc.arguments_dict})
        return blocks

    def _stop_details(self) -> dict[str, Any] | None:
        """Anthropic's ``stop_details`` of a refusal with an explanation (``Reply.refusal``), else None."""
        r = self.reply
        if r.refusal is None or _stop_for(MESSAGES, r) != "refusal":
            return None
        return {"type": "refusal", "category": r.refusal_category, "explanation": r.refusal}

    def _message_obj(self, content: list[dict[str, Any]], *, final: bool) -> dict[str, Any]:
        message = {
            "id": f"msg_fake_{self.n:05d}",
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": _stop_for(MESSAGES, self.reply) if final else None,
            "stop_sequence": None,
            "usage": self._messages_usage(start=not final),
        }
        details = self._stop_details() if final else None
        if details is not None:
            message["stop_details"] = details
        return message

    def _messages_json(self) -> dict[str, Any]:
        return self._message_obj(self._messages_blocks(), final=True)

    def _messages_frames(self) -> list[Frame]:
        r = self.reply
        start = {"type": "message_start", "message": self._message_obj([], final=False)}
        frames: list[Frame] = [("message_start", start), ("ping", {"type": "ping"})]
        for idx, block in enumerate(self._messages_blocks()):
            if block["type"] == "text":
                frames.append(("content_block_start", {"type": "content_block_start", "index": idx,
                                                       "content_block": {"type": "text", "text": ""}}))
                frames += [("content_block_delta", {"type": "content_block_delta", "index": idx,
                                                    "delta": {"type": "text_delta", "text": p}})
                           for p in _pieces(block["text"], r.chunk_size)]
            else:
                tc = r.calls[idx - (1 if r.text else 0)]
                frames.append(("content_block_start", {"type": "content_block_start", "index": idx,
                                                       "content_block": {**block, "input": {}}}))
                # like the real API: an empty partial_json first, then fragments of the JSON text
                args = tc.arguments_json
                frames += [("content_block_delta", {"type": "content_block_delta", "index": idx,
                                                    "delta": {"type": "input_json_delta", "partial_json": p}})
                           for p in ["", *_arg_pieces(args, r.chunk_size)]]
            frames.append(("content_block_stop", {"type": "content_block_stop", "index": idx}))
        usage = self._messages_usage()
        usage.pop("service_tier")
        delta: dict[str, Any] = {"stop_reason": _stop_for(MESSAGES, r), "stop_sequence": None}
        details = self._stop_details()
        if details is not None:
            delta["stop_details"] = details
        frames.append(("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}))
        frames.append(("message_stop", {"type": "message_stop"}))
        return frames


# --------------------------------------------------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------------------------------------------------

_ROUTES = {
    "/v1/chat/completions": CHAT,
    "/v1/responses": RESPONSES,
    "/v1/messages": MESSAGES,
    "/v1/messages/count_tokens": COUNT_TOKENS,
}


class _Abort(Exception):
    """Drop the connection without finishing the response."""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive; every response has a Content-Length or is chunked
    server_version = "FakeModelServer/1.0"
    sys_version = ""
    timeout = 60  # idle keep-alive connections are dropped after this
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.owner._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.owner._track(self.connection, add=False)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # ---- plumbing -------------------------------------------------------------------------------------------------

    def _send_bytes(self, status: int, payload: bytes, content_type: str, headers: Mapping[str, str]) -> None:
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(payload)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(payload)

    def _send_json(self, status: int, data: Any, headers: Mapping[str, str]) -> None:
        self._send_bytes(status, json.dumps(data).encode(), "application/json", headers)

    def do_GET(self) -> None:
        self._read_body()
        self._not_found(self.path.partition("?")[0])

    def _not_found(self, path: str) -> None:
        body = {"error": {"message": f"Unknown request URL: {self.command} {path}", "type": "invalid_request_error",
                          "param": None, "code": "unknown_url"}}
        self._send_json(404, body, {})

    def _read_body(self) -> bytes:
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length else b""

    # ---- requests -------------------------------------------------------------------------------------------------

    def do_POST(self) -> None:
        owner = self.server.owner
        path, _, query = self.path.partition("?")
        api = _ROUTES.get(path.rstrip("/"), "unknown")
        if api == "unknown" and path.startswith("/openai/deployments/") and path.endswith("/chat/completions"):
            api = CHAT  # Azure OpenAI's deployment path: Chat Completions
        raw = self._read_body()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        req = owner._record(api, self.command, path, query, {k.lower(): v for k, v in self.headers.items()}, body, raw)
        if api == "unknown":
            req.status = 404
            self._not_found(path)
            return
        if not isinstance(body, dict):
            req.status = 400
            self._send_json(400, _Renderer(owner, api, {}, Reply()).error_body(400), {})
            return
        if api == COUNT_TOKENS:
            req.status = 200
            self._send_json(200, {"input_tokens": max(1, len(raw) // 4)}, {})
            return

        try:
            reply, label = owner._next_reply(req)
            req.reply, req.script = reply, label
            r = _Renderer(owner, api, body, reply)
            plain = not reply.is_error and reply.raw_body is None and not reply.error_in_body
            frames = r.frames() if req.stream and plain else []
            payload = r.json_body() if not req.stream and plain else None
        except Exception as exc:  # a bad script or a bug in the fake: say so instead of hanging up
            owner.errors.append(exc)
            req.status = 500
            self._send_json(500, {"error": {"message": f"fake model server failed: {exc!r}", "type": "fake_error",
                                            "param": None, "code": None}}, {})
            return
        request_id = f"req_fake_{r.n:05d}"
        id_headers = {"request-id": request_id} if api == MESSAGES else {"x-request-id": request_id}
        headers = {**id_headers, **reply.headers}
        try:
            if reply.delay and owner._sleep(reply.delay):
                raise _Abort
            if reply.raw_body is not None:
                req.status = reply.status
                rb = reply.raw_body
                if isinstance(rb, (bytes, str)):
                    payload = rb.encode() if isinstance(rb, str) else rb
                    self._send_bytes(reply.status, payload, "application/json", headers)
                else:
                    self._send_json(reply.status, rb, headers)
            elif reply.is_error:
                req.status = reply.status
                self._send_json(reply.status, r.error_body(reply.status), headers)
            elif reply.error_in_body:  # a 200 with the error JSON, streamed or not: no SSE, just the body
                req.status = 200
                self._send_json(200, r.error_body(500), headers)
            elif req.stream:
                req.status = 200
                self._stream(r, frames, headers)
            elif reply.fail_after is not None:
                if reply.fail_mode == "abort":
                    raise _Abort
                req.status = 500
                self._send_json(500, r.error_body(500), headers)
            else:
                req.status = 200
                self._send_json(200, payload, headers)
        except _Abort:
            self._drop()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _drop(self) -> None:
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _stream(self, r: _Renderer, frames: list[Frame], headers: Mapping[str, str]) -> None:
        owner = self.server.owner
        reply = r.reply
        self.send_response(200)
        self.send_header("content-type", "text/event-stream; charset=utf-8")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        delay = owner.chunk_delay if reply.chunk_delay is None else reply.chunk_delay
        last = len(frames) - 1
        for i, (event, data) in enumerate(frames):
            if reply.fail_after is not None and i >= reply.fail_after:
                if reply.fail_mode == "abort":
                    raise _Abort
                self._write_chunk(_sse(*r.stream_error_frame(i)), end=True)
                return
            wait = delay + reply.pauses.get(i, 0.0)
            if wait and owner._sleep(wait):
                raise _Abort
            # the last frame goes out in one write with the terminating chunk, so a client that stops reading at
            # `data: [DONE]` (the sync openai Stream) still sees a complete body and can reuse the connection
            self._write_chunk(_sse(event, data), end=i == last)
        if not frames:
            self.wfile.write(b"0\r\n\r\n")

    def _write_chunk(self, data: bytes, *, end: bool = False) -> None:
        self.wfile.write(b"%x\r\n%s\r\n%s" % (len(data), data, b"0\r\n\r\n" if end else b""))


def _sse(event: str | None, data: Any) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024  # listen backlog: many clients connect at once in concurrency tests
    owner: FakeModelServer

    def server_bind(self) -> None:
        # HTTPServer.server_bind calls socket.getfqdn(), a reverse DNS lookup that can stall without a network.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client hanging up mid-response is expected (aborted streams, early-closed iterators): stay quiet;
        # anything else is a bug in the fake, kept for the fixture to report
        exc = sys.exc_info()[1]
        if exc is not None and not isinstance(exc, OSError):
            self.owner.errors.append(exc)


# --------------------------------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------------------------------


class FakeModelServer:
    """A scripted OpenAI/Anthropic-compatible HTTP server on 127.0.0.1, run in a background thread.

    Use as a context manager (or ``start()``/``stop()``). See the module doc for the reply-selection rules.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        default_reply: Reply | None = None,
        chunk_delay: float = 0.0,
    ) -> None:
        self.host = host
        self._port = port
        self._initial = (default_reply or Reply(text=DEFAULT_TEXT), chunk_delay)
        self.default_reply, self.chunk_delay = self._initial
        self._lock = threading.RLock()  # a match predicate may call back into the server
        self._changed = threading.Condition(self._lock)
        self._scripts: list[Script] = []
        self._global = Script(None, ())
        self._requests: list[RecordedRequest] = []
        self._ids = itertools.count(1)
        self._conns: set[socket.socket] = set()
        self.connections_accepted = 0  # TCP connections served so far (keep-alive reuse shows as fewer)
        self.errors: list[BaseException] = []  # exceptions raised inside the fake itself (bugs, bad scripts)
        self._stopping = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle ------------------------------------------------------------------------------------------------

    def start(self) -> FakeModelServer:
        if self._httpd is not None:
            return self
        self._stopping.clear()
        httpd = _HTTPServer((self.host, self._port), _Handler)
        httpd.owner = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-model-server", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._stopping.set()
        httpd.shutdown()
        with self._lock:
            conns = list(self._conns)
        for c in conns:  # wake handler threads blocked on idle keep-alive connections
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("server is not running")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def openai_base_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def anthropic_base_url(self) -> str:
        return self.url

    # ---- scripting ------------------------------------------------------------------------------------------------

    def queue(self, *replies: Reply, match: str | Matcher | None = None) -> Script:
        """Append replies for requests that ``match`` (substring of the first user message, or a predicate on the
        :class:`RecordedRequest`); ``match=None`` appends to the global queue. Returns the script (``.remaining``,
        ``.served``). Queuing again with an equal string ``match`` appends to the same script."""
        for r in replies:
            if not isinstance(r, Reply):
                raise TypeError(f"queue() takes Reply objects, not {type(r).__name__}")
        with self._lock:
            if match is None:
                self._global.pending.extend(replies)
                return self._global
            for s in self._scripts:
                if isinstance(match, str) and s.match == match:
                    s.pending.extend(replies)
                    return s
            script = Script(match, replies)
            self._scripts.append(script)
            return script

    @property
    def scripts(self) -> list[Script]:
        with self._lock:
            return [*self._scripts, self._global]

    def pending(self) -> dict[str, int]:
        """Replies not served yet, by script label ("global" for the global queue); empty when all were served."""
        with self._lock:
            out = {s.label: s.remaining for s in self._scripts if s.remaining}
            if self._global.remaining:
                out["global"] = self._global.remaining
            return out

    def assert_all_served(self) -> None:
        left = self.pending()
        if left:
            raise AssertionError(f"scripted replies never requested: {left}")

    def reset(self) -> None:
        """Forget scripts, recorded requests and errors; restore the constructor's default reply and chunk delay."""
        with self._lock:
            self._scripts.clear()
            self._global = Script(None, ())
            self._requests.clear()
        self.default_reply, self.chunk_delay = self._initial
        self.errors.clear()

    # ---- recorded requests ----------------------------------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def requests_for(self, match: str | None = None, *, api: str | None = None) -> list[RecordedRequest]:
        """Recorded requests whose first user message contains ``match`` and/or whose ``api`` is given."""
        return [
            r for r in self.requests
            if (match is None or match in r.first_user_text) and (api is None or r.api == api)
        ]

    def wait_for_requests(self, n: int, timeout: float = 5.0) -> list[RecordedRequest]:
        """Block until at least ``n`` requests have arrived (raises TimeoutError)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self._requests) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{len(self._requests)} requests arrived, expected {n}")
                self._changed.wait(left)
            return list(self._requests)

    # ---- SDK clients (imported lazily: this module itself needs only the standard library) ------------------------

    def openai_client(self, **kwargs: Any) -> Any:
        from openai import OpenAI

        return OpenAI(**{"base_url": self.openai_base_url, "api_key": "test-key", "max_retries": 0, **kwargs})

    def async_openai_client(self, **kwargs: Any) -> Any:
        from openai import AsyncOpenAI

        return AsyncOpenAI(**{"base_url": self.openai_base_url, "api_key": "test-key", "max_retries": 0, **kwargs})

    def anthropic_client(self, **kwargs: Any) -> Any:
        from anthropic import Anthropic

        return Anthropic(**{"base_url": self.anthropic_base_url, "api_key": "test-key", "max_retries": 0, **kwargs})

    def async_anthropic_client(self, **kwargs: Any) -> Any:
        from anthropic import AsyncAnthropic

        return AsyncAnthropic(
            **{"base_url": self.anthropic_base_url, "api_key": "test-key", "max_retries": 0, **kwargs}
        )

    # ---- internals used by the handler ----------------------------------------------------------------------------

    def _next_id(self) -> int:
        return next(self._ids)

    def _sleep(self, seconds: float) -> bool:
        """Sleep; True when the server is stopping (the handler should give up)."""
        return self._stopping.wait(seconds)

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self.connections_accepted += 1
                self._conns.add(conn)
            else:
                self._conns.discard(conn)

    def _record(self, api: str, method: str, path: str, query: str, headers: dict[str, str], body: Any,
                raw: bytes) -> RecordedRequest:
        with self._changed:
            req = RecordedRequest(len(self._requests), api, method, path, query, headers, body, raw)
            self._requests.append(req)
            self._changed.notify_all()
            return req

    def _next_reply(self, req: RecordedRequest) -> tuple[Reply, str]:
        with self._lock:
            matched = False
            for s in self._scripts:
                if s.matches(req):
                    matched = True
                    if s.pending:
                        s.served.append(req)
                        return s.pending.popleft(), str(s.label)
            if not matched and self._global.pending:
                self._global.served.append(req)
                return self._global.pending.popleft(), "global"
            return self.default_reply, "default"
