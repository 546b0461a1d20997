"""Kept so that ``loopscope.dashboards.views`` (which README names) still imports: the SQL
views are SQL over the store, and live in :mod:`loopscope.storage.views`."""

from __future__ import annotations

from ..storage.views import (
    DECLARED_VS_USED, LOOP_END_REASONS, OUTCOMES, SLOWEST_TURNS, TOKEN_USAGE, TOOL_CALLS, TOOL_COLUMNS, TOOL_STATS,
    TURN_SUMMARIES, VIEWS, create_statements, tool_rows, views,
)

__all__ = [
    "DECLARED_VS_USED", "LOOP_END_REASONS", "OUTCOMES", "SLOWEST_TURNS", "TOKEN_USAGE", "TOOL_CALLS", "TOOL_COLUMNS", "TOOL_STATS",
    "TURN_SUMMARIES", "VIEWS", "create_statements", "tool_rows", "views",
]
