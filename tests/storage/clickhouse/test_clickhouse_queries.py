"""The CLI's and dashboard's reads on ClickHouse (``loopscope/storage/clickhouse/queries.py``) answer
what DuckDB's ``Store`` answers for the same recorded spans: a timeline page (by offset and after an
index, blocked rows left out), the turns list, tool statistics (over a time range too) and the
sessions list.

The spans come from the hand API under an SDK tracer provider whose in-memory exporter sees what
the DuckDB store sees (the ``recording`` fixture); ``otel_rows`` turns them into the rows the
Collector's exporter writes into ``otel_traces``, and chDB's materialized views fill loopscope's
tables from them. Runs in the ``clickhouse`` stack.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from otel_rows import Local

import loopscope
from loopscope.storage.clickhouse import queries

pytestmark = pytest.mark.stack("clickhouse")


@loopscope.tool
def lookup(key: str) -> str:
    if key.startswith("bad"):
        raise KeyError(key)
    return f"value of {key}"


@loopscope.tool
def convert(amount: int) -> int:
    if amount < 0:
        raise ValueError("negative amount")
    return amount * 2


@pytest.fixture
def local(tmp_path: Path) -> Iterator[Local]:
    engine = Local(str(tmp_path / "chdb"))
    try:
        yield engine
    finally:
        engine.close()


def run_on(local: Local) -> queries.Run:
    """``queries``' callable on chDB: server-side parameters, rows as lists."""

    def run(sql: str, params: Mapping[str, Any]) -> Sequence[Sequence[Any]]:
        result = local.session.query(sql, "JSONCompact", params=dict(params))
        text = result.bytes().decode()
        return json.loads(text)["data"] if text.strip() else []

    return run


def record_sessions() -> None:
    """Three sessions of a few turns: tool loops with failed tools, a blocked input, a streamed turn,
    a failed model call; enough rows for a timeline of several pages."""
    for i in range(6):
        session = ("alpha", "beta", "gamma")[i % 3]
        agent = ("planner", "helper")[i % 2]
        with loopscope.turn(session_id=session, agent=agent, input=f"question {i}", correlation_id=f"turn-{i}",
                            input_blocked=(i == 4)) as t:
            t.generation(f"looking {i}", tool_calls=[{"id": f"c{i}a", "name": "lookup", "arguments": {"key": f"k{i}"}},
                                                     {"id": f"c{i}b", "name": "convert", "arguments": {"amount": i}}],
                         usage={"input_tokens": 10 + i, "output_tokens": 2}, model="scripted-1", provider="scripted")
            lookup(f"k{i}")
            convert(i)
            t.generation(f"again {i}", tool_calls=[{"id": f"c{i}c", "name": "lookup", "arguments": {"key": f"bad{i}"}},
                                                   {"id": f"c{i}d", "name": "convert", "arguments": {"amount": -i}}],
                         usage={"input_tokens": 20 + i, "output_tokens": 3})
            with pytest.raises(KeyError):
                lookup(f"bad{i}")
            if i:
                with pytest.raises(ValueError):
                    convert(-i)
            else:
                convert(0)
            if i == 2:
                with pytest.raises(ConnectionError), t.round("scripted-1", provider="scripted"):
                    raise ConnectionError("model down")
            t.generation(f"answer {i}", finish_reason="stop", usage={"input_tokens": 30 + i, "output_tokens": 4})


def _us(at: Any) -> int:
    return int(at.timestamp() * 1_000_000)


def _duck_page(events: list[Any]) -> list[tuple[Any, ...]]:
    return [(e.index, e.type, e.status.value, _us(e.created_at), e.correlation_id, e.source.channel_id,
             e.content.model_dump(mode="json") if hasattr(e.content, "model_dump") else e.content) for e in events]


def _ch_page(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    at = {name: i for i, name in enumerate(queries.EVENT_FIELDS)}
    return [(r[at["idx"]], r[at["type"]], r[at["status"]], r[at["created_us"]], r[at["correlation_id"]],
             r[at["source_channel_id"]], json.loads(r[at["content"]])) for r in rows]


def _comparable(page: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """A page with each content's duration to within the last decimal (both engines round to
    thousandths of a millisecond, and may differ by one in the last)."""
    out = []
    for row in page:
        content = row[-1]
        if isinstance(content, dict) and content.get("duration_ms") is not None:
            content = {**content, "duration_ms": pytest.approx(content["duration_ms"], abs=1.5e-3)}
        out.append((*row[:-1], content))
    return out


@pytest.fixture
def recorded(recording: Any, local: Local) -> Any:
    record_sessions()
    assert loopscope.flush()
    local.insert_spans(recording.exporter.get_finished_spans())
    return recording.store


def test_timeline_pages_match_duckdb(recorded: Any, local: Local) -> None:
    run = run_on(local)
    for session in ("alpha", "beta", "gamma"):
        whole = recorded.get_timeline(session)
        assert len(whole) > 12
        assert _ch_page(queries.timeline_page(run, session, limit=None)) == _comparable(_duck_page(whole))
        for offset, limit in ((0, 5), (5, 5), (10, 100)):
            assert _ch_page(queries.timeline_page(run, session, offset, limit)) == \
                _comparable(_duck_page(recorded.get_timeline(session, offset, limit)))
        after = whole[6].index
        assert _ch_page(queries.timeline_page(run, session, 99, 4, after_index=after)) == \
            _comparable(_duck_page(recorded.get_timeline(session, limit=4, after_index=after)))
    # the blocked input (turn 4, session beta) is left out of a page and keeps its index
    beta = queries.timeline_page(run, "beta", limit=None)
    with_blocked = queries.timeline_page(run, "beta", limit=None, include_blocked=True)
    assert len(with_blocked) == len(beta) + 1
    assert [r[0] for r in with_blocked] == list(range(1, len(with_blocked) + 1))
    assert [r[3] for r in with_blocked].count("blocked") == 1


def test_turns_list_matches_duckdb(recorded: Any, local: Local) -> None:
    run = run_on(local)
    for limit, session in ((50, None), (3, None), (50, "gamma")):
        duck = list(reversed(recorded.list_turns(session, limit, newest_first=True)))
        found = queries.turns_list(run, limit, session_id=session)
        assert [(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[13], r[14]) for r in found] == [
            (t.correlation_id, t.session_id, t.channel_id, _us(t.timestamp), t.loop_end_reason, t.model, t.provider,
             t.tool_calls_count, t.round_count, t.usage.get("input_tokens"), t.usage.get("output_tokens"), t.error,
             t.model_call_count) for t in duck]
        assert [r[11] for r in found] == [pytest.approx(t.latency_ms, abs=1.5e-3) for t in duck]
    assert [r[0] for r in queries.turns_list(run, 2)] == ["turn-5", "turn-4"]


def test_tool_stats_match_duckdb(recorded: Any, local: Local) -> None:
    run = run_on(local)
    _, duck = recorded.sql("SELECT tool, finished, finished - served, p50_ms, p95_ms FROM tool_stats ORDER BY calls DESC, tool")
    found = queries.tool_stats(run)
    assert [r[:3] for r in found] == [r[:3] for r in duck]
    assert [r[3:] for r in found] == [(pytest.approx(r[3], abs=2e-3), pytest.approx(r[4], abs=2e-3)) for r in duck]
    assert {r[0]: r[1:3] for r in found} == {"lookup": (12, 6), "convert": (12, 5)}
    # over a time range: the calls that started in it, as DuckDB's tool_calls view has them
    _, starts = recorded.sql("SELECT epoch_us(started_at) FROM tool_calls ORDER BY started_at")
    since, until = starts[5][0], starts[17][0]
    _, duck = recorded.sql(
        "SELECT tool, count(*), count(*) FILTER (WHERE outcome <> 'served'), quantile_cont(duration_ms, 0.5), "
        "quantile_cont(duration_ms, 0.95) FROM tool_calls WHERE epoch_us(started_at) >= ? AND epoch_us(started_at) < ? "
        "GROUP BY tool ORDER BY count(*) DESC, tool", [since, until])
    found = queries.tool_stats(run, since, until)
    assert sum(r[1] for r in found) == 12
    assert [r[:3] for r in found] == [tuple(r[:3]) for r in duck]
    assert [r[3:] for r in found] == [(pytest.approx(r[3], abs=2e-3), pytest.approx(r[4], abs=2e-3)) for r in duck]
    assert queries.tool_stats(run, until, since) == []


def test_sessions_match_duckdb(recorded: Any, local: Local) -> None:
    run = run_on(local)
    duck = recorded.list_sessions()
    found = queries.sessions(run)
    assert found == [(s.session_id, s.event_count, s.turn_count, _us(s.first_at), _us(s.last_at), s.agents) for s in duck]
    assert [r[0] for r in found] == ["gamma", "beta", "alpha"]
    assert queries.sessions(run, 1) == found[:1]


def test_a_resent_batch_reads_the_same(recording: Any, local: Local) -> None:
    """The Collector's retry of a batch: every read answers as before (``FINAL``)."""
    record_sessions()
    assert loopscope.flush()
    spans = recording.exporter.get_finished_spans()
    local.insert_spans(spans)
    run = run_on(local)

    def everything() -> list[Any]:
        return [queries.timeline_page(run, "beta", limit=None), queries.turns_list(run), queries.tool_stats(run),
                queries.sessions(run)]

    once = everything()
    local.insert_spans(spans)
    assert everything() == once
