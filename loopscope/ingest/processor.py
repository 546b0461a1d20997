"""The span processor that feeds the store: GenAI spans to the background writer."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from .. import semconv as a
from .._guard import internal_error
from .._otel_sdk import attributes_if_from
from .._otel_sdk import attributes_view as _attributes
from ..storage.rows import END, START
from .foreign import Assembler, classify
from .scores import foreign_scores
from .spans import OWN_SCOPE
from .stitch_foreign import Stitcher

if TYPE_CHECKING:
    from ..storage.duckdb.writer import StoreWriter
    from .writer_process import ProcessSpanWriter

_STARTS = frozenset({a.OP_EXECUTE_TOOL, a.OP_INVOKE_AGENT})
_ENDS = frozenset({a.OP_EXECUTE_TOOL, a.OP_INVOKE_AGENT, a.OP_CHAT})
_EXPIRE_EVERY = 5.0  # seconds between looks for idle foreign traces
PYDANTIC_AI_SCOPE = "pydantic-ai"
_MARKERS = frozenset({
    # a span without any of these (or pydantic-ai's scope) is nothing foreign.classify maps
    a.OPERATION, a.PROVIDER, "gen_ai.system", "openinference.span.kind", "traceloop.span.kind", "llm.request.type",
    "agent_name", "tool_arguments", a.EVALUATION_NAME,
})


class StoreSpanProcessor(SpanProcessor):
    """Hands GenAI spans to a :class:`StoreWriter`; costs one deque append per span of
    loopscope's own.

    Other instrumentations' GenAI spans in this process (pydantic-ai's, say) go through
    the same :class:`~loopscope.ingest.foreign.Assembler` that ``loopscope collect``
    uses, so a file written here and one written by a collector from the exported spans
    hold the same rows.
    """

    def __init__(self, writer: StoreWriter | ProcessSpanWriter) -> None:
        self.writer = writer
        self._submit = writer.submit  # bound once: this runs twice per recorded span
        self._assembler: Assembler | None = None  # made at the first foreign GenAI span
        self._lock = threading.Lock()
        self._next_expiry = 0.0

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        try:
            attributes = attributes_if_from(span, OWN_SCOPE)
            if attributes is not None and attributes.get(a.OPERATION) in _STARTS:
                self._submit(START, span)
        except Exception:
            internal_error("store processor start")

    def on_end(self, span: ReadableSpan) -> None:
        try:
            attributes = attributes_if_from(span, OWN_SCOPE)
            if attributes is not None:
                # a state span (loopscope.state_snapshot) or a tool outcome's correction is no
                # GenAI operation: asked only after
                if (attributes.get(a.OPERATION) in _ENDS or a.STATE_KIND in attributes or a.TOOL_CORRECTION in attributes
                        or a.EVALUATION_NAME in attributes):  # (a score: loopscope.score)
                    self._submit(END, span)
                assembler = self._assembler
                # an ended SDK span always has its context (ReadableSpan types it Optional)
                if assembler is not None and assembler.tracks(span.context.trace_id):  # pyright: ignore[reportOptionalMemberAccess]
                    self._assemble(span)  # an own turn claims foreign spans inside it
            else:
                self._foreign(span)
        except Exception:
            internal_error("store processor end")

    def _foreign(self, span: ReadableSpan) -> None:
        assembler = self._assembler
        tracked = assembler is not None and assembler.tracks(span.context.trace_id)  # pyright: ignore[reportOptionalMemberAccess]  # see on_end
        if not tracked:
            # most spans of other instrumentations (HTTP, databases) carry no GenAI marker at all
            scope = getattr(span.instrumentation_scope, "name", None)
            if _MARKERS.isdisjoint(_attributes(span)) and scope != PYDANTIC_AI_SCOPE:
                return
        if span.events or a.EVALUATION_NAME in _attributes(span):
            for score in foreign_scores(span):  # another instrumentation's gen_ai.evaluation.result (rare)
                self._submit(END, score)
        if not tracked and classify(span)[0] is None:
            return  # no GenAI span, and none of its trace is waiting for it
        if assembler is None:
            with self._lock:
                if self._assembler is None:
                    # bare model calls stitched into turns, as the collector does
                    self._assembler = Assembler(stitcher=Stitcher())
        self._assemble(span)

    def _assemble(self, span: ReadableSpan) -> None:
        assembler = self._assembler
        assert assembler is not None
        now = time.monotonic()
        with self._lock:
            rows = assembler.add(span)
            if now >= self._next_expiry:
                self._next_expiry = now + _EXPIRE_EVERY
                rows += assembler.expire()
        for kind, row in rows:
            self._submit(kind, row)

    def drain(self) -> None:
        """Hand on every foreign span still waiting for its agent run (at shutdown)."""
        assembler = self._assembler
        if assembler is None:
            return
        with self._lock:
            rows = assembler.drain()
        for kind, row in rows:
            self._submit(kind, row)

    def shutdown(self) -> None:
        self.drain()
        self.writer.close()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.writer.flush(timeout_millis / 1000)
