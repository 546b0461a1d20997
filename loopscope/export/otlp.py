"""OTLP export of spans and metrics, configured by the standard ``OTEL_*`` variables.

Arguments given to ``configure()`` win over the environment; the environment wins over
the exporters' defaults. Spans leave through a batch processor sized for bursts whose
drops are counted, and through the content policy, which strips or scrubs content.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanContext, Status

from .. import semconv as a
from .._guard import guard, logger, warn_once
from .._otel_sdk import attribute_values, own_encoder, queued_spans, shutdown_batch, span_attributes, start_attributes
from ..content.policy import ContentPolicy
from .encoder import SpanEncoder
from .notices import NoticeSender, NoticeSplitter, logs_endpoint, notices_wanted

QUEUE_SIZE = 65_536
"""Spans held for export. The SDK's default (2,048) drops about a third of spans when an
agent produces them flat out on a two-core machine; this holds bursts of that size."""
QUEUE_BYTES = 64 << 20
"""Bytes of spans held for export at most: the spans' text and 3 KB each for the span
itself (as the store's queue counts them), from a running mean over a sample of the spans
queued. Past it spans are dropped and counted, as past :data:`QUEUE_SIZE`: 65,536 spans
of 3.5 KB are 230 MB, while an endpoint that is down holds them all."""
_SPAN_BYTES = 3_072
_SAMPLE_EVERY = 16  # spans between two that are measured (a power of two)
BATCH_SIZE = 2_048
SHUTDOWN_MILLIS = 3_000


@dataclass
class OTLPSettings:
    """Where OTLP goes. ``None`` fields fall back to the ``OTEL_EXPORTER_OTLP_*`` variables."""

    endpoint: str | None = None
    protocol: str | None = None
    headers: Mapping[str, str] | None = None

    def enabled(self) -> bool:
        """Export only when an endpoint is given here or in the environment."""
        return bool(
            self.endpoint
            or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
            or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        )

    def resolved_protocol(self, signal: str) -> str:
        return (
            self.protocol
            or os.environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL")
            or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or "http/protobuf"
        ).strip().lower()


def _signal_endpoint(base: str | None, signal: str, protocol: str) -> str | None:
    """An explicit base endpoint becomes the signal's URL, as the variable would."""
    if base is None:
        return None
    if protocol.startswith("http"):
        return base.rstrip("/") + f"/v1/{signal}"
    return base


def span_exporter(settings: OTLPSettings) -> SpanExporter:
    """The SDK's OTLP span exporter for ``settings``, encoding with loopscope's encoder
    (:mod:`loopscope.export.encoder`: the same bytes, a fraction of the CPU)."""
    protocol = settings.resolved_protocol("traces")
    endpoint = _signal_endpoint(settings.endpoint, "traces", protocol)
    headers = dict(settings.headers) if settings.headers else None
    exporter: SpanExporter
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        exporter = GrpcExporter(endpoint=endpoint, headers=headers)
    elif protocol not in ("http/protobuf", "http/json"):
        raise ValueError(f"unknown OTLP protocol {protocol!r} (use http/protobuf or grpc)")
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        exporter = HttpExporter(endpoint=endpoint, headers=headers)
    own_encoder(exporter, SpanEncoder().encode)
    return exporter


def with_notices(exporter: SpanExporter, settings: OTLPSettings) -> tuple[SpanExporter, NoticeSender | None]:
    """``exporter`` with start notices sent beside it (to the same endpoint's logs
    receiver), and their sender; as it is, and None, when notices are off."""
    if not notices_wanted():
        return exporter, None
    protocol = settings.resolved_protocol("logs")
    sender = NoticeSender(logs_endpoint(settings.endpoint, protocol), protocol, settings.headers)
    return NoticeSplitter(exporter, sender), sender


def metric_exporter(settings: OTLPSettings) -> Any:
    protocol = settings.resolved_protocol("metrics")
    endpoint = _signal_endpoint(settings.endpoint, "metrics", protocol)
    headers = dict(settings.headers) if settings.headers else None
    if protocol == "grpc":
        from .refused import grpc_metric_exporter  # an endpoint without a metrics service is said once

        return grpc_metric_exporter(endpoint, headers, shown=settings.endpoint)
    from .refused import http_metric_exporter  # an endpoint without a metrics receiver is said once

    return http_metric_exporter(endpoint, headers)


class PolicyExporter(SpanExporter):
    """Sends spans through ``inner`` after the content policy has had its say."""

    def __init__(self, inner: SpanExporter, policy: ContentPolicy) -> None:
        self.inner = inner
        self.policy = policy
        self.failed_batches = 0
        self.failed_spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        filtered = [filtered_span(span, self.policy) for span in starts_made(spans)]
        try:
            result = self.inner.export(filtered)
        except Exception as exc:  # an exporter that raises must not kill the batch thread
            result = SpanExportResult.FAILURE
            warn_once("otlp-export", "loopscope: OTLP export failed (%s); spans are still stored locally", exc)
        if result is not SpanExportResult.SUCCESS:
            self.failed_batches += 1
            self.failed_spans += len(spans)
        return result

    def shutdown(self, timeout_millis: int = SHUTDOWN_MILLIS) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def filtered_span(span: ReadableSpan, policy: ContentPolicy) -> ReadableSpan:
    """``span`` as it may leave the process: content dropped or scrubbed, a copy if changed."""
    # the span's own dict, read only (the public view iterates in Python frames, two a key)
    attributes = policy.export_attributes(span_attributes(span))
    events = span.events
    scrub_events = bool(events) and any(
        e.attributes and ("exception.message" in e.attributes or a.EVALUATION_EXPLANATION in e.attributes) for e in events
    )
    status = span.status
    # an error's description quotes the exception message, which may quote inputs
    description = status.description
    if description and policy.masks:
        cleaned = policy.scrub(description, "exception.message")
        if cleaned != description:
            status = Status(status.status_code, cleaned)
    if attributes is None and not scrub_events and status is span.status:
        return span
    if scrub_events:
        from opentelemetry.sdk.trace import Event

        events = tuple(
            Event(e.name, policy.export_attributes(e.attributes) or e.attributes, e.timestamp) for e in events
        )
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=attributes if attributes is not None else span.attributes,
        events=events,
        links=span.links,
        kind=span.kind,
        instrumentation_scope=span.instrumentation_scope,
        status=status,
        start_time=span.start_time,
        end_time=span.end_time,
    )


_PENDING_OPS = frozenset({a.OP_INVOKE_AGENT, a.OP_EXECUTE_TOOL})
_OWN_SCOPE = "loopscope"  # the tracer name loopscope's spans are made with (ingest.spans.OWN_SCOPE)
_random = random.Random()


def pending_span(span: Span, attributes: dict[str, Any] | None = None) -> ReadableSpan:
    """A zero-duration copy of a span that started and still runs, made when the batch its
    start was queued in leaves (:class:`StartMarker`).

    OTLP carries spans when they end; loopscope's store writes a tool call's start row
    when the tool starts and a turn's input message when the turn starts. The copy lets
    a collector (``loopscope collect``) write those rows in the same order the
    in-process store does: the start attributes as they were (the content policy
    applies on export as to any span) and ``loopscope.pending_for`` = the real span's id
    in hex. It never leaves as a span: :class:`loopscope.export.notices.NoticeSplitter`
    takes it out of the batch and sends it as an OTLP log record (a *start notice*),
    which tracing backends do not count as a span, an agent run or a tool call.
    ``LOOPSCOPE_OTLP_PENDING=0`` turns them off (then a collector writes start rows when
    the spans end).
    """
    ctx = span.get_span_context()  # a started span's context is set
    if attributes is None:
        attributes = dict(span.attributes or {})
    attributes[a.PENDING_OPERATION] = attributes.pop(a.OPERATION, None) or ""
    attributes[a.PENDING_FOR] = f"{ctx.span_id:016x}"
    span_id = _random.getrandbits(64) or 1
    return ReadableSpan(
        name=f"{span.name} (pending)",
        context=SpanContext(ctx.trace_id, span_id, is_remote=False, trace_flags=ctx.trace_flags, trace_state=ctx.trace_state),
        parent=ctx,
        resource=span.resource,
        attributes=attributes,
        kind=span.kind,
        instrumentation_scope=span.instrumentation_scope,
        start_time=span.start_time,
        end_time=span.start_time,
    )


class StartMarker:
    """Where a started span's start notice belongs in the export stream: queued when the
    span starts (a reference and its count of start attributes, not a copy), and made into
    a pending copy (:func:`pending_span`) by :func:`starts_made` when its batch leaves, if
    the span still runs. A span that has ended by then carries its start itself (it is in
    that batch or the next), so most short spans cost no copy and no notice: a copy made at
    every start was a third of what the export cost an instrumented call (issue 31)."""

    __slots__ = ("context", "count", "span")

    def __init__(self, span: Span, count: int) -> None:
        self.span = span
        self.count = count
        self.context = span.get_span_context()  # the batch processor reads it (sampled or not)


def starts_made(spans: Sequence[ReadableSpan]) -> Sequence[ReadableSpan]:
    """A batch with each :class:`StartMarker` made into its span's pending copy (its start
    attributes as they were, and ``loopscope.pending_sent`` set on the span) where the span
    still runs, or left out where it has ended."""
    if not any(type(span) is StartMarker for span in spans):
        return spans
    made: list[ReadableSpan] = []
    for span in spans:
        if type(span) is not StartMarker:
            made.append(span)
            continue
        marker = cast(StartMarker, span)
        with guard("export pending span"):
            attributes = start_attributes(marker.span, marker.count, {a.PENDING_SENT: True})
            if attributes is not None:
                made.append(pending_span(marker.span, attributes))
    return made


class CountingBatchProcessor(BatchSpanProcessor):
    """A batch processor that counts the spans its full queue had to drop, and queues a
    :class:`StartMarker` for each ``invoke_agent`` and ``execute_tool`` span when it
    starts: one still running when its batch leaves is sent as a start notice by
    ``notices`` (see :mod:`loopscope.export.notices`), so that the export stream carries
    the starts in order. Without ``notices``, or once they are refused, nothing is queued."""

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        max_queue_size: int = QUEUE_SIZE,
        max_export_batch_size: int = BATCH_SIZE,
        max_queue_bytes: int = QUEUE_BYTES,
        notices: NoticeSender | None = None,
    ) -> None:
        super().__init__(exporter, max_queue_size=max_queue_size, max_export_batch_size=max_export_batch_size)
        self.max_queue_size = max_queue_size
        self.max_queue_bytes = max_queue_bytes
        self._seen = 0
        self._mean_bytes = _SPAN_BYTES  # a queued span's estimated bytes, the mean of a sample
        self.dropped = 0
        self.notices = notices
        self._lock = threading.Lock()

    @property
    def pending(self) -> bool:
        """Whether started spans get a start notice (sent, or wanted and not refused yet)."""
        return self.notices is not None and self.notices.enabled

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        notices = self.notices
        if notices is None or not notices.enabled:
            return
        with guard("export pending span"):
            attributes = span_attributes(span)  # read on the thread that owns the span, which just started it
            if attributes is None or attributes.get(a.OPERATION) not in _PENDING_OPS or not span.get_span_context().trace_flags.sampled:
                return
            scope = span.instrumentation_scope
            if scope is None or scope.name != _OWN_SCOPE:  # another instrumentation's (pydantic-ai's): no start rows of its own
                return
            self.on_end(StartMarker(span, len(attributes)))  # type: ignore[arg-type]  # the batch's exporter takes it out

    def on_end(self, span: ReadableSpan) -> None:
        queued = queued_spans(self)
        if queued is not None:
            over_bytes = queued * self._mean_bytes >= self.max_queue_bytes
            if over_bytes or queued >= self.max_queue_size:
                with self._lock:
                    self.dropped += 1
                if self.dropped == 1 or self.dropped % 10_000 == 0:
                    logger.warning("loopscope: the OTLP export queue is full; %d spans dropped so far", self.dropped)
                if over_bytes:
                    return  # past the count the SDK's own queue drops one; past the bytes, this one is
            self._seen = seen = self._seen + 1
            if not seen & (_SAMPLE_EVERY - 1) or seen == 1:
                self._mean_bytes = (self._mean_bytes * 7 + _span_bytes(span)) // 8
        super().on_end(span)

    def shutdown(self, timeout_millis: int = SHUTDOWN_MILLIS) -> None:
        """Send what is queued, but give up after ``timeout_millis``: a backend that is down
        must not hold the application's exit hostage."""
        if not shutdown_batch(self, timeout_millis):
            super().shutdown()


def _span_bytes(span: ReadableSpan) -> int:
    """What a span holds, about: its text attributes' lengths and :data:`_SPAN_BYTES`."""
    size = _SPAN_BYTES
    values = attribute_values(span)
    if values is not None:
        for value in values:
            if type(value) is str:
                size += len(value)
    return size
