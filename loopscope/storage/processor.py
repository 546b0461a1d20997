"""The span processor that feeds the store: GenAI spans to the background writer."""

from __future__ import annotations

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from .. import semconv as a
from .._guard import internal_error
from .writer import _END, _START, StoreWriter

_STARTS = frozenset({a.OP_EXECUTE_TOOL, a.OP_INVOKE_AGENT})
_ENDS = frozenset({a.OP_EXECUTE_TOOL, a.OP_INVOKE_AGENT, a.OP_CHAT})


class StoreSpanProcessor(SpanProcessor):
    """Hands GenAI spans to a :class:`StoreWriter`; costs one deque append per span."""

    def __init__(self, writer: StoreWriter) -> None:
        self.writer = writer
        self._submit = writer.submit  # bound once: this runs twice per recorded span

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        try:
            # An SDK span's attributes are a read-only view of BoundedAttributes: its copy()
            # is one dict.copy, while its get() runs Python frames and, for the spans of
            # other instrumentations that lack the key, raises and catches a KeyError.
            if span.attributes.copy().get(a.OPERATION) in _STARTS:
                self._submit(_START, span)
        except Exception:
            internal_error("store processor start")

    def on_end(self, span: ReadableSpan) -> None:
        try:
            if span.attributes.copy().get(a.OPERATION) in _ENDS:
                self._submit(_END, span)
        except Exception:
            internal_error("store processor end")

    def shutdown(self) -> None:
        self.writer.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.writer.flush(timeout_millis / 1000)
