"""The ClickHouse engine's sink (:class:`~loopscope.storage.api.BundleSink`): loopscope's spans
written into ``otel_traces`` as the Collector's ``clickhouseexporter`` writes them (:mod:`.spans`),
so that ``loopscope collect --db clickhouse://...`` (or ``chdb://...``) serves users without a
Collector. ClickHouse's materialized views do the mapping (:mod:`.ddl`): the
:class:`~loopscope.storage.rows.SpanMapping` the seam hands over is not used here.

Only ended spans are written (``submit_end``, ``submit(END, ...)``), one row each, as the exporter
writes them; a start (``submit_start``) is nothing to write. Rows are batched: a bundle (a
request's spans) is one ``INSERT``, and a background thread writes what is queued every
``flush_interval`` seconds, in one ``INSERT`` of at most ``batch_rows`` rows. A write that fails
keeps its rows queued for the next one (``last_error`` says why) until ``max_queued`` rows wait,
beyond which new spans are dropped and counted. Re-sending a span is harmless: the derived tables
keep one row per span (docs/clickhouse.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from ..limits import CLOSE_TIMEOUT, WriterStats
from ..rows import END
from .runner import Runner, connect
from .spans import json_each_row, row_of

DEFAULT_BATCH_ROWS = 10_000
DEFAULT_MAX_QUEUED = 1_000_000


class ClickHouseSink:
    """Ended spans into ``otel_traces`` of the store ``url`` names, batched (see the module)."""

    def __init__(self, url: str, *, flush_interval: float = 0.5, batch_rows: int = DEFAULT_BATCH_ROWS,
                 max_queued: int = DEFAULT_MAX_QUEUED, lock_timeout: float = 10.0, table: str = "otel_traces",
                 **ignored: Any) -> None:
        self.runner: Runner = connect(url, timeout=lock_timeout)
        self.path = self.runner.target.url
        self.table = table
        self.flush_interval = flush_interval
        self.batch_rows = batch_rows
        self.max_queued = max_queued
        self._queue: list[dict[str, Any]] = []
        self._bundle: list[dict[str, Any]] | None = None
        self._lock = threading.Lock()  # the queue
        self._write_lock = threading.Lock()  # one INSERT at a time, in queue order
        self._written = self._dropped = self._failed = self._batches = self._refused = 0
        self._last_error: str | None = None
        self._stop = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="loopscope-clickhouse-sink", daemon=True)
        self._thread.start()

    # -- spans in ----------------------------------------------------------------------------

    def submit(self, kind: int, span: Any) -> None:
        if kind == END:
            self.submit_end(span)

    def submit_start(self, span: Any) -> None:
        """A span's start: nothing to write (the exporter writes ended spans only)."""

    def submit_end(self, span: Any) -> None:
        row = row_of(span)
        with self._lock:
            if self._bundle is not None:
                self._bundle.append(row)
            elif self._closed or len(self._queue) >= self.max_queued:
                self._dropped += 1
            else:
                self._queue.append(row)

    def begin_bundle(self) -> None:
        with self._lock:
            self._bundle = []

    def end_bundle(self, raw: list[tuple[Any, ...]] | None = None) -> None:
        """The bundle's rows queued together (``raw``: the raw copies DuckDB keeps; here
        ``otel_traces`` is the raw copy)."""
        with self._lock:
            bundle, self._bundle = self._bundle or [], None
            if self._closed or len(self._queue) + len(bundle) > self.max_queued:
                self._dropped += len(bundle)
            else:
                self._queue.extend(bundle)

    def count_refused(self, spans: int = 0, reason: str | None = None) -> None:
        with self._lock:
            self._refused += 1
            self._last_error = reason or self._last_error

    # -- writing -----------------------------------------------------------------------------

    def _write_some(self) -> bool:
        """Write what is queued, a batch at a time; False when a write failed (rows kept)."""
        with self._write_lock:
            while True:
                with self._lock:
                    batch = self._queue[: self.batch_rows]
                if not batch:
                    return True
                try:
                    self.runner.insert_json(self.table, json_each_row(batch))
                except Exception as exc:  # the server away, the directory held: kept for the next write
                    with self._lock:
                        self._failed += 1
                        self._last_error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                    return False
                with self._lock:
                    del self._queue[: len(batch)]
                    self._written += len(batch)
                    self._batches += 1

    def _run(self) -> None:
        while not self._stop.wait(self.flush_interval):
            self._write_some()

    def flush(self, timeout: float | None = 30.0) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._write_some():
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(min(0.2, self.flush_interval))

    def flush_then(self, then: Callable[[bool], None]) -> None:
        then(self.flush(30.0))

    def close(self, timeout: float | None = CLOSE_TIMEOUT) -> None:
        if self._closed:
            return
        self.flush(timeout)
        with self._lock:
            self._closed = True
            self._dropped += len(self._queue)  # what could not be written in time
            self._queue.clear()
        self._stop.set()
        self._thread.join(5)
        self.runner.close()

    def stats(self) -> WriterStats:
        with self._lock:
            return WriterStats(queued=len(self._queue), written_events=self._written, written_turns=0,
                               dropped=self._dropped, excluded=0, failed_writes=self._failed, batches=self._batches,
                               last_error=self._last_error)


def open_sink(url: str, *, mapping: Any = None, **options: Any) -> ClickHouseSink:
    """The sink of the ClickHouse store ``url`` names (``mapping`` unused: the views map)."""
    return ClickHouseSink(url, **options)


__all__ = ["ClickHouseSink", "open_sink"]
