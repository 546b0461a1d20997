"""The background writer: spans in from the hot path, columnar batches out to DuckDB.

The calling thread only appends a reference to a bounded deque. A daemon thread wakes
every ``flush_interval`` (or when a batch is full; by default the interval follows the
writer's own cost, see :data:`AUTO_SHARE`), reduces the spans to facts in Arrow
record batches a chunk at a time (:class:`mapping.Facts`), and once it holds
``batch_size`` rows, a waiting flush or all that was queued, writes them in one
transaction: it opens the file, gives each row its per-session index, makes the rows
from the facts in SQL, and lets the file go again, so that other processes can read in
between. Rows that cannot be written (a reader holding
the file too long, a full disk) are kept and retried; past ``max_queue`` the oldest are
dropped and counted, never silently.
"""

from __future__ import annotations

import atexit
import collections
import os
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import duckdb

from .._guard import clear_warning, internal_error, logger, warn_once
from . import mapping, recovery
from . import health, idempotent, scrub
from ..export.content import ContentPolicy
from .connection import open_store
from .errors import StoreError
from .mapping import _END, _START
from .policy import PersistencePolicy
from .schema import migrate

__all__ = ["_END", "_START", "StoreWriter", "WriterStats", "write_batch"]

AUTO_INTERVAL = (0.5, 5.0)
"""The shortest and the longest wait between two batches with ``flush_interval=None``."""
AUTO_SHARE = 0.05
"""With ``flush_interval=None``, the share of one core the writer's batches may take: after
a batch that took ``c`` seconds of the writer thread's CPU it waits ``c / AUTO_SHARE``
(within :data:`AUTO_INTERVAL`). Most of a batch's cost is the same whatever its size
(opening the file, a few statements: 17-25 ms), so while the application records
little, rows are written within half a second, and under a steady load the batches grow
instead of coming more often, and the writer keeps off the application's cores (and its
GIL)."""


WAL_LIMIT = 128 << 10
"""Bytes of WAL after which a batch's commit checkpoints. A batch's rows stay in the WAL
(on disk: durable, and every reader replays it) until then, or until the writer has been
idle for :data:`CHECKPOINT_IDLE`, or it closes. A checkpoint costs a small batch ~7.5
ms (it rewrites the tables' last row groups); but every attach, the writer's own next
one included, replays the WAL: ~2 ms more at 128 KB, ~6 ms at 512 KB. Measured on the
openai loop (60-call batches), 128 KB cost the writer 10-25% less CPU a batch than a
checkpoint per batch; 64 KB and 512 KB less than that."""
CHECKPOINT_IDLE = 5.0
"""Seconds without a batch after which a writer that left rows in the WAL checkpoints them,
so that the file alone holds every row again while the application records nothing."""


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


class StoreWriter:
    """Writes the rows of recorded spans to one DuckDB file from a background thread."""

    def __init__(
        self,
        path: str,
        *,
        policy: PersistencePolicy | None = None,
        flush_interval: float | None = None,
        max_queue: int = 200_000,
        batch_size: int = 100_000,
        lock_timeout: float = 2.0,
        track_turns: bool = False,
        content: ContentPolicy | None = None,
        skip_stored: bool = False,
    ) -> None:
        self.path = path
        # leave out of each batch the rows the store holds already (idempotent.py): a
        # collector's senders resend what it did not acknowledge before a crash
        self.skip_stored = skip_stored
        self.already_stored = 0
        # secrets masked, the redaction hook and a size cap, in the writer's thread (scrub.py)
        self.content = content or ContentPolicy()
        # the counters kept in the store, for `loopscope status` (health.py); the pipeline
        # sets report.otlp to count the OTLP exporter's drops as well
        self.report = health.Report()
        self._dropped_unwritable = 0
        self._last_failure: str | None = None  # kept after writes work again, unlike _last_error
        self._last_failure_at: float | None = None
        # an in-process writer notes the turns it opens, so that a crash leaves them
        # closable; and it closes those that a dead process left (storage/recovery.py)
        self._tracker = recovery.Tracker() if track_turns else None
        self._recovered = not track_turns
        self.policy = policy or PersistencePolicy()
        self.flush_interval = flush_interval
        self.max_queue = max_queue
        self.batch_size = batch_size
        self.lock_timeout = lock_timeout
        self._queue: collections.deque[Any] = collections.deque()
        # _arrived: the queue got its first row (the writer sleeps until then); _wake: write
        # now (a flush, close, a full batch) rather than when the first row has waited
        self._arrived = threading.Event()
        self._wake = threading.Event()
        self._closed = False
        self._mapped = 0  # rows taken from the queue and mapped, not written yet
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
        self._thread = threading.Thread(target=self._run, name=f"loopscope-writer {path}", daemon=True)
        self._thread.start()
        _live_writers.add(self)

    # -- the hot path --------------------------------------------------------------------

    def submit(self, kind: int, span: Any) -> None:
        """Queue a span (``_START`` or ``_END``) for mapping and writing. Never blocks."""
        queue = self._queue
        size = len(queue)
        if size >= self.max_queue or self._closed:
            self._dropped += 1
            return
        queue.append((kind, span))
        if not size:
            self._arrived.set()  # the first row since the queue was last empty: its wait starts
        if size >= self.batch_size - 1:
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
        self._arrived.set()
        return marker.done.wait(timeout) and marker.ok

    def close(self, timeout: float | None = 30.0) -> None:
        """Flush, then stop the thread. Further spans are counted as dropped."""
        if self._closed:
            return
        self.flush(timeout)
        self._closed = True
        self._wake.set()
        self._arrived.set()
        self._thread.join(timeout)
        _live_writers.discard(self)
        self._report_stop()
        lost = self._dropped + self._backlog_rows()
        if lost:
            logger.warning("loopscope: %d events could not be stored in %s (%s)", lost, self.path, self._last_error or "queue full")

    def stats(self) -> WriterStats:
        return WriterStats(
            queued=len(self._queue) + self._mapped + self._backlog_rows(),
            written_events=self._written_events,
            written_turns=self._written_turns,
            dropped=self._dropped,
            excluded=self._excluded,
            failed_writes=self._failed_writes,
            batches=self._batches,
            last_error=self._last_error,
        )

    def counters(self, facts: mapping.Facts | None = None) -> health.Counters:
        """The counters kept in the store; with ``facts``, as they are once those are written."""
        otlp = self.report.otlp
        otlp_dropped, otlp_failed = otlp() if otlp is not None else (0, 0)
        return health.Counters(
            events_written=self._written_events + (facts.event_rows if facts is not None else 0),
            turns_written=self._written_turns + (facts.turn_rows if facts is not None else 0),
            dropped_queue_full=self._dropped - self._dropped_unwritable,
            dropped_unwritable=self._dropped_unwritable,
            excluded=self._excluded,
            failed_writes=self._failed_writes,
            last_error=self._last_failure,
            last_error_at=self._last_failure_at,
            otlp_dropped=otlp_dropped,
            otlp_failed=otlp_failed,
            queue_size=self.max_queue,
        )

    def _row_id(self) -> str | None:
        """The id of this writer's row in ``loopscope_writers``: the recovery tracker's, when
        there is one (None: the report's own)."""
        return self._tracker.writer_id if self._tracker is not None else None

    def _report_statements(self, facts: mapping.Facts, *, stopped: bool = False) -> list[str]:
        counters = self.counters(facts)
        statements = self.report.statements(counters, self._row_id(), stopped=stopped)
        self.report.persisted = counters
        return statements

    def _report_stop(self) -> None:
        """Say in the store that this writer stopped, with its last counters (drops after
        its last batch, the OTLP exporter's). Best effort: a held file keeps its last batch's."""
        counters = self.counters()
        if self.report.persisted is None and counters == health.Counters(queue_size=self.max_queue):
            return  # never wrote, nothing to report
        try:
            with open_store(self.path, read_only=False, timeout=min(self.lock_timeout, 2.0)) as con:
                _ensure_schema(self.path, con)
                con.execute(";\n".join(["BEGIN TRANSACTION", *self._report_statements(mapping.Facts(), stopped=True), "COMMIT"]))
        except (duckdb.Error, StoreError, OSError):
            pass

    def _backlog_rows(self) -> int:
        backlog = self._backlog
        return backlog.rows if backlog is not None else 0

    # -- the background thread -----------------------------------------------------------

    def _run(self) -> None:
        """Sleep until rows arrive; write them once the first has waited the interval
        (sooner for a flush, close or a full batch); again. Rows that could not be written
        are retried every interval, whether more arrive or not."""
        wait = self._wait_after(0.0)
        clock = time.thread_time  # this thread's CPU: a batch stretched by others' GIL is no dearer
        while True:
            if self._backlog is None:
                if self._wal_pending and not self._arrived.wait(CHECKPOINT_IDLE):
                    self._checkpoint()  # quiet for a while: the file alone holds every row again
                    continue
                self._arrived.wait()
                self._arrived.clear()  # before the queue is read: a row queued after it sets it again
            self._wake.wait(wait)
            self._wake.clear()
            closing = self._closed
            spent = clock()
            try:
                self._drain()
            except Exception:
                internal_error("store writer")
            if closing:
                if self._wal_pending:
                    self._checkpoint()  # a closed store's file holds every row by itself
                return
            wait = self._wait_after(clock() - spent)

    def _wait_after(self, cost: float) -> float:
        """How long to wait for the next batch, after one that took ``cost`` seconds of CPU."""
        if self.flush_interval is not None:
            return self.flush_interval
        shortest, longest = AUTO_INTERVAL
        return min(longest, max(shortest, cost / AUTO_SHARE))

    def _drain(self) -> None:
        """Map what was queued when the drain began, a chunk at a time, and write it in batches.

        A batch is written once it holds ``batch_size`` rows, when a flush waits for it,
        or when all of that is mapped. What is queued meanwhile waits for a batch of its
        own: an application that records without a pause would otherwise keep the
        drain mapping, and nothing written, until a batch filled up. A failed write ends
        the drain: the rows are kept, and retried at the next wake.
        """
        facts = mapping.Facts()
        markers: list[_Marker] = []
        # mapped rows count against the memory bound too: a batch holds at most what the
        # queue may, so a writer that cannot write holds about twice ``max_queue``, not
        # ``max_queue`` + ``batch_size``
        limit = max(1, min(self.batch_size, self.max_queue))
        chunk = min(mapping.CHUNK, limit)
        left = len(self._queue)
        while True:
            items, taken = self._take(min(chunk, left))
            left -= len(items) + len(taken)
            if items:
                self._map(items, facts)
                self._mapped = facts.rows
            markers += taken
            idle = left <= 0
            if markers or (facts.rows and (idle or facts.rows >= limit)) or (idle and self._backlog is not None):
                ok = False
                try:
                    ok = self._write(facts)
                finally:
                    self._mapped = 0
                    for marker in markers:
                        marker.ok = ok
                        marker.done.set()
                facts, markers = mapping.Facts(), []
                if not ok:
                    return
            if idle:
                if self._queue:  # queued while the drain ran, past the queue's first row: their wait starts now
                    self._arrived.set()
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

    def _write(self, facts: mapping.Facts) -> bool:
        # the content policy, once per batch (per chunk, its fixed cost would slow the
        # mapping of small chunks); the backlog's rows went through it before
        scrub.scrubber(self.content).apply(facts)
        backlog = self._backlog
        if backlog is not None:  # what could not be written before goes first
            self._backlog = None
            backlog.extend(facts)
            facts = backlog
        if not facts.rows:
            return True
        # The rows reach the file proper at a checkpoint, which also rewrites the tables'
        # last, partly filled row groups: about a quarter of a small batch's cost. So they
        # stay in the WAL (on disk too: a reader replays it) until it passes WAL_LIMIT,
        # the writer closes, or it has been idle for CHECKPOINT_IDLE (see _run).
        final = self._closed or _wal_size(self.path) >= WAL_LIMIT
        try:
            with open_store(self.path, read_only=False, timeout=self.lock_timeout, checkpoint=final) as con:
                _ensure_schema(self.path, con)
                if not self._recovered:
                    self._recover(con)
                if self.skip_stored:
                    self.already_stored += idempotent.drop_stored(con, facts)
                extra = self._tracker.statements(facts) if self._tracker is not None else []
                extra = [*extra, *self._report_statements(facts)]
                written_events, written_turns = write_batch(con, facts, extra=extra)
                if self._tracker is not None:
                    self._tracker.committed()
                self._wal_pending = not final
            self.report.stored(self._row_id())
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

    def _recover(self, con: duckdb.DuckDBPyConnection) -> None:
        """Close the turns that dead writers left open, once (again at the next batch if the
        file could not be written now)."""
        try:
            recovery.recover(con)
        except duckdb.Error:
            raise
        except Exception:
            internal_error("store recovery")
        self._recovered = True

    def _checkpoint(self) -> None:
        """Move what the last batches left in the WAL into the file (see :meth:`_write`)."""
        try:
            with open_store(self.path, read_only=False, timeout=self.lock_timeout) as con:
                con.execute("CHECKPOINT")
            self._wal_pending = False
        except (duckdb.Error, StoreError, OSError):
            pass  # the rows are safe in the WAL; the next idle wait or the close tries again

    def _keep(self, facts: mapping.Facts, exc: BaseException) -> None:
        """Hold rows that could not be written, up to max_queue; count the rest as dropped."""
        self._failed_writes += 1
        self._last_error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        self._last_failure, self._last_failure_at = self._last_error, time.time()
        warn_once(f"write:{self.path}", "loopscope: cannot write to %s (%s); keeping events in memory and retrying", self.path, self._last_error)
        overflow = facts.rows - self.max_queue
        if overflow > 0:
            self._dropped += overflow
            self._dropped_unwritable += overflow
            facts.drop_oldest(overflow)
        self._backlog = facts


def _wal_size(path: str) -> int:
    try:
        return os.path.getsize(path + ".wal")
    except OSError:
        return 0


def _yield_gil() -> None:
    """Let other threads take the GIL now, between two slices of mapping: the
    application's threads (and DuckDB, which takes the GIL back now and then while it
    runs a statement) would otherwise wait out the switch interval (5 ms) each time."""
    time.sleep(0)


_schema_ready: set[str] = set()
_schema_lock = threading.Lock()


def _ensure_schema(path: str, con: duckdb.DuckDBPyConnection) -> None:
    with _schema_lock:
        if path in _schema_ready:
            return
        migrate(con)
        _schema_ready.add(path)


def write_batch(con: duckdb.DuckDBPyConnection, facts: mapping.Facts, *, extra: Sequence[str] = ()) -> tuple[int, int]:
    """Write the rows of a batch of facts in one transaction, giving events their per-session indices.

    The rows are made from the facts in SQL (:data:`mapping.EVENTS_SQL`,
    :data:`mapping.TURNS_SQL`), the session counters too, all in one script of as few
    statements as it takes: every statement has DuckDB's Python client take the GIL back
    from the application's threads at each of its steps (see ``connection._Home``).
    ``extra`` statements run in the same transaction, after the rows (an importer writes
    its own table with them, so that all of it or none of it is stored). ``con`` is a
    write block of :func:`~loopscope.storage.connection.open_store`, whose settings say
    whether the commit checkpoints. Returns how many events and turn summaries were written.
    """
    import pyarrow as pa  # imported here: the hot path and a plain import never need it
    import pyarrow.compute as pc

    events, turns = facts.event_table(), facts.turn_table()
    script = ["BEGIN TRANSACTION"]
    if events is not None:
        sessions = facts.sessions
        distinct = list(dict.fromkeys(sessions))  # in order of first appearance
        # each session's events are numbered on from its last index (read to the end:
        # DuckDB 2 refuses a register() while a result is open); a lookup and numbering
        # here cost less than doing it in EVENTS_SQL (a join and a window)
        con.register(_SESSION_IDS, pa.table({"session_id": pa.array(distinct, pa.string())}))
        known = dict(con.execute(_SESSIONS_LOOKUP_SQL).fetchall())
        next_index = {s: known.get(s, 0) for s in distinct}
        indices = []
        add = indices.append
        for session in sessions:
            value = next_index[session] + 1
            next_index[session] = value
            add(value)
        events = events.append_column("idx", pa.array(indices, pa.int64()))
        con.register(mapping.EVENTS_TABLE, events)
        script.append(mapping.EVENTS_SQL)
        # the session counters, made here with Arrow (a statement that aggregates the
        # batch's events costs DuckDB ~2 ms more to plan): an update for the sessions the
        # file has, a plain insert for the new ones (the file is ours meanwhile)
        counters = (
            events.select(["session_id", "idx", "created_us"])
            .group_by("session_id")
            .aggregate([("idx", "max"), ("created_us", "min"), ("created_us", "max")])
            .rename_columns(["session_id", "last_index", "first_at", "last_at"])
        )
        if known:
            is_known = pc.is_in(counters.column("session_id"), value_set=pa.array(list(known), pa.string()))
            con.register(_KNOWN_SESSIONS, counters.filter(is_known))
            script.append(_SESSIONS_UPDATE_SQL)
            counters = counters.filter(pc.invert(is_known))
        if counters.num_rows:
            con.register(_NEW_SESSIONS, counters)
            script.append(_SESSIONS_INSERT_SQL)
    if turns is not None:
        con.register(mapping.TURNS_TABLE, turns)
        script.append(mapping.TURNS_SQL)
    script += extra
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


_SESSION_IDS, _KNOWN_SESSIONS, _NEW_SESSIONS = "_loopscope_session_ids", "_loopscope_known_sessions", "_loopscope_new_sessions"
_SESSIONS_LOOKUP_SQL = f"SELECT s.session_id, s.last_index FROM sessions s SEMI JOIN {_SESSION_IDS} b USING (session_id)"
_SESSIONS_UPDATE_SQL = f"""UPDATE sessions SET last_index = b.last_index,
  first_at = least(sessions.first_at, b.first_at), last_at = greatest(sessions.last_at, b.last_at)
FROM {_KNOWN_SESSIONS} b WHERE sessions.session_id = b.session_id"""
_SESSIONS_INSERT_SQL = f"INSERT INTO sessions (session_id, last_index, first_at, last_at) SELECT * FROM {_NEW_SESSIONS}"


_live_writers: weakref.WeakSet[StoreWriter] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for writer in list(_live_writers):
        try:
            writer.close(timeout=10.0)
        except Exception:
            logger.warning("loopscope: could not flush %s at exit", writer.path, exc_info=True)
