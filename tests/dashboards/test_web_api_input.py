"""The dashboard's API against what a store and a request may hold: a tool result with
NaN and infinities (JSON has neither: they are answered as null, never a dropped
connection), and hostile query parameters (answered 400, never 500). The CLI's ``--json``
output of the same store stays valid JSON."""

from __future__ import annotations

import http.client
import json
import math
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import webdata
from opentelemetry.sdk.trace import TracerProvider

import loopscope
from fakes.model_server import FakeModelServer, Reply, ToolCall
from loopscope.cli import main
from loopscope.dashboards.web import api
from loopscope.dashboards.web.server import make_server

SESSION = "nan-session"
RESULT = {"mean": math.nan, "max": math.inf, "min": -math.inf, "values": [1.5, math.nan], "n": 2}
SHOWN = {"mean": None, "max": None, "min": None, "values": [1.5, None], "n": 2}


def strict_json(text: str | bytes) -> Any:
    """``json.loads`` that refuses NaN and the infinities, as every other JSON reader does."""
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def nan_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store in which a real tool returned NaN and infinities, through the openai SDK's
    tool loop against the fake model server."""
    db = tmp_path_factory.mktemp("nan") / "nan.duckdb"
    loopscope.configure(db, tracer_provider=TracerProvider(), flush_interval=0.05)
    loopscope.instrument()

    @loopscope.tool
    def summarize(column: str) -> dict[str, Any]:
        return RESULT

    try:
        with FakeModelServer() as server, loopscope.session(SESSION):
            server.queue(Reply(tool_calls=[ToolCall("summarize", {"column": "latency"}, id="call_s")]), Reply(text="The mean is undefined."))
            client = server.openai_client()
            messages: list[dict[str, Any]] = [{"role": "user", "content": "summarize latency"}]
            first = client.chat.completions.create(model="gpt-4o", messages=messages)
            call = first.choices[0].message.tool_calls[0]
            summarize(**json.loads(call.function.arguments))
            messages += [first.choices[0].message.model_dump(exclude_none=True),
                         {"role": "tool", "tool_call_id": call.id, "content": "mean: nan"}]
            client.chat.completions.create(model="gpt-4o", messages=messages)
    finally:
        loopscope.uninstrument()
        loopscope.shutdown()
    return db


@pytest.fixture(scope="module")
def nan_dashboard(nan_db: Path):
    yield from webdata.running(make_server(str(nan_db), port=0))


def get(server: Any, path: str) -> tuple[int, bytes]:
    """One GET; a dropped connection raises (http.client.RemoteDisconnected) and fails the test."""
    host, port = server.server_address[:2]
    con = http.client.HTTPConnection(host, port, timeout=30)
    try:
        con.request("GET", path)
        response = con.getresponse()
        return response.status, response.read()
    finally:
        con.close()


def test_a_tool_result_with_nan_and_infinities_is_answered_as_null(nan_dashboard):
    status, body = get(nan_dashboard, f"/api/timeline?session={quote(SESSION)}")
    assert status == 200, body
    page = strict_json(body)
    [end] = [e for e in page["events"] if e["type"] == "tool_call_end"]
    assert end["content"]["result"] == SHOWN
    status, body = get(nan_dashboard, f"/api/event?id={quote(end['id'])}")  # the event whole
    assert status == 200 and strict_json(body)["content"]["result"] == SHOWN
    for path in ("/api/overview", "/api/sessions", "/api/tools?range=all", "/api/tools?range=all&tool=summarize",
                 "/api/turns?range=all", "/api/declared?range=all"):
        status, body = get(nan_dashboard, path)
        assert status == 200, (path, body)
        strict_json(body)


def test_the_api_makes_every_nan_null():
    assert api.json_safe({"a": [math.nan, {"b": math.inf}], "c": (1.0, -math.inf), "d": "NaN"}) == {
        "a": [None, {"b": None}], "c": [1.0, None], "d": "NaN"}
    plain = {"a": [1.0, {"b": 2}]}
    assert api.json_safe(plain) is plain


HOSTILE = ("1e23", "-1", "abc", "99999999999999999999999", "-99999999999999999999999", "NaN", "inf", "1.5", "0x10", "", " ")
NUMERIC = {"/api/sessions": ("limit", "offset"), "/api/timeline": ("limit", "after", "before")}
OTHER = {"/api/overview": (), "/api/sessions": ("q",), "/api/timeline": ("session",), "/api/event": ("id",),
         "/api/tools": ("range", "tool"), "/api/turns": ("range",), "/api/declared": ("range",)}
BASE = {"/api/timeline": f"session={quote(SESSION)}&", "/api/event": "id=x&"}


@pytest.mark.parametrize("endpoint", sorted(OTHER))
def test_hostile_parameters_get_400_never_500_nor_a_dropped_connection(nan_dashboard, endpoint):
    for name in NUMERIC.get(endpoint, ()):
        for value in HOSTILE:
            if not value.strip():
                continue  # an empty parameter is an absent one
            status, body = get(nan_dashboard, f"{endpoint}?{BASE.get(endpoint, '')}{name}={quote(value)}")
            assert status == 400, (endpoint, name, value, status, body)
            assert name in strict_json(body)["error"], body  # the message names the parameter
    for name in (*OTHER[endpoint], "limit", "offset", "after", "before"):
        for value in HOSTILE:
            status, body = get(nan_dashboard, f"{endpoint}?{BASE.get(endpoint, '')}{name}={quote(value)}")
            assert status in (200, 400, 404), (endpoint, name, value, status, body)
            strict_json(body)


def test_page_bounds_hold_on_the_python_api_too(nan_db):
    store = loopscope.Store(str(nan_db))
    with pytest.raises(api.ApiError, match="offset must be a whole number from 0 to"):
        api.sessions(store, offset=10**23)
    with pytest.raises(api.ApiError, match="offset"):
        api.sessions(store, offset=1e23)  # type: ignore[arg-type]
    with pytest.raises(api.ApiError, match="after"):
        api.timeline(store, SESSION, after_index=-1)
    with pytest.raises(api.ApiError, match="before"):
        api.timeline(store, SESSION, before_index=2**64)
    assert api.sessions(store, offset=api.MAX_OFFSET)["sessions"] == []


@pytest.mark.parametrize("argv", [
    ("timeline", SESSION), ("tail", SESSION), ("turns",), ("tools",), ("sessions",), ("stats",), ("calls",), ("status",),
    ("sql", "SELECT 'NaN'::DOUBLE AS x, 'inf'::DOUBLE AS y, content FROM events"),
], ids=lambda argv: argv[0])
def test_the_clis_json_with_nan_values_is_valid_json(nan_db, capsys, argv):
    code = main(["--db", str(nan_db), *argv, "--json"])
    out = capsys.readouterr().out
    assert code == 0 and out.strip()
    if argv[0] == "tail":  # JSON Lines
        values = [strict_json(line) for line in out.splitlines()]
        assert any(v["content"].get("result") == SHOWN for v in values)
    else:
        strict_json(out)
