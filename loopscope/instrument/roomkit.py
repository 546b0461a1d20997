"""RoomKit: every turn of an AI channel as one loopscope turn, through RoomKit's own surfaces.

Each ``RoomKit`` created while the adapter is on gets, through its public surfaces:

- a telemetry provider that hands everything to the application's own (or to RoomKit's
  no-op default) and tells loopscope when a turn's loop starts and ends, what each
  generation used and when each tool ran;
- an ``AFTER_BROADCAST`` hook on the AI channels' rows (text segments, tool call starts
  and ends with RoomKit's status, outcome and duration), an ``ON_AI_RESPONSE`` hook (the
  turn's own summary), an ``AFTER_TOOL_ROUND`` hook (a round's rows, read from the store
  before the next model call) and a ``BEFORE_AI_GENERATION`` hook (the message the turn
  answers); the two SYNC ones only read, and always allow.

Wrapped with wrapt, since RoomKit has no surface for them: ``RoomKit.__init__`` (to attach
the above to every kit, with no change to the application) and the constructor of its
streamed-turn writer, which names the turn's correlation id before the loop runs.
``uninstrument()`` restores both, removes the hooks from every kit and turns the
telemetry providers it handed out into plain pass-throughs.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import inspect
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

from roomkit.core.framework import RoomKit
from roomkit.core.hooks import HookRegistration
from roomkit.models.enums import ChannelType, EventType, HookExecution, HookTrigger
from roomkit.models.hook import HookResult
from roomkit.models.store_filter import EventFilter
from roomkit.telemetry.base import SpanKind, TelemetryProvider
from roomkit.telemetry.config import TelemetryConfig
from roomkit.telemetry.noop import NoopTelemetryProvider

from .. import pipeline
from .._guard import guard, guarded
from ..recorder.adapter import ToolExecution, report_own_tool_calls
from ._patch import Patch, Registration, wrap
from ._roomkit_turn import RoomKitTurn

try:  # the tool call a handler runs for (RoomKit sets it around the handler's call)
    from roomkit.tools import current_tool_call as _current_tool_call
except ImportError:  # an older RoomKit: decorated tools are recorded besides its rows
    _current_tool_call = None


_USAGE_METRICS = {"roomkit.llm.input_tokens": "input_tokens", "roomkit.llm.output_tokens": "output_tokens"}
_ROW_TYPES = {EventType.MESSAGE, EventType.TOOL_CALL_START, EventType.TOOL_CALL_END}
_HOOK_NAMES = ("loopscope_rows", "loopscope_ai_response", "loopscope_tool_round", "loopscope_turn_input")

_next_correlation: ContextVar[str | None] = ContextVar("loopscope_roomkit_correlation", default=None)
"""The correlation id of the response the current task is about to read (from its writer)."""
_current: ContextVar[RoomKitTurn | None] = ContextVar("loopscope_roomkit_turn", default=None)
"""The turn whose loop runs in this context (its generations' usage is reported here)."""

_on = False  # while False, every telemetry provider handed out only passes calls on


class _Turns:
    """The RoomKit turns being recorded, found by telemetry span, correlation id, room."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.by_span: dict[str, RoomKitTurn] = {}  # llm.generate span -> turn
        self.by_tool_span: dict[str, RoomKitTurn] = {}
        self.by_correlation: dict[str, RoomKitTurn] = {}
        self.open: list[RoomKitTurn] = []
        self.inputs: dict[tuple[str, str], str] = {}  # (room, channel) -> the text its next turn answers

    # -- from the telemetry ----------------------------------------------------------------

    def loop_started(self, span_id: str, room_id: str | None, channel_id: str | None) -> None:
        if not room_id or not channel_id:
            return
        correlation_id = _next_correlation.get()
        if correlation_id is not None:
            _next_correlation.set(None)  # one writer, one response
        with self.lock:
            text = self.inputs.pop((room_id, channel_id), None)
        rk = RoomKitTurn(room_id, channel_id, correlation_id, text)
        with self.lock:
            self.by_span[span_id] = rk
            if correlation_id is not None:
                self.by_correlation[correlation_id] = rk
            self.open.append(rk)
        rk.enter()
        rk.context_token = _current.set(rk)

    def loop_ended(self, span_id: str, status: str, error_message: str | None) -> None:
        with self.lock:
            rk = self.by_span.pop(span_id, None)
        if rk is None:
            return
        token, rk.context_token = rk.context_token, None
        if token is not None:
            try:
                _current.reset(token)
            except ValueError:
                _current.set(None)
        rk.leave()
        rk.loop_ended(status, error_message)
        self.settle(rk)

    def tool_started(self, span_id: str, parent_id: str | None, attributes: Mapping[str, Any] | None) -> None:
        with self.lock:
            rk = self.by_span.get(parent_id) if parent_id else None
            if rk is None or not attributes:
                return
            self.by_tool_span[span_id] = rk
        rk.tool_started(span_id, str(attributes.get("tool.name", "")), str(attributes.get("tool.id", "")))

    def tool_ended(self, span_id: str) -> None:
        with self.lock:
            rk = self.by_tool_span.pop(span_id, None)
        if rk is not None:
            rk.tool_ended(span_id)

    def metric(self, name: str, value: float) -> None:
        rk = _current.get()
        if rk is not None and rk.loop_status is None and not rk.finished:
            rk.usage_metric(_USAGE_METRICS[name], value)

    # -- from the hooks --------------------------------------------------------------------

    def generation_requested(self, event: Any) -> None:
        """BEFORE_AI_GENERATION: the event the channel's next turn answers (its input)."""
        if getattr(event, "purpose", "answer") != "answer" or not event.room_id:
            return
        body = getattr(getattr(event.trigger, "content", None), "body", None)
        with self.lock:
            if isinstance(body, str):
                self.inputs[(event.room_id, event.channel_id)] = body
            else:
                self.inputs.pop((event.room_id, event.channel_id), None)

    def row(self, event: Any) -> None:
        rk = self._of_row(event)
        if rk is None or rk.finished:
            return
        rk.feed(event)
        self.settle(rk)

    async def round_ran(self, event: Any, store: Any) -> None:
        """A tool round ran and its rows are committed, while their ``AFTER_BROADCAST`` may
        still be on its way: take them from the store now, before the next model call."""
        call_ids = {str(call.id) for call in event.calls}
        with self.lock:
            rk = next((t for t in self.open if t.room_id == event.room_id and t.ran(call_ids)), None)
        if rk is None or rk.correlation_id is None or rk.finished:
            return
        rows = await store.list_events(
            rk.room_id,
            limit=10_000,
            # roomkit's enums are enum.StrEnum (Python 3.11+, as roomkit is): checked against
            # 3.10 pyright sees them as plain str
            event_filter=EventFilter(correlation_id=rk.correlation_id, event_types=list(_ROW_TYPES)),  # pyright: ignore[reportArgumentType]
        )
        for row in rows:
            if row.source.channel_id == rk.channel_id:
                rk.feed(row)

    def _of_row(self, event: Any) -> RoomKitTurn | None:
        correlation_id = event.correlation_id
        with self.lock:
            rk = self.by_correlation.get(correlation_id) if correlation_id else None
            if rk is not None:
                return rk
            # a turn whose id was not learned before its loop: its first row names it
            channel_id = event.source.channel_id
            mates = [t for t in self.open if t.room_id == event.room_id and t.channel_id == channel_id]
            # one not named yet, else one named wrongly (a stale name): no row of it came yet
            rk = next((t for t in mates if t.correlation_id is None), None) or next(
                (t for t in mates if not (t.messages or t.starts or t.ends)), None
            )
            if rk is not None and correlation_id:
                if rk.correlation_id is not None and self.by_correlation.get(rk.correlation_id) is rk:
                    del self.by_correlation[rk.correlation_id]
                rk.correlate(correlation_id)
                self.by_correlation[correlation_id] = rk
            return rk

    def response(self, event: Any) -> None:
        with self.lock:
            waiting = [t for t in self.open if t.response is None and t.room_id == event.room_id and t.channel_id == event.channel_id]
        # the loop ended right before its ON_AI_RESPONSE: the oldest such turn is its
        rk = next((t for t in waiting if t.loop_status is not None), waiting[0] if waiting else None)
        if rk is None:
            return
        rk.take_response(event)
        self.settle(rk)

    # -- ending ----------------------------------------------------------------------------

    def settle(self, rk: RoomKitTurn) -> None:
        """End the turn once all is said, or after a grace period once its loop ended."""
        if rk.finished:
            return
        if rk.ready():
            self.finish(rk)
        elif rk.loop_status is not None or rk.response is not None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                self.finish(rk)
                return
            rk.schedule(loop, lambda: self._finish_guarded(rk))

    @guarded("roomkit turn end")
    def _finish_guarded(self, rk: RoomKitTurn) -> None:
        self.finish(rk)

    def finish(self, rk: RoomKitTurn) -> None:
        with self.lock:
            if rk in self.open:
                self.open.remove(rk)
            if rk.correlation_id is not None and self.by_correlation.get(rk.correlation_id) is rk:
                del self.by_correlation[rk.correlation_id]
            for spans in (self.by_span, self.by_tool_span):
                for key in [k for k, t in spans.items() if t is rk]:
                    del spans[key]
        rk.finish()

    def close_all(self) -> None:
        """End every turn still open (at shutdown, and when the adapter is turned off)."""
        with self.lock:
            turns = list(self.open)
        for rk in turns:
            self.finish(rk)


turns = _Turns()
pipeline.on_shutdown(turns.close_all)
atexit.register(turns.close_all)  # registered after the writer's: runs before it, so these turns are stored


# -- the telemetry provider ------------------------------------------------------------------


class LoopscopeTelemetry(TelemetryProvider):
    """A RoomKit telemetry provider that passes every call on to ``inner`` and reports
    the turns' loops, generations and tool runs to loopscope.

    The spans loopscope follows get ids of their own (RoomKit's no-op provider gives every
    span the same empty id); calls naming them reach ``inner`` with its ids.
    """

    _OWN = frozenset({"_inner", "_ids"})
    _FOLLOWED = frozenset({SpanKind.LLM_GENERATE, SpanKind.LLM_TOOL_CALL})

    def __init__(self, inner: TelemetryProvider) -> None:
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_ids", OrderedDict())  # our span id -> inner's, the last 4096

    @property
    def inner(self) -> TelemetryProvider:
        """The provider every call is passed on to."""
        return self._inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self._inner, name, value)  # e.g. the kit's search metadata

    @property
    def name(self) -> str:
        return self._inner.name

    def _theirs(self, span_id: str | None) -> str | None:
        return self._ids.get(span_id, span_id) if span_id else span_id

    def start_span(
        self,
        kind: SpanKind,
        name: str,
        *,
        parent_id: str | None = None,
        attributes: dict[str, Any] | None = None,
        room_id: str | None = None,
        session_id: str | None = None,
        channel_id: str | None = None,
    ) -> str:
        inner_id = self._inner.start_span(
            kind,
            name,
            parent_id=self._theirs(parent_id),
            attributes=attributes,
            room_id=room_id,
            session_id=session_id,
            channel_id=channel_id,
        )
        if not _on or kind not in self._FOLLOWED:
            return inner_id
        span_id = "loopscope-" + os.urandom(8).hex()
        ids = self._ids
        ids[span_id] = inner_id
        if len(ids) > 4096:
            ids.popitem(last=False)
        with guard("roomkit telemetry start"):
            if kind == SpanKind.LLM_GENERATE:
                turns.loop_started(span_id, room_id, channel_id)
            else:
                turns.tool_started(span_id, parent_id, attributes)
        return span_id

    def end_span(
        self,
        span_id: str,
        *,
        status: str = "ok",
        error_message: str | None = None,
        attributes: dict[str, Any] | None = None,
    ) -> None:
        self._inner.end_span(self._theirs(span_id) or span_id, status=status, error_message=error_message, attributes=attributes)
        if span_id in self._ids:
            with guard("roomkit telemetry end"):
                turns.loop_ended(span_id, status, error_message)
                turns.tool_ended(span_id)

    def set_attribute(self, span_id: str, key: str, value: Any) -> None:
        self._inner.set_attribute(self._theirs(span_id) or span_id, key, value)

    def record_metric(self, name: str, value: float, *, unit: str = "", attributes: dict[str, Any] | None = None) -> None:
        self._inner.record_metric(name, value, unit=unit, attributes=attributes)
        if _on and name in _USAGE_METRICS:
            with guard("roomkit telemetry metric"):
                turns.metric(name, value)

    def get_span_context(self, span_id: str) -> Any:
        return self._inner.get_span_context(self._theirs(span_id) or span_id)

    def inject_context(self, span_id: str) -> dict[str, str]:
        return self._inner.inject_context(self._theirs(span_id) or span_id)

    def extract_context(self, carrier: Mapping[str, str]) -> Any:
        return self._inner.extract_context(carrier)

    def flush(self) -> None:
        self._inner.flush()

    def close(self) -> None:
        self._inner.close()

    def reset(self) -> None:
        self._inner.reset()


def _teed(value: Any) -> Any:
    """The ``telemetry`` argument a kit is built with, its provider passed through ours."""
    if isinstance(value, LoopscopeTelemetry):
        return value
    if value is None:
        return LoopscopeTelemetry(NoopTelemetryProvider())
    if isinstance(value, TelemetryProvider):
        return LoopscopeTelemetry(value)
    if isinstance(value, TelemetryConfig) and not isinstance(value.provider, LoopscopeTelemetry):
        return dataclasses.replace(value, provider=LoopscopeTelemetry(value.provider or NoopTelemetryProvider()))
    return value


# -- the hooks -------------------------------------------------------------------------------


@guarded("roomkit row")
async def _rows_hook(event: Any, context: Any) -> None:
    turns.row(event)


@guarded("roomkit ai response")
async def _response_hook(event: Any, context: Any) -> None:
    turns.response(event)


_kits: weakref.WeakKeyDictionary[Any, list[str]] = weakref.WeakKeyDictionary()
"""The kits loopscope's hooks are on, with the names they were registered under."""
_teed_kits: weakref.WeakSet[Any] = weakref.WeakSet()
"""Every kit built with loopscope's telemetry provider: instrumenting again re-attaches them."""


def attach(kit: Any) -> None:
    """Register loopscope's hooks on ``kit`` (once)."""
    if kit in _kits:
        return
    engine = kit.hook_engine
    rows = engine.register(
        HookRegistration(
            trigger=HookTrigger.AFTER_BROADCAST,
            execution=HookExecution.ASYNC,
            fn=_rows_hook,
            name=_HOOK_NAMES[0],
            # enum.StrEnum members, which pyright sees as str when it checks against 3.10
            channel_types={ChannelType.AI},  # pyright: ignore[reportArgumentType]
            event_types=set(_ROW_TYPES),  # pyright: ignore[reportArgumentType]
        )
    )
    response = engine.register(
        HookRegistration(
            trigger=HookTrigger.ON_AI_RESPONSE,
            execution=HookExecution.ASYNC,
            fn=_response_hook,
            name=_HOOK_NAMES[1],
        )
    )
    ref = weakref.ref(kit)

    async def round_hook(event: Any, context: Any) -> HookResult:
        with guard("roomkit tool round"):
            owner = ref()
            if owner is not None:
                await turns.round_ran(event, owner.store)
        return HookResult.allow()

    # a SYNC hook (it only observes): the next model call waits for it, so the round's
    # tool calls end before that call's round is recorded
    round_ = engine.register(
        HookRegistration(
            trigger=HookTrigger.AFTER_TOOL_ROUND,
            execution=HookExecution.SYNC,
            fn=round_hook,
            name=_HOOK_NAMES[2],
            priority=-1000,
        )
    )
    async def input_hook(event: Any, context: Any) -> HookResult:
        with guard("roomkit turn input"):
            turns.generation_requested(event)
        return HookResult.allow()

    # SYNC too (BEFORE_AI_GENERATION has no observers), allowing always: it only reads
    input_ = engine.register(
        HookRegistration(
            trigger=HookTrigger.BEFORE_AI_GENERATION,
            execution=HookExecution.SYNC,
            fn=input_hook,
            name=_HOOK_NAMES[3],
            priority=1000,  # last: it reads the event the other hooks leave
        )
    )
    _kits[kit] = [rows.name, response.name, round_.name, input_.name]


def _reports_itself(execution: ToolExecution) -> bool:
    """Whether a decorated tool starting here is the call RoomKit is running, which this
    adapter records from RoomKit's own rows: the tool of that name, or the channel's
    ``tool_handler`` itself (called with the tool's name first). A tool a handler calls
    under another name is a call of its own, and recorded."""
    if _current_tool_call is None:
        return False
    rk = _current.get()
    call = _current_tool_call()
    if rk is None or rk.finished or call is None:
        return False
    name = rk.tool_name(str(call.tool_call_id))
    if name is None:
        return False
    if execution.name == name:
        return True
    arguments = execution.arguments
    return type(arguments) is dict and next(iter(arguments.values()), None) == name


def _detach_all() -> None:
    global _on
    _on = False
    for kit, names in list(_kits.items()):
        for name in names:
            with guard("roomkit hook removal"):
                kit.hook_engine.remove_global_hook(name)
    _kits.clear()
    turns.close_all()


# -- the patches -----------------------------------------------------------------------------


def _telemetry_index(init: Any) -> int | None:
    """Where ``telemetry`` sits among the constructor's positional arguments (less ``self``)."""
    try:
        params = list(inspect.signature(init).parameters.values())
    except (TypeError, ValueError):
        return None
    for index, param in enumerate(params):
        if param.name == "telemetry":
            return index - 1 if param.kind is param.POSITIONAL_OR_KEYWORD else None
    return None


def patch() -> list[Patch | Registration]:
    """Attach to every RoomKit created from now on; the patches and registrations to undo."""
    global _on
    from roomkit.core.mixins._streaming_segments import SegmentWriter

    index = _telemetry_index(RoomKit.__init__)

    def init_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if _on:
            with guard("roomkit telemetry"):
                if index is not None and len(args) > index:
                    args = (*args[:index], _teed(args[index]), *args[index + 1 :])
                else:
                    kwargs = {**kwargs, "telemetry": _teed(kwargs.get("telemetry"))}
        result = wrapped(*args, **kwargs)
        if _on:
            with guard("roomkit hooks"):
                if isinstance(instance.telemetry, LoopscopeTelemetry):
                    _teed_kits.add(instance)
                attach(instance)
        return result

    def writer_wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = wrapped(*args, **kwargs)
        if _on:
            correlation_id = kwargs.get("correlation_id")
            if isinstance(correlation_id, str):
                _next_correlation.set(correlation_id)
        return result

    patches: list[Patch | Registration] = []
    for owner, name, wrapper in ((RoomKit, "__init__", init_wrapper), (SegmentWriter, "__init__", writer_wrapper)):
        done = wrap(owner, name, wrapper)
        if done is not None:
            patches.append(done)
    patches.append(Registration(_detach_all))
    patches.append(Registration(report_own_tool_calls(_reports_itself)))
    _on = True
    for kit in list(_teed_kits):  # built while an earlier instrument() was on: recorded again
        with guard("roomkit hooks"):
            attach(kit)
    return patches
