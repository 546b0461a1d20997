"""The store writer's bounds and counters, without the writer: what ``configure()`` and a
writer process's application side need, which import neither DuckDB nor Arrow
(:mod:`loopscope.storage.writer` re-exports them)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CLOSE_TIMEOUT", "QUEUE_BYTES", "WriterStats"]

CLOSE_TIMEOUT = 5.0
"""Seconds :meth:`StoreWriter.close` (``loopscope.shutdown()``, and the close at exit) waits
at most for the last rows to be written; what is not written by then is counted as lost.
Under the 10 s a container gets between SIGTERM and SIGKILL, with room for the OTLP
exporters' own bound."""
QUEUE_BYTES = 64 << 20
"""Bytes the queue holds at most by default (``max_bytes``, ``configure(queue_bytes=...)``),
estimated from each span's text and a fixed 3 KB for the span itself, with the rows the
writer holds (mapped, being written, kept after failed writes); past it spans are dropped
and counted, as past ``max_queue``; a queue half full wakes the writer. With the writer
held, a flood of small turns peaked ~195 MB over the process's RSS before it
(``benchmarks/bench_memory.py``; when the rows held were not counted yet). A value far over
the store's cap counts what is kept of it (``ingest/big_values.py``)."""


@dataclass
class WriterStats:
    """Counters of a writer, for ``loopscope status`` and for tests."""

    queued: int
    written_events: int
    written_turns: int
    dropped: int
    excluded: int
    failed_writes: int
    batches: int
    last_error: str | None
    queued_bytes: int = 0
    """The estimated bytes of the spans queued and the rows held (mapped, being written, kept)."""
    lost_from_file: int = 0
    """Events this writer had written that the file no longer holds (its WAL was removed)."""
    written_calls: int = 0
    """Model call rows (``model_calls``) written."""
