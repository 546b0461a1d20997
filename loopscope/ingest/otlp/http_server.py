"""The collector's OTLP/HTTP server: ``POST /v1/traces``, ``/v1/logs`` (loopscope's start
notices are written, other records not kept) and ``/v1/metrics`` (accepted, not stored),
the Host/Origin rule or bearer token, request bytes bounded."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ..._guard import logger
from ..._http import BoundedHandler, BoundedHTTPServer, token_ok
from .decode import (
    JSON,
    PROTOBUF,
    PayloadError,
    Rejected,
    _check_other_signal,
    _decompress,
    decode_json,
    decode_logs,
    decode_protobuf,
    notices_of,
    received_of,
)
from .routing import ByteBudget, StoreUnavailable

if TYPE_CHECKING:
    from .collector import Collector


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


def _partial_success(rejected: Rejected, content_type: str) -> tuple[bytes, str]:
    """An ExportTraceServiceResponse whose ``partial_success`` counts the spans left out
    (OTLP: 200 with the count and a message), in the request's encoding."""
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTracePartialSuccess,
        ExportTraceServiceResponse,
    )

    answer = ExportTraceServiceResponse(partial_success=ExportTracePartialSuccess(
        rejected_spans=rejected.spans, error_message=rejected.reason()))
    if content_type == PROTOBUF:
        return answer.SerializeToString(), PROTOBUF
    return json_format.MessageToJson(answer, indent=None).encode(), JSON


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
        super().__init__(address, _Handler, max_connections=collector.max_connections, socket_timeout=collector.socket_timeout,
                         max_open=collector.max_open)

    def handle_error(self, request: Any, client_address: Any) -> None:
        logger.debug("loopscope collect: request from %s failed", client_address, exc_info=True)


class _Handler(BoundedHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    server_version = "loopscope-collect"

    def log_message(self, format: str, *args: Any) -> None:
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

    def do_GET(self) -> None:
        if not self._admitted(JSON, token=False):
            return
        if urlsplit(self.path).path in ("/", "/health", "/healthz"):
            self._send(200, b'{"status":"ok"}', JSON)
        else:
            self._fail(404, f"no such path {self.path}; POST OTLP to /v1/traces", JSON)

    def do_POST(self) -> None:
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
            self._refuse(415, f"unsupported content type {content_type or '(none)'!r}; send {PROTOBUF} or {JSON}", JSON,
                         signal=signal)
            return
        encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        if encoding not in ("identity", "", "gzip", "x-gzip", "deflate"):
            self._refuse(415, f"unsupported content encoding {encoding!r}; send gzip, deflate or none", answer_type,
                         signal=signal)
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
            if signal == "metrics":
                _check_other_signal(signal, body, content_type)
                collector.ingest.stats.metrics_requests += 1
                self._send_empty(signal, answer_type)
                return
            if signal == "logs":  # loopscope's start notices are written; other records are not kept
                notices = notices_of(decode_logs(body, content_type))
                collector.ingest.stats.logs_requests += 1
                try:
                    collector.ingest.notices(notices)
                except StoreUnavailable as exc:
                    self._fail(503, str(exc), answer_type, retry_after=1)
                    return
                self._send_empty(signal, answer_type)
                return
            request = decode_json(body) if content_type == JSON else decode_protobuf(body)
            del body  # the decoded request replaces it
            rejected = Rejected()
            received = received_of(request, collector.max_spans, rejected)
            del request  # the spans replace it
            if rejected.spans and not received:  # nothing to store: the request is bad
                raise PayloadError(400, rejected.message)
        except PayloadError as exc:
            collector.ingest.refused(exc, store=signal == "traces")  # counted in the store for `status` too
            self._fail(exc.status, exc.reason, answer_type, close=exc.status in (411, 413))
            return
        size, held[0] = held[0], 0  # given back by ingest, once the rows are written
        try:
            collector.ingest.ingest(received, size)
        except StoreUnavailable as exc:
            self._fail(503, str(exc), answer_type, retry_after=1)
            return
        if rejected.spans:
            collector.ingest.stats.rejected_spans += rejected.spans
            self._send(200, *_partial_success(rejected, answer_type))
            logger.info("loopscope collect: %s (from %s)", rejected.reason(), self.client_address[0])
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
                counted: bool = False, signal: str | None = None) -> None:
        """Refuse before reading the body: read it away (bounded) or close the connection.
        A traces request (``signal``) is counted in the store too (``Ingest.refused``)."""
        if signal == "traces":
            self.server.collector.ingest.refused(PayloadError(status, reason))
        elif not counted:
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
