"""The web dashboard's data functions and its HTTP server, without a browser."""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from importlib import resources
from pathlib import Path

import pytest
import webdata

import loopscope
from idle_sockets import serve_past_idle_sockets
from loopscope.cli import build_parser
from loopscope.dashboards.web import api
from loopscope.dashboards.web.server import DEFAULT_HOST, make_server

# -- the data -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def store(sample_db: Path) -> loopscope.Store:
    return loopscope.Store(str(sample_db))


def test_overview_totals_reasons_and_recent_sessions(store):
    data = api.overview(store)
    totals = data["totals"]
    assert totals["sessions"] == 3
    assert totals["turns"] == 6
    assert totals["events"] == 19 + 27 + 5
    assert totals["tool_calls"] == 5 + 8 + 1
    assert totals["input_tokens"] > 0 and totals["output_tokens"] > 0
    assert {r["reason"]: r["turns"] for r in data["loop_end_reasons"]} == {"completed": 5, "max_rounds": 1}
    assert [s["session_id"] for s in data["sessions"]] == [webdata.XSS_SESSION, "research-7f3a", "demo-concierge"]
    research = data["sessions"][1]
    assert research["turns"] == 3 and research["agents"] == ["researcher"]
    assert research["models"] == ["gpt-4o", "gpt-4o-mini"]
    assert research["last_loop_end_reason"] == "max_rounds"
    json.dumps(data, allow_nan=False)  # plain JSON


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("research", ["research-7f3a"]),
        ("CONCIERGE", ["demo-concierge"]),
        ("4o-mini", ["research-7f3a"]),
        ("nothing", []),
    ],
)
def test_session_search_matches_id_agent_and_model(store, query, expected):
    data = api.sessions(store, q=query)
    assert [s["session_id"] for s in data["sessions"]] == expected
    assert data["total"] == len(expected)


def test_session_paging(store):
    first = api.sessions(store, limit=2)
    second = api.sessions(store, limit=2, offset=2)
    assert first["total"] == 3 and len(first["sessions"]) == 2 and len(second["sessions"]) == 1
    with pytest.raises(api.ApiError):
        api.sessions(store, limit=0)


def test_timeline_pages_cursors_and_turn_summaries(store):
    page = api.timeline(store, "demo-concierge", limit=5)
    assert [e["index"] for e in page["events"]] == [15, 16, 17, 18, 19]
    assert page["more_before"] is True and page["last_index"] == 19
    assert len(page["turns"]) == 1 and page["turns"][0]["loop_end_reason"] == "completed"
    earlier = api.timeline(store, "demo-concierge", before_index=15, limit=5)
    assert [e["index"] for e in earlier["events"]] == [10, 11, 12, 13, 14]
    assert len(earlier["turns"]) == 2  # index 11 ends turn 1, 12 starts turn 2
    later = api.timeline(store, "demo-concierge", after_index=17)
    assert [e["index"] for e in later["events"]] == [18, 19] and later["more_after"] is False
    assert api.timeline(store, "demo-concierge", after_index=19)["events"] == []
    card = next(e for e in page["events"] if e["type"] == "tool_call_end")
    assert card["content"]["tool_name"] and card["content"]["outcome"] == "served"
    assert card["content"]["duration_ms"] > 0
    with pytest.raises(api.ApiError):
        api.timeline(store, "demo-concierge", after_index=1, before_index=5)


def test_timeline_serves_blocked_rows_only_on_request(store):
    plain = api.timeline(store, "research-7f3a")
    with_blocked = api.timeline(store, "research-7f3a", include_blocked=True)
    assert all(e["status"] == "delivered" for e in plain["events"])
    blocked = [e for e in with_blocked["events"] if e["status"] == "blocked"]
    assert len(blocked) == 1 and blocked[0]["content"]["role"] == "user"
    assert len(with_blocked["events"]) == len(plain["events"]) + 1


def test_timeline_of_an_unknown_session(store):
    page = api.timeline(store, "no-such-session")
    assert page["found"] is False and page["events"] == [] and page["turns"] == []


def test_tool_analytics(store):
    data = api.tool_analytics(store)
    tools = {t["tool"]: t for t in data["tools"]}
    assert set(tools) == {"web_search", "fetch_page", "summarize", "get_weather", "book_table", "render"}
    search = tools["web_search"]
    assert (search["calls"], search["served"], search["blocked"], search["running"]) == (4, 3, 1, 0)
    assert search["failure_share"] == pytest.approx(0.25)
    fetch = tools["fetch_page"]
    assert (fetch["calls"], fetch["served"], fetch["refused"], fetch["failed"]) == (3, 1, 1, 1)
    booking = tools["book_table"]
    assert booking["failed"] == 1 and booking["p50_ms"] <= booking["p95_ms"] <= booking["p99_ms"] <= booking["max_ms"]
    assert sum(r["calls"] for r in data["over_time"]) == sum(t["ended"] for t in tools.values())
    only = api.tool_analytics(store, tool="fetch_page")
    assert sum(r["calls"] for r in only["over_time"]) == 3
    assert api.tool_analytics(store, "15m")["tools"]  # recorded moments ago
    with pytest.raises(api.ApiError):
        api.tool_analytics(store, "forever")


def test_turn_analytics(store):
    data = api.turn_analytics(store)
    assert {r["reason"]: r["turns"] for r in data["loop_end_reasons"]} == {"completed": 5, "max_rounds": 1}
    assert sum(r["turns"] for r in data["over_time"]) == 6
    assert data["latency"][0]["agent"] == "all agents" and data["latency"][0]["turns"] == 6
    assert {row["agent"] for row in data["latency"][1:]} == {"concierge", "researcher", webdata.XSS_AGENT}
    latencies = [t["latency_ms"] for t in data["slowest"]]
    assert latencies == sorted(latencies, reverse=True)
    models = {m["model"]: m for m in data["models"]}
    assert models["gpt-4o-mini"]["turns"] == 1 and models["scripted-concierge-1"]["turns"] == 2


def test_declared_vs_used(store):
    data = api.declared_vs_used(store)
    agents = {a["agent"]: a for a in data["agents"]}
    researcher = {t["tool"]: t for t in agents["researcher"]["tools"]}
    assert researcher["send_email"]["never_called"] and researcher["translate"]["never_called"]
    assert researcher["send_email"]["turns_declared"] == 2
    assert researcher["web_search"]["calls"] == 4 and researcher["web_search"]["turns_declared"] == 3
    assert agents["researcher"]["never_called"] == 2
    assert all(not t["never_called"] for t in agents["concierge"]["tools"])


def test_a_running_tool_shows_as_running_until_it_ends(recording):
    store = recording.store
    with loopscope.turn(session_id="live", agent="a", tools=[{"name": "slow"}]) as turn:
        with turn.round() as rnd:
            rnd.response("wait", tool_calls=[{"id": "c1", "name": "slow", "arguments": {}}])
        with loopscope.tool("slow", call_id="c1") as call:
            page = api.timeline(store, "live")
            assert [e["type"] for e in page["events"]] == ["message", "tool_call_start"]
            assert page["turns"] == []  # the turn is still running
            assert {t["tool"]: t["running"] for t in api.tool_analytics(store)["tools"]} == {"slow": 1}
            call.set_result("done")
        turn.generation("finished")
    page = api.timeline(store, "live", after_index=2, turn_ids=[turn.correlation_id])
    assert [e["type"] for e in page["events"]] == ["tool_call_end", "message"]
    assert [t["correlation_id"] for t in page["turns"]] == [turn.correlation_id]
    assert api.tool_analytics(store)["tools"][0]["running"] == 0


def test_long_contents_are_cut_in_a_page_and_whole_on_request(recording):
    big = "x" * (api.MAX_CONTENT_CHARS + 500)
    with loopscope.turn(session_id="big", agent="a"), loopscope.tool("dump", arguments={"n": 1}) as call:
        call.set_result(big)
    events = api.timeline(recording.store, "big")["events"]
    end = next(e for e in events if e["type"] == "tool_call_end")
    assert end["truncated"] is True and len(end["content"]["result"]) < len(big)
    assert end["content"]["arguments"] == {"n": 1}
    full = api.event(recording.store, end["id"])
    assert full["truncated"] is False and full["content"]["result"] == big
    assert api.event(recording.store, "no-such-id") is None


# -- the server -----------------------------------------------------------------------------------


def request(server, method: str, path: str, headers: dict | None = None) -> tuple[int, dict, bytes]:
    host, port = server.server_address[:2]
    con = http.client.HTTPConnection(host, port, timeout=10)
    try:
        con.putrequest(method, path, skip_host=bool(headers and "Host" in headers), skip_accept_encoding=True)
        for key, value in (headers or {}).items():
            con.putheader(key, value)
        con.endheaders()
        response = con.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        con.close()


def test_binds_loopback_by_default(sample_db):
    assert DEFAULT_HOST == "127.0.0.1"
    args = build_parser().parse_args(["ui"])
    assert args.host == "127.0.0.1" and args.port == 8765
    server = make_server(str(sample_db), port=0)
    try:
        assert server.server_address[0] == "127.0.0.1"
        assert server.url.startswith("http://127.0.0.1:")
    finally:
        server.server_close()


def test_page_assets_and_api(dashboard):
    status, headers, body = request(dashboard, "GET", "/")
    assert status == 200 and headers["Content-Type"].startswith("text/html")
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert b'<script src="/static/app.js"' in body
    for name, kind in (("app.js", "text/javascript"), ("style.css", "text/css"), ("favicon.svg", "image/svg+xml")):
        status, headers, _ = request(dashboard, "GET", f"/static/{name}")
        assert status == 200 and headers["Content-Type"].startswith(kind)
    status, headers, body = request(dashboard, "GET", "/api/overview")
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert json.loads(body)["totals"]["sessions"] == 3
    status, _, body = request(dashboard, "GET", "/api/timeline?session=" + urllib.request.quote(webdata.XSS_SESSION))
    assert status == 200 and json.loads(body)["events"][0]["content"]["body"] == webdata.XSS_TEXT
    for path in ("/api/tools?range=1h", "/api/turns", "/api/declared", "/api/sessions?q=demo"):
        status, _, body = request(dashboard, "GET", path)
        assert status == 200, (path, body)
    status, headers, body = request(dashboard, "HEAD", "/api/overview")
    assert status == 200 and body == b""


@pytest.mark.parametrize(
    "path",
    [
        "/static/../../etc/passwd",
        "/static/%2e%2e/%2e%2e/etc/passwd",
        "/static/%2E%2E%2F%2E%2E%2Fetc%2Fpasswd",
        "/static/..%2f..%2f..%2fetc%2fpasswd",
        "/static/%252e%252e/%252e%252e/etc/passwd",
        "/static/..\\..\\etc\\passwd",
        "/static/%5c..%5c..%5cetc%5cpasswd",
        "/static/%00app.js",
        "/static//etc/passwd",
        "/static/",
        "/static/../server.py",
        "/static/../__init__.py",
        "/../../../../etc/passwd",
        "/%2e%2e/%2e%2e/etc/passwd",
        "/etc/passwd",
    ],
)
def test_static_serving_cannot_leave_its_folder(dashboard, path):
    status, _, body = request(dashboard, "GET", path)
    assert status in (400, 404), (path, status)
    assert b"root:" not in body and b"import" not in body


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
def test_only_get_is_served(dashboard, method):
    for path in ("/api/overview", "/", "/static/app.js"):
        status, headers, _ = request(dashboard, method, path)
        assert status == 405, (method, path)
        assert headers["Allow"] == "GET, HEAD"


def test_requests_for_another_host_name_are_refused(dashboard):
    status, _, _ = request(dashboard, "GET", "/api/overview", {"Host": "attacker.example:8765"})
    assert status == 421
    port = dashboard.server_address[1]
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "127.0.0.1"):
        assert request(dashboard, "GET", "/api/overview", {"Host": host})[0] == 200


def test_a_name_given_with_allow_host_is_answered_and_others_still_refused(sample_db):
    args = build_parser().parse_args(["ui", "--allow-host", "agents.internal", "--allow-host", "ui.example"])
    assert args.allow_host == ["agents.internal", "ui.example"]
    for server in webdata.running(make_server(str(sample_db), port=0, allow_hosts=args.allow_host)):
        port = server.server_address[1]
        assert request(server, "GET", "/api/overview", {"Host": f"agents.internal:{port}"})[0] == 200
        assert request(server, "GET", "/api/overview", {"Host": "ui.example"})[0] == 200
        assert request(server, "GET", "/api/overview", {"Host": "attacker.example"})[0] == 421


def test_requests_from_another_sites_page_are_refused(dashboard):
    port = dashboard.server_address[1]
    for origin in ("http://attacker.example", f"http://attacker.example:{port}", "null"):
        status, _, body = request(dashboard, "GET", "/api/overview", {"Origin": origin})
        assert status == 403 and "Origin" in json.loads(body)["error"], origin
    assert request(dashboard, "GET", "/api/overview", {"Origin": f"http://127.0.0.1:{port}"})[0] == 200


def test_idle_connections_are_closed_and_bounded_and_requests_still_answered(sample_db):
    for server in webdata.running(make_server(str(sample_db), port=0, max_connections=2, socket_timeout=0.5)):
        port = server.server_address[1]
        assert serve_past_idle_sockets(port, lambda server=server: request(server, "GET", "/api/overview")[0]) <= 2


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/api/timeline", 400),
        ("/api/timeline?session=x&after=abc", 400),
        ("/api/timeline?session=x&after=1&before=3", 400),
        ("/api/tools?range=forever", 400),
        ("/api/sessions?limit=-1", 400),
        ("/api/event?id=nope", 404),
        ("/api/unknown", 404),
    ],
)
def test_bad_requests_get_a_json_error(dashboard, path, status):
    got, headers, body = request(dashboard, "GET", path)
    assert got == status
    assert headers["Content-Type"] == "application/json" and json.loads(body)["error"]


def test_a_missing_store_is_reported_not_crashed(tmp_path):
    server = make_server(str(tmp_path / "absent.duckdb"), port=0)
    for live in webdata.running(server):
        status, _, body = request(live, "GET", "/api/overview")
        assert status == 503 and "no loopscope store" in json.loads(body)["error"]
        assert request(live, "GET", "/")[0] == 200


def test_static_assets_ship_in_the_package_and_never_inject_html():
    folder = resources.files("loopscope.dashboards.web") / "static"
    names = {entry.name for entry in folder.iterdir()}
    assert {"index.html", "app.js", "style.css", "favicon.svg"} <= names
    script = (folder / "app.js").read_text(encoding="utf-8")
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in script, sink
    page = (folder / "index.html").read_text(encoding="utf-8")
    assert not re.search(r"https?://", page.replace("http://www.w3.org", "")), "the page loads nothing from elsewhere"
    assert "<script>" not in page  # no inline script: the CSP forbids it anyway
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text(encoding="utf-8"))
    package_data = config["tool"]["setuptools"]["package-data"]
    assert "static/*" in package_data["loopscope.dashboards.web"]
    assert "grafana/*.json" in package_data["loopscope.dashboards"]


def test_loopscope_ui_command_serves_on_loopback(sample_db, tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "loopscope", "ui", "--db", str(sample_db), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    try:
        line = proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert match, line + proc.stderr.read() if proc.poll() is not None else line
        url = match.group(0)
        deadline = time.monotonic() + 10
        while True:
            try:
                with urllib.request.urlopen(url + "api/overview", timeout=5) as response:
                    assert json.load(response)["totals"]["sessions"] == 3
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()


def test_loopscope_ui_reports_a_busy_port_in_one_line(sample_db, capsys):
    from loopscope.cli import main

    server = make_server(str(sample_db), port=0)
    try:
        code = main(["ui", "--db", str(sample_db), "--port", str(server.server_address[1])])
    finally:
        server.server_close()
    _out, err = capsys.readouterr()
    assert code == 2 and err.startswith("loopscope: error: cannot listen on 127.0.0.1:")
    assert "Traceback" not in err


def test_timeline_has_each_turns_model_calls_for_a_waterfall(store):
    page = api.timeline(store, "research-7f3a")
    calls = page["model_calls"]
    assert calls and {c["turn_id"] for c in calls} == {t["correlation_id"] for t in page["turns"]}
    for turn in page["turns"]:
        mine = [c for c in calls if c["turn_id"] == turn["correlation_id"]]
        assert [c["position"] for c in mine] == list(range(1, len(mine) + 1)) and turn["model_calls"] == len(mine)
        assert turn["cost_usd"] == pytest.approx(sum(c["cost_usd"] for c in mine))  # gpt-4o and gpt-4o-mini have prices
        for call in mine:  # each call's bar lies within its turn's time
            assert turn["t"] - turn["latency_ms"] - 1 <= call["started_at"] <= call["ended_at"] <= turn["t"] + 1
            assert call["duration_ms"] >= 0 and call["model"] in ("gpt-4o", "gpt-4o-mini") and call["input_tokens"] > 0
    totals = api.overview(store)["totals"]
    assert totals["model_calls"] >= len(calls) and totals["cost_usd"] > 0
    json.dumps(page, allow_nan=False)


def test_costs_per_session_turn_and_model_count_calls_without_a_price(recording):
    """A turn's cost is its calls' sum; a call with tokens and no price is counted beside
    it, never priced at $0; a turn of unpriced calls costs None."""
    store = recording.store
    usage = {"input_tokens": 1000, "output_tokens": 100}
    with loopscope.turn(session_id="priced", model="gpt-4o", provider="openai", input="one") as turn:
        with turn.round("gpt-4o", provider="openai") as rnd:
            rnd.response("asking", tool_calls=[{"id": "c1", "name": "t", "arguments": {}}], usage=usage)
        with loopscope.tool("t", call_id="c1") as call:
            call.set_result(1)
        turn.generation("done", usage=usage, model="gpt-4o", provider="openai")
    with loopscope.turn(session_id="mixed", model="gpt-4o", provider="openai", input="two") as turn:
        turn.generation("house", usage=usage, model="house-model-7", provider="openai")
        turn.generation("known", usage=usage, model="gpt-4o", provider="openai")
    with loopscope.turn(session_id="unpriced", model="house-model-7", provider="openai", input="three") as turn:
        turn.generation("house", usage=usage, model="house-model-7", provider="openai")
    cost = {s: [c.cost_usd for c in store.model_calls(s)] for s in ("priced", "mixed", "unpriced")}
    assert cost["priced"][0] and cost["priced"][1] and cost["mixed"][0] is None and cost["mixed"][1]
    assert cost["unpriced"] == [None]
    expected = {  # model calls, cost, calls without a price
        "priced": (2, sum(cost["priced"]), 0),
        "mixed": (2, cost["mixed"][1], 1),
        "unpriced": (1, None, 1),
    }

    def figures(row):
        return row["model_calls"], row["cost_usd"], row["unpriced_calls"]

    def same(got, want):
        assert got[0] == want[0] and got[2] == want[2]
        assert got[1] == (None if want[1] is None else pytest.approx(want[1]))

    for row in api.sessions(store)["sessions"]:
        same(figures(row), expected[row["session_id"]])
    for session, want in expected.items():
        [turn] = api.timeline(store, session)["turns"]
        same(figures(turn), want)
    data = api.turn_analytics(store)
    for row in data["slowest"]:
        same(figures(row), expected[row["session_id"]])
    models = {m["model"]: m for m in data["models"]}  # by the turn's model
    same(figures(models["gpt-4o"]), (4, sum(cost["priced"]) + cost["mixed"][1], 1))
    same(figures(models["house-model-7"]), expected["unpriced"])
    assert data["latency"][0]["avg_model_calls"] == pytest.approx(5 / 3)
    totals = api.overview(store)["totals"]
    same(figures(totals), (5, sum(cost["priced"]) + cost["mixed"][1], 2))
    assert api.timeline(store, "priced")["model_calls"][0]["refusal"] is None


@pytest.mark.parametrize("version", [7, 3])
def test_an_older_store_has_no_costs_and_counts_its_turns_unpriced(version, tmp_path):
    """A file from before model calls (read as it is): every page answers, no cost is $0."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "storage"))
    from test_migrations import unpack

    store = loopscope.Store(str(unpack(version, tmp_path)))
    with_usage = store.sql("SELECT count(*) FROM turns WHERE input_tokens IS NOT NULL OR output_tokens IS NOT NULL")[1][0][0]
    assert with_usage
    sessions = api.sessions(store)["sessions"]
    assert sessions and all(s["cost_usd"] is None for s in sessions)
    assert sum(s["unpriced_calls"] for s in sessions) == with_usage
    data = api.turn_analytics(store)
    assert all(t["cost_usd"] is None and t["model_calls"] == 0 for t in data["slowest"])
    assert all(m["cost_usd"] is None for m in data["models"])
    for session in sessions:
        page = api.timeline(store, session["session_id"])
        assert page["model_calls"] == [] and all(t["cost_usd"] is None for t in page["turns"])
    json.dumps([sessions, data], allow_nan=False)
