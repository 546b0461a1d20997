"""An OTLP/HTTP endpoint without a metrics receiver: said once, clearly, then left alone.

Tracing backends that take OTLP spans often take no metrics (Jaeger, Phoenix, Tempo): their
``/v1/metrics`` answers 404 or 405. The SDK's exporter then logs ``Failed to export metrics
batch code: 405`` at every export, the last one at the application's exit. loopscope's
metric exporter (:func:`http_metric_exporter`) watches the answers through the
``requests`` session the exporter takes (a public argument), puts the SDK's line for that
answer aside, logs one warning naming the endpoint and ``OTEL_METRICS_EXPORTER=none``, and
sends that endpoint no more metrics (what it would have sent is counted in
:attr:`MetricsRefusal.dropped_exports`). Other failures are the SDK's to report, as before.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

from .._guard import logger

REFUSALS = frozenset({404, 405})
"""HTTP statuses that mean "no OTLP metrics receiver here" (not found, method not allowed)."""

# the loggers the SDK's OTLP/HTTP metric exporter reports a failed export on (its own module's;
# the shared HTTP client's in SDKs that have one)
_SDK_LOGGERS = ("opentelemetry.exporter.otlp.proto.http.metric_exporter", "opentelemetry.exporter.otlp.common.http")


class MetricsRefusal:
    """What one exporter learned: whether (and with which status) its endpoint refused metrics."""

    def __init__(self) -> None:
        self.status: int | str | None = None  # an HTTP status, or a gRPC status code's name
        self.url = ""
        self.dropped_exports = 0
        self._said = False

    def refused(self, status: int | str, url: str) -> None:
        if self.status is None:
            self.status, self.url = status, url
        _reporting.refused = True  # this thread's export is reporting it, until end_export

    def say_once(self) -> None:
        if self._said or self.status is None:
            return
        self._said = True
        how = f"HTTP {self.status}" if isinstance(self.status, int) else f"gRPC {self.status}"
        logger.warning(
            "loopscope: %s refused metrics (%s: no OTLP metrics receiver there); loopscope sends it no more "
            "metrics (spans go on as before). Set OTEL_METRICS_EXPORTER=none to not send metrics at all.",
            self.url, how,
        )

    def end_export(self) -> None:
        _reporting.refused = False


_reporting = threading.local()  # on a thread whose export was just refused: its report is ours to make


class _HideRefusal(logging.Filter):
    """On the SDK exporter's loggers: the SDK's line about a refusal that loopscope reports
    itself (a warning or error logged on the thread whose export was just refused)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno >= logging.WARNING and getattr(_reporting, "refused", False))


_HIDE = _HideRefusal()


def http_metric_exporter(endpoint: str | None, headers: Mapping[str, str] | None) -> Any:
    """The SDK's OTLP/HTTP metric exporter, telling an endpoint that refuses metrics once."""
    import requests
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import MetricExportResult

    refusal = MetricsRefusal()

    class WatchedSession(requests.Session):
        def request(self, method: str, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:
            response = super().request(method, url, *args, **kwargs)
            if response.status_code in REFUSALS:
                refusal.refused(response.status_code, url if isinstance(url, str) else url.decode())
            return response

    class RefusalAwareMetricExporter(OTLPMetricExporter):
        def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
            if refusal.status is not None:
                refusal.dropped_exports += 1
                return MetricExportResult.FAILURE
            try:
                return super().export(metrics_data, timeout_millis=timeout_millis, **kwargs)
            finally:
                refusal.end_export()
                refusal.say_once()

    for name in _SDK_LOGGERS:
        logging.getLogger(name).addFilter(_HIDE)  # once: a logger keeps one copy of a filter
    exporter = RefusalAwareMetricExporter(endpoint=endpoint, headers=dict(headers) if headers else None, session=WatchedSession())
    exporter.refusal = refusal  # type: ignore[attr-defined]  # for tests and status
    return exporter


# the SDK's OTLP/gRPC exporters log a failed export here, with its status code as an argument
_SDK_GRPC_LOGGER = "opentelemetry.exporter.otlp.proto.grpc.exporter"
_exporting = threading.local()  # the refusal of the gRPC metric export running on this thread


class _GrpcRefusal(logging.Filter):
    """On the SDK's gRPC exporter logger: a metric export answered ``UNIMPLEMENTED`` (no
    metrics service there) is a refusal, reported by loopscope once instead of the SDK's
    line at every export."""

    def filter(self, record: logging.LogRecord) -> bool:
        refusal = getattr(_exporting, "refusal", None)
        if refusal is None:
            return True
        code = next((arg for arg in record.args if getattr(arg, "name", None) == "UNIMPLEMENTED"), None) \
            if isinstance(record.args, tuple) else None
        if code is not None:
            refusal.refused("UNIMPLEMENTED", refusal.url or "the endpoint")
        return not (record.levelno >= logging.WARNING and getattr(_reporting, "refused", False))


_GRPC_FILTER = _GrpcRefusal()


def grpc_metric_exporter(endpoint: str | None, headers: Mapping[str, str] | None, shown: str | None = None) -> Any:
    """The SDK's OTLP/gRPC metric exporter, telling an endpoint without a metrics service
    (a tracing backend's gRPC port: ``UNIMPLEMENTED``) once, as over HTTP; ``shown`` names
    the endpoint where ``endpoint`` is None (the SDK then reads it from the environment)."""
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import MetricExportResult

    refusal = MetricsRefusal()
    refusal.url = (endpoint or shown or os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
                   or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or "the OTLP/gRPC endpoint")

    class RefusalAwareMetricExporter(OTLPMetricExporter):
        def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
            if refusal.status is not None:
                refusal.dropped_exports += 1
                return MetricExportResult.FAILURE
            _exporting.refusal = refusal
            try:
                return super().export(metrics_data, timeout_millis=timeout_millis, **kwargs)
            finally:
                _exporting.refusal = None
                refusal.end_export()
                refusal.say_once()

    logging.getLogger(_SDK_GRPC_LOGGER).addFilter(_GRPC_FILTER)  # once: a logger keeps one copy of a filter
    exporter = RefusalAwareMetricExporter(endpoint=endpoint, headers=dict(headers) if headers else None)
    exporter.refusal = refusal  # type: ignore[attr-defined]  # for tests and status
    return exporter
