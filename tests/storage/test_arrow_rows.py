"""The rows made in Arrow (storage/duckdb/arrow_rows.py) are the rows the SQL of storage/rows.py
makes from the same facts, column by column, in real DuckDB files: the writer inserts the
former where it can and falls back to the latter."""

from __future__ import annotations

import random
import re

import duckdb
import pyarrow as pa
import pytest

from loopscope.storage import rows
from loopscope.storage.duckdb import arrow_rows
from loopscope.storage.duckdb.connection import open_store
from loopscope.storage.duckdb.schema import migrate
from loopscope.storage.duckdb.writer import write_batch

AT_US = 1_700_000_000_123_456

# texts for the JSON columns and the text columns: JSON, almost JSON (what Python refuses
# and DuckDB's json_valid takes), control characters (DuckDB writes some in capitals),
# non-ASCII, quotes and backslashes, a backslash before "u00", NaN and Infinity
TEXTS = [
    None, "", "x", '{"q": "x"}', "[1,]", '{"a":1,}', "nan", "NaN", "[NaN]", "-Infinity", "[+1]", "1E+5", " [1] ", "é",
    '"found"', "null", "[tru]", "01", "1 2", "{a:1}", "'a'", '{"k": [1, {"x": null}]}', "a\x01b\x0bc\x1fd", "tab\there\nnew",
    'say "x" \\ y', "\\u0041 \\\\u00e9", '"\\u00e9\\ud83d\\ude00"', "😀 \u2028 \x7f", "1e400", '{"a": "NaN, ]"}',
]
DURATIONS = [None, 0.0, -0.0, 1.25, 0.5, 2500.0, 1e-4, 123456.789, 1e14 + 0.5]


def _event_facts() -> list[rows.EventFact]:
    facts = []
    for i, text in enumerate(TEXTS):
        other = TEXTS[-1 - i]
        common = {"trace_id": bytes([i]) * 16, "span_id": bytes([i + 1]) * 8, "created_us": AT_US + i,
                  "session_id": f"s{i % 3}", "correlation_id": None if i % 4 == 0 else f"t{i}",
                  "source_channel_id": None if i % 5 == 0 else "agent", "source_provider": "p", "source_framework": None,
                  "blocked": i % 6 == 0}
        tool = {"tool_name": None if i == 7 else (text or "search"), "tool_id": f"call-{i}", "arguments": text}
        facts += [
            rows.EventFact(code=rows.TOOL_START, **common, **tool),
            rows.EventFact(code=rows.TOOL_END, **common, **tool, result=other, tool_status=None if i == 9 else "completed",
                           outcome="served" if i % 2 else "errored", error=other if i % 3 else None,
                           duration_ms=DURATIONS[i % len(DURATIONS)]),
            rows.EventFact(code=rows.INPUT_MESSAGE, **common, body=text),
            rows.EventFact(code=rows.ROUND_MESSAGE, **common, body=other),
        ]
    return facts


def _turn_facts() -> list[rows.TurnFact]:
    out = []
    for i in range(6):
        out.append(rows.TurnFact(
            trace_id=bytes([i]) * 16, span_id=bytes([i + 9]) * 8, correlation_id=None if i % 2 else f"turn-{i}",
            session_id="s", channel_id="agent" if i else None, parent_correlation_id=None, response_content=f"answer {i} é",
            segments='["x"]', tool_calls_count=i, round_count=i + 1, input_tokens=None if i == 1 else 10 * i,
            output_tokens=None if i in (1, 2) else 5, cache_read_input_tokens=None if i < 4 else 3,
            cache_creation_input_tokens=None, reasoning_tokens=0 if i == 5 else None,
            usage='{"input_tokens": 7}' if i == 3 else None, thinking="", loop_end_reason="final_answer", latency_ms=12.5,
            streaming=bool(i % 2), timestamp_us=AT_US + i, declared_tools="[]", model="m", provider="openai",
            error=None if i else "Boom", model_call_count=None if i == 2 else i, cost_usd=None if i == 4 else 0.5 * i,
            price_source="genai-prices",
        ))
    return out


def _call_facts() -> list[rows.CallFact]:
    out = []
    for i, text in enumerate(TEXTS):
        out.append(rows.CallFact(
            trace_id=bytes([i]) * 16, span_id=bytes([i + 40]) * 8, session_id="s", correlation_id=f"t{i}", position=i,
            provider="openai", framework=None, agent="agent", request_model="m", response_model="m-1", response_id=f"r{i}",
            finish_reasons='["stop"]', outcome="answered", streaming=bool(i % 2), started_us=AT_US, ended_us=AT_US + 5,
            duration_ms=5.0, time_to_first_chunk_ms=None, input_tokens=3, output_tokens=None, cache_read_input_tokens=None,
            cache_creation_input_tokens=None, reasoning_tokens=None, provider_usage=text, parameters='{"temperature": 0.2}',
            error_type=None, error=None, refusal=None, input_messages=TEXTS[-1 - i], output_messages=text,
            cost_usd=0.001, price_source="genai-prices",
        ))
    return out


def _stored(path: str, facts: rows.Facts) -> dict[str, list[tuple]]:
    with open_store(path, read_only=False) as con:
        migrate(con)
        write_batch(con, facts)
    with open_store(path, read_only=True) as con:
        return {
            "events": con.execute("SELECT * FROM events ORDER BY idx, session_id").fetchall(),
            "turns": con.execute("SELECT * FROM turns ORDER BY span_id").fetchall(),
            "model_calls": con.execute("SELECT * FROM model_calls ORDER BY span_id").fetchall(),
            "sessions": con.execute("SELECT * FROM sessions ORDER BY session_id").fetchall(),
        }


def _both_ways(tmp_path, monkeypatch, make) -> tuple[dict[str, list[tuple]], dict[str, list[tuple]]]:
    tmp_path.mkdir(exist_ok=True)
    arrow = _stored(str(tmp_path / "arrow.duckdb"), make())
    with monkeypatch.context() as patch:
        for name in ("event_rows", "turn_rows", "call_rows"):
            patch.setattr(arrow_rows, name, lambda table, **_: None)
        sql = _stored(str(tmp_path / "sql.duckdb"), make())
    return arrow, sql


def _facts(events=(), turns=(), calls=()) -> rows.Facts:
    facts = rows.Facts()
    facts.append(list(events), list(turns), calls=list(calls))
    return facts


def _with_idx(events):
    return events.append_column("idx", pa.array(range(1, events.num_rows + 1), pa.int64()))


def test_rows_made_in_arrow_are_the_rows_the_sql_makes(tmp_path, monkeypatch):
    # every fact Arrow can make, in one batch (one it cannot sends its whole batch to the SQL)
    events = [f for f in _event_facts() if arrow_rows.event_rows(_with_idx(_facts([f]).event_table())) is not None]
    calls = [c for c in _call_facts() if arrow_rows.call_rows(_facts(calls=[c]).call_table()) is not None]
    assert len(events) > 3 * len(_event_facts()) // 4 and len(calls) > 3 * len(_call_facts()) // 4  # the fallback is rare
    assert arrow_rows.event_rows(_with_idx(_facts(events).event_table())) is not None
    assert arrow_rows.turn_rows(_facts(turns=_turn_facts()).turn_table()) is not None
    assert arrow_rows.call_rows(_facts(calls=calls).call_table()) is not None
    arrow, sql = _both_ways(tmp_path, monkeypatch, lambda: _facts(events, _turn_facts(), calls))
    assert [len(arrow[t]) for t in ("events", "turns", "model_calls")] == [len(events), len(_turn_facts()), len(calls)]
    for table in arrow:
        assert arrow[table] == sql[table], table


@pytest.mark.parametrize("kind", ["lone surrogate", "tiny duration", "huge duration", "NaN duration", "content", "deep", "long"])
def test_a_value_only_duckdb_makes_sends_the_batch_to_the_sql(tmp_path, monkeypatch, kind):
    common = {"trace_id": bytes(16), "span_id": bytes(8), "created_us": AT_US, "session_id": "s", "correlation_id": "t",
              "source_channel_id": None, "source_provider": None, "source_framework": None, "blocked": False}
    end = {"tool_name": "f", "tool_id": "c", "arguments": "{}", "result": '"ok"', "tool_status": "completed",
           "outcome": "served", "duration_ms": 1.0}
    end |= {
        "lone surrogate": {"arguments": '{"a": "\\udc00"}'}, "tiny duration": {"duration_ms": 1e-7},
        "huge duration": {"duration_ms": 1e17}, "NaN duration": {"duration_ms": float("nan")},
        "content": {}, "deep": {"result": "[" * 5000 + "]" * 5000},
        "long": {"result": '"' + "x" * arrow_rows.JSON_TEXT_LIMIT + '"'},  # the SQL checks it faster than Python
    }[kind]
    fact = rows.EventFact(code=rows.TOOL_END, **common, **end, content='{"type":"state"}' if kind == "content" else None)
    assert arrow_rows.event_rows(_with_idx(_facts([fact]).event_table())) is None
    arrow, sql = _both_ways(tmp_path, monkeypatch, lambda: _facts([fact]))
    assert repr(arrow) == repr(sql)  # NaN is not equal to itself


def _duckdb(sql: str, texts: list[str]) -> list[str]:
    con = duckdb.connect()
    con.register("texts", pa.table({"t": pa.array(texts, pa.string())}))
    return [row[0] for row in con.execute(sql).fetchall()]


def test_to_json_text_is_duckdbs_to_json_for_every_character():
    every = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    texts = [every, *(chr(c) for c in range(0x80)), *(t for t in TEXTS if t is not None)]
    assert [arrow_rows.to_json_text(t) for t in texts] == _duckdb("SELECT to_json(t)::VARCHAR FROM texts", texts)


def _mutated(count: int) -> list[str]:
    """Texts near JSON: the TEXTS with characters inserted, removed or replaced at random."""
    alphabet = list('{}[]",:0123456789.-+eEtrufalsnNIinfy \t\n\\u/*\'x') + ["NaN", "Infinity", "true", "null", "\x01", "é"]
    seeds = [t for t in TEXTS if t]
    rnd = random.Random(19)
    out = []
    for _ in range(count):
        text = list(rnd.choice(seeds))
        for _ in range(rnd.randint(1, 3)):
            at = rnd.randint(0, len(text))
            roll = rnd.random()
            if roll < 0.4 or not text:
                text.insert(at, rnd.choice(alphabet))
            elif roll < 0.7:
                del text[min(at, len(text) - 1)]
            else:
                text[min(at, len(text) - 1)] = rnd.choice(alphabet)
        out.append("".join(text))
    return out


def test_the_json_check_in_python_decides_as_the_sql_check():
    texts = [t for t in [*TEXTS, *_mutated(5000)] if t is not None and not re.search(r"\\u[dD][89a-fA-F]", t)]
    assert [arrow_rows.json_text(t) for t in texts] == _duckdb(f"SELECT {rows.json_text_sql('t')} FROM texts", texts)
