"""Stored rows as the public models: an ``events`` row as an :class:`ActivityEvent`, a
``turns`` row as an :class:`AIResponseEvent` (the store's reads and replays share them),
a ``model_call_summaries`` row as a :class:`ModelCall`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ...models import ActivityEvent, AIResponseEvent, EventSource, EventStatus, ModelCall, TextContent, ToolCallContent
from .reads import TURN_NAMES, call_row

EVENT_COLUMNS = (
    "id, session_id, idx, type, created_at, correlation_id, source_channel_id, source_provider, "
    "source_framework, status, content, trace_id, span_id"
)
"""The ``events`` columns :func:`event_of` reads, in its order."""
ID_AT, CONTENT_AT = 0, 10
"""Where :data:`EVENT_COLUMNS` has ``id`` and ``content`` (:func:`~loopscope.storage.duckdb.values.fill`)."""


def _content(text: str | None) -> Any:
    data = json.loads(text) if text else {}
    kind = data.get("type") if isinstance(data, dict) else None
    if kind == "tool_call":
        return ToolCallContent.model_validate(data)
    if kind == "text":
        return TextContent.model_validate(data)
    return data if isinstance(data, dict) else {"value": data}


def event_of(row: Sequence[Any]) -> ActivityEvent:
    """An ``events`` row (:data:`EVENT_COLUMNS`) as an :class:`ActivityEvent`."""
    return ActivityEvent(
        id=row[0],
        session_id=row[1],
        index=row[2],
        type=row[3],
        created_at=row[4],
        correlation_id=row[5],
        source=EventSource(channel_id=row[6], provider=row[7], framework=row[8]),
        status=EventStatus(row[9]),
        content=_content(row[10]),
        trace_id=row[11],
        span_id=row[12],
    )


def turn_of(row: Sequence[Any]) -> AIResponseEvent:
    """A ``turns`` row (:data:`~loopscope.storage.duckdb.reads.TURN_COLUMNS`) as an :class:`AIResponseEvent`."""
    data = dict(zip(TURN_NAMES, row))
    for key in ("segments", "usage", "declared_tools"):
        data[key] = json.loads(data[key]) if data[key] else None
    return AIResponseEvent.model_validate({k: v for k, v in data.items() if v is not None})


def call_of(row: Sequence[Any]) -> ModelCall:
    """A ``model_call_summaries`` row (:data:`~loopscope.storage.duckdb.reads.CALL_COLUMNS`) as a
    :class:`ModelCall`: :func:`~loopscope.storage.duckdb.reads.call_row`'s fields, validated."""
    return ModelCall.model_validate({k: v for k, v in call_row(row)._asdict().items() if v is not None})
