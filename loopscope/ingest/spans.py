"""The span model: a finished span as plain data, whatever recorded or sent it.

OTLP payloads (:mod:`loopscope.ingest.otlp`), other instrumentations' spans rewritten
into loopscope's conventions (:mod:`loopscope.ingest.foreign`) and the spans recovery
rebuilds (:mod:`loopscope.ingest.recovery`) are :class:`SpanRecord` objects, which the
mapping (:mod:`loopscope.ingest.mapping`) reads like any SDK span.
"""

from __future__ import annotations

from typing import Any

OWN_SCOPE = "loopscope"


STATUS_ERROR = 2  # StatusCode.ERROR


class Ctx:
    """A span context: the two ids, as ints."""

    __slots__ = ("is_remote", "span_id", "trace_id")

    def __init__(self, trace_id: int, span_id: int, is_remote: bool = False) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.is_remote = is_remote

    def __repr__(self) -> str:
        return f"Ctx({self.trace_id:032x}, {self.span_id:016x})"


class Status:
    __slots__ = ("description", "status_code")

    def __init__(self, status_code: int = 0, description: str | None = None) -> None:
        self.status_code = status_code
        self.description = description

    @property
    def is_ok(self) -> bool:
        return self.status_code != STATUS_ERROR


class Scope:
    __slots__ = ("name", "version")

    def __init__(self, name: str = "", version: str | None = None) -> None:
        self.name = name
        self.version = version


class SpanEvent:
    __slots__ = ("attributes", "name", "timestamp")

    def __init__(self, name: str, timestamp: int, attributes: dict[str, Any]) -> None:
        self.name = name
        self.timestamp = timestamp
        self.attributes = attributes


class SpanRecord:
    """A finished span as plain data: what OTLP carries, in the shape the mapping reads
    (``.context.trace_id`` / ``.span_id`` as ints, times in ns, ``.attributes`` a dict)."""

    __slots__ = (
        "attributes",
        "context",
        "end_time",
        "events",
        "instrumentation_scope",
        "kind",
        "links",
        "name",
        "parent",
        "resource",
        "start_time",
        "status",
    )

    def __init__(
        self,
        name: str,
        context: Ctx,
        parent: Ctx | None,
        start_time: int,
        end_time: int,
        attributes: dict[str, Any],
        *,
        kind: int = 0,
        events: tuple[SpanEvent, ...] | list[SpanEvent] = (),
        links: tuple[Any, ...] | list[Any] = (),
        status: Status | None = None,
        resource: dict[str, Any] | None = None,
        instrumentation_scope: Scope | None = None,
    ) -> None:
        self.name = name
        self.context = context
        self.parent = parent
        self.kind = kind
        self.start_time = start_time
        self.end_time = end_time
        self.attributes = attributes
        self.events = events
        self.links = links
        self.status = status or Status()
        self.resource = resource or {}
        self.instrumentation_scope = instrumentation_scope or Scope()

    def replace(self, **changes: Any) -> SpanRecord:
        """A copy with some fields changed."""
        copy = SpanRecord.__new__(SpanRecord)
        for slot in SpanRecord.__slots__:
            setattr(copy, slot, changes[slot] if slot in changes else getattr(self, slot))
        return copy

    def __repr__(self) -> str:
        return f"SpanRecord({self.name!r}, {self.context!r})"


def record_of(span: Any) -> SpanRecord:
    """Any span-like object (an SDK ``ReadableSpan``, say) as a :class:`SpanRecord`."""
    if isinstance(span, SpanRecord):
        return span
    ctx = span.context
    parent = getattr(span, "parent", None)
    status = getattr(span, "status", None)
    scope = getattr(span, "instrumentation_scope", None)
    resource = getattr(span, "resource", None)
    return SpanRecord(
        span.name,
        Ctx(ctx.trace_id, ctx.span_id),
        Ctx(parent.trace_id, parent.span_id, bool(getattr(parent, "is_remote", False))) if parent is not None else None,
        span.start_time or 0,
        span.end_time or span.start_time or 0,
        dict(span.attributes or {}),
        events=[SpanEvent(e.name, e.timestamp, dict(e.attributes or {})) for e in (getattr(span, "events", None) or ())],
        status=Status(int(getattr(getattr(status, "status_code", None), "value", 0) or 0), getattr(status, "description", None)),
        resource=dict(getattr(resource, "attributes", None) or {}),
        instrumentation_scope=Scope(getattr(scope, "name", "") or "", getattr(scope, "version", None)),
    )


def is_own(span: Any) -> bool:
    """A span loopscope's recorder made: its rows come from the mapping as they are."""
    scope = getattr(span, "instrumentation_scope", None)
    return getattr(scope, "name", None) == OWN_SCOPE


__all__ = ["OWN_SCOPE", "STATUS_ERROR", "Ctx", "Scope", "SpanEvent", "SpanRecord", "Status", "is_own", "record_of"]
