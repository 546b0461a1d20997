"""The analytics views in the store: their numbers against values computed in Python from
the base tables, their presence in every file, and the migration of older files."""

from __future__ import annotations

import collections
import json
import math
from pathlib import Path
from typing import Any

import duckdb
import pytest

import analytics_store as workload
import loopscope
import recorded
from loopscope.storage.duckdb.schema import MIGRATIONS, SCHEMA_VERSION, migrate, schema_version
from loopscope.storage.duckdb.views import OUTCOMES, VIEWS, views
from recorded import connect_when_free


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("views") / "store.duckdb"
    workload.record(path)
    return path


def query(db: Path, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
    """Rows as dicts, read with plain duckdb: no loopscope code at query time (waiting while a
    writer process left finishing by the close's bound still holds the file)."""
    con = recorded.connect_when_free(db)
    try:
        cursor = con.execute(sql, params or [])
        names = [d[0] for d in cursor.description]
        return [dict(zip(names, row)) for row in cursor.fetchall()]
    finally:
        con.close()


# -- every file has them --------------------------------------------------------------------------


def rounded(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: round(v, 9) if isinstance(v, float) and math.isfinite(v) else v for k, v in r.items()} for r in rows]


def test_the_writer_creates_every_view(db: Path) -> None:
    names = {r["view_name"] for r in query(db, "SELECT view_name FROM duckdb_views() WHERE NOT internal")}
    assert names == set(VIEWS)
    assert query(db, "SELECT value FROM loopscope_meta WHERE key = 'schema_version'")[0]["value"] == str(SCHEMA_VERSION)


def test_views_read_from_an_attached_file_without_use(db: Path) -> None:
    con = duckdb.connect()
    try:
        con.execute(f"ATTACH '{db}' AS store (READ_ONLY)")
        assert con.execute("SELECT sum(calls) FROM store.tool_stats").fetchone()[0] == 21
        assert con.execute("SELECT count(*) FROM store.declared_vs_used").fetchone()[0] > 0
    finally:
        con.close()


# -- tool_calls -------------------------------------------------------------------------------------


def test_tool_calls_one_row_per_call_with_its_start_and_end(db: Path) -> None:
    rows = query(db, "SELECT * FROM tool_calls")
    events = workload.tool_rows(db)
    ends = {e["tool_id"]: e for e in events if e["type"] == "tool_call_end"}
    starts = {e["tool_id"]: e for e in events if e["type"] == "tool_call_start"}
    assert len(rows) == len(starts) == len(ends) == 21
    by_id = {r["call_id"]: r for r in rows}
    assert set(by_id) == set(ends)
    for call_id, end in ends.items():
        row = by_id[call_id]
        assert row["tool"] == end["tool_name"]
        assert row["session_id"] == end["session_id"] and row["turn_id"] == end["turn_id"]
        assert row["agent"] == end["agent"]
        assert row["status"] == end["status"] and row["outcome"] == end["outcome"]
        assert row["duration_ms"] == pytest.approx(end["duration_ms"])
        assert row["error"] == end["error"]
        assert json.loads(row["arguments"]) == end["arguments"]
        assert (json.loads(row["result"]) if row["result"] is not None else None) == end["result"]
        assert row["started_at"] == starts[call_id]["created_at"] and row["ended_at"] == end["created_at"]
        assert row["start_index"] < row["end_index"]
    outcomes = collections.Counter(r["outcome"] for r in rows)
    assert outcomes == {"served": 16, "failed": 1, "refused": 1, "blocked": 1, "unserved": 1, "cancelled": 1}
    assert by_id["c2"]["error"].startswith("ConnectionError")
    assert by_id["c5"]["outcome"] == "unserved" and by_id["c7"]["outcome"] == "blocked"
    assert by_id["c7"]["result"] is not None  # a blocked result is kept for audit
    assert by_id["c2"]["result"] is None  # JSON null is SQL NULL


def test_tool_calls_filtered_by_session_reads_that_session(db: Path) -> None:
    rows = query(db, "SELECT call_id FROM tool_calls WHERE session_id = 'sch-1' ORDER BY call_id")
    assert [r["call_id"] for r in rows] == ["c8", "c9"]


def test_a_running_call_is_pending(recording: Any) -> None:
    with loopscope.turn(session_id="live", agent="a", tools=[{"name": "slow"}, {"name": "fast"}]) as turn:
        turn.generation("go", tool_calls=[{"id": "f1", "name": "fast", "arguments": {}}])
        with loopscope.tool("fast", call_id="f1"):
            pass
        with loopscope.tool("slow", arguments={"n": 1}, call_id="s1"):
            names, rows = recording.store.sql("SELECT call_id, status, outcome, ended_at, duration_ms FROM tool_calls ORDER BY call_id")
            assert [dict(zip(names, r)) for r in rows] == [
                {"call_id": "f1", "status": "completed", "outcome": "served", "ended_at": rows[0][3], "duration_ms": rows[0][4]},
                {"call_id": "s1", "status": "pending", "outcome": None, "ended_at": None, "duration_ms": None},
            ]
            names, rows = recording.store.sql("SELECT tool, calls, pending, finished FROM tool_stats ORDER BY tool")
            assert rows == [("fast", 1, 0, 1), ("slow", 1, 1, 0)]
    names, rows = recording.store.sql("SELECT call_id, status FROM tool_calls ORDER BY call_id")
    assert rows == [("f1", "completed"), ("s1", "completed")]


# -- tool_stats -------------------------------------------------------------------------------------


def test_tool_stats_against_python(db: Path) -> None:
    events = workload.tool_rows(db)
    stats = {r["tool"]: r for r in query(db, "SELECT * FROM tool_stats")}
    tools = {e["tool_name"] for e in events}
    assert set(stats) == tools == {"lookup_order", "refund", "escalate", "search", "fetch", "book"}
    for tool in tools:
        ends = [e for e in events if e["tool_name"] == tool and e["type"] == "tool_call_end"]
        starts = [e for e in events if e["tool_name"] == tool and e["type"] == "tool_call_start"]
        row = stats[tool]
        assert row["calls"] == len(starts) and row["finished"] == len(ends) and row["pending"] == 0
        counts = collections.Counter(e["outcome"] for e in ends)
        for outcome in OUTCOMES:
            assert row[outcome] == counts.get(outcome, 0), (tool, outcome)
            assert row[f"{outcome}_share"] == pytest.approx(counts.get(outcome, 0) / len(ends))
        assert row["failure_share"] == pytest.approx(1 - counts.get("served", 0) / len(ends))
        durations = [e["duration_ms"] for e in ends]
        assert row["avg_ms"] == pytest.approx(sum(durations) / len(durations))
        assert row["max_ms"] == pytest.approx(max(durations))
        for q, column in ((0.5, "p50_ms"), (0.95, "p95_ms"), (0.99, "p99_ms")):
            assert row[column] == pytest.approx(workload.percentile(durations, q)), (tool, column)
        assert row["last_seen"] == max(e["created_at"] for e in events if e["tool_name"] == tool)
        assert row["first_seen"] == min(e["created_at"] for e in events if e["tool_name"] == tool)
        assert row["agents"] == 1
    assert stats["lookup_order"]["calls"] == 14
    assert next(r["tool"] for r in query(db, "SELECT tool FROM tool_stats")) == "lookup_order"  # most called first


# -- turns ------------------------------------------------------------------------------------------


def test_turn_summaries_flatten_the_turns(db: Path) -> None:
    turns = query(db, "SELECT * FROM turns")
    flat = {r["turn_id"]: r for r in query(db, "SELECT * FROM turn_summaries")}
    assert len(flat) == len(turns) == workload.TURNS
    for t in turns:
        row = flat[t["correlation_id"]]
        usage = json.loads(t["usage"])
        declared = json.loads(t["declared_tools"])
        assert row["session_id"] == t["session_id"] and row["agent"] == t["channel_id"]
        assert row["input_tokens"] == usage.get("input_tokens") and row["output_tokens"] == usage.get("output_tokens")
        for key in ("cache_read_input_tokens", "cache_creation_input_tokens", "reasoning_tokens"):
            assert row[key] == usage.get(key)
        assert row["total_tokens"] == usage.get("input_tokens", 0) + usage.get("output_tokens", 0)
        assert row["declared_tools"] == [d["name"] for d in declared]
        assert row["declared_tool_count"] == len(declared)
        assert row["rounds"] == t["round_count"] and row["tool_calls"] == t["tool_calls_count"]
        assert row["loop_end_reason"] == t["loop_end_reason"] and row["ended_at"] == t["timestamp"]
        assert (row["ended_at"] - row["started_at"]).total_seconds() * 1000 == pytest.approx(t["latency_ms"], abs=0.01)
        assert row["model"] == t["model"] and row["provider"] == t["provider"]
    sup1 = next(r for r in flat.values() if r["session_id"] == "sup-1" and r["loop_end_reason"] == "completed")
    assert (sup1["cache_read_input_tokens"], sup1["reasoning_tokens"]) == (40, 5)
    error = next(r for r in flat.values() if r["loop_end_reason"] == "error")
    assert "context window exceeded" in error["error"]


def test_loop_end_reasons_per_day(db: Path) -> None:
    turns = query(db, "SELECT timezone('UTC', timestamp)::DATE AS day, loop_end_reason FROM turns")
    expected = collections.Counter((t["day"], t["loop_end_reason"]) for t in turns)
    per_day = collections.Counter(t["day"] for t in turns)
    rows = query(db, "SELECT * FROM loop_end_reasons")
    assert {(r["day"], r["loop_end_reason"]): r["turns"] for r in rows} == expected
    for r in rows:
        assert r["share"] == pytest.approx(r["turns"] / per_day[r["day"]])
    assert sum(r["turns"] for r in rows) == workload.TURNS
    assert collections.Counter({r["loop_end_reason"]: r["turns"] for r in rows}) == workload.REASONS


def test_declared_vs_used(db: Path) -> None:
    rows = {(r["agent"], r["tool"]): r for r in query(db, "SELECT * FROM declared_vs_used")}
    turns = query(db, "SELECT channel_id AS agent, correlation_id, declared_tools FROM turns")
    events = workload.tool_rows(db)
    calls = collections.Counter((e["agent"], e["tool_name"]) for e in events if e["type"] == "tool_call_start")
    used_turns = collections.defaultdict(set)
    for e in events:
        used_turns[(e["agent"], e["tool_name"])].add(e["turn_id"])
    offered = collections.defaultdict(set)
    for t in turns:
        for d in json.loads(t["declared_tools"]):
            offered[(t["agent"], d["name"])].add(t["correlation_id"])
    assert set(rows) == set(offered)
    for key, row in rows.items():
        assert row["turns_offered"] == len(offered[key])
        assert row["turns_used"] == len(offered[key] & used_turns[key])
        assert row["calls"] == calls.get(key, 0)
        assert row["use_share"] == pytest.approx(row["turns_used"] / row["turns_offered"])
        assert row["undeclared_calls"] == 0
    never = {key for key, row in rows.items() if row["calls"] == 0}
    assert never == workload.NEVER_CALLED
    assert rows[("support", "translate")]["turns_offered"] == 4
    ordered = query(db, "SELECT agent, tool FROM declared_vs_used WHERE agent = 'support'")
    assert ordered[0]["tool"] == "translate"  # least used first


def test_declared_vs_used_counts_calls_of_tools_never_declared(recording: Any) -> None:
    with loopscope.turn(session_id="u", agent="ad-hoc", tools=[{"name": "known"}]) as turn:
        turn.generation("x", tool_calls=[{"id": "k1", "name": "secret", "arguments": {}}])
        with loopscope.tool("secret", call_id="k1"):
            pass
        turn.generation("done")
    _names, rows = recording.store.sql("SELECT tool, turns_offered, calls, undeclared_calls, use_share FROM declared_vs_used ORDER BY tool")
    assert rows == [("known", 1, 0, 0, 0.0), ("secret", 0, 1, 1, None)]


def test_token_usage_per_session_and_model(db: Path) -> None:
    turns = query(db, "SELECT session_id, model, usage FROM turns")
    expected: dict[tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
    for t in turns:
        expected[(t["session_id"], t["model"])].update(json.loads(t["usage"]))
        expected[(t["session_id"], t["model"])]["turns"] += 1
    rows = {(r["session_id"], r["model"]): r for r in query(db, "SELECT * FROM token_usage")}
    assert set(rows) == set(expected)
    for key, row in rows.items():
        want = expected[key]
        assert row["turns"] == want["turns"]
        for column in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens", "reasoning_tokens"):
            assert (row[column] or 0) == want.get(column, 0), (key, column)
        assert row["total_tokens"] == want["input_tokens"] + want["output_tokens"]


def test_slowest_turns_ranked_by_latency(db: Path) -> None:
    rows = query(db, "SELECT * FROM slowest_turns")
    latencies = [r["latency_ms"] for r in rows]
    assert latencies == sorted(latencies, reverse=True)
    assert [r["rank"] for r in rows] == list(range(1, workload.TURNS + 1))
    assert rows[0]["turn_id"] == query(db, "SELECT correlation_id FROM turns ORDER BY latency_ms DESC LIMIT 1")[0]["correlation_id"]


# -- older files ------------------------------------------------------------------------------------


def make_v1(source: Path, target: Path) -> None:
    """A copy of ``source`` as loopscope 0.1 (schema 1, no views) left it."""
    con = duckdb.connect(str(target))
    try:
        for statement in MIGRATIONS[0].statements():
            con.execute(statement)
        con.execute(f"ATTACH '{source}' AS src (READ_ONLY)")
        for table in ("events", "turns", "sessions"):
            # the columns schema 1 has (later migrations added some to events)
            columns = [r[0] for r in con.execute(
                "SELECT column_name FROM duckdb_columns() WHERE database_name = current_database() AND table_name = ? ORDER BY column_index",
                [table]).fetchall()]
            con.execute(f"INSERT INTO main.{table} SELECT {', '.join(columns)} FROM src.{table}")
        con.execute("DETACH src")
        con.execute("INSERT INTO loopscope_meta VALUES ('schema_version', '1')")
    finally:
        con.close()


def test_a_v1_file_is_read_with_views_and_left_unchanged(db: Path, tmp_path: Path) -> None:
    old = tmp_path / "v1.duckdb"
    make_v1(db, old)
    before = old.read_bytes()
    store = loopscope.Store(str(old))
    _names, rows = store.sql("SELECT sum(calls), sum(failed) FROM tool_stats")
    assert rows == [(21, 1)]
    assert len(store.list_events("sup-1")) == query(db, "SELECT count(*) AS n FROM events WHERE session_id = 'sup-1'")[0]["n"]
    assert old.read_bytes() == before
    con = connect_when_free(old)
    try:
        assert schema_version(con) == 1
        assert con.execute("SELECT count(*) FROM duckdb_views() WHERE NOT internal").fetchone()[0] == 0
    finally:
        con.close()


def test_migrating_a_v1_file(db: Path, tmp_path: Path) -> None:
    old = tmp_path / "v1.duckdb"
    make_v1(db, old)
    con = duckdb.connect(str(old))
    try:
        assert migrate(con) == 1
        assert schema_version(con) == SCHEMA_VERSION
        assert migrate(con) == SCHEMA_VERSION  # nothing left to do
    finally:
        con.close()
    for view in VIEWS:
        if view in views(model_calls=False):
            assert query(old, f"SELECT count(*) AS n FROM {view}") == query(db, f"SELECT count(*) AS n FROM {view}")
        elif view in ("model_call_summaries", "model_usage"):  # the v1 copy holds no model calls
            assert query(old, f"SELECT count(*) AS n FROM {view}") == [{"n": 0}]
        else:  # per session, or one row of totals
            assert query(old, f"SELECT count(*) AS n FROM {view}") == query(db, f"SELECT count(*) AS n FROM {view}")
    # the migrated file's totals were summed in one pass, the writer's batch by batch: an
    # average may differ in its last bits (as DuckDB's own avg does with the order it sums in)
    assert rounded(query(old, "SELECT * FROM tool_stats")) == rounded(query(db, "SELECT * FROM tool_stats"))


def test_the_writer_migrates_a_v1_file_it_writes_to(db: Path, tmp_path: Path) -> None:
    old = tmp_path / "v1.duckdb"
    make_v1(db, old)
    loopscope.configure(old, flush_interval=0.05)
    try:
        with loopscope.turn(session_id="after-upgrade", agent="support") as turn:
            turn.generation("hello again")
    finally:
        loopscope.shutdown()
    assert query(old, "SELECT value FROM loopscope_meta WHERE key = 'schema_version'")[0]["value"] == str(SCHEMA_VERSION)
    assert query(old, "SELECT count(*) AS n FROM turn_summaries WHERE session_id = 'after-upgrade'")[0]["n"] == 1
    assert query(old, "SELECT sum(calls) AS n FROM tool_stats")[0]["n"] == 21
