"""The ClickHouse engine's data side on the real engine (chDB, ClickHouse in this process): the
``otel_traces`` table as the Collector's exporter makes it, and loopscope's materialized views over
it, fed with the rows the exporter would write for loopscope's real spans.

The spans come from the hand API under an SDK tracer provider whose in-memory exporter sees what the
DuckDB store (configured on the same provider: the ``recording`` fixture) sees, so every check holds
the ClickHouse tables to what the DuckDB path stored for the same spans. Runs in the ``clickhouse``
stack (tests/stacks.toml), where chdb is installed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from otel_rows import Local, as_string, go_float, json_each_row, row_of

import loopscope
from loopscope.storage.clickhouse import ddl

pytestmark = pytest.mark.stack("clickhouse")

WEATHER = {"type": "function", "function": {"name": "weather", "description": "Weather for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


@loopscope.tool
def weather(city: str) -> dict[str, Any]:
    return {"city": city, "temp_c": 21, "note": "<sunny> & dry"}


@loopscope.tool
def book(when: str) -> str:
    if when == "never":
        raise LookupError("no table then")
    return f"booked {when}"


@pytest.fixture
def local(tmp_path: Path) -> Iterator[Local]:
    engine = Local(str(tmp_path / "chdb"))
    try:
        yield engine
    finally:
        engine.close()


def record_conversation() -> None:
    """Turns through the real hand API: a tool loop with a failed tool, a streamed multi-round turn,
    a failed model call, a turn of another session."""
    with loopscope.turn(session_id="s1", agent="concierge", tools=[WEATHER], input="Dinner outside tonight?",
                        correlation_id="turn-1") as t:
        t.generation("Let me check the weather.",
                     tool_calls=[{"id": "c1", "name": "weather", "arguments": {"city": "Paris"}}],
                     usage={"input_tokens": 100, "output_tokens": 10}, model="scripted-1", provider="scripted")
        weather("Paris")
        t.generation("Booking.", tool_calls=[{"id": "c2", "name": "book", "arguments": {"when": "never"}},
                                             {"id": "c3", "name": "book", "arguments": {"when": "20:00"}}],
                     usage={"input_tokens": 150, "output_tokens": 12})
        with pytest.raises(LookupError):
            book("never")
        book("20:00")
        t.generation("Booked for 20:00.", finish_reason="stop", usage={"input_tokens": 200, "output_tokens": 6})
    with loopscope.turn(session_id="s1", agent="concierge", input="And tomorrow?", correlation_id="turn-2",
                        streaming=True) as t:
        with t.round("scripted-2", provider="scripted", stream=True) as r:
            r.mark_streaming()
            r.text_delta("Checking ")
            r.text_delta("again.")
            r.response(tool_calls=[{"id": "c4", "name": "weather", "arguments": {"city": "Lyon"}}],
                       usage={"input_tokens": 300, "output_tokens": 20, "cache_read_input_tokens": 128},
                       finish_reason="tool_calls", response_id="resp-1", model="scripted-2-2026")
        weather("Lyon")
        with t.round("scripted-2", provider="scripted", stream=True) as r:
            r.mark_streaming()
            r.text_delta("Rain in Lyon.")
            r.response(usage={"input_tokens": 350, "output_tokens": 5}, finish_reason="stop")
    with loopscope.turn(session_id="s1", agent="concierge", input="Hello?", correlation_id="turn-3") as t:
        with pytest.raises(ConnectionError), t.round("scripted-1", provider="scripted"):
            raise ConnectionError("model down")
        t.generation("Back again.", finish_reason="stop", usage={"input_tokens": 9, "output_tokens": 3})
    with loopscope.turn(session_id="s2", agent="helper", input="Café ☕ \"quoted\"\nnew line", correlation_id="turn-4",
                        input_blocked=True) as t:
        t.generation("4 — ünïcode", finish_reason="stop", usage={"input_tokens": 5, "output_tokens": 1},
                     model="scripted-1", thinking="2 and 2")
    with pytest.raises(ValueError), loopscope.turn(session_id="s2", agent="helper", input="fail", correlation_id="turn-5") as t:
        t.generation("Trying.", usage={"input_tokens": 7, "output_tokens": 2})
        raise ValueError("the agent broke")


def _json(text: Any) -> Any:
    return json.loads(text) if isinstance(text, str) else text


def _ms(value: Any) -> float | None:
    return None if value is None else round(float(value), 3)


def _content(text: Any) -> Any:
    """A row's content JSON, its duration apart: both engines round a duration to 3 decimals of a
    millisecond, and may differ by one in the last (compared with :func:`approx_at`)."""
    content = _json(text)
    if isinstance(content, dict) and "duration_ms" in content:
        content = {**content, "duration_ms": pytest.approx(content["duration_ms"], abs=1.5e-3)}
    return content


def approx_at(rows: list[tuple[Any, ...]], *positions: int) -> list[tuple[Any, ...]]:
    """The rows with the durations at ``positions`` compared to within the last decimal."""
    return [tuple(pytest.approx(v, abs=1.5e-3) if i in positions and v is not None else v for i, v in enumerate(row))
            for row in rows]


def duckdb_rows(recording: Any) -> dict[str, list[tuple[Any, ...]]]:
    """What the DuckDB store holds for the recorded spans, in the shapes compared below."""
    store = _Sql(recording.store)
    return {
        "turns": sorted(store.sql(
            "SELECT correlation_id, session_id, response_content, tool_calls_count, round_count, input_tokens, "
            "output_tokens, CAST(json_extract_string(usage, '$.cache_read_input_tokens') AS BIGINT), loop_end_reason, "
            "model, provider, streaming, model_call_count, latency_ms, error, epoch_us(timestamp) FROM turns")),
        "tools": sorted((r[0], r[1], r[2], r[3], _json(r[4]), _json(r[5]), r[6], r[7], _ms(r[8]), r[9], r[10])
                        for r in store.sql(
            "SELECT session_id, turn_id, tool, call_id, arguments, result, status, outcome, duration_ms, error, "
            "epoch_us(started_at) FROM tool_calls")),
        "calls": sorted((*r[:6], _json(r[6]), *r[7:]) for r in store.sql(
            "SELECT session_id, correlation_id, position, request_model, response_model, response_id, finish_reasons, "
            "outcome, streaming, input_tokens, output_tokens, cache_read_input_tokens, duration_ms, error_type, error, "
            "epoch_us(started_at), epoch_us(ended_at) FROM model_calls")),
        "events": [(r[0], r[1], r[2], _content(r[3]), r[4], r[5], r[6], r[7], r[8], r[9]) for r in store.sql(
            "SELECT session_id, idx, type, content, epoch_us(created_at), correlation_id, source_channel_id, status, "
            "tool_name, tool_status FROM events ORDER BY session_id, idx")],
    }


class _Sql:
    """The store's read-only SQL, rows only."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def sql(self, query: str) -> list[tuple[Any, ...]]:
        return self.store.sql(query)[1]


def chdb_rows(local: Local) -> dict[str, list[tuple[Any, ...]]]:
    """The same, read from the ClickHouse tables (``FINAL``: a resent batch's rows once)."""
    sessions = [r[0] for r in local.rows("SELECT session_id FROM loopscope_sessions GROUP BY session_id ORDER BY session_id")]
    events = []
    for session in sessions:
        events += [(r[0], r[1], r[2], _json(r[3]), r[4], r[5], r[6], r[7], r[8], r[9]) for r in local.rows(
            "SELECT session_id, idx, type, content, toUnixTimestamp64Micro(created_at), correlation_id, "
            f"source_channel_id, status, tool_name, tool_status FROM loopscope_timeline(session_id = '{session}')")]
    return {
        "turns": sorted(tuple(r) for r in local.rows(
            "SELECT correlation_id, session_id, response_content, tool_calls_count, round_count, input_tokens, "
            "output_tokens, cache_read_input_tokens, loop_end_reason, model, provider, streaming, model_call_count, "
            "latency_ms, error, toUnixTimestamp64Micro(timestamp) FROM loopscope_turns FINAL")),
        "tools": sorted((r[0], r[1], r[2], r[3], _json(r[4]), _json(r[5]), r[6], r[7], _ms(r[8]), r[9], r[10])
                        for r in local.rows(
            "SELECT session_id, turn_id, tool, call_id, arguments, result, status, outcome, duration_ms, error, "
            "toUnixTimestamp64Micro(started_at) FROM loopscope_tool_calls FINAL")),
        "calls": sorted((*r[:6], _json(r[6]), *r[7:]) for r in local.rows(
            "SELECT session_id, correlation_id, position, request_model, response_model, response_id, finish_reasons, "
            "outcome, streaming, input_tokens, output_tokens, cache_read_input_tokens, duration_ms, error_type, error, "
            "toUnixTimestamp64Micro(started_at), toUnixTimestamp64Micro(ended_at) FROM loopscope_model_calls FINAL")),
        "events": events,
    }


def test_views_hold_what_the_duckdb_store_holds(recording: Any, local: Local) -> None:
    record_conversation()
    assert loopscope.flush()
    spans = recording.exporter.get_finished_spans()
    local.insert_spans(spans)

    expected, found = duckdb_rows(recording), chdb_rows(local)
    assert found["turns"] == approx_at(expected["turns"], 13)
    assert found["tools"] == approx_at(expected["tools"], 8)
    assert found["calls"] == approx_at(expected["calls"], 12)
    assert found["events"] == expected["events"]
    # what that says, spelled out: the failed tool, the failed model call, the streamed turn
    tools = {(r[2], r[3]): r for r in found["tools"]}
    assert tools[("book", "c2")][6:8] == ("failed", "failed") and "no table then" in tools[("book", "c2")][9]
    assert tools[("weather", "c1")][5] == {"city": "Paris", "temp_c": 21, "note": "<sunny> & dry"}
    calls = {(r[1], r[2]): r for r in found["calls"]}
    assert calls[("turn-3", 1)][7] == "error" and calls[("turn-3", 1)][14] == "model down"
    assert calls[("turn-2", 1)][4:9] == ("scripted-2-2026", "resp-1", ["tool_calls"], "completed", True)
    turns = {r[0]: r for r in found["turns"]}
    assert turns["turn-5"][8] == "error" and "the agent broke" in turns["turn-5"][14]
    assert turns["turn-2"][11] is True and turns["turn-2"][7] == 128
    assert next(r[7] for r in found["events"] if r[0] == "s2") == "blocked"
    types = [r[2] for r in found["events"] if r[0] == "s1"]
    assert types.count("tool_call_start") == types.count("tool_call_end") == 4
    assert "model_error" in types
    assert [r[1] for r in found["events"] if r[0] == "s1"] == list(range(1, len(types) + 1))
    assert local.rows("SELECT session_id, toUnixTimestamp64Micro(min(first_at)), arraySort(groupUniqArrayArray(agents)) "
                      "FROM loopscope_sessions GROUP BY session_id ORDER BY session_id") == [
        ("s1", min(r[4] for r in found["events"] if r[0] == "s1"), ["concierge"]),
        ("s2", min(r[4] for r in found["events"] if r[0] == "s2"), ["helper"]),
    ]


def test_a_resent_batch_changes_nothing(recording: Any, local: Local) -> None:
    record_conversation()
    assert loopscope.flush()
    spans = recording.exporter.get_finished_spans()
    local.insert_spans(spans)
    once = chdb_rows(local)
    local.insert_spans(spans)  # the Collector's retry after a timeout: the same batch again
    local.insert_spans(spans[:5])
    assert local.value("SELECT count() FROM otel_traces") == 2 * len(spans) + 5  # the exporter's table keeps all
    assert chdb_rows(local) == once
    # and once the background merges ran, without FINAL too
    for table in ("loopscope_events", "loopscope_turns", "loopscope_model_calls", "loopscope_tool_calls",
                  "loopscope_tool_durations"):
        local.run(f"OPTIMIZE TABLE {table} FINAL")
        assert local.value(f"SELECT count() FROM {table}") == local.value(f"SELECT count() FROM {table} FINAL")
    assert local.value("SELECT count() FROM loopscope_events") == len(once["events"])


def test_thousands_of_spans(recording: Any, local: Local) -> None:
    """A few thousand spans in one insert (a sanity check of size, not of time: benchmarks/ times)."""
    turns = 600
    for i in range(turns):
        with loopscope.turn(session_id=f"s{i % 20}", agent="bulk", input=f"q{i}", correlation_id=f"t{i}") as t:
            t.generation("", tool_calls=[{"id": f"c{i}", "name": "weather", "arguments": {"city": f"c{i}"}}],
                         usage={"input_tokens": 10, "output_tokens": 2}, model="scripted-1")
            weather(f"c{i}")
            t.generation(f"a{i}", finish_reason="stop", usage={"input_tokens": 12, "output_tokens": 3})
    assert loopscope.flush()
    spans = recording.exporter.get_finished_spans()
    assert len(spans) == turns * 4
    local.insert_spans(spans)
    assert local.value("SELECT count() FROM loopscope_turns FINAL") == turns
    assert local.value("SELECT count() FROM loopscope_tool_calls FINAL") == turns
    assert local.value("SELECT count() FROM loopscope_model_calls FINAL") == 2 * turns
    assert local.value("SELECT count() FROM loopscope_events FINAL") == 4 * turns
    assert local.value("SELECT sum(input_tokens) FROM loopscope_turns FINAL") == 22 * turns
    assert local.rows("SELECT count(), min(idx), max(idx) FROM loopscope_timeline(session_id = 's7')") == [(120, 1, 120)]
    assert local.value("SELECT count() FROM loopscope_tool_durations FINAL WHERE tool = 'weather'") == turns
    assert recording.store.sql("SELECT count(*) FROM events")[1][0][0] == 4 * turns


def test_otel_traces_is_the_exporters_table(local: Local) -> None:
    """The table as the exporter's template makes it: its keys, columns and indexes, on both index
    variants; making the schema again changes nothing."""
    full_text = ddl.has_full_text(local.version)
    table = local.dicts("SELECT partition_key, sorting_key, primary_key, create_table_query FROM system.tables "
                        "WHERE database = currentDatabase() AND name = 'otel_traces'")[0]
    assert table["partition_key"] == "toDate(Timestamp)"
    assert table["sorting_key"] == "ServiceName, SpanName, toDateTime(Timestamp), Timestamp"
    assert table["primary_key"] == "ServiceName, SpanName, toDateTime(Timestamp)"
    assert ("TYPE text" in table["create_table_query"]) is full_text
    columns = dict(local.rows("SELECT name, type FROM system.columns WHERE database = currentDatabase() "
                              "AND table = 'otel_traces'"))
    assert columns["Timestamp"] == "DateTime64(9)"
    assert columns["SpanAttributes"] == columns["ResourceAttributes"] == "Map(LowCardinality(String), String)"
    assert columns["Duration"] == "UInt64"
    assert columns["Events.Attributes"] == "Array(Map(LowCardinality(String), String))"
    assert columns["Links.TraceId"] == "Array(String)"
    assert columns["SpanAttributeItems"] == "Array(String)"
    ddl.create(local.run, local.version)  # again: IF NOT EXISTS throughout
    other = "other_variant"
    local.run(ddl.otel_traces(table=other, full_text=not full_text, ttl_days=3))
    query = local.value(f"SELECT create_table_query FROM system.tables WHERE name = '{other}'")
    assert ("TYPE text" in query) is (not full_text)
    assert "TTL toDateTime(Timestamp) + toIntervalDay(3)" in query


def test_retention_drops_old_days(tmp_path: Path, recording: Any) -> None:
    """``ttl_days``: whole days older than the setting go, in otel_traces and in every derived table."""
    with loopscope.turn(session_id="old", input="then") as t:
        t.generation("ok", finish_reason="stop")
    assert loopscope.flush()
    spans = recording.exporter.get_finished_spans()
    engine = Local(str(tmp_path / "ttl"), ttl_days=2)
    try:
        rows = [row_of(span) for span in spans]
        for row in rows:  # the same spans, ten days ago
            row["Timestamp"] = "2000-01-01" + row["Timestamp"][10:]
        engine.session.query(f"INSERT INTO otel_traces SETTINGS session_timezone = 'UTC' FORMAT JSONEachRow\n"
                             f"{json_each_row(rows)}")
        engine.insert_spans(spans)  # and today's
        tables = ("otel_traces", "loopscope_events", "loopscope_turns", "loopscope_model_calls", "loopscope_sessions")
        for table in tables:
            engine.run(f"OPTIMIZE TABLE {table} FINAL")
        assert engine.value("SELECT count() FROM otel_traces") == len(spans)
        assert engine.value("SELECT count() FROM loopscope_turns FINAL") == 1
        assert engine.value("SELECT count() FROM loopscope_events FINAL") == 2
        assert engine.value("SELECT count() FROM loopscope_model_calls FINAL") == 1
    finally:
        engine.close()


@pytest.mark.parametrize(("value", "text"), [
    ("x", "x"), (True, "true"), (12, "12"), (0.5, "0.5"), (2.0, "2"), (1e21, "1e+21"), (1e-7, "1e-7"),
    (("stop", "length"), '["stop","length"]'), ((1, 2.5), "[1,2.5]"), (("<a>&",), '["\\u003ca\\u003e\\u0026"]'),
])
def test_attribute_values_as_the_exporter_writes_them(value: Any, text: str) -> None:
    assert as_string(value) == text
    assert go_float(123456789.0) == "123456789"
