"""The row types: every field of a fact reaches the stored column of the same name, and the
columns the SQL names are the columns the schema makes (read from a real DuckDB file)."""

from __future__ import annotations

import ast
import inspect
import json
import textwrap
from datetime import datetime, timezone

import duckdb

from loopscope.ingest import mapping
from loopscope.storage import rows
from loopscope.storage.duckdb.connection import open_store
from loopscope.storage.duckdb.schema import migrate
from loopscope.storage.duckdb.writer import write_batch

TRACE, SPAN = bytes(range(16)), bytes(range(100, 108))
AT_US = 1_700_000_000_123_456


def _store(tmp_path) -> str:
    path = str(tmp_path / "rows.duckdb")
    with open_store(path, read_only=False) as con:
        migrate(con)
    return path


def _columns(con: duckdb.DuckDBPyConnection, table: str) -> tuple[str, ...]:
    return tuple(name for name, *_ in con.execute(f"DESCRIBE {table}").fetchall())


def test_the_columns_the_sql_fills_are_the_columns_the_schema_makes(tmp_path):
    with open_store(_store(tmp_path), read_only=True) as con:
        assert _columns(con, "turns") == rows.TURN_COLUMNS
        assert _columns(con, "events") == rows.EVENT_COLUMNS
        assert _columns(con, "model_calls") == rows.CALL_COLUMNS


def test_the_fact_tables_duckdb_reads_have_the_row_types_fields_in_their_order(tmp_path):
    facts = rows.Facts()
    facts.append(
        [rows.EventFact(code=rows.TOOL_START, trace_id=TRACE, span_id=SPAN, created_us=AT_US, session_id="s",
                        correlation_id=None, source_channel_id=None, source_provider=None, source_framework=None,
                        blocked=False)],
        [_turn_fact()],
        calls=[_call_fact()],
    )
    with open_store(_store(tmp_path), read_only=False) as con:
        con.register("e", facts.event_table())
        con.register("t", facts.turn_table())
        con.register("c", facts.call_table())
        assert _columns(con, "e") == rows.EVENT_FIELDS == rows.EventFact._fields
        assert _columns(con, "t") == rows.TURN_FIELDS == rows.TurnFact._fields
        assert _columns(con, "c") == rows.CALL_FIELDS == rows.CallFact._fields


def _turn_fact() -> rows.TurnFact:
    return rows.TurnFact(
        trace_id=TRACE, span_id=SPAN, correlation_id="turn-1", session_id="session-1", channel_id="agent-1",
        parent_correlation_id="parent-1", response_content="the answer", segments='["the answer"]',
        tool_calls_count=3, round_count=4, input_tokens=11, output_tokens=12, cache_read_input_tokens=13,
        cache_creation_input_tokens=14, reasoning_tokens=15, usage=None, thinking="hmm", loop_end_reason="error",
        latency_ms=1234.5, streaming=True, timestamp_us=AT_US, declared_tools='[{"name":"search"}]',
        model="model-1", provider="provider-1", error="Boom: it broke", model_call_count=5, cost_usd=0.25,
        price_source="override",
    )


def _call_fact() -> rows.CallFact:
    return rows.CallFact(
        trace_id=TRACE, span_id=SPAN, session_id="session-1", correlation_id="turn-1", position=2, provider="provider-1",
        framework="framework-1", agent="agent-1", request_model="model-1", response_model="model-1-2025",
        response_id="resp-1", finish_reasons='["stop","length"]', outcome="truncated", streaming=True,
        started_us=AT_US - 2_500_000, ended_us=AT_US, duration_ms=2500.0, time_to_first_chunk_ms=120.5,
        input_tokens=21, output_tokens=22, cache_read_input_tokens=23, cache_creation_input_tokens=24,
        reasoning_tokens=25, provider_usage='{"input_tokens": 3}', parameters='{"temperature": 0.5}',
        error_type="Boom", error="it broke", refusal="no", input_messages='[{"role": "user"}]',
        output_messages='[{"role": "assistant"}]', cost_usd=0.125, price_source="genai-prices",
    )


def test_every_field_of_a_fact_reaches_the_column_of_its_name(tmp_path):
    """Distinct values in every field, one row of each kind: a field read into another
    column (a misplaced or misnamed field) shows as a wrong value here."""
    common = {"trace_id": TRACE, "span_id": SPAN, "created_us": AT_US, "session_id": "session-1", "correlation_id": "turn-1",
              "source_channel_id": "agent-1", "source_provider": "provider-1", "source_framework": "framework-1"}
    events = [
        rows.EventFact(code=rows.TOOL_END, **common, blocked=False, tool_name="search", tool_id="call-1",
                       arguments='{"q": "x"}', result='"found"', tool_status="failed", outcome="errored",
                       error="Timeout", duration_ms=2.5),
        rows.EventFact(code=rows.INPUT_MESSAGE, **common, blocked=True, body="hello"),
    ]
    facts = rows.Facts()
    facts.append(events, [_turn_fact()], calls=[_call_fact()])
    path = _store(tmp_path)
    with open_store(path, read_only=False) as con:
        write_batch(con, facts)
    with open_store(path, read_only=True) as con:
        tool, message = (
            dict(zip(_columns(con, "events"), row)) for row in con.execute("SELECT * FROM events ORDER BY idx").fetchall()
        )
        turn = dict(zip(_columns(con, "turns"), con.execute("SELECT * FROM turns").fetchone()))
        call = dict(zip(_columns(con, "model_calls"), con.execute("SELECT * FROM model_calls").fetchone()))
    at = datetime.fromtimestamp(AT_US / 1e6, timezone.utc)
    for row in (tool, message):
        assert (row["session_id"], row["correlation_id"], row["source_channel_id"], row["source_provider"],
                row["source_framework"], row["trace_id"], row["span_id"]) == (
            "session-1", "turn-1", "agent-1", "provider-1", "framework-1", TRACE.hex(), SPAN.hex())
        assert row["created_at"] == at
    assert (tool["type"], tool["status"], tool["tool_name"], tool["tool_call_id"], tool["tool_status"],
            tool["tool_outcome"], tool["tool_duration_ms"]) == (
        "tool_call_end", "delivered", "search", "call-1", "failed", "errored", 2.5)
    assert json.loads(tool["content"]) == {
        "type": "tool_call", "tool_name": "search", "tool_id": "call-1", "arguments": {"q": "x"}, "result": "found",
        "status": "failed", "outcome": "errored", "duration_ms": 2.5, "error": "Timeout",
    }
    assert (message["type"], message["status"]) == ("message", "blocked")
    assert json.loads(message["content"]) == {"type": "text", "body": "hello", "role": "user"}
    assert {k: v for k, v in turn.items() if k not in ("usage", "segments", "declared_tools", "timestamp")} == {
        "correlation_id": "turn-1", "session_id": "session-1", "channel_id": "agent-1", "parent_correlation_id": "parent-1",
        "response_content": "the answer", "tool_calls_count": 3, "round_count": 4, "input_tokens": 11, "output_tokens": 12,
        "thinking": "hmm", "loop_end_reason": "error", "latency_ms": 1234.5, "streaming": True, "model": "model-1",
        "provider": "provider-1", "error": "Boom: it broke", "trace_id": TRACE.hex(), "span_id": SPAN.hex(),
        "model_call_count": 5, "cost_usd": 0.25, "price_source": "override",
    }
    json_columns = ("finish_reasons", "provider_usage", "parameters", "input_messages", "output_messages")
    assert {k: json.loads(v) if k in json_columns else v for k, v in call.items()} == {
        "session_id": "session-1", "correlation_id": "turn-1", "position": 2, "provider": "provider-1",
        "framework": "framework-1", "agent": "agent-1", "request_model": "model-1", "response_model": "model-1-2025",
        "response_id": "resp-1", "finish_reasons": ["stop", "length"], "outcome": "truncated", "streaming": True,
        "started_at": datetime.fromtimestamp((AT_US - 2_500_000) / 1e6, timezone.utc), "ended_at": at,
        "duration_ms": 2500.0, "time_to_first_chunk_ms": 120.5, "input_tokens": 21, "output_tokens": 22,
        "cache_read_input_tokens": 23, "cache_creation_input_tokens": 24, "reasoning_tokens": 25,
        "provider_usage": {"input_tokens": 3}, "parameters": {"temperature": 0.5}, "error_type": "Boom",
        "error": "it broke", "refusal": "no", "input_messages": [{"role": "user"}],
        "output_messages": [{"role": "assistant"}], "cost_usd": 0.125, "price_source": "genai-prices",
        "trace_id": TRACE.hex(), "span_id": SPAN.hex(),
    }
    assert json.loads(turn["usage"]) == {
        "input_tokens": 11, "output_tokens": 12, "cache_read_input_tokens": 13, "cache_creation_input_tokens": 14,
        "reasoning_tokens": 15,
    }
    assert (json.loads(turn["segments"]), json.loads(turn["declared_tools"]), turn["timestamp"]) == (
        ["the answer"], [{"name": "search"}], at)


def test_a_fact_arrow_refuses_is_cleaned_by_field_name(tmp_path):
    """A usage value too large for its column: the turn is kept, the value NULL, and the
    usage JSON (the field named ``usage``) holds every usage value."""
    facts = rows.Facts()
    facts.append([], [_turn_fact()._replace(input_tokens=1 << 70, channel_id=7)])
    path = _store(tmp_path)
    with open_store(path, read_only=False) as con:
        write_batch(con, facts)
    with open_store(path, read_only=True) as con:
        usage, input_tokens, output_tokens, channel = con.execute(
            "SELECT usage, input_tokens, output_tokens, channel_id FROM turns").fetchone()
    assert (input_tokens, output_tokens, channel) == (None, 12, "7")
    assert json.loads(usage) == {
        "input_tokens": 1 << 70, "output_tokens": 12, "cache_read_input_tokens": 13, "cache_creation_input_tokens": 14,
        "reasoning_tokens": 15,
    }


def _tuples_of_names(function, where) -> list[tuple[str, ...]]:
    """The tuples of plain names ``function`` builds at ``where`` (an ``add(...)`` call's
    argument, or a ``return``)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    found = []
    for node in ast.walk(tree):
        if where == "add" and isinstance(node, ast.Call) and getattr(node.func, "id", None) == "add":
            value = node.args[0]
        elif where == "return" and isinstance(node, ast.Return):
            value = node.value
        else:
            continue
        assert isinstance(value, ast.Tuple) and all(isinstance(e, ast.Name) for e in value.elts), ast.dump(value)
        found.append(tuple(e.id for e in value.elts))
    return found


def test_the_mapping_builds_each_fact_from_names_that_are_the_row_types_fields_in_order():
    """The mapping builds plain tuples (a fifth of the cost of a call that names each
    value) of locals named as the fields: a value put in the wrong place fails here."""
    assert _tuples_of_names(mapping.collect, "add") == [rows.EventFact._fields]
    assert _tuples_of_names(mapping._turn_fact, "return") == [rows.TurnFact._fields]
    assert _tuples_of_names(mapping._call_fact, "return") == [rows.CallFact._fields]
    assert _tuples_of_names(mapping._error_fact, "return") == [rows.EventFact._fields]


def test_the_json_check_bound_once_for_several_columns_decides_as_the_check_of_each():
    # EVENTS_SQL and CALLS_SQL check their JSON columns in one lambda (bound once per
    # statement): it keeps, quotes or nulls each text exactly as the check of one column
    texts = [None, "", "x", "[1,]", '{"a":1,}', "nan", "NaN", "[NaN]", "[nan]", "-Infinity", "[+1]", "1E+5",
             '"\\ud800"', '{"a": "NaN, ]"}', "[1, -inf]", "null", "[tru]", " [1] ", "é", '{"k": [1, {"x": null}]}']
    con = duckdb.connect()
    con.execute("CREATE TABLE t (a VARCHAR, b VARCHAR)")
    con.executemany("INSERT INTO t VALUES (?, ?)", [(text, texts[-1 - i]) for i, text in enumerate(texts)])
    each = con.execute(f"SELECT {rows.json_text_sql('a')}, {rows.json_text_sql('b')} FROM t").fetchall()
    once = con.execute(f"SELECT j[1], j[2] FROM (SELECT {rows.json_texts_sql(('a', 'b'))} AS j FROM t)").fetchall()
    assert once == each
    assert each[3] == ('"[1,]"', each[3][1])  # a trailing comma Python refuses: kept as a JSON string


def test_a_batch_without_content_made_in_python_gives_the_rows_the_full_statement_gives(tmp_path, monkeypatch):
    # write_batch takes a shorter statement when no event fact carries content made in
    # Python: the same facts through the full one give the very same rows
    common = {"trace_id": TRACE, "span_id": SPAN, "created_us": AT_US, "session_id": "s", "correlation_id": "t",
              "source_channel_id": "a", "source_provider": "p", "source_framework": None}
    events = [
        rows.EventFact(code=rows.TOOL_START, **common, blocked=False, tool_name="search", tool_id="c1", arguments="{bad"),
        rows.EventFact(code=rows.TOOL_END, **common, blocked=False, tool_name="search", tool_id="c1", arguments='{"q": 1}',
                       result="[1,]", tool_status="completed", outcome="served", error=None, duration_ms=1.25),
        rows.EventFact(code=rows.TOOL_END, **common, blocked=False, tool_name="t", tool_id="c2", arguments=None,
                       result=None, tool_status="failed", outcome="errored", error="Boom", duration_ms=0.5),
        rows.EventFact(code=rows.INPUT_MESSAGE, **common, blocked=True, body="hi é"),
        rows.EventFact(code=rows.ROUND_MESSAGE, **common, blocked=False, body='say "x"'),
    ]

    def stored(name: str) -> list[tuple]:
        facts = rows.Facts()
        facts.append(list(events), [])
        path = str(tmp_path / name)
        with open_store(path, read_only=False) as con:
            migrate(con)
            write_batch(con, facts)
        with open_store(path, read_only=True) as con:
            return con.execute("SELECT * FROM events ORDER BY idx").fetchall()

    plain = stored("plain.duckdb")
    monkeypatch.setattr(rows, "PLAIN_EVENTS_SQL", rows.EVENTS_SQL)
    assert stored("full.duckdb") == plain
    assert [row[-3] for row in plain] == ["pending", "completed", "failed", None, None]  # tool_status
