"""The one query API every read of the CLI, the web dashboard and ``collect`` goes through,
engine-neutral: named queries with typed results (:mod:`.results`, or the public models
where a query says so), and :func:`open_reader` / :func:`open_sink`, which pick the engine
by the store's name.

* ``clickhouse://host:port/database`` (or ``clickhouses://``): the ClickHouse engine,
  :mod:`loopscope.storage.clickhouse`, imported when asked for; a loopscope without it
  says so (:class:`EngineMissingError`).
* anything else: a DuckDB file (:mod:`loopscope.storage.duckdb`), imported when a store
  is opened, not with this module (``loopscope --help`` needs neither engine).

A :class:`Reader` answers the named queries; the DuckDB engine's answers them with the SQL
its CLI commands and dashboard ran before there was a seam (``storage/duckdb/queries.py``).
A query takes and gives plain values and the models of :mod:`loopscope.models`, never an
engine's types (connections, cursors, engine errors): a second engine implements this
protocol, and the callers do not change.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from .errors import StoreError
from .policy import EventFilter, TurnFilter
from .results import (
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

if TYPE_CHECKING:
    from ..models import ActivityEvent, AIResponseEvent, ModelCall, SessionInfo
    from .api import BundleSink
    from .rows import SpanMapping

CLICKHOUSE_SCHEMES = ("clickhouse://", "clickhouses://", "chdb://")
"""The prefixes that name a ClickHouse store (``--db``, ``LOOPSCOPE_DB``)."""

CLICKHOUSE_ENGINE = "loopscope.storage.clickhouse"
"""The ClickHouse engine's package. What the seam calls there: ``open_reader(url, *,
lock_timeout, keep_open)`` (a :class:`Reader`), ``open_sink(url, *, mapping, **options)``
(a :class:`~loopscope.storage.api.BundleSink`) and ``prepare(url, *, timeout[, ttl_days])`` (the DDL
run; the URL back), as :mod:`loopscope.storage.duckdb.queries` has them for a file."""

TOOL_ORDERS = ("calls", "failures", "p95", "name")
"""How :meth:`Reader.tools` may order its rows (``loopscope tools --sort``)."""

EXPORT_TABLES = ("events", "turns", "tool_calls")
"""The tables :meth:`Reader.export_parquet` writes (``tool_calls``: one row per call)."""


class EngineMissingError(StoreError):
    """The store's name asks for an engine this loopscope does not have."""


def engine_of(db: str) -> str:
    """Which engine a store's name asks for: ``"clickhouse"`` for a ``clickhouse://`` URL,
    else ``"duckdb"`` (a file path)."""
    return "clickhouse" if db.lower().startswith(CLICKHOUSE_SCHEMES) else "duckdb"


class ExportProgress(Protocol):
    """A progress bar of one table being exported (the CLI draws it on stderr)."""

    def draw(self, percent: float) -> None: ...

    def done(self, interrupted: bool = False) -> None: ...


def name_of(db: str) -> str:
    """The store as its reads and sinks name it: a URL as given, a file's path resolved
    (absolute, ``~`` expanded, links followed)."""
    if engine_of(db) == "clickhouse":
        return db
    from .recording import resolve

    return resolve(db)


@runtime_checkable
class Follow(Protocol):
    """A session's log (or every session's) followed: the newest events first, then each
    event as it lands, in each session's index order, never back (``loopscope tail -f``)."""

    def start(self, newest: int = 0) -> list[ActivityEvent]:
        """The ``newest`` events, and the place the next poll goes on from."""
        ...

    def poll(self) -> list[ActivityEvent]:
        """The events that landed since the last call."""
        ...


@runtime_checkable
class Reader(Protocol):
    """The named queries of one store. Reads never write; what this process recorded is
    written before a read (a read sees it). Engine errors come out as :class:`StoreError`
    where the store cannot be read (locked, not a store, too new), else as the engine's
    own (a bad SQL text: the CLI says ``SQL failed``)."""

    path: str
    """The store as its reads name it (a resolved file path, or the URL)."""
    lock_timeout: float

    # -- sessions ------------------------------------------------------------------------

    def session(self, requested: str | None) -> SessionLookup:
        """The session named (or uniquely prefixed), or the most recently active one."""
        ...

    def sessions(self, limit: int | None = None, *, search: str | None = None) -> list[SessionInfo]:
        """Sessions, most recently active first; ``search``: those whose id, agent or
        model, or whose content (:meth:`search`'s), holds it (any case)."""
        ...

    def session_costs(self, session_ids: Sequence[str]) -> dict[str, float | None]:
        """What each of these sessions cost in USD (None: no price known)."""
        ...

    # -- the timeline ----------------------------------------------------------------------

    def timeline(
        self, session_id: str, limit: int | None = None, *, after_index: int | None = None,
        before_index: int | None = None, event_filter: EventFilter | None = None, newest_first: bool = False,
    ) -> list[ActivityEvent]:
        """A page of the session's timeline, ascending by index."""
        ...

    def event_count(self, session_id: str, event_filter: EventFilter | None = None) -> int:
        """How many events the session's timeline has, uncapped."""
        ...

    def recent_events(self, limit: int = 10, *, event_filter: EventFilter | None = None) -> list[ActivityEvent]:
        """The newest events of all sessions together, oldest first."""
        ...

    def follow(self, session_id: str | None, *, event_filter: EventFilter | None = None) -> Follow:
        """A session's log (None: every session's) followed as it grows."""
        ...

    def ready(self) -> bool:
        """Whether the store exists and can be read now (not locked, holding loopscope data)."""
        ...

    # -- turns and model calls --------------------------------------------------------------

    def turns(
        self, session_id: str | None = None, limit: int | None = 50, *, newest_first: bool = False,
        turn_filter: TurnFilter | None = None,
    ) -> list[AIResponseEvent]:
        """Turn summaries as the public models, oldest first (``newest_first``: the most recent
        ``limit``); ``turn_filter``: only the turns it keeps (agent, reason, model, since, cost, text)."""
        ...

    def turn_rows(
        self, session_id: str | None = None, limit: int | None = 50, *, newest_first: bool = False,
        turn_filter: TurnFilter | None = None,
    ) -> list[TurnRow]:
        """The same turns as plain rows (no pydantic)."""
        ...

    def turn_costs(self, turn_ids: Sequence[str | None]) -> dict[tuple[str | None, str | None], float | None]:
        """What the turns of these correlation ids cost in USD, by (session, turn)."""
        ...

    def calls(
        self, session_id: str | None = None, *, model: str | None = None, provider: str | None = None,
        failed: bool = False, slowest: bool = False, limit: int | None = 50,
        since: datetime | None = None, search: str | None = None,
    ) -> list[CallRow]:
        """Model calls as plain rows, oldest first (``slowest``: longest first); ``since``:
        started at or after it; ``search``: whose messages or error hold the text (any case)."""
        ...

    def model_calls(
        self, session_id: str | None = None, *, model: str | None = None, provider: str | None = None,
        failed: bool = False, slowest: bool = False, limit: int | None = 50,
        since: datetime | None = None, search: str | None = None,
    ) -> list[ModelCall]:
        """The same calls as the public models."""
        ...

    # -- trajectories (loopscope diff) -------------------------------------------------------

    def trajectory(self, ref: str) -> TrajectoryLookup:
        """The steps of the session or turn ``ref`` names (its id, else a unique prefix of a
        session id or a turn's correlation id; a session's id wins over a turn's), in order:
        model calls, tool calls, and each turn's end (:class:`~.results.TrajectoryStep`)."""
        ...

    # -- search and tool calls (issue 35) ---------------------------------------------------

    def search(self, text: str, *, session_id: str | None = None, limit: int = 50) -> list[SearchHit]:
        """Where ``text`` (any case) is in the store's content: messages, tool names,
        arguments, results and errors, model calls' output messages and errors; newest
        first, each with its session, turn, the field that holds it and a snippet. A plain
        scan, no index; an empty text is a ``ValueError``."""
        ...

    def tool_calls(
        self, session_id: str | None = None, *, tool: str | None = None, failed: bool = False,
        slowest: bool = False, since: datetime | None = None, search: str | None = None, limit: int | None = 50,
    ) -> list[ToolCallRow]:
        """Tool calls (a start and its end as one row), newest first (``slowest``: longest
        first); ``failed``: those that ended other than served; ``search``: whose name,
        arguments, result or error hold the text."""
        ...

    # -- analytics ------------------------------------------------------------------------

    def stats(self) -> Stats:
        """The store's totals (``loopscope stats``)."""
        ...

    def tools(self, order: str = "calls", limit: int | None = None) -> list[Record]:
        """``tool_stats``: one row per tool (:data:`TOOL_ORDERS`)."""
        ...

    def declared_tools(self, agent: str | None = None, limit: int | None = None) -> list[Record]:
        """``declared_vs_used``: per agent, each tool offered or called, with its ``kind``
        (``server``: a tool the provider runs; else ``client``)."""
        ...

    def turn_count(self, agent: str | None = None) -> int:
        """How many turns the store holds (of ``agent``)."""
        ...

    def status(self) -> StoreStatus:
        """What the store holds and what its writers counted (``loopscope status``)."""
        ...

    # -- the web dashboard's pages (JSON-ready dicts: storage/pages.py, docs/dashboards.md) ---

    def page_overview(self, limit: int = 50) -> dict[str, Any]:
        """Store-wide totals, loop end reasons, the most recently active sessions."""
        ...

    def page_sessions(self, q: str | None = None, limit: int | None = None, offset: int | None = None) -> dict[str, Any]:
        """A page of sessions, most recently active first; ``q`` matches session id, agent or
        model, or the sessions' content (:meth:`search`'s)."""
        ...

    def page_timeline(
        self, session_id: str, *, after_index: int | None = None, before_index: int | None = None,
        limit: int | None = None, include_blocked: bool = False, turn_ids: Sequence[str] = (),
    ) -> dict[str, Any]:
        """A page of a session's timeline, the turns on it and their model calls."""
        ...

    def page_event(self, event_id: str) -> dict[str, Any] | None:
        """One event in full, or None."""
        ...

    def page_tools(self, range_: str | None = "all", tool: str | None = None) -> dict[str, Any]:
        """Tool analytics within a time range (:data:`~loopscope.storage.pages.RANGES`)."""
        ...

    def page_turns(self, range_: str | None = "all") -> dict[str, Any]:
        """Turn analytics within a time range."""
        ...

    def page_declared(self, range_: str | None = "all") -> dict[str, Any]:
        """Declared tools against the tools called, per agent, within a time range."""
        ...

    # -- scores (docs/scores.md) ---------------------------------------------------------------

    def score_target(self, ref: str) -> ScoreTarget | None:
        """The turn, model call or tool call an id names (``loopscope score TARGET``): a turn's
        correlation id or a unique prefix of it, a response id, a tool call id, a span id; None
        when nothing has it; a :class:`StoreError` when several things do."""
        ...

    def page_session_scores(self, session_id: str, turn_ids: Sequence[str]) -> dict[str, Any]:
        """The scores of these turns of a session and of their calls and tools, as a timeline
        page holds them (its ``scores``): what a page open on the session polls for, as scores
        come after their turns ended."""
        ...

    def page_scores(self, range_: str | None = "all") -> dict[str, Any]:
        """The dashboard's Scores page within a time range: per score name, by agent, model and
        tool, per day, and the most recent scores with what they score."""
        ...

    def sql(self, query: str, params: Sequence[Any] = ()) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Read-only SQL on the store (the engine's dialect): column names and rows."""
        ...

    def export_parquet(
        self, tables: Sequence[str], out: str, *, progress: Callable[[str], ExportProgress] | None = None,
    ) -> dict[str, int]:
        """Write each of ``tables`` (:data:`EXPORT_TABLES`) as Parquet under ``out/<table>/``,
        partitioned by UTC day (``date=YYYY-MM-DD``), a table's folder replaced; the rows
        written per table. ``progress(table)`` makes the bar a table's writing draws."""
        ...

    def stored_ids(self, event_ids: Sequence[str]) -> set[str]:
        """Which of these event ids the store holds (``collect``'s look-up of start rows)."""
        ...

    def has_agui_events(self, session_id: str) -> bool:
        """Whether the store holds imported AG-UI events of this session (``loopscope import --agui``)."""
        ...

    def interrupted(self, exc: BaseException) -> bool:
        """Whether ``exc`` is Ctrl-C that reached the engine first (a query interrupted)."""
        ...


def open_reader(db: str, *, lock_timeout: float = 10.0, keep_open: bool = False) -> Reader:
    """The query API of the store ``db`` names: a ``clickhouse://`` URL, else a DuckDB file
    (see the module's docstring). Opens nothing yet: each query reads when asked.
    ``keep_open``: a reader that reads often and never writes (a dashboard); an engine
    may keep what it opened between reads (DuckDB: the file attached, see ``Store``)."""
    if engine_of(db) == "clickhouse":
        return _clickhouse("open_reader")(db, lock_timeout=lock_timeout, keep_open=keep_open)  # type: ignore[no-any-return]
    from .duckdb.queries import DuckDBReader

    return DuckDBReader(db, lock_timeout=lock_timeout, keep_open=keep_open)


def prepare(db: str, *, timeout: float = 10.0, ttl_days: int = 0) -> str:
    """Make the store ``db`` names ready to be written (its schema made, or migrated to this
    loopscope's); its name as its reads and sinks take it. A store that cannot be written
    fails here, clearly, not at the first span. ``ttl_days`` (ClickHouse only; 0: keep
    everything): the retention the tables it makes get (docs/clickhouse.md, "Retention");
    a DuckDB file keeps every row, and asking it for a retention is a ``ValueError``."""
    if ttl_days < 0:
        raise ValueError("ttl_days must not be negative")
    if engine_of(db) == "clickhouse":
        return _clickhouse("prepare")(db, timeout=timeout, ttl_days=ttl_days)  # type: ignore[no-any-return]
    if ttl_days:
        raise ValueError("a DuckDB file has no retention (ttl_days is for a ClickHouse store): it keeps every row")
    from .duckdb.queries import prepare as prepare_file

    return prepare_file(db, timeout=timeout)


def open_sink(db: str, *, mapping: SpanMapping, **options: Any) -> BundleSink:
    """The write side of the store ``db`` names, fed spans through ``mapping`` (ingest's):
    a ClickHouse engine's sink, or DuckDB's :class:`~loopscope.storage.duckdb.writer.StoreWriter`
    (``options`` are its own)."""
    if engine_of(db) == "clickhouse":
        return _clickhouse("open_sink")(db, mapping=mapping, **options)  # type: ignore[no-any-return]
    from .duckdb.writer import StoreWriter

    return StoreWriter(db, mapping=mapping, **options)


def _clickhouse(name: str) -> Any:
    """The ClickHouse engine's ``name``, or :class:`EngineMissingError` saying it is missing."""
    try:
        engine = importlib.import_module(CLICKHOUSE_ENGINE)
    except ModuleNotFoundError as exc:
        if exc.name is None or not CLICKHOUSE_ENGINE.startswith(exc.name):
            raise  # the engine is there; something it imports is not (its error says what)
        raise EngineMissingError(
            "a clickhouse:// store needs the ClickHouse engine (loopscope.storage.clickhouse), which this loopscope "
            "does not have yet; give --db (or LOOPSCOPE_DB) a DuckDB file path instead"
        ) from None
    found = getattr(engine, name, None)
    if found is None:
        raise EngineMissingError(
            f"the ClickHouse engine (loopscope.storage.clickhouse) has no {name}() yet: it cannot serve this store"
        )
    return found


__all__ = [
    "CLICKHOUSE_SCHEMES",
    "EXPORT_TABLES",
    "TOOL_ORDERS",
    "EngineMissingError",
    "ExportProgress",
    "Follow",
    "Reader",
    "engine_of",
    "name_of",
    "open_reader",
    "open_sink",
    "prepare",
]
