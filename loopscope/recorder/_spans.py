"""Setting span attributes that are already clean, without the SDK cleaning them again.

``Span.set_attributes`` in the OpenTelemetry SDK passes every value through its generic
attribute validation (isinstance checks against ``Sequence`` and ``Mapping`` ABCs, a new
dict, one method call per key) before it stores it. The values loopscope sets are plain
``str``, ``bool``, ``int``, ``float`` or tuples of ``str``, which that validation keeps
as they are; for them :func:`set_attributes` stores the values the very same way (same
locks, same order: a key set again moves to the end) at a fraction of the cost. Anything
else, or an SDK whose internals are not the ones checked here at import, takes the
SDK's own path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_SCALARS = frozenset({str, bool, int, float})


def _clean(attributes: Mapping[str, Any]) -> bool:
    """Whether every value is one the SDK would store unchanged (and no string limit applies)."""
    scalars = _SCALARS
    for value in attributes.values():
        kind = type(value)
        if kind in scalars:
            continue
        if kind is tuple and all(type(v) is str for v in value):
            continue
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
    if type(span) is _SPAN and _fast_set(span, attributes):
        return
    span.set_attributes(attributes)


_SPAN: type | None = None
_BOUNDED: type | None = None
try:
    from opentelemetry.attributes import BoundedAttributes
    from opentelemetry.sdk.trace import TracerProvider, _Span

    def _probe() -> bool:
        tracer = TracerProvider().get_tracer("loopscope-probe")
        values = {"s": "x", "b": True, "i": 1, "f": 0.5, "t": ("a", "b"), "k": "again"}
        fast = tracer.start_span("probe", attributes={"k": "first", "z": 0})
        slow = tracer.start_span("probe", attributes={"k": "first", "z": 0})
        if type(fast) is not _Span or type(fast._attributes) is not BoundedAttributes:
            return False
        global _SPAN, _BOUNDED
        _SPAN, _BOUNDED = _Span, BoundedAttributes
        ok = _fast_set(fast, values)
        slow.set_attributes(values)
        same = ok and list(fast.attributes.items()) == list(slow.attributes.items())
        fast.end()
        slow.end()
        return same and _fast_set(fast, {"late": 1}) is False and "late" not in fast.attributes

    if not _probe():
        _SPAN = _BOUNDED = None
except Exception:  # another SDK: always its own path
    _SPAN = _BOUNDED = None
