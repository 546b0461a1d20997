"""The query API (:class:`~loopscope.storage.queries.Reader`) on a DuckDB file: the reads
the terminal commands made before the seam, by the same SQL, now behind named queries.

The public models (pydantic) are made only by the queries that answer with them
(:meth:`DuckDBReader.timeline`, :meth:`~DuckDBReader.turns`, ...), through
:class:`~loopscope.storage.duckdb.store.Store`, imported then; the plain-row queries
(:meth:`~DuckDBReader.turn_rows`, :meth:`~DuckDBReader.calls`, the analytics) import
neither pydantic nor the models (``loopscope turns`` starts in a third of the time)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..errors import StoreError, StoreLockedError
from ..policy import EventFilter, TurnFilter
from ..recording import flush_own, resolve
from ..results import (
    CallRow,
    Record,
    ScoreTarget,
    SearchHit,
    SessionLookup,
    Stats,
    StoreStatus,
    ToolCallRow,
    TrajectoryLookup,
    TurnRow,
)
from . import reads
from .connection import open_store
from .schema import check_readable

if TYPE_CHECKING:
    from ...models import ActivityEvent, AIResponseEvent, ModelCall, SessionInfo
    from ..queries import ExportProgress, Follow
    from .store import Store

# what each turn cost in USD (its model calls' sum, else its own price)
_TURN_COSTS = "SELECT session_id, turn_id, cost_usd FROM turn_summaries WHERE list_contains(?, turn_id)"
_SESSION_COSTS = "SELECT session_id, cost_usd FROM session_costs WHERE list_contains(?, session_id)"

_OVERVIEW = """
SELECT
    (SELECT count(*) FROM sessions) AS sessions,
    (SELECT count(*) FROM turns) AS turns,
    (SELECT count(*) FROM events) AS events,
    (SELECT count(DISTINCT channel_id) FROM turns) AS agents,
    (SELECT min(first_at) FROM sessions) AS first_at,
    (SELECT max(last_at) FROM sessions) AS last_at
"""

_TOOL_TOTALS = """
SELECT
    coalesce(sum(calls), 0) AS calls,
    coalesce(sum(pending), 0) AS pending,
    coalesce(sum(finished), 0) AS finished,
    {outcomes},
    (sum(finished) - sum(served)) / nullif(sum(finished), 0) AS failure_share,
    count(*) AS tools
FROM tool_stats
"""

_REASONS = """
SELECT loop_end_reason, count(*) AS turns, count(*) / sum(count(*)) OVER () AS share, avg(latency_ms) AS avg_latency_ms
FROM turns
GROUP BY loop_end_reason
ORDER BY turns DESC, loop_end_reason
"""

_TOKENS = """
SELECT
    sum(input_tokens) AS input_tokens,
    sum(output_tokens) AS output_tokens,
    sum(cache_read_input_tokens) AS cache_read_input_tokens,
    sum(cache_creation_input_tokens) AS cache_creation_input_tokens,
    sum(reasoning_tokens) AS reasoning_tokens,
    sum(total_tokens) AS total_tokens
FROM turn_summaries
"""

_MODELS = """
SELECT model, provider, count(*) AS turns, sum(total_tokens) AS total_tokens, avg(latency_ms) AS avg_latency_ms
FROM turn_summaries
GROUP BY ALL
ORDER BY turns DESC, model NULLS LAST
"""

_COSTS = "SELECT model_calls, cost_usd, unpriced_calls FROM cost_totals"

_MODEL_CALLS = """
SELECT model, provider, calls, failed, cost_usd, unpriced_calls, avg_ms, p95_ms, avg_ttfc_ms
FROM model_usage
ORDER BY cost_usd DESC NULLS LAST, calls DESC, model NULLS LAST
"""

_ORDER = {
    "calls": "calls DESC, tool",
    "failures": "failure_share DESC NULLS LAST, calls DESC, tool",
    "p95": "p95_ms DESC NULLS LAST, tool",
    "name": "tool",
}

# the tools that turns offered as server tools (the provider runs them: a declared tool with
# a type), by agent as declared_vs_used names it (the text prefilter spares parsing the
# declared tools of every turn that has none)
_SERVER_TOOLS = """
SELECT DISTINCT agent, json_extract_string(d, '$.name') AS tool
FROM (
    SELECT channel_id AS agent, unnest(CAST(declared_tools AS JSON[])) AS d
    FROM turns
    WHERE contains(CAST(declared_tools AS VARCHAR), '"type"')
)
WHERE json_extract_string(d, '$.type') IS NOT NULL
"""


class DuckDBReader:
    """The named queries on the DuckDB file ``db`` (a path; ``~`` expanded, links resolved
    for the reads, as given for :meth:`status`). Each query opens the file read-only for
    its own reads and lets go (the views' queries keep the shared attachment between them,
    as ``stats`` runs several)."""

    engine = "duckdb"

    def __init__(self, db: str, *, lock_timeout: float = 10.0, keep_open: bool = False) -> None:
        self.given = os.path.expanduser(db)
        self.path = resolve(self.given)
        self.lock_timeout = lock_timeout
        self.keep_open = keep_open
        self._store: Store | None = None

    def _flush_own(self) -> None:
        flush_own(self.path)  # what this process recorded is read too

    @property
    def store(self) -> Store:
        """The public models' reads of this file (pydantic imported with it)."""
        if self._store is None:
            from .store import Store

            self._store = Store(self.path, lock_timeout=self.lock_timeout, keep_open=self.keep_open)
        return self._store

    def _views(self, query: str, params: Sequence[Any] = ()) -> list[Record]:
        flush_own(self.path)  # what this process recorded is read too
        names, rows = reads.view_query(self.path, query, params, timeout=self.lock_timeout, keep=True)
        return [dict(zip(names, row)) for row in rows]

    # -- sessions ------------------------------------------------------------------------

    def session(self, requested: str | None) -> SessionLookup:
        flush_own(self.path)  # what this process recorded (a test, a notebook) is read too
        with open_store(self.path, read_only=True, timeout=self.lock_timeout, keep=True) as con:
            found = reads.session_of(con, requested)
        return SessionLookup(found) if isinstance(found, str) else SessionLookup(None, tuple(found))

    def sessions(self, limit: int | None = None, *, search: str | None = None) -> list[SessionInfo]:
        return self.store.list_sessions(limit=limit, search=search)

    def session_costs(self, session_ids: Sequence[str]) -> dict[str, float | None]:
        if not session_ids:
            return {}
        return dict(reads.view_rows(self.path, _SESSION_COSTS, [list(session_ids)], timeout=self.lock_timeout))

    # -- the timeline ----------------------------------------------------------------------

    def timeline(
        self, session_id: str, limit: int | None = None, *, after_index: int | None = None,
        before_index: int | None = None, event_filter: EventFilter | None = None, newest_first: bool = False,
    ) -> list[ActivityEvent]:
        return self.store.list_events(
            session_id, limit=limit, after_index=after_index, before_index=before_index,
            event_filter=event_filter, newest_first=newest_first,
        )

    def event_count(self, session_id: str, event_filter: EventFilter | None = None) -> int:
        return self.store.get_event_count(session_id, event_filter)

    def recent_events(self, limit: int = 10, *, event_filter: EventFilter | None = None) -> list[ActivityEvent]:
        return self.store.list_recent_events(limit, event_filter=event_filter)

    def follow(self, session_id: str | None, *, event_filter: EventFilter | None = None) -> Follow:
        from .replay import Follower

        return Follower(self.store, session_id, event_filter=event_filter)

    def ready(self) -> bool:
        if not os.path.exists(self.path):
            return False
        try:
            self.store.last_indices()
        except StoreLockedError:
            return False
        except StoreError as exc:
            if "holds no loopscope data yet" in str(exc):
                return False
            raise
        return True

    # -- turns and model calls --------------------------------------------------------------

    def turns(
        self, session_id: str | None = None, limit: int | None = 50, *, newest_first: bool = False,
        turn_filter: TurnFilter | None = None,
    ) -> list[AIResponseEvent]:
        return self.store.list_turns(session_id, limit=limit, newest_first=newest_first, turn_filter=turn_filter)

    def turn_rows(
        self, session_id: str | None = None, limit: int | None = 50, *, newest_first: bool = False,
        turn_filter: TurnFilter | None = None,
    ) -> list[TurnRow]:
        flush_own(self.path)
        with open_store(self.path, read_only=True, timeout=self.lock_timeout, keep=True) as con:
            rows = reads.turn_rows(
                con, session_id, limit, newest_first=newest_first, utc_naive=True, turn_filter=turn_filter
            )
        return [reads.turn_row(r) for r in rows]

    def turn_costs(self, turn_ids: Sequence[str | None]) -> dict[tuple[str | None, str | None], float | None]:
        ids = sorted({t for t in turn_ids if t})
        if not ids:
            return {}
        return {(r[0], r[1]): r[2] for r in reads.view_rows(self.path, _TURN_COSTS, [ids], timeout=self.lock_timeout)}

    def calls(
        self, session_id: str | None = None, *, model: str | None = None, provider: str | None = None,
        failed: bool = False, slowest: bool = False, limit: int | None = 50,
        since: datetime | None = None, search: str | None = None,
    ) -> list[CallRow]:
        flush_own(self.path)
        return [reads.call_row(r) for r in reads.call_rows(
            self.path, session_id, model=model, provider=provider, failed=failed, slowest=slowest, limit=limit,
            since=since, text=search, timeout=self.lock_timeout, keep=True, utc_naive=True,
        )]

    def model_calls(
        self, session_id: str | None = None, *, model: str | None = None, provider: str | None = None,
        failed: bool = False, slowest: bool = False, limit: int | None = 50,
        since: datetime | None = None, search: str | None = None,
    ) -> list[ModelCall]:
        return self.store.model_calls(
            session_id, model=model, provider=provider, failed=failed, slowest=slowest, limit=limit,
            since=since, search=search,
        )

    # -- trajectories (loopscope diff: storage/duckdb/trajectory.py) -------------------------

    def trajectory(self, ref: str) -> TrajectoryLookup:
        from . import trajectory

        flush_own(self.path)
        with open_store(self.path, read_only=True, timeout=self.lock_timeout, keep=True) as con:
            return trajectory.lookup(con, ref)

    # -- search and tool calls (storage/duckdb/search.py) -----------------------------------

    def search(self, text: str, *, session_id: str | None = None, limit: int = 50) -> list[SearchHit]:
        from . import search

        search.needle_of(text)  # an empty text: a clear error before the store is opened
        flush_own(self.path)
        with open_store(self.path, read_only=True, timeout=self.lock_timeout, keep=True) as con:
            reads.check_readable(con)
            return search.hits(con, text, session_id, limit)

    def tool_calls(
        self, session_id: str | None = None, *, tool: str | None = None, failed: bool = False,
        slowest: bool = False, since: datetime | None = None, search: str | None = None, limit: int | None = 50,
    ) -> list[ToolCallRow]:
        from .schema import has_tool_columns
        from .search import ended_calls_sql, tool_call_row, tool_call_sql

        flush_own(self.path)
        if (failed or slowest) and not search and limit is not None:
            # the ended calls a failed or slowest list shows, picked from the end rows alone;
            # then the view reads just those sessions (it groups every tool row otherwise)
            with open_store(self.path, read_only=True, timeout=self.lock_timeout, keep=True) as con:
                reads.check_readable(con)
                sql, params = ended_calls_sql(
                    has_tool_columns(con), tool=tool, failed=failed, slowest=slowest, session_id=session_id,
                    since=since, limit=limit,
                )
                keys = con.execute(sql, params).fetchall()
            if not keys:
                return []
            sql, params = tool_call_sql(
                session_id, tool=tool, failed=failed, slowest=slowest, since=since, limit=None,
                sessions=sorted({k[0] for k in keys}),
            )
            rows = {
                (r.session_id, r.turn_id, r.call_id): r
                for r in map(tool_call_row, reads.view_rows(self.path, sql, params, timeout=self.lock_timeout, keep=True))
            }
            return [rows[key] for key in keys if key in rows]
        sql, params = tool_call_sql(
            session_id, tool=tool, failed=failed, slowest=slowest, since=since, text=search, limit=limit,
        )
        return [tool_call_row(r) for r in reads.view_rows(self.path, sql, params, timeout=self.lock_timeout, keep=True)]

    # -- analytics ------------------------------------------------------------------------

    def stats(self) -> Stats:
        from .views import OUTCOMES

        data = self._views(_OVERVIEW)[0]
        outcomes = ", ".join(f"coalesce(sum({o}), 0) AS {o}" for o in OUTCOMES)
        return Stats(
            sessions=data["sessions"], turns=data["turns"], events=data["events"], agents=data["agents"],
            first_at=data["first_at"], last_at=data["last_at"],
            costs=self._views(_COSTS)[0],
            model_calls=self._views(_MODEL_CALLS),
            tool_calls=self._views(_TOOL_TOTALS.format(outcomes=outcomes))[0],
            loop_end_reasons=self._views(_REASONS),
            tokens=self._views(_TOKENS)[0],
            models=self._views(_MODELS),
        )

    def tools(self, order: str = "calls", limit: int | None = None) -> list[Record]:
        sql = f"SELECT * FROM tool_stats ORDER BY {_ORDER[order]}"
        if limit:
            sql += f" LIMIT {int(limit)}"
        return self._views(sql)

    def declared_tools(self, agent: str | None = None, limit: int | None = None) -> list[Record]:
        sql, params = "SELECT * FROM declared_vs_used", []
        if agent:
            sql += " WHERE agent = ?"
            params.append(agent)
        if limit:
            sql += f" LIMIT {int(limit)}"
        records = self._views(sql, params)
        server = {(r["agent"], r["tool"]) for r in self._views(_SERVER_TOOLS)} if records else set()
        for r in records:  # the KIND the table shows
            r["kind"] = "server" if (r["agent"], r["tool"]) in server else "client"
        return records

    def turn_count(self, agent: str | None = None) -> int:
        where, params = ("WHERE channel_id = ?", [agent]) if agent else ("", [])
        return int(self._views(f"SELECT count(*) AS n FROM turns {where}", params)[0]["n"])

    def status(self) -> StoreStatus:
        from ...semconv import UNSERVED_CUT
        from . import health
        from .schema import check_readable, has_model_calls, schema_version

        path = self.given
        with open_store(path, read_only=True, timeout=self.lock_timeout) as con:
            check_readable(con)
            version = schema_version(con)
            [(sessions, events, turns, tool_calls, last_event)] = con.execute(
                "SELECT (SELECT count(*) FROM sessions), (SELECT count(*) FROM events), (SELECT count(*) FROM turns), "
                "(SELECT count(*) FROM events WHERE type = 'tool_call_start'), (SELECT max(created_at) FROM events)"
            ).fetchall()  # one row: aggregates
            writers = health.writers(con)
            # calls whose stitched turn ended early: more turns waited for results than are kept open
            [(cut,)] = con.execute(
                "SELECT count(*) FROM events WHERE type = 'tool_call_end' AND json_extract_string(content, '$.error') = ?",
                [UNSERVED_CUT],
            ).fetchall()
            model_calls = con.execute("SELECT count(*) FROM model_calls").fetchall()[0][0] if has_model_calls(con) else 0
        beside = health.read_beside(path)
        size = sum(os.path.getsize(p) for p in (path, path + ".wal") if os.path.exists(p))
        return StoreStatus(
            path=path, size_bytes=size, schema_version=version, sessions=sessions, events=events, turns=turns,
            tool_calls=tool_calls, model_calls=model_calls, last_event_at=last_event, writers=writers,
            unserved_cut=cut, beside=beside,
        )

    # -- the web dashboard's pages (storage/duckdb/dashboard.py) -----------------------------

    def page_overview(self, limit: int = 50) -> dict[str, Any]:
        from . import dashboard

        return dashboard.overview(self, limit)

    def page_sessions(self, q: str | None = None, limit: int | None = None, offset: int | None = None) -> dict[str, Any]:
        from . import dashboard

        return dashboard.sessions(self, q, limit, offset)

    def page_timeline(
        self, session_id: str, *, after_index: int | None = None, before_index: int | None = None,
        limit: int | None = None, include_blocked: bool = False, turn_ids: Sequence[str] = (),
    ) -> dict[str, Any]:
        from . import dashboard

        return dashboard.timeline(
            self, session_id, after_index=after_index, before_index=before_index, limit=limit,
            include_blocked=include_blocked, turn_ids=turn_ids,
        )

    def page_event(self, event_id: str) -> dict[str, Any] | None:
        from . import dashboard

        return dashboard.event(self, event_id)

    def page_tools(self, range_: str | None = "all", tool: str | None = None) -> dict[str, Any]:
        from . import dashboard

        return dashboard.tool_analytics(self, range_, tool)

    def page_turns(self, range_: str | None = "all") -> dict[str, Any]:
        from . import dashboard

        return dashboard.turn_analytics(self, range_)

    def page_declared(self, range_: str | None = "all") -> dict[str, Any]:
        from . import dashboard

        return dashboard.declared_vs_used(self, range_)

    # -- scores (storage/duckdb/scores.py) ---------------------------------------------------

    def score_target(self, ref: str) -> ScoreTarget | None:
        from . import scores

        flush_own(self.path)
        with open_store(self.path, read_only=True, timeout=self.lock_timeout, keep=True) as con:
            check_readable(con)
            return scores.score_target(con, ref) if scores.has_scores(con) else None

    def page_session_scores(self, session_id: str, turn_ids: Sequence[str]) -> dict[str, Any]:
        from . import scores

        flush_own(self.path)
        with open_store(self.path, read_only=True, timeout=self.lock_timeout, keep=self.keep_open) as con:
            check_readable(con)
            return scores.session_page(con, session_id, turn_ids)

    def page_scores(self, range_: str | None = "all") -> dict[str, Any]:
        from . import scores

        flush_own(self.path)
        with open_store(self.path, read_only=True, timeout=self.lock_timeout, keep=self.keep_open) as con:
            check_readable(con)
            return scores.page(con, range_)

    def sql(self, query: str, params: Sequence[Any] = ()) -> tuple[list[str], list[tuple[Any, ...]]]:
        return self.store.sql(query, params)

    def export_parquet(
        self, tables: Sequence[str], out: str, *, progress: Callable[[str], ExportProgress] | None = None,
    ) -> dict[str, int]:
        from . import parquet

        return parquet.export(self.given, tables, out, timeout=self.lock_timeout, progress=progress)

    def stored_ids(self, event_ids: Sequence[str]) -> set[str]:
        with open_store(self.path, read_only=True, timeout=self.lock_timeout) as con:
            found = con.execute("SELECT id FROM events WHERE id IN (SELECT unnest(?::VARCHAR[]))", [list(event_ids)]).fetchall()
        return {row[0] for row in found}

    def has_agui_events(self, session_id: str) -> bool:
        from .engine import duckdb

        try:
            _, rows = self.store.sql("SELECT 1 FROM agui_events WHERE session_id = ? LIMIT 1", [session_id])
        except duckdb.CatalogException:  # a store without AG-UI imports
            return False
        return bool(rows)

    def interrupted(self, exc: BaseException) -> bool:
        from .engine import duckdb

        return isinstance(exc, duckdb.InterruptException) or (
            isinstance(exc, RuntimeError) and "interrupted" in str(exc).lower()
        )


def prepare(db: str, *, timeout: float = 10.0) -> str:
    """The DuckDB file ``db`` made or migrated for writing; its resolved path."""
    from .schema import migrate

    path = resolve(db)
    with open_store(path, read_only=False, timeout=timeout) as con:
        migrate(con)
    return path


__all__ = ["DuckDBReader", "prepare"]
