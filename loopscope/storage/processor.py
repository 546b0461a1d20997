"""The span processor that feeds the store: GenAI spans to the background writer."""

from __future__ import annotations

from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from .. import semconv as a
from .._guard import internal_error
from .writer import StoreWriter

_STARTS = frozenset({a.OP_EXECUTE_TOOL, a.OP_INVOKE_AGENT})
_ENDS = frozenset({a.OP_EXECUTE_TOOL, a.OP_INVOKE_AGENT, a.OP_CHAT})


class StoreSpanProcessor(SpanProcessor):
    """Hands GenAI spans to a :class:`StoreWriter`; costs one deque append per span."""

    def __init__(self, writer: StoreWriter) -> None:
        self.writer = writer

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        try:
            attrs: Any = span.attributes
            if attrs and attrs.get(a.OPERATION) in _STARTS:
                self.writer.submit_start(span)
        except Exception:
            internal_error("store processor start")

    def on_end(self, span: ReadableSpan) -> None:
        try:
            attrs: Any = span.attributes
            if attrs and attrs.get(a.OPERATION) in _ENDS:
                self.writer.submit_end(span)
        except Exception:
            internal_error("store processor end")

    def shutdown(self) -> None:
        self.writer.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.writer.flush(timeout_millis / 1000)
