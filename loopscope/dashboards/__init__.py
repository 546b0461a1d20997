"""Ways to look at a store: terminal tables, SQL views, the web dashboard (``web/``,
served by ``loopscope ui``) and a Grafana dashboard over the OTLP export (``grafana/``)."""

from __future__ import annotations

from .tables import Column, events_table, render, sessions_table, sql_table, truncate, turns_table

__all__ = ["Column", "events_table", "render", "sessions_table", "sql_table", "truncate", "turns_table"]
