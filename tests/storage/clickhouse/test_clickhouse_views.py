"""The DuckDB store's SQL views (docs/sql-views.md) answer the same rows on ClickHouse (chDB), by the
same names and columns: one recording (test_engines_agree.py's dataset) in both engines, each view
read through ``open_reader(...).sql`` on both and compared row by row (in a key's order; floats to the
microsecond, times as instants, JSON as values), and ``loopscope sql "SELECT * FROM tool_stats"`` run
on both stores. What ClickHouse has no data for (costs, a call's request parameters) is NULL there."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from datetime import date, datetime, timezone
from typing import Any

import pytest
from test_engines_agree import ENGINES, recorded  # noqa: F401  (the module's dataset: a fixture)

from loopscope.storage.clickhouse.views import VIEWS
from loopscope.storage.duckdb.views import VIEWS as DUCKDB_VIEWS
from loopscope.storage.queries import open_reader, prepare

pytestmark = pytest.mark.stack("clickhouse")

# each view's rows in an order both engines give alike (a view's own order ties on some rows)
KEYS = {
    "tool_calls": "session_id, started_at, call_id",
    "turn_summaries": "session_id, started_at, turn_id",
    "tool_stats": "tool",
    "loop_end_reasons": "day, loop_end_reason",
    "declared_vs_used": "agent, tool",
    "token_usage": "session_id, model",
    "slowest_turns": "rank",
    "model_call_summaries": "session_id, started_at, span_id",
    "model_usage": "provider, model",
    "session_costs": "session_id",
    "cost_totals": "model_calls",
    "score_targets": "id",
    "scores_over_time": "day, name, target, agent, model, tool",
}
SCORED = {"score_targets", "scores_over_time"}
"""Views empty in this recording (no scores): test_clickhouse_scores.py compares them."""

# no prices on ClickHouse (every call that used tokens is unpriced), no request parameters
PRICELESS = {"cost_usd", "price_source", "unpriced", "unpriced_calls", "parameters"}
JSON_COLUMNS = {"arguments", "result", "finish_reasons", "provider_usage", "input_messages", "output_messages"}


def _value(name: str, value: Any) -> Any:
    """A cell as both engines should agree on it."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, float):
        return None if math.isnan(value) else pytest.approx(value, abs=2e-3)
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)
    if isinstance(value, date):
        return value
    if name in JSON_COLUMNS and isinstance(value, str):
        return json.loads(value)
    if isinstance(value, (list, tuple)):
        return [_value(name, v) for v in value]
    return int(value) if hasattr(value, "__index__") else value


def _rows(reader: Any, view: str) -> tuple[list[str], list[dict[str, Any]]]:
    names, rows = reader.sql(f"SELECT * FROM {view} ORDER BY {KEYS[view]}")
    return names, [{n: _value(n, v) for n, v in zip(names, row) if n not in PRICELESS} for row in rows]


@pytest.fixture(params=ENGINES)
def readers(request: pytest.FixtureRequest, recorded: dict[str, Any]) -> Any:  # noqa: F811
    ch = open_reader(recorded[request.param])
    try:
        yield open_reader(recorded["duckdb"]), ch
    finally:
        ch.close()  # type: ignore[attr-defined]


def test_every_duckdb_view_has_a_clickhouse_view_of_the_same_rows(readers: tuple[Any, Any]) -> None:
    duck, ch = readers
    assert list(VIEWS) == list(DUCKDB_VIEWS)
    for view in VIEWS:
        duck_names, expected = _rows(duck, view)
        names, found = _rows(ch, view)
        assert names == duck_names, view  # the same columns, in the same order
        assert expected or view in SCORED, view  # the recording gives every other view rows to compare
        assert found == expected, view
    # what ClickHouse has no data for is NULL, and every call that used tokens is unpriced
    names, rows = ch.sql("SELECT cost_usd, price_source, parameters, unpriced, total_tokens FROM model_call_summaries")
    assert rows and all(r[:3] == (None, None, None) and r[3] == (r[4] is not None) for r in rows)
    _, [(cost, unpriced, calls_with_tokens)] = ch.sql(
        "SELECT cost_usd, unpriced_calls, (SELECT countIf(unpriced) FROM model_call_summaries) FROM cost_totals")
    assert cost is None and unpriced == calls_with_tokens > 0
    _, turns = ch.sql("SELECT sum(unpriced_calls), countIf(cost_usd IS NULL), count() FROM turn_summaries")
    assert turns == [(calls_with_tokens, 6, 6)]
    # a filter on a view reaches its tables' reads (a range of their sort keys): one session's calls
    # read that session's tool calls and numbers that session's timeline rows only
    _, one = ch.sql("SELECT DISTINCT session_id FROM tool_calls WHERE session_id = {s:String}", {"s": "beta"})
    assert one == [("beta",)]
    _, plan = ch.sql("EXPLAIN indexes = 1 SELECT * FROM tool_calls WHERE session_id = 'beta'")
    plan_text = "\n".join(str(r[0]) for r in plan)
    assert plan_text.count("Condition: (session_id in ['beta', 'beta'])") == 2, plan_text
    # plain views, read when asked: no insert into otel_traces feeds them (its dependents are the
    # materialized views that fill the derived tables, as before)
    names_sql = ", ".join(f"'{name}'" for name in VIEWS)
    _, kinds = ch.sql(f"SELECT name, engine FROM system.tables WHERE database = currentDatabase() AND name IN ({names_sql})")
    assert sorted(kinds) == sorted((name, "View") for name in VIEWS)
    _, [(dependents,)] = ch.sql("SELECT dependencies_table FROM system.tables "
                                "WHERE database = currentDatabase() AND name = 'otel_traces'")
    assert dependents and all(name.endswith("_mv") for name in dependents)


def test_loopscope_sql_answers_the_same_tool_stats_on_both_engines(recorded: dict[str, Any]) -> None:  # noqa: F811
    def cli(db: str) -> list[dict[str, Any]]:
        done = subprocess.run([sys.executable, "-m", "loopscope", "sql", "SELECT * FROM tool_stats", "--db", db, "--json"],
                              check=False, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    assert prepare(recorded["chdb"]) == recorded["chdb"]  # prepare again: the views replaced, the data kept
    expected, found = cli(recorded["duckdb"]), cli(recorded["chdb"])
    assert [list(r) for r in found] == [list(r) for r in expected]
    assert [r["tool"] for r in found] == [r["tool"] for r in expected] == ["lookup", "convert"]
    for got, want in zip(found, expected):
        for name, value in want.items():
            assert got[name] == (pytest.approx(value, abs=2e-3) if isinstance(value, float) else value), name
