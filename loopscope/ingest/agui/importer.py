"""Storing an AG-UI event stream: its rows through the writer's own batch, its events raw.

The whole stream is read and validated first; then, in one transaction of one file
opening, the rows go through :func:`loopscope.storage.duckdb.writer.write_batch` (so they get
their per-session indices exactly as recorded rows do, from the ``sessions`` table) and
every event goes verbatim into ``agui_events``. Either all of a stream is stored, or
none of it.

A run already stored is recognised by its raw events: one that matches is skipped (a
re-import adds nothing), one that differs is refused, naming it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import duckdb

from ...storage import rows
from ...storage.duckdb.connection import open_store, resolve
from ...storage.duckdb.schema import migrate
from ...storage.duckdb.writer import write_batch
from ...storage.recording import configured_path, default_db_path
from .interpret import Interpretation, PendingCall, interpret
from .read import AguiFormatError, Source, read_events

__all__ = ["ImportResult", "import_stream"]

RAW_TABLE = "_loopscope_agui_rows"


@dataclass(frozen=True)
class ImportResult:
    """What an import stored."""

    path: str
    sessions: list[str]
    received: int  # AG-UI events read
    raw_events: int  # AG-UI events stored (the rest belonged to runs stored already)
    events: int  # activity log rows written
    turns: int  # turn summaries written
    runs: int  # runs stored
    skipped_runs: list[str] = field(default_factory=list)  # runs already stored, unchanged
    unmatched_results: int = 0  # tool results for calls no stored or imported event started


def import_stream(
    source: Source,
    path: str | None = None,
    *,
    session: str | None = None,
    lock_timeout: float = 10.0,
) -> ImportResult:
    """Store an AG-UI event stream in a loopscope store.

    ``source`` is SSE text, JSON lines or a JSON array (as ``str`` or ``bytes``), a path,
    an open file, or an iterable of ``ag_ui.core`` events, dicts or JSON texts. The rows
    go to the session of each run's thread id, or all to ``session`` when given. ``path``
    is the store file (default: the configured one, ``LOOPSCOPE_DB``, ./loopscope.duckdb).

    Raises :class:`AguiFormatError` (a ``ValueError``) naming the line of the first
    malformed event; nothing of such a stream is stored.
    """
    received = read_events(source)
    target = resolve(path or configured_path() or default_db_path())
    if not received:
        return ImportResult(target, [], 0, 0, 0, 0, 0)
    interpret(received, session)  # a stream that cannot be read as runs fails before the file is touched
    with open_store(target, read_only=False, timeout=lock_timeout) as con:
        migrate(con)
        plan = interpret(
            received, session,
            lookup_pending=lambda s, call_id: _stored_pending(con, s, call_id),
            seen_message=lambda s, span: _stored_message(con, s, span),
        )
        skipped = _stored_segments(con, plan)
        facts = _facts(plan, skipped)
        raw = _raw_rows(con, plan, skipped)
        con.register(RAW_TABLE, raw)
        try:
            events, turns = write_batch(con, facts, extra=[(
                f"INSERT INTO agui_events (session_id, run_id, seq, type, created_at, raw, imported_at) "
                f"SELECT session_id, run_id, seq, type, created_at, raw, now() FROM {RAW_TABLE}"
            )])
        finally:
            con.unregister(RAW_TABLE)
    kept = [s for i, s in enumerate(plan.segments) if i not in skipped]
    return ImportResult(
        path=target,
        sessions=list(dict.fromkeys(s.session for s in plan.segments)),
        received=len(received),
        raw_events=sum(len(s.items) for s in kept),
        events=events,
        turns=turns,
        runs=sum(1 for s in kept if s.run_id is not None),
        skipped_runs=[plan.segments[i].run_id or "" for i in sorted(skipped)],
        unmatched_results=plan.unmatched_results,
    )


# -- what the store holds already -----------------------------------------------------------


def _stored_segments(con: duckdb.DuckDBPyConnection, plan: Interpretation) -> set[int]:
    """The segments stored already (skipped); raises if one is stored with other events."""
    skipped: set[int] = set()
    sessions = list(dict.fromkeys(s.session for s in plan.segments))
    stored: dict[tuple[str, str | None], list[str]] = {
        (row[0], row[1]): row[2]
        for row in con.execute(
            "SELECT session_id, run_id, list(raw ORDER BY seq) FROM agui_events "
            "WHERE list_contains(?, session_id) GROUP BY session_id, run_id",
            [sessions],
        ).fetchall()
    }
    for number, segment in enumerate(plan.segments):
        before = stored.get((segment.session, segment.run_id))
        if before is None:
            continue
        if before == [r.raw for r in segment.items]:
            skipped.add(number)
            continue
        what = f"run {segment.run_id!r}" if segment.run_id is not None else "the events before its first run"
        raise AguiFormatError(
            segment.items[0].where,
            f"{what} of session {segment.session!r} is stored already with other events "
            f"({len(before)} stored, {len(segment.items)} here); nothing was imported",
        )
    return skipped


def _stored_pending(con: duckdb.DuckDBPyConnection, session: str, call_id: str) -> PendingCall | None:
    """A tool call started in the store (by an earlier import) and not ended there."""
    row = con.execute(
        """SELECT trace_id, span_id, json_extract_string(content, '$.tool_name'),
                  json_extract(content, '$.arguments')::VARCHAR, epoch_us(created_at), correlation_id
           FROM events s
           WHERE session_id = ? AND type = 'tool_call_start' AND json_extract_string(content, '$.tool_id') = ?
             AND NOT EXISTS (SELECT 1 FROM events e WHERE e.session_id = s.session_id AND e.type = 'tool_call_end'
                             AND json_extract_string(e.content, '$.tool_id') = ?)
           ORDER BY idx DESC LIMIT 1""",
        [session, call_id, call_id],
    ).fetchone()
    if row is None:
        return None
    arguments = None if row[3] in (None, "null") else row[3]
    return PendingCall(bytes.fromhex(row[0]), bytes.fromhex(row[1]), row[2] or "", arguments, int(row[4]), row[5])


def _stored_message(con: duckdb.DuckDBPyConnection, session: str, span: bytes) -> bool:
    row = con.execute(
        "SELECT 1 FROM events WHERE session_id = ? AND span_id = ? AND type = 'message' LIMIT 1",
        [session, span.hex()],
    ).fetchone()
    return row is not None


# -- the rows -------------------------------------------------------------------------------


def _facts(plan: Interpretation, skipped: set[int]) -> rows.Facts:
    """The kept rows as the writer's facts (the same Arrow batches a span batch makes)."""
    facts = rows.Facts()
    facts.append(
        [rows.EventFact(**row) for n, row in plan.events if n not in skipped],
        [rows.TurnFact(**row) for n, row in plan.turns if n not in skipped],
    )
    return facts


def _raw_rows(con: duckdb.DuckDBPyConnection, plan: Interpretation, skipped: set[int]) -> Any:
    """The kept events as an Arrow table for ``agui_events``, numbered on from each
    session's last ``seq``."""
    import pyarrow as pa

    sessions = list(dict.fromkeys(s.session for s in plan.segments))
    seq: dict[str, int] = dict.fromkeys(sessions, 0)
    seq.update(dict(con.execute(
        "SELECT session_id, max(seq) FROM agui_events WHERE list_contains(?, session_id) GROUP BY session_id",
        [sessions],
    ).fetchall()))
    columns: dict[str, list[Any]] = {"session_id": [], "run_id": [], "seq": [], "type": [], "created_at": [], "raw": []}
    for number, segment in enumerate(plan.segments):
        if number in skipped:
            continue
        for item, ts in zip(segment.items, segment.times):
            seq[segment.session] += 1
            columns["session_id"].append(segment.session)
            columns["run_id"].append(segment.run_id)
            columns["seq"].append(seq[segment.session])
            columns["type"].append(item.type)
            columns["created_at"].append(ts)
            columns["raw"].append(item.raw)
    text = pa.string()
    schema = pa.schema([
        ("session_id", text), ("run_id", text), ("seq", pa.int64()), ("type", text),
        ("created_at", pa.timestamp("us", tz="UTC")), ("raw", text),
    ])
    return pa.table(columns, schema=schema)

