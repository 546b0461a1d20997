"""Following a session's log: the stored events, then the ones that land afterwards.

The log is append-only and its indices are gap-free per session: the writer numbers a
batch's rows inside its write transaction, from ``sessions.last_index``, which it moves
in the same transaction. So a reader that asks for the events past its cursor and then
moves the cursor to the ``last_index`` read *in the same connection* (one consistent
state of the file) sees every event exactly once, whatever process writes and however
the reads fall between the writer's batches: the seam between the stored part and the
live part is just one more cursor step. Rows a filter leaves out (blocked ones) still
move the cursor past them.

:func:`read_after` is that one query; :class:`Replay` / :class:`AsyncReplay`
(``Store.replay``) follow one session with it, :class:`Follower` (``loopscope tail
--follow``) follows many, and the web dashboard's live timeline asks for its pages with
it. Each read attaches the file read-only for that read alone, as every reader does, so
the writer in the agent's process keeps its turn.
"""

from __future__ import annotations

import contextlib
import heapq
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol

from ...models import ActivityEvent
from ..errors import StoreLockedError
from ..policy import RECEIVED, EventFilter
from . import values
from .connection import open_store
from .engine import duckdb
from .events import CONTENT_AT, EVENT_COLUMNS, ID_AT, event_of
from .schema import check_readable

if TYPE_CHECKING:
    import asyncio  # imported where an async replay runs (on an event loop, it is loaded already)

    from typing_extensions import Self  # typing.Self from 3.11; only read by type checkers here

    from .store import Store

__all__ = [
    "AfterPage", "AsyncReplay", "Follower", "Replay", "SessionMark", "StopFlag", "interleave", "read_after", "session_mark",
]

DEFAULT_PAGE = 500
"""Events a replay reads at most per query (it reads on at once while there are more)."""


class StopFlag(Protocol):
    """What a replay's ``stop`` can be: anything with ``is_set()``, such as a
    ``threading.Event`` or an ``asyncio.Event``."""

    def is_set(self) -> bool: ...


@dataclass(frozen=True)
class SessionMark:
    """A session's row of ``sessions``: its last index and the times of its first and last event."""

    last_index: int
    first_at: datetime | None
    last_at: datetime | None


@dataclass(frozen=True)
class AfterPage:
    """What :func:`read_after` found: the rows (without their leading index), their column
    names, where the next read takes up (``cursor``), and whether the state read holds
    more rows past the page (``more``: read again at once)."""

    rows: list[tuple[Any, ...]]
    names: list[str]
    cursor: int
    more: bool
    mark: SessionMark | None


def session_mark(con: duckdb.DuckDBPyConnection, session_id: str) -> SessionMark | None:
    row = con.execute("SELECT last_index, first_at, last_at FROM sessions WHERE session_id = ?", [session_id]).fetchone()
    return SessionMark(int(row[0]), row[1], row[2]) if row else None


def _marks(con: duckdb.DuckDBPyConnection) -> dict[str, SessionMark]:
    return {r[0]: SessionMark(int(r[1]), r[2], r[3]) for r in con.execute("SELECT session_id, last_index, first_at, last_at FROM sessions").fetchall()}


def _span(mark: SessionMark | None) -> tuple[list[str], list[Any]]:
    # the session's time span lets DuckDB skip the row groups written while it was idle
    if mark is not None and mark.first_at is not None and mark.last_at is not None:
        return ["created_at BETWEEN ? AND ?"], [mark.first_at, mark.last_at]
    return [], []


def read_after(
    con: duckdb.DuckDBPyConnection,
    session_id: str,
    after_index: int,
    *,
    columns: str,
    event_filter: EventFilter | None = None,
    limit: int | None = None,
    upto: int | None = None,
    mark: SessionMark | None = None,
) -> AfterPage:
    """The events of ``session_id`` past ``after_index``, ascending by index, as
    ``SELECT {columns}`` rows, at most ``limit`` of them and none past ``upto``.

    Bounded by the session's ``last_index`` read on the same connection (``mark``, read
    here unless given), so ``cursor`` (the last index of a full page, else that bound) is
    exactly where the next read takes up: nothing is skipped and nothing comes twice.
    """
    if mark is None:
        mark = session_mark(con, session_id)
    top = mark.last_index if mark is not None else after_index
    if upto is not None:
        top = min(top, upto)
    if top <= after_index:
        return AfterPage([], [], after_index, False, mark)
    clauses, params = (event_filter or RECEIVED).where()
    span_clauses, span_params = _span(mark)
    where = " AND ".join(["session_id = ?", "idx > ?", "idx <= ?", *clauses, *span_clauses])
    sql = f"SELECT idx, {columns} FROM events WHERE {where} ORDER BY idx"
    if limit is not None:
        sql += f" LIMIT {int(limit) + 1}"
    cursor = con.execute(sql, [session_id, after_index, top, *params, *span_params])
    names = [d[0] for d in cursor.description][1:]
    rows = cursor.fetchall()
    more = limit is not None and len(rows) > limit
    if more:
        rows = rows[:limit]
        top = int(rows[-1][0])
    rows = [r[1:] for r in rows]
    if "id" in names and "content" in names:  # large values whole (values.py)
        rows = values.fill(con, rows, names.index("id"), names.index("content"))
    return AfterPage(rows, names, top, more, mark)


@contextlib.contextmanager
def _reading(store: Store, flush: bool = True) -> Iterator[duckdb.DuckDBPyConnection]:
    if flush:
        store._flush_own()  # what this process recorded so far is in the file
    with open_store(store.path, read_only=True, timeout=store.lock_timeout) as con:
        check_readable(con)
        yield con


def _events(rows: list[tuple[Any, ...]]) -> list[ActivityEvent]:
    return [event_of(r) for r in rows]


def _columns() -> str:
    return EVENT_COLUMNS


# -- one session: Store.replay -------------------------------------------------------------


class _ReplayState:
    """The cursor, the events read and not yet handed out, and when to stop: the part a
    sync and an async replay share. One :meth:`read` is one short read of the file."""

    def __init__(
        self,
        store: Store,
        session_id: str,
        after_index: int | None,
        *,
        until_turn_end: bool,
        poll_interval: float,
        event_filter: EventFilter | None,
        stop: StopFlag | None,
        page: int,
    ) -> None:
        if poll_interval <= 0:
            raise ValueError("poll_interval must be positive")
        if page <= 0:
            raise ValueError("page must be positive")
        self.store = store
        self.session_id = session_id
        self.cursor = max(0, after_index or 0)
        self.until_turn_end = until_turn_end
        self.poll_interval = poll_interval
        self.event_filter = event_filter
        self.page = page
        self.buffer: deque[ActivityEvent] = deque()
        self.delivered = self.cursor
        self.started = False
        self.more = False
        self.done = False  # no read left to do: hand out the buffer, then end
        self.end_at: int | None = None  # with until_turn_end: the last index to deliver
        self.waiting: set[str] = set()  # the turns in flight at the start, until their summaries land
        self._user_stop = stop
        self.stop_flag = threading.Event()

    def stopped(self) -> bool:
        user = self._user_stop
        return self.stop_flag.is_set() or (user is not None and user.is_set())

    def read(self) -> None:
        """Read once: the events past the cursor (a page) and, with ``until_turn_end``,
        whether the turns waited for have their summaries, all from one state of the file.
        Only the first read flushes this process's own writer: a live part arrives within
        the writer's ``flush_interval`` anyway, and polls must not force tiny batches."""
        first = not self.started
        try:
            with _reading(self.store, flush=first) as con:
                mark = session_mark(con, self.session_id)
                if first and self.until_turn_end:
                    self.waiting = _in_flight(con, self.session_id, mark)
                page = read_after(
                    con, self.session_id, self.cursor, columns=_columns(), event_filter=self.event_filter,
                    limit=self.page, upto=self.end_at, mark=mark,
                )
                if self.until_turn_end and self.end_at is None:
                    if self.waiting:
                        self.waiting -= _ended(con, self.session_id, self.waiting)
                    if not self.waiting:
                        # the summaries are committed with every event written before them:
                        # deliver up to what this state of the file holds, no further
                        self.end_at = mark.last_index if mark is not None else self.cursor
        except StoreLockedError:
            if first:
                raise
            return  # someone holds the file for long: try again at the next poll
        self.started = True
        self.buffer.extend(_events(page.rows))
        self.cursor = page.cursor
        self.more = page.more
        if self.end_at is not None and self.cursor >= self.end_at:
            self.done = True

    def take(self) -> ActivityEvent:
        event = self.buffer.popleft()
        self.delivered = event.index
        return event

    @property
    def position(self) -> int:
        return self.delivered if self.buffer else max(self.delivered, self.cursor)


def _in_flight(con: duckdb.DuckDBPyConnection, session_id: str, mark: SessionMark | None) -> set[str]:
    """The turns of the session that have events and no summary yet."""
    if mark is None:
        return set()
    span_clauses, span_params = _span(mark)
    where = " AND ".join(["session_id = ?", "correlation_id IS NOT NULL", *span_clauses])
    rows = con.execute(
        f"SELECT DISTINCT correlation_id FROM events WHERE {where} "
        "EXCEPT SELECT correlation_id FROM turns WHERE session_id = ?",
        [session_id, *span_params, session_id],
    ).fetchall()
    return {r[0] for r in rows}


def _ended(con: duckdb.DuckDBPyConnection, session_id: str, turns: set[str]) -> set[str]:
    rows = con.execute(
        "SELECT correlation_id FROM turns WHERE session_id = ? AND list_contains(?, correlation_id)",
        [session_id, sorted(turns)],
    ).fetchall()
    return {r[0] for r in rows}


class Replay(Iterator[ActivityEvent]):
    """The events of one session in index order: the stored ones, then, without a gap or
    a repeat, those that land afterwards (see :meth:`loopscope.Store.replay`).

    Iterate it; stop it with :meth:`stop` (any thread), :meth:`close`, the ``stop``
    flag it was given, or by leaving a ``with`` block. :attr:`position` is the index
    to resume from (``after_index=replay.position``).
    """

    def __init__(self, state: _ReplayState) -> None:
        self._state = state

    @property
    def session_id(self) -> str:
        return self._state.session_id

    @property
    def position(self) -> int:
        """The index of the last event handed out (or read past, when a filter left the
        rest out): a new replay with ``after_index=position`` takes up exactly here."""
        return self._state.position

    def stop(self) -> None:
        """End the replay: the next ``next()`` raises ``StopIteration`` (a wait wakes now)."""
        self._state.stop_flag.set()

    close = stop

    def __iter__(self) -> Replay:
        return self

    def __next__(self) -> ActivityEvent:
        state = self._state
        while True:
            if state.stopped():
                raise StopIteration
            if state.buffer:
                return state.take()
            if state.done:
                raise StopIteration
            if state.started and not state.more and state.stop_flag.wait(state.poll_interval):
                raise StopIteration
            if state.stopped():
                raise StopIteration
            state.read()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


class AsyncReplay:
    """:class:`Replay` as an async iterator: each read runs in a worker thread and the
    waits between polls are ``asyncio`` sleeps, so the event loop never blocks."""

    def __init__(self, state: _ReplayState) -> None:
        self._state = state
        self._wake: asyncio.Event | None = None

    @property
    def session_id(self) -> str:
        return self._state.session_id

    @property
    def position(self) -> int:
        """See :attr:`Replay.position`."""
        return self._state.position

    def stop(self) -> None:
        """End the replay (from the event loop's thread a wait ends at once; from another
        thread within one ``poll_interval``)."""
        self._state.stop_flag.set()
        wake = self._wake
        if wake is not None:
            import asyncio

            try:
                asyncio.get_running_loop()
            except RuntimeError:
                return  # not on a loop's thread: the sleep notices the flag when it ends
            wake.set()

    async def aclose(self) -> None:
        self.stop()

    def __aiter__(self) -> AsyncReplay:
        return self

    async def __anext__(self) -> ActivityEvent:
        import asyncio

        state = self._state
        while True:
            if state.stopped():
                raise StopAsyncIteration
            if state.buffer:
                return state.take()
            if state.done:
                raise StopAsyncIteration
            if state.started and not state.more:
                await self._sleep(state.poll_interval)
                if state.stopped():
                    raise StopAsyncIteration
            await asyncio.to_thread(state.read)

    async def _sleep(self, seconds: float) -> None:
        import asyncio

        if self._wake is None:
            self._wake = asyncio.Event()
        try:
            await asyncio.wait_for(self._wake.wait(), seconds)
        except asyncio.TimeoutError:
            pass

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


# -- many sessions: loopscope tail --follow ---------------------------------------------------


class Follower:
    """Cursors over one session or every session of a store; each :meth:`poll` reads, in
    one short connection, the events past the cursors of the sessions that moved."""

    def __init__(self, store: Store, session_id: str | None = None, *, event_filter: EventFilter | None = None) -> None:
        self.store = store
        self.session_id = session_id
        self.event_filter = event_filter
        self.cursors: dict[str, int] = {}

    def _marks(self, con: duckdb.DuckDBPyConnection) -> dict[str, SessionMark]:
        if self.session_id is None:
            return _marks(con)
        mark = session_mark(con, self.session_id)
        return {self.session_id: mark} if mark is not None else {}

    def start(self, newest: int = 0) -> list[ActivityEvent]:
        """Put the cursors at the end of the log and return the ``newest`` events before
        them (of the session, or of all sessions by time), read from the same state of the
        file: the first :meth:`poll` goes on right after them."""
        with _reading(self.store) as con:
            marks = self._marks(con)
            self.cursors = {name: mark.last_index for name, mark in marks.items()}
            if self.session_id is not None:
                self.cursors.setdefault(self.session_id, 0)
            if newest <= 0:
                return []
            clauses, params = (self.event_filter or RECEIVED).where()
            if self.session_id is not None:
                mark = marks.get(self.session_id)
                if mark is None:
                    return []
                span_clauses, span_params = _span(mark)
                where = " AND ".join(["session_id = ?", "idx <= ?", *clauses, *span_clauses])
                rows = con.execute(
                    f"SELECT {_columns()} FROM events WHERE {where} ORDER BY idx DESC LIMIT {int(newest)}",
                    [self.session_id, mark.last_index, *params, *span_params],
                ).fetchall()
            else:
                where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
                rows = con.execute(
                    f"SELECT {_columns()} FROM events {where} ORDER BY created_at DESC, session_id DESC, idx DESC LIMIT {int(newest)}",
                    params,
                ).fetchall()
            rows = values.fill(con, rows, ID_AT, CONTENT_AT)
        if self.session_id is None:  # (events made once the file is let go)
            return interleave(_events(rows))
        rows.reverse()
        return _events(rows)

    def poll(self) -> list[ActivityEvent]:
        """The events past each cursor (a session first seen now: all of its events), in
        the order of :func:`interleave`; moves the cursors on."""
        found: list[tuple[Any, ...]] = []
        with _reading(self.store) as con:  # the rows only: they become events once the file is let go
            for name, mark in self._marks(con).items():
                cursor = self.cursors.get(name, 0)
                if mark.last_index <= cursor:
                    continue
                page = read_after(con, name, cursor, columns=_columns(), event_filter=self.event_filter, mark=mark)
                found.extend(page.rows)
                self.cursors[name] = page.cursor
        return interleave(_events(found))


def interleave(events: list[ActivityEvent]) -> list[ActivityEvent]:
    """Events of several sessions in one list: each session's in index order, the sessions
    merged by time (of each one's next event).

    Not sorted by time alone: processes that write one session number a batch's rows when
    they write it, so a row made earlier in one process can have a higher index than a row
    another made later; the log's order is the index, and a reader must never see a
    session's indices go back.
    """
    by_session: dict[str, list[ActivityEvent]] = {}
    for event in events:
        by_session.setdefault(event.session_id, []).append(event)
    if len(by_session) <= 1:
        return sorted(events, key=_index)
    queues = [deque(sorted(group, key=_index)) for group in by_session.values()]
    heads = [(q[0].created_at, q[0].session_id, n) for n, q in enumerate(queues)]
    heapq.heapify(heads)
    merged: list[ActivityEvent] = []
    while heads:
        _, _, n = heapq.heappop(heads)
        queue = queues[n]
        merged.append(queue.popleft())
        if queue:
            heapq.heappush(heads, (queue[0].created_at, queue[0].session_id, n))
    return merged


def _index(event: ActivityEvent) -> int:
    return event.index

