"""The fake model server's script vocabulary, shared by every wire (tests/fakes/wires/): a
provider-neutral :class:`Reply` (text, tool calls, stop reason, usage, faults), its :class:`ToolCall`
and :class:`Usage`, and the :class:`Script` of replies queued for matching requests. Each wire renders
a Reply in its provider's format; the stop-reason table below says which provider values a Reply
accepts and what each means, so a script written for one provider can be served by any."""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from .model_server import RecordedRequest

__all__ = ["CANONICAL_STOP", "DEFAULT_TEXT", "FailMode", "Matcher", "Reply", "Script", "ToolCall", "Usage",
           "canonical_stop"]

DEFAULT_TEXT = "This is a fake reply."

# --------------------------------------------------------------------------------------------------------------------
# Stop reasons
# --------------------------------------------------------------------------------------------------------------------

CANONICAL_STOP = {
    # the neutral four, and OpenAI's and Anthropic's own
    "stop": "stop", "end_turn": "stop", "stop_sequence": "stop", "pause_turn": "stop", "completed": "stop",
    "tool_calls": "tool_calls", "tool_use": "tool_calls", "function_call": "tool_calls",
    "length": "length", "max_tokens": "length", "max_output_tokens": "length", "incomplete": "length",
    "model_context_window_exceeded": "length",
    "content_filter": "content_filter", "refusal": "content_filter",
    # Gemini's finishReason (a call with function calls ends STOP too)
    "STOP": "stop", "MAX_TOKENS": "length", "SAFETY": "content_filter", "RECITATION": "content_filter",
    "BLOCKLIST": "content_filter", "PROHIBITED_CONTENT": "content_filter", "SPII": "content_filter",
    "IMAGE_SAFETY": "content_filter", "LANGUAGE": "stop", "OTHER": "stop", "MALFORMED_FUNCTION_CALL": "stop",
    "UNEXPECTED_TOOL_CALL": "stop",
    # Cohere v2's finish_reason
    "COMPLETE": "stop", "STOP_SEQUENCE": "stop", "TOOL_CALL": "tool_calls", "ERROR": "stop", "TIMEOUT": "stop",
    # Bedrock Converse's stopReason (beside Anthropic's values, which it shares)
    "guardrail_intervened": "content_filter", "content_filtered": "content_filter",
    # Mistral's finish_reason
    "model_length": "length", "error": "stop",
}
"""Every stop reason a :class:`Reply` accepts, to the neutral one it means (``stop``, ``tool_calls``,
``length``, ``content_filter``). A wire sends a value as it is when it is its API's own, else the
neutral value translated into its API's vocabulary (:func:`canonical_stop`)."""


def canonical_stop(reply: Reply) -> tuple[str, str]:
    """``(the reply's stop reason as given or derived, its neutral meaning)``: ``tool_calls`` when the reply has
    tool calls and no stop was given, else ``stop``."""
    stop = reply.stop or ("tool_calls" if reply.calls else "stop")
    canonical = CANONICAL_STOP.get(stop)
    if canonical is None:
        raise ValueError(f"unknown stop reason {stop!r}")
    return stop, canonical


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
    - Gemini: ``promptTokenCount``, ``candidatesTokenCount`` (= output_tokens, thoughts apart),
      ``thoughtsTokenCount`` (= reasoning_tokens), ``cachedContentTokenCount``, ``totalTokenCount`` (all three).
    - Ollama: ``prompt_eval_count``, ``eval_count``. Cohere: ``tokens`` and ``billed_units`` (``input_tokens``,
      ``output_tokens``), ``cached_tokens``. Mistral: Chat's three counts, no details. Groq: Chat's, with its
      timings. Bedrock: ``inputTokens``, ``outputTokens``, ``totalTokens``, ``cacheReadInputTokens``,
      ``cacheWriteInputTokens``.
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
    - ``cut_body=N``: a JSON answer's connection drops after N bytes of its body (the headers promised it whole).
    - ``delay``: seconds before the response starts (``hold``: until an event is set); ``chunk_delay``: seconds before each SSE frame;
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
    # a JSON answer whose connection drops after this many bytes of its body (its Content-Length says the whole)
    cut_body: int | None = None

    delay: float = 0.0
    # the response waits for this event (set by the test: e.g. once N requests have arrived, which proves they are
    # served at once) instead of for a time; a server stopping, or 60 s without it, drops the connection
    hold: threading.Event | None = None
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
        if self.stop is not None and self.stop not in CANONICAL_STOP:
            raise ValueError(f"unknown stop reason {self.stop!r}; known: {sorted(CANONICAL_STOP)}")
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


