"""``loopscope collect``: receive OTLP from many processes and write one store."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from .commands import CommandError, db_path, emit, warn

if TYPE_CHECKING:
    import logging


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0..65535, got {value}")
    return value


def _size(text: str) -> int:
    units = {"k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30, "": 1, "b": 1}
    number = text.strip().lower()
    unit = number.lstrip("0123456789.")
    try:
        value = int(float(number[: len(number) - len(unit)]) * units[unit.strip()])
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"expected a size such as 16MiB or 1048576, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
    return value


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    from ..ingest.otlp import (  # the defaults alone: the receiver is imported when it runs
        DEFAULT_GRPC_PORT,
        DEFAULT_HOST,
        DEFAULT_HTTP_PORT,
        DEFAULT_MAX_CONNECTIONS,
        DEFAULT_MAX_SPANS,
        DEFAULT_SOCKET_TIMEOUT,
        TOKEN_ENV,
    )

    collect = sub.add_parser(
        "collect",
        parents=[common],
        help="receive OTLP spans (HTTP :4318, gRPC :4317) from many processes into one store",
        description="Run an OTLP receiver that writes the spans it receives into the store, as the same "
        "events and turns an instrumented process writes itself. Point every agent process at it "
        "(OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318) to share one store: DuckDB admits one "
        "writer at a time. It understands loopscope's spans and the GenAI spans of the official "
        "OpenTelemetry instrumentations, OpenLLMetry, OpenInference and pydantic-ai, and keeps every "
        "span as received in the `spans` table. Requests are answered once their rows are stored. "
        "Metrics and logs are accepted and not stored.",
    )
    collect.add_argument("--host", default=DEFAULT_HOST, metavar="ADDR",
                         help=f"address to listen on (default: {DEFAULT_HOST}; another address lets that network write to your store)")
    collect.add_argument("--http-port", type=_port, default=DEFAULT_HTTP_PORT, metavar="N",
                         help=f"OTLP/HTTP port (default: {DEFAULT_HTTP_PORT}; 0 = any free port)")
    collect.add_argument("--grpc-port", type=_port, default=DEFAULT_GRPC_PORT, metavar="N",
                         help=f"OTLP/gRPC port (default: {DEFAULT_GRPC_PORT}; 0 = any free port)")
    collect.add_argument("--no-grpc", action="store_true", help="serve OTLP/HTTP only")
    collect.add_argument("--max-bytes", type=_size, default="16MiB", metavar="SIZE",
                         help="largest payload taken, also once decompressed (default: 16MiB); larger ones get 413")
    collect.add_argument("--max-spans", type=int, default=DEFAULT_MAX_SPANS, metavar="N",
                         help=f"most spans one traces request may carry (default: {DEFAULT_MAX_SPANS}); a request "
                         "with more is refused whole (HTTP 413, gRPC INVALID_ARGUMENT)")
    collect.add_argument("--max-queued-bytes", type=_size, default="64MiB", metavar="SIZE",
                         help="payload bytes (decompressed) held at once while they are decoded and written (default: "
                         "64MiB); past it requests get 503 (gRPC RESOURCE_EXHAUSTED), which OTLP senders retry")
    collect.add_argument("--token", metavar="TOKEN",
                         help=f"require 'Authorization: Bearer TOKEN' on every request (default: ${TOKEN_ENV}); "
                         "needed when listening beyond loopback. Senders: OTEL_EXPORTER_OTLP_HEADERS=Authorization=Bearer%%20TOKEN")
    collect.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                         help="another host name requests may be addressed to (Host header), when listening beyond "
                         "loopback without a token; repeatable")
    collect.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS, metavar="N",
                         help=f"HTTP connections served at once; more wait (default: {DEFAULT_MAX_CONNECTIONS})")
    collect.add_argument("--socket-timeout", type=float, default=DEFAULT_SOCKET_TIMEOUT, metavar="SECONDS",
                         help=f"close an HTTP connection that sends nothing this long (default: {DEFAULT_SOCKET_TIMEOUT:g})")
    collect.add_argument("--no-raw", action="store_true", help="do not keep the received spans in the `spans` table")
    collect.add_argument("--idle", type=float, default=60.0, metavar="SECONDS",
                         help="how long another instrumentation's model and tool calls wait for their agent run "
                         "to end before they are stored on their own (default: 60)")
    collect.add_argument("--prices", metavar="FILE",
                         help="a TOML or JSON file of model prices (USD per million tokens of input, output, cache_read, "
                         "cache_write, per model name) for models genai-prices does not know or that you pay otherwise "
                         "(default: $LOOPSCOPE_PRICES)")
    collect.add_argument("--verbose", action="store_true", help="log every request to stderr")
    collect.set_defaults(handler=run)


def _log_handler() -> logging.Handler:
    """``--verbose``'s log lines to stderr as :func:`tables.visible` shows them: a request
    line (its path is the sender's text) cannot drive the terminal the collector runs in."""
    import logging

    from ..dashboards.tables import visible

    class Visible(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            return visible(super().format(record))

    handler = logging.StreamHandler()
    handler.setFormatter(Visible("%(message)s"))
    return handler


def run(args: argparse.Namespace) -> int:
    import logging

    from .. import pricing
    from ..ingest.otlp.collector import TOKEN_ENV, Collector, serve

    if args.verbose:  # each request's line (its path is the sender's text): control characters as escapes
        logging.basicConfig(level=logging.INFO, handlers=[_log_handler()])
    if args.max_connections < 1 or not args.socket_timeout > 0:
        raise CommandError("--max-connections must be at least 1 and --socket-timeout positive")
    if args.max_spans < 1:
        raise CommandError("--max-spans must be at least 1")
    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV)
    if args.prices is not None:
        try:
            pricing.use_prices_file(args.prices)
        except (OSError, ValueError) as exc:
            raise CommandError(f"--prices {args.prices}: {exc}") from None
    collector = Collector(
        db_path(args),
        host=args.host,
        http_port=args.http_port,
        grpc_port=None if args.no_grpc else args.grpc_port,
        max_bytes=args.max_bytes,
        max_spans=args.max_spans,
        raw=not args.no_raw,
        idle_seconds=args.idle,
        verbose=args.verbose,
        token=token,
        allow_hosts=args.allow_host,
        max_queued_bytes=args.max_queued_bytes,
        max_connections=args.max_connections,
        socket_timeout=args.socket_timeout,
    )

    def ready(c: Collector) -> None:
        where = [f"OTLP/HTTP on {c.http_endpoint}"] + ([f"OTLP/gRPC on {c.grpc_endpoint}"] if c.grpc_port else [])
        emit(f"loopscope collect: {', '.join(where)} -> {c.db}  (Ctrl-C to stop)", flush=True)
        emit(f"  point agents at it: OTEL_EXPORTER_OTLP_ENDPOINT={c.http_endpoint}", flush=True)
        if args.host not in ("127.0.0.1", "localhost", "::1") and not c.token:
            warn(f"loopscope: warning: listening on {args.host} without a token: anyone who can reach it can write to "
                 f"this store (set --token or ${TOKEN_ENV})")

    try:
        serve(collector, ready)
    except OSError as exc:
        raise CommandError(f"cannot listen on {args.host}: {exc.strerror or exc} (another collector running? try --http-port 0 --grpc-port 0)") from None
    stats = collector.ingest.stats if collector.ingest is not None else None
    if stats is not None:
        busy = f", {stats.busy} over --max-queued-bytes (retried by their senders)" if stats.busy else ""
        turned = stats.unauthorized + stats.misdirected
        denied = f", {turned} not allowed (token, Host or Origin)" if turned else ""
        large = f" ({stats.too_many_spans} of them over --max-spans)" if stats.too_many_spans else ""
        rejected = f", {stats.rejected_spans} spans with bad ids rejected (partial success)" if stats.rejected_spans else ""
        emit(f"loopscope collect: stopped; {stats.spans} spans in {stats.requests} requests, {stats.refused} refused{large}{rejected}{busy}{denied}",
             flush=True)
    return 0
