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
        return clauses, params


RECEIVED = EventFilter()
"""The default read: every delivered row, no blocked one."""
