"""Ways to look at a store: terminal tables now; SQL views and a web dashboard to come."""

from __future__ import annotations

from .tables import Column, events_table, render, sessions_table, sql_table, truncate, turns_table

__all__ = ["Column", "events_table", "render", "sessions_table", "sql_table", "truncate", "turns_table"]
