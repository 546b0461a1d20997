"""loopscope's own OTLP span encoder: an ``ExportTraceServiceRequest``'s bytes written
straight from the spans, the same bytes the OpenTelemetry exporters' ``encode_spans``
serializes to (tests/export/test_encoder.py compares them byte for byte and decoded).

Why: the SDK's encoder builds one protobuf ``KeyValue`` and one ``AnyValue`` object in
Python per attribute, then serializes the tree; with loopscope's ~24 attributes a span it
was the largest part of what export costs (benchmarks/README.md, issue 31). Here each
field is written as bytes at once, and what repeats from span to span is written once and
kept: the resource and scope (a few per process), each attribute key's field, and whole
key/value fields whose value is short (provider, model, operation, token counts...).

Same rules as ``encode_spans``: spans grouped by resource, then by instrumentation scope,
in the order first seen (equal resources and scopes are one group, as dict keys there);
proto3 defaults left out; an attribute whose value cannot be encoded (an int past 64
bits, a string with a lone surrogate, an unknown type) is left out of its span, and
logged once a key, the rest of the span is sent. A batch it cannot encode at all goes
to the SDK's encoder (:func:`loopscope._otel_sdk.own_encoder`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from struct import Struct
from typing import Any

from .._guard import warn_once
from .._otel_sdk import attributes_dict, span_record

_DOUBLE = Struct("<d").pack
_FIXED64 = Struct("<Q").pack
_FIXED32 = Struct("<I").pack
_ONE_BYTE = tuple(bytes((i,)) for i in range(128))
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1

_CACHE_MAX = 4_096
"""Entries each cache holds; past it the cache starts again (values come and go, keys do not)."""
_SHORT = 64
"""Text values up to this many characters have their whole key/value field cached."""


def _varint(n: int) -> bytes:
    """``n`` (>= 0, < 2**64) as a protobuf varint."""
    if n < 128:
        return _ONE_BYTE[n]
    if n < 16_384:
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag, the payload's length, the payload."""
    n = len(payload)
    return tag + (_ONE_BYTE[n] if n < 128 else _varint(n)) + payload


# -- values ---------------------------------------------------------------------------------


def _any_value(value: Any) -> bytes:
    """An ``AnyValue`` message's bytes, as the SDK's ``_encode_value`` makes it; raises for
    a value it refuses too."""
    kind = type(value)
    if kind is str:
        return _field(b"\x0a", value.encode())
    if kind is bool:
        return b"\x10\x01" if value else b"\x10\x00"
    if kind is int:
        return b"\x18" + _int64(value)
    if kind is float:
        return b"\x21" + _DOUBLE(value)
    if kind is tuple or kind is list:
        return _field(b"\x2a", b"".join([_field(b"\x0a", _any_value(item)) for item in value]))
    return _any_value_slow(value)


def _any_value_slow(value: Any) -> bytes:
    # the SDK's order of isinstance checks, for subclasses (an IntEnum is an int, ...)
    if value is None:
        return b""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _field(b"\x0a", str(value).encode())
    if isinstance(value, int):
        return b"\x18" + _int64(int(value))
    if isinstance(value, float):
        return b"\x21" + _DOUBLE(float(value))
    if isinstance(value, bytes):
        return _field(b"\x3a", bytes(value))
    if isinstance(value, Sequence):
        return _field(b"\x2a", b"".join([_field(b"\x0a", _any_value(item)) for item in value]))
    if isinstance(value, Mapping):
        pairs = [_field(b"\x0a", _key(str(k)) + _field(b"\x12", _any_value(v))) for k, v in value.items()]
        return _field(b"\x32", b"".join(pairs))
    raise TypeError(f"Invalid type {type(value)} of value {value}")


def _int64(value: int) -> bytes:
    if value < 0:
        if value < _INT64_MIN:
            raise ValueError(f"{value} is out of range for an int64")
        return _varint(value + (1 << 64))
    if value > _INT64_MAX:
        raise ValueError(f"{value} is out of range for an int64")
    return _varint(value)


class SpanEncoder:
    """Encodes batches of SDK ``ReadableSpan`` objects into ``ExportTraceServiceRequest``
    bytes (:meth:`encode`). One per exporter: its caches are not locked (an exporter's
    ``export`` is called by one thread at a time, the batch processor's)."""

    def __init__(self) -> None:
        self._keys: dict[str, bytes] = {}  # key -> the KeyValue's key field
        # tag -> (key, type, short value) -> the KeyValue field
        self._fields: dict[bytes, dict[tuple[str, type, Any], bytes]] = {}
        # resources and scopes by id, each with the object (so the id stays its) and its group's key and bytes
        self._resources: dict[int, tuple[Any, int, bytes]] = {}
        self._scopes: dict[int, tuple[Any, int, bytes, str | None]] = {}
        self._canonical: dict[Any, Any] = {}  # equal resources / scopes: the first one seen

    # -- attributes

    def _key(self, key: str) -> bytes:
        field = self._keys.get(key)
        if field is None:
            if len(self._keys) >= _CACHE_MAX:
                self._keys.clear()
            field = self._keys[key] = _field(b"\x0a", key.encode())
        return field

    def attributes(self, tag: bytes, attributes: Mapping[str, Any] | None) -> list[bytes]:
        """Each attribute as a ``KeyValue`` field with ``tag`` (the containing message's field)."""
        if not attributes:
            return []
        if type(attributes) is not dict:
            attributes = attributes_dict(attributes) or attributes  # an SDK BoundedAttributes: its dict
        cache = self._fields.get(tag)
        if cache is None:
            cache = self._fields[tag] = {}
        get = cache.get
        out: list[bytes] = []
        append = out.append
        for key, value in attributes.items():
            kind = type(value)
            if kind is str:
                if len(value) > _SHORT:
                    field = self._field(tag, key, value)
                    if field is not None:
                        append(field)
                    continue
            elif kind is not int and kind is not bool:
                field = self._field(tag, key, value)
                if field is not None:
                    append(field)
                continue
            # a short text, an int, a bool: the whole field is kept
            slot = (key, kind, value)
            field = get(slot)
            if field is None:
                field = self._field(tag, key, value)
                if field is None:
                    continue
                if len(cache) >= _CACHE_MAX:
                    cache.clear()
                cache[slot] = field
            append(field)
        return out

    def _field(self, tag: bytes, key: str, value: Any) -> bytes | None:
        """A ``KeyValue`` field; None (and logged, as the SDK does) for a value it refuses."""
        try:
            return _field(tag, self._key(key) + _field(b"\x12", _any_value(value)))
        except Exception as error:  # the SDK's encoder logs each one; once a key is enough
            warn_once(f"otlp-attribute:{key}", "loopscope: OTLP export leaves out attribute %s: %s", key, error)
            return None

    # -- resources and scopes

    def _forget_groups(self) -> None:
        """Start the resource and scope caches again (all of them: a group is an id in them)."""
        self._resources.clear()
        self._scopes.clear()
        self._canonical.clear()

    def _resource(self, resource: Any) -> tuple[int, bytes]:
        """A resource's group (the id of the first equal one seen) and its field."""
        entry = self._resources.get(id(resource))
        if entry is None or entry[0] is not resource:
            if len(self._resources) >= 256:
                self._forget_groups()
            group = self._canonical.setdefault(("resource", resource), resource)
            encoded = _field(b"\x0a", b"".join(self.attributes(b"\x0a", resource.attributes)))
            entry = self._resources[id(resource)] = (resource, id(group), encoded)
        return entry[1], entry[2]

    def _scope(self, scope: Any) -> tuple[int, bytes, str | None]:
        """A scope's group (the id of the first equal one seen), its field, its schema URL."""
        entry = self._scopes.get(id(scope))
        if entry is None or entry[0] is not scope:
            if len(self._scopes) >= 256:
                self._forget_groups()
            parts = []
            schema_url = None
            if scope is not None:
                if scope.name:
                    parts.append(_field(b"\x0a", scope.name.encode()))
                if scope.version:
                    parts.append(_field(b"\x12", scope.version.encode()))
                parts.extend(self.attributes(b"\x1a", scope.attributes))
                schema_url = scope.schema_url
            group = self._canonical.setdefault(("scope", scope), scope)
            entry = self._scopes[id(scope)] = (scope, id(group), _field(b"\x0a", b"".join(parts)), schema_url)
        return entry[1], entry[2], entry[3]

    # -- spans

    def span(self, span: Any) -> bytes:
        """One ``Span`` message's body."""
        (context, parent, name, kind, start, end, attributes, dropped_attributes, events, dropped_events, links,
         dropped_links, status) = span_record(span)
        parts = [
            b"\x0a\x10" + context.trace_id.to_bytes(16, "big"),
            b"\x12\x08" + context.span_id.to_bytes(8, "big"),
        ]
        append = parts.append
        trace_state = context.trace_state
        if trace_state is not _NO_TRACE_STATE and trace_state:
            append(_field(b"\x1a", ",".join([f"{k}={v}" for k, v in trace_state.items()]).encode()))
        if parent is not None:
            append(b"\x22\x08" + parent.span_id.to_bytes(8, "big"))
        if name:
            append(_field(b"\x2a", name.encode()))
        append(_KINDS[kind])
        if start:
            append(b"\x39" + _FIXED64(start))
        if end:
            append(b"\x41" + _FIXED64(end))
        if attributes:
            parts.extend(self.attributes(b"\x4a", attributes))
        if dropped_attributes:
            append(b"\x50" + _varint(dropped_attributes))
        for event in events:
            append(_field(b"\x5a", self._event(event)))
        if dropped_events:
            append(b"\x60" + _varint(dropped_events))
        for link in links:
            append(_field(b"\x6a", self._link(link)))
        if dropped_links:
            append(b"\x70" + _varint(dropped_links))
        if status is not None:
            code = status.status_code.value
            description = status.description
            if description:
                body = _field(b"\x12", description.encode())
                if code:
                    body += b"\x18" + _varint(code)
                append(_field(b"\x7a", body))
            else:
                append(_STATUS[code])
        append(_REMOTE_FLAGS if parent is not None and parent.is_remote else _FLAGS)
        return b"".join(parts)

    def _event(self, event: Any) -> bytes:
        parts = []
        if event.timestamp:
            parts.append(b"\x09" + _FIXED64(event.timestamp))
        if event.name:
            parts.append(_field(b"\x12", event.name.encode()))
        parts.extend(self.attributes(b"\x1a", event.attributes))
        if event.dropped_attributes:
            parts.append(b"\x20" + _varint(event.dropped_attributes))
        return b"".join(parts)

    def _link(self, link: Any) -> bytes:
        context = link.context
        parts = [b"\x0a\x10" + context.trace_id.to_bytes(16, "big"), b"\x12\x08" + context.span_id.to_bytes(8, "big")]
        parts.extend(self.attributes(b"\x22", link.attributes))
        if link.dropped_attributes:
            parts.append(b"\x28" + _varint(link.dropped_attributes))
        parts.append(b"\x35" + _FIXED32(0x300 if context.is_remote else 0x100))
        return b"".join(parts)

    def encode(self, spans: Sequence[Any]) -> bytes:
        """The ``ExportTraceServiceRequest`` of ``spans``, serialized."""
        # resource group -> (its field, its schema URL, scope group -> [schema URL, pieces (the scope's field first), their bytes])
        groups: dict[int, tuple[bytes, str, dict[int, list[Any]]]] = {}
        for span in spans:
            resource = span.resource
            resource_key, resource_bytes = self._resource(resource)
            scope_key, scope_bytes, scope_schema = self._scope(span.instrumentation_scope or None)
            body = self.span(span)
            group = groups.get(resource_key)
            if group is None:
                group = groups[resource_key] = (resource_bytes, resource.schema_url, {})
            scoped = group[2].get(scope_key)
            if scoped is None:
                scoped = group[2][scope_key] = [scope_schema, [scope_bytes], len(scope_bytes)]
            n = len(body)
            head = b"\x12" + (_ONE_BYTE[n] if n < 128 else _varint(n))
            pieces = scoped[1]
            pieces.append(head)
            pieces.append(body)
            scoped[2] += len(head) + n
        # the nested messages' lengths are summed, not measured on joined copies: the bytes
        # are joined once, at the end (a batch of 2,048 spans is megabytes)
        out: list[bytes] = []
        for resource_bytes, resource_schema, scopes in groups.values():
            parts = [resource_bytes]
            size = len(resource_bytes)
            for scope_schema, pieces, scope_size in scopes.values():
                if scope_schema:
                    schema = _field(b"\x1a", scope_schema.encode())
                    pieces.append(schema)
                    scope_size += len(schema)
                head = b"\x12" + _varint(scope_size)
                parts.append(head)
                parts.extend(pieces)
                size += len(head) + scope_size
            if resource_schema:
                schema = _field(b"\x1a", resource_schema.encode())
                parts.append(schema)
                size += len(schema)
            out.append(b"\x0a" + _varint(size))
            out.extend(parts)
        return b"".join(out)


def _key(key: str) -> bytes:
    return _field(b"\x0a", key.encode())


_FLAGS = b"\x85\x01" + _FIXED32(0x100)  # field 16, fixed32: SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_REMOTE_FLAGS = b"\x85\x01" + _FIXED32(0x300)  # and SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK


# a status without description, by its code (UNSET, OK, ERROR)
_STATUS = {code: _field(b"\x7a", b"\x18" + _varint(code) if code else b"") for code in range(3)}


def _kinds() -> dict[Any, bytes]:
    from opentelemetry.trace import SpanKind

    # the API's kinds count from INTERNAL = 0, OTLP's from UNSPECIFIED = 0
    return {kind: b"\x30" + _varint(kind.value + 1) for kind in SpanKind}


_KINDS = _kinds()


def _no_trace_state() -> Any:
    from opentelemetry.trace.span import DEFAULT_TRACE_STATE

    return DEFAULT_TRACE_STATE  # empty: the trace state of every span that was given none


_NO_TRACE_STATE = _no_trace_state()
