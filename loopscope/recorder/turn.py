"""The turn model: one agent turn, its generation rounds and its tool calls, as spans.

A :class:`Turn` is an ``invoke_agent`` span; each :class:`Round` is a ``chat`` span
under it; tool executions (see :mod:`loopscope.recorder.tool`) are ``execute_tool``
spans. The turn keeps what a summary needs (segments, usage, the declared-tool union,
which requested calls ran) and writes it onto the ``invoke_agent`` span when it ends.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from random import getrandbits
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

from .. import _json
from .. import semconv as a

# The turn's and the round's start and end (and the tool list a turn reads) run on every
# recorded call: they keep a plain ``try`` and ``internal_error`` rather than ``with
# guard(...)``, because a try costs nothing until it fails while a with block makes two
# Python method calls every time (about 0.3 us a block measured, several per call: a tenth
# of a hand tool call's cost, see benchmarks/bench_tool_call.py).
from .._guard import internal_error, warn_once
from .._otel_sdk import CLIENT, end_span, start_span
from ..models import RESPONSE_SEGMENT_SEPARATOR, AIResponseEvent, DeclaredTool, LoopEndReason, ToolCall
from . import _values, settings
from .chunks import ChunkGaps
from .context import current_round, current_session, current_turn
from .declared import ToolSet, declared_json, declared_tools, definitions_json, tool_set, union_into
from .declared import declared_tools as declared_tools_of
from .finish import COMMON, OUTCOMES, Finish
from .tool import ToolExecution, record_unserved, start_requested

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from 3.11; only read by type checkers here

call_owners: dict[str, Turn] = {}
"""Every call id an adapter started and nobody has ended yet, with the turn that asked for it."""

served_owners: dict[str, Turn] = {}
"""Calls an adapter started that a decorated tool already served, until their turn ends:
the request that later carries their results still joins that turn."""

anonymous_owners: dict[Turn, list[str]] = {}
"""Turns whose last response asked for calls without an id (Gemini's OpenAI-compatible
endpoint sends ``"id": ""``, others send none), most recent last, with the keys those calls
are pending under (:func:`_anonymous_key`) in the response's order, not yet matched to a
result: a request's results without an id are matched to them by position (see
:func:`loopscope.recorder.stitch.start_model_call`)."""

_anonymous_keys = itertools.count(1)


def _anonymous_key() -> str:
    """The key a call without an id is pending under in its turn (and in :data:`call_owners`):
    never recorded (its span, rows and output message keep the id the provider sent, empty),
    and never an id a provider sends (it starts with a NUL)."""
    return f"\0{next(_anonymous_keys)}"

_OUTCOME_REASONS = {
    "refusal": LoopEndReason.REFUSAL,
    "content_filter": LoopEndReason.CONTENT_FILTER,
    "error": LoopEndReason.ERROR,  # the provider ended the answer with an error (Finish.ERROR: Cohere's ERROR)
}
"""A last call's outcome and the loop end reason it gives its turn."""

_PLAIN = frozenset({str, type(None)})  # the types an id or a name is taken as it is


def _release(var: Any, var_token: Any, context_token: Any, where: str) -> None:
    """Reset a context variable and detach an OpenTelemetry context, never raising: a
    token from another context (a generator closed elsewhere) is reported, not raised."""
    try:
        if var_token is not None:
            var.reset(var_token)
    except Exception:
        internal_error(where)
    finally:
        if context_token is not None:
            otel_context.detach(context_token)


def _offered(tools: Iterable[Any] | ToolSet | None) -> ToolSet:
    """The tools a turn offers; a tool list loopscope cannot read offers none (it is the
    user's ``loopscope.turn(...)`` call: it must not fail because of it)."""
    try:
        return tool_set(tools)
    except Exception:
        internal_error("turn tools")
        return ToolSet(())


def _new_id() -> str:
    """32 random hex digits, as ``uuid4().hex`` gives, for a tenth of its cost (ids, not
    secrets: the generator OpenTelemetry draws trace ids from, reseeded in a forked child)."""
    return f"{getrandbits(128):032x}"


def _tool_call(call: Any) -> ToolCall:
    if isinstance(call, ToolCall):
        return call
    if isinstance(call, Mapping):
        fn = call.get("function")
        if not isinstance(fn, Mapping):
            fn = call
        args = fn.get("arguments", fn.get("input", call.get("input")))
        if isinstance(args, str):
            try:
                args = _json.loads(args)
            except ValueError:
                pass  # keep the model's text as it was
        name = fn.get("name")
        return ToolCall(
            id=_call_id(call.get("id") or call.get("call_id")), name="None" if name is None else _values.text(name) or "", arguments=args
        )
    return ToolCall(
        id=_call_id(getattr(call, "id", None)),
        name=_values.text(getattr(call, "name", None)) or "",
        arguments=getattr(call, "arguments", None),
    )


def _call_id(value: Any) -> str:
    """A call's id as text; a call without one keeps none (``""``): the turn pairs it with
    its result by position (:data:`anonymous_owners`), and what is recorded is what was sent."""
    return (value if type(value) is str else _values.text(value)) or ""


def _tool_calls(calls: Iterable[Any]) -> list[ToolCall]:
    """The calls a response asked for; a value that is not a list of calls is said in the log."""
    try:
        return [_tool_call(c) for c in calls]
    except Exception:
        shown = _json.to_text(calls)[:80]
        warn_once("tool_calls", "loopscope: tool_calls=%s is not a list of tool calls; left out", shown)
        return []


class Round:
    """One generation of the model inside a turn: a ``chat`` span.

    Use it as a context manager around the model call and report what came back with
    :meth:`response`; :meth:`Turn.generation` records a finished round in one call.
    """

    # immutable defaults live on the class: a round per model call sets only what differs
    text = ""
    finish_reason: str | None = None
    finish: Finish | None = None
    """The finish reason mapped by the adapter (the outcome's source); None: read from ``finish_reason``."""
    thinking = ""
    response_id: str | None = None
    response_model: str | None = None
    blocked = False
    _span: Span | None = None
    _token: object | None = None
    _round_token: object | None = None
    _late: dict[str, Any] | None = None  # set at the start, with the span
    _first_chunk_ns: int | None = None
    _chunk_gaps: ChunkGaps | None = None  # streamed chunks' arrival times, while metrics want them
    _start_ns = 0
    eager = False  # start the requested tool calls when the round ends (adapters)
    ended = False
    # explicit span times (ns since the epoch) for a generation reported after it ran
    _start_time: int | None = None
    _end_time: int | None = None
    invalid_usage: dict[str, str] | None = None
    """Usage values reported that are not token counts, as text (left out of :attr:`usage`)."""
    refusal: str | None = None
    """The model's refusal text (a structured-output refusal)."""
    refused = False
    """The model refused (with or without a text: Anthropic's ``refusal`` stop reason)."""
    error: str | None = None
    """An error the response carried as data (an HTTP 200 whose body is an error)."""
    error_type: str | None = None
    provider_usage: str | None = None
    """The provider's own usage figures, JSON text (``usage`` is normalized)."""
    choices: tuple[Any, ...] = ()
    """The answers after the first of a call that asked for several (``n > 1``)."""
    input_messages: list[dict[str, Any]] | str | None = None
    """The request's messages in the GenAI message schema (or their JSON text)."""
    outcome: str | None = None
    """How the call ended (one of :data:`loopscope.semconv.CALL_OUTCOMES`), once it has;
    set before the end only to say ``cancelled``."""
    position = 0
    """The call's place in its turn, from 1 (set when the round starts)."""
    _arguments_json: list[str] | tuple[()] = ()
    """Each tool call's arguments as JSON text, in order, made once for the answer's output
    message (see :func:`_output_json`) and given to the call's ``execute_tool`` span."""

    def __init__(
        self,
        turn: Turn,
        model: str | None,
        provider: str | None,
        tools: Iterable[Any] | ToolSet | None,
        stream: bool | None,
        request: Mapping[str, Any] | None = None,
    ) -> None:
        self._turn = turn
        self._request = request
        if model is not None and type(model) is not str:
            model = _values.text(model)  # a name given as another value is its text
        if provider is not None and type(provider) is not str:
            provider = _values.text(provider)
        self.model = model or turn.model
        self.provider = provider or turn.provider
        self._tools = tools if tools is None or type(tools) is ToolSet else _offered(tools)
        self._stream = stream if stream is None or type(stream) is bool else _values.flag(stream)
        self.tool_calls: list[ToolCall] = []
        self.usage: dict[str, int] = {}

    def response(
        self,
        text: str | None = None,
        tool_calls: Iterable[Any] | None = None,
        usage: Mapping[str, int] | None = None,
        finish_reason: str | None = None,
        *,
        thinking: str | None = None,
        response_id: str | None = None,
        model: str | None = None,
        blocked: bool = False,
        refusal: str | bool | None = None,
        error: str | None = None,
        error_type: str | None = None,
        provider_usage: Mapping[str, Any] | None = None,
        choices: Iterable[Any] | None = None,
    ) -> None:
        """Report what the model returned in this round.

        Values of other types are recorded as text (``response_id=12345`` as ``"12345"``);
        a usage value that is not a token count (NaN, ``-1``, ``"n/a"``) is left out of the
        usage, said once in the log and kept in the span's ``loopscope.usage.invalid``.
        ``usage`` is normalized (input tokens include cached ones); ``provider_usage`` the
        provider's own figures, kept beside. ``refusal``: the model refused (its text, or
        True); ``error``: the response carried an error as data (the call's outcome is
        ``error``). ``choices``: the answers after the first (``n > 1``, each with
        ``text``, ``finish_reason``, ``tool_calls``, ``refusal``); the turn's text stays
        the first answer's. Nothing here raises.
        """
        text_of = _values.text
        if text is not None:
            self.text += text if type(text) is str else text_of(text)  # type: ignore[operator]
        if tool_calls is not None:
            self.tool_calls.extend(_tool_calls(tool_calls))
        if usage is not None:
            invalid = _values.add_usage(self.usage, usage)
            if invalid:
                self.invalid_usage = {**(self.invalid_usage or {}), **invalid}
        if finish_reason is not None:
            self.finish_reason = finish_reason if type(finish_reason) is str else text_of(finish_reason)
        if thinking is not None:
            self.thinking += thinking if type(thinking) is str else text_of(thinking)  # type: ignore[operator]
        if response_id is not None:
            self.response_id = response_id if type(response_id) is str else text_of(response_id)
        if model is not None:
            self.response_model = model if type(model) is str else text_of(model)
        if blocked is not False:
            self.blocked = self.blocked or (blocked if type(blocked) is bool else _values.flag(blocked))
        if refusal is not None and refusal is not False:
            self.refused = True
            if refusal is not True:
                self.refusal = refusal if type(refusal) is str else text_of(refusal)
        if error is not None:
            self.error = error if type(error) is str else text_of(error)
            if error_type is not None:
                self.error_type = error_type if type(error_type) is str else text_of(error_type)
        if provider_usage:
            self.provider_usage = _json.dumps(provider_usage)
        if choices:
            self.choices = tuple(choices)

    def _adapter_response(self, provider_usage: Mapping[str, Any] | str | None, /, *args: Any, **fields: Any) -> None:
        """:meth:`response` for the adapters (:class:`~loopscope.recorder.stitch.ModelCall`):
        their ``provider_usage`` may be JSON text they made, kept as it is (the public door
        encodes whatever it is given: a user's string is no checked JSON)."""
        if isinstance(provider_usage, str):
            self.response(*args, **fields)
            self.provider_usage = provider_usage
        else:
            self.response(*args, provider_usage=provider_usage, **fields)

    def add_input_messages(self, messages: list[dict[str, Any]] | str | None) -> None:
        """The request's messages (GenAI message schema), learned after the round started
        (the SDK call that fills a framework's round); the first ones given stay."""
        if messages is not None and self.input_messages is None:
            self.input_messages = messages
            if self._late is not None:
                self._late[a.INPUT_MESSAGES] = messages if type(messages) is str else _json.dumps(messages)

    def mark_streaming(self) -> None:
        """The answer comes in chunks, as learned after the round started (a framework
        that says so only with its first chunk)."""
        self._stream = True
        if self._late is not None:
            self._late[a.REQUEST_STREAM] = True

    def add_request(self, request: Mapping[str, Any]) -> None:
        """Request parameters learned after the round started (the SDK call that fills a
        framework's round knows the server and what it sent)."""
        if self._late is not None:
            self._late.update(a.request_attributes(request))

    def text_delta(self, delta: str) -> None:
        """Add a streamed chunk of text; the first one marks the time to first chunk."""
        if self._first_chunk_ns is None:
            self._first_chunk_ns = time.monotonic_ns()
        self.text += delta if type(delta) is str else (_values.text(delta) or "")

    def __enter__(self) -> Self:
        self._start()
        return self

    async def __aenter__(self) -> Self:
        self._start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._finish(exc)

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._finish(exc)

    def _start(self, attach: bool = True) -> None:
        try:
            turn = self._turn
            tools = self._tools if self._tools is not None else turn._tools
            turn._declare(tools)
            attributes: dict[str, Any] = {
                a.OPERATION: a.OP_CHAT,
                a.CONVERSATION_ID: turn.session_id,
                a.TURN_ID: turn.correlation_id,
            }
            if self.model:
                attributes[a.REQUEST_MODEL] = self.model
            if self.provider:
                attributes[a.PROVIDER] = self.provider
            # The rest is set with the round's results, in one go and in this order: a chat
            # span's start attributes are the ones sampling looks at (the store reads chat
            # spans when they end), and the SDK's cleaning of each is a good part of a call's cost.
            late: dict[str, Any] = {}
            if turn.agent:
                late[a.AGENT_NAME] = turn.agent
            if turn.framework:
                late[a.FRAMEWORK] = turn.framework
            if self._stream is not None:
                late[a.REQUEST_STREAM] = self._stream
            if tools:
                late[a.TOOL_DEFINITIONS] = tools.definitions()
            if self._request:
                late.update(a.request_attributes(self._request))
            self.position = position = late[a.CALL_POSITION] = next(turn._positions)
            messages = self.input_messages
            if messages is not None:  # C-encoded in one call, unless the adapter made the text
                late[a.INPUT_MESSAGES] = messages if type(messages) is str else _json.dumps(messages)
            else:
                # a hand round (no request seen): it was given at least the turn's input and what
                # the turn's rounds and tools said so far; an SDK call that fills the round
                # later says what it really sent (add_input_messages)
                turn._hand = True
                if position > 1 or turn.input is not None:
                    late[a.INPUT_MESSAGES] = turn._conversation()
            self._late = late
            name = f"{a.OP_CHAT} {self.model}" if self.model else a.OP_CHAT
            # one origin for the time to first chunk and the span's duration: the span's start, read
            # on both clocks at once (a start dated after a busy GIL moment would make the first
            # chunk come later than the call's whole duration)
            now_ns, wall_ns = time.monotonic_ns(), time.time_ns()
            start_time = wall_ns if self._start_time is None else self._start_time
            self._start_ns = now_ns - (wall_ns - start_time)
            # CLIENT: a call to a model service, over HTTP (the conventions' gen_ai.inference.client)
            self._span = span = start_span(turn._tracer, name, turn._context(), attributes, start_time, CLIENT)
            if attach:
                self._token = otel_context.attach(trace.set_span_in_context(span))
                self._round_token = current_round.set(self)
        except Exception:
            internal_error("round start")

    def _finish(self, exc: BaseException | None) -> None:
        try:
            span = self._span
            if span is None or self.ended:
                return
            self.ended = True
            attributes = self._late or {}  # the start attributes sampling does not need, first
            if self.response_model:
                attributes[a.RESPONSE_MODEL] = self.response_model
            if self.response_id:
                attributes[a.RESPONSE_ID] = self.response_id
            choices = self.choices
            if choices:  # one entry per choice (n > 1), in order
                attributes[a.RESPONSE_FINISH_REASONS] = (self.finish_reason or "", *(_choice_reason(c) for c in choices))
            elif self.finish_reason:
                attributes[a.RESPONSE_FINISH_REASONS] = (self.finish_reason,)
            if self.provider_usage:
                attributes[a.USAGE_PROVIDER] = self.provider_usage
            for key, value in self.usage.items():
                attr = a.USAGE_EMITTED.get(key)  # the conventions' version configure() chose
                if attr:
                    attributes[attr] = value
            if self.invalid_usage:
                attributes[a.USAGE_INVALID] = _json.dumps(self.invalid_usage)
            if self.text:
                attributes[a.ROUND_TEXT] = self.text
            if self.blocked:
                attributes[a.ROUND_BLOCKED] = True
            if choices:
                attributes[a.OUTPUT_MESSAGES] = _json.dumps([_output_message(self, exc), *(_choice_message(c) for c in choices)])
            elif self.text or self.tool_calls:
                attributes[a.OUTPUT_MESSAGES] = _output_json(self, exc)
            if self._first_chunk_ns is not None:
                attributes[a.TIME_TO_FIRST_CHUNK] = (self._first_chunk_ns - self._start_ns) / 1e9
            self.outcome = outcome = self._outcome(exc)
            attributes[a.CALL_OUTCOME] = outcome
            if self.refused:  # a refusal without a text of its own (Anthropic's) is the message's text
                refusal = self.refusal if self.refusal is not None else self.text
                if refusal:
                    attributes[a.CALL_REFUSAL] = refusal
            if exc is not None:
                attributes[a.ERROR_TYPE] = type(exc).__qualname__
                span.set_status(Status(StatusCode.ERROR, str(exc)))
            elif self.error is not None:  # an error as data: the call failed all the same
                attributes[a.ERROR_TYPE] = self.error_type or "error_response"
                attributes[a.CALL_ERROR] = self.error
                span.set_status(Status(StatusCode.ERROR, self.error))
            if self._token is not None or self._round_token is not None:  # an adapter's round attached nothing
                self._release_context()
            gaps, take = self._chunk_gaps, settings.chunk_gaps
            if gaps is not None and take is not None:  # before the end: the metrics side sees the span after
                self._chunk_gaps = None
                try:  # a plain try: the span must end whatever the metrics side does
                    take(span, gaps)
                except Exception:
                    internal_error("chunk gaps")
            end_span(span, self._end_time, attributes)  # set_attributes, then the end
            self._turn._round_done(self, exc)
        except Exception:
            internal_error("round end")
        finally:
            if self._token is not None or self._round_token is not None:
                self._release_context()  # whatever failed above, the caller's context is put back

    def _outcome(self, exc: BaseException | None) -> str:
        """How the call ended (see :data:`loopscope.semconv.CALL_OUTCOMES`)."""
        if self.outcome is not None:  # said before the end: cancelled (a stream let go)
            return self.outcome
        if exc is not None:
            return "cancelled" if isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt)) else "error"
        if self.error is not None:
            return "error"
        if self.refused:
            return "refusal"
        finish = self.finish_kind()
        return "completed" if finish is None else OUTCOMES[finish]

    def finish_kind(self) -> Finish | None:
        """Why the response ended, in the kit's vocabulary (:mod:`loopscope.recorder.finish`):
        what the adapter mapped, else the provider's reason read by the common map."""
        finish = self.finish
        return finish if finish is not None else COMMON(self.finish_reason)

    def _release_context(self) -> None:
        """Undo what :meth:`_start` attached, once (a later call does nothing)."""
        round_token, token = self._round_token, self._token
        self._round_token = self._token = None
        _release(current_round, round_token, token, "round context")


def _error_text(result: Any) -> str:
    """A short error text from a tool result the application marked as an error."""
    text = result if isinstance(result, str) else _json.dumps(result)
    return text if len(text) <= 500 else text[:500] + "…"


def _output_message(rnd: Round, exc: BaseException | None = None) -> dict[str, Any]:
    """The round's answer as a GenAI output message. ``finish_reason`` is required there
    (backends drop a message without one): the provider's, else what the round shows
    (``error``, ``tool_call``, ``stop``) for a round whose reporter gave none."""
    parts: list[dict[str, Any]] = []
    if rnd.text:
        parts.append({"type": "text", "content": rnd.text})
    for call in rnd.tool_calls:
        parts.append({"type": "tool_call", "id": call.id, "name": call.name, "arguments": call.arguments})
    reason = _finish_reason(rnd, exc)
    return {"role": "assistant", "parts": parts, "finish_reason": reason}


def _finish_reason(rnd: Round, exc: BaseException | None) -> str:
    """The provider's finish reason, else what the round shows (``error``, ``tool_call``, ``stop``)."""
    return rnd.finish_reason or (
        "error" if exc is not None or rnd.error is not None else "tool_call" if rnd.tool_calls else "stop"
    )


def _output_json(rnd: Round, exc: BaseException | None) -> str:
    """``_json.dumps([_output_message(rnd, exc)])``, assembled from its parts' JSON text
    (the same text: see :func:`loopscope._json.plain`), so that each tool call's arguments
    are encoded once, for this message and for the call's ``execute_tool`` span (kept in
    :attr:`Round._arguments_json`). A part that needs a fallback encodes the whole as before."""
    plain = _json.plain
    parts: list[str] = []
    text = rnd.text
    if text:
        encoded = plain(text)
        if encoded is None:
            return _json.dumps([_output_message(rnd, exc)])
        parts.append('{"type": "text", "content": ' + encoded + "}")
    calls = rnd.tool_calls
    if calls:
        made: list[str] = []
        for call in calls:
            arguments, call_id, name = plain(call.arguments), plain(call.id), plain(call.name)
            if arguments is None or call_id is None or name is None:
                return _json.dumps([_output_message(rnd, exc)])
            made.append(arguments)
            parts.append('{"type": "tool_call", "id": ' + call_id + ', "name": ' + name + ', "arguments": ' + arguments + "}")
        rnd._arguments_json = made
    reason = plain(_finish_reason(rnd, exc))
    if reason is None:
        return _json.dumps([_output_message(rnd, exc)])
    return '[{"role": "assistant", "parts": [' + ", ".join(parts) + '], "finish_reason": ' + reason + "}]"


def _choice_reason(choice: Any) -> str:
    reason = getattr(choice, "finish_reason", None)
    return reason if type(reason) is str else _values.text(reason) or ""


def _choice_message(choice: Any) -> dict[str, Any]:
    """A further choice (``n > 1``) as an output message, as :func:`_output_message` makes the first."""
    parts: list[dict[str, Any]] = []
    text = getattr(choice, "text", None)
    if text:
        parts.append({"type": "text", "content": text if type(text) is str else _values.text(text)})
    calls = _tool_calls(getattr(choice, "tool_calls", None) or ())
    for call in calls:
        parts.append({"type": "tool_call", "id": call.id, "name": call.name, "arguments": call.arguments})
    reason = _choice_reason(choice) or ("tool_call" if calls else "stop")
    return {"role": "assistant", "parts": parts, "finish_reason": reason}


class _Ended(NamedTuple):
    """What a turn's response is made of, kept at its end; the response model itself is
    built only when asked for (see :attr:`Turn.response`)."""

    segments: list[str]
    response_content: str
    round_count: int
    tool_calls_count: int
    usage: dict[str, int]
    thinking: str
    reason: LoopEndReason
    streaming: bool
    declared: list[DeclaredTool]
    model: str | None
    provider: str | None
    error: str | None
    timestamp: float
    latency_ms: float
    model_call_count: int


class Turn:
    """One agent turn: an ``invoke_agent`` span and the summary it ends with.

    Create it with :func:`loopscope.turn`. Inside, record each model generation with
    :meth:`round` or :meth:`generation` and run tools decorated with
    :func:`loopscope.tool`; after the block, :attr:`response` holds the turn's
    :class:`~loopscope.AIResponseEvent`.
    """

    # immutable defaults live on the class: a turn per stitched call sets only what differs
    parent: Turn | None = None
    _response: AIResponseEvent | None = None
    _result: _Ended | None = None  # what the response is made of, once the turn has ended
    _unserved_error: str | None = None  # why its unanswered calls went unserved, if not the usual
    _last_declared: ToolSet | None = None
    _union: ToolSet | None = None  # the one tool set the union is made of, while it is
    _open_segment = ""
    _round_no = 0
    _tool_calls_count = 0
    _last_round: Round | None = None
    _explicit_reason: LoopEndReason | None = None
    _facts: dict[str, Any] | None = None  # a framework's own summary values (set_summary)
    _invalid_usage: dict[str, str] | None = None  # set_summary's usage values that are not token counts
    _span: Span | None = None
    _span_context: otel_context.Context | None = None
    _token: object | None = None
    _turn_token: object | None = None
    _started = 0.0
    _first_messages: list[dict[str, Any]] | str | None = None  # the first model call's input messages
    _hand = False  # a round started without the request's messages: keep what was said (_history)
    _history: list[dict[str, Any]] | None = None
    _served_ok: dict[str, tuple[str, int | None]] | None = None
    """Requested calls a tool served that ended ``served``: id -> (tool name, the span's end in ns)."""
    ended = False

    def __init__(
        self,
        tracer: trace.Tracer,
        *,
        session_id: str | None,
        agent: str | None,
        tools: Iterable[Any] | ToolSet | None,
        input: str | None,
        input_blocked: bool,
        model: str | None,
        provider: str | None,
        framework: str | None,
        correlation_id: str | None,
        streaming: bool,
    ) -> None:
        self._tracer = tracer
        # ids and names the application gives as other values (session_id=12345) are text
        text, plain = _values.text, _PLAIN
        if type(session_id) not in plain:
            session_id = text(session_id)
        self._requested_session = session_id
        self.session_id = session_id or ""
        self.agent = agent if type(agent) in plain else text(agent)
        self._tools = tools if type(tools) is ToolSet else _offered(tools)  # an adapter's is made already
        self.input = input
        self._input_blocked = input_blocked
        self.model = model if type(model) in plain else text(model)
        self.provider = provider if type(provider) in plain else text(provider)
        self.framework = framework if type(framework) in plain else text(framework)
        self.correlation_id = (correlation_id if type(correlation_id) in plain else text(correlation_id)) or _new_id()
        self.streaming = streaming if type(streaming) is bool else _values.flag(streaming)
        self._lock = threading.Lock()
        self._declared: dict[str, DeclaredTool] = {}
        self._segments: list[str] = []
        self._usage: dict[str, int] = {}
        self._thinking: list[str] = []
        # calls the model asked for that have not ended: call id -> (call, round no.). A
        # ToolExecution is a call an adapter started when the response came (its span is
        # open); a ToolCall waits for a decorated tool to run it.
        self._pending: dict[str, tuple[ToolCall | ToolExecution, int]] = {}
        self._rounds_with_tools: dict[int, bool] = {}  # round no. -> did one of its calls run
        self.last_activity = time.monotonic()
        self._served_ids: list[str] = []
        self._positions = itertools.count(1)  # each round's place in the turn (next() is atomic)

    # -- recording API -------------------------------------------------------------------

    def round(
        self,
        model: str | None = None,
        *,
        provider: str | None = None,
        tools: Iterable[Any] | None = None,
        stream: bool | None = None,
    ) -> Round:
        """A context manager around one model generation; ``tools`` default to the turn's."""
        return Round(self, model, provider, tools, stream)

    def generation(
        self,
        text: str | None = None,
        tool_calls: Iterable[Any] | None = None,
        usage: Mapping[str, int] | None = None,
        finish_reason: str | None = None,
        *,
        model: str | None = None,
        provider: str | None = None,
        tools: Iterable[Any] | None = None,
        thinking: str | None = None,
        response_id: str | None = None,
        blocked: bool = False,
        start_time: int | None = None,
        end_time: int | None = None,
    ) -> Round:
        """Record a generation that has already returned, as one round.

        ``start_time`` and ``end_time`` (nanoseconds since the epoch, as OpenTelemetry
        counts) place the round when it really ran, for a generation learned of later.
        """
        rnd = Round(self, model, provider, tools, None)
        if start_time is not None:
            rnd._start_time = _values.time_ns(start_time, "start_time")
        if end_time is not None:
            rnd._end_time = _values.time_ns(end_time, "end_time")
        with rnd:
            rnd.response(text, tool_calls, usage, finish_reason, thinking=thinking, response_id=response_id, blocked=blocked)
        return rnd

    def declare_tools(self, tools: Iterable[Any], origin: str = "revealed") -> None:
        """Offer more tools from now on (for example revealed by a tool search)."""
        with self._lock:
            current = self._tools.tools
            names = {x.name for x in current}
            offered = declared_tools(_values.items(tools, "tools"), origin)  # a value that is no list offers none
            self._tools = ToolSet(current + tuple(t for t in offered if t.name not in names))

    def end(self, reason: LoopEndReason | str) -> None:
        """Name why the loop stopped (``max_rounds``, ``timeout``, ``budget_exceeded``...)."""
        self._explicit_reason = LoopEndReason(reason)

    def set_correlation_id(self, correlation_id: str) -> None:
        """Name the turn with the id a framework gives it, learned after the turn started.

        Rounds and tool calls recorded from now on carry it (those before keep the old one).
        """
        self.correlation_id = correlation_id = _values.text(correlation_id) or self.correlation_id
        if self._span is not None:
            self._span.set_attribute(a.TURN_ID, correlation_id)

    def set_summary(
        self,
        *,
        segments: Iterable[str] | None = None,
        tool_calls_count: int | None = None,
        round_count: int | None = None,
        usage: Mapping[str, int] | None = None,
        loop_end_reason: LoopEndReason | str | None = None,
        declared_tools: Iterable[Any] | None = None,
        thinking: str | None = None,
        streaming: bool | None = None,
    ) -> None:
        """Take a framework's own values for the turn's summary instead of computing them.

        For a framework that reports its turns itself (RoomKit's ``AIResponseEvent``): each
        value given replaces what the turn would work out from its rounds and tools, so the
        stored summary says what the framework said. ``response_content`` is the segments
        joined; ``declared_tools`` may carry each tool's ``origin``. Call before the turn ends.
        """
        facts: dict[str, Any] = dict(self._facts or {})
        if segments is not None:
            facts["segments"] = [_values.text(s) for s in _values.items(segments, "segments")]
        for name, value in (("tool_calls_count", tool_calls_count), ("round_count", round_count)):
            found = _values.count(value, name)  # a count that is not one is left out (and said)
            if found is not None:
                facts[name] = found
        if usage is not None:
            counts: dict[str, int] = {}
            self._invalid_usage = _values.add_usage(counts, usage) or None
            facts["usage"] = counts
        if declared_tools is not None:
            facts["declared"] = declared_tools_of(declared_tools)
        if thinking is not None:
            facts["thinking"] = _values.text(thinking)
        if streaming is not None:
            facts["streaming"] = _values.flag(streaming)
        self._facts = facts
        if loop_end_reason is not None:
            self.end(loop_end_reason)

    def state(self, snapshot: Any) -> None:
        """Record the session's whole state as it is now, as part of this turn (a
        ``state_snapshot`` event; see :func:`loopscope.state_snapshot`)."""
        from .state import record_state

        record_state("snapshot", snapshot, turn=self)

    def state_delta(self, operations: Iterable[Mapping[str, Any]]) -> None:
        """Record a change of the session's state as a JSON Patch, as part of this turn
        (a ``state_delta`` event; see :func:`loopscope.state_delta`)."""
        from .state import record_state

        record_state("delta", operations, turn=self)

    # -- context management --------------------------------------------------------------

    def __enter__(self) -> Self:
        self._start()
        return self

    async def __aenter__(self) -> Self:
        self._start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._finish(exc)

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._finish(exc)

    def _start(self, attach: bool = True) -> None:
        self._started = time.monotonic()
        try:
            parent = current_turn.get()
            self.parent = parent
            if not self._requested_session:
                self.session_id = current_session.get() or (parent.session_id if parent is not None else _new_id())
            attributes: dict[str, Any] = {
                a.OPERATION: a.OP_INVOKE_AGENT,
                a.CONVERSATION_ID: self.session_id,
                a.TURN_ID: self.correlation_id,
            }
            if self.agent:
                attributes[a.AGENT_NAME] = self.agent
            if self.provider:  # under loopscope.* in the current conventions, which left it off the agent span
                attributes[a.turn_provider_attribute()] = self.provider
            if self.model:
                attributes[a.REQUEST_MODEL] = self.model
            if self.framework:
                attributes[a.FRAMEWORK] = self.framework
            if parent is not None:
                attributes[a.PARENT_TURN_ID] = parent.correlation_id
            if self.input is not None:
                text = self.input
                if type(text) is not str or not text.isascii():  # plain ASCII text is its own JSON-able form
                    text = _json.to_jsonable(text) if isinstance(text, str) else _json.dumps(text)
                attributes[a.TURN_INPUT] = text
                if self._input_blocked:
                    attributes[a.TURN_INPUT_BLOCKED] = True
            name = f"{a.OP_INVOKE_AGENT} {self.agent}" if self.agent else a.OP_INVOKE_AGENT
            self._span = span = start_span(self._tracer, name, None, attributes)
            self._span_context = trace.set_span_in_context(span)
            if attach:
                self._token = otel_context.attach(self._span_context)
                self._turn_token = current_turn.set(self)
        except Exception:
            internal_error("turn start")

    def _context(self) -> otel_context.Context | None:
        """The context whose current span is this turn's: the parent of its rounds and calls."""
        return self._span_context

    def _finish(self, exc: BaseException | None) -> None:
        try:
            span = self._span
            if span is None or self.ended:
                return
            self.ended = True
            reason = self._loop_end_reason(exc)
            self._close_unserved()
            if anonymous_owners:
                anonymous_owners.pop(self, None)
            for call_id in self._served_ids:
                if served_owners.get(call_id) is self:
                    del served_owners[call_id]
            error = error_type = None
            if reason is LoopEndReason.ERROR:
                last = self._last_round
                if exc is not None:
                    error_type, error = type(exc).__qualname__, str(exc)
                elif last is not None and last.error is not None:  # the last call's response was an error
                    error_type, error = last.error_type or "error_response", last.error
            with self._lock:
                self._close_segment()
                segments = list(self._segments)
                response_content = RESPONSE_SEGMENT_SEPARATOR.join(segments)
                round_count = sum(self._rounds_with_tools.values())  # the rounds one of whose calls ran (bools)
                usage = dict(self._usage)
                thinking = "\n".join(self._thinking)
                model_call_count = self._round_no
                declared = list(self._declared.values())
                union = self._union
                tool_calls_count, streaming = self._tool_calls_count, self.streaming
                model, provider = self.model, self.provider
                facts = self._facts
                if facts:
                    segments = facts.get("segments", segments)
                    response_content = RESPONSE_SEGMENT_SEPARATOR.join(segments)
                    round_count = facts.get("round_count", round_count)
                    tool_calls_count = facts.get("tool_calls_count", tool_calls_count)
                    usage = dict(facts.get("usage", usage))
                    thinking = facts.get("thinking", thinking)
                    streaming = facts.get("streaming", streaming)
                    if "declared" in facts:
                        declared, union = facts["declared"], None
            timestamp = time.time()
            # one segment (the usual turn) is the response content too: its JSON is made once
            content_json = _json.plain(segments[0]) if len(segments) == 1 and type(segments[0]) is str else None
            summary = a.turn_attributes(
                reason.value,
                "[" + content_json + "]" if content_json is not None else _json.dumps(segments),
                round_count,
                tool_calls_count,
                streaming,
                union.declared() if union is not None else declared_json(declared) if declared else "[]",
                union.definitions() if union is not None else definitions_json(declared) if declared else None,
                response_content,
                thinking,
                model,
                provider,
                usage,
                model_call_count=model_call_count,
                input_messages_json=self._input_messages_json(),
                content_json=content_json,
            )
            if self._invalid_usage:
                summary[a.USAGE_INVALID] = _json.dumps(self._invalid_usage)
            if error is not None:
                summary[a.ERROR_TYPE] = error_type  # set after the summary, as set_attribute would
                span.set_status(Status(StatusCode.ERROR, error))
            if self._token is not None or self._turn_token is not None:  # a stitched turn attached nothing
                self._release_context()
            end_span(span, None, summary)  # set_attributes, then the end
            self._last_round = None  # the round points at its turn: no cycle left for the GC to find
            self._result = _Ended(
                segments=segments, response_content=response_content, round_count=round_count,
                tool_calls_count=tool_calls_count, usage=usage, thinking=thinking, reason=reason, streaming=streaming,
                declared=declared, model=model, provider=provider,
                error=f"{error_type}: {error}" if error is not None else None, timestamp=timestamp,
                latency_ms=(time.monotonic() - self._started) * 1000, model_call_count=model_call_count,
            )
        except Exception:
            internal_error("turn end")
        finally:
            if self._token is not None or self._turn_token is not None:
                self._release_context()  # whatever failed above, later calls must not land in this turn

    def _conversation(self) -> str:
        """What a hand round was given, as ``gen_ai.input.messages`` JSON: the turn's input
        as a user message, then each earlier round's answer and each tool result since."""
        messages: list[dict[str, Any]] = [] if self.input is None else [
            {"role": "user", "parts": [{"type": "text", "content": self.input if isinstance(self.input, str) else _json.to_text(self.input)}]}
        ]
        with self._lock:
            messages.extend(self._history or ())
        return _json.dumps(messages)

    def _input_messages_json(self) -> str | None:
        """What the agent was given (``gen_ai.input.messages`` on its span): its first model
        call's messages when an SDK call said them (the history the agent started from),
        else its input as a user message; None when neither is known."""
        first = self._first_messages
        if first is not None:
            return first if type(first) is str else _json.dumps(first)
        return a.user_text_json(self.input) if self.input is not None else None

    def _release_context(self) -> None:
        """Undo what :meth:`_start` attached, once (a later call does nothing)."""
        turn_token, token = self._turn_token, self._token
        self._turn_token = self._token = None
        _release(current_turn, turn_token, token, "turn context")

    @property
    def response(self) -> AIResponseEvent | None:
        """The turn's :class:`~loopscope.AIResponseEvent`, once it has ended (else None)."""
        response = self._response
        if response is None and self._result is not None:
            with self._lock:
                response = self._response
                if response is None:
                    response = self._response = self._summary()
        return response

    @response.setter
    def response(self, value: AIResponseEvent | None) -> None:
        self._response = value

    def _summary(self) -> AIResponseEvent:
        """The response, made when first asked for: ending a turn builds no model."""
        ended = self._result
        assert ended is not None  # only called once the turn has ended
        context = self._span.get_span_context()  # type: ignore[union-attr]
        return AIResponseEvent(
            channel_id=self.agent,
            session_id=self.session_id,
            correlation_id=self.correlation_id,
            parent_correlation_id=self.parent.correlation_id if self.parent else None,
            response_content=ended.response_content,
            segments=ended.segments,
            tool_calls_count=ended.tool_calls_count,
            round_count=ended.round_count,
            model_call_count=ended.model_call_count,
            usage=ended.usage,
            thinking=ended.thinking,
            loop_end_reason=ended.reason,
            latency_ms=ended.latency_ms,
            streaming=ended.streaming,
            timestamp=datetime.fromtimestamp(ended.timestamp, timezone.utc),
            # copies: the records may be shared with other turns (see ToolSet)
            declared_tools=[
                t.model_copy(update={"parameters": dict(t.parameters)}) if t.parameters is not None else t.model_copy()
                for t in ended.declared
            ],
            model=ended.model,
            provider=ended.provider,
            error=ended.error,
            trace_id=format(context.trace_id, "032x"),
            span_id=format(context.span_id, "016x"),
        )

    # -- bookkeeping, called by rounds and tools -----------------------------------------

    def _declare(self, tools: ToolSet) -> None:
        if tools is self._last_declared or not tools:
            return
        with self._lock:
            self._last_declared = tools
            if not self._declared:
                union_into(self._declared, tools.tools)
                self._union = tools if tools.unique else None
            else:
                count = len(self._declared)
                union_into(self._declared, tools.tools)
                if len(self._declared) != count:
                    self._union = None

    def _round_done(self, rnd: Round, exc: BaseException | None) -> None:
        with self._lock:
            if not self._round_no and rnd.input_messages is not None:
                self._first_messages = rnd.input_messages
            self._round_no += 1
            self._last_round = rnd
            if rnd.text:
                self._open_segment += rnd.text
            for key, value in rnd.usage.items():
                self._usage[key] = self._usage.get(key, 0) + value
            if rnd.thinking:
                self._thinking.append(rnd.thinking)
            if rnd.response_model and not self.model:
                self.model = rnd.response_model
            elif rnd.model and not self.model:
                self.model = rnd.model
            if rnd.provider and not self.provider:
                self.provider = rnd.provider
            if rnd._stream:
                self.streaming = True
            self.last_activity = time.monotonic()
            if self._hand and (rnd.text or rnd.tool_calls):
                history = self._history if self._history is not None else []
                said = _output_message(rnd, exc)
                del said["finish_reason"]  # an input message has none
                history.append(said)
                self._history = history
            if rnd.tool_calls:
                # a tool call is a segment boundary: the text so far is one stretch
                self._close_segment()
                self._rounds_with_tools[self._round_no] = False
                made = rnd._arguments_json  # the arguments' JSON, when the round's answer made it
                anonymous: list[str] | None = None
                for index, call in enumerate(rnd.tool_calls):
                    key = call.id
                    if not key:  # no id: pending under a key of its own, matched to its result by position
                        key = _anonymous_key()
                        if anonymous is None:
                            anonymous = []
                        anonymous.append(key)
                    if rnd.eager:
                        arguments = made[index] if index < len(made) else None
                        self._pending[key] = (start_requested(self, call, arguments_json=arguments), self._round_no)
                        call_owners[key] = self
                    else:
                        self._pending[key] = (call, self._round_no)
                if anonymous is not None and rnd.eager:
                    anonymous_owners.pop(self, None)  # re-inserted: the most recent last
                    anonymous_owners[self] = anonymous  # this response's calls replace an earlier one's

    def _close_segment(self) -> None:
        if self._open_segment.strip():
            self._segments.append(self._open_segment)
        self._open_segment = ""

    def _claim_call(self, name: str, call_id: str | None) -> ToolCall | ToolExecution | None:
        """The requested call a tool execution serves: by id, else the oldest of that name."""
        with self._lock:
            if call_id is None:
                call_id = next((cid for cid, (call, _) in self._pending.items() if call.name == name), None)
            entry = self._pending.pop(call_id, None) if call_id is not None else None
            if entry is None:
                return None
            call, round_no = entry
            if call_owners.get(call_id) is self:  # type: ignore[arg-type]
                del call_owners[call_id]  # type: ignore[arg-type]
                served_owners[call_id] = self  # type: ignore[index]
                self._served_ids.append(call_id)  # type: ignore[arg-type]
            self._rounds_with_tools[round_no] = True
            self.last_activity = time.monotonic()
            return call

    def correct_call(self, call_id: str, result: Any) -> None:
        """A call this turn's tool already served (its ``execute_tool`` span ended ``served``,
        as a decorated tool returned) whose result the application then sent to the model
        marked as an error (Anthropic's ``tool_result.is_error``): the span is gone, so a
        ``tool_outcome_correction`` span under the turn says it failed, with the
        result's text as its error, once per call; the store sets the call's row ``failed``
        (storage/duckdb/writer.py) and OTLP carries both spans. The correction span starts where the
        call's span ended (else where the turn started), so the store looks for the call's
        row from then on only."""
        with self._lock:
            served = self._served_ok
            found = served.pop(call_id, None) if served else None
        if found is None:
            return  # not served by a tool here, corrected already, or it failed already
        name, ended = found
        now = time.time_ns()
        since = ended if type(ended) is int else getattr(self._span, "start_time", None)
        error = _error_text(result)
        attributes: dict[str, Any] = {
            a.CONVERSATION_ID: self.session_id, a.TURN_ID: self.correlation_id, a.TOOL_NAME: name,
            a.TOOL_CALL_ID: call_id, a.TOOL_CORRECTION: "failed", a.TOOL_ERROR: error, a.ERROR_TYPE: "failed",
        }
        if self.agent:
            attributes[a.AGENT_NAME] = self.agent
        if self.framework:
            attributes[a.FRAMEWORK] = self.framework
        span = self._tracer.start_span(f"{a.TOOL_CORRECTION_SPAN} {name}", context=self._context(), attributes=attributes,
                                       start_time=since if type(since) is int and since <= now else now)
        span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=now)

    def has_call(self, call_id: str) -> bool:
        """Whether this turn asked for ``call_id`` and it has not ended yet."""
        return call_id in self._pending

    def end_call(self, call_id: str, result: Any, is_error: bool = False, outcome: str | None = None) -> bool:
        """End a pending call with the result the application sent back to the model.

        Returns False when the turn has no such pending call (already served, or not its).
        """
        call = self._claim_call("", call_id if type(call_id) is str else _values.text(call_id))
        if call is None:
            return False
        if not isinstance(call, ToolExecution):
            call = start_requested(self, call)
        call.result = result
        if outcome is not None or is_error:
            call._outcome = _values.text(outcome) or "failed"
            call._error = _error_text(result) if is_error else None
        call._finish(None)
        return True

    def _tool_done(self, call_id: str | None = None, result: Any = None, outcome: str | None = None, name: str = "",
                   span: Any = None) -> None:
        with self._lock:
            self._tool_calls_count += 1
            if outcome == "served" and call_id and served_owners.get(call_id) is self:
                # a call the model asked for, served: the request that sends its result back
                # may still mark it an error (correct_call); its span's end dates its row
                served = self._served_ok
                if served is None:
                    served = self._served_ok = {}
                served[call_id] = (name, getattr(span, "end_time", None))
            if self._hand:  # the next hand round was given this result
                history = self._history if self._history is not None else []
                history.append({"role": "tool", "parts": [{"type": "tool_call_response", "id": call_id, "response": result}]})
                self._history = history

    def _close_unserved(self) -> None:
        with self._lock:
            pending = list(self._pending.items())
            self._pending.clear()
            for call_id, _ in pending:
                if call_owners.get(call_id) is self:
                    del call_owners[call_id]
        for _, (call, _) in pending:
            record_unserved(self, call)

    def _loop_end_reason(self, exc: BaseException | None) -> LoopEndReason:
        if self._explicit_reason is not None:
            return self._explicit_reason
        if exc is not None:
            if isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt)):
                return LoopEndReason.CANCELLED
            if isinstance(exc, TimeoutError):
                return LoopEndReason.TIMEOUT
            return LoopEndReason.ERROR
        last = self._last_round
        if last is None:
            return LoopEndReason.EMPTY_RESPONSE
        if last.tool_calls:
            return LoopEndReason.UNFINISHED  # the model still asked for tools when the loop stopped
        if last.error is not None:
            return LoopEndReason.ERROR  # the response carried an error (a raised one is the turn's exception)
        outcome = last.outcome
        if outcome in _OUTCOME_REASONS:
            return _OUTCOME_REASONS[outcome]
        if last.finish_kind() is Finish.LENGTH:
            return LoopEndReason.TRUNCATED
        if not last.text.strip():
            return LoopEndReason.EMPTY_RESPONSE
        return LoopEndReason.COMPLETED
