"""Tool executions: ``execute_tool`` spans from a decorator or a context manager."""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar, cast, overload

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, Status, StatusCode

from .. import _json
from .. import semconv as a

# A tool call's start and end run on every recorded call: they keep a plain ``try`` and
# ``internal_error`` rather than ``with guard(...)``, because a try costs nothing until it
# fails while a with block makes two Python method calls every time (about 0.3 us a block
# measured, several per call: a tenth of a hand tool call's cost, see
# benchmarks/bench_tool_call.py).
from .._guard import internal_error
from .._otel_sdk import end_span, start_span
from ..models import ToolCall
from . import _values, settings
from .context import current_turn, open_stitched_turn

if TYPE_CHECKING:
    from contextvars import Token

    from opentelemetry.context import Context
    from typing_extensions import Self  # typing.Self from 3.11; only read by type checkers here

_F = TypeVar("_F", bound=Callable[..., Any])
_SKIPPED_PARAMS = frozenset({"self", "cls"})
_UNSET: Any = object()

_reported_elsewhere: list[Callable[[ToolExecution], bool]] = []
"""One check per framework adapter that records the tool calls its framework runs (RoomKit's,
from its own rows): whether an execution starting in this context is such a call."""


def reported_elsewhere(check: Callable[[ToolExecution], bool]) -> Callable[[], None]:
    """Have decorated tools (and ``with loopscope.tool(...)`` blocks) for which ``check``
    says True run unrecorded: a framework adapter records that call already, so it is
    reported once. Returns what takes the check back."""
    _reported_elsewhere.append(check)

    def undo() -> None:
        if check in _reported_elsewhere:
            _reported_elsewhere.remove(check)

    return undo


class ToolExecution:
    """One execution of a tool: an ``execute_tool`` span and its start and end rows.

    Inside a turn it serves the call the model asked for: the one with ``call_id``, or
    else the oldest pending call of the same tool name. Set the outcome with
    :meth:`set_result`, :meth:`refuse` or :meth:`block`; an exception marks it failed
    (or cancelled) and passes through unchanged.
    """

    __slots__ = (
        "_adopted",
        "_duration_ms",
        "_elsewhere",
        "_error",
        "_outcome",
        "_span",
        "_status",
        "_token",
        "_turn",
        "arguments",
        "call_id",
        "description",
        "name",
        "result",
    )

    def __init__(self, name: str, arguments: Any = None, call_id: str | None = None, description: str | None = None) -> None:
        # a name or an id given as another value (call_id=12345) is recorded as text
        self.name = name if type(name) is str else _values.text(name) or ""
        self.arguments = arguments
        self.call_id = call_id if call_id is None or type(call_id) is str else _values.text(call_id)
        self.description = description if description is None or type(description) is str else _values.text(description)
        self.result: Any = None
        self._outcome: str | None = None
        self._error: str | None = None
        self._span: Span | None = None
        self._token: Token[Context] | None = None
        self._turn: Any = None
        self._adopted: ToolExecution | None = None
        self._status: str | None = None  # a framework's own status, else folded from the outcome
        self._duration_ms: float | None = None  # a framework's own duration: the span ends at start + it
        self._elsewhere = False  # a framework adapter records this call (see reported_elsewhere)

    def set_result(self, value: Any) -> None:
        """The value the tool returned (the decorator sets it for you)."""
        self.result = value

    def refuse(self, reason: str = "") -> None:
        """The tool declined to serve the call (a gate, a policy, a bad request)."""
        self._outcome, self._error = "refused", _reason(reason)

    def block(self, reason: str = "") -> None:
        """The result was withheld from the model (for example by a guardrail)."""
        self._outcome, self._error = "blocked", _reason(reason)

    def fail(self, error: str = "") -> None:
        """The tool reported a failure in its result rather than raising (an MCP result
        with ``isError``, a LangChain ``ToolMessage`` with status ``error``)."""
        self._outcome, self._error = "failed", _reason(error)

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

    def __call__(self, fn: _F) -> _F:
        """Use a configured ``loopscope.tool(name=...)`` as a decorator."""
        return _decorate(fn, self.name or fn.__name__, self.description)

    def _start(self) -> None:
        try:
            if self.call_id is None and _reported_elsewhere:
                for check in _reported_elsewhere:
                    if check(self):
                        self._elsewhere = True  # the framework's record of the call is the one
                        return
            turn = current_turn.get() or open_stitched_turn()
            self._turn = turn
            call = None
            if turn is not None:
                call = turn._claim_call(self.name, self.call_id)
                if type(call) is ToolExecution:
                    # the model's response already started this call: serve that one, once
                    self._adopted = call
                    self.call_id = call.call_id
                    if self.arguments is None:
                        self.arguments = call.arguments
                    self._token = otel_context.attach(trace.set_span_in_context(call._span))  # type: ignore[arg-type]
                    return
                if call is not None:
                    call = cast(ToolCall, call)  # not an execution (served above): a requested call
                    self.call_id = call.id
                    if self.arguments is None:
                        self.arguments = call.arguments
            self._open(turn, None)
            self._token = otel_context.attach(trace.set_span_in_context(self._span))  # type: ignore[arg-type]
        except Exception:
            internal_error("tool start")

    def report(
        self,
        *,
        outcome: str,
        result: Any = None,
        status: str | None = None,
        error: str | None = None,
        duration_ms: float | None = None,
        arguments: Any = _UNSET,
    ) -> None:
        """End the call with what a framework recorded of it itself (RoomKit's tool rows).

        ``outcome``, ``status`` and ``error`` are stored as given; with ``duration_ms`` the
        span ends that long after it started, so the stored duration is the framework's;
        ``arguments``, when given, are the ones the call ran with (a hook may rewrite them).
        """
        if arguments is not _UNSET and arguments != self.arguments:
            self.arguments = arguments
            if self._span is not None:
                self._span.set_attribute(a.TOOL_CALL_ARGUMENTS, _json.dumps(arguments))
        self.result = result
        text = _values.text
        self._outcome, self._error, self._status = text(outcome), text(error), text(status)
        self._duration_ms = _values.duration_ms(duration_ms)
        self._finish(None)

    def _open(
        self, turn: Any, parent: otel_context.Context | None, start_time: int | None = None, arguments_json: str | None = None
    ) -> None:
        """Start the ``execute_tool`` span (under ``parent``, else the current span);
        ``arguments_json``: the arguments' JSON text, when the caller made it already."""
        attributes: dict[str, Any] = {a.OPERATION: a.OP_EXECUTE_TOOL, a.TOOL_NAME: self.name, a.TOOL_TYPE: "function"}
        if turn is not None:
            attributes[a.CONVERSATION_ID] = turn.session_id
            attributes[a.TURN_ID] = turn.correlation_id
            if turn.agent:
                attributes[a.AGENT_NAME] = turn.agent
            if getattr(turn, "framework", None):  # the tool rows name the framework, as the turn's do
                attributes[a.FRAMEWORK] = turn.framework
        if self.call_id is None:
            # a tool run no model asked for (a hand tool): 32 random hex digits, as uuid4().hex
            # gives, for a quarter of its cost, so that its start and end rows pair
            self.call_id = os.urandom(16).hex()
        if self.call_id:  # a call the model asked for without an id is recorded without one
            attributes[a.TOOL_CALL_ID] = self.call_id
        if self.arguments is not None:
            attributes[a.TOOL_CALL_ARGUMENTS] = arguments_json if arguments_json is not None else _json.dumps(self.arguments)
        if self.description:
            attributes[a.TOOL_DESCRIPTION] = self.description
        self._span = start_span(settings.tracer(), f"{a.OP_EXECUTE_TOOL} {self.name}", parent, attributes, start_time)

    def _finish(self, exc: BaseException | None) -> None:
        if self._elsewhere:
            return
        adopted = self._adopted
        if adopted is not None:
            self._detach()
            adopted.result = self.result
            if self._outcome is not None:
                adopted._outcome, adopted._error = self._outcome, self._error
            adopted._finish(exc)
            return
        try:
            span = self._span
            if span is None:
                return
            outcome, error = self._outcome, self._error
            if exc is not None:
                outcome = "cancelled" if isinstance(exc, asyncio.CancelledError) else "failed"
                error = f"{type(exc).__qualname__}: {exc}"
            elif outcome is None:
                outcome = "served"
            status = self._status or ("completed" if outcome == "served" else "failed")
            attributes: dict[str, Any] = {a.TOOL_OUTCOME: outcome, a.TOOL_STATUS: status}
            if self.result is not None:
                attributes[a.TOOL_CALL_RESULT] = _json.dumps(self.result)
            if error:
                attributes[a.TOOL_ERROR] = error
            if outcome != "served":
                attributes[a.ERROR_TYPE] = type(exc).__qualname__ if exc is not None else outcome
                span.set_status(Status(StatusCode.ERROR, error))
            self._detach()
            end_time = None
            start_time = getattr(span, "start_time", None)  # an SDK span's (the API's has none)
            if self._duration_ms is not None and start_time is not None:
                end_time = start_time + round(self._duration_ms * 1e6)
            end_span(span, end_time, attributes)  # set_attributes, then the end
            if self._turn is not None:
                self._turn._tool_done(self.call_id, self.result, outcome, self.name, span)
        except Exception:
            internal_error("tool end")
        finally:
            self._detach()  # whatever failed above, the caller's context is put back

    def _detach(self) -> None:
        token, self._token = self._token, None
        if token is not None:
            otel_context.detach(token)


def _reason(reason: Any) -> str | None:
    """A refusal's, a block's or a failure's reason as text; an empty one is none."""
    return (reason if type(reason) is str else _values.text(reason)) or None


def running_tool() -> str | None:
    """The name of the tool whose ``execute_tool`` span is the current span, or None. A
    client library called inside a tool that is recorded already (an MCP call inside a
    LangChain tool of the same name) is that call, not a second one."""
    span = trace.get_current_span()
    if not span.is_recording():
        return None
    attributes = getattr(span, "attributes", None) or {}
    if attributes.get(a.OPERATION) != a.OP_EXECUTE_TOOL:
        return None
    name = attributes.get(a.TOOL_NAME)
    return name if isinstance(name, str) else None


def start_requested(turn: Any, call: ToolCall, start_time: int | None = None, arguments_json: str | None = None) -> ToolExecution:
    """Start a call the model just asked for, as a sibling of the round that asked.

    Adapters that see a response, not the tool run, use this: the call is pending from
    the moment the response is complete until a later request carries its result, or a
    decorated tool serves it. ``start_time`` (ns since the epoch) dates a call learned of
    after it started; ``arguments_json``: the call's arguments as JSON text, made already
    (for the answer's output message).
    """
    execution = ToolExecution(call.name, call.arguments, call.id)
    execution._turn = turn
    execution._open(turn, turn._context(), start_time, arguments_json)
    return execution


def record_unserved(turn: Any, call: ToolCall | ToolExecution) -> None:
    """End a call the model asked for that nothing ran before its turn ended."""
    execution = call if isinstance(call, ToolExecution) else ToolExecution(call.name, call.arguments, call.id)
    if execution._span is None:
        execution._open(turn, turn._context())
    execution._outcome = "unserved"
    execution._error = getattr(turn, "_unserved_error", None) or "not executed before the turn ended"
    execution._turn = None  # it never ran: not counted among the turn's tool calls
    execution._finish(None)


def _argument_binder(fn: Callable[..., Any]) -> Callable[[tuple[Any, ...], dict[str, Any]], Any]:
    """A fast mapping of a call's arguments to parameter names, computed once per tool."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return lambda args, kwargs: {"args": list(args), **kwargs} if args else dict(kwargs)
    params = list(signature.parameters.values())
    simple = all(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY, p.VAR_KEYWORD) for p in params)
    names = tuple(p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
    skip = bool(names) and names[0] in _SKIPPED_PARAMS

    if simple:

        def bind(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if not args:
                return dict(kwargs)
            bound = dict(zip(names, args))
            if skip:
                bound.pop(names[0], None)
            if kwargs:
                bound.update(kwargs)
            return bound

        return bind

    def bind_slow(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            bound = signature.bind_partial(*args, **kwargs).arguments
        except TypeError:
            return {"args": list(args), **kwargs}
        return {k: v for k, v in bound.items() if k not in _SKIPPED_PARAMS}

    return bind_slow


def _decorate(fn: _F, name: str, description: str | None) -> _F:
    bind = _argument_binder(fn)
    description = description or inspect.getdoc(fn)

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            execution = ToolExecution(name, bind(args, kwargs), None, description)
            execution._start()
            try:
                result = await fn(*args, **kwargs)
            except BaseException as exc:
                execution._finish(exc)
                raise
            execution.result = result
            execution._finish(None)
            return result

        wrapper: Any = async_wrapper
    else:

        @functools.wraps(fn)
        def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
            execution = ToolExecution(name, bind(args, kwargs), None, description)
            execution._start()
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:
                execution._finish(exc)
                raise
            execution.result = result
            execution._finish(None)
            return result

        wrapper = sync_wrapper
    wrapper.__loopscope_tool_name__ = name
    return wrapper  # type: ignore[no-any-return]


@overload
def tool(fn: _F, /) -> _F: ...
@overload
def tool(
    name: str | None = None, /, *, arguments: Any = None, call_id: str | None = None, description: str | None = None
) -> ToolExecution: ...
def tool(
    name_or_fn: Any = None, /, *, arguments: Any = None, call_id: str | None = None, description: str | None = None
) -> Any:
    """Record tool executions.

    As a decorator (``@loopscope.tool`` or ``@loopscope.tool("name")``) on a sync or
    async function, every call becomes an ``execute_tool`` span with its arguments,
    result, duration and outcome. As a context manager
    (``with loopscope.tool("search", arguments=...) as call:``) it records the block;
    set ``call.set_result(...)``, ``call.refuse(...)`` or ``call.block(...)`` inside.
    """
    if callable(name_or_fn):
        return _decorate(name_or_fn, name_or_fn.__name__, description)
    return ToolExecution(name_or_fn or "", arguments, call_id, description)
