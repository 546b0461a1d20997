"""The recorder's adapter-facing API: all that ``loopscope/instrument/*`` uses of the recorder.

An adapter is a translator: it reads an SDK's or a framework's objects and reports them
here, in typed records; it never touches a turn's, a round's or a span's internals. The
contract (see docs/architecture.md, "Writing an adapter"):

Model calls (an SDK adapter; ``instrument/_calls.py`` is the one generic patcher)
    :func:`start_model_call` with a :class:`ModelRequest` places the call: it ends the
    tool calls whose results the request carries (:class:`ToolResult`, read only for
    the ids :func:`wants_result` asks for, their content through :func:`result_value`),
    joins the current round, the current turn, or the turn that asked for those calls,
    or opens a stitched turn. The :class:`ModelCall` it returns takes streamed text
    (``delta``, ``first_chunk``; a stream proxy dates chunks with ``date_first_chunk`` and
    ``chunk_times``) and ends once: ``finish(ModelResponse(...))``,
    ``fail(exc)``, or ``abandon()`` for a stream let go before its end. While the SDK
    method runs, ``ModelCall.attach()`` makes its span current (:func:`detach` undoes it).
    :func:`recorded_elsewhere` says a framework records the call about to be made;
    :func:`note_request_elsewhere` adds what the call sends to that framework's span.

Turns, rounds and tools (a framework adapter)
    :func:`open_turn` opens a turn a framework run stands for (or the adapter joins
    :func:`current_turn`); :func:`end_turn` ends it. :func:`open_round` /
    :func:`end_round` bracket a framework's own model call. :func:`start_tool` starts a
    tool execution (serving the pending call of that id, else of that name);
    :func:`end_tool` ends it with a result, an exception, or an outcome.
    :func:`serve_call` ends a pending call by id with the result sent to the model.
    Tools offered mid-turn: ``Turn.declare_tools``. A framework that records the tool
    calls it runs claims them with :func:`report_own_tool_calls`; one that records its
    own model calls defers the SDK adapters with :func:`defer_model_calls_to`.

One call, one record (an adapter over other adapters)
    A library that makes model calls itself and may do so through an SDK loopscope also
    wraps (LiteLLM: its HTTP code for most routes, the openai SDK for Azure) records the
    call where it sees it first: :func:`open_outer_call` says, in the context its SDK
    calls run in, that this call is open; an inner adapter's :func:`start_model_call`
    for the same request there (as many messages, the same last user text) is then no
    second call (it returns None, and the inner adapter leaves the call alone).
    :func:`close_outer_call` ends that, and an outer call that has ended covers nothing.

The provider of an SDK's call follows its server: :func:`provider_of_server` (the SDK's
provider name, the server's host and port) names the provider whose host it is;
:func:`provider_at` does it for the server :func:`server_of` read from a base URL.

The provider kit (docs/writing-an-adapter.md): what every provider adapter would
otherwise derive again, so that an adapter only translates.

- :func:`request_parameters`: typed keyword-only request parameters; a provider's own
  keys kept under ``other`` and said once; :func:`server_of` the server of a base URL.
- :class:`InputMessage`, :class:`OutputMessage` and their parts (:class:`Text`,
  :class:`ToolCallRequest`, :class:`ToolCallResponse`, :class:`Reasoning`, :class:`Part`):
  util-genai's shapes, for ``ModelRequest.input_messages``.
- declared tools in any provider's objects (pydantic models, dataclasses, objects with a
  ``name``, Gemini's ``Tool`` with its ``function_declarations``): ``ModelRequest.tools``
  takes them as they are.
- :class:`Finish`, :class:`FinishMap`, :data:`FINISH_OUTCOMES`: the finish-reason
  vocabulary and the outcome each gives (``ModelResponse.finish``).
- :func:`usage`: one builder of the recorded usage, told what the provider's figures include.
- :class:`ToolResults`: the request's tool results, with and without ids, paired once;
  :class:`RequestMessages`: the walk over a request's messages that gathers them, the typed
  messages and the last user text, and makes the :class:`ModelRequest`.
- ``loopscope/instrument/_streams.py`` (stream proxies, :func:`proxy_stream`) and
  ``loopscope/instrument/_openai_compat.py`` (the OpenAI format) are the kit's instrument side.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextvars import ContextVar, Token
from typing import Any, NamedTuple

from opentelemetry import context as otel_context

from .._otel_sdk import attach_span, detach
from ..models import LoopEndReason, ToolCall
from ..pricing import provider_of as provider_of_server
from . import settings
from .context import current_round, current_session, current_turn, last_stitched
from .elsewhere import defer_to as defer_model_calls_to
from .elsewhere import note_request as note_request_elsewhere
from .elsewhere import recorded_elsewhere
from .finish import COMMON as COMMON_FINISH
from .finish import OUTCOMES as FINISH_OUTCOMES
from .finish import Finish, FinishMap
from .parameters import request_parameters, server_of
from .parts import InputMessage, OutputMessage, Part, Reasoning, Text, ToolCallRequest, ToolCallResponse
from .records import Choice, ModelRequest, ModelResponse, ToolResult
from .results import RequestMessages, ToolResults
from .settings import on_exit
from .stitch import (
    ModelCall,
    StreamClosed,
    close_turn,
    requested_call_span,
    result_value,
    wants_result,
)
from .stitch import start_model_call as _start_model_call
from .tool import ToolExecution, running_tool, start_requested
from .tool import reported_elsewhere as report_own_tool_calls
from .turn import Round, Turn, call_owners
from .turn import _new_id as new_id
from .usage import USAGE_KEYS, usage


def provider_at(provider: str, server: Mapping[str, Any] | None) -> str:
    """The provider of a call to ``server`` (what :func:`server_of` gave) by an SDK of
    ``provider``: the one whose host it is (Groq's, Gemini's OpenAI endpoint...), else ``provider``."""
    if not server:
        return provider
    return provider_of_server(provider, server.get("server_address"), server.get("server_port"))


_CURRENT: Any = object()  # "the current turn", where a turn may be named
_UNSET: Any = object()


# -- one call, one record ---------------------------------------------------------------


class _Outer(NamedTuple):
    call: ModelCall
    inputs: int  # how many messages its request has
    text: str | None  # its request's last user text


_outer: ContextVar[_Outer | None] = ContextVar("loopscope_outer_call", default=None)


def open_outer_call(call: ModelCall, request: ModelRequest) -> Token[_Outer | None]:
    """``call`` (recorded by an adapter over other adapters) is open in this context: an
    inner adapter's call here for the same request is not recorded again. The token is
    for :func:`close_outer_call`."""
    messages = request.messages
    return _outer.set(_Outer(call, len(messages) if messages is not None else -1, request.input_text))


def close_outer_call(token: Token[_Outer | None]) -> bool:
    """Undo :func:`open_outer_call`; False when the token is of another context (nothing undone)."""
    try:
        _outer.reset(token)
    except ValueError:
        return False
    return True


def start_model_call(request: ModelRequest) -> ModelCall | None:
    """:func:`loopscope.recorder.stitch.start_model_call`, unless an outer adapter's call
    open in this context is this very request (:func:`open_outer_call`): then None, and
    the calling adapter leaves the call to it."""
    outer = _outer.get()
    if outer is not None and not outer.call._done:
        messages = request.messages
        if (len(messages) if messages is not None else -1) == outer.inputs and request.input_text == outer.text:
            return None
    return _start_model_call(request)


# -- turns ------------------------------------------------------------------------------


def open_turn(
    *,
    framework: str | None,
    agent: str | None = None,
    tools: Iterable[Any] | None = None,
    input: str | None = None,
    model: str | None = None,
    provider: str | None = None,
    session_id: str | None = None,
    correlation_id: str | None = None,
    streaming: bool = False,
    parent: Turn | None = _CURRENT,
) -> Turn:
    """Start the turn a framework run stands for (an ``invoke_agent`` span) without making
    it current: :func:`enter` does that where the run's code runs, and :func:`end_turn`
    ends it. Its parent is the current turn, or ``parent`` when given (None: a root turn);
    its session is ``session_id``, else the current session, else its parent's, else new.
    """
    turn = Turn(
        settings.tracer(),
        session_id=session_id,
        agent=agent,
        tools=tools,
        input=input,
        input_blocked=False,
        model=model,
        provider=provider,
        framework=framework,
        correlation_id=correlation_id,
        streaming=streaming,
    )
    if parent is _CURRENT:
        turn._start(attach=False)
        return turn
    token = current_turn.set(parent)
    try:
        turn._start(attach=False)
    finally:
        current_turn.reset(token)
    return turn


def end_turn(turn: Turn, reason: LoopEndReason | None = None, exc: BaseException | None = None) -> None:
    """End a turn: with ``reason`` (why its loop stopped), or failed by ``exc``; the calls
    its model asked for that nothing served end as unserved. A second end does nothing."""
    close_turn(turn, reason, exc)


def rounds_done(turn: Turn) -> int:
    """How many rounds of ``turn`` have ended (a framework adapter learns from it whether
    an SDK adapter recorded its model calls)."""
    return turn._round_no


# -- making a turn or a round current -------------------------------------------------------


class Entered(NamedTuple):
    """What :func:`enter` set, for :func:`leave`."""

    var: ContextVar[Any]
    var_token: Token[Any]
    context_token: object | None


def enter(record: Turn | Round) -> Entered | None:
    """Make a turn (or a round) the current one in this context, and its span the current
    OpenTelemetry span: model calls and tools here join it, the SDK's and the HTTP
    client's spans nest under it. None (nothing set) when it has no span: it failed to
    start, and nothing should join it. Undo with :func:`leave`."""
    span = record._span
    if span is None:
        return None
    if isinstance(record, Turn):
        return Entered(current_turn, current_turn.set(record), otel_context.attach(record._span_context))  # type: ignore[arg-type]
    return Entered(current_round, current_round.set(record), attach_span(span))


def leave(entered: Entered | None) -> bool:
    """Undo :func:`enter`. False when it was entered in another context (a generator
    closed elsewhere, a stream ended in another task): nothing of this context is undone."""
    if entered is None:
        return True
    try:
        entered.var.reset(entered.var_token)
    except ValueError:
        return False
    if entered.context_token is not None:
        detach(entered.context_token)
    return True


# -- rounds -----------------------------------------------------------------------------------


def open_round(
    turn: Turn,
    *,
    model: str | None = None,
    provider: str | None = None,
    tools: Iterable[Any] | None = None,
    stream: bool | None = None,
    current: bool = False,
) -> Round:
    """Start a framework's own model call as a round of ``turn`` (a ``chat`` span); with
    ``current`` it is the current round (and span) in this context until it ends. An SDK
    call made while it is current fills it (and sets ``Round.eager``); otherwise report
    what came back with ``Round.response(...)``. End it with :func:`end_round`."""
    rnd = Round(turn, model, provider, tools, stream)
    rnd._start(attach=current)
    return rnd


def end_round(rnd: Round, exc: BaseException | None = None) -> None:
    """End a round :func:`open_round` started (failed with ``exc``, when given)."""
    rnd._finish(exc)


# -- tool calls -------------------------------------------------------------------------------


def call_owner(call_id: str) -> Turn | None:
    """The open turn whose model asked for ``call_id`` and that nothing has served yet."""
    return call_owners.get(call_id)


def serve_call(turn: Turn, call_id: str, result: Any, is_error: bool = False) -> bool:
    """End ``turn``'s pending call ``call_id`` with the result sent back to the model;
    False when it has no such call."""
    return turn.end_call(call_id, result, is_error)


def claim_call(turn: Turn, name: str, call_id: str | None) -> ToolCall | ToolExecution | None:
    """Take the pending call of ``turn`` a framework serves itself (by id, else the oldest
    of that name): a :class:`ToolExecution` (its span open) when an SDK adapter started
    it, which the framework then ends with :func:`end_tool` or ``ToolExecution.report``."""
    return turn._claim_call(name, call_id)


def start_requested_call(turn: Turn, call: ToolCall, start_time: int | None = None) -> ToolExecution:
    """Start a call the model asked for in ``turn`` as the framework reports it (not
    current anywhere); ``start_time`` (ns since the epoch) dates it. End it with
    ``ToolExecution.report(...)`` or :func:`end_tool`."""
    return start_requested(turn, call, start_time)


def start_tool(
    name: str,
    arguments: Any = None,
    call_id: str | None = None,
    description: str | None = None,
    *,
    turn: Turn | None = None,
) -> ToolExecution:
    """Start a tool execution (an ``execute_tool`` span, current in this context): it
    serves the pending call ``call_id`` of ``turn`` (by default the current turn, else
    the last stitched one), else the oldest one of that name. End it with :func:`end_tool`."""
    execution = ToolExecution(name, arguments, call_id, description)
    if turn is None:
        execution._start()
        return execution
    token = current_turn.set(turn)
    try:
        execution._start()
    finally:
        current_turn.reset(token)
    return execution


def tool_turn(execution: ToolExecution) -> Turn | None:
    """The turn a started tool execution belongs to (None outside any)."""
    turn = execution._turn
    return turn if isinstance(turn, Turn) else None


def end_tool(
    execution: ToolExecution,
    exc: BaseException | None = None,
    *,
    result: Any = _UNSET,
    outcome: str | None = None,
    error: str | None = None,
    context_gone: bool = False,
) -> None:
    """End a tool execution: with ``result``; failed or cancelled by ``exc``; or with an
    ``outcome`` (``"failed"``, ``"unserved"``, ...) and its ``error`` text.
    ``context_gone``: it ends elsewhere than in the context it started in (that task is
    gone), so the context it made current there is left alone."""
    if context_gone:
        execution._token = None
    if result is not _UNSET:
        execution.result = result
    if outcome is not None:
        execution._outcome, execution._error = outcome, error
    execution._finish(exc)


__all__ = [
    "COMMON_FINISH",
    "FINISH_OUTCOMES",
    "USAGE_KEYS",
    "Choice",
    "Entered",
    "Finish",
    "FinishMap",
    "InputMessage",
    "ModelCall",
    "ModelRequest",
    "ModelResponse",
    "OutputMessage",
    "Part",
    "Reasoning",
    "RequestMessages",
    "Round",
    "StreamClosed",
    "Text",
    "ToolCallRequest",
    "ToolCallResponse",
    "ToolExecution",
    "ToolResult",
    "ToolResults",
    "Turn",
    "call_owner",
    "claim_call",
    "close_outer_call",
    "current_round",
    "current_session",
    "current_turn",
    "defer_model_calls_to",
    "detach",
    "end_round",
    "end_tool",
    "end_turn",
    "enter",
    "last_stitched",
    "leave",
    "new_id",
    "note_request_elsewhere",
    "on_exit",
    "open_outer_call",
    "open_round",
    "open_turn",
    "provider_at",
    "provider_of_server",
    "recorded_elsewhere",
    "report_own_tool_calls",
    "request_parameters",
    "requested_call_span",
    "result_value",
    "rounds_done",
    "running_tool",
    "serve_call",
    "server_of",
    "start_model_call",
    "start_requested_call",
    "start_tool",
    "tool_turn",
    "usage",
    "wants_result",
]
