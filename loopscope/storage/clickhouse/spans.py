"""Finished SDK spans as the rows the Collector's ``clickhouseexporter`` writes into ``otel_traces``:
what the sink (:mod:`.sink`) inserts, so that a store ``loopscope collect`` writes holds what a
Collector would have written for the same spans.

Written from the exporter's documented mapping (its traces insert): one row per ended span;
``Timestamp`` the span's start, ``Duration`` its end less its start in nanoseconds; trace and span
ids in lower-case hex (empty for no parent); ``SpanKind`` and ``StatusCode`` as the proto names
them (``SPAN_KIND_INTERNAL``, ``STATUS_CODE_ERROR``: contrib's ``traceutil.SpanKindStr`` /
``StatusCodeStr``); ``ServiceName`` the resource's ``service.name``; ``ScopeName`` /
``ScopeVersion`` the instrumentation scope's; events and links as the Nested columns' arrays; every
attribute value as text as pdata's ``Value.AsString`` makes it: a string as it is, ``true`` /
``false``, an integer in decimal, a float as Go's JSON encoder writes it (shortest form, exponent
only below 1e-6 or from 1e21), a list (OTLP's array value) as JSON, compact, with ``<``, ``>``,
``&``, U+2028 and U+2029 escaped as Go's encoder does.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

SPAN_KINDS = {0: "SPAN_KIND_INTERNAL", 1: "SPAN_KIND_SERVER", 2: "SPAN_KIND_CLIENT", 3: "SPAN_KIND_PRODUCER",
              4: "SPAN_KIND_CONSUMER"}
"""The SDK's ``SpanKind`` values (INTERNAL is 0 in the Python API) and the exporter's names."""
STATUS_CODES = {0: "STATUS_CODE_UNSET", 1: "STATUS_CODE_OK", 2: "STATUS_CODE_ERROR"}


def go_float(value: float) -> str:
    """A float as Go's ``encoding/json`` (and so pdata's ``AsString``) writes it."""
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    if abs(value) < 1e-6 or abs(value) >= 1e21:
        text = repr(value)  # shortest round trip, as Go's 'e' with precision -1
        mantissa, _, exponent = text.partition("e")
        if "." in mantissa:
            mantissa = mantissa.rstrip("0").rstrip(".")
        sign = "-" if exponent.startswith("-") else "+"
        return f"{mantissa}e{sign}{int(exponent.lstrip('+-'))}"
    text = repr(value)
    if "e" in text:  # Python's repr has an exponent from 1e16 on: Go's 'f' format does not (the same digits)
        text = format(Decimal(text), "f")
    return text.removesuffix(".0")


def _go_json_string(text: str) -> str:
    out = json.dumps(text, ensure_ascii=False)
    return (out.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _go_json(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return go_float(value)
    if isinstance(value, str):
        return _go_json_string(value)
    if isinstance(value, bytes):
        return _go_json_string(base64.b64encode(value).decode())
    if isinstance(value, Mapping):  # Go's encoder sorts a map's keys
        return "{" + ",".join(_go_json_string(str(k)) + ":" + _go_json(v) for k, v in sorted(value.items())) + "}"
    if isinstance(value, Sequence):
        return "[" + ",".join(_go_json(v) for v in value) + "]"
    return "null"


def as_string(value: Any) -> str:
    """pdata's ``Value.AsString`` of an attribute value the Python SDK holds."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return go_float(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return _go_json(value)  # a sequence (OTLP's array value) or a mapping: JSON


def _map(attributes: Mapping[str, Any] | None) -> dict[str, str]:
    return {str(k): as_string(v) for k, v in (attributes or {}).items()}


def _time(ns: int) -> str:
    """A DateTime64(9) in UTC as ClickHouse's text input reads it."""
    seconds, nanos = divmod(ns, 1_000_000_000)
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M:%S") + f".{nanos:09d}"


def _trace_state(state: Any) -> str:
    """A W3C trace state as its header text (empty for none)."""
    return ",".join(f"{k}={v}" for k, v in state.items()) if state else ""


def row_of(span: Any) -> dict[str, Any]:
    """One ``otel_traces`` row (column -> value, Nested columns by their dotted names) of a finished
    SDK span (``ReadableSpan``, or anything with its fields: ingest's spans decoded from OTLP)."""
    ctx = span.context
    parent = span.parent
    status = span.status
    resource = getattr(span.resource, "attributes", span.resource) or {}  # an SDK Resource, or a dict
    scope = span.instrumentation_scope
    events = list(span.events or ())
    links = list(span.links or ())
    return {
        "Timestamp": _time(span.start_time),
        "TraceId": f"{ctx.trace_id:032x}",
        "SpanId": f"{ctx.span_id:016x}",
        "ParentSpanId": f"{parent.span_id:016x}" if parent is not None else "",
        "TraceState": _trace_state(getattr(ctx, "trace_state", None)),
        "SpanName": span.name,
        "SpanKind": SPAN_KINDS.get(getattr(span.kind, "value", span.kind), ""),
        "ServiceName": as_string(resource.get("service.name", "")),
        "ResourceAttributes": _map(resource),
        "ScopeName": scope.name if scope is not None else "",
        "ScopeVersion": (scope.version or "") if scope is not None else "",
        "SpanAttributes": _map(span.attributes),
        "Duration": span.end_time - span.start_time,
        "StatusCode": STATUS_CODES.get(getattr(status.status_code, "value", status.status_code), "") if status else "",
        "StatusMessage": (status.description or "") if status else "",
        "Events.Timestamp": [_time(e.timestamp) for e in events],
        "Events.Name": [e.name for e in events],
        "Events.Attributes": [_map(e.attributes) for e in events],
        "Links.TraceId": [f"{link.context.trace_id:032x}" for link in links],
        "Links.SpanId": [f"{link.context.span_id:016x}" for link in links],
        "Links.TraceState": [_trace_state(getattr(link.context, "trace_state", None)) for link in links],
        "Links.Attributes": [_map(link.attributes) for link in links],
    }


def json_each_row(rows: Iterable[Mapping[str, Any]]) -> str:
    """The rows as ClickHouse's ``JSONEachRow`` input."""
    return "\n".join(json.dumps(row, ensure_ascii=False) for row in rows)


__all__ = ["SPAN_KINDS", "STATUS_CODES", "as_string", "go_float", "json_each_row", "row_of"]
