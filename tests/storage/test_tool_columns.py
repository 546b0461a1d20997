"""The tool columns of ``events`` (name, call id, status, outcome, duration): filled by every
writer path as the row's ``content`` JSON says, back-filled by the migration of an older
file, and read by the views and the dashboard's API, which fall back to ``content``
for rows without them."""

from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path
from typing import Any

import duckdb
import pytest
from opentelemetry.sdk.trace import TracerProvider

import loopscope
from loopscope import semconv as a
from loopscope.dashboards.web import api
from loopscope.ingest.otlp.collector import Collector
from loopscope.ingest.spans import OWN_SCOPE
from loopscope.storage.duckdb.connection import open_store
from loopscope.storage.duckdb.schema import MIGRATIONS, SCHEMA_VERSION, has_tool_columns, migrate, schema_version
from loopscope.storage.duckdb.views import TOOL_COLUMNS, views

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import analytics_store as workload
from recorded import connect_when_free

# what the views read from content where the columns are NULL, per column
FROM_CONTENT = {
    "tool_name": "json_extract_string(content, '$.tool_name')",
    "tool_call_id": "json_extract_string(content, '$.tool_id')",
    "tool_status": "json_extract_string(content, '$.status')",
    "tool_outcome": "json_extract_string(content, '$.outcome')",
    "tool_duration_ms": "TRY_CAST(json_extract_string(content, '$.duration_ms') AS DOUBLE)",
}
TOOL_VIEWS = ("tool_calls", "tool_stats", "declared_vs_used")
ORDER = {"tool_calls": "session_id, turn_id, call_id", "tool_stats": "tool", "declared_vs_used": "agent, tool"}
V1_TURN_COLUMNS = "* EXCLUDE (model_call_count, cost_usd, price_source)"  # turns as m001 made them (m008 added these)
V3_EVENT_COLUMNS = (
    "id, session_id, idx, type, created_at, correlation_id, source_channel_id, source_provider, source_framework, "
    "status, content, trace_id, span_id"
)


def query(db: Path | str, sql: str) -> list[tuple[Any, ...]]:
    # through the store's gate: a writer in this process may hold the file
    with open_store(str(Path(db).resolve()), read_only=True) as con:
        return con.execute(sql).fetchall()


def tool_rows(db: Path | str) -> list[tuple[Any, ...]]:
    """(type, columns..., the same fields from content...) of every tool row."""
    return query(db, f"""SELECT type, {", ".join(TOOL_COLUMNS)}, {", ".join(FROM_CONTENT.values())}
                         FROM events WHERE type IN ('tool_call_start', 'tool_call_end') ORDER BY session_id, idx""")


def assert_columns_match_content(db: Path | str, *, at_least: int = 1, plain: bool = True) -> list[tuple[Any, ...]]:
    rows = tool_rows(db)
    assert len(rows) >= at_least
    for row in rows:
        columns, parsed = row[1:6], row[6:11]
        assert columns == parsed, row
        assert columns[0] is not None  # filled, not left to the fallback
        if row[0] == "tool_call_start":
            assert columns[2:] == ("pending", None, None)
        else:
            assert isinstance(columns[4], float)
            assert columns[2] in ("completed", "failed") or not plain
    others = query(db, f"SELECT count(*) FROM events WHERE type NOT IN ('tool_call_start', 'tool_call_end') "
                       f"AND NOT ({' AND '.join(f'{c} IS NULL' for c in TOOL_COLUMNS)})")
    assert others == [(0,)]  # message rows have none
    return rows


def view_rows(db: Path | str, view: str) -> list[tuple[Any, ...]]:
    return normalized(query(db, f"SELECT * FROM {view} ORDER BY {ORDER[view]}"))


def normalized(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    # averages may differ in the last bits with the order DuckDB sums them in
    return [tuple(round(v, 9) if isinstance(v, float) and math.isfinite(v) else v for v in r) for r in rows]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tool_columns") / "store.duckdb"
    workload.record(path)
    return path


def make_v3(source: Path, target: Path) -> None:
    """A copy of ``source`` as loopscope left it before the tool columns: schema 3, the
    views reading ``content`` only."""
    con = duckdb.connect(str(target))
    try:
        for step in MIGRATIONS[:3]:
            for statement in step.statements():
                con.execute(statement)
        con.execute(f"ATTACH '{source}' AS src (READ_ONLY)")
        con.execute(f"INSERT INTO main.events SELECT {V3_EVENT_COLUMNS} FROM src.events")
        con.execute(f"INSERT INTO main.turns SELECT {V1_TURN_COLUMNS} FROM src.turns")
        con.execute("INSERT INTO main.sessions SELECT * FROM src.sessions")
        con.execute("DETACH src")
        con.execute("INSERT INTO loopscope_meta VALUES ('schema_version', '3')")
    finally:
        con.close()


# -- every writer fills them --------------------------------------------------------------------


def test_the_in_process_writer_fills_the_tool_columns(recorded: Path) -> None:
    rows = assert_columns_match_content(recorded, at_least=40)
    outcomes = {r[4] for r in rows if r[0] == "tool_call_end"}
    assert outcomes == {"served", "failed", "refused", "blocked", "unserved", "cancelled"}
    assert query(recorded, "SELECT tool_name, tool_call_id, tool_status, tool_outcome FROM events "
                           "WHERE type = 'tool_call_end' AND tool_outcome = 'failed'") == [("refund", "c2", "failed", "failed")]


def test_values_the_sql_cannot_express_give_columns_from_their_content(recording) -> None:
    """A span with a number as its outcome and status: the row's content is made in
    Python, and the columns say what that content says."""
    tracer = recording.pipeline.tracer_provider.get_tracer(OWN_SCOPE)  # spans that claim to be ours
    start = {a.OPERATION: a.OP_EXECUTE_TOOL, a.CONVERSATION_ID: "odd", a.TOOL_NAME: "odd_tool", a.TOOL_CALL_ID: "o1"}
    with tracer.start_as_current_span("execute_tool odd", attributes=start) as span:
        span.set_attributes({a.TOOL_OUTCOME: 5, a.TOOL_STATUS: 7, a.TOOL_ERROR: 3})
    recording.pipeline.writer.flush()
    rows = assert_columns_match_content(recording.db, plain=False)
    assert [r[:6] for r in rows] == [
        ("tool_call_start", "odd_tool", "o1", "pending", None, None),
        ("tool_call_end", "odd_tool", "o1", "7", "5", rows[1][5]),
    ]


def test_the_collector_fills_the_tool_columns(tmp_path: Path) -> None:
    with Collector(str(tmp_path / "collected.duckdb"), http_port=0, grpc_port=None, flush_interval=0.05) as collector:
        loopscope.configure(tmp_path / "local.duckdb", tracer_provider=TracerProvider(), otlp_endpoint=collector.http_endpoint,
                            capture_content=True, flush_interval=0.05)

        @loopscope.tool
        def lookup(n: int) -> int:
            return n

        @loopscope.tool
        def broken() -> None:
            raise RuntimeError("down")

        with loopscope.turn(session_id="collected", agent="c", input="go") as t:
            t.generation("", tool_calls=[{"id": "l1", "name": "lookup", "arguments": {"n": 1}},
                                         {"id": "b1", "name": "broken", "arguments": {}}])
            lookup(1)
            with pytest.raises(RuntimeError):
                broken()
            t.generation("done", finish_reason="stop")
        loopscope.shutdown()
    collected = assert_columns_match_content(collector.db, at_least=4)
    local = assert_columns_match_content(tmp_path / "local.duckdb", at_least=4)
    assert [r[:5] for r in collected] == [r[:5] for r in local]  # durations are the spans' own, the same too
    assert [r[5] for r in collected] == [r[5] for r in local]
    assert {(r[1], r[4]) for r in collected if r[0] == "tool_call_end"} == {("lookup", "served"), ("broken", "failed")}


# -- older files ------------------------------------------------------------------------------------


def test_migrating_a_v3_file_fills_the_tool_columns_from_content(recorded: Path, tmp_path: Path) -> None:
    old = tmp_path / "v3.duckdb"
    make_v3(recorded, old)
    con = duckdb.connect(str(old))
    try:
        assert not has_tool_columns(con)
        assert migrate(con) == 3
        assert schema_version(con) == SCHEMA_VERSION and has_tool_columns(con)
    finally:
        con.close()
    assert tool_rows(old) == tool_rows(recorded)  # the very values the writer stores
    # in any order (tool_calls has none); the v3 copy has no model calls, so the views as
    # they were before them (their columns) are compared
    for view in views(model_calls=False):
        columns = ", ".join(r[0] for r in query(old, f"DESCRIBE ({views(model_calls=False)[view]})"))
        assert sorted(normalized(query(old, f"SELECT {columns} FROM {view}")), key=repr) == sorted(
            normalized(query(recorded, f"SELECT {columns} FROM {view}")), key=repr), view


def test_the_writer_migrates_a_v3_file_on_its_first_write(recorded: Path, tmp_path: Path) -> None:
    old = tmp_path / "v3.duckdb"
    make_v3(recorded, old)
    loopscope.configure(old, flush_interval=0.05)
    try:
        @loopscope.tool
        def later(x: int) -> int:
            return x

        with loopscope.turn(session_id="after-upgrade", agent="support") as turn:
            turn.generation("", tool_calls=[{"id": "n1", "name": "later", "arguments": {"x": 1}}])
            later(1)
            turn.generation("ok", finish_reason="stop")
    finally:
        loopscope.shutdown()
    rows = assert_columns_match_content(old)
    assert len(rows) == len(tool_rows(recorded)) + 2
    assert query(old, "SELECT calls, served FROM tool_stats WHERE tool = 'later'") == [(1, 1)]


def test_a_v3_file_read_without_migrating_answers_from_content(recorded: Path, tmp_path: Path) -> None:
    old = tmp_path / "v3.duckdb"
    make_v3(recorded, old)
    store = loopscope.Store(str(old))
    for view in TOOL_VIEWS:
        _, rows = store.sql(f"SELECT * FROM {view} ORDER BY {ORDER[view]}")
        assert normalized(rows) == view_rows(recorded, view)
    assert strip(api.tool_analytics(store)) == strip(api.tool_analytics(loopscope.Store(str(recorded))))
    assert strip(api.declared_vs_used(store)) == strip(api.declared_vs_used(loopscope.Store(str(recorded))))
    con = connect_when_free(old)
    try:
        assert schema_version(con) == 3 and not has_tool_columns(con)  # left as it was
    finally:
        con.close()


def test_a_v1_file_gets_views_that_read_content(recorded: Path, tmp_path: Path) -> None:
    """A file without views (schema 1) is read through temporary views: the content-only ones."""
    old = tmp_path / "v1.duckdb"
    con = duckdb.connect(str(old))
    try:
        for statement in MIGRATIONS[0].statements():
            con.execute(statement)
        con.execute(f"ATTACH '{recorded}' AS src (READ_ONLY)")
        con.execute(f"INSERT INTO main.events SELECT {V3_EVENT_COLUMNS} FROM src.events")
        con.execute(f"INSERT INTO main.turns SELECT {V1_TURN_COLUMNS} FROM src.turns")
        con.execute("DETACH src")
        con.execute("INSERT INTO loopscope_meta VALUES ('schema_version', '1')")
    finally:
        con.close()
    _, rows = loopscope.Store(str(old)).sql("SELECT * FROM tool_stats ORDER BY tool")
    assert normalized(rows) == view_rows(recorded, "tool_stats")


# -- rows without the columns -----------------------------------------------------------------------


def strip(data: dict[str, Any]) -> dict[str, Any]:
    data = dict(data)
    data.pop("generated_at", None)
    return _rounded(data)


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 9)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


@pytest.mark.parametrize("which", ["every tool row", "every other tool row"])
def test_views_read_content_where_the_columns_are_null(recorded: Path, tmp_path: Path, which: str) -> None:
    """Rows of a writer that does not fill the columns (an importer, say): the views and the
    dashboard's API give what they give with the columns filled."""
    copy = tmp_path / "copy.duckdb"
    shutil.copy(recorded, copy)
    con = duckdb.connect(str(copy))
    try:
        where = "" if which == "every tool row" else "WHERE idx % 2 = 0"
        con.execute(f"UPDATE events SET {', '.join(f'{c} = NULL' for c in TOOL_COLUMNS)} {where}")
        left = con.execute("SELECT count(*) FROM events WHERE type LIKE 'tool_call_%' AND tool_name IS NOT NULL").fetchone()[0]
    finally:
        con.close()
    total = len(tool_rows(recorded))
    assert left == 0 if which == "every tool row" else 0 < left < total
    for view in TOOL_VIEWS:
        assert view_rows(copy, view) == view_rows(recorded, view), view
    filled, emptied = loopscope.Store(str(recorded)), loopscope.Store(str(copy))
    assert strip(api.tool_analytics(emptied)) == strip(api.tool_analytics(filled))
    assert strip(api.tool_analytics(emptied, tool="lookup_order")) == strip(api.tool_analytics(filled, tool="lookup_order"))
    assert strip(api.declared_vs_used(emptied)) == strip(api.declared_vs_used(filled))


def test_the_views_of_both_kinds_agree(recorded: Path) -> None:
    """The definitions for files without the columns (content only) give the same rows."""
    con = connect_when_free(recorded)
    try:
        for view in TOOL_VIEWS:
            # the content-only definitions, as temporary views reading the same tables
            for name, sql in views(tool_columns=False).items():
                con.execute(f"CREATE OR REPLACE TEMP VIEW json_{name} AS {sql.replace('FROM turn_summaries', 'FROM json_turn_summaries')}")
            mine = normalized(con.execute(f"SELECT * FROM {view} ORDER BY {ORDER[view]}").fetchall())
            theirs = normalized(con.execute(f"SELECT * FROM json_{view} ORDER BY {ORDER[view]}").fetchall())
            assert mine == theirs and mine, view
    finally:
        con.close()


def test_an_importer_that_names_only_the_old_columns_is_counted(recorded: Path, tmp_path: Path) -> None:
    """A writer that inserts rows naming the columns it knows (no tool columns) still works."""
    copy = tmp_path / "copy.duckdb"
    shutil.copy(recorded, copy)
    con = duckdb.connect(str(copy))
    try:
        con.execute(f"""INSERT INTO events ({V3_EVENT_COLUMNS}) VALUES
            ('imp-s', 'imported', 1, 'tool_call_start', now(), 't1', 'importer', NULL, 'ag-ui', 'delivered',
             '{{"type":"tool_call","tool_name":"lookup_order","tool_id":"x1","arguments":{{}},"result":null,"status":"pending","outcome":null,"duration_ms":null,"error":null}}', NULL, NULL),
            ('imp-e', 'imported', 2, 'tool_call_end', now(), 't1', 'importer', NULL, 'ag-ui', 'delivered',
             '{{"type":"tool_call","tool_name":"lookup_order","tool_id":"x1","arguments":{{}},"result":1,"status":"completed","outcome":"served","duration_ms":2.5,"error":null}}', NULL, NULL)""")
    finally:
        con.close()
    before = {r[0]: r[1:] for r in query(recorded, "SELECT tool, calls, served, max_ms FROM tool_stats")}
    after = {r[0]: r[1:] for r in query(copy, "SELECT tool, calls, served, max_ms FROM tool_stats")}
    assert after["lookup_order"][:2] == (before["lookup_order"][0] + 1, before["lookup_order"][1] + 1)
    assert query(copy, "SELECT tool, status, outcome, duration_ms FROM tool_calls WHERE session_id = 'imported'") == [
        ("lookup_order", "completed", "served", 2.5)
    ]
