"""The collector's OTLP/gRPC server: the trace, metrics and logs services (loopscope's start
notices are written, other log records not kept), the bearer token as ``authorization`` metadata."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..._http import token_ok
from .decode import PayloadError, Rejected, notices_of, received_of
from .routing import CollectorStats, StoreUnavailable

if TYPE_CHECKING:
    from .collector import Collector


# -- gRPC ---------------------------------------------------------------------------------------


def _grpc_server(collector: Collector, host: str, port: int) -> tuple[Any, int]:
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    class Traces(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:
            ingest = collector.ingest
            size = request.ByteSize()
            if not ingest.budget.take(size):
                ingest.stats.busy += 1
                ingest.stats.busy_bytes += size
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                              f"the collector holds {ingest.budget.limit} bytes of requests already (--max-queued-bytes); retry later")
            try:
                rejected = Rejected()
                received = received_of(request, collector.max_spans, rejected)
                if rejected.spans and not received:  # nothing to store: the request is bad
                    raise PayloadError(400, rejected.message)
            except PayloadError as exc:
                ingest.budget.give(size)
                ingest.refused(exc)  # counted in the store for `status` too
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.reason)
            except BaseException:
                ingest.budget.give(size)
                raise
            del request  # the spans replace it
            try:
                ingest.ingest(received, size)  # gives the bytes back once the rows are written
            except StoreUnavailable as exc:
                context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
            if rejected.spans:  # OTLP's partial success: the others are stored
                ingest.stats.rejected_spans += rejected.spans
                return trace_service_pb2.ExportTraceServiceResponse(partial_success=trace_service_pb2.ExportTracePartialSuccess(
                    rejected_spans=rejected.spans, error_message=rejected.reason()))
            return trace_service_pb2.ExportTraceServiceResponse()

    class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:
            collector.ingest.stats.metrics_requests += 1
            return metrics_service_pb2.ExportMetricsServiceResponse()

    class Logs(logs_service_pb2_grpc.LogsServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:
            collector.ingest.stats.logs_requests += 1
            try:
                collector.ingest.notices(notices_of(request))  # loopscope's start notices; other records are not kept
            except StoreUnavailable as exc:
                context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
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
