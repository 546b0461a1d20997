"""The one door to OpenTelemetry's internals: every private name of ``opentelemetry-sdk``
(and of the API) that loopscope uses is used here, and nowhere else in the package
(tests/test_sdk_door.py checks it).

Why there are any: the SDK's public path costs more than loopscope's per-call budget
(benchmarks/README.md), and two features have no public path at all.

Fast paths (each checked by a probe at import, each with the SDK's public path behind it):

* :func:`set_attributes`: ``Span.set_attributes`` in the SDK passes every value through
  its generic attribute validation (isinstance checks against ``Sequence`` and
  ``Mapping`` ABCs, a new dict, one method call per key) before it stores it. The values
  loopscope sets are plain ``str``, ``bool``, ``int``, ``float`` or tuples of ``str``,
  which that validation keeps as they are; for them the values are stored the very same
  way (same locks, same order: a key set again moves to the end) at a fraction of the
  cost.
* :func:`start_span` and :func:`end_span`: ``Tracer.start_span`` asks the sampler (a few
  Python frames that build a ``SamplingResult``), looks the parent up twice, cleans every
  start attribute and builds the span through four constructors; ``Span.end`` builds a
  ``ReadableSpan`` through its keyword constructor. For a provider whose sampler, id
  generator and span limits are the SDK's defaults (the decision is then known: sample,
  as the parent was), they build the very same ``_Span`` and ``ReadableSpan`` objects
  directly, field by field, and hand them to the provider's span processors exactly as
  the SDK does, so every processor and exporter sees an ordinary SDK span. The probe
  builds one span both ways and compares every field.
* :func:`attach_span` / :func:`detach`: the API's context calls, on its ``ContextVar``.
* :func:`own_encoder`: the SDK's OTLP span exporters (http/protobuf, gRPC) encode a batch
  with ``encode_spans``, which builds a protobuf object per attribute in Python: most of
  what loopscope's export cost (benchmarks/README.md, issue 31). For an exporter loopscope
  made, the method that calls it is given a copy of its module's globals where
  ``encode_spans`` is loopscope's encoder (:mod:`loopscope.export.encoder`, the same bytes:
  tests/export/test_encoder.py); the application's exporters are not touched. The
  switch is read at each batch.
* Reading spans (the store's processor and the span-to-row mapping read a few fields of
  every span): :func:`span_fields`, :func:`attributes_view`, :func:`attribute_values`,
  :func:`scope_name` read the SDK's fields without its properties' Python frames.

An SDK whose objects differ from what is probed here, or any other sampler, id
generator, limits, tracer configuration or attribute value, takes the SDK's own path.
So does everything when ``LOOPSCOPE_SDK_FAST_PATH=0`` is set (read at import) or after
:func:`set_fast_path` ``(False)``: the public path then runs, with the same spans and
rows (tests/test_sdk_door.py compares them).

No public path (these work whatever the switch says, and do nothing on an SDK without
the fields): :func:`span_processors` / :func:`replace_span_processors` (the content
policy wraps the exporting processors an application installed before loopscope),
:func:`exports_spans`, :func:`queued_spans` and :func:`shutdown_batch` (a batch
processor's queue and its bounded shutdown).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar
from itertools import islice
from operator import attrgetter
from random import getrandbits
from time import time_ns
from typing import Any, NamedTuple, cast

from opentelemetry.trace import SpanKind

_logger = logging.getLogger("loopscope")

SWITCH = "LOOPSCOPE_SDK_FAST_PATH"
"""The environment variable that turns the fast paths off (``0``, ``false``, ``no``, ``off``)."""

_SCALARS = frozenset({str, bool, int, float})

# What runs now (set by set_fast_path, at the end of this module): each fast path is on
# when the switch is and its probe passed.
_FAST_SET = False  # set_attributes (and end_span's attributes)
_FAST_SPANS = False  # start_span, end_span
_OWN_ENCODER = False  # own_encoder: loopscope's exporters encode spans with loopscope's encoder
_CONTEXT_VAR: Any = None  # attach_span, detach: the ContextVar behind the API's runtime context
_READ_TYPES: frozenset[type] = frozenset()  # the span classes whose fields are read directly
_READ_BOUNDED: type | None = None  # BoundedAttributes, when its dict is read directly
_READ_SCOPE: type | None = None  # InstrumentationScope, when its name is read directly
_READ_LISTS: frozenset[type] = frozenset()  # BoundedList, when an ended span's events and links are read directly
# What the probes found at import
_PROBED_SET = _PROBED_SPANS = _PROBED_READ = False
_PROBED_CONTEXT_VAR: Any = None
_FIELDS: SpanFields  # span_fields(), made by set_fast_path


def _wanted() -> bool:
    return os.environ.get(SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


def set_fast_path(enabled: bool) -> bool:
    """Turn the fast paths on (each one whose probe passed at import) or off (the SDK's
    public path for everything); returns :func:`fast_path`. ``LOOPSCOPE_SDK_FAST_PATH=0``
    does the same at import. Spans already started keep working either way."""
    global _FAST_SET, _FAST_SPANS, _CONTEXT_VAR, _READ_TYPES, _READ_BOUNDED, _READ_SCOPE, _FIELDS, _OWN_ENCODER, _READ_LISTS
    _FAST_SET = enabled and _PROBED_SET
    _OWN_ENCODER = enabled
    _FAST_SPANS = enabled and _PROBED_SET and _PROBED_SPANS
    _CONTEXT_VAR = _PROBED_CONTEXT_VAR if enabled else None
    read = enabled and _PROBED_READ
    _READ_TYPES = _SDK_SPAN_TYPES if read else frozenset()
    _READ_BOUNDED = _BOUNDED if read else None
    _READ_SCOPE = _SCOPE if read else None
    _READ_LISTS = _LISTS if read else frozenset()
    _FIELDS = SpanFields(_READ_TYPES, _READ_BOUNDED, *_READERS)
    return fast_path()


def fast_path() -> bool:
    """Whether every fast path is on: the switch is, and this SDK's objects are the ones
    the probes expect."""
    return _FAST_SET and _FAST_SPANS and _CONTEXT_VAR is not None and bool(_READ_TYPES) and _OWN_ENCODER


def _clean(attributes: Mapping[str, Any]) -> bool:
    """Whether every value is one the SDK would store unchanged (and no string limit applies)."""
    scalars = _SCALARS
    for value in attributes.values():
        kind = type(value)
        if kind in scalars:
            continue
        if kind is not tuple:
            return False
        for item in value:  # a loop, not all(...): no generator frame
            if type(item) is not str:
                return False
    return True


def _fast_set(span: Any, attributes: Mapping[str, Any]) -> bool:
    """Store ``attributes`` on an SDK span directly; False to leave it to ``set_attributes``."""
    bounded = span._attributes
    if type(bounded) is not _BOUNDED or bounded.max_value_len is not None or bounded._immutable:
        return False
    items = bounded._dict
    maxlen = bounded.maxlen
    if maxlen is not None and len(items) + len(attributes) > maxlen:
        return False  # the SDK drops the oldest keys then, and counts them
    if not _clean(attributes):
        return False
    with span._lock:
        if span._end_time is not None:
            return False  # the SDK warns about this one
        with bounded._lock:
            if not items.keys().isdisjoint(attributes):
                for key in attributes:
                    if key in items:
                        del items[key]  # as the SDK does: a key set again moves to the end
            items.update(attributes)
    return True


def set_attributes(span: Any, attributes: Mapping[str, Any]) -> None:
    """``span.set_attributes(attributes)``, with the same result."""
    if _FAST_SET and type(span) is _SPAN and _fast_set(span, attributes):
        return
    span.set_attributes(attributes)


def start_attributes(span: Any, count: int, mark: Mapping[str, Any]) -> dict[str, Any] | None:
    """The first ``count`` attributes of a span that has not ended (those it started with:
    keys keep their place), with ``mark`` set on it in the same step, from a thread that
    does not own the span; None once it has ended (then nothing is set)."""
    if _FAST_SET and type(span) is _SPAN:
        bounded = span._attributes
        if (type(bounded) is _BOUNDED and bounded.max_value_len is None and not bounded._immutable and _clean(mark)
                and (bounded.maxlen is None or len(bounded._dict) + len(mark) <= bounded.maxlen)):
            with span._lock:  # the span's end() takes it too: it cannot end halfway through
                if span._end_time is not None:
                    return None
                with bounded._lock:
                    items = bounded._dict
                    first = dict(islice(items.items(), count))
                    for key in mark:
                        items.pop(key, None)  # as the SDK does: a key set again moves to the end
                    items.update(mark)
            return first
    if not span.is_recording():
        return None
    first = dict(islice((span.attributes or {}).items(), count))
    span.set_attributes(mark)  # (it may have ended meanwhile: the SDK then says so, and sets nothing)
    return first


_SPAN: type | None = None
_BOUNDED: type | None = None
_SCOPE: type | None = None
_SDK_SPAN_TYPES: frozenset[type] = frozenset()
try:
    from opentelemetry.attributes import BoundedAttributes
    from opentelemetry.sdk.trace import ReadableSpan, Span, TracerProvider, _Span
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    def _probe() -> bool:
        tracer = TracerProvider().get_tracer("loopscope-probe")
        values = {"s": "x", "b": True, "i": 1, "f": 0.5, "t": ("a", "b"), "k": "again"}
        # the SDK's Span (its attributes are a mapping), as the type check below makes sure
        fast = cast(_Span, tracer.start_span("probe", attributes={"k": "first", "z": 0}))
        slow = cast(_Span, tracer.start_span("probe", attributes={"k": "first", "z": 0}))
        if type(fast) is not _Span or type(fast._attributes) is not BoundedAttributes:
            return False
        global _SPAN, _BOUNDED
        _SPAN, _BOUNDED = _Span, BoundedAttributes
        ok = _fast_set(fast, values)
        slow.set_attributes(values)
        # ReadableSpan.attributes is never None (a MappingProxyType of the span's, or of {}):
        # its annotation is the wider Attributes, hence the `or {}`, which changes nothing
        same = ok and list((fast.attributes or {}).items()) == list((slow.attributes or {}).items())
        fast.end()
        slow.end()
        return same and _fast_set(fast, {"late": 1}) is False and "late" not in (fast.attributes or {})

    _PROBED_SET = _probe()
    if not _PROBED_SET:
        _SPAN = _BOUNDED = None
    else:
        _SCOPE = InstrumentationScope
        _SDK_SPAN_TYPES = frozenset({ReadableSpan, Span, _Span})
except Exception:  # another SDK: always its own path
    _SPAN = _BOUNDED = None


# -- starting and ending loopscope's own spans -------------------------------------------


CLIENT = SpanKind.CLIENT
"""The kind of a span that calls a service in another process (a model call over HTTP)."""


def start_span(
    tracer: Any,
    name: str,
    context: Any = None,
    attributes: Mapping[str, Any] | None = None,
    start_time: int | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
) -> Any:
    """``tracer.start_span(name, context=context, kind=kind, attributes=attributes, start_time=start_time)``,
    with the same result (see the module's docstring). A plain dict of ``attributes`` becomes
    the span's own (the SDK would copy it): the caller does not use it afterwards."""
    if _FAST_SPANS and type(tracer) is _TRACER:
        span = _fast_start(tracer, name, context, attributes, start_time, kind)
        if span is not None:
            return span
    return tracer.start_span(name, context=context, kind=kind, attributes=attributes, start_time=start_time)


def end_span(span: Any, end_time: int | None = None, attributes: Mapping[str, Any] | None = None) -> None:
    """``span.set_attributes(attributes)`` (when given) then ``span.end(end_time=end_time)``,
    with the same result: for loopscope's spans, under one hold of the span's lock."""
    if _FAST_SPANS and type(span) is _SPAN and _fast_end(span, end_time, attributes):
        return
    if attributes:
        set_attributes(span, attributes)
    span.end(end_time=end_time)


def _fast_start(
    tracer: Any, name: str, context: Any, attributes: Mapping[str, Any] | None, start_time: int | None,
    kind: SpanKind = SpanKind.INTERNAL,
) -> Any:
    """The span ``Tracer.start_span`` would make, or None to let it make it."""
    sampler = tracer.sampler
    limits = tracer._span_limits
    if (
        (sampler is not _PARENT_BASED and sampler is not _ALWAYS_ON)
        or type(tracer.id_generator) is not _RANDOM_IDS
        or type(tracer._tracer_metrics) is not _NO_METRICS
        or not tracer._tracer_config.is_enabled
        or type(limits) is not _LIMITS
        or limits.max_span_attribute_length is not None
    ):
        return None
    max_attributes = limits.max_span_attributes
    if attributes:
        if (max_attributes is not None and len(attributes) > max_attributes) or not _clean(attributes):
            return None
        values = attributes if type(attributes) is dict else dict(attributes)
    else:
        values = {}
    # get_current_span(context).get_span_context(), for an SDK span without the frames (and
    # the ABC isinstance check) of get_current_span, get_value and the typing.cast it returns
    current: Any = context.get(_SPAN_KEY) if context is not None else None
    if type(current) is _SPAN:
        parent = current._context
    else:
        parent = _get_span(context).get_span_context()
    if parent is not None and type(parent) is not _SPAN_CONTEXT:
        return None  # the SDK raises for that one
    if parent is None or not parent[5]:  # no valid parent: a root span (the root sampler is ALWAYS_ON)
        parent = None
        trace_id = getrandbits(128) or getrandbits(128) or 1
        trace_state = _DEFAULT_TRACE_STATE
        flags = _SAMPLED_RANDOM
    else:
        parent_flags = parent[3]
        if not parent_flags & 1 and sampler is _PARENT_BASED:
            return None  # not sampled: the SDK makes a non-recording span
        trace_id = parent[0]
        trace_state = parent[4]
        flags = _SAMPLED_RANDOM if parent_flags & 2 else _SAMPLED
    span_id = getrandbits(64) or getrandbits(64) or 1
    # field by field, as Span.__init__ sets them (the probe checks they are the same);
    # attribute stores, not a __dict__ literal: CPython keeps those inline, far cheaper
    span = _new(_SPAN)
    span._name = name
    span._context = _new_tuple(_SPAN_CONTEXT, (trace_id, span_id, False, flags, trace_state, True))
    span._kind = kind  # the samplers this path takes (always on, parent based) do not look at it
    span._instrumentation_info = tracer.instrumentation_info
    span._instrumentation_scope = tracer._instrumentation_scope
    span._parent = parent
    span._start_time = start_time if start_time is not None else time_ns()
    span._end_time = None
    # The attributes, events and links share one lock (the SDK makes three): none of their
    # methods takes another's lock while it holds its own, so one cannot deadlock, and the
    # two locks fewer are two objects fewer per span for the garbage collector to look at
    # while the store's queue holds the span.
    shared = _Lock()
    span._attributes = bounded = _new(_BOUNDED)  # BoundedAttributes(max_attributes, values, immutable=False)
    bounded._dict = values
    bounded.maxlen = max_attributes
    bounded.dropped = 0
    bounded.max_value_len = None
    bounded._lock = shared
    bounded._immutable = False
    span._events = events = _new(_BOUNDED_LIST)  # BoundedList(limits.max_events)
    events.dropped = 0
    events._dq = deque((), limits.max_events)  # positional: keyword parsing costs more than the deque
    events._lock = shared
    span._links = links = _new(_BOUNDED_LIST)  # BoundedList(limits.max_links)
    links.dropped = 0
    links._dq = deque((), limits.max_links)
    links._lock = shared
    span._resource = tracer.resource
    span._status = _UNSET_STATUS
    span._sampler = sampler
    span._trace_config = None
    span._record_exception = True
    span._set_status_on_exception = True
    span._span_processor = tracer.span_processor
    span._limits = limits
    span._lock = _Lock()
    span._record_end_metrics = _NOOP
    tracer.span_processor.on_start(span, parent_context=context)
    return span


def _fast_end(span: Any, end_time: int | None, attributes: Mapping[str, Any] | None = None) -> bool:
    """``Span.end`` with the ``ReadableSpan`` built directly, after ``attributes`` stored as
    :func:`_fast_set` does; False to leave both to the SDK."""
    if span._start_time is None or span._end_time is not None:
        return False  # the SDK raises or warns about these
    bounded = span._attributes
    if attributes:
        maxlen = bounded.maxlen
        if (
            type(bounded) is not _BOUNDED
            or bounded.max_value_len is not None
            or bounded._immutable
            or (maxlen is not None and len(bounded._dict) + len(attributes) > maxlen)
            or not _clean(attributes)
        ):
            span.set_attributes(attributes)  # the SDK's cleaning, then the end as below
            attributes = None
    with span._lock:
        if span._end_time is not None:  # ended by another thread meanwhile
            ended = True
        else:
            ended = False
            if attributes:
                items = bounded._dict
                with bounded._lock:
                    if not items.keys().isdisjoint(attributes):
                        for key in attributes:
                            if key in items:
                                del items[key]  # as the SDK does: a key set again moves to the end
                    items.update(attributes)
            span._end_time = end = end_time if end_time is not None else time_ns()
            bounded._immutable = True
    if ended:
        if attributes:
            span.set_attributes(attributes)  # the SDK's warnings, as before
        span.end(end_time=end_time)
        return True
    record_end_metrics = span._record_end_metrics
    if record_end_metrics:
        record_end_metrics()
    processor = span._span_processor
    processor._on_ending(span)
    readable = _new(_READABLE)
    readable._name = span._name
    readable._context = span._context
    readable._kind = span._kind
    readable._instrumentation_info = span._instrumentation_info
    readable._instrumentation_scope = span._instrumentation_scope
    readable._parent = span._parent
    readable._start_time = span._start_time
    readable._end_time = end
    readable._attributes = span._attributes
    # a span that had no events (or links) shares one empty list (as long, never written:
    # a ReadableSpan has no writers and an ended span takes no more): two containers fewer
    # for the collector to look at while the store's queue holds the span, and to promote
    events, links = span._events, span._links
    readable._events = events if events._dq or events.dropped else _empty_list(events._dq.maxlen)
    readable._links = links if links._dq or links.dropped else _empty_list(links._dq.maxlen)
    readable._resource = span._resource
    readable._status = span._status
    processor.on_end(readable)
    return True


_EMPTY_LISTS: dict[int | None, Any] = {}


def _empty_list(maxlen: int | None) -> Any:
    """One shared, empty ``BoundedList(maxlen)`` per limit, made as :func:`_fast_start` makes them."""
    empty = _EMPTY_LISTS.get(maxlen)
    if empty is None:
        empty = _new(_BOUNDED_LIST)
        empty.dropped = 0
        empty._dq = deque((), maxlen)
        empty._lock = _Lock()
        empty = _EMPTY_LISTS.setdefault(maxlen, empty)
    return empty


def attach_span(span: Any) -> object:
    """``context.attach(trace.set_span_in_context(span))``: ``span`` current until :func:`detach`."""
    var = _CONTEXT_VAR
    if var is None:
        return _attach(_set_span_in_context(span))
    # what set_value does, without its three Python frames and with one copy, not two
    new = _Context(var.get())
    _dict_set(new, _SPAN_KEY, span)  # Context refuses item assignment: the dict's own
    return var.set(new)


def detach(token: object) -> None:
    """``context.detach(token)``."""
    var = _CONTEXT_VAR
    if var is None:
        _detach(token)  # type: ignore[arg-type]
        return
    try:
        var.reset(token)  # type: ignore[arg-type]
    except Exception:  # another context's token: the API logs it, as it always did
        _detach(token)  # type: ignore[arg-type]


# typed as taking any class (the stubs want a type[Self]): the classes it builds from are
# set once the probes pass, and the fields it stores are the SDK's private ones
_new: Callable[[Any], Any] = object.__new__
_dict_set = dict.__setitem__
_new_tuple = tuple.__new__
_Lock = threading.Lock
try:
    from opentelemetry import context as _context_api
    from opentelemetry.context import Context as _Context
    from opentelemetry.context import attach as _attach
    from opentelemetry.context import detach as _detach
    from opentelemetry.context.contextvars_context import ContextVarsRuntimeContext
    from opentelemetry.trace import set_span_in_context as _set_span_in_context
    from opentelemetry.trace.propagation import _SPAN_KEY

    _runtime = getattr(_context_api, "_RUNTIME_CONTEXT", None)
    if type(_runtime) is ContextVarsRuntimeContext and type(getattr(_runtime, "_current_context", None)) is ContextVar:
        _PROBED_CONTEXT_VAR = _runtime._current_context
except Exception:  # another API: its own functions
    from opentelemetry.context import attach as _attach
    from opentelemetry.context import detach as _detach
    from opentelemetry.trace import set_span_in_context as _set_span_in_context
try:
    import inspect

    from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, SpanProcessor, SynchronousMultiSpanProcessor, Tracer
    from opentelemetry.sdk.trace import sampling as _sampling
    from opentelemetry.sdk.trace._tracer_metrics import NoOpTracerMetrics, noop
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
    from opentelemetry.sdk.util import BoundedList
    from opentelemetry.trace import SpanContext, TraceFlags, get_current_span
    from opentelemetry.trace.span import DEFAULT_TRACE_STATE

    _TRACER, _SPAN_CONTEXT, _READABLE, _BOUNDED_LIST, _LIMITS = Tracer, SpanContext, ReadableSpan, BoundedList, SpanLimits
    _PARENT_BASED, _ALWAYS_ON = _sampling.DEFAULT_ON, _sampling.ALWAYS_ON
    _RANDOM_IDS, _NO_METRICS, _NOOP = RandomIdGenerator, NoOpTracerMetrics, noop
    _DEFAULT_TRACE_STATE = DEFAULT_TRACE_STATE
    _SAMPLED = TraceFlags(TraceFlags.SAMPLED)
    _SAMPLED_RANDOM = TraceFlags(TraceFlags.SAMPLED | TraceFlags.RANDOM_TRACE_ID)
    _UNSET_STATUS = inspect.signature(ReadableSpan.__init__).parameters["status"].default
    _get_span = get_current_span

    def _same(fast: Any, slow: Any, skip: frozenset[str]) -> bool:
        """Every field of ``fast`` is the one the SDK set on ``slow`` (ids, times and locks aside)."""
        mine, theirs = vars(fast), vars(slow)
        if list(mine) != list(theirs) and set(mine) != set(theirs):
            return False
        for key, value in theirs.items():
            other = mine[key]
            if type(other) is not type(value):
                return False
            if key in skip:
                continue
            if isinstance(value, (BoundedAttributes, BoundedList)):
                if vars(value).keys() != vars(other).keys():
                    return False
                if isinstance(value, BoundedList):
                    # BoundedList's private deque: its maxlen is the limit
                    dq, other_dq = value._dq, other._dq  # pyright: ignore[reportAttributeAccessIssue]
                    if dq.maxlen != other_dq.maxlen or list(value) != list(other) or value.dropped != other.dropped:
                        return False
                elif list(value.items()) != list(other.items()) or any(
                    getattr(value, k) != getattr(other, k) for k in ("maxlen", "dropped", "max_value_len", "_immutable")
                ):
                    return False
            elif other is not value and other != value:
                return False
        return True

    def _probe_spans() -> bool:
        seen: list[tuple[str, Any, Any]] = []

        class _Seen(SpanProcessor):
            def on_start(self, span: Any, parent_context: Any = None) -> None:
                seen.append(("start", span, parent_context))

            def _on_ending(self, span: Any) -> None:
                seen.append(("ending", span, None))

            def on_end(self, span: Any) -> None:
                seen.append(("end", span, None))

        provider = TracerProvider(shutdown_on_exit=False)
        if type(provider._active_span_processor) is not SynchronousMultiSpanProcessor:
            return False
        provider.add_span_processor(_Seen())  # type: ignore[arg-type]
        tracer = cast(Tracer, provider.get_tracer("loopscope-probe", "1"))  # the SDK's, typed as the API's
        if tracer.sampler is not _PARENT_BASED:
            return False  # OTEL_TRACES_SAMPLER set: nothing to compare with here
        from opentelemetry import trace

        attributes = {"s": "x", "b": True, "i": 1, "f": 0.5, "t": ("a", "b")}
        ok = True
        for parent_of in (None, "span"):
            root = tracer.start_span("root") if parent_of else None
            context = trace.set_span_in_context(root) if root is not None else None
            seen.clear()
            slow = tracer.start_span("probe", context=context, attributes=attributes, start_time=5)
            fast = _fast_start(tracer, "probe", context, attributes, 5)
            if fast is None or [(k, p) for k, _, p in seen] != [("start", context), ("start", context)]:
                return False
            ok = ok and seen[1][1] is fast and _same(fast, slow, frozenset({"_context", "_lock"}))
            sc, fc = slow.get_span_context(), fast.get_span_context()
            ok = ok and tuple(sc)[2:] == tuple(fc)[2:] and (parent_of is None or sc.trace_id == fc.trace_id)
            seen.clear()
            slow.end(end_time=9)
            if not _fast_end(fast, 9) or [k for k, _, _ in seen] != ["ending", "end", "ending", "end"]:
                return False
            ok = ok and seen[2][1] is fast and type(seen[3][1]) is ReadableSpan
            ok = ok and _same(seen[3][1], seen[1][1], frozenset({"_context"})) and _same(fast, slow, frozenset({"_context", "_lock"}))
            if root is not None:
                root.end()
        return ok

    _PROBED_SPANS = _SPAN is not None and _probe_spans()
except Exception:  # another SDK: always its own path
    _PROBED_SPANS = False


# -- reading spans --------------------------------------------------------------------------
# The store's processor reads a few attributes of every span twice (start and end) in the
# application's thread, and the mapping reads a few fields of every span in the writer's:
# the SDK's properties cost a Python frame each (and ``attributes`` wraps a new proxy).


class SpanFields(NamedTuple):
    """Readers of an SDK span's fields for a loop over many spans, C-level
    (``operator.attrgetter``: no Python frame). Use them only on a span whose type is in
    ``types`` (empty while the fast path is off: read the public properties then), and
    :attr:`bounded_dict` only on an attributes object whose type is ``bounded``."""

    types: frozenset[type]
    bounded: type | None
    attributes: Callable[[Any], Any]  # the span's attributes object (BoundedAttributes, a dict or None)
    bounded_dict: Callable[[Any], dict[str, Any]]  # BoundedAttributes -> its dict, read only
    context: Callable[[Any], Any]  # the SpanContext (a tuple: trace id, span id, ...)
    start_time: Callable[[Any], Any]
    end_time: Callable[[Any], Any]


_READERS = (
    attrgetter("_attributes"), attrgetter("_dict"), attrgetter("_context"), attrgetter("_start_time"),
    attrgetter("_end_time"),
)


def span_fields() -> SpanFields:
    """The readers of :class:`SpanFields`, for the fast path as it is now."""
    return _FIELDS


def attributes_dict(attributes: Any) -> dict[str, Any] | None:
    """The dict inside an SDK ``BoundedAttributes`` (read only: reads of a dict are atomic);
    None for anything else, or while the fast path is off."""
    return attributes._dict if type(attributes) is _READ_BOUNDED else None  # type: ignore[no-any-return]


def attributes_view(span: Any) -> Mapping[str, Any]:
    """A span's attributes, to read a few keys and let go (not to keep, not to change): an
    SDK span's own dict (reads of a dict are atomic), else a copy."""
    bounded = getattr(span, "_attributes", None) if _READ_BOUNDED is not None else None
    if type(bounded) is _READ_BOUNDED:
        return bounded._dict  # type: ignore[union-attr, no-any-return]
    return span.attributes.copy()  # type: ignore[no-any-return]


def attribute_values(span: Any) -> Iterable[Any] | None:
    """The values of an SDK span's attributes (read only); None for a span that is not the SDK's."""
    if _READ_BOUNDED is not None:
        try:
            attributes = span._attributes
            return attributes._dict.values() if type(attributes) is _READ_BOUNDED else attributes.values()  # type: ignore[no-any-return]
        except AttributeError:
            return None
    if not isinstance(span, _PUBLIC_SPAN_TYPES):
        return None
    attributes = span.attributes
    return attributes.values() if attributes is not None else None


def span_attributes(span: Any) -> Mapping[str, Any] | None:
    """An ended span's attributes, to read them all once (not to keep, not to change): the
    dict inside an SDK span's ``BoundedAttributes`` or a plain dict it was given (the
    public view iterates in Python frames, two a key), else its public ``attributes``."""
    if type(span) in _READ_TYPES:
        attributes = span._attributes
        kind = type(attributes)
        if kind is _READ_BOUNDED:
            return attributes._dict  # type: ignore[no-any-return]
        if kind is dict:
            return attributes  # type: ignore[no-any-return]
    return span.attributes  # type: ignore[no-any-return]


_RECORD = attrgetter("_context", "_parent", "_name", "_kind", "_start_time", "_end_time", "_attributes", "_events", "_links", "_status")


def span_record(span: Any) -> tuple[Any, ...]:
    """An ended span's fields for an encoder, in one call: ``(context, parent, name, kind,
    start_time, end_time, attributes, dropped_attributes, events, dropped_events, links,
    dropped_links, status)``, the attributes a mapping and the events and links iterables,
    all read only. An SDK span's are read from its fields (its properties cost a Python
    frame each, and ``events`` / ``links`` build a tuple through a generator); any other
    span's, or any span's while the fast path is off, from its public properties."""
    if type(span) in _READ_TYPES:
        context, parent, name, kind, start, end, attributes, events, links, status = _RECORD(span)
        lists = _READ_LISTS
        kind_of = type(attributes)
        if kind_of is _READ_BOUNDED:
            dropped_attributes, attributes = attributes.dropped, attributes._dict
        elif kind_of is dict:
            dropped_attributes = 0
        else:
            dropped_attributes, attributes = span.dropped_attributes, span.attributes
        if type(events) is tuple:
            dropped_events = 0
        elif type(events) in lists:
            dropped_events, events = events.dropped, events._dq  # an ended span's: no one adds to it
        else:
            dropped_events, events = span.dropped_events, span.events
        if type(links) is tuple:
            dropped_links = 0
        elif type(links) in lists:
            dropped_links, links = links.dropped, links._dq
        else:
            dropped_links, links = span.dropped_links, span.links
        return (context, parent, name, kind, start, end, attributes, dropped_attributes, events, dropped_events, links,
                dropped_links, status)
    return (span.context, span.parent, span.name, span.kind, span.start_time, span.end_time, span.attributes,
            span.dropped_attributes, span.events, span.dropped_events, span.links, span.dropped_links, span.status)


def attributes_if_from(span: Any, scope_name: str) -> Mapping[str, Any] | None:
    """:func:`attributes_view` of a span made under the instrumentation scope ``scope_name``,
    None for any other span: both reads in one call, since the store's processor asks
    them of every span twice (at its start and at its end), on the application's thread."""
    if type(span) in _READ_TYPES:
        scope = span._instrumentation_scope
        if scope is None or (scope._name if type(scope) is _READ_SCOPE else scope.name) != scope_name:
            return None
        bounded = span._attributes
        if type(bounded) is _READ_BOUNDED:
            return bounded._dict  # type: ignore[no-any-return]
        return span.attributes.copy()  # type: ignore[no-any-return]
    scope = span.instrumentation_scope
    if scope is None or scope.name != scope_name:
        return None
    return span.attributes.copy()  # type: ignore[no-any-return]


def scope_name(span: Any) -> str | None:
    """The name of the instrumentation scope that made ``span`` (None without one)."""
    scope = span._instrumentation_scope if type(span) in _READ_TYPES else span.instrumentation_scope
    if scope is None:
        return None
    return scope._name if type(scope) is _READ_SCOPE else scope.name  # type: ignore[no-any-return]


_PUBLIC_SPAN_TYPES: tuple[type, ...] = ()
_LISTS: frozenset[type] = frozenset()
try:
    from opentelemetry.attributes import BoundedAttributes as _Bounded
    from opentelemetry.sdk.trace import ReadableSpan as _Readable
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope as _Scope

    _PUBLIC_SPAN_TYPES = (_Readable,)

    def _probe_read() -> bool:
        bounded = _Bounded(attributes={"k": "v"})
        scope = _Scope("probe", "1")
        span = _Readable("probe", attributes=bounded, start_time=1, end_time=2, instrumentation_scope=scope)
        readers = SpanFields(_SDK_SPAN_TYPES, _BOUNDED, *_READERS)
        return (
            _BOUNDED is _Bounded
            and readers.bounded_dict(readers.attributes(span)) == {"k": "v"} == span.attributes
            and (readers.start_time(span), readers.end_time(span), readers.context(span)) == (1, 2, None)
            and span._instrumentation_scope is scope is span.instrumentation_scope
            and scope._name == "probe" == scope.name
        )

    _PROBED_READ = bool(_SDK_SPAN_TYPES) and _probe_read()
    if _PROBED_READ:
        from opentelemetry.sdk.util import BoundedList as _List

        _RECORD(_Readable("probe"))  # span_record's fields are there (an AttributeError: the except below)

        _probe_list = _List(2)
        _probe_list.append(1)
        if type(getattr(_probe_list, "_dq", None)) is deque and list(getattr(_probe_list, "_dq", ())) == [1] and _probe_list.dropped == 0:
            _LISTS = frozenset({_List})
except Exception:  # another SDK: its public properties, always right
    _PROBED_READ = False


# -- encoding loopscope's OTLP exports ------------------------------------------------------


class _Encoded:
    """What ``encode_spans`` returns to an exporter loopscope's encoder works for: the request
    already serialized. The HTTP exporter only serializes it; anything else it is asked is
    answered by the decoded request (the same message the SDK would have built)."""

    __slots__ = ("_message", "data")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self._message: Any = None

    def SerializePartialToString(self, **_: Any) -> bytes:
        return self.data

    SerializeToString = SerializePartialToString

    def ByteSize(self) -> int:
        return len(self.data)

    def __getattr__(self, name: str) -> Any:
        if self._message is None:
            self._message = _request_type().FromString(self.data)
        return getattr(self._message, name)


def _request_type() -> Any:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    return ExportTraceServiceRequest


def own_encoder(exporter: Any, encode: Callable[[Any], bytes]) -> bool:
    """Make ``exporter`` (an SDK OTLP span exporter loopscope made, HTTP or gRPC) encode its
    batches with ``encode`` (spans -> ``ExportTraceServiceRequest`` bytes) while the fast
    path is on, with the SDK's ``encode_spans`` while it is off. False (and nothing
    changed) for an exporter whose encoding is not where this SDK version has it."""
    from types import FunctionType, MethodType

    kind = type(exporter)
    module = getattr(kind, "__module__", "")
    if not module.startswith("opentelemetry.exporter.otlp.proto."):
        return False
    grpc = ".grpc." in module
    name = "_translate_data" if grpc else "export"
    method = getattr(kind, name, None)
    if not isinstance(method, FunctionType):
        return False
    code = method.__code__
    sdk_encode = method.__globals__.get("encode_spans")
    if sdk_encode is None or "encode_spans" not in code.co_names or method.__closure__:
        return False
    request_type = _request_type()

    def encode_spans(spans: Any) -> Any:
        if not _OWN_ENCODER:
            return sdk_encode(spans)
        try:
            data = encode(spans)
        except Exception:  # a span it cannot read: the SDK's encoder says what it makes of it
            _logger.debug("loopscope: its OTLP encoder failed; the SDK's encodes this batch", exc_info=True)
            return sdk_encode(spans)
        # gRPC hands the request to its stub, which wants the message itself
        return request_type.FromString(data) if grpc else _Encoded(data)

    own_globals = dict(method.__globals__)
    own_globals["encode_spans"] = encode_spans
    function = FunctionType(code, own_globals, method.__name__, method.__defaults__)
    function.__kwdefaults__ = method.__kwdefaults__
    setattr(exporter, name, MethodType(function, exporter))
    return True


# -- what has no public path ----------------------------------------------------------------


def span_processors(provider: Any) -> tuple[Any, ...] | None:
    """The span processors an SDK ``TracerProvider`` runs, in order; None when it does not say."""
    processors = getattr(getattr(provider, "_active_span_processor", None), "_span_processors", None)
    return processors if isinstance(processors, tuple) else None


def replace_span_processors(provider: Any, processors: tuple[Any, ...]) -> None:
    """Make ``provider`` run ``processors`` instead of those :func:`span_processors` gave."""
    provider._active_span_processor._span_processors = processors


def exports_spans(processor: Any) -> bool:
    """Whether ``processor`` hands spans to an exporter (the SDK's simple and batch
    processors, and those made like them): such spans leave the process."""
    return any(hasattr(processor, name) for name in ("span_exporter", "_exporter", "_batch_processor"))


def queued_spans(processor: Any) -> int | None:
    """How many spans an SDK ``BatchSpanProcessor`` holds, not yet exported (None: unknown)."""
    queue = getattr(getattr(processor, "_batch_processor", None), "_queue", None)
    if queue is None:
        queue = getattr(processor, "queue", None)  # older SDKs (1.30) keep it here, public
    return None if queue is None else len(queue)


def shutdown_batch(processor: Any, timeout_millis: int) -> bool:
    """Shut an SDK ``BatchSpanProcessor`` down giving up after ``timeout_millis`` (its own
    ``shutdown()`` takes no timeout); False when it has no such worker to ask (older SDKs,
    1.30: the caller's ``shutdown()`` then waits for the export, in the pipeline's closing
    thread, which is bounded)."""
    batch = getattr(processor, "_batch_processor", None)
    if batch is None:
        return False
    batch.shutdown(timeout_millis=timeout_millis)
    return True


set_fast_path(_wanted())


__all__ = [
    "SWITCH", "SpanFields", "attach_span", "attribute_values", "attributes_dict", "attributes_view", "detach", "end_span",
    "exports_spans", "fast_path", "own_encoder", "queued_spans", "replace_span_processors", "scope_name", "set_attributes", "set_fast_path",
    "shutdown_batch", "span_attributes", "span_fields", "span_processors", "span_record", "start_attributes", "start_span",
]
