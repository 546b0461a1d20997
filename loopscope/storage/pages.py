"""The web dashboard's pages as the query API answers them (``Reader.page_*``), engine-neutral:
the bounds of their parameters, the error a bad one gives, the time ranges of the
analytics pages, and JSON's rule for NaN and infinity. Each engine reads the pages in its
own SQL (DuckDB: ``storage/duckdb/dashboard.py``); the answers are JSON-ready dicts whose
keys the dashboard's page reads (docs/dashboards.md)."""

from __future__ import annotations

import json
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


def page_args(limit: int | None, offset: int | None, default: int) -> tuple[int, int]:
    """A page's ``limit`` (``default`` when not given) and ``offset`` (0), each checked within
    its bound: an :class:`ApiError` names the one out of it."""
    return (whole("limit", default if limit is None else limit, 1, MAX_PAGE),
            whole("offset", 0 if offset is None else offset, 0, MAX_OFFSET))


def timeline_limit(limit: int | None, after_index: int | None, before_index: int | None) -> int:
    """A timeline page's ``limit``, once its cursor is checked: at most one of ``after_index``
    and ``before_index``, each a whole index within bounds (both engines' pages take them)."""
    if after_index is not None and before_index is not None:
        raise ApiError("after and before cannot be used together")
    limit, _ = page_args(limit, 0, TIMELINE_PAGE)
    if after_index is not None:
        whole("after", after_index, 0, MAX_INDEX)
    if before_index is not None:
        whole("before", before_index, 0, MAX_INDEX)
    return limit


def since(range_: str | None) -> float | None:
    """The start of a time range as epoch seconds; None for all time."""
    key = range_ or "all"
    if key not in RANGES:
        raise ApiError(f"unknown range {key!r}; one of {', '.join(RANGES)}")
    seconds = RANGES[key]
    return None if seconds is None else time.time() - seconds


def loads(text: str) -> Any:
    """Stored JSON text as a value an answer can hold: ``NaN``, ``Infinity`` and numbers
    too large for a float (which the store's JSON may hold) become ``None``."""
    return json.loads(text, parse_constant=_not_a_number, parse_float=_finite_float)


def json_or_text(text: Any) -> Any:
    """Stored JSON text parsed; text that is not JSON kept as it is; None as None."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def _not_a_number(name: str) -> None:
    return None


def _finite_float(text: str) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


def _clip(value: Any) -> tuple[Any, bool]:
    """``value``, or its text cut to :data:`MAX_CONTENT_CHARS`, and whether it was cut."""
    if value is None or isinstance(value, (bool, int, float)):
        return value, False
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if len(text) <= MAX_CONTENT_CHARS:
        return value, False
    return f"{text[:MAX_CONTENT_CHARS]}… [{len(text):,} characters in all]", True


def content_of(text: str | None, clip: bool) -> tuple[Any, bool]:
    """An event's stored ``content`` as the page shows it (a dict), its long texts cut when
    ``clip``; and whether one was cut. Every engine's timeline page uses it."""
    try:
        content = loads(text) if text else {}
    except ValueError:
        content = {"value": text}
    if not isinstance(content, dict):
        content = {"value": content}
    truncated = False
    if clip and text is not None and len(text) > MAX_CONTENT_CHARS:
        for key in ("body", "arguments", "result", "error", "value"):
            if key in content:
                content[key], cut = _clip(content[key])
                truncated = truncated or cut
    return content, truncated


def declared_page(rows: list[dict[str, Any]], range_: str | None) -> dict[str, Any]:
    """The declared-vs-used page from one row per (agent, tool) (``agent``, ``tool``,
    ``turns_declared``, ``calls``, ``turns_used``, ``agent_turns``), as both engines read them:
    grouped by agent, each tool marked never called (declared, no call) or undeclared (called,
    never offered)."""
    agents: dict[str, dict[str, Any]] = {}
    for row in rows:
        name = row.pop("agent")
        entry = agents.setdefault(name, {"agent": name or "(no agent)", "turns": row["agent_turns"], "tools": []})
        row.pop("agent_turns")
        row["never_called"] = row["turns_declared"] > 0 and row["calls"] == 0
        row["undeclared"] = row["turns_declared"] == 0
        entry["tools"].append(row)
    for entry in agents.values():
        entry["declared"] = sum(1 for t in entry["tools"] if t["turns_declared"])
        entry["never_called"] = sum(1 for t in entry["tools"] if t["never_called"])
    return {"range": range_ or "all", "agents": list(agents.values()), "generated_at": now_ms()}


__all__ = [
    "LIVE_SECONDS", "MAX_CONTENT_CHARS", "MAX_INDEX", "MAX_OFFSET", "MAX_PAGE", "RANGES", "TIMELINE_PAGE", "ApiError",
    "content_of", "declared_page", "json_or_text", "json_safe", "loads", "now_ms", "page_args", "since", "timeline_limit", "whole",
]
