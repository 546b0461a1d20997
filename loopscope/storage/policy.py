"""Which events are stored, and which rows a read serves."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum


def _names(types: Iterable[str | Enum] | None) -> frozenset[str] | None:
    if types is None:
        return None
    return frozenset(t.value if isinstance(t, Enum) else str(t) for t in types)


@dataclass(frozen=True)
class PersistencePolicy:
    """Which event types are written to the store.

    ``persist_types=None`` stores every type; ``exclude_types`` always wins. An excluded
    type is still recorded as a span (and exported), just not stored.
    """

    persist_types: Iterable[str | Enum] | None = None
    exclude_types: Iterable[str | Enum] = field(default_factory=set)

    def __post_init__(self) -> None:
        object.__setattr__(self, "persist_types", _names(self.persist_types))
        object.__setattr__(self, "exclude_types", _names(self.exclude_types) or frozenset())

    def allows(self, event_type: str) -> bool:
        if event_type in self.exclude_types:  # type: ignore[operator]
            return False
        return self.persist_types is None or event_type in self.persist_types  # type: ignore[operator]


@dataclass(frozen=True)
class EventFilter:
    """Narrows a read to some events. Blocked rows are served only with ``include_blocked``."""

    event_types: Iterable[str | Enum] | None = None
    exclude_types: Iterable[str | Enum] | None = None
    correlation_id: str | None = None
    source_channel_id: str | None = None
    source_provider: str | None = None
    source_framework: str | None = None
    after_time: datetime | None = None
    before_time: datetime | None = None
    include_blocked: bool = False
    tool_name: str | None = None
    """Only the rows of this tool's calls (their starts and ends)."""
    failed: bool = False
    """Only the ends of tool calls that were not served (failed, refused, blocked, ...)."""
    text: str | None = None
    """Only the rows whose content holds this text, any case: a message's text, a tool's
    name, arguments, result or error (:data:`EVENT_TEXT`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "event_types", _names(self.event_types))
        object.__setattr__(self, "exclude_types", _names(self.exclude_types))

    def where(self) -> tuple[list[str], list[object]]:
        """SQL conditions (joined with AND) and their parameters."""
        clauses: list[str] = []
        params: list[object] = []
        if not self.include_blocked:
            clauses.append("status <> 'blocked'")
        if self.event_types is not None:
            clauses.append("list_contains(?, type)")
            params.append(sorted(self.event_types))  # type: ignore[arg-type]
        if self.exclude_types:
            clauses.append("NOT list_contains(?, type)")
            params.append(sorted(self.exclude_types))  # type: ignore[arg-type]
        for column in ("correlation_id", "source_channel_id", "source_provider", "source_framework"):
            value = getattr(self, column)
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if self.after_time is not None:
            clauses.append("created_at > ?")
            params.append(self.after_time)
        if self.before_time is not None:
            clauses.append("created_at < ?")
            params.append(self.before_time)
        if self.tool_name is not None:
            clauses.append("json_extract_string(content, '$.tool_name') = ?")
            params.append(self.tool_name)
        if self.failed:
            clauses.append(f"type = 'tool_call_end' AND {TOOL_NOT_SERVED}")
        if self.text:
            clauses.append(f"contains(lower({EVENT_TEXT}), ?)")
            params.append(self.text.lower())
        return clauses, params


# -- what content search reads (issue 35) ---------------------------------------------------------

EVENT_TEXT = (
    "concat_ws(chr(31), json_extract_string(content, '$.body'), json_extract_string(content, '$.tool_name'), "
    "CAST(json_extract(content, '$.arguments') AS VARCHAR), CAST(json_extract(content, '$.result') AS VARCHAR), "
    "json_extract_string(content, '$.error'))"
)
"""An event's searchable text (SQL over ``events.content``): a message's text, a tool
call's name, arguments (JSON text), result (JSON text) and error, one string. Content
search is a case-insensitive scan of it (``contains(lower(...), needle)``): no index
(docs/cli.md, "Search")."""

TOOL_NOT_SERVED = (
    "coalesce(json_extract_string(content, '$.outcome'), "
    "CASE WHEN json_extract_string(content, '$.status') = 'completed' THEN 'served' END, 'failed') <> 'served'"
)
"""A tool call's end row whose call was not served (SQL over ``events.content``): what
``tool_stats`` counts as a failure (ended other than served)."""


RECEIVED = EventFilter()
"""The default read: every delivered row, no blocked one."""


@dataclass(frozen=True)
class TurnFilter:
    """Narrows a turn read (``loopscope turns --reason --model --agent --since --min-cost
    --search``): every field given must hold."""

    agent: str | None = None
    reason: str | None = None
    """The loop end reason (``completed``, ``max_rounds``, ...)."""
    model: str | None = None
    since: datetime | None = None
    """Turns that ended at or after this time."""
    min_cost: float | None = None
    """Turns that cost at least this many USD (a turn without a price never matches)."""
    text: str | None = None
    """Turns one of whose events or model calls holds this text (the content search)."""
