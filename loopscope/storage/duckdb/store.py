"""Reading a store: the timeline, the conversation, counts, turns and sessions.

The semantics follow RoomKit's ConversationStore. A page is always ascending by index;
``newest_first`` and ``before_index`` only choose which window the page holds. Each
read opens the file for that read alone, so a reader in another process works while an
agent keeps writing.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from ...models import ActivityEvent, AIResponseEvent, ModelCall, SessionInfo
from ..errors import SQLRefusedError
from ..policy import RECEIVED, EventFilter, TurnFilter
from ..recording import configured_path, default_db_path, flush_own
from . import values
from .connection import open_store, resolve
from .engine import duckdb
from .events import CONTENT_AT as _CONTENT_AT
from .events import EVENT_COLUMNS as _EVENT_COLUMNS
from .events import call_of as _call
from .events import event_of as _event
from .events import turn_of as _turn
from .reads import call_rows, turn_rows, view_rows
from .replay import DEFAULT_PAGE, AsyncReplay, Replay, StopFlag
from .schema import SCHEMA_VERSION, check_readable, missing_views, remember_version, remembered_version

# The schema version and the session's span in one statement: two small scans side by
# side, not a join (planning and running the join cost ~0.4 ms more on a freshly attached
# file, a tenth of a timeline page's query)
_SPAN_SQL = """
    SELECT value, NULL, NULL FROM main.loopscope_meta WHERE key = 'schema_version'
    UNION ALL
    SELECT NULL, first_at, last_at FROM main.sessions WHERE session_id = ?
"""
# the session's span alone, for a file whose schema was checked as it is now
# (schema.remembered_version): reading loopscope_meta is a second table loaded on a freshly
# attached file (~0.4 ms of a page)
_SPAN_ONLY_SQL = _SPAN_SQL.split("UNION ALL", 1)[1]


class Store:
    """Read access to a loopscope DuckDB file.

    ``Store()`` reads the file the current configuration writes (``LOOPSCOPE_DB`` or
    ``./loopscope.duckdb`` by default). Events this process recorded are flushed before
    a read, so a read always sees them.

    ``keep_open=True`` is for a process that reads often and never writes the file
    itself (a dashboard): the file stays attached read-only between its reads, for 50 ms
    idle and 0.5 s at most, which makes a timeline page about twice as cheap. A loopscope
    writer that finds the file held (in any process) is let in at once; anything else
    that wants to write the file waits out those 50 ms, and in this process
    ``duckdb.connect(path)`` fails meanwhile. By default each read lets go of the file
    when it ends.
    """

    def __init__(self, path: str | None = None, *, lock_timeout: float = 10.0, keep_open: bool = False) -> None:
        self.path = resolve(path or configured_path() or default_db_path())
        self.lock_timeout = lock_timeout
        self.keep_open = keep_open

    def _flush_own(self) -> None:
        flush_own(self.path)

    def _query(self, sql: str, params: Sequence[Any] = (), *, events: bool = False) -> list[tuple[Any, ...]]:
        """``sql``'s rows; with ``events``, rows of :data:`_EVENT_COLUMNS` given their large
        values whole (:func:`values.fill`)."""
        self._flush_own()
        with open_store(self.path, read_only=True, timeout=self.lock_timeout, keep=self.keep_open) as con:
            check_readable(con)
            found = con.execute(sql, list(params)).fetchall()
            return values.fill(con, found, 0, _CONTENT_AT) if events else found

    # -- events --------------------------------------------------------------------------

    def list_events(
        self,
        session_id: str,
        offset: int = 0,
        limit: int | None = 50,
        *,
        after_index: int | None = None,
        before_index: int | None = None,
        event_filter: EventFilter | None = None,
        newest_first: bool = False,
    ) -> list[ActivityEvent]:
        """One page of a session's events, always ascending by index.

        ``newest_first`` takes the window from the newest end (``offset`` then counts
        back from it); ``before_index`` takes the ``limit`` events just before that
        index; ``after_index`` the ``limit`` events just after it. A cursor ignores
        ``offset`` and ``newest_first``; both cursors at once raise ``ValueError``.
        Blocked rows are skipped before the page is cut, unless the filter includes them.
        """
        if after_index is not None and before_index is not None:
            raise ValueError("after_index and before_index cannot be used together")
        if offset < 0 or (limit is not None and limit < 0):
            raise ValueError("offset and limit must not be negative")
        clauses, params = (event_filter or RECEIVED).where()
        clauses.insert(0, "session_id = ?")
        params.insert(0, session_id)
        descending = False
        if after_index is not None:
            clauses.append("idx > ?")
            params.append(after_index)
            offset = 0
        elif before_index is not None:
            clauses.append("idx < ?")
            params.append(before_index)
            offset, descending = 0, True
        elif newest_first:
            descending = True
        sql = f"SELECT {_EVENT_COLUMNS} FROM events WHERE {' AND '.join(clauses)}{{span}} ORDER BY idx {'DESC' if descending else 'ASC'}"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        if offset:
            sql += f" OFFSET {int(offset)}"
        rows = self._session_query(session_id, sql, params)
        if descending:
            rows.reverse()
        return [_event(r) for r in rows]

    def _session_query(self, session_id: str, sql: str, params: list[Any]) -> list[tuple[Any, ...]]:
        """Run an events query of one session with the session's time span added where
        ``sql`` says ``{span}`` (at the end of its WHERE clause, after every parameter), so
        that DuckDB skips the row groups outside it.

        The ``sessions`` row holds the first and last ``created_at`` of the session's events
        (the writer keeps them in the same transaction as the rows), so the bound drops
        nothing. Rows are appended in about the order of their times, so a session that
        lasted an hour is read from the one or two row groups of that hour instead of
        comparing every session id in the file.
        """
        self._flush_own()
        with open_store(self.path, read_only=True, timeout=self.lock_timeout, keep=self.keep_open, page=True) as con:
            known = remembered_version(con)
            checked = known is not None and 0 < known <= SCHEMA_VERSION
            # else the schema check and the session's span in one statement (a page is a few ms)
            try:
                rows = con.execute(_SPAN_ONLY_SQL if checked else _SPAN_SQL, [session_id]).fetchall()
            except duckdb.CatalogException:
                rows = []
            if not checked:
                version = next((r[0] for r in rows if r[0] is not None), None)
                if version is None or not str(version).isdigit() or not 0 < int(version) <= SCHEMA_VERSION:
                    check_readable(con)  # raises what is wrong with the file
                else:
                    remember_version(con, int(version))
            span = next((r[1:] for r in rows if r[0] is None), None)
            if span is not None and span[0] is not None and span[1] is not None:
                sql = sql.replace("{span}", " AND created_at BETWEEN ? AND ?")
                params = [*params, span[0], span[1]]
            else:
                sql = sql.replace("{span}", "")
            found = con.execute(sql, params).fetchall()
            # a page of events (a count's one row has no id to look up)
            return values.fill(con, found, 0, _CONTENT_AT) if found and len(found[0]) > _CONTENT_AT else found

    def get_timeline(
        self,
        session_id: str,
        offset: int = 0,
        limit: int | None = None,
        *,
        after_index: int | None = None,
        before_index: int | None = None,
        event_filter: EventFilter | None = None,
        newest_first: bool = False,
    ) -> list[ActivityEvent]:
        """Everything the session received, in order; the same paging rules as :meth:`list_events`."""
        return self.list_events(
            session_id, offset, limit, after_index=after_index, before_index=before_index,
            event_filter=event_filter, newest_first=newest_first,
        )

    def get_conversation(self, session_id: str, limit: int = 50, after_index: int | None = None) -> list[ActivityEvent]:
        """Message events only, blocked ones included: the most recent ``limit`` in
        ascending order, or with ``after_index`` the first ``limit`` after it."""
        only_messages = EventFilter(event_types=["message"], include_blocked=True)
        if after_index is not None:
            return self.list_events(session_id, limit=limit, after_index=after_index, event_filter=only_messages)
        return self.list_events(session_id, limit=limit, newest_first=True, event_filter=only_messages)

    def get_event(self, event_id: str) -> ActivityEvent | None:
        """One event by id, whatever its status."""
        rows = self._query(f"SELECT {_EVENT_COLUMNS} FROM events WHERE id = ?", [event_id], events=True)
        return _event(rows[0]) if rows else None

    def get_event_count(self, session_id: str, event_filter: EventFilter | None = None) -> int:
        """Without a filter every committed row (blocked included); with one, exactly
        the rows :meth:`list_events` would serve under it, uncapped."""
        if event_filter is None:
            clauses, params = ["session_id = ?"], [session_id]
        else:
            clauses, params = event_filter.where()
            clauses.insert(0, "session_id = ?")
            params.insert(0, session_id)
        rows = self._session_query(session_id, f"SELECT count(*) FROM events WHERE {' AND '.join(clauses)}{{span}}", params)
        return int(rows[0][0])

    def list_recent_events(self, limit: int = 10, *, event_filter: EventFilter | None = None) -> list[ActivityEvent]:
        """The newest ``limit`` events of all sessions together, oldest first (by time,
        then session and index)."""
        if limit < 0:
            raise ValueError("limit must not be negative")
        clauses, params = (event_filter or RECEIVED).where()
        where = f"WHERE {' AND '.join(clauses)}" if clauses else ""
        rows = self._query(
            f"SELECT {_EVENT_COLUMNS} FROM events {where} ORDER BY created_at DESC, session_id DESC, idx DESC LIMIT {int(limit)}",
            params,
            events=True,
        )
        rows.reverse()
        return [_event(r) for r in rows]

    def last_indices(self) -> dict[str, int]:
        """Each session's highest event index so far: where a reader that wants only newer
        events (``after_index``) takes up."""
        return dict(self._query("SELECT session_id, last_index FROM sessions"))

    # -- replay and state ----------------------------------------------------------------

    def replay(
        self,
        session_id: str,
        after_index: int | None = None,
        *,
        until_turn_end: bool = False,
        poll_interval: float = 0.25,
        event_filter: EventFilter | None = None,
        stop: StopFlag | None = None,
        page: int = DEFAULT_PAGE,
    ) -> Replay:
        """The session's events in index order (those after ``after_index``, else all):
        first the stored ones, then each new one as it lands, none missed and none twice.

        The live part is read every ``poll_interval`` seconds, from any process, holding
        the file only for each read; events another process records arrive within its
        writer's ``flush_interval``. The iterator ends when it is stopped (``stop()``,
        ``close()``, leaving its ``with`` block, or the ``stop`` flag, e.g. a
        ``threading.Event``, being set) or, with ``until_turn_end``, once the summaries of
        the turns in flight when it started have landed (at once, after the stored
        events, when none is in flight). A turn whose process was killed never ends: stop
        such a replay yourself. Blocked rows are left out unless ``event_filter`` asks
        for them; :attr:`Replay.position` is where to take up again.
        """
        from .replay import Replay, _ReplayState

        return Replay(_ReplayState(
            self, session_id, after_index, until_turn_end=until_turn_end, poll_interval=poll_interval,
            event_filter=event_filter, stop=stop, page=page,
        ))

    def derive_state(self, session_id: str, *, at_index: int | None = None) -> Any | None:
        """The session's state as its log says: the last ``state_snapshot``'s object with
        the ``state_delta`` patches after it applied (as of event ``at_index``, default
        the end); None when the session has neither."""
        from .state import derive_state

        self._flush_own()
        with open_store(self.path, read_only=True, timeout=self.lock_timeout) as con:
            check_readable(con)
            return derive_state(con, session_id, at_index)

    # -- turns and sessions --------------------------------------------------------------

    def list_turns(
        self,
        session_id: str | None = None,
        limit: int | None = 50,
        *,
        correlation_id: str | None = None,
        channel_id: str | None = None,
        loop_end_reason: str | None = None,
        after_time: datetime | None = None,
        newest_first: bool = False,
        turn_filter: TurnFilter | None = None,
    ) -> list[AIResponseEvent]:
        """Turn summaries, oldest first (``newest_first`` picks the most recent ``limit``);
        ``turn_filter`` narrows them (agent, end reason, model, since, cost, content)."""
        self._flush_own()
        with open_store(self.path, read_only=True, timeout=self.lock_timeout, keep=self.keep_open) as con:
            rows = turn_rows(
                con, session_id, limit, correlation_id=correlation_id, channel_id=channel_id,
                loop_end_reason=loop_end_reason, after_time=after_time, newest_first=newest_first,
                turn_filter=turn_filter,
            )
        return [_turn(r) for r in rows]

    def list_sessions(self, limit: int | None = None, *, search: str | None = None) -> list[SessionInfo]:
        """Sessions, most recently active first. ``search`` keeps the sessions whose id,
        or the name of one of their agents or models, contains it (any case), and those
        whose content holds it (a message, a tool's name, arguments, result or error, a
        model call's output or error: the content search, storage/duckdb/search.py)."""
        matched, where, params = "", "", []
        if search:
            from .search import matches_sql, needle_of

            needle = needle_of(search)
            with open_store(self.path, read_only=True, timeout=self.lock_timeout, keep=self.keep_open) as con:
                content, match_params = matches_sql(con, needle)
            matched = ", bool_or(contains(lower(channel_id), ?) OR contains(lower(model), ?)) AS matched"
            where = (
                "WHERE contains(lower(s.session_id), ?) OR coalesce(t.matched, false) "
                f"OR s.session_id IN (SELECT session_id FROM ({content}))"
            )
            params = [needle, needle, needle, *match_params]
        sql = f"""
            SELECT s.session_id, s.last_index, coalesce(t.turns, 0), s.first_at, s.last_at, coalesce(t.agents, [])
            FROM sessions s
            LEFT JOIN (
                SELECT session_id, count(*) AS turns, list_sort(list_distinct(list(channel_id))) AS agents{matched}
                FROM turns GROUP BY session_id
            ) t USING (session_id)
            {where}
            ORDER BY s.last_at DESC, s.session_id"""
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [
            SessionInfo(session_id=r[0], event_count=r[1], turn_count=r[2], first_at=r[3], last_at=r[4], agents=[x for x in r[5] if x])
            for r in self._query(sql, params)
        ]

    def _view_query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """A query of the views: on a file of this schema as :meth:`_query` runs it; on an
        older one (read, not migrated) in a database of its own given this loopscope's
        views first (:func:`~loopscope.storage.duckdb.schema.missing_views`)."""
        self._flush_own()
        return view_rows(self.path, sql, params, timeout=self.lock_timeout, keep=self.keep_open)

    def model_calls(
        self,
        session_id: str | None = None,
        correlation_id: str | None = None,
        *,
        model: str | None = None,
        provider: str | None = None,
        failed: bool = False,
        slowest: bool = False,
        limit: int | None = 50,
        with_messages: bool = False,
        since: datetime | None = None,
        search: str | None = None,
    ) -> list[ModelCall]:
        """Model calls (one per ``chat`` span), oldest first: the most recent ``limit``.

        Filters: the session, the turn (``correlation_id``), the model (the request's or
        the response's), the provider, and ``failed`` (calls that ended in an error).
        ``slowest`` orders by duration instead, longest first (the ``limit`` longest).
        ``with_messages`` reads each call's input and output messages too (content).
        ``since``: calls started at or after it; ``search``: calls whose messages or
        error hold the text (any case). A file from before model calls were stored has none.
        """
        self._flush_own()
        rows = call_rows(
            self.path, session_id, correlation_id, model=model, provider=provider, failed=failed, slowest=slowest,
            limit=limit, since=since, text=search, with_messages=with_messages, timeout=self.lock_timeout, keep=self.keep_open,
        )
        return [_call(r) for r in rows]

    def sql(self, query: str, params: Sequence[Any] = ()) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run read-only SQL on the store: column names and rows.

        The SQL reads the store and nothing else. It runs on a read-only DuckDB of its
        own whose settings DuckDB locks: reading or writing any other file (``COPY ...
        TO``, ``EXPORT DATABASE``, ``read_csv``, ``read_text``, ``glob``, ``ATTACH``) or
        installing or loading an extension raises :class:`SQLRefusedError`; writing the
        store, or ``SET`` / ``RESET``, raises DuckDB's own error. Nothing is changed
        either way. The query must fit in memory (it writes no temporary files).

        The views (``tool_calls``, ``tool_stats``, ...) work on files from older
        loopscope versions too: the connection defines the ones such a file lacks.
        """
        self._flush_own()
        with open_store(self.path, read_only=True, timeout=self.lock_timeout, isolated=True) as con:
            for statement in missing_views(con):
                con.execute(statement)
            try:
                cursor = con.execute(query, list(params))
            except duckdb.PermissionException as exc:
                said = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
                raise SQLRefusedError(
                    f"refused: SQL on the loopscope store reads {self.path} and nothing else (no other "
                    f"file, no COPY TO, EXPORT, ATTACH, INSTALL or LOAD); DuckDB said: {said}"
                ) from exc
            names = [d[0] for d in cursor.description] if cursor.description else []
            return names, cursor.fetchall()


async def _to_thread(function: Any, /, *args: Any, **kwargs: Any) -> Any:
    import asyncio  # here, not at the top: a command that reads the store does not need it (~20 ms)

    return await asyncio.to_thread(function, *args, **kwargs)


class AsyncStore:
    """The same reads as :class:`Store`, for async code: each runs in a worker thread
    so the event loop never waits on the file."""

    def __init__(self, path: str | None = None, *, lock_timeout: float = 10.0, keep_open: bool = False) -> None:
        self.sync = Store(path, lock_timeout=lock_timeout, keep_open=keep_open)
        self.path = self.sync.path

    async def list_events(self, session_id: str, offset: int = 0, limit: int | None = 50, **kwargs: Any) -> list[ActivityEvent]:
        return await _to_thread(self.sync.list_events, session_id, offset, limit, **kwargs)

    async def get_timeline(self, session_id: str, offset: int = 0, limit: int | None = None, **kwargs: Any) -> list[ActivityEvent]:
        return await _to_thread(self.sync.get_timeline, session_id, offset, limit, **kwargs)

    async def get_conversation(self, session_id: str, limit: int = 50, after_index: int | None = None) -> list[ActivityEvent]:
        return await _to_thread(self.sync.get_conversation, session_id, limit, after_index)

    async def get_event(self, event_id: str) -> ActivityEvent | None:
        return await _to_thread(self.sync.get_event, event_id)

    async def get_event_count(self, session_id: str, event_filter: EventFilter | None = None) -> int:
        return await _to_thread(self.sync.get_event_count, session_id, event_filter)

    async def list_recent_events(self, limit: int = 10, **kwargs: Any) -> list[ActivityEvent]:
        return await _to_thread(self.sync.list_recent_events, limit, **kwargs)

    async def last_indices(self) -> dict[str, int]:
        return await _to_thread(self.sync.last_indices)

    def replay(
        self,
        session_id: str,
        after_index: int | None = None,
        *,
        until_turn_end: bool = False,
        poll_interval: float = 0.25,
        event_filter: EventFilter | None = None,
        stop: StopFlag | None = None,
        page: int = DEFAULT_PAGE,
    ) -> AsyncReplay:
        """:meth:`Store.replay` as an async iterator (``async for event in store.replay(...)``):
        reads run in a worker thread, waits are asyncio sleeps."""
        from .replay import _ReplayState

        return AsyncReplay(_ReplayState(
            self.sync, session_id, after_index, until_turn_end=until_turn_end, poll_interval=poll_interval,
            event_filter=event_filter, stop=stop, page=page,
        ))

    async def derive_state(self, session_id: str, *, at_index: int | None = None) -> Any | None:
        return await _to_thread(self.sync.derive_state, session_id, at_index=at_index)

    async def list_turns(self, session_id: str | None = None, limit: int | None = 50, **kwargs: Any) -> list[AIResponseEvent]:
        return await _to_thread(self.sync.list_turns, session_id, limit, **kwargs)

    async def list_sessions(self, limit: int | None = None, *, search: str | None = None) -> list[SessionInfo]:
        return await _to_thread(self.sync.list_sessions, limit, search=search)

    async def model_calls(self, session_id: str | None = None, correlation_id: str | None = None, **kwargs: Any) -> list[ModelCall]:
        return await _to_thread(self.sync.model_calls, session_id, correlation_id, **kwargs)

    async def sql(self, query: str, params: Sequence[Any] = ()) -> tuple[list[str], list[tuple[Any, ...]]]:
        return await _to_thread(self.sync.sql, query, params)
