"""The store's API: what ingest, the CLI and the dashboards call, and what a second storage
engine (ClickHouse, say) would implement beside the DuckDB one.

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

Behind the doors, DuckDB's own: the file and its connections (``connection.py``), the
schema and its migrations (``schema.py``), ``write_batch`` (facts to rows in SQL), the
SQL views (``views.py``), the writers' health rows (``health.py``), open-turn tracking
(``recovery.py``) and the raw ``spans`` table (``raw_spans.py``).

Not behind them yet (each is DuckDB-specific and names the DuckDB modules directly):
AG-UI import (``ingest/agui``) and recovery (``ingest/recovery.py``) write facts with
``write_batch`` on a connection they open; the collector migrates the file on start; the
dashboard's JSON API and ``loopscope status`` / ``export`` read with ``open_store``,
``schema`` and ``health``. An engine of a second kind starts by giving these a door.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from ..models import ActivityEvent, AIResponseEvent, ModelCall, SessionInfo
from .duckdb.replay import DEFAULT_PAGE, Replay, StopFlag
from .duckdb.writer import CLOSE_TIMEOUT, WriterStats
from .policy import EventFilter
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
        newest_first: bool = False,
    ) -> list[AIResponseEvent]:
        """Turn summaries, oldest first."""
        ...

    def list_sessions(self, limit: int | None = None, *, search: str | None = None) -> list[SessionInfo]:
        """Sessions, most recently active first."""
        ...

    def model_calls(
        self, session_id: str | None = None, correlation_id: str | None = None, *, model: str | None = None,
        provider: str | None = None, failed: bool = False, slowest: bool = False, limit: int | None = 50,
        with_messages: bool = False,
    ) -> list[ModelCall]:
        """Model calls, oldest first (``slowest``: longest first), with their cost."""
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


__all__ = ["SpanMapping", "SpanSink", "StoreReader"]
