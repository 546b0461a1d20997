"""The engine-neutral query API (loopscope/storage/queries.py), the seam the CLI, the dashboard and collect read
through: each named query answers on a real DuckDB file the hand API recorded, with plain values
and the public models (no DuckDB types), and the engine is picked by the store's name: a
``clickhouse://`` URL asks for the ClickHouse engine, which says clearly when it is missing."""

from __future__ import annotations

import dataclasses
import inspect
from datetime import datetime

import pytest

import loopscope
from loopscope.models import ActivityEvent, AIResponseEvent, ModelCall, SessionInfo
from loopscope.storage import queries
from loopscope.storage.api import BundleSink
from loopscope.storage.duckdb.queries import DuckDBReader
from loopscope.storage.duckdb.writer import StoreWriter
from loopscope.storage.errors import StoreError
from loopscope.storage.policy import EventFilter
from loopscope.storage.queries import EngineMissingError, Reader, open_reader, open_sink
from loopscope.storage.results import CallRow, SessionLookup, Stats, StoreStatus, TurnRow


def _methods(protocol: type) -> list[str]:
    return [name for name, value in vars(protocol).items() if inspect.isfunction(value) and not name.startswith("_")]


def _shape(function: object) -> list[tuple[str, object, object, object]]:
    signature = inspect.signature(function)  # type: ignore[arg-type]
    return [(p.name, p.kind, p.default, p.annotation) for p in signature.parameters.values()] + [
        ("return", None, None, signature.return_annotation)
    ]


@pytest.mark.parametrize(("protocol", "implementation"), [(Reader, DuckDBReader), (BundleSink, StoreWriter)])
def test_the_duckdb_engine_implements_each_query_with_its_signature(protocol, implementation):
    methods = _methods(protocol)
    assert methods
    for name in methods:
        assert _shape(getattr(implementation, name)) == _shape(getattr(protocol, name)), name


@pytest.fixture
def recorded(recording):
    """Two sessions the hand API recorded: a turn with a tool call, a turn with a declared tool never called."""

    @loopscope.tool
    def lookup(city: str) -> str:
        return f"sunny in {city}"

    with loopscope.turn(session_id="seam-weather", agent="forecaster", input="weather in Oslo?") as t:
        t.generation(tool_calls=[{"id": "c1", "name": "lookup", "arguments": {"city": "Oslo"}}],
                     usage={"input_tokens": 12, "output_tokens": 3}, model="gpt-4o-mini", provider="openai",
                     tools=[{"name": "lookup"}, {"name": "forecast_week"}])
        lookup("Oslo")
        t.generation("Sunny in Oslo.", usage={"input_tokens": 20, "output_tokens": 5}, model="gpt-4o-mini",
                     provider="openai")
    with loopscope.turn(session_id="seam-chat", agent="chatter", input="hello") as t:
        t.generation("hi there", model="gpt-4o-mini", provider="openai")
    loopscope.flush()
    return recording


def test_each_named_query_answers_on_a_recorded_duckdb_file(recorded):
    reader = open_reader(str(recorded.db))
    assert isinstance(reader, Reader) and isinstance(reader, DuckDBReader)

    # sessions: the one named, a unique prefix, the most recent, none
    assert reader.session("seam-weather") == SessionLookup("seam-weather")
    assert reader.session("seam-w") == SessionLookup("seam-weather")
    assert reader.session(None) == SessionLookup("seam-chat")
    assert reader.session("seam") == SessionLookup(None, ("seam-chat", "seam-weather"))
    assert reader.session("nope") == SessionLookup(None, ())
    found = reader.sessions()
    assert [s.session_id for s in found] == ["seam-chat", "seam-weather"] and all(isinstance(s, SessionInfo) for s in found)
    assert [s.session_id for s in reader.sessions(search="weather")] == ["seam-weather"]  # the search query
    assert set(reader.session_costs(["seam-weather", "seam-chat"])) == {"seam-weather", "seam-chat"}

    # the timeline: a page, its count, the newest events of all sessions
    events = reader.timeline("seam-weather")
    assert [e.type for e in events] == [
        "message", "tool_call_start", "tool_call_end", "message",
    ] and all(isinstance(e, ActivityEvent) for e in events)
    assert [e.index for e in events] == list(range(1, len(events) + 1))
    assert reader.event_count("seam-weather") == len(events)
    assert [e.index for e in reader.timeline("seam-weather", limit=2, after_index=1)] == [2, 3]
    assert [e.index for e in reader.timeline("seam-weather", limit=1, newest_first=True)] == [len(events)]
    assert reader.event_count("seam-weather", EventFilter(include_blocked=True)) == len(events)
    recent = reader.recent_events(2)
    assert [(e.session_id, e.type) for e in recent][-1] == ("seam-chat", "message")
    follow = reader.follow("seam-weather")
    assert [e.index for e in follow.start(2)] == [len(events) - 1, len(events)]
    assert follow.poll() == []
    assert reader.ready()

    # turns: the public models and the same turns as plain rows
    turns = reader.turns(limit=None)
    rows = reader.turn_rows(limit=None)
    assert all(isinstance(t, AIResponseEvent) for t in turns) and all(isinstance(r, TurnRow) for r in rows)
    assert [(t.session_id, t.channel_id, t.tool_calls_count) for t in turns] == [
        (r.session_id, r.channel_id, r.tool_calls_count) for r in rows
    ] == [("seam-weather", "forecaster", 1), ("seam-chat", "chatter", 0)]
    assert [r.session_id for r in reader.turn_rows(limit=1, newest_first=True)] == ["seam-chat"]
    costs = reader.turn_costs([t.correlation_id for t in turns])
    assert set(costs) == {(t.session_id, t.correlation_id) for t in turns}

    # model calls: plain rows and the models
    calls = reader.calls("seam-weather", limit=None)
    assert [(c.position, c.model, c.usage.get("input_tokens")) for c in calls] == [(1, "gpt-4o-mini", 12), (2, "gpt-4o-mini", 20)]
    assert all(isinstance(c, CallRow) for c in calls)
    models = reader.model_calls("seam-weather", limit=None)
    assert [c.position for c in models] == [1, 2] and all(isinstance(c, ModelCall) for c in models)
    assert reader.calls(provider="anthropic") == []

    # analytics: totals, tools, declared tools, status
    stats = reader.stats()
    assert isinstance(stats, Stats)
    assert (stats.sessions, stats.turns, stats.agents, stats.tool_calls["calls"]) == (2, 2, 2, 1)
    assert isinstance(stats.first_at, datetime) and list(stats.as_dict())[:4] == ["sessions", "turns", "events", "agents"]
    tools = reader.tools()
    assert [(r["tool"], r["calls"], r["served"]) for r in tools] == [("lookup", 1, 1)]
    declared = reader.declared_tools("forecaster")
    assert {(r["tool"], r["calls"], r["kind"]) for r in declared} == {("lookup", 1, "client"), ("forecast_week", 0, "client")}
    assert reader.turn_count() == 2 and reader.turn_count("chatter") == 1
    status = reader.status()
    assert isinstance(status, StoreStatus)
    assert (status.sessions, status.turns, status.tool_calls, status.model_calls) == (2, 2, 1, 3)
    assert status.writers and status.unserved_cut == 0

    # read-only SQL, the collector's look-up, AG-UI imports
    assert reader.sql("SELECT count(*) AS n FROM turns") == (["n"], [(2,)])
    assert reader.stored_ids([events[0].id, "no-such-id"]) == {events[0].id}
    assert not reader.has_agui_events("seam-weather")

    # the dashboard's pages: JSON-ready dicts
    assert [s["session_id"] for s in reader.page_sessions("weather")["sessions"]] == ["seam-weather"]
    assert reader.page_overview()["totals"]["turns"] == 2
    page = reader.page_timeline("seam-weather")
    assert [e["index"] for e in page["events"]] == [e.index for e in events]
    assert reader.page_event(events[0].id)["id"] == events[0].id
    assert [t["tool"] for t in reader.page_tools()["tools"]] == ["lookup"]
    assert reader.page_turns()["loop_end_reasons"]
    assert reader.page_declared()


def test_the_results_are_plain_values_not_the_engines(recorded):
    """What a query gives holds no DuckDB type: a second engine gives the same."""
    reader = open_reader(str(recorded.db))
    values = [*reader.turn_rows(), *reader.calls(), dataclasses.asdict(reader.stats()), dataclasses.asdict(reader.status())]

    def walk(value: object) -> None:
        assert "duckdb" not in type(value).__module__, type(value)
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item)

    walk(values)


@pytest.mark.parametrize("url", ["clickhouse://localhost:8123/loopscope", "ClickHouse://db.example:8123/agents"])
def test_a_clickhouse_url_asks_for_the_clickhouse_engine_and_says_when_it_is_missing(url, monkeypatch):
    # the engine is another package (loopscope.storage.clickhouse); here, as in a loopscope without it, missing
    monkeypatch.setattr(queries, "CLICKHOUSE_ENGINE", "loopscope.storage.no_such_engine")
    assert queries.engine_of(url) == "clickhouse"
    for open_it in (lambda: open_reader(url), lambda: open_sink(url, mapping=None), lambda: queries.prepare(url)):  # type: ignore[arg-type]
        with pytest.raises(EngineMissingError, match="needs the ClickHouse engine") as raised:
            open_it()
        assert isinstance(raised.value, StoreError)  # the CLI prints it as one line
    assert queries.engine_of("/tmp/store.duckdb") == queries.engine_of("clickhouse.duckdb") == "duckdb"


def test_the_cli_says_a_clickhouse_store_needs_the_engine(monkeypatch, capsys):
    from loopscope.cli import main

    monkeypatch.setattr(queries, "CLICKHOUSE_ENGINE", "loopscope.storage.no_such_engine")
    assert main(["turns", "--db", "clickhouse://localhost:8123/loopscope"]) == 2  # the CLI's error status
    err = capsys.readouterr().err
    assert "needs the ClickHouse engine" in err and "Traceback" not in err
