"""``loopscope collect``: an OTLP receiver that writes what it receives into a store.

Processes that export OTLP to it share one DuckDB file (DuckDB admits one writer at a
time): spans arrive over OTLP/HTTP (``POST /v1/traces``, protobuf or JSON bodies, gzip or
deflate) on 127.0.0.1:4318 and over OTLP/gRPC on 127.0.0.1:4317, and become the same
events and turns the in-process store writes, through the same :class:`StoreWriter` and
span-to-row mapping. A request is answered only once its events and turns are in the
file, so an acknowledged payload is stored (the raw copies of its spans follow within
half a second, see :class:`Ingest`).

Order. OTLP carries spans when they end, but loopscope writes a tool call's start row
when the tool starts and a turn's input message when the turn starts. loopscope's own
exporter therefore also sends, when an ``invoke_agent`` or ``execute_tool`` span starts,
a zero-duration *pending* copy of it (``loopscope.pending_for`` = the real span's id;
see :mod:`loopscope.export.otlp`). The collector writes the real span's start rows from
the pending copy, with the real span's ids (so the event ids match), and only the end
rows when the real span arrives. Spans without pending copies (another exporter, another
instrumentation) give both from the ended span.

Other instrumentations' GenAI spans are understood too (:mod:`loopscope.storage.foreign`),
and every span received is also kept as it came in the ``spans`` table.

Bad payloads get a 4xx with a reason and change nothing: a payload is decoded and checked
whole before any of it is written; one that is too large (``max_bytes``, also after
decompression) is refused with 413, a wrong content type with 415, garbage (JSON nested
too deeply too) with 400. Metrics and logs (``/v1/metrics``, ``/v1/logs`` and their gRPC
services) are accepted when well-formed and not stored.

Who may write. A request whose ``Host`` names another machine gets 421 and one whose
``Origin`` names another site 403, so that a web page the user visits cannot write here
by DNS rebinding (the rule is the dashboard's: :class:`loopscope._http.HostRule`). With a
``token``, every request must carry ``Authorization: Bearer <token>`` (gRPC: the
``authorization`` metadata), or gets 401 / ``UNAUTHENTICATED``; a token is what a
collector bound beyond loopback needs, and then any ``Host`` is answered.

Idempotent. A request resent after a crash (the sender never saw the answer) adds no
rows: rows the store holds already are left out by span id (:mod:`.idempotent`), and
within a run the spans of the latest requests are remembered.

Memory. The payloads being decoded, routed and written take at most
``max_queued_bytes`` (counted decompressed) at once: a request that would pass it gets
503 (gRPC ``RESOURCE_EXHAUSTED``), which OTLP senders retry, and is counted
(``stats.busy``). HTTP connections are served by at most ``max_connections`` threads,
and one that sends nothing for ``socket_timeout`` seconds is closed.
"""

from __future__ import annotations

import base64
import collections
import json
import os
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from .. import _json, semconv as a
from .._guard import internal_error, logger
from .._http import BoundedHandler, BoundedHTTPServer, HostRule, token_ok
from ..export.content import ContentPolicy
from . import scrub
from .connection import open_store, resolve
from .idempotent import fresh_spans_sql
from .foreign import AGENT, Assembler, Ctx, Scope, SpanEvent, SpanRecord, Status, classify, is_own
from .schema import migrate
from .writer import StoreWriter

DEFAULT_HOST = "127.0.0.1"
DEFAULT_HTTP_PORT = 4318
DEFAULT_GRPC_PORT = 4317
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_QUEUED_BYTES = 64 * 1024 * 1024
"""Payload bytes (decompressed) held at once, from reading a request to its rows' write."""
DEFAULT_MAX_CONNECTIONS = 64
DEFAULT_SOCKET_TIMEOUT = 15.0
TOKEN_ENV = "LOOPSCOPE_COLLECT_TOKEN"
"""The environment variable ``loopscope collect`` reads its bearer token from."""

PROTOBUF = "application/x-protobuf"
JSON = "application/json"

_STARTS = frozenset({a.OP_INVOKE_AGENT, a.OP_EXECUTE_TOOL})
_KINDS = ("UNSPECIFIED", "INTERNAL", "SERVER", "CLIENT", "PRODUCER", "CONSUMER")
_STATUS = ("UNSET", "OK", "ERROR")
_FLAG_HAS_REMOTE, _FLAG_REMOTE = 0x100, 0x200


class PayloadError(Exception):
    """A request the collector refuses: ``status`` is the HTTP status, ``reason`` says why."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class StoreUnavailable(Exception):
    """The rows could not be written in time (the file is held elsewhere, the disk is full)."""


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


def records_of(request: Any) -> list[SpanRecord]:
    """The spans of an export request as :class:`SpanRecord`, checked; in request order."""
    return [r.span for r in received_of(request)]


_UNSET = Status()
_from_bytes = int.from_bytes


def received_of(request: Any) -> list[Received]:
    """The spans of an export request, checked (ids of the right size, not zero); raises
    :class:`PayloadError` for the first bad one, so that nothing of a bad payload is used."""
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
                if len(raw_tid) != 16 or not tid:
                    raise _bad_id(raw_tid, 16, "traceId", (ri, si, pi))
                if len(raw_sid) != 8 or not sid:
                    raise _bad_id(raw_sid, 8, "spanId", (ri, si, pi))
                parent = None
                if raw_parent:
                    if len(raw_parent) != 8:
                        raise _bad_id(raw_parent, 8, "parentSpanId", (ri, si, pi))
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


# -- the raw spans ---------------------------------------------------------------------------


class _Marker:
    __slots__ = ("done", "ok", "then")

    def __init__(self, then: Callable[[bool], None] | None = None) -> None:
        self.done = threading.Event()
        self.ok = False
        self.then = then  # called with ``ok`` by the writer's thread, once done


class RawSpanWriter:
    """Writes received spans as they came to the ``spans`` table, in batches of whatever
    arrived in ``interval``, off the request threads; :meth:`flush` waits until what was
    queued before it is written. A span the table holds already is left out. Rows that cannot be written are kept and retried (past
    ``max_backlog``, the oldest are dropped and counted). The file must have the schema
    already (:class:`Ingest` sees to it)."""

    def __init__(self, path: str, *, interval: float = 0.5, lock_timeout: float = 2.0, max_backlog: int = 500_000,
                 content: ContentPolicy | None = None) -> None:
        self.path = path
        # secrets are masked in the raw copies too: a sender other than loopscope (or one
        # with capture on and its own policy) sends what it has
        self.scrubber = scrub.scrubber(content or ContentPolicy())
        self.interval = interval
        self.lock_timeout = lock_timeout
        self.max_backlog = max_backlog
        self.dropped = 0
        self._queue: collections.deque[Any] = collections.deque()
        self._wake = threading.Event()
        self._closed = False
        self.written = 0
        self.failed_writes = 0
        self.last_error: str | None = None
        self._backlog: list[tuple[Any, ...]] = []
        self._thread = threading.Thread(target=self._run, name=f"loopscope-raw-spans {path}", daemon=True)
        self._thread.start()

    def submit(self, rows: list[tuple[Any, ...]]) -> None:
        self._queue.append(rows)

    def flush(self, timeout: float | None = 30.0) -> bool:
        return self.wait(self.request_flush(), timeout)

    def request_flush(self) -> _Marker:
        """Ask for a write of what is queued now; :meth:`wait` for the answer."""
        marker = _Marker()
        self._queue.append(marker)
        self._wake.set()
        return marker

    def then(self, callback: Callable[[bool], None]) -> None:
        """Call ``callback(ok)`` once what is queued now is written (ok) or failed to be, at
        the next batch (this does not hasten it)."""
        self._queue.append(_Marker(callback))

    @property
    def idle(self) -> bool:
        """Nothing queued or kept for a retry."""
        return not self._queue and not self._backlog

    @staticmethod
    def wait(marker: _Marker, timeout: float | None = 30.0) -> bool:
        return marker.done.wait(timeout) and marker.ok

    def close(self, timeout: float = 30.0) -> None:
        if self._closed:
            return
        self.flush(timeout)
        self._closed = True
        self._wake.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        backlog = self._backlog
        while True:
            self._wake.wait(self.interval)
            self._wake.clear()
            closing = self._closed
            markers = []
            while self._queue:
                item = self._queue.popleft()
                if type(item) is _Marker:
                    markers.append(item)
                else:
                    backlog.extend(item)
            ok = True
            if backlog:
                try:
                    self._write(backlog)
                    self.written += len(backlog)
                    backlog.clear()
                    self.last_error = None
                except Exception as exc:
                    ok = False
                    self.failed_writes += 1
                    if len(backlog) > self.max_backlog:
                        self.dropped += len(backlog) - self.max_backlog
                        del backlog[: len(backlog) - self.max_backlog]
                    self.last_error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                    logger.warning("loopscope collect: cannot write raw spans to %s (%s); retrying", self.path, self.last_error)
            for marker in markers:
                marker.ok = ok
                marker.done.set()
                if marker.then is not None:
                    try:
                        marker.then(ok)
                    except Exception:
                        internal_error("collector raw spans callback")
            if closing:
                return

    def _write(self, rows: list[tuple[Any, ...]]) -> None:
        import pyarrow as pa

        columns = list(zip(*rows))
        us = pa.timestamp("us", tz="UTC")
        text = pa.string()
        masked = self.scrubber.masked
        table = pa.table(
            [
                pa.array(columns[0], text), pa.array(columns[1], text), pa.array(columns[2], text), pa.array(columns[3], text),
                pa.array(columns[4], text), pa.array(columns[5], us), pa.array(columns[6], us), pa.array(columns[7], pa.float64()),
                pa.array(columns[8], text), masked(pa.array(columns[9], text), "text"), masked(pa.array(columns[10], text)),
                pa.array(columns[11], text), masked(pa.array(columns[12], text)), pa.array(columns[13], text), pa.array(columns[14], text), pa.array(columns[15], text),
                pa.array(columns[16], text), pa.array(columns[17], text), pa.array(columns[18], text), pa.array(columns[19], us),
            ],
            names=list(_RAW_COLUMNS),
        )
        starts = [t for t in columns[5] if t is not None]
        # a span resent after a crash is not kept twice (idempotent.py)
        insert = fresh_spans_sql("_loopscope_raw_spans", ", ".join(_RAW_COLUMNS), min(starts, default=None), max(starts, default=None))
        with open_store(self.path, read_only=False, timeout=self.lock_timeout) as con:
            con.register("_loopscope_raw_spans", table)
            con.execute(insert).fetchall()
            con.unregister("_loopscope_raw_spans")


_RAW_COLUMNS = (
    "trace_id", "span_id", "parent_span_id", "name", "kind", "start_time", "end_time", "duration_ms", "status_code",
    "status_message", "attributes", "resource", "events", "links", "scope_name", "scope_version", "service_name", "role",
    "framework", "received_at",
)


def _raw_row(received: Received, role: str | None, framework: str | None, now_us: int) -> tuple[Any, ...]:
    span = received.span
    kind = span.kind
    return (
        "%032x" % span.context.trace_id,
        "%016x" % span.context.span_id,
        "%016x" % span.parent.span_id if span.parent is not None else None,
        span.name,
        _KINDS[kind] if 0 <= kind < len(_KINDS) else str(kind),
        span.start_time // 1000,
        span.end_time // 1000,
        round((span.end_time - span.start_time) / 1e6, 3),
        _STATUS[span.status.status_code] if 0 <= span.status.status_code < 3 else str(span.status.status_code),
        span.status.description,
        _json.dumps(span.attributes),
        received.resource_json,
        _json.dumps([{"name": e.name, "time_unix_nano": e.timestamp, "attributes": e.attributes} for e in span.events]) if span.events else "[]",
        _json.dumps(span.links) if span.links else "[]",
        span.instrumentation_scope.name or None,
        span.instrumentation_scope.version,
        received.service,
        role,
        framework,
        now_us,
    )


# -- ingest: spans -> rows ------------------------------------------------------------------------


@dataclass
class CollectorStats:
    """What a collector received and refused since it started (printed when it stops)."""

    requests: int = 0
    spans: int = 0
    pending: int = 0
    refused: int = 0  # bad requests (4xx)
    duplicates: int = 0  # spans of a request received again in this run, left out
    unavailable: int = 0  # 503: the store could not be written in time
    busy: int = 0  # 503 / RESOURCE_EXHAUSTED: over max_queued_bytes (the sender retries)
    busy_bytes: int = 0  # the payload bytes of those
    unauthorized: int = 0  # 401: no or a wrong bearer token
    misdirected: int = 0  # 421 / 403: another Host or Origin (DNS rebinding)
    metrics_requests: int = 0
    logs_requests: int = 0


_TRIM_AFTER = 16 * 1024 * 1024


_libc: list[Any] = []


def _malloc_trim() -> None:
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return
    if not _libc:
        try:
            _libc.append(ctypes.CDLL("libc.so.6").malloc_trim)
        except (OSError, AttributeError):  # another C library (musl has no malloc_trim)
            _libc.append(None)
    if _libc[0] is not None:
        _libc[0](0)


class ByteBudget:
    """The payload bytes a collector holds at once. A request takes its share before it is
    read (and more as it turns out larger, decompressed) and gives it back once its rows
    are written; one that finds the budget spent is refused (the sender retries). A
    request whose rows could not be written in time leaves its share *parked*: its spans
    are still queued, so the share comes back only once the writer's queue is empty.
    When nothing is held, any one request is let in (``max_bytes`` bounds it)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"max_queued_bytes must be positive, got {limit}")
        self.limit = limit
        self.used = 0
        self.parked = 0
        self.peak = 0
        self._freed = 0
        self._lock = threading.Lock()

    def take(self, size: int) -> bool:
        with self._lock:
            if self.used and self.used + size > self.limit:
                return False
            self.used += size
            self.peak = max(self.peak, self.used)
            return True

    def give(self, size: int) -> None:
        with self._lock:
            self.used -= size
            self._freed += size

    def trim(self) -> None:
        """Once nothing is held and much was freed, hand the free heap back to the system:
        glibc keeps what large requests' threads freed in their arenas otherwise."""
        with self._lock:
            if self.used or self._freed < _TRIM_AFTER:
                return
            self._freed = 0
        _malloc_trim()

    def park(self, size: int) -> None:
        with self._lock:
            self.parked += size

    def unpark(self) -> None:
        with self._lock:
            self.used -= self.parked
            self.parked = 0


class _Share:
    """One request's bytes of the budget, given back once each of its ``parts`` (its
    events and turns; its raw spans) is written, or parked if one could not be."""

    __slots__ = ("budget", "size", "left", "failed", "_lock")

    def __init__(self, budget: ByteBudget, size: int, parts: int) -> None:
        self.budget, self.size, self.left, self.failed = budget, size, parts, False
        self._lock = threading.Lock()

    def done(self, ok: bool) -> None:
        with self._lock:
            self.left -= 1
            self.failed = self.failed or not ok
            if self.left:
                return
        if self.failed:
            self.budget.park(self.size)
        else:
            self.budget.give(self.size)


class Ingest:
    """Spans in (already decoded and checked), rows out through a :class:`StoreWriter`.

    Thread-safe: requests are routed one at a time (the order of a request's spans is
    the order of their rows), and then wait together for the writer.

    A request returns once its events and turns are in the file. The raw copies of its
    spans (the ``spans`` table) follow within ``flush_interval``, written together with
    those of the requests around it: a file opening per request for them would halve the
    ingest rate. ``raw_wait=True`` waits for them too.
    """

    def __init__(
        self,
        path: str,
        *,
        raw: bool = True,
        max_pending_ids: int = 100_000,
        dedupe_window: int = 200_000,
        raw_wait: bool = False,
        idle_seconds: float = 60.0,
        flush_timeout: float = 30.0,
        flush_interval: float = 0.5,
        lock_timeout: float = 2.0,
        max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES,
    ) -> None:
        self.path = resolve(path)
        self.flush_timeout = flush_timeout
        self.max_pending_ids = max_pending_ids
        self.budget = ByteBudget(max_queued_bytes)
        with open_store(self.path, read_only=False, timeout=max(10.0, lock_timeout)) as con:
            migrate(con)
        self.writer = StoreWriter(self.path, flush_interval=flush_interval, lock_timeout=lock_timeout, skip_stored=True)
        self.raw = (
            RawSpanWriter(self.path, interval=flush_interval, lock_timeout=lock_timeout, content=self.writer.content)
            if raw else None
        )
        self.raw_wait = raw_wait
        self.assembler = Assembler(idle_seconds=idle_seconds)
        self.stats = CollectorStats()
        self._pending: collections.OrderedDict[tuple[int, int], None] = collections.OrderedDict()
        # the spans of the latest requests, so that a retried request (a 503, a client that
        # gave up waiting) is not written twice: a span id is never sent again otherwise
        self.dedupe_window = dedupe_window
        self._seen: set[int] = set()
        self._seen_order: collections.deque[int] = collections.deque()
        self._lock = threading.Lock()
        self._closed = False
        self._ticker = threading.Thread(target=self._tick, name="loopscope-collect-idle", daemon=True)
        self._stop = threading.Event()
        self._ticker.start()

    def ingest(self, received: Sequence[Received], size: int = 0) -> None:
        """Route the spans of one request to the writers, then wait until they are stored.

        ``size``: the bytes the request took from :attr:`budget`; they are given back
        once its rows are written, raw spans included (which may be after this returns).
        Raises :class:`StoreUnavailable` when they could not be written in
        ``flush_timeout`` (they stay queued and are written when the file is free).
        """
        if self._closed:
            self.budget.give(size)
            raise StoreUnavailable("the collector is shutting down")
        try:
            share, raw_marker = self._route_all(received, size)
        except BaseException:
            self.budget.give(size)
            raise
        deadline = time.monotonic() + self.flush_timeout
        ok = self.writer.flush(self.flush_timeout)
        share.done(ok)
        if raw_marker is not None:
            ok = RawSpanWriter.wait(raw_marker, max(0.0, deadline - time.monotonic())) and ok
        if not ok:
            self.stats.unavailable += 1
            stats = self.writer.stats()
            raise StoreUnavailable(
                f"could not write to {self.path} within {self.flush_timeout:g}s "
                f"({stats.last_error or (self.raw.last_error if self.raw else None) or 'busy'}); the spans are kept and written when it is free"
            )

    def _route_all(self, received: Sequence[Received], size: int) -> tuple[_Share, _Marker | None]:
        """Route a request's spans (one request at a time) and queue its raw rows; its share
        of the budget, and the marker to wait for with ``raw_wait``."""
        now_us = int(time.time() * 1e6)
        raw_rows: list[tuple[Any, ...]] = []
        with self._lock:
            self.stats.requests += 1
            self.stats.spans += len(received)
            seen, order = self._seen, self._seen_order
            for item in received:
                ctx = item.span.context
                key = ctx.span_id ^ (ctx.trace_id & 0xFFFFFFFFFFFFFFFF) ^ (ctx.trace_id >> 64)
                if key in seen:
                    self.stats.duplicates += 1
                    continue
                seen.add(key)
                order.append(key)
                if len(order) > self.dedupe_window:
                    seen.discard(order.popleft())
                try:
                    role, framework = self._route(item.span)
                except Exception:
                    internal_error("collector routing")
                    role, framework = None, None
                if role != "pending" and self.raw is not None:
                    raw_rows.append(_raw_row(item, role, framework, now_us))
            raw_marker = None
            share = _Share(self.budget, size, 2 if raw_rows and self.raw is not None else 1)
            if raw_rows and self.raw is not None:
                self.raw.submit(raw_rows)
                self.raw.then(share.done)
                if self.raw_wait:
                    raw_marker = self.raw.request_flush()
        return share, raw_marker

    def _route(self, span: SpanRecord) -> tuple[str | None, str | None]:
        """Submit the rows of one span; returns how it was understood (role, framework)."""
        writer = self.writer
        attrs = span.attributes
        tid, sid = span.context.trace_id, span.context.span_id
        if is_own(span):
            pending_for = attrs.get(a.PENDING_FOR)
            if pending_for is not None:
                self._pending_start(span, pending_for)
                return "pending", "loopscope"
            if a.STATE_KIND in attrs and a.OPERATION not in attrs:  # a state snapshot or delta
                writer.submit_end(span)
                return "state", "loopscope"
            op = attrs.get(a.OPERATION)
            if op in _STARTS:
                key = (tid, sid)
                if key in self._pending:
                    del self._pending[key]
                elif not attrs.get(a.PENDING_SENT) or not self._start_stored(span):
                    writer.submit_start(span)
                writer.submit_end(span)
            elif op == a.OP_CHAT:
                writer.submit_end(span)
            if self.assembler.tracks(tid):
                for kind, row in self.assembler.add(span):
                    writer.submit(kind, row)
            return {a.OP_INVOKE_AGENT: AGENT, a.OP_EXECUTE_TOOL: "tool", a.OP_CHAT: "chat"}.get(op), "loopscope"  # type: ignore[arg-type]
        role, framework = classify(span)
        for kind, row in self.assembler.add(span):
            writer.submit(kind, row)
        return role, framework

    def _pending_start(self, span: SpanRecord, pending_for: Any) -> None:
        try:
            real = int(str(pending_for), 16)
        except ValueError:
            return
        if not 0 < real < (1 << 64):
            return
        key = (span.context.trace_id, real)
        if key in self._pending:
            return  # the same pending copy again (a retried request)
        self._pending[key] = None
        if len(self._pending) > self.max_pending_ids:
            self._pending.popitem(last=False)
        self.stats.pending += 1
        attributes = dict(span.attributes)
        del attributes[a.PENDING_FOR]
        operation = attributes.pop(a.PENDING_OPERATION, None)
        if operation:
            attributes[a.OPERATION] = operation
        self.writer.submit_start(span.replace(context=Ctx(span.context.trace_id, real), parent=None, attributes=attributes))

    def _start_stored(self, span: SpanRecord) -> bool:
        """Whether the start rows of a span whose pending copy was sent are in the store
        already (its pending id was forgotten: the memory of them is bounded)."""
        if not self.writer.flush(self.flush_timeout):
            return False
        prefix = "%032x%016x" % (span.context.trace_id, span.context.span_id)
        try:
            with open_store(self.path, read_only=True, timeout=self.flush_timeout) as con:
                row = con.execute("SELECT count(*) FROM events WHERE id IN (?, ?)", [prefix + "s", prefix + "i"]).fetchone()
        except Exception:
            internal_error("collector start lookup")
            return False
        if row and row[0]:
            return True
        # an agent run whose pending copy had no input text has no start row to find: only
        # the pending copy's arrival would tell, and that is forgotten; its span says the same
        return (span.attributes.get(a.OPERATION) == a.OP_INVOKE_AGENT) and a.TURN_INPUT not in span.attributes

    def _tick(self) -> None:
        every = min(5.0, max(0.05, self.assembler.idle_seconds / 4))
        last = time.monotonic()
        while not self._stop.wait(min(every, 1.0)):
            try:
                if time.monotonic() - last >= every:
                    last = time.monotonic()
                    with self._lock:
                        for kind, row in self.assembler.expire():
                            self.writer.submit(kind, row)
                if self.budget.parked and not self.writer.stats().queued and (self.raw is None or self.raw.idle):
                    self.budget.unpark()  # what could not be written in time is now
                self.budget.trim()
            except Exception:
                internal_error("collector idle traces")

    def close(self, timeout: float = 30.0) -> None:
        """Map what is still held, write everything, stop the writers."""
        if self._closed:
            return
        self._stop.set()
        with self._lock:
            self._closed = True
            for kind, row in self.assembler.drain():
                self.writer.submit(kind, row)
        self.writer.close(timeout)
        if self.raw is not None:
            self.raw.close(timeout)


# -- HTTP ---------------------------------------------------------------------------------------


def _status_body(code: int, message: str, content_type: str) -> tuple[bytes, str]:
    """A google.rpc.Status, as OTLP/HTTP answers failures, in the request's encoding."""
    try:
        from google.rpc import status_pb2

        status = status_pb2.Status(code=code, message=message)
        if content_type == PROTOBUF:
            return status.SerializeToString(), PROTOBUF
    except Exception:  # noqa: S110 - googleapis-common-protos missing: JSON below
        pass
    return json.dumps({"code": code, "message": message}).encode(), JSON


_GRPC_CODES = {  # INVALID_ARGUMENT, UNAUTHENTICATED, PERMISSION_DENIED, NOT_FOUND, ... UNAVAILABLE
    400: 3, 401: 16, 403: 7, 404: 5, 405: 12, 411: 3, 413: 8, 415: 3, 421: 7, 503: 14,
}


class _Busy(Exception):
    """The request would take the collector past ``max_queued_bytes`` by taking ``size`` more."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


class _Server(BoundedHTTPServer):
    def __init__(self, address: tuple[str, int], collector: Collector) -> None:
        self.collector = collector
        super().__init__(address, _Handler, max_connections=collector.max_connections, socket_timeout=collector.socket_timeout)

    def handle_error(self, request: Any, client_address: Any) -> None:
        logger.debug("loopscope collect: request from %s failed", client_address, exc_info=True)


class _Handler(BoundedHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    server_version = "loopscope-collect"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        if self.server.collector.verbose:
            logger.info("loopscope collect: %s %s", self.address_string(), format % args)

    def _admitted(self, answer_type: str, *, token: bool) -> bool:
        """Whether this request may be answered: the bearer token (when the collector has
        one), else a Host addressed to it; and no Origin of another site. Refuses it if not."""
        collector = self.server.collector
        stats = collector.ingest.stats
        if collector.token is not None:  # with a token, any Host: a page cannot know the token
            if token and not token_ok(self.headers.get("Authorization"), collector.token):
                stats.unauthorized += 1
                self._refuse(401, "a bearer token is required (Authorization: Bearer <token>)", answer_type,
                             headers={"WWW-Authenticate": 'Bearer realm="loopscope collect"'}, counted=True)
                return False
            refused = None if collector.host_rule.allows_origin(self.headers.get("Origin")) else (403, "requests from web pages are refused (Origin)")
        else:
            refused = collector.host_rule.refusal(self.headers)
        if refused is not None:
            stats.misdirected += 1
            self._refuse(*refused, answer_type, counted=True)
            return False
        return True

    def do_GET(self) -> None:  # noqa: N802
        if not self._admitted(JSON, token=False):
            return
        if urlsplit(self.path).path in ("/", "/health", "/healthz"):
            self._send(200, b'{"status":"ok"}', JSON)
        else:
            self._fail(404, f"no such path {self.path}; POST OTLP to /v1/traces", JSON)

    def do_POST(self) -> None:  # noqa: N802
        collector = self.server.collector
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if not self._admitted(JSON if content_type == JSON else PROTOBUF, token=True):
            return
        budget = collector.ingest.budget
        held = [0]  # the bytes this request took from the budget (until ingest takes them over)
        try:
            self._post(collector, content_type, budget, held)
        except _Busy as exc:
            collector.ingest.stats.busy += 1
            collector.ingest.stats.busy_bytes += held[0] + exc.size
            self._fail(503, f"the collector holds {budget.limit} bytes of requests already (--max-queued-bytes); retry later",
                       JSON if content_type == JSON else PROTOBUF, close=self.close_connection, retry_after=1)
        finally:
            budget.give(held[0])

    def _post(self, collector: Collector, content_type: str, budget: ByteBudget, held: list[int]) -> None:
        """Answer a POST (the budget's bytes: see :class:`ByteBudget`)."""
        path = urlsplit(self.path).path.rstrip("/")
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        answer_type = JSON if content_type == JSON else PROTOBUF
        signal = {"/v1/traces": "traces", "/v1/metrics": "metrics", "/v1/logs": "logs"}.get(path)
        if signal is None:
            self._refuse(404, f"no such path {path or '/'}; OTLP goes to /v1/traces, /v1/metrics or /v1/logs", answer_type)
            return
        if content_type not in (PROTOBUF, JSON):
            self._refuse(415, f"unsupported content type {content_type or '(none)'!r}; send {PROTOBUF} or {JSON}", JSON)
            return
        encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        if encoding not in ("identity", "", "gzip", "x-gzip", "deflate"):
            self._refuse(415, f"unsupported content encoding {encoding!r}; send gzip, deflate or none", answer_type)
            return

        def take(size: int) -> None:
            if not budget.take(size):
                raise _Busy(size)
            held[0] += size

        try:
            body = self._read_body(collector.max_bytes, take)
            if encoding in ("gzip", "x-gzip", "deflate"):
                body = _decompress(body, encoding, collector.max_bytes)
                take(max(0, len(body) - held[0]))  # decoded, it is this large
            if signal != "traces":
                _check_other_signal(signal, body, content_type)
                if signal == "metrics":
                    collector.ingest.stats.metrics_requests += 1
                else:
                    collector.ingest.stats.logs_requests += 1
                self._send_empty(signal, answer_type)
                return
            request = decode_json(body) if content_type == JSON else decode_protobuf(body)
            del body  # the decoded request replaces it
            received = received_of(request)
            del request  # the spans replace it
        except PayloadError as exc:
            collector.ingest.stats.refused += 1
            self._fail(exc.status, exc.reason, answer_type, close=exc.status in (411, 413))
            return
        size, held[0] = held[0], 0  # given back by ingest, once the rows are written
        try:
            collector.ingest.ingest(received, size)
        except StoreUnavailable as exc:
            self._fail(503, str(exc), answer_type, retry_after=1)
            return
        self._send_empty("traces", answer_type)

    # -- the body --------------------------------------------------------------------------

    def _read_body(self, limit: int, take: Callable[[int], None]) -> bytes:
        """The body, at most ``limit`` bytes; ``take`` gets each size before it is read (and
        raises :class:`_Busy` when the collector holds too much already)."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._read_chunked(limit, take)
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            raise PayloadError(411, "a Content-Length (or chunked transfer encoding) is required")
        try:
            length = int(length_text)
        except ValueError:
            raise PayloadError(400, f"bad Content-Length {length_text!r}") from None
        if length < 0:
            raise PayloadError(400, f"bad Content-Length {length_text!r}")
        if length > limit:
            self._discard(length)
            raise PayloadError(413, f"the payload is {length} bytes; this collector takes at most {limit} (--max-bytes)")
        try:
            take(length)  # before reading: a refused body is never held
        except _Busy:
            if length <= 64 * 1024 * 1024:
                self._discard(length)  # read away, so that the sender reads the 503 and retries
            else:
                self.close_connection = True
            raise
        body = self.rfile.read(length)
        if len(body) != length:
            raise PayloadError(400, f"the body ended after {len(body)} of {length} bytes")
        return body

    def _read_chunked(self, limit: int, take: Callable[[int], None]) -> bytes:
        chunks: list[bytes] = []
        total = 0
        while True:
            line = self.rfile.readline(1024)
            try:
                size = int(line.split(b";")[0].strip(), 16)
            except ValueError:
                raise PayloadError(400, "bad chunked transfer encoding") from None
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(chunks)
            total += size
            if total > limit:
                raise PayloadError(413, f"the payload is over {limit} bytes, the most this collector takes (--max-bytes)")
            try:
                take(size)
            except _Busy:
                self.close_connection = True  # the rest of the body is not read
                raise
            chunk = self.rfile.read(size)
            if len(chunk) != size:
                raise PayloadError(400, "the body ended inside a chunk")
            chunks.append(chunk)
            self.rfile.readline(8)

    def _discard(self, length: int) -> None:
        """Read and drop a refused body (up to 256 MiB), so the client gets to read the
        answer instead of a reset connection."""
        left = min(length, 256 * 1024 * 1024)
        while left > 0:
            got = self.rfile.read(min(left, 1 << 16))
            if not got:
                break
            left -= len(got)

    # -- answers ---------------------------------------------------------------------------

    def _send_empty(self, signal: str, answer_type: str) -> None:
        if answer_type == JSON:
            self._send(200, b"{}", JSON)
        else:
            self._send(200, b"", PROTOBUF)  # an empty Export*ServiceResponse serializes to no bytes

    def _refuse(self, status: int, reason: str, answer_type: str, *, headers: dict[str, str] | None = None,
                counted: bool = False) -> None:
        """Refuse before reading the body: read it away (bounded) or close the connection."""
        if not counted:
            self.server.collector.ingest.stats.refused += 1
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        close = length < 0 or length > 64 * 1024 * 1024 or "chunked" in (self.headers.get("Transfer-Encoding") or "").lower()
        if not close and length:
            self._discard(length)
        self._fail(status, reason, answer_type, close=close, headers=headers)

    def _fail(self, status: int, reason: str, answer_type: str, *, close: bool = False, retry_after: int | None = None,
              headers: dict[str, str] | None = None) -> None:
        body, kind = _status_body(_GRPC_CODES.get(status, 3), reason, answer_type)
        headers = dict(headers or {})
        if retry_after is not None:
            headers["Retry-After"] = str(retry_after)
        if close:
            headers["Connection"] = "close"
            self.close_connection = True
        self._send(status, body, kind, headers)
        if status != 503:
            logger.info("loopscope collect: refused a request from %s: %d %s", self.client_address[0], status, reason)

    def _send(self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            self.wfile.write(body)


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


# -- gRPC ---------------------------------------------------------------------------------------


def _grpc_server(collector: Collector, host: str, port: int) -> tuple[Any, int]:
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    class Traces(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:  # noqa: N802
            ingest = collector.ingest
            size = request.ByteSize()
            if not ingest.budget.take(size):
                ingest.stats.busy += 1
                ingest.stats.busy_bytes += size
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"the collector holds {ingest.budget.limit} bytes of requests already (--max-queued-bytes); retry later")
            try:
                received = received_of(request)
            except PayloadError as exc:
                ingest.budget.give(size)
                ingest.stats.refused += 1
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.reason)
            except BaseException:
                ingest.budget.give(size)
                raise
            del request  # the spans replace it
            try:
                ingest.ingest(received, size)  # gives the bytes back once the rows are written
            except StoreUnavailable as exc:
                context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            return trace_service_pb2.ExportTraceServiceResponse()

    class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:  # noqa: N802
            collector.ingest.stats.metrics_requests += 1
            return metrics_service_pb2.ExportMetricsServiceResponse()

    class Logs(logs_service_pb2_grpc.LogsServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:  # noqa: N802
            collector.ingest.stats.logs_requests += 1
            return logs_service_pb2.ExportLogsServiceResponse()

    interceptors = [_token_interceptor(collector.token, collector.ingest.stats)] if collector.token is not None else []
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="loopscope-collect-grpc"),
        interceptors=interceptors,
        # calls past the workers wait in gRPC's queue up to this many, then get RESOURCE_EXHAUSTED
        maximum_concurrent_rpcs=collector.max_connections,
        options=[
            ("grpc.max_receive_message_length", collector.max_bytes),
            ("grpc.so_reuseport", 0),
        ],
    )
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), server)
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(Logs(), server)
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(target)
    except RuntimeError as exc:
        raise OSError(f"cannot listen on {target} for gRPC ({exc})") from None
    if not bound:
        raise OSError(f"cannot listen on {target} for gRPC (the port is taken?)")
    server.start()
    return server, bound


def _token_interceptor(token: str, stats: CollectorStats) -> Any:
    """A gRPC interceptor refusing calls without ``authorization: Bearer <token>`` (UNAUTHENTICATED)."""
    import grpc

    def deny(request: Any, context: Any) -> Any:
        stats.unauthorized += 1
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "a bearer token is required (authorization: Bearer <token>)")

    denied = grpc.unary_unary_rpc_method_handler(deny)

    class TokenCheck(grpc.ServerInterceptor):
        def intercept_service(self, continuation: Any, details: Any) -> Any:
            values = [v for k, v in (details.invocation_metadata or ()) if k == "authorization"]
            if values and token_ok(values[0] if isinstance(values[0], str) else values[0].decode("latin-1"), token):
                return continuation(details)
            return denied

    return TokenCheck()


# -- the collector --------------------------------------------------------------------------------


class Collector:
    """An OTLP receiver writing to one store. ``http_port`` / ``grpc_port`` 0 take any free
    port; ``grpc_port=None`` serves HTTP only. Use as a context manager, or ``start()`` /
    ``stop()``.

    ``token``: requests must carry ``Authorization: Bearer <token>``; ``allow_hosts``: more
    host names requests may be addressed to (see :class:`loopscope._http.HostRule`);
    ``max_queued_bytes``: the payload bytes held at once (past them: 503);
    ``max_connections`` / ``socket_timeout``: HTTP connections served at once, and the
    seconds one may send nothing before it is closed."""

    def __init__(
        self,
        db: str,
        *,
        host: str = DEFAULT_HOST,
        http_port: int | None = DEFAULT_HTTP_PORT,
        grpc_port: int | None = DEFAULT_GRPC_PORT,
        max_bytes: int = DEFAULT_MAX_BYTES,
        raw: bool = True,
        raw_wait: bool = False,
        idle_seconds: float = 60.0,
        flush_timeout: float = 30.0,
        flush_interval: float = 0.5,
        verbose: bool = False,
        token: str | None = None,
        allow_hosts: Sequence[str] = (),
        max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        socket_timeout: float = DEFAULT_SOCKET_TIMEOUT,
    ) -> None:
        self.db = resolve(db)
        self.host = host
        self.max_bytes = max_bytes
        self.verbose = verbose
        # an empty token is no token (an unset variable in a shell script)
        self.token = token or None
        self.host_rule = HostRule(host, allow_hosts)
        self.max_connections = max_connections
        self.socket_timeout = socket_timeout
        self._http_port = http_port
        self._grpc_port = grpc_port
        self._ingest_args = {
            "raw": raw, "raw_wait": raw_wait, "idle_seconds": idle_seconds, "flush_timeout": flush_timeout, "flush_interval": flush_interval,
            "max_queued_bytes": max_queued_bytes,
        }
        self.ingest: Ingest = None  # type: ignore[assignment]
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        self._http: _Server | None = None
        self._grpc: Any = None

    @property
    def http_endpoint(self) -> str | None:
        """The OTLP/HTTP base URL (``OTEL_EXPORTER_OTLP_ENDPOINT``); None without HTTP."""
        if self.http_port is None:
            return None
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{'127.0.0.1' if self.host in ('0.0.0.0', '') else host}:{self.http_port}"

    @property
    def grpc_endpoint(self) -> str | None:
        if self.grpc_port is None:
            return None
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{'127.0.0.1' if self.host in ('0.0.0.0', '') else host}:{self.grpc_port}"

    def start(self) -> Collector:
        # the file first: a path that cannot be written fails here, clearly, not at the first span
        with open_store(self.db, read_only=False, timeout=10.0) as con:
            migrate(con)
        self.ingest = Ingest(self.db, **self._ingest_args)  # type: ignore[arg-type]
        try:
            if self._http_port is not None:
                self._http = _Server((self.host, self._http_port), self)
                self.http_port = self._http.server_address[1]
                threading.Thread(target=self._http.serve_forever, name="loopscope-collect-http", daemon=True).start()
            if self._grpc_port is not None:
                self._grpc, self.grpc_port = _grpc_server(self, self.host, self._grpc_port)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop listening, then write everything received."""
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        if self._grpc is not None:
            self._grpc.stop(grace=min(timeout, 5.0)).wait(min(timeout, 5.0))
            self._grpc = None
        if self.ingest is not None:
            self.ingest.close(timeout)

    def __enter__(self) -> Collector:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(collector: Collector, ready: Callable[[Collector], None] | None = None, stop: threading.Event | None = None) -> None:
    """Run until ``stop`` is set or the process is interrupted (Ctrl-C, SIGTERM)."""
    import signal

    stop = stop or threading.Event()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    collector.start()
    try:
        if ready is not None:
            ready(collector)
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        collector.stop()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


__all__ = [
    "DEFAULT_GRPC_PORT", "DEFAULT_HTTP_PORT", "DEFAULT_MAX_BYTES", "DEFAULT_MAX_QUEUED_BYTES", "TOKEN_ENV", "ByteBudget", "Collector",
    "CollectorStats", "Ingest", "PayloadError", "StoreUnavailable",
    "decode_json", "decode_protobuf", "received_of", "records_of", "serve",
]
