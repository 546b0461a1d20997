"""The same recorded data answers the same through ``open_reader`` on DuckDB and on ClickHouse (chDB),
query by query: loopscope's real spans from one recording go into the DuckDB store (its writer) and,
converted as the Collector's ``clickhouseexporter`` writes them, into chDB's ``otel_traces``, whose
materialized views fill loopscope's tables. One dataset for the module.

Each query is run on both engines and the answers compared field by field, less what ClickHouse
does not have (docs/clickhouse.md "What differs"): event ids (the exporter's rows are named by
trace, span and kind), costs, request parameters, writers' counters, pending tool calls. With
``LOOPSCOPE_CLICKHOUSE_URL`` set (a server), the same data goes into a fresh database there and
the same comparisons run on it too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from agent_loop import record_sessions
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import loopscope
from loopscope.dashboards.web import api
from loopscope.storage.clickhouse.runner import connect
from loopscope.storage.clickhouse.spans import json_each_row, row_of
from loopscope.storage.errors import StoreError
from loopscope.storage.policy import EventFilter, TurnFilter
from loopscope.storage.queries import Reader, open_reader, prepare

pytestmark = pytest.mark.stack("clickhouse")

SERVER = os.environ.get("LOOPSCOPE_CLICKHOUSE_URL")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The recording's spans, in a DuckDB store and (as the exporter's rows) in chDB (and a server)."""
    folder = tmp_path_factory.mktemp("engines")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    duck = folder / "store.duckdb"
    loopscope.configure(duck, tracer_provider=provider, flush_interval=0.05, capture_content=True)
    try:
        record_sessions()
        assert loopscope.flush()
    finally:
        loopscope.shutdown()
    body = json_each_row(row_of(span) for span in exporter.get_finished_spans())
    urls = {"chdb": prepare(f"chdb://{folder}/chdb")}
    if SERVER:  # a database of its own on the server, dropped at the end
        parts = urlsplit(SERVER)
        urls["server"] = prepare(urlunsplit(parts._replace(path=f"/loopscope_test_{uuid.uuid4().hex[:8]}")))
    for url in urls.values():
        runner = connect(url)
        try:
            runner.insert_json("otel_traces", body)
        finally:
            runner.close()
    yield {"duckdb": str(duck), "folder": folder, **urls}
    if SERVER:
        runner = connect(urls["server"])
        try:
            runner.command(f"DROP DATABASE IF EXISTS `{runner.target.database}`")
        finally:
            runner.close()


ENGINES = ["chdb", *(["server"] if SERVER else [])]


@pytest.fixture(params=ENGINES)
def pair(request: pytest.FixtureRequest, recorded: dict[str, Any]) -> Iterator[tuple[Reader, Reader]]:
    """The DuckDB reader and a ClickHouse one, of the same recording."""
    ch = open_reader(recorded[request.param])
    try:
        yield open_reader(recorded["duckdb"]), ch
    finally:
        ch.close()  # type: ignore[attr-defined]


def event_view(e: Any) -> tuple[Any, ...]:
    """An event less its id (named otherwise on each engine); durations to the microsecond."""
    content = e.content.model_dump(mode="json") if hasattr(e.content, "model_dump") else e.content
    if isinstance(content, dict) and content.get("duration_ms") is not None:
        content = {**content, "duration_ms": pytest.approx(content["duration_ms"], abs=1.5e-3)}
    return (e.session_id, e.index, e.type, e.created_at, e.correlation_id, e.source, e.status, content, e.trace_id, e.span_id)


def test_sessions_and_lookup_agree(pair: tuple[Reader, Reader]) -> None:
    duck, ch = pair
    assert [s.model_dump() for s in ch.sessions()] == [s.model_dump() for s in duck.sessions()]
    assert [s.session_id for s in ch.sessions()] == ["gamma", "beta", "alpha"]
    assert [s.model_dump() for s in ch.sessions(2)] == [s.model_dump() for s in duck.sessions(2)]
    for search in ("ALP", "helper", "scripted", "nothing"):
        assert [s.session_id for s in ch.sessions(search=search)] == [s.session_id for s in duck.sessions(search=search)]
    for asked in (None, "gamma", "b", "zzz"):
        assert ch.session(asked) == duck.session(asked)
    assert ch.session_costs(["alpha"]) == {"alpha": None}  # no prices on ClickHouse
    assert ch.ready() and duck.ready()


def test_timeline_pages_and_counts_agree(pair: tuple[Reader, Reader]) -> None:
    duck, ch = pair
    for session in ("alpha", "beta", "gamma"):
        whole = duck.timeline(session)
        assert len(whole) > 12
        assert [event_view(e) for e in ch.timeline(session)] == [event_view(e) for e in whole]
        middle = whole[6].index
        for kwargs in ({"limit": 5}, {"limit": 5, "newest_first": True}, {"limit": 4, "after_index": middle},
                       {"limit": 4, "before_index": middle},
                       {"event_filter": EventFilter(event_types=["tool_call_end"])},
                       {"event_filter": EventFilter(include_blocked=True, exclude_types=["message"])},
                       {"event_filter": EventFilter(correlation_id=whole[3].correlation_id, source_channel_id="helper")}):
            assert [event_view(e) for e in ch.timeline(session, **kwargs)] == \
                [event_view(e) for e in duck.timeline(session, **kwargs)], kwargs
        for f in (None, EventFilter(), EventFilter(event_types=["message"], include_blocked=True)):
            assert ch.event_count(session, f) == duck.event_count(session, f)
    # the blocked input keeps its index and is left out unless asked for
    blocked = ch.timeline("beta", event_filter=EventFilter(include_blocked=True, event_types=["message"]))
    assert [e.status.value for e in blocked].count("blocked") == 1
    for limit in (1, 7):
        assert [event_view(e) for e in ch.recent_events(limit)] == [event_view(e) for e in duck.recent_events(limit)]


def test_turns_and_calls_agree(pair: tuple[Reader, Reader]) -> None:
    duck, ch = pair
    for session, limit, newest in ((None, 50, False), (None, 3, True), ("gamma", None, False)):
        found, expected = ch.turn_rows(session, limit, newest_first=newest), duck.turn_rows(session, limit, newest_first=newest)
        assert [r._replace(latency_ms=pytest.approx(r.latency_ms, abs=1.5e-3)) for r in found] == expected
        assert [t.model_dump() for t in ch.turns(session, limit, newest_first=newest)] == \
            [t.model_dump() | {"latency_ms": pytest.approx(t.latency_ms, abs=1.5e-3)}
             for t in duck.turns(session, limit, newest_first=newest)]
    ignore = {"cost_usd": None, "price_source": None, "parameters": {}, "input_messages": None, "output_messages": None}

    def calls(rows: list[Any]) -> list[dict[str, Any]]:
        return [r._asdict() | ignore | {"duration_ms": pytest.approx(r.duration_ms, abs=1.5e-3)} for r in rows]

    for kwargs in ({}, {"session_id": "gamma"}, {"failed": True}, {"model": "scripted-1", "limit": 4},
                   {"provider": "nobody"}):
        assert calls(ch.calls(**kwargs)) == calls(duck.calls(**kwargs)), kwargs
    assert [c.duration_ms for c in ch.calls(slowest=True, limit=3)] == \
        [pytest.approx(c.duration_ms, abs=1.5e-3) for c in duck.calls(slowest=True, limit=3)]
    assert [c.model_dump(exclude=set(ignore)) for c in ch.model_calls(failed=True)] == \
        [c.model_dump(exclude=set(ignore)) for c in duck.model_calls(failed=True)]
    turn_ids = [t.correlation_id for t in duck.turn_rows()]
    assert set(ch.turn_costs(turn_ids)) == set(duck.turn_costs(turn_ids))
    assert all(v is None for v in ch.turn_costs(turn_ids).values())


def _step(step: Any) -> dict[str, Any]:
    """A trajectory step less its cost (none on ClickHouse), durations to the microsecond."""
    data = dict(vars(step)) | {"cost_usd": None}
    if data["duration_ms"] is not None:
        data["duration_ms"] = pytest.approx(data["duration_ms"], abs=1.5e-3)
    return data


def test_search_filters_tool_calls_and_trajectories_agree(pair: tuple[Reader, Reader]) -> None:
    """Issue 35's queries and filters: content search, tool calls, the new timeline, turn and call
    filters, and ``diff``'s trajectories, the same on both engines."""
    duck, ch = pair
    # the timeline's tool, failed and text filters, and their counts
    for f in (EventFilter(tool_name="lookup"), EventFilter(failed=True), EventFilter(text="VALUE OF k"),
              EventFilter(text="ünïcode", include_blocked=True), EventFilter(text="bad", event_types=["tool_call_start"]),
              EventFilter(tool_name="convert", failed=True)):
        expected = duck.timeline("alpha", event_filter=f)
        assert [event_view(e) for e in ch.timeline("alpha", event_filter=f)] == [event_view(e) for e in expected], f
        assert ch.event_count("alpha", f) == duck.event_count("alpha", f) == len(expected), f
    assert len(ch.timeline("alpha", event_filter=EventFilter(failed=True))) == 2  # the bad keys' lookups
    # turns as filtered rows and models
    since = duck.turn_rows()[3].timestamp
    for tf in (TurnFilter(agent="helper"), TurnFilter(reason="completed", model="scripted-1"), TurnFilter(since=since),
               TurnFilter(text="bad3"), TurnFilter(text="MODEL DOWN"), TurnFilter(min_cost=0.0), TurnFilter(agent="nobody")):
        found, expected = ch.turn_rows(None, 50, turn_filter=tf), duck.turn_rows(None, 50, turn_filter=tf)
        assert [r._replace(latency_ms=pytest.approx(r.latency_ms, abs=1.5e-3)) for r in found] == expected, tf
        assert [t.correlation_id for t in ch.turns(turn_filter=tf)] == [r.correlation_id for r in expected], tf
    assert [r.correlation_id for r in ch.turn_rows(turn_filter=TurnFilter(text="bad3"))] == ["turn-3"]
    assert ch.turn_rows(turn_filter=TurnFilter(min_cost=0.0)) == []  # no prices on ClickHouse, none on DuckDB here
    # calls since a time and by their text
    ignore = {"cost_usd": None, "price_source": None, "parameters": {}, "input_messages": None, "output_messages": None}
    started = duck.calls(limit=None)[5].started_at
    for kwargs in ({"since": started}, {"search": "answer 4"}, {"search": "MODEL down"}, {"search": "nowhere"}):
        assert [r._asdict() | ignore | {"duration_ms": pytest.approx(r.duration_ms, abs=1.5e-3)} for r in ch.calls(**kwargs)] \
            == [r._asdict() | ignore for r in duck.calls(**kwargs)], kwargs
        assert [c.span_id for c in ch.model_calls(**kwargs)] == [c.span_id for c in duck.model_calls(**kwargs)], kwargs
    assert len(ch.calls(search="answer 4")) == 1 and len(ch.calls(since=started)) == len(duck.calls(limit=None)) - 5
    # content search: events by field, model calls, a session, a limit
    for text, kwargs in (("value of k1", {}), ("bad", {}), ("Model Down", {}), ("ÜNÏCODE", {}), ("lookup", {"session_id": "beta"}),
                         ("answer", {"limit": 3}), ("again 2", {}), ("nothing like it", {})):
        assert ch.search(text, **kwargs) == duck.search(text, **kwargs), text
    assert {h.field for h in ch.search("bad")} >= {"arguments", "error"}
    with pytest.raises(ValueError, match="empty"):
        ch.search("  ")
    assert [s.session_id for s in ch.sessions(search="value of k4")] == [s.session_id for s in duck.sessions(search="value of k4")] \
        == ["beta"]
    # tool calls, one row a call, with their timeline indices
    for kwargs in ({}, {"session_id": "gamma"}, {"tool": "lookup", "failed": True}, {"failed": True, "limit": 2},
                   {"slowest": True, "limit": 3}, {"since": started}, {"search": "negative"}, {"search": "k5"}, {"limit": 0}):
        found, expected = ch.tool_calls(**kwargs), duck.tool_calls(**kwargs)
        if kwargs.get("slowest"):  # the order of near-equal durations is the engines' own: compare what is picked
            found, expected = sorted(found), sorted(expected)
        assert [r._replace(duration_ms=pytest.approx(r.duration_ms, abs=1.5e-3)) for r in found] == expected, kwargs
    assert len(ch.tool_calls(limit=None)) == 18 and all(r.start_index and r.end_index for r in ch.tool_calls(limit=None))
    # trajectories (loopscope diff): a session, a turn, prefixes, an unknown run
    for ref in ("alpha", "turn-4", "gam", "turn-", "nothing"):
        found, expected = ch.trajectory(ref), duck.trajectory(ref)
        assert found.candidates == expected.candidates, ref
        assert (found.trajectory is None) == (expected.trajectory is None), ref
        if expected.trajectory is not None and found.trajectory is not None:
            assert (found.trajectory.kind, found.trajectory.id, found.trajectory.session_id, found.trajectory.turn_ids) == \
                (expected.trajectory.kind, expected.trajectory.id, expected.trajectory.session_id, expected.trajectory.turn_ids)
            assert [_step(s) for s in found.trajectory.steps] == [_step(s) for s in expected.trajectory.steps], ref
    whole = ch.trajectory("gamma").trajectory
    assert whole is not None and [s.kind for s in whole.steps].count("end") == 2


def _close(value: Any) -> Any:
    """A figure to compare across engines: floats to the microsecond, records key by key."""
    if isinstance(value, float):
        return pytest.approx(value, abs=2e-3)
    if isinstance(value, dict):
        return {k: _close(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_close(v) for v in value]
    return value


def test_analytics_agree(pair: tuple[Reader, Reader]) -> None:
    duck, ch = pair
    found, expected = ch.stats(), duck.stats()
    for name in ("sessions", "turns", "events", "agents", "first_at", "last_at", "loop_end_reasons", "tokens", "models"):
        assert getattr(found, name) == _close(getattr(expected, name)), name
    assert found.tool_calls == _close(expected.tool_calls)
    # no prices: every call that used tokens is unpriced
    priced_by_duckdb = sum(1 for c in duck.calls(limit=None) if c.usage)
    assert found.costs == {**expected.costs, "cost_usd": None, "unpriced_calls": priced_by_duckdb}
    priceless = ("cost_usd", "unpriced_calls")
    assert [{k: v for k, v in r.items() if k not in priceless} for r in found.model_calls] == \
        [_close({k: v for k, v in r.items() if k not in priceless}) for r in expected.model_calls]
    for order in ("calls", "failures", "p95", "name"):
        assert ch.tools(order) == _close(duck.tools(order)), order
    assert ch.tools(limit=1) == _close(duck.tools(limit=1))
    assert ch.declared_tools() == duck.declared_tools()
    assert ch.declared_tools("helper", 2) == duck.declared_tools("helper", 2)
    assert {(r["tool"], r["kind"]) for r in ch.declared_tools()} >= {("web_search", "server"), ("unused", "client")}
    assert ch.turn_count() == duck.turn_count() == 6
    assert ch.turn_count("helper") == duck.turn_count("helper") == 3
    status, expected_status = ch.status(), duck.status()
    for name in ("sessions", "events", "turns", "tool_calls", "model_calls", "last_event_at"):
        assert getattr(status, name) == getattr(expected_status, name), name
    assert status.writers == [] and status.size_bytes > 0


def _page(value: Any, drop: tuple[str, ...]) -> Any:
    """A dashboard answer with what differs by engine left out (ids, costs, the time it was made)."""
    if isinstance(value, dict):
        return {k: _page(v, drop) for k, v in value.items() if k not in drop}
    if isinstance(value, list):
        return [_page(v, drop) for v in value]
    return _close(value)


def test_dashboard_pages_agree(pair: tuple[Reader, Reader]) -> None:
    duck, ch = pair
    drop = ("generated_at", "id", "cost_usd", "unpriced_calls", "store", "live")
    assert _page(ch.page_overview(), drop) == _page(duck.page_overview(), drop)
    for q, limit, offset in ((None, None, None), ("help", 1, 0), (None, 1, 1), ("value of k4", None, None)):
        assert _page(ch.page_sessions(q, limit, offset), drop) == _page(duck.page_sessions(q, limit, offset), drop)
    for kwargs in ({}, {"limit": 5}, {"after_index": 3, "limit": 4}, {"before_index": 10, "limit": 3},
                   {"include_blocked": True, "limit": 6}):
        assert _page(ch.page_timeline("beta", **kwargs), drop) == _page(duck.page_timeline("beta", **kwargs), drop), kwargs
    event = ch.page_timeline("alpha", limit=2)["events"][0]
    assert ch.page_event(event["id"]) == {**event, "truncated": False}
    assert ch.page_event("nothing") is None
    tools_drop = (*drop, "running", "last_seen", "over_time", "bucket_seconds")
    assert _page(ch.page_tools(), tools_drop) == _page(duck.page_tools(), tools_drop)
    assert sum(r["calls"] for r in ch.page_tools("24h", "lookup")["over_time"]) == 12
    turns_drop = (*drop, "over_time", "bucket_seconds", "model_calls", "avg_model_calls")
    found, expected = ch.page_turns(), duck.page_turns()
    by_agent = lambda page: sorted(page.pop("latency"), key=lambda r: r["agent"])  # agents tie on turns: by name
    assert _page(by_agent(found), turns_drop) == _page(by_agent(expected), turns_drop)
    assert _page(found, turns_drop) == _page(expected, turns_drop)
    assert _page(ch.page_declared(), drop) == _page(duck.page_declared(), drop)


def test_sql_is_read_only_and_export_writes_parquet(pair: tuple[Reader, Reader], tmp_path: Path) -> None:
    import pyarrow.dataset as ds

    _, ch = pair
    names, rows = ch.sql("SELECT count() AS n FROM loopscope_turns WHERE session_id = {s:String}", {"s": "alpha"})
    assert names == ["n"] and rows == [(2,)]
    for write in ("INSERT INTO loopscope_turns (correlation_id) VALUES ('x')", "DROP TABLE loopscope_turns",
                  "CREATE TABLE t (x Int8) ENGINE = Memory"):
        with pytest.raises(StoreError, match="SQL failed: .*(readonly|READONLY)"):
            ch.sql(write)
    with pytest.raises(StoreError, match="SQL failed: .*UNKNOWN_TABLE"):
        ch.sql("SELECT * FROM no_such_table")
    assert ch.sql("SELECT count() FROM loopscope_turns")[1] == [(6,)]
    counts = ch.export_parquet(["events", "turns", "tool_calls"], str(tmp_path / "out"))
    assert counts == {"events": ch.stats().events, "turns": 6, "tool_calls": 18}
    assert ds.dataset(tmp_path / "out" / "turns", format="parquet", partitioning="hive").count_rows() == 6
    assert ch.stored_ids([e.id for e in ch.timeline("alpha", 2)] + ["nope"]) == {e.id for e in ch.timeline("alpha", 2)}
    follow = ch.follow("alpha")
    assert [e.index for e in follow.start(3)] == [e.index for e in ch.timeline("alpha")][-3:]
    assert follow.poll() == []


def test_cli_commands_read_the_chdb_store(recorded: dict[str, Any]) -> None:
    """The commands (sessions, timeline, turns, calls, stats, tools, status, sql) with ``--db
    chdb://...`` in a child process (this one holds no chDB directory
    meanwhile: chDB lets one process at a time open it)."""

    def cli(*args: str) -> Any:
        done = subprocess.run([sys.executable, "-m", "loopscope", *args, "--db", recorded["chdb"], "--json"],
                              check=False, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    assert [s["session_id"] for s in cli("sessions")] == ["gamma", "beta", "alpha"]
    timeline = cli("timeline", "beta")
    assert timeline and all(e["session_id"] == "beta" for e in (timeline.get("events", timeline)
                                                                 if isinstance(timeline, dict) else timeline))
    assert len(cli("turns")) == 6
    assert {c["session_id"] for c in cli("calls")} == {"alpha", "beta", "gamma"}
    assert cli("stats")["turns"] == 6
    assert {r["tool"] for r in cli("tools")} == {"lookup", "convert"}
    assert cli("status")["turns"] == 6
    # issue 35's commands: diff, search, and the filters of turns, calls and timeline
    duck = open_reader(recorded["duckdb"])
    diffed = cli("diff", "alpha", "turn-4")
    assert _page(diffed, ("cost_usd",)) == _page(api.diff(duck, "alpha", "turn-4"), ("cost_usd",))
    assert diffed["a"]["session_id"] == "alpha" and diffed["b"]["id"] == "turn-4" and len(diffed["rows"]) > 5
    hits = cli("search", "bad", "--session", "beta")
    assert [(h["turn_id"], h["index"], h["field"], h["snippet"]) for h in hits] == \
        [(h.turn_id, h.index, h.field, h.snippet) for h in duck.search("bad", session_id="beta")] and hits
    done = subprocess.run([sys.executable, "-m", "loopscope", "sql", "SELECT count() AS n FROM loopscope_events",
                           "--db", recorded["chdb"]], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "n" in done.stdout


def test_the_dashboard_serves_the_chdb_store_over_http(recorded: dict[str, Any]) -> None:
    """The web dashboard's API on a ``chdb://`` store, as ``loopscope ui --db chdb://...`` serves it."""
    from loopscope.dashboards.web.server import make_server, serve_in_thread

    server = make_server(recorded["chdb"], "127.0.0.1", 0)
    serve_in_thread(server)

    def get(path: str) -> Any:
        with urllib.request.urlopen(server.url + path, timeout=30) as response:
            return json.loads(response.read())

    try:
        assert get("api/overview")["totals"]["turns"] == 6
        assert [s["session_id"] for s in get("api/sessions?limit=2")["sessions"]] == ["gamma", "beta"]
        page = get("api/timeline?session=beta&limit=5")
        assert len(page["events"]) == 5 and page["more_before"] is True and page["turns"]
        assert get(f"api/event?id={page['events'][0]['id']}")["index"] == page["events"][0]["index"]
        assert {t["tool"] for t in get("api/tools")["tools"]} == {"lookup", "convert"}
        assert get("api/turns")["loop_end_reasons"]
        assert {a["agent"] for a in get("api/declared")["agents"]} == {"helper", "planner"}
        # issue 35's pages: a diff, a search, the failed and slowest calls, as on the DuckDB store
        duck = open_reader(recorded["duckdb"])
        assert _page(get("api/diff?a=beta&b=gam"), ("cost_usd",)) == _page(api.diff(duck, "beta", "gam"), ("cost_usd",))
        with pytest.raises(urllib.error.HTTPError) as unknown:
            get("api/diff?a=beta&b=nothing")
        assert unknown.value.code == 400
        found = get("api/search?q=model%20down")
        assert found["hits"] == api.search(duck, "model down")["hits"] and found["hits"]
        for query, failed in (("api/calls?failed=1", True), ("api/calls?tool=convert&failed=1", True), ("api/calls", False)):
            page, expected = get(query), api.calls(duck, "convert" if "tool" in query else None, failed)
            ids = lambda rows: sorted((r["session_id"], r["turn_id"], r.get("call_id")) for r in rows)
            assert ids(page["tool_calls"]) == ids(expected["tool_calls"]), query
            assert ids(page["model_calls"]) == ids(expected["model_calls"]), query
        assert len(get("api/calls?failed=1")["tool_calls"]) == 6
    finally:
        server.shutdown()
        server.server_close()
        server.store.close()  # type: ignore[attr-defined]
