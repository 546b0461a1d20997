"""The raw copies of received spans: the ``spans`` table, written as they came, in batches
off the request threads (``loopscope collect`` keeps every span it receives there)."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

from .._guard import logger
from ..content.policy import ContentPolicy
from . import scrub
from .connection import open_store
from .flush import FlushRequest, settle
from .idempotent import fresh_spans_sql

# -- the raw spans ---------------------------------------------------------------------------


class RawSpanWriter:
    """Writes received spans as they came to the ``spans`` table, in batches of whatever
    arrived in ``interval``, off the request threads; :meth:`flush` waits until what was
    queued before it is written. A span the table holds already is left out. Rows that cannot be written are kept and retried (past
    ``max_backlog``, the oldest are dropped and counted). The file must have the schema
    already (:class:`Ingest` sees to it)."""

    def __init__(self, path: str, *, interval: float = 0.5, lock_timeout: float = 2.0, max_backlog: int = 500_000,
                 content: ContentPolicy | None = None) -> None:
        self.path = path
        # secrets are masked in the raw copies too: a sender other than loopscope (or one
        # with capture on and its own policy) sends what it has
        self.scrubber = scrub.scrubber(content or ContentPolicy())
        self.interval = interval
        self.lock_timeout = lock_timeout
        self.max_backlog = max_backlog
        self.dropped = 0
        self._queue: collections.deque[Any] = collections.deque()
        self._wake = threading.Event()
        self._closed = False
        self.written = 0
        self.failed_writes = 0
        self.last_error: str | None = None
        self._backlog: list[tuple[Any, ...]] = []
        self._thread = threading.Thread(target=self._run, name=f"loopscope-raw-spans {path}", daemon=True)
        self._thread.start()

    def submit(self, rows: list[tuple[Any, ...]]) -> None:
        self._queue.append(rows)

    def flush(self, timeout: float | None = 30.0) -> bool:
        return self.wait(self.request_flush(), timeout)

    def request_flush(self) -> FlushRequest:
        """Ask for a write of what is queued now; :meth:`wait` for the answer."""
        marker = FlushRequest()
        self._queue.append(marker)
        self._wake.set()
        return marker

    def then(self, callback: Callable[[bool], None]) -> None:
        """Call ``callback(ok)`` once what is queued now is written (ok) or failed to be, at
        the next batch (this does not hasten it)."""
        self._queue.append(FlushRequest(callback))

    @property
    def idle(self) -> bool:
        """Nothing queued or kept for a retry."""
        return not self._queue and not self._backlog

    @staticmethod
    def wait(marker: FlushRequest, timeout: float | None = 30.0) -> bool:
        return marker.wait(timeout)

    def close(self, timeout: float = 30.0) -> None:
        if self._closed:
            return
        self.flush(timeout)
        self._closed = True
        self._wake.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        backlog = self._backlog
        while True:
            self._wake.wait(self.interval)
            self._wake.clear()
            closing = self._closed
            markers: list[FlushRequest] = []
            while self._queue:
                item = self._queue.popleft()
                if type(item) is FlushRequest:
                    markers.append(item)
                else:
                    backlog.extend(item)
            ok = True
            if backlog:
                try:
                    self._write(backlog)
                    self.written += len(backlog)
                    backlog.clear()
                    self.last_error = None
                except Exception as exc:
                    ok = False
                    self.failed_writes += 1
                    if len(backlog) > self.max_backlog:
                        self.dropped += len(backlog) - self.max_backlog
                        del backlog[: len(backlog) - self.max_backlog]
                    self.last_error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                    logger.warning("loopscope collect: cannot write raw spans to %s (%s); retrying", self.path, self.last_error)
            settle(markers, ok, "collector raw spans callback")
            if closing:
                return

    def _write(self, rows: list[tuple[Any, ...]]) -> None:
        import pyarrow as pa

        columns = list(zip(*rows))
        us = pa.timestamp("us", tz="UTC")
        text = pa.string()
        masked = self.scrubber.masked
        table = pa.table(
            [
                pa.array(columns[0], text), pa.array(columns[1], text), pa.array(columns[2], text), pa.array(columns[3], text),
                pa.array(columns[4], text), pa.array(columns[5], us), pa.array(columns[6], us), pa.array(columns[7], pa.float64()),
                pa.array(columns[8], text), masked(pa.array(columns[9], text), "text"), masked(pa.array(columns[10], text), "attributes"),
                pa.array(columns[11], text), masked(pa.array(columns[12], text)), pa.array(columns[13], text), pa.array(columns[14], text), pa.array(columns[15], text),
                pa.array(columns[16], text), pa.array(columns[17], text), pa.array(columns[18], text), pa.array(columns[19], us),
            ],
            names=list(RAW_COLUMNS),
        )
        starts = [t for t in columns[5] if t is not None]
        # a span resent after a crash is not kept twice (idempotent.py)
        insert = fresh_spans_sql("_loopscope_raw_spans", ", ".join(RAW_COLUMNS), min(starts, default=None), max(starts, default=None))
        with open_store(self.path, read_only=False, timeout=self.lock_timeout) as con:
            con.register("_loopscope_raw_spans", table)
            con.execute(insert).fetchall()
            con.unregister("_loopscope_raw_spans")


RAW_COLUMNS = (
    "trace_id", "span_id", "parent_span_id", "name", "kind", "start_time", "end_time", "duration_ms", "status_code",
    "status_message", "attributes", "resource", "events", "links", "scope_name", "scope_version", "service_name", "role",
    "framework", "received_at",
)
