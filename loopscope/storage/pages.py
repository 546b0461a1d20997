"""The web dashboard's pages as the query API answers them (``Reader.page_*``), engine-neutral:
the bounds of their parameters, the error a bad one gives, the time ranges of the
analytics pages, and JSON's rule for NaN and infinity. Each engine reads the pages in its
own SQL (DuckDB: ``storage/duckdb/dashboard.py``); the answers are JSON-ready dicts whose
keys the dashboard's page reads (docs/dashboards.md)."""

from __future__ import annotations

import math
import time
from typing import Any

MAX_CONTENT_CHARS = 20_000
"""A text, arguments or result longer than this is cut in a timeline page (``/api/event`` has it whole)."""

TIMELINE_PAGE = 300
MAX_PAGE = 2_000
MAX_OFFSET = 1_000_000_000
"""The largest ``offset`` of a sessions page."""
MAX_INDEX = 2**63 - 1
"""The largest event index (``after``, ``before``): the store's ``BIGINT``."""
LIVE_SECONDS = 30
"""A session whose last event is this recent is shown as live."""

RANGES: dict[str, float | None] = {"15m": 900, "1h": 3600, "24h": 86_400, "7d": 604_800, "30d": 2_592_000, "all": None}
"""Time ranges the analytics pages offer, in seconds (``all``: no limit)."""


class ApiError(ValueError):
    """A request the API cannot answer as asked (a bad parameter); the HTTP layer sends 400."""


def json_safe(value: Any) -> Any:
    """``value`` with every NaN and infinity in it (in lists, tuples and dicts too) made
    ``None``: JSON has neither. Values without one are returned as they are."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (list, tuple)):
        items = [json_safe(v) for v in value]
        return value if all(a is b for a, b in zip(items, value)) else items
    if isinstance(value, dict):
        out = {k: json_safe(v) for k, v in value.items()}
        return value if all(out[k] is v for k, v in value.items()) else out
    return value


def whole(name: str, value: Any, low: int, high: int) -> int:
    """``value`` if it is a whole number from ``low`` to ``high``; else an :class:`ApiError`."""
    if type(value) is not int or not low <= value <= high:
        raise ApiError(f"{name} must be a whole number from {low} to {high}")
    return value


def now_ms() -> int:
    return int(time.time() * 1000)


def since(range_: str | None) -> float | None:
    """The start of a time range as epoch seconds; None for all time."""
    key = range_ or "all"
    if key not in RANGES:
        raise ApiError(f"unknown range {key!r}; one of {', '.join(RANGES)}")
    seconds = RANGES[key]
    return None if seconds is None else time.time() - seconds


__all__ = [
    "LIVE_SECONDS", "MAX_CONTENT_CHARS", "MAX_INDEX", "MAX_OFFSET", "MAX_PAGE", "RANGES", "TIMELINE_PAGE", "ApiError",
    "json_safe", "now_ms", "since", "whole",
]
