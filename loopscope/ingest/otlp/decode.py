"""Decoding OTLP export requests: protobuf or JSON bodies (gzip or deflate) to checked
:class:`~loopscope.ingest.spans.SpanRecord` objects.

A payload is decoded and checked whole before any of it is used: a bad one raises
:class:`PayloadError` (an HTTP status and a reason). A span with a bad id (an all-zero
trace id, say) is left out of a request that is otherwise good: :class:`Rejected` counts
it, and the collector answers with OTLP's ``partial_success`` (the sender's other spans
are stored; a 400 would lose them all, as exporters do not retry it)."""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ... import _json
from ...semconv import NOTICE_EVENT, NOTICE_SPAN_NAME, OPERATION
from ..spans import Ctx, Scope, SpanEvent, SpanRecord, Status

PROTOBUF = "application/x-protobuf"
JSON = "application/json"

_KINDS = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
_STATUS = ("UNSET", "OK", "ERROR")
_FLAG_HAS_REMOTE, _FLAG_REMOTE = 0x100, 0x200


class PayloadError(Exception):
    """A request the collector refuses: ``status`` is the HTTP status, ``reason`` says why."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class TooManySpans(PayloadError):
    """A traces request of more spans than the collector takes in one (413); ``spans``: how many it carries."""

    def __init__(self, status: int, reason: str, spans: int = 0) -> None:
        super().__init__(status, reason)
        self.spans = spans


# -- decoding --------------------------------------------------------------------------------


def _trace_request() -> Any:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    return ExportTraceServiceRequest()


def decode_protobuf(body: bytes, message: Any = None) -> Any:
    request = message if message is not None else _trace_request()
    try:
        request.ParseFromString(body)
    except Exception as exc:  # google.protobuf.message.DecodeError, and whatever upb raises
        raise PayloadError(400, f"the body is not a valid OTLP protobuf message ({exc or type(exc).__name__})") from None
    return request


_HEX_FIELDS = ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id")


def _ids_to_base64(node: Any, where: str = "") -> None:
    """OTLP/JSON writes trace and span ids as hex; protobuf's JSON mapping wants base64."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _HEX_FIELDS and isinstance(value, str):
                if value == "":
                    continue
                try:
                    raw = bytes.fromhex(value)
                except ValueError:
                    raise PayloadError(400, f"{where}{key} {value[:40]!r} is not hex (OTLP/JSON ids are hex strings)") from None
                node[key] = base64.b64encode(raw).decode()
            elif isinstance(value, (dict, list)):
                _ids_to_base64(value, where)
    elif isinstance(node, list):
        for item in node:
            _ids_to_base64(item, where)


def decode_json(body: bytes, message: Any = None) -> Any:
    from google.protobuf import json_format

    try:
        data = json.loads(body)
    except RecursionError:
        raise PayloadError(400, "the body is JSON nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise PayloadError(400, f"the body is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise PayloadError(400, "the body is not a JSON object (an OTLP export request)")
    request = message if message is not None else _trace_request()
    try:
        _ids_to_base64(data)
        json_format.ParseDict(data, request, ignore_unknown_fields=True)
    except PayloadError:
        raise
    except RecursionError:
        raise PayloadError(400, "the body is JSON nested too deeply for an OTLP export request") from None
    except Exception as exc:  # json_format.ParseError, ValueError, TypeError, whatever else hostile input finds
        reason = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
        raise PayloadError(400, f"the body is not an OTLP export request ({reason})") from None
    return request


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "string_value":
        return v.string_value
    if kind == "int_value":
        return v.int_value
    if kind == "bool_value":
        return v.bool_value
    if kind == "double_value":
        return v.double_value
    if kind == "array_value":
        return tuple(_value(x) for x in v.array_value.values)
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return bytes(v.bytes_value)
    return None


def _attributes(kvs: Iterable[Any]) -> dict[str, Any]:
    out = {}
    for kv in kvs:
        v = kv.value
        kind = v.WhichOneof("value")
        if kind == "string_value":  # the common case, without a call
            out[kv.key] = v.string_value
        else:
            out[kv.key] = _value(v)
    return out


def _bad_id(raw: bytes, size: int, what: str, where: tuple[int, int, int]) -> PayloadError:
    place = "resourceSpans[{}].scopeSpans[{}].spans[{}]".format(*where)
    if len(raw) != size:
        return PayloadError(400, f"{place}: {what} must be {size} bytes, got {len(raw)}")
    return PayloadError(400, f"{place}: {what} is all zeros (an invalid id)")


@dataclass(slots=True)
class Received:
    """One span as received, and what the raw ``spans`` table keeps of it."""

    span: SpanRecord
    resource_json: str
    service: str | None


@dataclass(slots=True)
class Rejected:
    """The spans of a request left out for bad ids: how many, and why the first was."""

    spans: int = 0
    message: str = ""

    def add(self, error: PayloadError) -> None:
        if not self.spans:
            self.message = error.reason
        self.spans += 1

    def reason(self) -> str:
        """The ``error_message`` of the request's partial success."""
        more = f" (and {self.spans - 1} more span{'s' if self.spans > 2 else ''} with bad ids)" if self.spans > 1 else ""
        return f"{self.spans} span{'s' if self.spans > 1 else ''} rejected, the others stored: {self.message}{more}"


def records_of(request: Any) -> list[SpanRecord]:
    """The spans of an export request as :class:`SpanRecord`, checked; in request order."""
    return [r.span for r in received_of(request)]


_UNSET = Status()
_from_bytes = int.from_bytes


def received_of(request: Any, max_spans: int | None = None, rejected: Rejected | None = None) -> list[Received]:
    """The spans of an export request, checked (ids of the right size, not zero); raises
    :class:`PayloadError` for the first bad one, so that nothing of a bad payload is used,
    or with ``rejected``, leaves each bad one out and counts it there (OTLP's partial
    success); raises (413) for a request of more than ``max_spans`` spans, before any is read."""
    if max_spans is not None:
        count = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        if count > max_spans:
            raise TooManySpans(413, f"the request carries {count} spans; this collector takes at most {max_spans} "
                                    "in one request (--max-spans): send them in smaller batches", count)
    out: list[Received] = []
    add = out.append
    for ri, rs in enumerate(request.resource_spans):
        resource = _attributes(rs.resource.attributes)
        resource_json = _json.dumps(resource)
        service = resource.get("service.name")
        service = service if isinstance(service, str) else None
        for si, ss in enumerate(rs.scope_spans):
            scope = Scope(ss.scope.name, ss.scope.version or None)
            for pi, s in enumerate(ss.spans):
                raw_tid, raw_sid, raw_parent = s.trace_id, s.span_id, s.parent_span_id
                tid = _from_bytes(raw_tid, "big")
                sid = _from_bytes(raw_sid, "big")
                bad = None
                if len(raw_tid) != 16 or not tid:
                    bad = _bad_id(raw_tid, 16, "traceId", (ri, si, pi))
                elif len(raw_sid) != 8 or not sid:
                    bad = _bad_id(raw_sid, 8, "spanId", (ri, si, pi))
                elif raw_parent and len(raw_parent) != 8:
                    bad = _bad_id(raw_parent, 8, "parentSpanId", (ri, si, pi))
                if bad is not None:
                    if rejected is None:
                        raise bad
                    rejected.add(bad)
                    continue
                parent = None
                if raw_parent:
                    parent_id = _from_bytes(raw_parent, "big")
                    if parent_id:
                        flags = s.flags
                        parent = Ctx(tid, parent_id, bool(flags & _FLAG_HAS_REMOTE and flags & _FLAG_REMOTE))
                status = s.status
                code, message = status.code, status.message
                span = SpanRecord(
                    s.name,
                    Ctx(tid, sid),
                    parent,
                    s.start_time_unix_nano,
                    s.end_time_unix_nano,
                    _attributes(s.attributes),
                    kind=s.kind,  # OTLP's numbering (0 = UNSPECIFIED), which the raw table names
                    events=[SpanEvent(e.name, e.time_unix_nano, _attributes(e.attributes)) for e in s.events] if len(s.events) else (),
                    links=[
                        {"trace_id": bytes(link.trace_id).hex(), "span_id": bytes(link.span_id).hex(), "attributes": _attributes(link.attributes)}
                        for link in s.links
                    ] if len(s.links) else (),
                    status=Status(int(code), message or None) if code or message else _UNSET,
                    resource=resource,
                    instrumentation_scope=scope,
                )
                add(Received(span, resource_json, service))
    return out


def decode_logs(body: bytes, content_type: str) -> Any:
    """An OTLP logs export request (protobuf or JSON body); :class:`PayloadError` if it is not one."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    return decode_json(body, ExportLogsServiceRequest()) if content_type == JSON else decode_protobuf(body, ExportLogsServiceRequest())


def notices_of(request: Any) -> list[SpanRecord]:
    """The start notices (see :mod:`loopscope.export.notices`) of a logs export request, as
    zero-duration records of the started spans (their own ids, their start attributes);
    other log records and notices with bad ids are left out. Never raises on content."""
    out: list[SpanRecord] = []
    for rl in request.resource_logs:
        resource: dict[str, Any] | None = None
        for sl in rl.scope_logs:
            scope: Scope | None = None
            for record in sl.log_records:
                event = getattr(record, "event_name", "")
                if event and event != NOTICE_EVENT:
                    continue
                attributes = _attributes(record.attributes)
                if not event and attributes.pop("event.name", None) != NOTICE_EVENT:
                    continue
                raw_tid, raw_sid = record.trace_id, record.span_id
                if len(raw_tid) != 16 or len(raw_sid) != 8:
                    continue
                tid, sid = _from_bytes(raw_tid, "big"), _from_bytes(raw_sid, "big")
                if not tid or not sid:
                    continue
                name = attributes.pop(NOTICE_SPAN_NAME, None)
                if resource is None:
                    resource = _attributes(rl.resource.attributes)
                if scope is None:
                    scope = Scope(sl.scope.name, sl.scope.version or None)
                at = record.time_unix_nano or record.observed_time_unix_nano
                out.append(SpanRecord(
                    name if isinstance(name, str) else str(attributes.get(OPERATION) or ""),
                    Ctx(tid, sid), None, at, at, attributes, resource=resource, instrumentation_scope=scope,
                ))
    return out


def _decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """gzip or deflate (zlib-wrapped, or raw as some clients send it), at most ``limit`` bytes out."""
    if encoding in ("gzip", "x-gzip"):
        wbits = 16 + zlib.MAX_WBITS
    elif len(body) >= 2 and (body[0] & 0x0F) == 8 and ((body[0] << 8) | body[1]) % 31 == 0:
        wbits = zlib.MAX_WBITS
    else:
        wbits = -zlib.MAX_WBITS
    decompressor = zlib.decompressobj(wbits)
    too_large = f"the payload is over {limit} bytes once decompressed, the most this collector takes (--max-bytes)"
    try:
        out = decompressor.decompress(body, limit + 1)
        if len(out) > limit or decompressor.unconsumed_tail:
            raise PayloadError(413, too_large)
        out += decompressor.flush()
    except zlib.error as exc:
        raise PayloadError(400, f"the body is not valid {encoding} data ({exc})") from None
    if not decompressor.eof:
        raise PayloadError(400, f"the {encoding} data ends early")
    if len(out) > limit:
        raise PayloadError(413, too_large)
    return out


def _check_other_signal(signal: str, body: bytes, content_type: str) -> None:
    """Metrics and logs are accepted, not stored: a malformed one is still refused."""
    if signal == "metrics":
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest as Request
    else:
        from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest as Request  # type: ignore[assignment]
    if content_type == JSON:
        decode_json(body, Request())
    else:
        decode_protobuf(body, Request())


def parse_fixture(data: Any) -> list[SpanRecord]:
    """OTLP/JSON (hex ids) as records, in document order; for tests and tools."""
    return records_of(decode_json(json.dumps(data).encode()))
