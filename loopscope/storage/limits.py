"""The store writer's bounds and counters, without the writer: what ``configure()`` and a
writer process's application side need, which import neither DuckDB nor Arrow
(:mod:`loopscope.storage.duckdb.writer` re-exports them)."""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["CLOSE_TIMEOUT", "CLOSE_TIMEOUT_ENV", "QUEUE_BYTES", "WRITER_CLOSE_TIMEOUT", "WriterStats", "close_timeout"]

CLOSE_TIMEOUT = 5.0
"""Seconds :meth:`StoreWriter.close` (``loopscope.shutdown()``, and the close at exit) waits
at most for the last rows to be written; what is not written by then is counted as lost.
Under the 10 s a container gets between SIGTERM and SIGKILL, with room for the OTLP
exporters' own bound."""
WRITER_CLOSE_TIMEOUT = 60.0
"""Seconds a writer process goes on writing what it was handed after the application's
close (``configure(close_timeout=...)``, :data:`CLOSE_TIMEOUT_ENV`), before what it could not
write is counted as lost. The application waits :data:`CLOSE_TIMEOUT` at most for it, then
leaves it writing (the writer process holds everything by then): under load (several
writers and readers taking turns at the file) a close that killed the writer at 5 s cost
whole runs, while writing what was left took seconds more."""
CLOSE_TIMEOUT_ENV = "LOOPSCOPE_CLOSE_TIMEOUT"
"""The environment's :data:`WRITER_CLOSE_TIMEOUT` (seconds), when ``configure()`` does not say."""


def close_timeout(asked: float | None = None) -> float:
    """The writer process's bound after the close: ``asked`` (``configure(close_timeout=)``),
    else :data:`CLOSE_TIMEOUT_ENV`, else :data:`WRITER_CLOSE_TIMEOUT`. A ValueError for a
    negative, infinite or non-numeric ``asked``; a bad environment value is taken as the default."""
    if asked is not None:
        if isinstance(asked, bool) or not isinstance(asked, (int, float)) or not 0 <= asked < 1e9:
            raise ValueError(f"close_timeout must be a number of seconds >= 0, not {asked!r}")
        return float(asked)
    try:
        value = float(os.environ.get(CLOSE_TIMEOUT_ENV, ""))
    except ValueError:
        return WRITER_CLOSE_TIMEOUT
    return value if 0 <= value < 1e9 else WRITER_CLOSE_TIMEOUT  # (nan, inf: the default)


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
    """Event rows dropped or not written (the queue was full, the file stayed unwritable, the
    close came first): counted as the store would have held them, never as spans."""
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
    dropped_turns: int = 0
    """Turn summary rows (``turns``) dropped or not written, as :attr:`dropped` counts events."""
