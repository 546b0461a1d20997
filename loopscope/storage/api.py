"""The store's API: the protocols a storage engine implements (DuckDB's, ClickHouse's), which
the seam (:mod:`loopscope.storage.queries`: ``open_reader``, ``open_sink``, ``prepare``) hands
out to the CLI, the dashboards and ingest.

Two doors, both engine-neutral in what they take and give:

* :class:`StoreReader`: the query API, events, turns, model calls and sessions as the public models
  (:mod:`loopscope.models`), a session's log followed live, read-only SQL. DuckDB's
  :class:`~loopscope.storage.duckdb.store.Store` implements it (and :class:`~loopscope.storage.duckdb.store.AsyncStore`
  the same reads for async code).
* :class:`SpanSink`: the write side. Spans queued as they start and end, reduced to
  :class:`~loopscope.storage.rows.Facts` (Arrow record batches in a fixed field order) by
  the :class:`~loopscope.storage.rows.SpanMapping` the sink was given (ingest's), and
  written in batches. DuckDB's :class:`~loopscope.storage.duckdb.writer.StoreWriter` implements
  it; the facts are what any engine takes, so the mapping is not the engine's.

* :class:`BundleSink`: the sink ``loopscope collect`` writes through (a request's spans in
  one transaction, refused requests counted, flushes answered later).

The CLI's, the dashboard's and ``collect``'s reads are the named queries of
:class:`loopscope.storage.queries.Reader` (typed results: :mod:`loopscope.storage.results`).

Behind the doors, DuckDB's own (``storage/duckdb/``): the file and its connections
(``connection.py``), the schema and its migrations (``schema.py``), ``write_batch`` (facts to
rows in SQL), the SQL views (``views.py``), the writers' health rows (``health.py``),
open-turn tracking (``recovery.py``), the raw ``spans`` table (``raw_spans.py``) and the
queries' SQL (``queries.py``, ``dashboard.py``, ``parquet.py``).

Not behind them yet (each names the DuckDB modules directly; pyproject.toml's ``seam``
contract lists them in ``ignore_imports`` with what removes each): the writer process's child
runs DuckDB's ``StoreWriter`` itself (the thread writer and ``collect`` take theirs from
``open_sink``); a writer process records its losses beside the store
(``health``); recovery (``ingest/recovery.py``) and AG-UI import (``ingest/agui``) write
with ``write_batch`` on a connection they open; AG-UI export reads ``agui_events``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from ..models import ActivityEvent, AIResponseEvent, ModelCall, SessionInfo
from .duckdb.replay import DEFAULT_PAGE, Replay, StopFlag
from .limits import CLOSE_TIMEOUT, WriterStats
from .policy import EventFilter, TurnFilter
from .rows import SpanMapping


@runtime_checkable
class StoreReader(Protocol):
    """The query API of a store (see :class:`~loopscope.storage.duckdb.store.Store` for each
    method's full contract). Reads never write."""

    path: str

    def list_events(
        self, session_id: str, offset: int = 0, limit: int | None = 50, *, after_index: int | None = None,
        before_index: int | None = None, event_filter: EventFilter | None = None, newest_first: bool = False,
    ) -> list[ActivityEvent]:
        """One page of a session's events, ascending by index."""
        ...

    def get_timeline(
        self, session_id: str, offset: int = 0, limit: int | None = None, *, after_index: int | None = None,
        before_index: int | None = None, event_filter: EventFilter | None = None, newest_first: bool = False,
    ) -> list[ActivityEvent]:
        """Everything the session received, in order."""
        ...

    def get_conversation(self, session_id: str, limit: int = 50, after_index: int | None = None) -> list[ActivityEvent]:
        """Message events only, blocked ones included."""
        ...

    def get_event(self, event_id: str) -> ActivityEvent | None:
        """One event by id, whatever its status."""
        ...

    def get_event_count(self, session_id: str, event_filter: EventFilter | None = None) -> int:
        """How many events :meth:`list_events` would serve, uncapped."""
        ...

    def list_recent_events(self, limit: int = 10, *, event_filter: EventFilter | None = None) -> list[ActivityEvent]:
        """The newest events of all sessions together, oldest first."""
        ...

    def last_indices(self) -> dict[str, int]:
        """Each session's highest event index so far."""
        ...

    def replay(
        self, session_id: str, after_index: int | None = None, *, until_turn_end: bool = False,
        poll_interval: float = 0.25, event_filter: EventFilter | None = None, stop: StopFlag | None = None,
        page: int = DEFAULT_PAGE,
    ) -> Replay:
        """The session's events in index order, stored ones first, then each new one as it lands."""
        ...

    def derive_state(self, session_id: str, *, at_index: int | None = None) -> Any | None:
        """The session's state: the last snapshot with the later deltas applied."""
        ...

    def list_turns(
        self, session_id: str | None = None, limit: int | None = 50, *, correlation_id: str | None = None,
        channel_id: str | None = None, loop_end_reason: str | None = None, after_time: datetime | None = None,
        newest_first: bool = False, turn_filter: TurnFilter | None = None,
    ) -> list[AIResponseEvent]:
        """Turn summaries, oldest first; ``turn_filter``: only those it keeps."""
        ...

    def list_sessions(self, limit: int | None = None, *, search: str | None = None) -> list[SessionInfo]:
        """Sessions, most recently active first; ``search``: whose id, agent, model or content holds it."""
        ...

    def model_calls(
        self, session_id: str | None = None, correlation_id: str | None = None, *, model: str | None = None,
        provider: str | None = None, failed: bool = False, slowest: bool = False, limit: int | None = 50,
        with_messages: bool = False, since: datetime | None = None, search: str | None = None,
    ) -> list[ModelCall]:
        """Model calls, oldest first (``slowest``: longest first), with their cost; ``since``:
        started at or after it; ``search``: whose output or error holds the text."""
        ...

    def sql(self, query: str, params: Sequence[Any] = ()) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Read-only SQL on the store: column names and rows."""
        ...


@runtime_checkable
class SpanSink(Protocol):
    """The write side of a store: spans in (never blocking the caller), rows written in
    the background. Made with the :class:`~loopscope.storage.rows.SpanMapping` that turns
    spans into facts."""

    path: str

    def submit(self, kind: int, span: Any) -> None:
        """Queue a span as it starts (``rows.START``) or ends (``rows.END``); a full queue drops and counts."""
        ...

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Write everything queued so far; True when it reached the store."""
        ...

    def close(self, timeout: float | None = CLOSE_TIMEOUT) -> None:
        """Flush, then stop; returns within ``timeout``, counting what it could not write."""
        ...

    def stats(self) -> WriterStats:
        """What was written, dropped and queued."""
        ...


@runtime_checkable
class BundleSink(SpanSink, Protocol):
    """A sink that ``loopscope collect`` writes a request's spans through: a request's spans
    (and their raw copies) in one transaction or none, a refused request counted, a flush
    answered later (DuckDB's :class:`~loopscope.storage.duckdb.writer.StoreWriter` is one)."""

    def submit_start(self, span: Any) -> None: ...

    def submit_end(self, span: Any) -> None: ...

    def begin_bundle(self) -> None:
        """The spans submitted until :meth:`end_bundle` are written together."""
        ...

    def end_bundle(self, raw: list[tuple[Any, ...]] | None = None) -> None:
        """End the bundle; ``raw``: the raw copies of its spans, written with its rows."""
        ...

    def flush_then(self, then: Callable[[bool], None]) -> None:
        """Call ``then(ok)`` once what was queued before is written (or failed to be)."""
        ...

    def count_refused(self, spans: int = 0, reason: str | None = None) -> None:
        """Count a request refused unread (with its spans when counted)."""
        ...


__all__ = ["BundleSink", "SpanMapping", "SpanSink", "StoreReader"]
