"""The web dashboard's data: JSON-ready dicts read from a store through the query API
(:class:`~loopscope.storage.queries.Reader`'s ``page_*`` queries), whatever its engine.

Each page is one short read: the store is held for the duration of the call and let go
of again, so an agent keeps writing while the dashboard reads. Times are epoch
milliseconds (UTC); the browser formats them.

``overview(store)`` is the main page's data (headline totals and the most recently
active sessions); it reads only the sessions and the turns, never the whole event log.
The analytics functions scan the event log within a time range.

JSON has no NaN or infinity: wherever one would be (a figure the store computes, a tool
result such as ``{"mean": NaN}`` recorded as Python's ``json`` writes it), the answers
hold ``null``, as ``loopscope ... --json`` does for recorded values (:func:`json_safe`).
Numeric parameters are whole numbers within bounds (``limit`` 1..:data:`MAX_PAGE`,
``offset`` 0..:data:`MAX_OFFSET`, ``after``/``before`` 0..:data:`MAX_INDEX`); anything
else is an :class:`ApiError` (HTTP 400).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Protocol

from ...storage.pages import (
    MAX_CONTENT_CHARS,
    MAX_INDEX,
    MAX_OFFSET,
    MAX_PAGE,
    RANGES,
    TIMELINE_PAGE,
    ApiError,
    json_safe,
    now_ms,
    whole,
)
from ...storage.queries import Reader, open_reader

__all__ = [
    "MAX_CONTENT_CHARS",
    "MAX_INDEX",
    "MAX_OFFSET",
    "MAX_PAGE",
    "RANGES",
    "TIMELINE_PAGE",
    "ApiError",
    "calls",
    "declared_vs_used",
    "diff",
    "event",
    "json_safe",
    "overview",
    "scores",
    "search",
    "session_scores",
    "sessions",
    "timeline",
    "tool_analytics",
    "turn_analytics",
]


class StoreLike(Protocol):
    """A store object of the public API (:class:`loopscope.Store`): its path and lock wait."""

    path: str
    lock_timeout: float


def reader(store: Reader | StoreLike) -> Reader:
    """The query API of ``store``: itself, or that of the store a :class:`loopscope.Store` reads."""
    if isinstance(store, Reader):
        return store
    return open_reader(store.path, lock_timeout=store.lock_timeout, keep_open=bool(getattr(store, "keep_open", False)))


def sessions(store: Reader | StoreLike, q: str | None = None, limit: int | None = None, offset: int | None = None) -> dict[str, Any]:
    """A page of sessions, most recently active first; ``q`` matches session id, agent or model."""
    return reader(store).page_sessions(q, limit, offset)


def overview(store: Reader | StoreLike, limit: int = 50) -> dict[str, Any]:
    """The dashboard's first page: store-wide totals, loop end reasons, the most recent sessions."""
    return reader(store).page_overview(limit)


def timeline(
    store: Reader | StoreLike,
    session_id: str,
    *,
    after_index: int | None = None,
    before_index: int | None = None,
    limit: int | None = None,
    include_blocked: bool = False,
    turn_ids: Sequence[str] = (),
) -> dict[str, Any]:
    """One page of a session's timeline, the summaries of the turns on it and their model
    calls (see :meth:`~loopscope.storage.queries.Reader.page_timeline`)."""
    return reader(store).page_timeline(
        session_id, after_index=after_index, before_index=before_index, limit=limit,
        include_blocked=include_blocked, turn_ids=turn_ids,
    )


def event(store: Reader | StoreLike, event_id: str) -> dict[str, Any] | None:
    """One event in full (a timeline page cuts long contents)."""
    return reader(store).page_event(event_id)


def tool_analytics(store: Reader | StoreLike, range_: str | None = "all", tool: str | None = None) -> dict[str, Any]:
    """Per tool: calls, running, share by outcome, duration percentiles, last seen; calls over time."""
    return reader(store).page_tools(range_, tool)


def turn_analytics(store: Reader | StoreLike, range_: str | None = "all") -> dict[str, Any]:
    """Loop end reasons (in all and over time), tokens by model and over time, latency, slowest turns."""
    return reader(store).page_turns(range_)


def declared_vs_used(store: Reader | StoreLike, range_: str | None = "all") -> dict[str, Any]:
    """Per agent: each tool declared in its turns, in how many turns, and how often it was called.

    Tools declared but never called cost prompt tokens every turn; tools called but not
    declared point at a mismatch between what the model is offered and what runs.
    """
    return reader(store).page_declared(range_)


def scores(store: Reader | StoreLike, range_: str | None = "all") -> dict[str, Any]:
    """The Scores page: per score name, by agent, model and tool, per day, and the most recent
    scores with what they score (docs/scores.md)."""
    return reader(store).page_scores(range_)


def session_scores(store: Reader | StoreLike, session_id: str, turn_ids: Sequence[str] = ()) -> dict[str, Any]:
    """The scores of a session's turns (and their calls' and tools'), as a timeline page holds them."""
    return reader(store).page_session_scores(session_id, turn_ids)
# -- two runs compared (the diff page; loopscope diff) --------------------------------------------


def diff(store: Reader | StoreLike, a: str, b: str) -> dict[str, Any]:
    """Run ``a`` and run ``b`` (each a session id or a turn's correlation id, or a unique
    prefix) aligned step by step (:func:`loopscope.dashboards.diff.compare`, docs/diff.md);
    an :class:`ApiError` names a run not found, or a prefix that names several."""
    from ..align import TooLongError
    from ..diff import compare

    read = reader(store)
    runs = []
    for side, ref in (("a", a), ("b", b)):
        found = read.trajectory(ref)
        if found.trajectory is None:
            if found.candidates:
                raise ApiError(f"{side}: {ref!r} matches several sessions or turns ({', '.join(found.candidates)})")
            raise ApiError(f"{side}: no session or turn {ref!r} in this store")
        runs.append(found.trajectory)
    try:
        return json_safe(compare(runs[0], runs[1]))  # type: ignore[no-any-return]
    except TooLongError as exc:
        raise ApiError(f"{exc}: compare single turns instead") from None


# -- search and the store-wide call lists (issue 35) ---------------------------------------------

SEARCH_LIMIT = 100
"""The places a dashboard search lists at most."""
CALLS_LIMIT = 50
"""The calls a store-wide list shows at most (``/api/calls``)."""


def _ms(value: datetime | None) -> int | None:
    return None if value is None else int(value.timestamp() * 1000)


def search(store: Reader | StoreLike, q: str | None, session_id: str | None = None, limit: int | None = None) -> dict[str, Any]:
    """Where ``q`` is in the store's content (:meth:`~loopscope.storage.queries.Reader.search`):
    each place with its session, turn, event index, field and snippet; ``t`` epoch ms."""
    limit = whole("limit", SEARCH_LIMIT if limit is None else limit, 1, MAX_PAGE)
    text = (q or "").strip()
    if not text:
        return {"q": "", "hits": [], "limit": limit}
    hits = reader(store).search(text, session_id=session_id, limit=limit)
    return {
        "q": text,
        "limit": limit,
        "hits": [
            {"session_id": h.session_id, "turn_id": h.turn_id, "kind": h.kind, "index": h.index, "event_id": h.event_id,
             "tool": h.tool, "field": h.field, "snippet": h.snippet, "t": _ms(h.at)}
            for h in hits
        ],
    }


def calls(store: Reader | StoreLike, tool: str | None = None, failed: bool = False, limit: int | None = None) -> dict[str, Any]:
    """Store-wide lists of calls: with ``failed`` the calls that failed, newest first, else
    the slowest, longest first; tool calls (of ``tool`` alone when given) and, without a
    ``tool``, model calls. Each with its session and turn; times epoch ms."""
    limit = whole("limit", CALLS_LIMIT if limit is None else limit, 1, MAX_PAGE)
    found = reader(store)
    tool_rows = found.tool_calls(tool=tool, failed=failed, slowest=not failed, limit=limit)
    model_rows = [] if tool is not None else found.calls(failed=failed, slowest=not failed, limit=limit)
    if failed:
        model_rows.reverse()  # newest first, as the tool calls
    return {
        "tool": tool,
        "failed": failed,
        "limit": limit,
        "tool_calls": [
            json_safe({
                "session_id": r.session_id, "turn_id": r.turn_id, "agent": r.agent, "tool": r.tool, "call_id": r.call_id,
                "outcome": r.outcome or ("running" if r.end_index is None else r.status), "t": _ms(r.started_at or r.ended_at),
                "duration_ms": r.duration_ms, "error": r.error, "arguments": r.arguments, "index": r.start_index,
                "end_index": r.end_index,
            })
            for r in tool_rows
        ],
        "model_calls": [
            json_safe({
                "session_id": c.session_id, "turn_id": c.correlation_id, "agent": c.agent, "position": c.position,
                "model": c.response_model or c.request_model or c.model, "provider": c.provider, "outcome": c.outcome,
                "t": _ms(c.started_at), "duration_ms": c.duration_ms, "time_to_first_chunk_ms": c.time_to_first_chunk_ms,
                "cost_usd": c.cost_usd, "error_type": c.error_type, "error": c.error,
            })
            for c in model_rows
        ],
        "generated_at": now_ms(),
    }
