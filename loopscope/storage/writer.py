"""The background writer: spans in from the hot path, columnar batches out to DuckDB.

The calling thread only appends a reference to a bounded deque. A daemon thread wakes
every ``flush_interval`` (or when a batch is full), maps the spans to rows, gives each
row its per-session index, and writes the batch as Arrow columns in one transaction,
holding the file only for that moment so that other processes can read in between.
Rows that cannot be written (a reader holding the file too long, a full disk) are kept
and retried; past ``max_queue`` the oldest are dropped and counted, never silently.
"""

from __future__ import annotations

import atexit
import collections
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import duckdb

from .._guard import clear_warning, internal_error, logger, warn_once
from . import mapping
from .connection import open_store
from .errors import StoreError
from .policy import PersistencePolicy
from .schema import migrate

_START, _END = 0, 1


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
        self._backlog_events: list[mapping.EventRow] = []
        self._backlog_turns: list[mapping.TurnRow] = []
        self._written_events = 0
        self._written_turns = 0
        self._dropped = 0
        self._excluded = 0
        self._failed_writes = 0
        self._batches = 0
        self._last_error: str | None = None
        self._allowed: dict[str, bool] = {}
        self._allowed_by: PersistencePolicy | None = None
        self._thread = threading.Thread(target=self._run, name=f"loopscope-writer {path}", daemon=True)
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
        if len(queue) >= self.batch_size:
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
        """Flush, then stop the thread. Further spans are counted as dropped."""
        if self._closed:
            return
        self.flush(timeout)
        self._closed = True
        self._wake.set()
        self._thread.join(timeout)
        _live_writers.discard(self)
        lost = self._dropped + len(self._backlog_events) + len(self._backlog_turns)
        if lost:
            logger.warning("loopscope: %d events could not be stored in %s (%s)", lost, self.path, self._last_error or "queue full")

    def stats(self) -> WriterStats:
        return WriterStats(
            queued=len(self._queue) + len(self._backlog_events) + len(self._backlog_turns),
            written_events=self._written_events,
            written_turns=self._written_turns,
            dropped=self._dropped,
            excluded=self._excluded,
            failed_writes=self._failed_writes,
            batches=self._batches,
            last_error=self._last_error,
        )

    # -- the background thread -----------------------------------------------------------

    def _run(self) -> None:
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

    def _drain(self) -> None:
        while True:
            items, markers = self._take()
            events, turns = self._map(items)
            ok = self._write(events, turns)
            for marker in markers:
                marker.ok = ok
                marker.done.set()
            if not self._queue or not ok:
                return

    def _take(self) -> tuple[list[Any], list[_Marker]]:
        items: list[Any] = []
        markers: list[_Marker] = []
        queue = self._queue
        popleft = queue.popleft
        for _ in range(min(len(queue), self.batch_size)):
            item = popleft()
            if type(item) is _Marker:
                markers.append(item)
            else:
                items.append(item)
        return items, markers

    def _map(self, items: list[Any]) -> tuple[list[mapping.EventRow], list[mapping.TurnRow]]:
        events = self._backlog_events
        turns = self._backlog_turns
        self._backlog_events, self._backlog_turns = [], []
        on_start, on_end = mapping.rows_on_start, mapping.rows_on_end
        policy = self.policy
        if self._allowed_by is not policy:  # the policy's answer per event type, asked once
            self._allowed, self._allowed_by = {}, policy
        allowed = self._allowed
        for kind, span in items:
            try:
                if kind == _START:
                    rows = on_start(span)
                else:
                    rows, turn = on_end(span)
                    if turn is not None:
                        turns.append(turn)
                for row in rows:
                    keep = allowed.get(row.type)
                    if keep is None:
                        keep = allowed[row.type] = policy.allows(row.type)
                    if keep:
                        events.append(row)
                    else:
                        self._excluded += 1
            except Exception:
                internal_error("span mapping")
        return events, turns

    def _write(self, events: list[mapping.EventRow], turns: list[mapping.TurnRow]) -> bool:
        if not events and not turns:
            return True
        try:
            with open_store(self.path, read_only=False, timeout=self.lock_timeout) as con:
                _ensure_schema(self.path, con)
                write_batch(con, events, turns)
        except (duckdb.Error, StoreError, OSError) as exc:
            self._keep(events, turns, exc)
            return False
        self._written_events += len(events)
        self._written_turns += len(turns)
        self._batches += 1
        if self._last_error is not None:
            logger.warning("loopscope: writing to %s works again", self.path)
            clear_warning(f"write:{self.path}")
            self._last_error = None
        return True

    def _keep(self, events: list[mapping.EventRow], turns: list[mapping.TurnRow], exc: BaseException) -> None:
        """Hold rows that could not be written, up to max_queue; count the rest as dropped."""
        self._failed_writes += 1
        self._last_error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        warn_once(f"write:{self.path}", "loopscope: cannot write to %s (%s); keeping events in memory and retrying", self.path, self._last_error)
        overflow = len(events) + len(turns) - self.max_queue
        if overflow > 0:
            cut = min(overflow, len(events))
            self._dropped += overflow
            events = events[cut:]
            turns = turns[overflow - cut:]
        self._backlog_events, self._backlog_turns = events, turns


_schema_ready: set[str] = set()
_schema_lock = threading.Lock()


def _ensure_schema(path: str, con: duckdb.DuckDBPyConnection) -> None:
    with _schema_lock:
        if path in _schema_ready:
            return
        migrate(con)
        _schema_ready.add(path)


def write_batch(con: duckdb.DuckDBPyConnection, events: list[mapping.EventRow], turns: list[mapping.TurnRow]) -> None:
    """Write mapped rows in one transaction, giving events their per-session indices."""
    import pyarrow as pa  # imported here: the hot path and a plain import never need it

    con.execute("BEGIN TRANSACTION")
    try:
        if events:
            columns = list(zip(*events))
            sessions = columns[1]
            distinct = dict.fromkeys(sessions)  # in order of first appearance
            known = dict(
                con.execute(
                    "SELECT session_id, last_index FROM sessions WHERE list_contains(?, session_id)", [list(distinct)]
                ).fetchall()
            )
            next_index = {s: known.get(s, 0) for s in distinct}
            indices = []
            for session in sessions:
                value = next_index[session] + 1
                next_index[session] = value
                indices.append(value)
            created = columns[3]
            table = pa.table(
                {
                    "id": pa.array(columns[0], pa.string()),
                    "session_id": pa.array(sessions, pa.string()),
                    "idx": pa.array(indices, pa.int64()),
                    "type": pa.array(columns[2], pa.string()),
                    "created_at": pa.array(created, pa.timestamp("us", tz="UTC")),
                    "correlation_id": pa.array(columns[4], pa.string()),
                    "source_channel_id": pa.array(columns[5], pa.string()),
                    "source_provider": pa.array(columns[6], pa.string()),
                    "source_framework": pa.array(columns[7], pa.string()),
                    "status": pa.array(columns[8], pa.string()),
                    "content": pa.array(columns[9], pa.string()),
                    "trace_id": pa.array(columns[10], pa.string()),
                    "span_id": pa.array(columns[11], pa.string()),
                }
            )
            con.register("_loopscope_events", table)
            con.execute("INSERT INTO events SELECT * FROM _loopscope_events")
            # the session counters from the same Arrow table, in one statement: a row per
            # session is far cheaper than executemany's statement per session
            con.execute(
                """INSERT INTO sessions
                   SELECT session_id, max(idx), min(created_at), max(created_at) FROM _loopscope_events GROUP BY session_id
                   ON CONFLICT (session_id) DO UPDATE SET last_index = excluded.last_index,
                     first_at = least(sessions.first_at, excluded.first_at),
                     last_at = greatest(sessions.last_at, excluded.last_at)"""
            )
            con.unregister("_loopscope_events")
        if turns:
            columns = list(zip(*turns))
            table = pa.table(
                {name: pa.array(col, pa.timestamp("us", tz="UTC") if name == "timestamp_us" else None)
                 for name, col in zip(mapping.TurnRow._fields, columns)}
            )
            con.register("_loopscope_turns", table)
            con.execute(f"INSERT INTO turns SELECT {', '.join(_TURN_SELECT)} FROM _loopscope_turns")
            con.unregister("_loopscope_turns")
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


_TURN_SELECT = [
    f"CAST({name} AS JSON)" if name in ("segments", "usage", "declared_tools") else name
    for name in mapping.TurnRow._fields
]

_live_writers: weakref.WeakSet[StoreWriter] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for writer in list(_live_writers):
        try:
            writer.close(timeout=10.0)
        except Exception:
            logger.warning("loopscope: could not flush %s at exit", writer.path, exc_info=True)


