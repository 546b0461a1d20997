"""A session as an AG-UI event stream (SSE), for any AG-UI client to replay.

The runs an import stored are written back verbatim from ``agui_events`` (an import
followed by an export gives the same events, byte for byte in their JSON). Turns that
loopscope recorded itself are synthesized from the activity log: one run per turn, in
the order of the turns' first events, built from the ``ag_ui.core`` models (so each
event validates) and encoded by ``ag_ui.encoder.EventEncoder``:

``RUN_STARTED`` (with the declared tools as the run's input) .. per row:
``TEXT_MESSAGE_START/CONTENT/END`` for a message, ``TOOL_CALL_START/ARGS/END`` for a tool
call's start, ``TOOL_CALL_RESULT`` for its end (outcome, status, error and duration in
``metadata.loopscope``), ``STATE_SNAPSHOT`` / ``STATE_DELTA`` for state rows, ``CUSTOM``
(named ``loopscope.<type>``) for any other row .. ``RUN_FINISHED`` (usage, cancelled
outcome) or ``RUN_ERROR``, with the turn's loop end reason in ``metadata.loopscope``.
A client accepts no event after ``RUN_ERROR``, so only a stream's last run ends in one;
an earlier failed turn ends in ``RUN_FINISHED`` whose metadata says it failed. A turn
still running has no final event yet (unless later runs follow it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import duckdb

from ...models import ActivityEvent, AIResponseEvent, TextContent, ToolCallContent
from ...storage.duckdb.connection import open_store
from ...storage.duckdb.store import Store
from ...storage.errors import StoreError
from .interpret import FRAMEWORK

__all__ = ["export_session", "iter_session", "session_events"]


def iter_session(
    session_id: str, path: str | None = None, *, run_id: str | None = None, lock_timeout: float = 10.0
) -> Iterator[str]:
    """The session's AG-UI events (only run ``run_id``'s, when given) as SSE chunks
    (``data: {...}\\n\\n``), one per event."""
    from ag_ui.encoder import EventEncoder

    raw, synthesized = session_events(session_id, path, run_id=run_id, lock_timeout=lock_timeout)
    for text in raw:
        yield f"data: {text}\n\n"  # exactly the framing EventEncoder gives
    encoder = EventEncoder()
    for event in synthesized:
        yield encoder.encode(event)


def export_session(
    session_id: str, path: str | None = None, *, run_id: str | None = None, lock_timeout: float = 10.0
) -> str:
    """The session (or its run ``run_id``) as one SSE text (see :func:`iter_session`)."""
    return "".join(iter_session(session_id, path, run_id=run_id, lock_timeout=lock_timeout))


def session_events(
    session_id: str, path: str | None = None, *, run_id: str | None = None, lock_timeout: float = 10.0
) -> tuple[list[str], list[Any]]:
    """The session's imported events (raw JSON texts, in order) and the ``ag_ui.core``
    events synthesized for the turns loopscope recorded itself; only those of run (turn)
    ``run_id`` when given."""
    store = Store(path, lock_timeout=lock_timeout)
    raw, imported_runs = _raw(store, session_id, run_id)
    events = [
        e for e in store.get_timeline(session_id)
        if not (e.correlation_id in imported_runs and e.source.framework == FRAMEWORK)
        and (run_id is None or e.correlation_id == run_id)
    ]
    turns = [
        t for t in store.list_turns(session_id, limit=None, correlation_id=run_id)
        if t.correlation_id not in imported_runs
    ]
    if not raw and not events and not turns:
        what = f"no run {run_id!r} in session {session_id!r}" if run_id is not None else f"no session {session_id!r}"
        raise StoreError(f"{what} in {store.path}")
    return raw, _synthesize(session_id, events, turns)


def _raw(store: Store, session_id: str, run_id: str | None) -> tuple[list[str], set[str | None]]:
    store._flush_own()
    with open_store(store.path, read_only=True, timeout=store.lock_timeout) as con:
        try:
            rows = con.execute(
                "SELECT run_id, raw FROM agui_events WHERE session_id = ? AND (? IS NULL OR run_id = ?) ORDER BY seq",
                [session_id, run_id, run_id],
            ).fetchall()
        except duckdb.CatalogException:  # a file from before AG-UI imports
            rows = []
    return [r[1] for r in rows], {r[0] for r in rows}


# -- synthesis ---------------------------------------------------------------------------------


def _ms(event: ActivityEvent) -> int:
    return int(event.created_at.timestamp() * 1000)


def _synthesize(session_id: str, events: list[ActivityEvent], turns: list[AIResponseEvent]) -> list[Any]:
    from ag_ui import core

    by_turn = {t.correlation_id: t for t in turns}
    groups: dict[str | None, list[ActivityEvent]] = {}
    for event in events:
        groups.setdefault(event.correlation_id, []).append(event)
    starts: dict[str | None, int] = {key: _ms(rows[0]) for key, rows in groups.items()}
    for turn in turns:
        if turn.correlation_id not in groups:
            groups[turn.correlation_id] = []
            starts[turn.correlation_id] = int(turn.timestamp.timestamp() * 1000 - turn.latency_ms)
    out: list[Any] = []
    order = sorted(groups, key=lambda k: starts[k])
    for number, key in enumerate(order, 1):
        turn = by_turn.get(key)
        last = number == len(order)
        run_id = key or f"loopscope-run-{number}"
        run_input = None
        if turn is not None and turn.declared_tools:
            run_input = core.RunAgentInput(
                thread_id=session_id, run_id=run_id, messages=[],
                tools=[
                    core.Tool(name=t.name, description=t.description or "", parameters=t.parameters)
                    for t in turn.declared_tools
                ],
            )
        out.append(core.RunStartedEvent(
            thread_id=session_id, run_id=run_id, parent_run_id=turn.parent_correlation_id if turn else None,
            input=run_input, timestamp=starts[key],
        ))
        for event in groups[key]:
            out += _rows(core, event)
        if turn is not None:
            out.append(_final(core, session_id, run_id, turn, last))
        elif not last:  # a turn without a summary (still running when it was read): the next run may start
            out.append(core.RunFinishedEvent(thread_id=session_id, run_id=run_id, metadata={"loopscope": {"loop_end_reason": None}}))
    return out


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _rows(core: Any, event: ActivityEvent) -> list[Any]:
    ts = _ms(event)
    content = event.content
    if isinstance(content, TextContent):
        role = content.role if content.role in ("developer", "system", "assistant", "user") else "assistant"
        return [
            core.TextMessageStartEvent(message_id=event.id, role=role, timestamp=ts),
            core.TextMessageContentEvent(message_id=event.id, delta=content.body, timestamp=ts),
            core.TextMessageEndEvent(message_id=event.id, timestamp=ts),
        ]
    if isinstance(content, ToolCallContent) and event.type == "tool_call_start":
        rows = [core.ToolCallStartEvent(tool_call_id=content.tool_id, tool_call_name=content.tool_name, timestamp=ts)]
        if content.arguments is not None:
            delta = _text(content.arguments)
            rows.append(core.ToolCallArgsEvent(tool_call_id=content.tool_id, delta=delta, timestamp=ts))
        rows.append(core.ToolCallEndEvent(tool_call_id=content.tool_id, timestamp=ts))
        return rows
    if isinstance(content, ToolCallContent):
        facts = {
            "outcome": content.outcome, "status": content.status, "error": content.error,
            "duration_ms": content.duration_ms,
        }
        result = _text(content.result) if content.result is not None else (content.error or "")
        return [core.ToolCallResultEvent(
            message_id=event.id, tool_call_id=content.tool_id, content=result, role="tool", timestamp=ts,
            metadata={"loopscope": {k: v for k, v in facts.items() if v is not None}},
        )]
    data = content if isinstance(content, dict) else content.model_dump(mode="json")
    if event.type == "state_snapshot" and "snapshot" in data:
        return [core.StateSnapshotEvent(snapshot=data["snapshot"], timestamp=ts)]
    if event.type == "state_delta" and isinstance(data.get("delta"), list):
        return [core.StateDeltaEvent(delta=data["delta"], timestamp=ts)]
    return [core.CustomEvent(name=f"loopscope.{event.type}", value=data, timestamp=ts)]


_USAGE = {
    "input_tokens": "input_tokens",
    "output_tokens": "output_tokens",
    "cache_read_input_tokens": "cached_input_tokens",
    "cache_creation_input_tokens": "cache_write_input_tokens",
    "reasoning_tokens": "reasoning_tokens",
}


def _final(core: Any, session_id: str, run_id: str, turn: AIResponseEvent, last: bool) -> Any:
    """The run's last event. A client accepts no event after RUN_ERROR, so only the last
    run of a stream ends so; an earlier failed turn ends in RUN_FINISHED whose
    ``metadata.loopscope`` says it failed and why (as every synthesized end says its
    loop end reason)."""
    ts = int(turn.timestamp.timestamp() * 1000)
    counts = {
        theirs: turn.usage[ours] for ours, theirs in _USAGE.items()
        if isinstance(turn.usage.get(ours), int) and turn.usage[ours] >= 0
    }
    usage = [core.TokenUsage(provider=turn.provider, model=turn.model, **counts)] if counts else None
    reason = turn.loop_end_reason.value if turn.loop_end_reason is not None else None
    said: dict[str, Any] = {"loop_end_reason": reason}
    if turn.error:
        said["error"] = turn.error
    metadata = {"loopscope": said}
    if reason == "error" and last:
        return core.RunErrorEvent(message=turn.error or "error", usage=usage, timestamp=ts, metadata=metadata)
    outcome = core.RunFinishedCancelledOutcome() if reason == "cancelled" else None
    return core.RunFinishedEvent(
        thread_id=session_id, run_id=run_id, outcome=outcome, usage=usage, timestamp=ts, metadata=metadata
    )
