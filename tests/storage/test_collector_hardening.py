"""``loopscope collect`` under hostile requests and crashes: DNS rebinding (Host, Origin),
the bearer token, requests resent after a restart, the byte bound on requests held,
idle connections, and JSON nested too deeply."""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from test_collector import ROOT, _one_turn_payload, rows

from children import collect_child
from idle_sockets import serve_past_idle_sockets
from loopscope.ingest.otlp.collector import Collector
from loopscope.storage.duckdb.connection import open_store

PROTOBUF = "application/x-protobuf"


def send(port: int, body: bytes, headers: dict[str, str] | None = None, path: str = "/v1/traces",
         content_type: str = PROTOBUF) -> tuple[int, dict[str, str], bytes]:
    """POST to 127.0.0.1:port with exactly these headers (``Host`` included, when given)."""
    headers = {"Content-Type": content_type, "Content-Length": str(len(body)), **(headers or {})}
    con = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        con.putrequest("POST", path, skip_host="Host" in headers, skip_accept_encoding=True)
        for key, value in headers.items():
            con.putheader(key, value)
        con.endheaders(body)
        response = con.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        con.close()


def counts(db: str) -> tuple[int, ...]:
    return rows(db, "SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM turns), (SELECT count(*) FROM spans), "
                    "(SELECT coalesce(sum(last_index), 0) FROM sessions)")[0]


# -- DNS rebinding, and the token --------------------------------------------------------------------


def test_a_request_for_another_host_or_from_another_site_is_refused_and_stores_nothing(collector):
    body = _one_turn_payload()
    port = collector.http_port
    # what a web page gets after rebinding evil.example to 127.0.0.1
    status, _, answer = send(port, body, {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"})
    assert status == 421 and b"Host" in answer
    # addressed to the collector, but sent by another site's page
    status, _, answer = send(port, body, {"Host": f"127.0.0.1:{port}", "Origin": "http://evil.example"})
    assert status == 403 and b"Origin" in answer
    status, _, _ = send(port, body, {"Host": f"localhost:{port}", "Origin": "null"})
    assert status == 403
    assert collector.ingest.writer.flush()
    assert rows(collector.db, "SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM turns), (SELECT count(*) FROM spans)") == [(0, 0, 0)]
    assert collector.ingest.stats.misdirected == 3
    # the collector's own names, and a local page, are answered
    assert send(port, body, {"Host": f"localhost:{port}", "Origin": f"http://127.0.0.1:{port}"})[0] == 200
    assert rows(collector.db, "SELECT count(*) FROM turns") == [(1,)]


def test_beyond_loopback_the_host_may_be_an_address_or_this_machine_never_another_name():
    from loopscope._http import HostRule

    rule = HostRule("0.0.0.0", ["collector.internal"])
    for host in ("10.1.2.3:4318", "[fd00::1]:4318", "127.0.0.1", f"{socket.gethostname()}:4318", "collector.internal:4318"):
        assert rule.allows_host(host), host
    assert not rule.allows_host("evil.example:4318")
    assert not rule.allows_origin("http://evil.example")
    # on loopback, only loopback names and the bound address
    local = HostRule("127.0.0.1")
    assert local.allows_host("localhost:1") and local.allows_host("[::1]:1")
    assert not local.allows_host("10.1.2.3") and not local.allows_host(f"{socket.gethostname()}.evil.example")


def test_with_a_token_every_request_must_carry_it_over_http_and_grpc(tmp_path):
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    body = _one_turn_payload()
    with Collector(str(tmp_path / "t.duckdb"), http_port=0, grpc_port=0, flush_interval=0.05, token="s3cret-token") as c:
        port = c.http_port
        status, headers, _ = send(port, body)
        assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
        assert send(port, body, {"Authorization": "Bearer wrong"})[0] == 401
        assert send(port, body, {"Authorization": "Basic czNjcmV0LXRva2Vu"})[0] == 401
        # a page cannot know the token, so any Host is answered with it (a name the senders use)
        assert send(port, body, {"Authorization": "Bearer s3cret-token", "Host": "collector.example"})[0] == 200
        request = ExportTraceServiceRequest()
        request.ParseFromString(_one_turn_payload())
        channel = grpc.insecure_channel(f"127.0.0.1:{c.grpc_port}")
        stub = trace_service_pb2_grpc.TraceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Export(request, timeout=10)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        stub.Export(request, timeout=10, metadata=[("authorization", "Bearer s3cret-token")])
        channel.close()
        assert c.ingest.stats.unauthorized == 4
    assert rows(str(tmp_path / "t.duckdb"), "SELECT count(*) FROM turns") == [(2,)]


def test_the_collect_command_takes_its_token_from_the_environment(tmp_path):
    db = tmp_path / "cli.duckdb"
    with collect_child(db, "--no-grpc", env={**os.environ, "LOOPSCOPE_COLLECT_TOKEN": "from-env"}) as child:
        body = _one_turn_payload()
        assert send(child.port, body)[0] == 401
        assert send(child.port, body, {"Authorization": "Bearer from-env"})[0] == 200
        out = child.stop_ok(30)
    assert "1 not allowed" in out
    assert rows(db, "SELECT count(*) FROM turns") == [(1,)]


def _status(db, *flags: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "loopscope", "--db", str(db), "status", *flags],
                          check=False, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_requests_the_collect_command_refuses_are_counted_in_status(tmp_path):
    db = tmp_path / "refused.duckdb"
    body = _one_turn_payload()  # one turn
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
    with collect_child(db, "--no-grpc", "--max-spans", str(spans)) as child:
        status, _, answer = send(child.port, _merged(body, _one_turn_payload()))
        assert status == 413 and b"--max-spans" in answer
        assert send(child.port, b"\x00garbage")[0] == 400  # a bad payload
        assert send(child.port, body)[0] == 200  # within the bound: stored (and its rows written, answered after)
        # the refusals' row is written by a flush of their own, right after them: wait for it
        deadline = time.monotonic() + 60
        while True:
            totals = json.loads(_status(db, "--json"))["totals"]
            if totals["refused_requests"] == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert (totals["refused_requests"], totals["refused_spans"]) == (2, 2 * spans)
        text = _status(db)
        assert "2 traces requests refused by loopscope collect" in text and f"{2 * spans} spans in those over --max-spans" in text
        assert "nothing was dropped" not in text
        out = child.stop_ok(30)
    assert "2 refused (1 of them over --max-spans)" in out
    # kept in the store after the collector stopped, with the last reason
    [writer] = [w for w in json.loads(_status(db, "--json"))["writers"] if w["refused_requests"]]
    assert (writer["refused_requests"], writer["refused_spans"]) == (2, 2 * spans)
    assert writer["last_refused"].startswith("400 ")
    assert rows(db, "SELECT count(*) FROM turns") == [(1,)]


def test_a_grpc_request_over_max_spans_is_counted_in_the_store(tmp_path):
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    from loopscope.cli.status import read_status

    db = str(tmp_path / "grpc.duckdb")
    request = ExportTraceServiceRequest()
    request.ParseFromString(_one_turn_payload())
    spans = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
    with Collector(db, http_port=None, grpc_port=0, flush_interval=0.05, max_spans=spans - 1) as c:
        channel = grpc.insecure_channel(f"127.0.0.1:{c.grpc_port}")
        with pytest.raises(grpc.RpcError) as info:
            trace_service_pb2_grpc.TraceServiceStub(channel).Export(request, timeout=30)
        channel.close()
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    totals = read_status(db)["totals"]
    assert (totals["refused_requests"], totals["refused_spans"]) == (1, spans)


# -- resent after a crash --------------------------------------------------------------------------------


def _merged(*bodies: bytes) -> bytes:
    request = ExportTraceServiceRequest()
    for body in bodies:
        request.MergeFromString(body)
    return request.SerializeToString()


def test_requests_resent_to_a_restarted_collector_add_no_rows(tmp_path):
    """A collector killed after storing a request but before answering it gets the request
    again from its sender, after a restart that forgot the spans it had seen."""
    db = str(tmp_path / "resent.duckdb")
    first, second = _one_turn_payload(), _one_turn_payload()  # two turns of session "payload"

    def run(body: bytes) -> None:
        with Collector(db, http_port=0, grpc_port=None, flush_interval=0.05) as c:
            assert send(c.http_port, body)[0] == 200

    run(first)
    once = counts(db)
    assert once[0] > 0 and once[1] == 1
    run(first)  # the same request again
    assert counts(db) == once
    run(_merged(first, second))  # the unanswered request again, with more spans after it
    events, turns, spans, last_index = counts(db)
    assert (events, turns, spans) == (2 * once[0], 2, 2 * once[2])
    # no id twice, and the session numbered on without a gap
    assert rows(db, "SELECT count(DISTINCT id), count(DISTINCT span_id || type) FROM events") == [(events, events)]
    assert rows(db, "SELECT count(DISTINCT span_id) FROM turns") == [(2,)]
    assert rows(db, "SELECT min(idx), max(idx), count(DISTINCT idx) FROM events WHERE session_id = 'payload'") == [(1, events, events)]
    assert last_index == events


# -- memory -------------------------------------------------------------------------------------------------


def test_requests_past_the_byte_bound_get_503_until_the_bytes_are_given_back(tmp_path):
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    first, second = _one_turn_payload(), _one_turn_payload()
    db = str(tmp_path / "bounded.duckdb")
    # room for one request at a time: the second waits for the first's rows to be written
    with Collector(db, http_port=0, grpc_port=0, flush_interval=0.05, flush_timeout=60,
                   max_queued_bytes=len(first) + 64) as c:
        answers: list[int] = []
        with open_store(c.db, read_only=False):  # the file held: the first request's rows wait
            sender = threading.Thread(target=lambda: answers.append(send(c.http_port, first)[0]))
            sender.start()
            deadline = time.monotonic() + 30
            while c.ingest.stats.requests < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert c.ingest.stats.requests == 1, "the first request never reached the collector"
            status, headers, answer = send(c.http_port, second)
            assert status == 503 and headers.get("Retry-After") == "1" and b"--max-queued-bytes" in answer
            request = ExportTraceServiceRequest()
            request.ParseFromString(second)
            channel = grpc.insecure_channel(f"127.0.0.1:{c.grpc_port}")
            with pytest.raises(grpc.RpcError) as info:
                trace_service_pb2_grpc.TraceServiceStub(channel).Export(request, timeout=10)
            channel.close()
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        sender.join(60)
        assert answers == [200]
        assert (c.ingest.stats.busy, c.ingest.stats.busy_bytes) == (2, 2 * len(second))
        assert c.ingest.writer.flush()
        assert c.ingest.budget.used == 0  # every byte given back
        assert send(c.http_port, second)[0] == 200  # the sender's retry
    assert rows(db, "SELECT count(*) FROM turns") == [(2,)]


# -- connections ---------------------------------------------------------------------------------------------


def test_idle_connections_are_closed_and_bounded_and_requests_still_answered(tmp_path):
    with Collector(str(tmp_path / "idle.duckdb"), http_port=0, grpc_port=None, flush_interval=0.05,
                   max_connections=2, socket_timeout=0.5) as c:
        assert serve_past_idle_sockets(c.http_port, lambda: send(c.http_port, _one_turn_payload())[0]) <= 2
    assert rows(str(tmp_path / "idle.duckdb"), "SELECT count(*) FROM turns") == [(1,)]


# -- hostile JSON ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [100_000, 5_000])
def test_json_nested_too_deeply_gets_400_with_a_reason(collector, depth):
    body = b'{"resourceSpans": ' + b"[" * depth + b"]" * depth + b"}"
    status, _, answer = send(collector.http_port, body, content_type="application/json")
    assert status == 400
    assert "nested too deeply" in json.loads(answer)["message"]
    # and deep values inside a well-formed request
    deep: Any = "x"
    for _ in range(depth // 100):
        deep = {"arrayValue": {"values": [deep if isinstance(deep, dict) else {"stringValue": deep}]}}
    span = {"traceId": "1" * 32, "spanId": "2" * 16, "name": "s", "attributes": [{"key": "k", "value": deep}]}
    request = {"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}
    try:
        text = json.dumps(request).encode()
    except RecursionError:
        return
    status, _, answer = send(collector.http_port, text, content_type="application/json")
    assert status in (200, 400)  # an answer, not a closed connection
    assert send(collector.http_port, _one_turn_payload())[0] == 200
