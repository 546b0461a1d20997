"""Start notices: the start of an ``invoke_agent`` or ``execute_tool`` span, sent at once
as an OTLP *log record* (``POST /v1/logs``, or the gRPC logs service), not as a span.

OTLP carries spans when they end; ``loopscope collect`` writes a tool call's start row
and a turn's input message when they start, so it needs to hear of the start. A copy of
the span sent as a span (what loopscope did before) is counted by every tracing backend
as one more agent run or tool call (Phoenix showed 21 spans for 14). A log record is
what a span-only backend ignores or refuses: Phoenix answers ``/v1/logs`` with an error,
an OpenTelemetry Collector without a logs pipeline refuses it, and a backend that keeps
logs shows a DEBUG record beside the span, never a span.

The record: ``trace_id`` / ``span_id`` of the real span, ``time_unix_nano`` its start,
``event_name`` :data:`loopscope.semconv.NOTICE_EVENT`, severity DEBUG, and the span's
start attributes (after the content policy, as any exported span) plus its name in
``loopscope.span.name``.

Order. :class:`NoticeSplitter` sits where the span exporter was: a batch from the batch
processor holds the pending copies (:func:`loopscope.export.otlp.pending_span`) among the
spans in the order they started and ended. It sends the batch's notices first (one logs
request), each naming the span that comes next in the batch
(:data:`loopscope.semconv.NOTICE_BEFORE`), then the batch's spans (one traces request); a
collector writes each notice's start rows right before that span's rows, which is the
order the process saw, in two requests a batch. A notice no span follows (its span still
runs) is written at once: that is what shows running turns and tools live.

Refusal. An endpoint that answers that it has no logs receiver (HTTP 404, 405, 415, 501;
gRPC ``UNIMPLEMENTED``, ``NOT_FOUND``) turns notices off for the rest of the process: one
INFO line in the log, no retry. Other failures (the endpoint down, a timeout) are not
retried either: a notice is useful only in time, and a collector that missed it writes
the start rows from the ended span. Both are counted (:class:`NoticeSender` ``refused``,
``failed``); nothing of the spans is lost with them.
"""

from __future__ import annotations

import gzip
import http.client
import os
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from .. import _json
from .. import semconv as a
from .._guard import logger
from . import signals

_REFUSED_HTTP = frozenset({404, 405, 415, 501})
"""HTTP answers that say the endpoint takes no OTLP logs (a span-only backend)."""
DEFAULT_TIMEOUT = 10.0


def _env(*names: str) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value.strip()
    return None


def notices_wanted() -> bool:
    """Start notices are on unless ``LOOPSCOPE_OTLP_PENDING=0`` or ``OTEL_LOGS_EXPORTER``
    leaves OTLP logs out (``none``, or only exporters loopscope does not provide)."""
    if os.environ.get("LOOPSCOPE_OTLP_PENDING", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    return signals.exports("logs")


def logs_endpoint(base: str | None, protocol: str) -> str:
    """Where notices go: beside the spans, as the ``OTEL_EXPORTER_OTLP_*`` variables say.

    An explicit base endpoint (``configure(otlp_endpoint=)``) wins; then
    ``OTEL_EXPORTER_OTLP_LOGS_ENDPOINT`` (taken as it is), ``OTEL_EXPORTER_OTLP_ENDPOINT``
    (plus ``/v1/logs`` over HTTP), and a traces endpoint ending in ``/v1/traces`` with
    ``/v1/logs`` instead."""
    grpc = protocol == "grpc"
    if base:
        return base if grpc else base.rstrip("/") + "/v1/logs"
    explicit = _env("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT")
    if explicit:
        return explicit
    general = _env("OTEL_EXPORTER_OTLP_ENDPOINT")
    if general:
        return general if grpc else general.rstrip("/") + "/v1/logs"
    traces = _env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if traces:
        if grpc:
            return traces
        stripped = traces.rstrip("/")
        if stripped.endswith("/v1/traces"):
            return stripped[: -len("/v1/traces")] + "/v1/logs"
        return stripped + "/v1/logs"
    return "localhost:4317" if grpc else "http://localhost:4318/v1/logs"


def _headers(given: Mapping[str, str] | None) -> dict[str, str]:
    if given is not None:
        return dict(given)
    text = _env("OTEL_EXPORTER_OTLP_LOGS_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS")
    if not text:
        return {}
    from opentelemetry.util.re import parse_env_headers

    return dict(parse_env_headers(text, liberal=True))


def _timeout() -> float:
    text = _env("OTEL_EXPORTER_OTLP_LOGS_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")
    try:
        return float(text) if text else DEFAULT_TIMEOUT
    except ValueError:
        return DEFAULT_TIMEOUT


# -- the log records -----------------------------------------------------------------------------


def _any_value(value: Any, out: Any) -> None:
    """``value`` into the protobuf ``AnyValue`` ``out`` (the attribute types spans hold)."""
    if isinstance(value, bool):
        out.bool_value = value
    elif isinstance(value, int):
        out.int_value = value
    elif isinstance(value, float):
        out.double_value = value
    elif isinstance(value, str):
        out.string_value = value
    elif isinstance(value, bytes):
        out.bytes_value = value
    elif isinstance(value, (list, tuple)):
        array = out.array_value
        array.SetInParent()
        for item in value:
            _any_value(item, array.values.add())
    else:
        out.string_value = _json.to_text(value)


def _set_attributes(target: Any, attributes: Mapping[str, Any]) -> None:
    for key, value in attributes.items():
        kv = target.add()
        kv.key = key
        _any_value(value, kv.value)


def notice_request(notices: Sequence[tuple[ReadableSpan, str | None]]) -> Any:
    """An ``ExportLogsServiceRequest`` with one log record per pending copy in ``notices``,
    each given with the span that comes next in its batch (:data:`loopscope.semconv.NOTICE_BEFORE`)."""
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
    from opentelemetry.proto.logs.v1.logs_pb2 import SEVERITY_NUMBER_DEBUG, LogRecord

    request = ExportLogsServiceRequest()
    has_event_name = "event_name" in LogRecord.DESCRIPTOR.fields_by_name  # OTLP 1.5 on; older packages lack it
    groups: dict[tuple[int, str, str | None], Any] = {}
    for span, before in notices:
        ctx = span.context
        if ctx is None:  # a started span has one; a hand-made ReadableSpan may not
            continue
        resource, scope = span.resource, span.instrumentation_scope
        key = (id(resource), scope.name if scope else "", scope.version if scope else None)
        scope_logs = groups.get(key)
        if scope_logs is None:
            resource_logs = request.resource_logs.add()
            if resource is not None:
                _set_attributes(resource_logs.resource.attributes, resource.attributes)
            scope_logs = groups[key] = resource_logs.scope_logs.add()
            if scope is not None:
                scope_logs.scope.name = scope.name
                if scope.version:
                    scope_logs.scope.version = scope.version
        attributes = dict(span.attributes or {})
        real = attributes.pop(a.PENDING_FOR, None)
        operation = attributes.pop(a.PENDING_OPERATION, None)
        if operation:
            attributes[a.OPERATION] = operation
        name = span.name.removesuffix(" (pending)")
        attributes[a.NOTICE_SPAN_NAME] = name
        if before is not None and before.startswith("after:"):
            attributes[a.NOTICE_AFTER] = before[len("after:"):]
        elif before is not None:
            attributes[a.NOTICE_BEFORE] = before
        record = scope_logs.log_records.add()
        record.time_unix_nano = record.observed_time_unix_nano = span.start_time or 0
        record.severity_number = SEVERITY_NUMBER_DEBUG
        record.severity_text = "DEBUG"
        record.body.string_value = f"{name} started"
        record.trace_id = ctx.trace_id.to_bytes(16, "big")
        span_id = int(str(real), 16) if real else ctx.span_id
        record.span_id = span_id.to_bytes(8, "big")
        record.flags = int(ctx.trace_flags) & 0xFF
        if has_event_name:
            record.event_name = a.NOTICE_EVENT
        else:
            attributes["event.name"] = a.NOTICE_EVENT
        _set_attributes(record.attributes, attributes)
    return request


# -- sending -------------------------------------------------------------------------------------


class NoticeSender:
    """Sends start notices to the endpoint's logs receiver; turns itself off for good when
    the endpoint has none. ``sent``, ``refused`` and ``failed`` count notices."""

    def __init__(self, endpoint: str, protocol: str, headers: Mapping[str, str] | None = None, timeout: float | None = None) -> None:
        self.endpoint = endpoint
        self.protocol = protocol
        self.headers = _headers(headers)
        self.timeout = timeout if timeout is not None else _timeout()
        self.gzip = (_env("OTEL_EXPORTER_OTLP_LOGS_COMPRESSION", "OTEL_EXPORTER_OTLP_COMPRESSION") or "").lower() == "gzip"
        self.enabled = True
        self.sent = 0
        self.refused = 0
        self.failed = 0
        self.last_error: str | None = None
        self._lock = threading.Lock()
        self._channel: Any = None
        self._stub: Any = None
        self._http_lock = threading.Lock()
        self._connection: Any = None  # the kept-alive HTTP connection (http.client), made at the first send

    def send(self, notices: Sequence[tuple[ReadableSpan, str | None]]) -> None:
        """Send ``notices`` (pending copies, each with the span that comes next) as one logs
        request; never raises."""
        if not notices:
            return
        if not self.enabled:
            self.refused += len(notices)
            return
        try:
            request = notice_request(notices)
            outcome = self._grpc(request) if self.protocol == "grpc" else self._http(request.SerializeToString())
        except Exception as exc:  # whatever a transport raises: the spans go on without notices
            outcome = f"failed: {type(exc).__name__}: {exc}"
        if outcome is None:
            self.sent += len(notices)
        elif outcome.startswith("refused"):
            self.enabled = False
            self.refused += len(notices)
            self.last_error = outcome
            logger.info(
                "loopscope: %s takes no OTLP logs (%s); start notices are off (only `loopscope collect` reads them, "
                "the spans are sent as usual)", self.endpoint, outcome,
            )
        else:
            self.failed += len(notices)
            self.last_error = outcome
            logger.debug("loopscope: start notices not sent to %s (%s)", self.endpoint, outcome)

    def _http(self, body: bytes) -> str | None:
        headers = {**self.headers, "Content-Type": "application/x-protobuf"}
        if self.gzip:
            body = gzip.compress(body)
            headers["Content-Encoding"] = "gzip"
        kept = self._kept_alive(body, headers)
        if kept is not _NO_CONNECTION:
            return kept
        request = urllib.request.Request(self.endpoint, data=body, method="POST", headers=headers)
        context = None
        if self.endpoint.startswith("https:"):
            cafile = _env("OTEL_EXPORTER_OTLP_LOGS_CERTIFICATE", "OTEL_EXPORTER_OTLP_CERTIFICATE")
            context = ssl.create_default_context(cafile=cafile)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=context) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            exc.close()
            return f"refused: HTTP {exc.code}" if exc.code in _REFUSED_HTTP else f"failed: HTTP {exc.code}"
        except (urllib.error.URLError, OSError) as exc:
            return f"failed: {getattr(exc, 'reason', exc)}"
        return None

    def _kept_alive(self, body: bytes, headers: dict[str, str]) -> str | None:
        """POST ``body`` on a connection kept open from one batch to the next (as the span
        exporter's session does: a new connection a batch cost more CPU than the notices
        themselves); :data:`_NO_CONNECTION` where ``urllib`` is to send it (a proxy is set
        for the endpoint, or it is not plain http/https)."""
        with self._http_lock:
            connection = self._connection
            fresh = connection is None  # a connection opens at its first request (http.client)
            if fresh:
                connection = self._connection = _connection(self.endpoint, self.timeout)
            if connection is _NO_CONNECTION:
                return _NO_CONNECTION
            while True:
                try:
                    connection.request("POST", self._path, body=body, headers=headers)
                    response = connection.getresponse()
                    response.read()
                    status = response.status
                    if response.will_close:
                        connection.close()
                    break
                except (http.client.HTTPException, OSError) as exc:
                    connection.close()
                    # the server closed the idle connection meanwhile: once more on a new one
                    if not fresh and isinstance(exc, (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)):
                        fresh = True
                        continue
                    return f"failed: {exc}"
        if 200 <= status < 300:
            return None
        return f"refused: HTTP {status}" if status in _REFUSED_HTTP else f"failed: HTTP {status}"

    @property
    def _path(self) -> str:
        parts = urllib.parse.urlsplit(self.endpoint)
        return (parts.path or "/") + (f"?{parts.query}" if parts.query else "")

    def _grpc(self, request: Any) -> str | None:
        import grpc
        from opentelemetry.proto.collector.logs.v1.logs_service_pb2_grpc import LogsServiceStub

        with self._lock:
            if self._stub is None:
                target = self.endpoint
                secure = target.startswith("https://")
                insecure_env = (_env("OTEL_EXPORTER_OTLP_LOGS_INSECURE", "OTEL_EXPORTER_OTLP_INSECURE") or "").lower() == "true"
                for prefix in ("http://", "https://"):
                    target = target.removeprefix(prefix)
                target = target.rstrip("/")
                if secure and not insecure_env:
                    self._channel = grpc.secure_channel(target, grpc.ssl_channel_credentials())
                else:
                    self._channel = grpc.insecure_channel(target)
                self._stub = LogsServiceStub(self._channel)
        metadata = [(k.lower(), v) for k, v in self.headers.items()]
        try:
            self._stub.Export(request, timeout=self.timeout, metadata=metadata or None)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            if code in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.NOT_FOUND):
                return f"refused: gRPC {code.name}"
            return f"failed: gRPC {getattr(code, 'name', code)}"
        return None

    def close(self) -> None:
        with self._http_lock:
            if self._connection is not None and self._connection is not _NO_CONNECTION:
                self._connection.close()
            self._connection = None
        with self._lock:
            if self._channel is not None:
                self._channel.close()
                self._channel = self._stub = None


_NO_CONNECTION: Any = "urllib"
"""What :meth:`NoticeSender._kept_alive` answers when ``urllib`` is to send the request."""


def _connection(endpoint: str, timeout: float) -> Any:
    """An ``http.client`` connection to ``endpoint`` (opened at its first request), or
    :data:`_NO_CONNECTION` when a proxy is set for it (``urllib`` honours the proxy
    variables) or it is not an http/https URL."""
    parts = urllib.parse.urlsplit(endpoint)
    host = parts.hostname
    if parts.scheme not in ("http", "https") or not host:
        return _NO_CONNECTION
    proxies = urllib.request.getproxies()
    if parts.scheme in proxies and not urllib.request.proxy_bypass(host):
        return _NO_CONNECTION
    if parts.scheme == "https":
        cafile = _env("OTEL_EXPORTER_OTLP_LOGS_CERTIFICATE", "OTEL_EXPORTER_OTLP_CERTIFICATE")
        return http.client.HTTPSConnection(host, parts.port, timeout=timeout, context=ssl.create_default_context(cafile=cafile))
    return http.client.HTTPConnection(host, parts.port, timeout=timeout)


def is_notice(span: ReadableSpan) -> bool:
    """Whether ``span`` is a pending copy (to leave as a notice, not as a span)."""
    attributes = span.attributes
    return attributes is not None and a.PENDING_FOR in attributes


class NoticeSplitter(SpanExporter):
    """The span exporter with start notices taken out: each batch's notices go first, as
    log records through ``notices``; its spans after, through ``inner``."""

    def __init__(self, inner: SpanExporter, notices: NoticeSender) -> None:
        self.inner = inner
        self.notices = notices

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not any(is_notice(span) for span in spans):
            return self.inner.export(spans)
        starts: list[tuple[ReadableSpan, str | None]] = []
        rest: list[ReadableSpan] = []
        following: str | None = None  # the next span of the batch that is no notice, walking back
        for span in reversed(spans):
            if is_notice(span):
                starts.append((span, following))
            else:
                rest.append(span)
                ctx = span.context
                following = f"{ctx.trace_id:032x}{ctx.span_id:016x}" if ctx is not None else None
        starts.reverse()
        rest.reverse()
        if rest:  # notices after the batch's last span go right after it, not ahead of the batch
            ctx = rest[-1].context
            last = f"after:{ctx.trace_id:032x}{ctx.span_id:016x}" if ctx is not None else None
            starts = [(span, before if before is not None else last) for span, before in starts]
        self.notices.send(starts)
        return self.inner.export(rest) if rest else SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.notices.close()
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)
