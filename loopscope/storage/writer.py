"""The background writer: spans in from the hot path, columnar batches out to DuckDB.

The calling thread only appends a reference to a bounded deque. Two daemon threads do
the rest, as a pipeline: the *mapper* wakes every ``flush_interval`` (or when a batch is
full), reduces the spans to facts in Arrow record batches (:class:`mapping.Facts`) and
hands the batch on; the *writer* opens the file, gives each row its per-session index,
makes the rows from the facts in SQL and writes them in one transaction, holding the
file only for that moment so that other processes can read in between. While DuckDB
writes one batch (without the GIL, on one thread) the mapper reads the spans of the next.
Rows that cannot be written (a reader holding the file too long, a full disk) are kept
and retried; past ``max_queue`` the oldest are dropped and counted, never silently.
"""

from __future__ import annotations

import atexit
import collections
import queue
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

import duckdb

from .._guard import clear_warning, internal_error, logger, warn_once
from . import mapping
from .connection import open_store
from .errors import StoreError
from .mapping import _END, _START
from .policy import PersistencePolicy
from .schema import migrate

__all__ = ["_END", "_START", "StoreWriter", "WriterStats", "write_batch"]

assert mapping.CHUNK & (mapping.CHUNK - 1) == 0, "CHUNK is a power of two"
_WAKE_MASK = mapping.CHUNK - 1


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


class _Marker:
    """A flush request travelling through the queue behind the items it waits for."""

    __slots__ = ("done", "ok")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.ok = True


class _Batch:
    """What the mapper hands the writer: a batch's facts and the flushes waiting for it."""

    __slots__ = ("facts", "markers")

    def __init__(self, facts: mapping.Facts, markers: list[_Marker]) -> None:
        self.facts = facts
        self.markers = markers


class StoreWriter:
    """Writes the rows of recorded spans to one DuckDB file from background threads."""

    def __init__(
        self,
        path: str,
        *,
        policy: PersistencePolicy | None = None,
        flush_interval: float = 0.5,
        max_queue: int = 200_000,
        batch_size: int = 50_000,
        lock_timeout: float = 2.0,
    ) -> None:
        self.path = path
        self.policy = policy or PersistencePolicy()
        self.flush_interval = flush_interval
        self.max_queue = max_queue
        self.batch_size = batch_size
        self.lock_timeout = lock_timeout
        self._queue: collections.deque[Any] = collections.deque()
        self._wake = threading.Event()
        self._closed = False
        # mapper -> writer; one batch in hand at most, so the mapper stays a batch ahead
        self._handoff: queue.Queue[_Batch | None] = queue.Queue(maxsize=1)
        self._mapping = False  # the mapper holds items taken from the queue
        self._mapped = 0  # rows the mapper holds, not handed on yet
        self._writing = False  # the writer thread holds a batch
        self._handed = 0  # rows handed to the writer thread (counted by the mapper)
        self._settled = 0  # rows of those written or kept (counted by the writer thread)
        self._backlog: mapping.Facts | None = None  # rows that could not be written yet
        self._wal_pending = False  # the last batch left its rows in the WAL (see _write)
        self._written_events = 0
        self._written_turns = 0
        self._dropped = 0
        self._excluded = 0
        self._failed_writes = 0
        self._batches = 0
        self._last_error: str | None = None
        self._skip: frozenset[str] = frozenset()
        self._allowed_by: PersistencePolicy | None = None
        self._writer = threading.Thread(target=self._run_writer, name=f"loopscope-writer {path}", daemon=True)
        self._thread = threading.Thread(target=self._run, name=f"loopscope-mapper {path}", daemon=True)
        self._writer.start()
        self._thread.start()
        _live_writers.add(self)

    # -- the hot path --------------------------------------------------------------------

    def submit(self, kind: int, span: Any) -> None:
        """Queue a span (``_START`` or ``_END``) for mapping and writing. Never blocks."""
        queue = self._queue
        if len(queue) >= self.max_queue or self._closed:
            self._dropped += 1
            return
        queue.append((kind, span))
        if not len(queue) & _WAKE_MASK:  # every CHUNK spans: the mapper maps a burst as it comes
            self._wake.set()

    def submit_start(self, span: Any) -> None:
        self.submit(_START, span)

    def submit_end(self, span: Any) -> None:
        self.submit(_END, span)

    # -- control -------------------------------------------------------------------------

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Write everything queued so far; True when it reached the file."""
        if not self._thread.is_alive():
            return not self._queue
        marker = _Marker()
        self._queue.append(marker)
        self._wake.set()
        return marker.done.wait(timeout) and marker.ok

    def close(self, timeout: float | None = 30.0) -> None:
        """Flush, then stop the threads. Further spans are counted as dropped."""
        if self._closed:
            return
        self.flush(timeout)
        self._closed = True
        self._wake.set()
        self._thread.join(timeout)
        self._writer.join(timeout)
        _live_writers.discard(self)
        backlog = self._backlog
        lost = self._dropped + (backlog.rows if backlog is not None else 0)
        if lost:
            logger.warning("loopscope: %d events could not be stored in %s (%s)", lost, self.path, self._last_error or "queue full")

    def stats(self) -> WriterStats:
        backlog = self._backlog
        return WriterStats(
            queued=len(self._queue) + self._mapped + self._handed - self._settled + (backlog.rows if backlog is not None else 0),
            written_events=self._written_events,
            written_turns=self._written_turns,
            dropped=self._dropped,
            excluded=self._excluded,
            failed_writes=self._failed_writes,
            batches=self._batches,
            last_error=self._last_error,
        )

    # -- the mapper thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                self._wake.wait(self.flush_interval)
                self._wake.clear()
                closing = self._closed
                try:
                    self._drain()
                except Exception:
                    internal_error("store writer")
                if closing:
                    return
        finally:
            self._handoff.put(None)  # the writer thread stops after what was handed before

    def _drain(self) -> None:
        """Map what is queued, a chunk at a time, and hand it on in batches.

        A batch goes to the writer when it holds ``batch_size`` rows, when a flush waits
        for it, or when the queue is empty; so the writer starts on a burst's first batch
        while the rest is still being recorded, and later batches grow while it writes.
        """
        facts = mapping.Facts()
        markers: list[_Marker] = []
        while True:
            self._mapping = True  # before taking: the writer never sees the items nowhere
            try:
                items, taken = self._take(mapping.CHUNK)
                if items:
                    self._map(items, facts)
                markers += taken
                idle = not self._queue
                if (
                    markers
                    or (facts.rows and (idle or facts.rows >= self.batch_size))
                    or (idle and (self._backlog is not None or (self._wal_pending and not self._writing)))
                ):
                    self._handed += facts.rows
                    self._mapped = 0
                    self._handoff.put(_Batch(facts, markers))  # waits while the writer has one in hand
                    facts, markers = mapping.Facts(), []
                else:
                    self._mapped = facts.rows
            finally:
                self._mapping = False
            if idle:
                return

    def _take(self, count: int) -> tuple[list[Any], list[_Marker]]:
        items: list[Any] = []
        markers: list[_Marker] = []
        queue = self._queue
        popleft = queue.popleft
        for _ in range(min(len(queue), count)):
            item = popleft()
            if type(item) is _Marker:
                markers.append(item)
            else:
                items.append(item)
        return items, markers

    def _map(self, items: list[Any], facts: mapping.Facts) -> None:
        policy = self.policy
        if self._allowed_by is not policy:  # the policy's answer, asked once per policy
            self._skip = frozenset(t for t in set(mapping.EVENT_TYPES.values()) if not policy.allows(t))
            self._allowed_by = policy
        excluded = facts.excluded
        facts.add(items, self._skip, _yield_gil)
        self._excluded += facts.excluded - excluded

    # -- the writer thread ---------------------------------------------------------------

    def _run_writer(self) -> None:
        while True:
            batch = self._handoff.get()
            if batch is None:
                return
            self._writing = True
            ok = False
            try:
                ok = self._write(batch.facts)
            except Exception:
                internal_error("store writer")
            finally:
                self._settled += batch.facts.rows
                self._writing = False
                for marker in batch.markers:
                    marker.ok = ok
                    marker.done.set()

    def _more_waiting(self) -> bool:
        """Whether another batch follows at once: one is handed over or being mapped, or a
        chunk is queued (a burst). A trickle of spans between wakes is not."""
        return not self._handoff.empty() or self._mapping or len(self._queue) >= mapping.CHUNK

    def _write(self, facts: mapping.Facts) -> bool:
        backlog = self._backlog
        if backlog is not None:  # what could not be written before goes first
            self._backlog = None
            backlog.extend(facts)
            facts = backlog
        if not facts.rows:
            if self._wal_pending and not self._more_waiting():
                self._checkpoint()
            return True
        try:
            with open_store(self.path, read_only=False, timeout=self.lock_timeout) as con:
                _ensure_schema(self.path, con)
                # The rows reach the file proper at a checkpoint, which also rewrites the
                # table's last, partly filled row groups. When another batch follows at once
                # (a burst), this batch's rows stay in the WAL (on disk too: a reader
                # replays it), and the burst's last batch checkpoints them all at its commit
                # (DuckDB still checkpoints by itself once the WAL passes its threshold).
                final = not self._more_waiting()
                written_events, written_turns = write_batch(con, facts, checkpoint=final)
                self._wal_pending = not final
        except (duckdb.Error, StoreError, OSError) as exc:
            self._keep(facts, exc)
            return False
        self._written_events += written_events
        self._written_turns += written_turns
        self._batches += 1
        if self._last_error is not None:
            logger.warning("loopscope: writing to %s works again", self.path)
            clear_warning(f"write:{self.path}")
            self._last_error = None
        return True

    def _checkpoint(self) -> None:
        """Move what the last batches left in the WAL into the file (see :meth:`_write`)."""
        try:
            with open_store(self.path, read_only=False, timeout=self.lock_timeout) as con:
                con.execute("CHECKPOINT")
            self._wal_pending = False
        except (duckdb.Error, StoreError, OSError):
            pass  # the rows are safe in the WAL; the next batch's close checkpoints them

    def _keep(self, facts: mapping.Facts, exc: BaseException) -> None:
        """Hold rows that could not be written, up to max_queue; count the rest as dropped."""
        self._failed_writes += 1
        self._last_error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        warn_once(f"write:{self.path}", "loopscope: cannot write to %s (%s); keeping events in memory and retrying", self.path, self._last_error)
        overflow = facts.rows - self.max_queue
        if overflow > 0:
            self._dropped += overflow
            facts.drop_oldest(overflow)
        self._backlog = facts


def _yield_gil() -> None:
    """Let other threads take the GIL now. A DuckDB statement running on the writer thread
    takes the GIL back many times (when it hands results over, when it checks for signals);
    each time it would otherwise wait for the mapper's switch interval (5 ms) to run out,
    and the writer would crawl while the mapper works."""
    time.sleep(0)


_schema_ready: set[str] = set()
_schema_lock = threading.Lock()


def _ensure_schema(path: str, con: duckdb.DuckDBPyConnection) -> None:
    with _schema_lock:
        if path in _schema_ready:
            return
        migrate(con)
        _schema_ready.add(path)


def write_batch(con: duckdb.DuckDBPyConnection, facts: mapping.Facts, *, checkpoint: bool = True) -> tuple[int, int]:
    """Write the rows of a batch of facts in one transaction, giving events their per-session indices.

    The rows are made from the facts in SQL (:data:`mapping.EVENTS_SQL`,
    :data:`mapping.TURNS_SQL`), all in one script: every call into DuckDB from this
    thread has to win the GIL back from the mapper when it returns. DuckDB runs it on
    one thread, leaving the other cores to the application and the mapper.

    With ``checkpoint`` the commit checkpoints (a large batch then skips the WAL);
    without, the rows stay in the WAL, and closing the connection does not checkpoint.
    Returns how many events and turn summaries were written.
    """
    import pyarrow as pa  # imported here: the hot path and a plain import never need it

    events, turns = facts.event_table(), facts.turn_table()
    script = [
        "SET threads = 1",
        "SET checkpoint_threshold = '0b'" if checkpoint else "PRAGMA disable_checkpoint_on_shutdown",
        "BEGIN TRANSACTION",
    ]
    if events is not None:
        sessions = facts.sessions
        distinct = dict.fromkeys(sessions)  # in order of first appearance
        known = dict(
            con.execute(
                "SELECT session_id, last_index FROM sessions WHERE list_contains(?, session_id)", [list(distinct)]
            ).fetchall()
        )
        next_index = {s: known.get(s, 0) for s in distinct}
        indices = []
        add = indices.append
        for session in sessions:
            value = next_index[session] + 1
            next_index[session] = value
            add(value)
        con.register(mapping.EVENTS_TABLE, events.append_column("idx", pa.array(indices, pa.int64())))
        # the session counters from the same facts, in one statement: a row per session
        # is far cheaper than executemany's statement per session
        script += [mapping.EVENTS_SQL, _SESSIONS_SQL]
    if turns is not None:
        con.register(mapping.TURNS_TABLE, turns)
        script.append(mapping.TURNS_SQL)
    script.append("COMMIT")
    try:
        con.execute(";\n".join(script))
    except BaseException:
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:
            pass  # no transaction left to roll back
        raise
    return facts.event_rows, facts.turn_rows


_SESSIONS_SQL = f"""
INSERT INTO sessions
SELECT session_id, max(idx), min(created_us), max(created_us) FROM {mapping.EVENTS_TABLE} GROUP BY session_id
ON CONFLICT (session_id) DO UPDATE SET last_index = excluded.last_index,
  first_at = least(sessions.first_at, excluded.first_at),
  last_at = greatest(sessions.last_at, excluded.last_at)
"""


_live_writers: weakref.WeakSet[StoreWriter] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for writer in list(_live_writers):
        try:
            writer.close(timeout=10.0)
        except Exception:
            logger.warning("loopscope: could not flush %s at exit", writer.path, exc_info=True)
