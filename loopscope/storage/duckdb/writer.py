"""The background writer: spans in from the hot path, columnar batches out to DuckDB.

The calling thread only appends a reference to a bounded deque. A daemon thread wakes
every ``flush_interval`` (or when a batch is full; by default the interval follows the
writer's own cost, see :data:`AUTO_SHARE`), reduces the spans to facts in Arrow
record batches a chunk at a time (:class:`rows.Facts`, through the :class:`rows.SpanMapping`
it was given: loopscope.ingest's), and once it holds
``batch_size`` rows, a waiting flush or all that was queued, writes them in one
transaction: it opens the file, gives each row its per-session index, makes the rows
from the facts in SQL, and lets the file go again, so that other processes can read in
between. Rows that cannot be written (a reader holding
the file too long, a full disk) are kept and retried, in smaller pieces when a whole
batch fails (what fits is written, in order); past ``max_queue`` rows or ``max_bytes`` the
oldest are dropped and counted, never silently. The queue is bounded the same way: in
spans and in bytes (estimated from the lengths of an ended span's text attributes).

``close()`` returns within its timeout (:data:`CLOSE_TIMEOUT` by default, at exit too)
whatever the thread is doing: what was not written by then is counted as lost, in the
store's health record when it can still be written, else beside it
(:func:`health.record_beside`).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import duckdb

from ..._guard import clear_warning, guard, internal_error, logger, warn_once
from ...content.policy import ContentPolicy
from .. import rows, scrub
from ..errors import StoreError, StoreLockedError
from ..flush import FlushRequest, settle
from ..limits import CLOSE_TIMEOUT, QUEUE_BYTES, WriterStats
from ..policy import PersistencePolicy
from ..rows import END, START, SpanMapping
from . import allocator, arrow_rows, health, idempotent, raw_spans, recovery, tool_totals, values, wakeup
from .connection import Cancelled, mark_parted, open_store
from .schema import migrate

__all__ = ["StoreWriter", "WriterStats", "write_batch"]

AUTO_INTERVAL = (1.0, 5.0)
"""The shortest and the longest wait between two batches with ``flush_interval=None``."""
AUTO_SHARE = 0.01
"""With ``flush_interval=None``, the share of one core the writer's batches may take: after
a batch that took ``c`` seconds of the writer thread's CPU it waits ``c / AUTO_SHARE``
(within :data:`AUTO_INTERVAL`). Most of a batch's cost is the same whatever its size
(attaching the file, a dozen statements: 20-40 ms), so the wait, not the rows, sets what
the writer costs: an agent that calls a model every second or two paid one batch a call
(~35 ms of CPU, 30x what its recording cost the application) at 5% and a wait of half a
second. At 1% rows wait 2-5 s, as long as OpenTelemetry's batch span processor holds spans
(5 s), and under a steady load the batches grow instead of coming more often. loopscope's
own readers never see the wait: a read first has the writers that hold rows write them
(:mod:`wakeup`)."""


WAL_LIMIT = 128 << 10
"""Bytes of WAL after which a batch's commit checkpoints. A batch's rows stay in the WAL
(on disk: durable, and every reader replays it) until then, or until the writer has been
idle for :data:`CHECKPOINT_IDLE`, or it closes. A checkpoint costs a small batch ~7.5
ms (it rewrites the tables' last row groups); but every attach, the writer's own next
one included, replays the WAL: ~2 ms more at 128 KB, ~6 ms at 512 KB. Measured on the
openai loop (60-call batches), 128 KB cost the writer 10-25% less CPU a batch than a
checkpoint per batch; 64 KB and 512 KB less than that."""
LARGE_BATCH = 1 << 20
"""Arrow bytes from which a batch leaves its rows in the WAL whatever its size (see _write_piece)."""
BATCH_SHARE = 0.25
"""The share of ``max_bytes`` a batch holds at most (in the Arrow bytes of its rows): writing
it makes copies of its content (the content policy's columns, DuckDB's vectors, the pages it
writes), so a batch of large values (1 MiB tool results) held and written whole made the
writer peak at several times the bound; a quarter of it keeps the peak near the bound."""
LARGE_SHARE = 0.125
"""The share of ``max_bytes`` a batch holds at most once it holds a span of more than
:data:`LARGE_SPAN` bytes: the copies writing it makes (its content policy's, its parts',
DuckDB's) are of a value's size, so they take an eighth of the bound rather than a quarter.
Measured (``bench_big_values.py``, 300 calls of 1 MiB, medians of 3): the thread writer's
application peak 244 -> 199 MiB, the writer process's 323 -> 310 MiB, at the same MiB a
second of its CPU. A batch of small values keeps :data:`BATCH_SHARE` (a flood of them would
otherwise pay a batch's fixed cost twice as often)."""
WRITE_COPIES = 3
"""Copies of a batch of large values that writing it holds beside the batch itself (its rows
in Arrow and its parts over them, the content policy's joined columns, DuckDB's insert and
commit): while large values are written, that much of the bound (:data:`LARGE_SHARE` each) is
kept free of the queue (``StoreWriter._reserve``), so that the writer's memory stays near the
bound rather than the bound plus the write's copies."""
LARGE_SPAN = 64 << 10
"""Bytes of a span (as the byte bound counts them) from which its batch holds
:data:`LARGE_SHARE` of the bound: a value this long is stored in parts (``values.CUT_OVER``)."""
INTERRUPT_WAIT = 1.0
"""Seconds ``close()`` waits, past its timeout, for a write it interrupted to leave DuckDB
(see ``StoreWriter._interrupt``); an interrupted statement ends within milliseconds."""
LEAVE_WAIT = 2.0
"""Seconds from ``close()``'s giving up on a writer's thread within which, at the end of the
interpreter's exit hooks, the thread must have left DuckDB; else the process ends there by
``os._exit`` (see :func:`_leave_duckdb_at_exit`). What cannot be interrupted (an attach that
replays the WAL, a commit writing a batch of large values) takes this long at most on a
disk that answers."""
REPORT_EVERY = 5.0
"""Seconds a writer's row in ``loopscope_writers`` may leave its written counts and
``last_seen`` behind. A batch updates the row when a flush waits for it (so ``flush()``
then ``loopscope status`` agree), when a loss or a failure is new (those are never late),
or when the row is this old; other batches skip the update: it cost a batch ~1 ms of
statement and, at the next checkpoint, the rewrite of one more table (~2% of a batch of the
openai loop's writer CPU, in an A/B against an update at every batch). A crash leaves the
row up to this much behind: recovery ends a dead writer's turns at its ``last_seen`` or
their last row, whichever is later."""
CLOSE_MARGIN = 0.25
"""Seconds of a close's bound kept for the writer's last report once its writes waited for
a held file (see ``StoreWriter._lock_wait``)."""
CHECKPOINT_IDLE = 30.0
"""Seconds without a batch after which a writer that left rows in the WAL checkpoints them,
so that the file alone holds every row again while the application records nothing. A
checkpoint costs about what a batch does (~15-20 ms): at 5 s an agent that a person talks
to (a turn, then a pause to read and type) paid one after each turn, on top of the turn's
batch, where the WAL (128 KB at most, :data:`WAL_LIMIT`) costs a reader ~2 ms to replay."""

class StoreWriter:
    """Writes the rows of recorded spans to one DuckDB file from a background thread."""

    def __init__(
        self,
        path: str,
        *,
        mapping: SpanMapping,
        policy: PersistencePolicy | None = None,
        flush_interval: float | None = None,
        max_queue: int = 200_000,
        max_bytes: int = QUEUE_BYTES,
        batch_size: int = 100_000,
        lock_timeout: float = 2.0,
        track_turns: bool = False,
        content: ContentPolicy | None = None,
        skip_stored: bool = False,
        report_each_batch: bool = False,
    ) -> None:
        self.path = path
        # the writer's row updated in every batch's transaction, not at most every REPORT_EVERY:
        # a writer process's, whose application sets what it sent against the row (writer_child.py)
        self.report_each_batch = report_each_batch
        # spans to facts (loopscope.ingest.mapping.SPANS): the writer itself knows facts only
        self._mapping = mapping
        self._span_bytes = mapping.size  # bound once: the hot path calls it per ended span
        # leave out of each batch the rows the store holds already (idempotent.py): a
        # collector's senders resend what it did not acknowledge before a crash
        self.skip_stored = skip_stored
        self.already_stored = 0
        # secrets masked, the redaction hook and a size cap, in the writer's thread (scrub.py)
        self.content = content or ContentPolicy()
        # a value far over the cap is cut before it is queued (mapping.cap), so that it costs
        # the queue what the store keeps of it: one 60 MB tool result no longer fills the byte
        # bound and drops the rest of its turn; a span's size past _cap_over says it may hold one
        self._cap_over, self._cut = mapping.cap(self.content.store_max_chars or 0)
        # the counters kept in the store, for `loopscope status` (health.py); the pipeline
        # sets report.otlp to count the OTLP exporter's drops as well
        self.report = health.Report()
        # losses are counted as the store would have held them: event rows and turn rows
        # (a span lost before its mapping counts the rows the mapping would make of it,
        # SpanMapping.rows), never spans or a mix of rows of every table
        self._dropped_unwritable = 0  # events not written: the file stayed unwritable, or the close came first
        self._dropped_unwritable_turns = 0
        self._last_failure: str | None = None  # kept after writes work again, unlike _last_error
        self._last_failure_at: float | None = None
        # an in-process writer notes the turns it opens, so that a crash leaves them
        # closable; and it closes those that a dead process left (storage/duckdb/recovery.py)
        self._tracker = recovery.Tracker() if track_turns else None
        self._recovered = not track_turns
        self.policy = policy or PersistencePolicy()
        self.flush_interval = flush_interval
        self.max_queue = max_queue
        self.max_bytes = max_bytes
        self._wake_bytes = max_bytes // 2  # queued bytes that wake the writer before its wait is over
        self.batch_size = batch_size
        self.lock_timeout = lock_timeout
        self._queue: collections.deque[Any] = collections.deque()
        self._bundle: list[Any] | None = None  # the spans of the bundle being made (see begin_bundle)
        # spans in the bundles queued (a bundle is one entry of the queue): _bundled_in -
        # _bundled_out, each added to by one side only (as _in_bytes and _out_bytes)
        self._bundled_in = 0
        self._bundled_out = 0
        # _arrived: the queue got its first row (the writer sleeps until then); _wake: write
        # now (a flush, close, a full batch) rather than when the first row has waited
        self._arrived = threading.Event()
        self._wake = threading.Event()
        self._holding = wakeup.Holding(path)  # while rows wait for a batch: readers may ask for them
        self._last_batch_end = 0.0  # time.monotonic() when the last drain ended
        self._closed = False
        self._mapped = 0  # rows taken from the queue and mapped, not written yet
        self._mapped_facts: rows.Facts | None = None  # those rows (counted as lost by an abandoned close)
        self._inflight = 0  # rows in the write under way (the backlog's among them)
        self._inflight_rows = (0, 0)  # of those, events and turn summaries
        self._held_bytes = 0  # Arrow bytes of the rows mapped, being written or kept
        self._reserve = 0  # bytes of the bound kept for a write's copies while large values are written (WRITE_COPIES)
        self._backlog: rows.Facts | None = None  # rows that could not be written yet
        # bytes queued = _in_bytes - _out_bytes: the first only the application's threads
        # add to, the second only the writer's thread (no lock on the hot path)
        self._in_bytes = 0
        self._out_bytes = 0
        self._abandoned = False  # close() gave up waiting for the thread (see _abandon)
        self._abandoned_at = 0.0  # time.monotonic() of that
        # _inside: the thread is in a block of the store (opening it, writing, letting it go),
        # where it calls into DuckDB; set and read under _state, with _abandoned: once
        # abandoned, the thread opens no block any more (_store)
        self._state = threading.Condition()
        self._inside = False
        self._close_deadline: float | None = None  # set by close(): see _lock_wait
        self._held = False  # the last write failed because another process held the file
        self.draining = False
        """The writer's thread is taking spans off the queue and writing them (their rows may
        be counted nowhere else meanwhile: read after :meth:`stats`' ``queued`` to know that
        everything queued before was written or kept)."""
        self._con: Any = None  # the connection of the write (or checkpoint) under way: close() may interrupt it
        self.after_write: Callable[[], None] | None = allocator.give_back
        """Called by the writer's thread after each batch and checkpoint, once the file is
        detached (and before a flush waiting for the batch is answered): by default the
        pages of DuckDB's allocator the batch freed go back to the system there (the writer
        process gives the C heap's back too), so that between batches the writer holds what it uses, not what
        its largest batch used (:mod:`.allocator`)."""
        self._beside_lock = threading.Lock()
        self._beside = False  # an entry of this writer's is in the file beside the store
        self._room_kept = False  # the spare beside the store was made (health.reserve_room)
        self._indices = _SessionIndex()
        self._wal_pending = False  # the last batch left its rows in the WAL (see _write)
        self._reported_at = -REPORT_EVERY  # time.monotonic() of the last batch that updated its row
        self._written_events = 0
        self._written_turns = 0
        self._written_calls = 0
        self._dropped = 0  # events dropped: the queue was full, or unwritable (_dropped_unwritable)
        self._dropped_turns = 0  # turn summaries dropped, likewise
        self._excluded = 0
        self._failed_writes = 0
        self._refused = (0, 0, None)  # requests refused whole before they reached it, their spans, the last reason
        self._batches = 0
        self._last_error: str | None = None
        self._skip: frozenset[str] = frozenset()
        self._allowed_by: PersistencePolicy | None = None
        self._thread = threading.Thread(target=self._run, name=f"loopscope-writer {path}", daemon=True)
        self._thread.start()
        _live_writers.add(self)

    # -- the hot path --------------------------------------------------------------------

    def submit(self, kind: int, span: Any) -> None:
        """Queue a span (``START`` or ``END``) for mapping and writing. Never blocks."""
        queue = self._queue
        bundle = self._bundle
        size = len(queue) + self._bundled_in - self._bundled_out + (len(bundle) if bundle is not None else 0)
        # the bytes held all told: queued, and the rows mapped, being written or kept (so a
        # writer that is busy with a batch, or cannot write, holds max_bytes, not twice it)
        if size >= self.max_queue or self._closed or (
            self._in_bytes - self._out_bytes + self._held_bytes + self._reserve >= self.max_bytes
        ):
            self._drop_span(kind, span)
            return
        if kind:  # an ended span: its content is final (a started one's is counted at its end)
            counted = self._span_bytes(span)
            if counted > self._cap_over:
                span, counted = self._cut(span)
            self._in_bytes += counted
        if bundle is not None:
            bundle.append((kind, span))
            return
        queue.append((kind, span))
        if not size:
            self._arrived.set()  # the first row since the queue was last empty: its wait starts
        if size >= self.batch_size - 1 or (self._in_bytes - self._out_bytes >= self._wake_bytes and self._backlog is None):
            # a full batch, or half the byte bound: written now rather than dropped after the
            # wait (not while writes fail: the rows kept are retried at the interval)
            self._wake.set()

    def begin_bundle(self) -> None:
        """Gather what is submitted from now until :meth:`end_bundle` into one entry of the
        queue, which a batch takes whole: the spans of one collector request and their raw
        copies are written in one transaction, or none of them (a process killed between two
        transactions would keep one without the other). One caller at a time (the
        collector's lock): a span submitted meanwhile from another thread joins the bundle."""
        self._bundle = []

    def end_bundle(self, raw: list[tuple[Any, ...]] | None = None) -> None:
        """Queue the bundle begun by :meth:`begin_bundle`, with ``raw``: the raw copies of its
        spans (``spans`` rows, see :mod:`.raw_spans`), written in the same transaction."""
        spans, self._bundle = self._bundle or [], None
        raw = raw or []
        if not spans and not raw:
            return
        raw_bytes = raw_spans.raw_size(raw) if raw else 0
        self._in_bytes += raw_bytes
        self._bundled_in += len(spans)
        queue = self._queue
        first = not queue
        queue.append(_Bundle(spans, raw, raw_bytes))
        if first:
            self._arrived.set()
        if self._in_bytes - self._out_bytes >= self._wake_bytes and self._backlog is None:
            self._wake.set()

    def _drop_span(self, kind: int, span: Any) -> None:
        """Count a span that is not queued: the rows its mapping would have made."""
        events, turns = self._mapping.rows(kind, span, self._skipped())
        self._dropped += events
        self._dropped_turns += turns

    def _skipped(self) -> frozenset[str]:
        """The event types the policy leaves out (asked once per policy)."""
        policy = self.policy
        if self._allowed_by is not policy:
            self._skip = frozenset(t for t in set(rows.EVENT_TYPES.values()) if not policy.allows(t))
            self._allowed_by = policy
        return self._skip

    def _queued_rows(self) -> tuple[int, int]:
        """The events and turn summaries of the spans queued now (not mapped yet)."""
        skip, rows_of = self._skipped(), self._mapping.rows
        events = turns = 0
        for item in list(self._queue):
            if type(item) is _Bundle:
                for kind, span in item.spans:
                    e, t = rows_of(kind, span, skip)
                    events += e
                    turns += t
            elif type(item) is not FlushRequest:
                e, t = rows_of(item[0], item[1], skip)
                events += e
                turns += t
        return events, turns

    def submit_start(self, span: Any) -> None:
        self.submit(START, span)

    def submit_end(self, span: Any) -> None:
        self.submit(END, span)

    # -- control -------------------------------------------------------------------------

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Write everything queued so far; True when it reached the file."""
        if not self._thread.is_alive():
            return not self._queue
        request = FlushRequest()
        self._queue.append(request)
        self._wake.set()
        self._arrived.set()
        return request.wait(timeout)

    def flush_then(self, then: Callable[[bool], None]) -> None:
        """Queue a flush without waiting for it: the writer's thread calls ``then(ok)`` once
        what was queued before it reached the file (``ok``) or failed to (a writer process
        answers its application's flush so, while it goes on reading spans)."""
        request = FlushRequest(then)
        if not self._thread.is_alive():
            settle([request], not self._queue, "store writer")
            return
        self._queue.append(request)
        self._wake.set()
        self._arrived.set()

    def count_dropped(self, events: int, turns: int = 0) -> None:
        """Count the rows of spans dropped before they reached this writer (``events`` and
        ``turns``: a writer process's application, whose queue was full) as dropped by this
        writer's full queue, so that the store's health record says so."""
        if events > 0:
            self._dropped += events
        if turns > 0:
            self._dropped_turns += turns

    def count_refused(self, spans: int = 0, reason: str | None = None) -> None:
        """Count a request refused whole before any of it reached this writer (a collector's:
        a bad payload, one over its bounds), with its spans when they were counted (its rows
        are not known: it was not read): the store's health record says so, written by the
        next batch, or by a flush with nothing else to write."""
        with self._beside_lock:
            requests, counted, last = self._refused
            self._refused = (requests + 1, counted + max(0, int(spans)), reason or last)

    def close(self, timeout: float | None = CLOSE_TIMEOUT) -> None:
        """Flush, then stop the thread; returns within ``timeout`` seconds (``None``: once
        everything is written or given up), whatever the thread is doing. What is not
        written by then is counted as lost (``dropped_unwritable``), in the store's
        health record or beside the store. Further spans are counted as dropped."""
        if self._closed:
            return
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        self._close_deadline = deadline  # a held file is waited for until then (_lock_wait)
        written = self.flush(left())
        while not written and self._held and self._thread.is_alive() and (deadline is None or (left() or 0.0) > CLOSE_MARGIN):
            # another process holds the file (other writers and readers taking their turns,
            # under load): what is held is tried again while the close allows, not given up
            # after one lock wait
            written = self.flush(left())
        self._closed = True
        self._wake.set()
        self._arrived.set()
        self._thread.join(left())
        _live_writers.discard(self)
        if self._thread.is_alive():
            # inside a write that does not end (a stuck disk, a hook): the file and its
            # in-process lock are the thread's, so the count goes beside the store
            self._abandon()
            self._holding.unlink()  # what it holds is counted lost below: no reader waits for it
            events, turns = self._unwritten()
            lost = (self._dropped + events, self._dropped_turns + turns)
            self._interrupt(time.monotonic() + INTERRUPT_WAIT)
        else:
            self._give_up_backlog()
            lost = (self._dropped, self._dropped_turns)
            before_stop = self.report.before_stop
            if before_stop is not None:  # the exporters' last sends, counted in the last report
                with guard("writer before stop"):
                    wait = left()
                    before_stop(None if wait is None else wait / 2)  # half: the report needs its turn
            self._report_stop(left())
        if any(lost):
            why = self._last_error or ("still writing when the store was closed" if self._abandoned else "queue full")
            logger.warning("loopscope: %d events and %d turns could not be stored in %s (%s)", *lost, self.path, why)

    def stats(self) -> WriterStats:
        return WriterStats(
            queued=len(self._queue) + self._mapped + self._inflight + self._backlog_rows(),
            written_events=self._written_events,
            written_turns=self._written_turns,
            dropped=self._dropped,
            dropped_turns=self._dropped_turns,
            excluded=self._excluded,
            failed_writes=self._failed_writes,
            batches=self._batches,
            last_error=self._last_error,
            queued_bytes=max(0, self._in_bytes - self._out_bytes) + self._held_bytes,
            lost_from_file=self._indices.lost,
            written_calls=self._written_calls,
        )

    def counters(self, facts: rows.Facts | None = None) -> health.Counters:
        """The counters kept in the store; with ``facts``, as they are once those are written."""
        otlp, notices = self.report.otlp, self.report.notices
        otlp_dropped, otlp_failed = otlp() if otlp is not None else (0, 0)
        sent, refused, failed, off = notices() if notices is not None else (0, 0, 0, None)
        requests, spans, last_refused = self._refused
        return health.Counters(
            events_written=self._written_events + (facts.event_rows if facts is not None else 0),
            turns_written=self._written_turns + (facts.turn_rows if facts is not None else 0),
            dropped_queue_full=self._dropped - self._dropped_unwritable,
            dropped_unwritable=self._dropped_unwritable,
            turns_dropped_queue_full=self._dropped_turns - self._dropped_unwritable_turns,
            turns_dropped_unwritable=self._dropped_unwritable_turns,
            excluded=self._excluded,
            failed_writes=self._failed_writes,
            last_error=self._last_failure,
            last_error_at=self._last_failure_at,
            otlp_dropped=otlp_dropped,
            otlp_failed=otlp_failed,
            queue_size=self.max_queue,
            notices_sent=sent,
            notices_refused=refused,
            notices_failed=failed,
            notices_off=off,
            refused_requests=requests,
            refused_spans=spans,
            last_refused=last_refused,
        )

    def _row_id(self) -> str | None:
        """The id of this writer's row in ``loopscope_writers``: the recovery tracker's, when
        there is one (None: the report's own)."""
        return self._tracker.writer_id if self._tracker is not None else None

    def _report_statements(self, facts: rows.Facts, *, stopped: bool = False) -> tuple[list[str], health.Counters]:
        """The statements that keep this writer's counters in the store, and the counters
        they hold (``report.persisted`` once their transaction commits)."""
        counters = self.counters(facts)
        return self.report.statements(counters, self._row_id(), stopped=stopped), counters

    def _report_due(self, flushing: bool) -> bool:
        """Whether this batch (one a flush waits for, if ``flushing``) updates the writer's
        row (see :data:`REPORT_EVERY`)."""
        persisted = self.report.persisted
        if (
            flushing or self.report_each_batch or persisted is None or not self.report.has_row(self._row_id())
            or time.monotonic() - self._reported_at >= REPORT_EVERY
        ):
            return True
        return health.losses(self.counters()) != health.losses(persisted)

    def _losses_unsaid(self) -> bool:
        """Whether the store's row lacks a loss counted since the last batch (a flush with no
        rows then still writes the row: a collector's refused request, say)."""
        persisted = self.report.persisted or health.Counters(queue_size=self.max_queue)
        now = self.counters()
        return any(getattr(now, name) != getattr(persisted, name) for name in health.LOSS_COUNTERS)

    def _report_stop(self, timeout: float | None = None) -> None:
        """Say in the store that this writer stopped, with its last counters (drops after
        its last batch, the OTLP exporter's). When the file cannot be written now (another
        process holds it past ``timeout``, a full disk), what its row lacks is counted
        beside it instead."""
        counters = self.counters()
        if self.report.persisted is None and counters == health.Counters(queue_size=self.max_queue):
            return  # never wrote, nothing to report
        wait = min(self.lock_timeout, 2.0, timeout if timeout is not None else 2.0)
        try:
            with open_store(self.path, read_only=False, timeout=wait) as con:
                _ensure_schema(self.path, con)
                statements, counters = self._report_statements(rows.Facts(), stopped=True)
                con.execute(";\n".join(["BEGIN TRANSACTION", *statements, "COMMIT"]))
            self.report.persisted = counters
        except (duckdb.Error, StoreError, OSError):
            self._record_beside()
            return
        self._record_beside()  # an entry an earlier close left (see _abandon) is now in the row

    def _give_up_backlog(self) -> None:
        """The thread stopped with rows it could not write (and, after a write that failed,
        spans it did not take from the queue): they are lost, and counted."""
        events, turns = self._queued_rows()
        backlog = self._backlog
        if backlog is not None:
            events += backlog.event_rows
            turns += backlog.turn_rows
        self._queue.clear()
        self._backlog = None
        self._held_bytes = 0
        self._lose(events, turns)

    def _lose(self, events: int, turns: int) -> None:
        """Count rows that will not be written (the file stayed unwritable, the close came first)."""
        self._dropped += events
        self._dropped_unwritable += events
        self._dropped_turns += turns
        self._dropped_unwritable_turns += turns

    def _unwritten(self) -> tuple[int, int]:
        """The events and turn summaries held and not written: queued, mapped, being written, kept."""
        events, turns = self._queued_rows()
        mapped, backlog = self._mapped_facts, self._backlog
        for held in (mapped, backlog):
            if held is not None:
                events += held.event_rows
                turns += held.turn_rows
        inflight = self._inflight_rows
        return events + inflight[0], turns + inflight[1]

    def _abandon(self) -> None:
        """``close()`` stops waiting for a thread stuck in a write: count what it holds as
        lost, beside the store. Should the write end after all (the process goes on), the
        thread writes no more and puts the count right (:meth:`_run`). From now on the
        thread starts no DuckDB call: it leaves the one it is in (interrupted, see
        :meth:`_interrupt`) and the store's block without a retry or a checkpoint."""
        with self._state:
            self._abandoned = True
            self._abandoned_at = time.monotonic()
        _left_behind.add(self)
        self._record_beside()

    def _interrupt(self, deadline: float) -> bool:
        """After :meth:`_abandon`: stop DuckDB's statement under way (``interrupt()``) until the
        thread has left the store's block, or ``deadline`` (``time.monotonic()``); True when it
        left. At exit the interpreter stops its daemon threads, and one that comes back from
        DuckDB meanwhile aborts the process (SIGABRT, ``FATAL: exception not rethrown``: the
        GIL it takes back ends the thread inside DuckDB's C++); an interrupted write rolls back
        and its rows stay counted as lost. A thread elsewhere (in a content hook, mapping
        spans) is not waited for: it opens no block any more (:meth:`_store`)."""
        with self._state:
            while self._inside:
                con = self._con
                if con is not None:
                    try:
                        con.interrupt()  # again each time: one sent between two statements is lost
                    except Exception:  # noqa: S110  # a connection closed meanwhile: the thread is out of it
                        pass
                wait = deadline - time.monotonic()
                if wait <= 0:
                    return False
                self._state.wait(min(wait, 0.02))
        return True

    def _record_beside(self) -> None:
        """Count beside the store what this writer's row in it lacks: its losses since the
        row was last written, and what it holds unwritten now if it was abandoned."""
        with self._beside_lock:
            delta = self.counters().since(self.report.persisted)
            if self._abandoned:
                events, turns = self._unwritten()
                delta.dropped_unwritable += events
                delta.turns_dropped_unwritable += turns
                delta.last_error, delta.last_error_at = "still writing when the store was closed", time.time()
            if not self._beside and not any(getattr(delta, name) for name in health.LOSS_COUNTERS):
                return  # the store's row says it all, and nothing was noted beside it before
            if health.record_beside(self.path, self._row_id() or self.report.writer_id, delta):
                self._beside = True
            elif delta.dropped_unwritable or delta.dropped_queue_full:
                warn_once(f"beside:{self.path}", "loopscope: cannot count the lost events beside %s either", self.path)

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
        warm = False
        wakeup.writer_thread()
        while True:
            if self._backlog is None:
                if self._wal_pending and not self._arrived.wait(CHECKPOINT_IDLE):
                    self._checkpoint()  # quiet for a while: the file alone holds every row again
                    continue
                self._arrived.wait()
                self._arrived.clear()  # before the queue is read: a row queued after it sets it again
                if not self._queue and not self._closed:
                    continue  # what set it was taken by the last drain: nothing is held
                self._holding.open()  # readers may ask for these rows now (wakeup.py)
            asked = self._wait_for_batch(wait)
            closing = self._closed
            spent = clock()
            with _WRITER_GUARD:
                self.draining = True
                try:
                    self._drain()
                    if asked and self._queue and not self._abandoned:
                        self._drain()  # what came while it wrote: the reader that asked waits for it too
                finally:
                    self.draining = False
                    self._holding.close()  # written (or kept for a retry, which no reader waits for)
                    self._last_batch_end = time.monotonic()
            if self._abandoned:
                # close() stopped waiting while a write ran, and counted what was held as
                # lost; the write ended after all: count again what is still unwritten
                self._record_beside()
                return
            if closing:
                if self._wal_pending:
                    self._checkpoint()  # a closed store's file holds every row by itself
                return
            cost = clock() - spent
            # the first batch pays what is paid once (the schema, pyarrow's import, cold
            # caches): taken as the writer's cost, it would hold the next batch back for
            # seconds while the application goes on recording
            wait = self._wait_after(cost if warm else 0.0)
            warm = warm or self._batches > 0

    def _wait_for_batch(self, wait: float) -> bool:
        """Wait ``wait`` seconds for the next batch; less when woken (a flush, the close, a
        full batch) or when a reader asks for the rows held (:mod:`wakeup`). True when a reader asked."""
        asked = False
        if self._holding.path is None:
            self._wake.wait(wait)
        else:
            deadline = time.monotonic() + wait
            while True:
                if not asked and self._holding.asked():
                    # asked: write now, but not sooner than ASK_GAP after the last batch (a
                    # reader that polls, `loopscope tail --follow`, asks four times a second)
                    asked, deadline = True, min(deadline, self._last_batch_end + wakeup.ASK_GAP)
                left = deadline - time.monotonic()
                if left <= 0 or self._wake.wait(min(left, wakeup.POLL)):
                    break
        self._wake.clear()
        return asked

    def _wait_after(self, cost: float) -> float:
        """How long to wait for the next batch, after one that took ``cost`` seconds of CPU (:data:`AUTO_SHARE`)."""
        if self.flush_interval is not None:
            return self.flush_interval
        shortest, longest = AUTO_INTERVAL
        return min(longest, max(shortest, cost / AUTO_SHARE))

    def _drain(self) -> None:
        """Map what was queued when the drain began, a chunk at a time, and write it in batches.

        A batch is written once it holds ``batch_size`` rows (or ``max_bytes``), when a
        flush waits for it, or when all of that is mapped. What is queued meanwhile waits
        for a batch of its own: an application that records without a pause would
        otherwise keep the drain mapping, and nothing written, until a batch filled up. A
        failed write ends the drain: the rows are kept, and retried at the next wake.
        """
        facts = rows.Facts()
        markers: list[FlushRequest] = []
        # mapped rows count against the memory bound too: a batch holds at most what the
        # queue may, so a writer that cannot write holds about twice ``max_queue`` (and
        # ``max_bytes``), not ``max_queue`` + ``batch_size``
        limit = max(1, min(self.batch_size, self.max_queue))
        chunk = min(rows.CHUNK, limit)
        # a batch takes about BATCH_SHARE of max_bytes from the queue, as the byte bound
        # counts them: a chunk of 4,096 entries took the whole queue at once, so a batch of
        # 1 MiB values held every value queued (64 MiB), and each copy made in writing it
        # was as large (see bench_big_values.py)
        share = max(1, int(self.max_bytes * BATCH_SHARE))
        large_share = max(1, int(self.max_bytes * LARGE_SHARE))  # once the batch holds a large span
        large = False
        batch_bytes = 0
        left = len(self._queue)
        while True:
            items, taken, consumed, took, large_taken = self._take(
                min(chunk, left), facts, (large_share if large else share) - batch_bytes, large_share - batch_bytes
            )
            left -= consumed
            batch_bytes += took
            large = large or large_taken
            mapped = bool(items)
            markers += taken
            if mapped:
                # the room a write of large values needs for its copies, kept from the queue
                self._reserve = large_share * WRITE_COPIES if large else 0
                try:
                    self._map(items, facts)
                except BaseException:
                    # a failure of ours (reported by the thread's guard): the flushes that
                    # wait for this chunk are answered, not left waiting out their timeout
                    settle(markers, False, "store writer")
                    raise
                items.clear()  # the spans' values are in the facts now: not held through the write
            if mapped or facts.raw:
                self._mapped, self._mapped_facts = facts.rows, facts
                self._held_bytes = self._backlog_bytes() + _facts_bytes(facts)
            if self._abandoned:  # close() gave up: what is mapped stays counted as lost (_unwritten)
                settle(markers, False, "store writer")
                return
            idle = left <= 0
            bound = large_share if large else share
            full = facts.rows >= limit or self._held_bytes >= bound or batch_bytes >= bound
            if markers or ((facts.rows or facts.raw or facts.scores) and (idle or full)) or (idle and self._backlog is not None):
                ok = False
                try:
                    ok = self._write(facts, flushing=bool(markers))
                finally:
                    self._mapped, self._mapped_facts = 0, None
                    settle(markers, ok, "store writer")
                facts, markers, batch_bytes, large = rows.Facts(), [], 0, False
                if not ok or self._abandoned:
                    return
            elif not (facts.rows or facts.raw):
                batch_bytes, large = 0, False  # what was taken made no row (left out by policy): nothing is held
            if idle:
                if self._queue:  # queued while the drain ran, past the queue's first row: their wait starts now
                    self._arrived.set()
                return

    def _take(
        self, count: int, facts: rows.Facts, budget: int, large_budget: int
    ) -> tuple[list[Any], list[FlushRequest], int, int, bool]:
        """Up to ``count`` entries of the queue, and no more once they count ``budget`` bytes
        (the one that passes it taken), or ``large_budget`` once a span of more than
        :data:`LARGE_SPAN` bytes is among them: their spans, the flushes among them, how many
        entries they were, their bytes, and whether such a span is among them. A bundle's
        spans are taken whole, its raw rows put in ``facts``."""
        items: list[Any] = []
        markers: list[FlushRequest] = []
        queue = self._queue
        popleft = queue.popleft
        taken = 0
        consumed = 0
        large = False
        for _ in range(min(len(queue), count)):
            if taken >= budget and consumed:
                break
            consumed += 1
            item = popleft()
            if type(item) is FlushRequest:
                markers.append(item)
            elif type(item) is _Bundle:
                self._bundled_out += len(item.spans)
                for entry in item.spans:
                    items.append(entry)
                    if entry[0]:
                        size = self._span_bytes(entry[1])
                        taken += size
                        if size > LARGE_SPAN and not large:
                            large, budget = True, large_budget
                if item.raw:
                    facts.raw += item.raw
                    facts.raw_bytes += item.raw_bytes
                    taken += item.raw_bytes
            else:
                items.append(item)
                if item[0]:  # as submit() counted it
                    size = self._span_bytes(item[1])
                    taken += size
                    if size > LARGE_SPAN and not large:
                        large, budget = True, large_budget
        self._out_bytes += taken
        return items, markers, consumed, taken, large

    def _map(self, items: list[Any], facts: rows.Facts) -> None:
        skip = self._skipped()
        excluded = facts.excluded
        self._mapping.add(facts, items, skip, _yield_gil)
        self._excluded += facts.excluded - excluded

    def _write(self, facts: rows.Facts, *, flushing: bool = False) -> bool:
        """Write the backlog, then ``facts``; True when all of it reached the file.
        ``flushing``: a flush waits for them (the writer's row is updated with them).

        When a batch fails for another reason than a held file, it is written in halves
        (each half in halves again, in order) so that what fits is written, a full disk
        that has room for some of it again, say. A single row that still fails where the
        file takes others (a value the file refuses) is dropped and counted, so that it
        cannot hold the rest back; rows the file itself refuses are kept and retried.
        """
        # the content policy, once per batch (per chunk, its fixed cost would slow the
        # mapping of small chunks); the backlog's rows went through it before
        scrub.scrubber(self.content).apply(facts)
        backlog = self._backlog
        if backlog is not None:  # what could not be written before goes first
            self._backlog = None
            backlog.extend(facts)
            facts = backlog
        if not facts.rows and not facts.fixes and not facts.scores and not facts.raw and not (flushing and self._losses_unsaid()):
            return True
        self._inflight, self._mapped, self._mapped_facts = facts.rows, 0, None
        self._inflight_rows = (facts.event_rows, facts.turn_rows)
        pieces = [facts]
        try:
            while pieces:
                piece = pieces.pop()
                failure = self._write_piece(piece, flushing)
                if failure is None:
                    self._inflight -= piece.rows
                    self._inflight_rows = (self._inflight_rows[0] - piece.event_rows, self._inflight_rows[1] - piece.turn_rows)
                    continue
                if self._abandoned:  # close() interrupted it: no retry, what is left stays counted as lost
                    rest = piece
                    for later in reversed(pieces):
                        rest.extend(later)
                    self._backlog = rest
                    return False
                if not isinstance(failure, StoreLockedError) and piece.rows > 1:
                    first, second = _halves(piece)
                    pieces += [second, first]  # the first half is written first
                    continue
                if piece.rows == 1 and not _file_error(failure):
                    self._drop_bad_row(failure, piece)
                    self._inflight -= 1
                    self._inflight_rows = (self._inflight_rows[0] - piece.event_rows, self._inflight_rows[1] - piece.turn_rows)
                    continue
                rest = piece
                for later in reversed(pieces):
                    rest.extend(later)
                self._keep(rest, failure)
                return False
        finally:
            self._inflight, self._inflight_rows = 0, (0, 0)
            self._held_bytes = self._backlog_bytes()
            self._written_out()
        self._held = False
        if self._last_error is not None:
            logger.warning("loopscope: writing to %s works again", self.path)
            clear_warning(f"write:{self.path}")
            self._last_error = None
        return True

    def _write_piece(self, facts: rows.Facts, flushing: bool = False) -> BaseException | None:
        """Write ``facts`` in one transaction; the error when it failed."""
        # The rows reach the file proper at a checkpoint, which also rewrites the tables'
        # last, partly filled row groups: about a quarter of a small batch's cost. So they
        # stay in the WAL (on disk too: a reader replays it) until it passes WAL_LIMIT,
        # the writer closes, or it has been idle for CHECKPOINT_IDLE (see _run).
        # A batch of large values (1 MiB tool results) stays in the WAL past WAL_LIMIT, up to
        # DuckDB's own checkpoint_threshold (16 MiB): a checkpoint rewrites the last row
        # group whole, large values and all, so one per batch made each batch dearer than the
        # last (7 MiB/s over 512 MiB of 1 MiB values, against 17 MiB/s so)
        # (A closing writer's last batch goes to the WAL too: _run's checkpoint moves it, a
        # statement that close() can interrupt, where a commit's checkpoint and a detach's are not.)
        final = _wal_size(self.path) >= WAL_LIMIT and _facts_bytes(facts) < LARGE_BATCH
        if facts.events and values.may_cut(facts.event_table()):
            mark_parted(self.path)  # this block writes parts: its attach gives ROW_GROUP_SIZE
        try:
            with self._store(checkpoint=final) as con:
                _ensure_schema(self.path, con)
                if not self._recovered:
                    self._go_on()
                    self._recover(con)
                if self.skip_stored:
                    self._go_on()
                    self.already_stored += idempotent.drop_stored(con, facts)
                tables = Tables()
                extra = self._tracker.statements(facts, tables) if self._tracker is not None else []
                if facts.raw:  # the raw copies of the spans, in their rows' transaction
                    tables.register(raw_spans.RAW_TABLE, raw_spans.raw_table(facts.raw, scrub.scrubber(self.content)))
                    extra.append(raw_spans.raw_insert_sql(facts.raw))
                report, counters = self._report_statements(facts) if self._report_due(flushing) else ([], None)
                written_events, written_turns = write_batch(
                    con, facts, extra=[*extra, *report], seen=self._indices, tables=tables, go_on=self._go_on
                )
                if self._tracker is not None:
                    self._tracker.committed()
            # whether rows wait in the WAL, read from the file: a commit meant to checkpoint
            # may have left them there (its checkpoint failed, see write_batch)
            self._wal_pending = _wal_size(self.path) > 0
            if counters is not None:
                self.report.persisted = counters
                self.report.stored(self._row_id())
                self._reported_at = time.monotonic()
        except (duckdb.Error, StoreError, OSError) as exc:
            self._indices.pending = None
            return exc
        if not self._room_kept:  # the disk had room for a batch: a spare for a record of losses on a full one
            self._room_kept = True
            health.reserve_room(self.path)
        self._written_events += written_events
        self._written_turns += written_turns
        self._written_calls += facts.call_rows
        self._batches += 1
        if self._indices.commit():
            # rows this writer had written are gone from the file (its WAL was removed):
            # counted, and its row in loopscope_writers, gone with them, is made again
            self._lose(self._indices.last_gap, 0)
            self._last_failure = self._last_error = (
                f"{self._indices.lost} events written earlier are missing from the file (was its .wal removed?)"
            )
            self._last_failure_at = time.time()
            self.report.forget(self._row_id())
            warn_once(f"lost-from-file:{self.path}", "loopscope: %s in %s", self._last_failure, self.path)
        return None

    @contextlib.contextmanager
    def _store(self, *, checkpoint: bool) -> Iterator[duckdb.DuckDBPyConnection]:
        """The store opened for the thread's write (:func:`open_store`), its connection the one
        :meth:`_interrupt` stops. Refused once :meth:`_abandon` ran (:class:`Cancelled`), and
        then neither retried nor checkpointed at its end: no DuckDB call starts after it."""
        with self._state:
            if self._abandoned:
                raise Cancelled("the store was closed while this write waited")  # close() counted its rows lost
            self._inside = True
        try:
            with open_store(
                self.path, read_only=False, timeout=self._lock_wait(), checkpoint=checkpoint, cancelled=self._given_up
            ) as con:
                self._con = con
                try:
                    yield con
                finally:
                    self._con = None
        finally:
            with self._state:
                self._inside = False
                self._state.notify_all()

    def _given_up(self) -> bool:
        return self._abandoned

    def _go_on(self) -> None:
        """Before a DuckDB call in the store's block: raise :class:`Cancelled` once abandoned."""
        if self._abandoned:
            raise Cancelled("the store was closed while this write ran")

    def _drop_bad_row(self, exc: BaseException, piece: rows.Facts) -> None:
        self._lose(piece.event_rows, piece.turn_rows)  # one row: an event, a model call or a turn summary
        self._failed_writes += 1
        self._last_failure, self._last_failure_at = _first_line(exc), time.time()
        warn_once(f"bad-row:{self.path}", "loopscope: %s refused an event (%s); it is dropped and counted", self.path, self._last_failure)

    def _recover(self, con: duckdb.DuckDBPyConnection) -> None:
        """Close the turns that dead writers left open, once (again at the next batch if the
        file could not be written now)."""
        try:
            self._mapping.recover(con)
        except duckdb.Error:
            raise
        except Exception:
            internal_error("store recovery")
        self._recovered = True

    def _checkpoint(self) -> None:
        """Move what the last batches left in the WAL into the file (see :meth:`_write`)."""
        try:
            # the WAL kept at the detach: an interrupted CHECKPOINT (see _interrupt) is not done
            # again there, where nothing can interrupt it
            with self._store(checkpoint=False) as con:
                con.execute("CHECKPOINT")
            self._wal_pending = False
        except (duckdb.Error, StoreError, OSError):
            pass  # the rows are safe in the WAL; the next idle wait or the close tries again
        self._written_out()

    def _written_out(self) -> None:
        """A batch (or a checkpoint) is done and its database detached: :attr:`after_write`."""
        if self.after_write is not None:
            self.after_write()

    def _lock_wait(self) -> float:
        """How long a write waits for a file another process holds: ``lock_timeout``, and
        while ``close()`` waits, what is left of its bound (less :data:`CLOSE_MARGIN` for the
        last report), so that a close under load writes what it holds rather than giving
        it up after one ``lock_timeout``."""
        deadline = self._close_deadline
        if deadline is None or self._abandoned:
            return self.lock_timeout
        return max(0.05, deadline - time.monotonic() - CLOSE_MARGIN)

    def _keep(self, facts: rows.Facts, exc: BaseException) -> None:
        """Hold rows that could not be written, up to max_queue rows and max_bytes; count
        the rest (the oldest) as dropped."""
        self._failed_writes += 1
        self._held = isinstance(exc, StoreLockedError)
        self._last_error = _first_line(exc)
        self._last_failure, self._last_failure_at = self._last_error, time.time()
        warn_once(f"write:{self.path}", "loopscope: cannot write to %s (%s); keeping events in memory and retrying", self.path, self._last_error)
        overflow = facts.rows - self.max_queue
        size = _facts_bytes(facts)
        if size > self.max_bytes and facts.rows:  # about the share of the rows over the bound
            overflow = max(overflow, -(-facts.rows * (size - self.max_bytes) // size))
        if overflow > 0:
            events, turns = facts.event_rows, facts.turn_rows
            facts.drop_oldest(overflow)
            self._lose(events - facts.event_rows, turns - facts.turn_rows)
        self._backlog = facts

    def _backlog_bytes(self) -> int:
        backlog = self._backlog
        return _facts_bytes(backlog) if backlog is not None else 0


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def committed_anyway(exc: BaseException) -> bool:
    """Whether DuckDB says a COMMIT that raised ``exc`` was written and is durable (only
    the automatic checkpoint after it failed). DuckDB has no exception type for this,
    only its message."""
    return "COMMIT succeeded and is durable" in str(exc)


def _file_error(exc: BaseException) -> bool:
    """Whether ``exc`` is about the file (it cannot be opened, written, grown) rather than
    about the rows: such rows are kept and retried, never dropped as bad."""
    if isinstance(exc, (StoreError, OSError, duckdb.IOException)):
        return True
    text = str(exc).lower()
    return any(word in text for word in ("invalidated", "space", "disk", "file", "i/o", "fatal", "lock"))


def _halves(facts: rows.Facts) -> tuple[rows.Facts, rows.Facts]:
    """``facts`` in two, in order: the first half of the events, then the rest of them with
    every model call and turn summary (a turn's summary is written with or after its
    events, so the open turns noted by the recovery tracker close in order); without
    events, the model calls are halved likewise (the turn summaries after them), then the
    turn summaries. Each half holds at least one row of ``facts`` (which holds two or more)."""
    first, second = rows.Facts(), rows.Facts()
    second.fixes = list(facts.fixes)  # after every row they may fix
    second.scores = list(facts.scores)  # a table of their own: with the last half
    second.raw, second.raw_bytes = list(facts.raw), facts.raw_bytes  # with the rows that are written last
    events = facts.event_rows
    if events > 1 or (events == 1 and (facts.turn_rows or facts.call_rows)):
        cut = events // 2 if events > 1 else 1
        table = facts.event_table()
        first.events, first.sessions = table.slice(0, cut).to_batches(), facts.sessions[:cut]
        second.events, second.sessions = table.slice(cut).to_batches(), facts.sessions[cut:]
        second.calls, second.call_rows = list(facts.calls), facts.call_rows
        second.turns, second.turn_rows = list(facts.turns), facts.turn_rows
    elif facts.call_rows > 1 or (facts.call_rows == 1 and facts.turn_rows):
        second.events, second.sessions = list(facts.events), list(facts.sessions)
        cut = facts.call_rows // 2 if facts.call_rows > 1 else 1
        table = facts.call_table()
        first.calls, first.call_rows = table.slice(0, cut).to_batches(), cut
        second.calls, second.call_rows = table.slice(cut).to_batches(), facts.call_rows - cut
        second.turns, second.turn_rows = list(facts.turns), facts.turn_rows
    else:
        second.events, second.sessions = list(facts.events), list(facts.sessions)
        second.calls, second.call_rows = list(facts.calls), facts.call_rows
        cut = facts.turn_rows // 2
        table = facts.turn_table()
        first.turns, first.turn_rows = table.slice(0, cut).to_batches(), cut
        second.turns, second.turn_rows = table.slice(cut).to_batches(), facts.turn_rows - cut
    return first, second


def _facts_bytes(facts: rows.Facts) -> int:
    """The Arrow bytes of the rows of ``facts`` (what they hold in memory, about)."""
    return (
        sum(batch.nbytes for batch in facts.events) + sum(batch.nbytes for batch in facts.turns)
        + sum(batch.nbytes for batch in facts.calls) + facts.raw_bytes
    )


class _Bundle:
    """One entry of the queue holding several spans and their raw copies, written in one
    transaction (see :meth:`StoreWriter.begin_bundle`)."""

    __slots__ = ("raw", "raw_bytes", "spans")

    def __init__(self, spans: list[Any], raw: list[tuple[Any, ...]], raw_bytes: int) -> None:
        self.spans, self.raw, self.raw_bytes = spans, raw, raw_bytes


class _SessionIndex:
    """The last index this writer gave each session's events, to tell when the file lost
    rows it had written (its WAL removed while the writer ran): the file's last index of
    a session is then below this writer's. :func:`write_batch` checks (``pending``),
    :meth:`commit` counts once the batch is written. Bounded: the most recent sessions."""

    LIMIT = 10_000

    def __init__(self) -> None:
        self.last: dict[str, int] = {}
        self.lost = 0
        self.last_gap = 0
        self.pending: tuple[int, dict[str, int]] | None = None

    def check(self, known: dict[str, int], next_index: dict[str, int]) -> None:
        """Called by :func:`write_batch`: ``known`` is the file's last index of the batch's
        sessions, ``next_index`` what they are once the batch is written."""
        last = self.last
        gap = sum(last[s] - known.get(s, 0) for s in next_index if s in last and last[s] > known.get(s, 0))
        self.pending = (gap, next_index)

    def commit(self) -> bool:
        """The batch checked last was written; True when it found rows missing."""
        pending, self.pending = self.pending, None
        if pending is None:
            return False
        gap, next_index = pending
        last = self.last
        for session, index in next_index.items():
            last.pop(session, None)
            last[session] = index  # the most recent last
        while len(last) > self.LIMIT:
            del last[next(iter(last))]
        self.last_gap = gap
        self.lost += gap
        return gap > 0


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


_WRITER_GUARD = guard("store writer")

_schema_ready: set[str] = set()
_schema_lock = threading.Lock()


def _ensure_schema(path: str, con: duckdb.DuckDBPyConnection) -> None:
    with _schema_lock:
        if path in _schema_ready:
            return
        migrate(con)
        if values.has_parts(con):
            mark_parted(path)  # from the next attach on (see connection.ROW_GROUP_SIZE)
        _schema_ready.add(path)


def write_batch(
    con: duckdb.DuckDBPyConnection, facts: rows.Facts, *, extra: Sequence[str] = (), seen: _SessionIndex | None = None,
    tables: Tables | None = None, go_on: Callable[[], None] | None = None,
) -> tuple[int, int]:
    """Write the rows of a batch of facts in one transaction, giving events their per-session indices.

    The rows are made from the facts in Arrow (:mod:`arrow_rows`: each insert then binds
    no expression), or in SQL where only DuckDB makes them the same (:data:`rows.EVENTS_SQL`,
    :data:`rows.TURNS_SQL`), the session counters too, all in one script of as few
    statements as it takes: every statement has DuckDB's Python client take the GIL back
    from the application's threads at each of its steps (see ``connection._Home``).
    ``extra`` statements run in the same transaction, after the rows (an importer writes
    its own table with them, so that all of it or none of it is stored). ``con`` is a
    write block of :func:`~loopscope.storage.duckdb.connection.open_store`, whose settings say
    whether the commit checkpoints. ``seen``, a writer's memory of the indices it gave,
    is shown the file's (:meth:`_SessionIndex.check`). ``tables`` holds the Arrow tables
    that the ``extra`` statements read (see :func:`scanning`); tables registered on ``con``
    are read too. ``go_on`` is called before each DuckDB call and may raise to stop the
    batch there (a writer that ``close()`` gave up on: see ``StoreWriter._go_on``). Returns
    how many events and turn summaries were written.
    """
    import pyarrow as pa  # imported here: the hot path and a plain import never need it

    tables = tables if tables is not None else Tables()
    events, turns = facts.event_table(), facts.turn_table()
    script = ["BEGIN TRANSACTION"]
    if events is not None:
        sessions = facts.sessions
        distinct = list(dict.fromkeys(sessions))  # in order of first appearance
        # each session's events are numbered on from its last index (read to the end:
        # DuckDB 2 refuses a register() while a result is open); a lookup and numbering
        # here cost less than doing it in EVENTS_SQL (a join and a window)
        ids = {_SESSION_IDS: pa.table({"session_id": pa.array(distinct, pa.string())})}
        if go_on is not None:
            go_on()
        known = dict(scanning(con, _SESSIONS_LOOKUP_SQL, ids).fetchall())
        next_index = {s: known.get(s, 0) for s in distinct}
        if seen is not None:
            seen.check(known, next_index)  # the dict is numbered on below: its last indices then
        indices = []
        add = indices.append
        for session in sessions:
            value = next_index[session] + 1
            next_index[session] = value
            add(value)
        events = events.append_column("idx", pa.array(indices, pa.int64()))
        parts = None
        cutting = values.may_cut(events)
        # the rows themselves: a plain insert binds in a quarter of the time
        made = arrow_rows.event_rows(events, any_length=cutting)
        if cutting:
            # a value long enough to be kept in parts (rare): the rows made here, or by
            # DuckDB's SQL read back as Arrow, then cut (values.py)
            if made is None:
                if go_on is not None:
                    go_on()
                plain = events.column("content").null_count == events.num_rows
                made = _arrow_of(con, rows.events_select(overrides=not plain), {rows.EVENTS_TABLE: events})
                made = made.rename_columns(list(rows.EVENT_COLUMNS))
            made, parts = values.cut(made)
            if parts is not None:  # the next attach of this file, whoever writes it here, gives ROW_GROUP_SIZE
                found = con.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchall()
                if found and found[0][0]:
                    mark_parted(str(found[0][0]))
        if made is not None:
            tables.register(arrow_rows.EVENT_ROWS, made)
            script.append(arrow_rows.EVENTS_INSERT)
            if parts is not None:
                tables.register(values.PARTS_ROWS, parts)
                script.append(values.PARTS_INSERT)
        else:
            # most batches have no content made in Python: a statement without its branches binds faster
            plain = events.column("content").null_count == events.num_rows
            script.append(rows.PLAIN_EVENTS_SQL if plain else rows.EVENTS_SQL)
        script += tool_totals.batch_script(tables, events)  # tool_stats's totals, in the rows' transaction
        # the session counters, made here with Arrow (a statement that aggregates the
        # batch's events costs DuckDB ~2 ms more to plan), in one statement: an update
        # when the file has every session of the batch, a plain insert when it has none
        # (the file is ours meanwhile), an upsert for both (one statement costs a batch
        # less than two, but more than the plain insert alone)
        counters = (
            events.select(["session_id", "idx", "created_us"])
            .group_by("session_id")
            .aggregate([("idx", "max"), ("created_us", "min"), ("created_us", "max")])
            .rename_columns(["session_id", "last_index", "first_at", "last_at"])
        )
        tables.register(_SESSION_COUNTERS, counters)
        if not known:
            script.append(_SESSIONS_INSERT_SQL)
        elif len(known) == len(distinct):
            script.append(_SESSIONS_UPDATE_SQL)
        else:
            script.append(_SESSIONS_UPSERT_SQL)
    calls = facts.call_table()
    if calls is not None:
        made = arrow_rows.call_rows(calls)
        if made is not None:
            tables.register(arrow_rows.CALL_ROWS, made)
        script.append(rows.CALLS_SQL if made is None else arrow_rows.CALLS_INSERT)
    if turns is not None:
        made = arrow_rows.turn_rows(turns)
        if made is not None:
            tables.register(arrow_rows.TURN_ROWS, made)
        script.append(rows.TURNS_SQL if made is None else arrow_rows.TURNS_INSERT)
    if facts.fixes:  # served tool calls the application then sent back as errors (rare): set failed
        fixes = list({(f[0], f[1], f[2]): f for f in facts.fixes}.values())  # one per call (an UPDATE takes one match)
        tables.register(rows.FIXES_TABLE, pa.Table.from_pylist(
            [dict(zip(rows.ToolFix._fields, fix)) for fix in fixes],
            pa.schema([("session_id", pa.string()), ("correlation_id", pa.string()), ("tool_id", pa.string()),
                       ("error", pa.string()), ("created_us", pa.int64()), ("since_us", pa.int64())]),
        ))
        since = min(fix[5] for fix in fixes)
        script += [tool_totals.fix_sql(since), rows.fix_sql(since)]
    if facts.scores:  # scores of turns, calls and tools (loopscope.score, gen_ai.evaluation.result): rare
        tables.register(rows.SCORES_TABLE, pa.Table.from_pylist(
            [dict(zip(rows.SCORE_FIELDS, fact)) for fact in {f[0]: f for f in facts.scores}.values()],
            rows.score_schema(),
        ))
        script.append(rows.SCORES_INSERT)
    script += extra
    script.append("COMMIT")
    # the tables of facts, for the statements that read them (the SQL that makes rows where
    # the Arrow rows could not, the tool totals' and the recovery tracker's); a table no
    # statement names costs nothing
    for name, table in ((rows.EVENTS_TABLE, events), (rows.CALLS_TABLE, calls), (rows.TURNS_TABLE, turns)):
        if table is not None:
            tables.register(name, table)
    if go_on is not None:
        go_on()  # (before the transaction: nothing to roll back)
    try:
        scanning(con, ";\n".join(script), tables.by_name)
    except BaseException as exc:
        if committed_anyway(exc):
            # the transaction is in the WAL and only DuckDB's automatic checkpoint after it
            # failed (a full disk): the rows are stored (every attach replays the WAL), so
            # they count as written; written again, they would be stored twice
            return facts.event_rows, facts.turn_rows
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:
            pass  # no transaction left to roll back
        raise
    return facts.event_rows, facts.turn_rows


_ARROW_SCAN = compile("result = con.sql(sql)", "<loopscope batch>", "exec")


def _arrow_of(con: duckdb.DuckDBPyConnection, sql: str, tables: dict[str, Any]) -> Any:
    """The rows of ``sql`` as a pyarrow Table, where the names of ``tables`` are those
    tables (as :func:`scanning`). A relation's, not a result's (DuckDB 1.4 warns that an
    Arrow table of a result is an extra copy), named ``to_arrow_table`` since DuckDB 1.4,
    ``arrow`` before."""
    scope = {"con": con, "sql": sql, **tables}
    exec(_ARROW_SCAN, scope)  # noqa: S102  # a constant statement; the namespace is what DuckDB looks names up in
    relation = scope["result"]
    to_table = getattr(relation, "to_arrow_table", None) or relation.arrow
    return to_table()


class Tables:
    """The Arrow tables a batch's statements read, by the names the statements use (what
    ``write_batch``'s ``extra`` statements read is registered here too, by whoever makes
    them: ``register(name, table)``, as on a connection)."""

    __slots__ = ("by_name",)

    def __init__(self) -> None:
        self.by_name: dict[str, Any] = {}

    def register(self, name: str, table: Any) -> None:
        self.by_name[name] = table


_SCAN = compile("result = con.execute(sql)", "<loopscope batch>", "exec")


def scanning(con: duckdb.DuckDBPyConnection, sql: str, tables: dict[str, Any]) -> duckdb.DuckDBPyConnection:
    """``con.execute(sql)`` where the names of ``tables`` are those tables: DuckDB reads a
    Python variable that a statement names (its replacement scan, in the frame that runs
    the statement: here the namespace the statement runs in). A ``con.register()`` costs
    ~0.4 ms for each table (it makes a view: a statement of its own), the replacement
    scan next to nothing more than the statement's binding of the table."""
    scope = {"con": con, "sql": sql, **tables}
    exec(_SCAN, scope)  # noqa: S102  # a constant statement; the namespace is what DuckDB looks names up in
    return scope["result"]  # type: ignore[no-any-return]


_SESSION_IDS, _SESSION_COUNTERS = "_loopscope_session_ids", "_loopscope_session_counters"
_SESSIONS_LOOKUP_SQL = f"SELECT s.session_id, s.last_index FROM sessions s SEMI JOIN {_SESSION_IDS} b USING (session_id)"
_SESSIONS_UPDATE_SQL = f"""UPDATE sessions SET last_index = b.last_index,
  first_at = least(sessions.first_at, b.first_at), last_at = greatest(sessions.last_at, b.last_at)
FROM {_SESSION_COUNTERS} b WHERE sessions.session_id = b.session_id"""
_SESSIONS_INSERT_SQL = f"INSERT INTO sessions (session_id, last_index, first_at, last_at) SELECT * FROM {_SESSION_COUNTERS}"
_SESSIONS_UPSERT_SQL = f"""{_SESSIONS_INSERT_SQL}
ON CONFLICT (session_id) DO UPDATE SET last_index = excluded.last_index,
  first_at = least(sessions.first_at, excluded.first_at), last_at = greatest(sessions.last_at, excluded.last_at)"""


_live_writers: weakref.WeakSet[StoreWriter] = weakref.WeakSet()
_left_behind: weakref.WeakSet[StoreWriter] = weakref.WeakSet()
"""Writers whose thread ``close()`` gave up on (:meth:`StoreWriter._abandon`)."""


@atexit.register  # before _close_all: runs after it (and after every exit hook registered since)
def _leave_duckdb_at_exit() -> None:
    """The last of loopscope's exit hooks: a writer's thread that ``close()`` gave up on must
    have left DuckDB before the interpreter finalises. It starts no DuckDB call once given up
    on, and the call it is in is interrupted; it gets until :data:`LEAVE_WAIT` after it was
    given up on. A thread still inside then would be stopped by the interpreter as it comes
    back (the process aborts, SIGABRT, exit status 134): the process ends here instead, by
    ``os._exit``, as a writer process does (its streams and log handlers flushed; what the
    writer held is counted already). Exit hooks registered before loopscope was imported do
    not run then, and the status is 1 after an uncaught exception, else 0 (the one a
    ``sys.exit(n)`` asked for is not known here)."""
    inside = False
    for writer in list(_left_behind):
        if writer._thread.is_alive() and not writer._interrupt(writer._abandoned_at + LEAVE_WAIT):
            inside = True
    if not inside:
        return
    logger.warning("loopscope: the store's writer is still inside DuckDB; the process ends now (os._exit) rather than "
                   "abort as the interpreter stops it")
    _end_now()


def _end_now() -> None:
    import logging

    with contextlib.suppress(Exception):
        logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()
    failed = getattr(sys, "last_exc", None) is not None or getattr(sys, "last_value", None) is not None
    real_exit = getattr(os._exit, "__wrapped__", os._exit)  # past loopscope's own wrap (_exits.py): all is closed
    real_exit(1 if failed else 0)


@atexit.register
def _close_all() -> None:
    for writer in list(_live_writers):
        try:
            writer.close()
        except Exception:
            logger.warning("loopscope: could not flush %s at exit", writer.path, exc_info=True)
