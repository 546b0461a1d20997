"""``loopscope collect``: an OTLP receiver that writes what it receives into a store.

Processes that export OTLP to it share one DuckDB file (DuckDB admits one writer at a
time): spans arrive over OTLP/HTTP (``POST /v1/traces``, protobuf or JSON bodies, gzip or
deflate) on 127.0.0.1:4318 and over OTLP/gRPC on 127.0.0.1:4317, and become the same
events and turns the in-process store writes, through the same store writer and
span-to-row mapping. A request is answered only once its events, turns and the raw
copies of its spans are in the file, written in one transaction (see :class:`Ingest`): an
acknowledged payload is stored, and a collector killed at any moment keeps each request
whole or not at all.

Order. OTLP carries spans when they end, but loopscope writes a tool call's start row
when the tool starts and a turn's input message when the turn starts. loopscope's own
exporter therefore also sends, when an ``invoke_agent`` or ``execute_tool`` span starts,
a *start notice*: an OTLP log record with the span's ids and start attributes
(``POST /v1/logs`` or the gRPC logs service; see :mod:`loopscope.export.notices`), before
the batch of spans it belongs to. A log record is what tracing backends do not count as a
span. The collector writes the span's start rows from the notice (so the event ids match),
and only the end rows when the span arrives. A notices request is answered once its rows
are queued, ahead of the spans that follow (not written yet: a lost notice is made good by
its span). Spans without notices (another exporter,
another instrumentation) give both from the ended span. A pending copy sent as a span
(``loopscope.pending_for``, earlier versions' exporter) is understood too.

Other instrumentations' GenAI spans are understood too (:mod:`loopscope.ingest.foreign`);
their model calls under no agent run (a bare instrumented SDK loop) are stitched into
turns (:mod:`loopscope.ingest.stitch_foreign`). Every span received is also kept as it
came in the ``spans`` table.

Bad payloads get a 4xx with a reason and change nothing: a payload is decoded and checked
whole before any of it is written; one that is too large (``max_bytes``, also after
decompression) is refused with 413, a wrong content type with 415, garbage (JSON nested
too deeply too) with 400; a traces request so refused is counted in the store for
``loopscope status`` (the sender does not resend a 4xx). Metrics and other log records (``/v1/metrics``, ``/v1/logs`` and
their gRPC services) are accepted when well-formed and not stored.

Who may write. A request whose ``Host`` names another machine gets 421 and one whose
``Origin`` names another site 403, so that a web page the user visits cannot write here
by DNS rebinding (the rule is the dashboard's: :class:`loopscope._http.HostRule`). With a
``token``, every request must carry ``Authorization: Bearer <token>`` (gRPC: the
``authorization`` metadata), or gets 401 / ``UNAUTHENTICATED``; a token is what a
collector bound beyond loopback needs, and then any ``Host`` is answered.

Idempotent. A request resent after a crash (the sender never saw the answer) adds no
rows: rows the store holds already are left out by span id (:mod:`loopscope.storage.duckdb.idempotent`), and
within a run the spans of the latest requests are remembered.

Memory. The payloads being decoded, routed and written take at most
``max_queued_bytes`` (counted decompressed) at once: a request that would pass it gets
503 (gRPC ``RESOURCE_EXHAUSTED``), which OTLP senders retry, and is counted
(``stats.busy``). HTTP requests are served by at most ``max_connections`` threads; a
connection waits for its next request without one, its request head must arrive whole
within ``socket_timeout`` seconds, and past ``max_open`` connections the oldest waiting
one is closed for a new one (:class:`loopscope._http.BoundedHTTPServer`): slow or idle
clients cannot keep others out. A traces request of more than ``max_spans`` spans is
refused whole (413); the work a request takes grows linearly with its spans.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..._http import HostRule
from ...storage.queries import name_of, prepare

# the defaults live in the package, where ``loopscope collect``'s parser reads them without
# importing the receiver
from . import (
    DEFAULT_GRPC_PORT,
    DEFAULT_HOST,
    DEFAULT_HTTP_PORT,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_OPEN,
    DEFAULT_MAX_SPANS,
    DEFAULT_SOCKET_TIMEOUT,
    TOKEN_ENV,
)
from .decode import PayloadError, decode_json, decode_protobuf, received_of, records_of
from .grpc_server import _grpc_server
from .http_server import _Server
from .routing import DEFAULT_MAX_QUEUED_BYTES, ByteBudget, CollectorStats, Ingest, StoreUnavailable

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from 3.11; only read by type checkers here



# -- the collector --------------------------------------------------------------------------------


class Collector:
    """An OTLP receiver writing to one store. ``http_port`` / ``grpc_port`` 0 take any free
    port; ``grpc_port=None`` serves HTTP only. Use as a context manager, or ``start()`` /
    ``stop()``.

    ``token``: requests must carry ``Authorization: Bearer <token>``; ``allow_hosts``: more
    host names requests may be addressed to (see :class:`loopscope._http.HostRule`);
    ``max_queued_bytes``: the payload bytes held at once (past them: 503); ``max_spans``:
    the spans one traces request may carry (past them: 413, the request refused whole);
    ``max_connections`` / ``socket_timeout`` / ``max_open``: HTTP requests served at once,
    the seconds a request's head (and each part of its body) may take to arrive, and the
    connections held open at once (:class:`loopscope._http.BoundedHTTPServer`)."""

    def __init__(
        self,
        db: str,
        *,
        host: str = DEFAULT_HOST,
        http_port: int | None = DEFAULT_HTTP_PORT,
        grpc_port: int | None = DEFAULT_GRPC_PORT,
        max_bytes: int = DEFAULT_MAX_BYTES,
        max_spans: int = DEFAULT_MAX_SPANS,
        raw: bool = True,
        idle_seconds: float = 60.0,
        flush_timeout: float = 30.0,
        flush_interval: float = 0.5,
        verbose: bool = False,
        token: str | None = None,
        allow_hosts: Sequence[str] = (),
        max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        socket_timeout: float = DEFAULT_SOCKET_TIMEOUT,
        max_open: int = DEFAULT_MAX_OPEN,
    ) -> None:
        self.db = name_of(db)  # a file's path resolved; a clickhouse:// URL as given
        self.host = host
        self.max_bytes = max_bytes
        if max_spans < 1:
            raise ValueError(f"max_spans must be positive, got {max_spans}")
        self.max_spans = max_spans
        self.verbose = verbose
        # an empty token is no token (an unset variable in a shell script)
        self.token = token or None
        self.host_rule = HostRule(host, allow_hosts)
        self.max_connections = max_connections
        self.socket_timeout = socket_timeout
        self.max_open = max_open
        self._http_port = http_port
        self._grpc_port = grpc_port
        self._ingest_args = {
            "raw": raw, "idle_seconds": idle_seconds, "flush_timeout": flush_timeout, "flush_interval": flush_interval,
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
        return self._endpoint(self.http_port)

    @property
    def grpc_endpoint(self) -> str | None:
        """The OTLP/gRPC endpoint; None without gRPC."""
        return self._endpoint(self.grpc_port)

    def _endpoint(self, port: int | None) -> str | None:
        if port is None:
            return None
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{'127.0.0.1' if self.host in ('0.0.0.0', '') else host}:{port}"

    def start(self) -> Self:
        # the file first: a path that cannot be written fails here, clearly, not at the first span
        prepare(self.db, timeout=10.0)
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

    def __enter__(self) -> Self:
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
    "DEFAULT_GRPC_PORT", "DEFAULT_HTTP_PORT", "DEFAULT_MAX_BYTES", "DEFAULT_MAX_QUEUED_BYTES", "DEFAULT_MAX_SPANS", "TOKEN_ENV", "ByteBudget", "Collector",
    "CollectorStats", "Ingest", "PayloadError", "StoreUnavailable",
    "decode_json", "decode_protobuf", "received_of", "records_of", "serve",
]
