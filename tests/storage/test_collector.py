"""``loopscope collect``: the OTLP receiver, the invariant with the in-process store, bad
payloads, many processes, the command line."""

from __future__ import annotations

import base64
import gzip
import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import TracerProvider

import loopscope
from children import collect_child
from exporting import batch_leaves
from fakes.model_server import Reply, ToolCall, Usage
from loopscope.ingest.otlp.collector import Collector
from loopscope.storage.duckdb.connection import open_store

ROOT = Path(__file__).resolve().parents[2]

EVENT_COLUMNS = (
    "id, session_id, idx, type, created_at, correlation_id, source_channel_id, source_provider, source_framework, "
    "status, content::VARCHAR, trace_id, span_id"
)


def rows(db: Path | str, sql: str) -> list[tuple[Any, ...]]:
    # through the store's gate: a collector in this process may be writing the file
    with open_store(str(Path(db).resolve()), read_only=True) as con:
        return con.execute(sql).fetchall()


def events(db: Path | str) -> list[tuple[Any, ...]]:
    return rows(db, f"SELECT {EVENT_COLUMNS} FROM events ORDER BY session_id, idx")


def turns(db: Path | str) -> list[tuple[Any, ...]]:
    return rows(db, "SELECT * EXCLUDE (segments, usage, declared_tools), segments::VARCHAR, usage::VARCHAR, "
                    "declared_tools::VARCHAR FROM turns ORDER BY session_id, correlation_id")


def model_calls(db: Path | str) -> list[tuple[Any, ...]]:
    return rows(db, "SELECT * EXCLUDE (finish_reasons, provider_usage, parameters, input_messages, output_messages), "
                    "finish_reasons::VARCHAR, parameters::VARCHAR, input_messages::VARCHAR, output_messages::VARCHAR "
                    "FROM model_calls ORDER BY session_id, started_at, span_id")


def post(url: str, body: bytes, content_type: str = "application/x-protobuf", **headers: str) -> tuple[int, bytes, dict[str, str]]:
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": content_type, **headers})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


# -- the invariant ----------------------------------------------------------------------------------


def run_scenario(server: Any, in_tools: Callable[[], None] = lambda: None) -> None:
    """Hand API turns with tools (one fails), a nested turn, and an SDK tool loop through the
    openai adapter against the fake model server; ``in_tools`` runs inside each tool."""

    @loopscope.tool
    def weather(city: str) -> dict:
        in_tools()
        return {"city": city, "temp_c": 21}

    @loopscope.tool
    def book(room: str) -> str:
        in_tools()
        raise RuntimeError(f"room {room} is taken")

    for i in range(3):
        with loopscope.turn(session_id="hand", agent="concierge", input=f"Weather and a room, take {i}", model="m1", provider="openai") as t:
            t.generation("Checking the weather.", tool_calls=[
                {"id": f"w{i}", "name": "weather", "arguments": {"city": "Paris"}},
                {"id": f"b{i}", "name": "book", "arguments": {"room": "12"}},
            ], usage={"input_tokens": 30, "output_tokens": 5})
            weather("Paris")
            with pytest.raises(RuntimeError):
                book("12")
            with loopscope.turn(agent="helper", input="sub-question") as sub:
                sub.generation("sub answer", finish_reason="stop")
            t.generation(f"It is 21 °C; room 12 is taken ({i}).", finish_reason="stop", usage={"input_tokens": 50, "output_tokens": 9})

    server.queue(
        Reply(text="Let me look.", tool_calls=[ToolCall("weather", {"city": "Lyon"}, id="call_sdk_1")], usage=Usage(40, 8)),
        Reply(text="Lyon: 21 °C.", usage=Usage(60, 6)),
    )
    client = server.openai_client()
    tools = [{"type": "function", "function": {"name": "weather", "description": "Weather for a city",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    with loopscope.session("sdk"):
        history: list[Any] = [{"role": "user", "content": "Weather in Lyon?"}]
        first = client.chat.completions.create(model="gpt-test", messages=history, tools=tools)
        call = first.choices[0].message.tool_calls[0]
        history.append(first.choices[0].message.model_dump(exclude_none=True))
        result = weather(**json.loads(call.function.arguments))
        history.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
        client.chat.completions.create(model="gpt-test", messages=history, tools=tools)


@pytest.mark.parametrize("notices", ["none", "mid-tool"])
@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_local_store_and_collector_hold_the_same_events_and_turns(tmp_path, collector, model_server, protocol, notices, monkeypatch):
    """The same rows, in the same order, whether the runs' starts came as start notices (a
    batch left while each tool ran: its turn and itself were running) or only with their
    ended spans (every span ended before its batch left; nested turns included)."""
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "600000")  # batches leave when the test says, and at the end
    local = tmp_path / "local.duckdb"
    endpoint = collector.http_endpoint if protocol == "http/protobuf" else collector.grpc_endpoint
    pipeline = loopscope.configure(local, tracer_provider=TracerProvider(), otlp_endpoint=endpoint, otlp_protocol=protocol,
                                   capture_content=True, flush_interval=0.05)
    loopscope.instrument(anthropic=False)
    try:
        run_scenario(model_server, batch_leaves if notices == "mid-tool" else lambda: None)
    finally:
        loopscope.uninstrument()
        loopscope.shutdown()
    assert pipeline.dropped() == {"store": 0, "otlp": 0}
    collector.stop()  # writes what it holds
    mine, theirs = events(local), events(collector.db)
    assert len(mine) > 30
    assert {r[3] for r in mine} == {"message", "tool_call_start", "tool_call_end"}
    assert [r[:3] for r in theirs] == [r[:3] for r in mine]  # ids, sessions, indices: same order
    assert theirs == mine  # and everything else, content included
    assert turns(collector.db) == turns(local)
    assert len(turns(local)) == 7  # 3 hand turns, 3 nested ones, 1 stitched SDK turn
    # every model call a row, the same in both (cost included)
    assert model_calls(collector.db) == model_calls(local)
    assert len(model_calls(local)) == 11
    # a turn's input message comes first in its session, as in the local store
    first = rows(collector.db, "SELECT type, content->>'role' FROM events WHERE session_id = 'hand' AND idx = 1")
    assert first == [("message", "user")]
    # every span is also kept raw, pending copies are not
    raw = rows(collector.db, "SELECT role, count(*) FROM spans GROUP BY role ORDER BY role")
    assert dict(raw) == {"agent": 7, "chat": 11, "tool": 7}
    # mid-tool: the 3 outer turns, the SDK loop's turn and the 7 tool calls were running (the
    # nested turns were not); none: every span had ended
    assert collector.ingest.stats.pending == (11 if notices == "mid-tool" else 0)


def test_without_content_the_collector_keeps_every_row_without_its_text(tmp_path, collector, model_server):
    local = tmp_path / "local.duckdb"
    loopscope.configure(local, tracer_provider=TracerProvider(), otlp_endpoint=collector.http_endpoint,
                        capture_content=False, flush_interval=0.05)
    loopscope.instrument(anthropic=False)
    try:
        run_scenario(model_server)
    finally:
        loopscope.uninstrument()
        loopscope.shutdown()
    collector.stop()
    mine, theirs = events(local), events(collector.db)
    # the same rows (ids, sessions, indices, types): messages too, kept without their text
    assert [r[:4] for r in theirs] == [r[:4] for r in mine]
    messages = [(json.loads(m[10]), json.loads(t[10])) for m, t in zip(mine, theirs) if m[3] == "message"]
    assert len(messages) > 10 and all(m["body"] for m, _ in messages)
    assert all(t == {**m, "body": ""} for m, t in messages)
    assert len(turns(collector.db)) == len(turns(local)) == 7


def test_spans_without_pending_copies_still_give_every_row(tmp_path, collector):
    """The application's own exporter (no pending copies): start rows come from the ended span."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=collector.http_endpoint + "/v1/traces")))
    loopscope.configure(tmp_path / "local.duckdb", tracer_provider=provider, capture_content=True, flush_interval=0.05)

    @loopscope.tool
    def add(x: int, y: int) -> int:
        return x + y

    with loopscope.turn(session_id="own", agent="calc", input="1+2?") as t:
        t.generation("Adding.", tool_calls=[{"id": "a1", "name": "add", "arguments": {"x": 1, "y": 2}}])
        add(1, 2)
        t.generation("3", finish_reason="stop")
    loopscope.shutdown()
    collector.stop()
    types = [r[3] for r in events(collector.db)]
    # the same rows; the turn's input and the tool's start come when their spans end
    assert sorted(types) == sorted(r[3] for r in events(tmp_path / "local.duckdb"))
    assert {r[0] for r in events(collector.db)} == {r[0] for r in events(tmp_path / "local.duckdb")}
    assert turns(collector.db) == turns(tmp_path / "local.duckdb")


def test_a_forgotten_pending_id_is_looked_up_in_the_store(tmp_path):
    with Collector(str(tmp_path / "c.duckdb"), http_port=0, grpc_port=None, flush_interval=0.05) as collector:
        collector.ingest.max_pending_ids = 1  # remember one pending copy only
        loopscope.configure(tmp_path / "local.duckdb", tracer_provider=TracerProvider(), otlp_endpoint=collector.http_endpoint,
                            capture_content=True, flush_interval=0.05)

        @loopscope.tool
        def step(n: int) -> int:
            return n

        with loopscope.turn(session_id="long", agent="a", input="go") as t:
            t.generation("", tool_calls=[{"id": f"s{n}", "name": "step", "arguments": {"n": n}} for n in range(5)])
            for n in range(5):
                step(n)
            t.generation("done", finish_reason="stop")
        loopscope.shutdown()
    assert events(collector.db) == events(tmp_path / "local.duckdb")


def test_a_retried_request_is_not_written_twice(collector):
    provider = TracerProvider()
    body = _one_turn_payload(provider)
    for _ in range(3):
        status, _, _ = post(collector.http_endpoint + "/v1/traces", body)
        assert status == 200
    assert collector.ingest.stats.duplicates == 2 * collector.ingest.stats.spans // 3
    assert collector.ingest.writer.flush()
    assert len(rows(collector.db, "SELECT * FROM spans")) == collector.ingest.stats.spans // 3
    assert rows(collector.db, "SELECT count(*) FROM turns") == [(1,)]


# -- payloads -----------------------------------------------------------------------------------------


def _one_turn_payload(provider: TracerProvider | None = None) -> bytes:
    """The protobuf export request of one recorded turn with a tool call (no pending copies)."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    provider = provider or TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    loopscope.configure(False, tracer_provider=provider)

    @loopscope.tool
    def ping() -> str:
        return "pong"

    with loopscope.turn(session_id="payload", agent="p", input="ping?") as t:
        t.generation("", tool_calls=[{"id": "p1", "name": "ping", "arguments": {}}])
        ping()
        t.generation("pong", finish_reason="stop")
    loopscope.shutdown()
    return encode_spans(memory.get_finished_spans()).SerializeToString()


def _otlp_json(body: bytes) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    data = MessageToDict(request)
    for rs in data["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return data


def test_protobuf_json_and_gzip_bodies_are_stored(collector):
    body = _one_turn_payload()
    url = collector.http_endpoint + "/v1/traces"
    status, answer, headers = post(url, gzip.compress(body), **{"Content-Encoding": "gzip"})
    assert (status, answer, headers["Content-Type"]) == (200, b"", "application/x-protobuf")
    assert rows(collector.db, "SELECT count(*) FROM turns") == [(1,)]  # stored before the answer came
    # the same spans as OTLP/JSON (hex ids), under new ids so they are not taken for a retry
    data = _otlp_json(_one_turn_payload())
    status, answer, headers = post(url, json.dumps(data).encode(), "application/json")
    assert (status, json.loads(answer)) == (200, {})
    assert rows(collector.db, "SELECT count(*) FROM turns") == [(2,)]
    ids = rows(collector.db, "SELECT DISTINCT trace_id FROM events")
    assert all(len(i[0]) == 32 for i in ids)
    # metrics are accepted, not stored
    status, _, _ = post(collector.http_endpoint + "/v1/metrics", b"")
    assert status == 200 and collector.ingest.stats.metrics_requests == 1


def test_bad_payloads_get_a_reason_and_change_nothing(collector):
    url = collector.http_endpoint + "/v1/traces"
    assert post(url, _one_turn_payload())[0] == 200
    assert collector.ingest.writer.flush()
    before = (events(collector.db), turns(collector.db), rows(collector.db, "SELECT count(*) FROM spans"))

    def refused(status: int, body: bytes, content_type: str = "application/x-protobuf", path: str = "/v1/traces", **headers: str) -> str:
        got, answer, answer_headers = post(collector.http_endpoint + path, body, content_type, **headers)
        assert got == status, answer
        from google.rpc import status_pb2

        if answer_headers["Content-Type"] == "application/x-protobuf":  # a google.rpc.Status, as OTLP says
            message = status_pb2.Status.FromString(answer).message
        else:
            message = json.loads(answer)["message"]
        assert message
        return message

    assert "content type" in refused(415, b"{}", "text/plain")
    assert "not a valid OTLP protobuf" in refused(400, b"\xff\xfe garbage \x00\x01")
    assert "not valid JSON" in refused(400, b"{nope", "application/json")
    assert "OTLP export request" in refused(400, b'{"resourceSpans": 7}', "application/json")
    good = _otlp_json(_one_turn_payload())
    good["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"] = "zz" * 16
    assert "not hex" in refused(400, json.dumps(good).encode(), "application/json")
    good = _otlp_json(_one_turn_payload())
    for span in good["resourceSpans"][0]["scopeSpans"][0]["spans"]:  # every span: with good ones, a partial success
        span["spanId"] = "abcd"
    assert "spanId must be 8 bytes" in refused(400, json.dumps(good).encode(), "application/json")
    assert "not valid gzip" in refused(400, b"not gzip at all", **{"Content-Encoding": "gzip"})
    assert "content encoding" in refused(415, b"x", **{"Content-Encoding": "br"})
    assert "/v1/traces" in refused(404, b"", path="/v1/spans")
    # too large, as sent and once decompressed
    limit = collector.max_bytes
    assert "at most" in refused(413, b"\0" * (limit + 1))
    bomb = gzip.compress(b"\0" * (limit + 10))
    assert len(bomb) < limit and "once decompressed" in refused(413, bomb, **{"Content-Encoding": "gzip"})
    assert collector.ingest.writer.flush()
    after = (events(collector.db), turns(collector.db), rows(collector.db, "SELECT count(*) FROM spans"))
    assert after == before
    assert collector.ingest.stats.refused == 11
    # and the collector still takes good payloads
    assert post(url, _one_turn_payload())[0] == 200
    assert rows(collector.db, "SELECT count(*) FROM turns") == [(2,)]


def test_grpc_refuses_bad_spans_with_invalid_argument(collector):
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{collector.grpc_port}")
    stub = trace_service_pb2_grpc.TraceServiceStub(channel)
    request = trace_service_pb2.ExportTraceServiceRequest()
    request.ParseFromString(_one_turn_payload())
    for span in request.resource_spans[0].scope_spans[0].spans:  # every span: with good ones, a partial success
        span.trace_id = b"short"
    with pytest.raises(grpc.RpcError) as info:
        stub.Export(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "traceId must be 16 bytes" in info.value.details()
    request.ParseFromString(_one_turn_payload())
    stub.Export(request, timeout=10)
    channel.close()
    assert rows(collector.db, "SELECT count(*) FROM turns") == [(1,)]


def test_the_collector_binds_loopback_by_default(tmp_path):
    c = Collector(str(tmp_path / "x.duckdb"), http_port=0, grpc_port=0)
    assert c.host == "127.0.0.1"
    with c:
        assert c._http.server_address[0] == "127.0.0.1"


# -- many processes ---------------------------------------------------------------------------------

WORKER = textwrap.dedent("""
    import sys
    import loopscope
    worker, turns = int(sys.argv[1]), int(sys.argv[2])
    loopscope.configure(False, capture_content=True)  # export only: OTEL_EXPORTER_OTLP_ENDPOINT

    @loopscope.tool
    def lookup(key: str) -> str:
        return key.upper()

    for n in range(turns):
        with loopscope.turn(session_id=f"worker-{worker}", agent=f"w{worker}", input=f"job {n}") as t:
            t.generation(f"looking up {n}", tool_calls=[{"id": f"c{worker}-{n}", "name": "lookup", "arguments": {"key": f"k{n}"}}])
            lookup(f"k{n}")
            t.generation(f"done {n}", finish_reason="stop")
    loopscope.shutdown()
""")


def test_eight_worker_processes_share_one_store(tmp_path, collector):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({"OTEL_EXPORTER_OTLP_ENDPOINT": collector.http_endpoint, "LOOPSCOPE_STRICT": "1", "PYTHONPATH": str(ROOT)})
    turns_each = 40
    workers = [subprocess.Popen([sys.executable, str(script), str(w), str(turns_each)], env=env, stderr=subprocess.PIPE, text=True)
               for w in range(8)]
    for w in workers:
        _, err = w.communicate(timeout=120)
        assert w.returncode == 0, err
    collector.stop()
    per_session = dict(rows(collector.db, "SELECT session_id, count(*) FROM events GROUP BY 1"))
    assert per_session == {f"worker-{w}": turns_each * 5 for w in range(8)}  # input, text, start, end, text
    gaps = rows(collector.db, "SELECT session_id, min(idx), max(idx), count(DISTINCT idx) FROM events GROUP BY 1")
    assert all((lo, hi, n) == (1, turns_each * 5, turns_each * 5) for _, lo, hi, n in gaps)
    assert rows(collector.db, "SELECT count(*) FROM turns") == [(8 * turns_each,)]
    last = dict(rows(collector.db, "SELECT session_id, last_index FROM sessions"))
    assert last == {f"worker-{w}": turns_each * 5 for w in range(8)}
    # each session in the order its worker recorded it: input, text, tool start, tool end, text
    order = rows(collector.db, "SELECT type, content->>'role' FROM events WHERE session_id = 'worker-3' ORDER BY idx LIMIT 5")
    assert order == [("message", "user"), ("message", "assistant"), ("tool_call_start", None), ("tool_call_end", None),
                     ("message", "assistant")]


# -- the command line ----------------------------------------------------------------------------------


def test_loopscope_collect_command(tmp_path):
    db = tmp_path / "cli.duckdb"
    with collect_child(db) as child:
        assert post(child.http + "/v1/traces", _one_turn_payload())[0] == 200
        out = child.stop_ok(30)
    assert "stopped;" in out
    assert rows(db, "SELECT count(*) FROM turns") == [(1,)]


def test_collect_reports_a_taken_port(tmp_path, collector):
    from loopscope.cli import main

    code = main(["--db", str(tmp_path / "y.duckdb"), "collect", "--http-port", str(collector.http_port), "--no-grpc"])
    assert code == 2


def test_odd_values_in_spans_that_claim_to_be_ours_do_not_stop_the_collector(collector, monkeypatch):
    """A collector takes spans from anyone: values of the wrong type are stored as text or
    left out, never a reason to stop (outside the tests' strict mode, as in production)."""
    from loopscope import _guard

    monkeypatch.setattr(_guard, "_strict", False)
    data = _otlp_json(_one_turn_payload())
    scope_spans = data["resourceSpans"][0]["scopeSpans"][0]
    assert scope_spans["scope"]["name"] == "loopscope"
    for span in scope_spans["spans"]:
        span["attributes"] += [
            {"key": "loopscope.turn.tool_calls_count", "value": {"stringValue": "many"}},
            {"key": "loopscope.turn.segments", "value": {"intValue": "123"}},
            {"key": "gen_ai.tool.call.arguments", "value": {"kvlistValue": {"values": [{"key": "a", "value": {"intValue": "1"}}]}}},
            {"key": "loopscope.round.text", "value": {"arrayValue": {"values": [{"boolValue": True}]}}},
            {"key": "gen_ai.conversation.id", "value": {"bytesValue": "AAE="}},
        ]
    status, _, _ = post(collector.http_endpoint + "/v1/traces", json.dumps(data).encode(), "application/json")
    assert status == 200
    assert post(collector.http_endpoint + "/v1/traces", _one_turn_payload())[0] == 200
    assert rows(collector.db, "SELECT count(*) FROM turns WHERE session_id = 'payload'") == [(1,)]
    assert collector.ingest.writer.flush()
    assert rows(collector.db, "SELECT count(*) FROM spans") == [(8,)]


def test_starts_leave_as_log_record_notices_never_as_spans(tmp_path, monkeypatch):
    """A started agent run or tool call is announced as an OTLP log record (a start notice),
    before the spans of its batch; no span a tracing backend would count is added."""
    from fakes import otlp_receiver

    receiver, server = otlp_receiver.start()
    try:
        loopscope.configure(tmp_path / "p.duckdb", tracer_provider=TracerProvider(), otlp_endpoint=receiver.endpoint, flush_interval=0.05)

        @loopscope.tool
        def noop() -> None:
            batch_leaves()  # while the turn and the tool run

        with loopscope.turn(session_id="p", agent="pa") as t:
            t.generation("", tool_calls=[{"id": "n1", "name": "noop", "arguments": {}}])
            noop()
            t.generation("ok", finish_reason="stop")
        loopscope.shutdown()
        assert receiver.wait_for(lambda r: len(r.spans) >= 4 and len(r.notices) >= 2)
        assert receiver.pending == []  # no span copies
        assert sorted(s.name for s in receiver.spans) == ["chat", "chat", "execute_tool noop", "invoke_agent pa"]
        real = {s.span_id: s for s in receiver.spans}
        assert sorted(n.name for n in receiver.notices) == ["execute_tool noop", "invoke_agent pa"]
        for notice in receiver.notices:
            target = real[notice.span_id]  # the log record names the span it announces
            assert notice.trace_id == target.trace_id
            assert notice.attributes["event_name"] == "loopscope.span.start"
            assert notice.attributes["gen_ai.operation.name"] == target.attributes["gen_ai.operation.name"]
            assert target.attributes["loopscope.pending_sent"] is True
        assert receiver.paths.index("/v1/logs") < receiver.paths.index("/v1/traces")  # notices first

        # a turn that ended before its batch left: its span carries its start, no notice is made
        receiver.spans.clear()
        receiver.notices.clear()
        loopscope.configure(tmp_path / "p.duckdb", tracer_provider=TracerProvider(), otlp_endpoint=receiver.endpoint, flush_interval=0.05)
        with loopscope.turn(session_id="p1", agent="pq") as t:
            t.generation("ok", finish_reason="stop")
        batch_leaves()
        loopscope.shutdown()
        assert receiver.wait_for(lambda r: len(r.spans) >= 2)
        assert receiver.notices == [] and receiver.pending == []
        assert [s.attributes.get("loopscope.pending_sent") for s in receiver.spans] == [None, None]

        monkeypatch.setenv("LOOPSCOPE_OTLP_PENDING", "0")
        receiver.spans.clear()
        receiver.notices.clear()
        loopscope.configure(tmp_path / "p.duckdb", tracer_provider=TracerProvider(), otlp_endpoint=receiver.endpoint, flush_interval=0.05)
        with loopscope.turn(session_id="p2", agent="pb") as t:
            t.generation("ok", finish_reason="stop")
        loopscope.shutdown()
        assert receiver.wait_for(lambda r: len(r.spans) >= 2)
        assert receiver.notices == [] and receiver.pending == []
    finally:
        server.shutdown()


def test_an_endpoint_without_logs_is_asked_once_and_the_spans_still_go(tmp_path, caplog):
    """A span-only backend refuses /v1/logs: notices stop after the first refusal (counted,
    one INFO line, nothing retried) and every span is sent and counted as sent."""
    from fakes import otlp_receiver

    receiver, server = otlp_receiver.start()
    receiver.logs_status = 404
    try:
        pipeline = loopscope.configure(tmp_path / "r.duckdb", tracer_provider=TracerProvider(), otlp_endpoint=receiver.endpoint, flush_interval=0.05)
        assert pipeline.exporter is not None and pipeline.exporter.notices is not None
        for n in range(3):
            with loopscope.turn(session_id="r", agent="ra") as t:
                pipeline.exporter.force_flush()  # while the turn runs: its start notice is due
                t.generation(f"ok {n}", finish_reason="stop")
        notices = pipeline.exporter.notices
        loopscope.shutdown()
        assert receiver.wait_for(lambda r: len(r.spans) >= 6)
        assert receiver.paths.count("/v1/logs") == 1  # refused once, never asked again
        # the first turn's notice was refused; the next turns made none
        assert not notices.enabled and notices.refused == 1 and notices.sent == 0 and notices.failed == 0
        assert pipeline.dropped()["otlp"] == 0  # the spans all went
        assert not [r for r in caplog.records if r.levelno >= 30 and "loopscope" in r.getMessage()]
    finally:
        server.shutdown()


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_the_collector_shows_a_running_turn_and_tool_from_their_start_notices(tmp_path, collector, monkeypatch, protocol):
    """While a tool runs, the collector's store already holds the turn's input and the tool
    call's start row (status pending): the start notices brought them, the spans have not ended."""
    import contextvars
    import threading

    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")  # export batches every 50 ms
    endpoint = collector.http_endpoint if protocol == "http/protobuf" else collector.grpc_endpoint
    loopscope.configure(tmp_path / "local.duckdb", tracer_provider=TracerProvider(), otlp_endpoint=endpoint, otlp_protocol=protocol,
                        capture_content=True, flush_interval=0.05)
    running, release = threading.Event(), threading.Event()

    @loopscope.tool
    def slow(n: int) -> int:
        running.set()
        release.wait(30)
        return n

    def seen() -> list[tuple[Any, ...]]:
        return rows(collector.db, "SELECT type, content->>'status' FROM events WHERE session_id = 'live' ORDER BY idx")

    try:
        with loopscope.turn(session_id="live", agent="a", input="go") as t:
            t.generation("", tool_calls=[{"id": "w1", "name": "slow", "arguments": {"n": 1}}])
            worker = threading.Thread(target=contextvars.copy_context().run, args=(slow, 1))  # in the turn
            worker.start()
            assert running.wait(10)
            deadline = time.monotonic() + 20
            while seen() != [("message", None), ("tool_call_start", "pending")] and time.monotonic() < deadline:
                time.sleep(0.05)
            assert seen() == [("message", None), ("tool_call_start", "pending")]
            release.set()
            worker.join()
            t.generation("done", finish_reason="stop")
    finally:
        release.set()
        loopscope.shutdown()
    collector.stop()
    assert events(collector.db) == events(tmp_path / "local.duckdb")
    assert collector.ingest.stats.pending == 2  # the turn and the tool call, from their notices


def test_other_log_records_are_accepted_and_not_kept(collector):
    """An application's own log records sent to /v1/logs are answered 200 and stored nowhere;
    a logs body that is not OTLP is refused with a reason, as a traces body would be."""
    record = {"timeUnixNano": "1700000000000000000", "severityNumber": 9, "body": {"stringValue": "user logged in"},
              "traceId": "0" * 31 + "1", "spanId": "0" * 15 + "2",
              "attributes": [{"key": "loopscope.span.name", "value": {"stringValue": "not a notice"}}]}
    body = json.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": [record]}]}]}).encode()
    status, _, _ = post(collector.http_endpoint + "/v1/logs", body, "application/json")
    assert status == 200
    assert collector.ingest.stats.logs_requests == 1 and collector.ingest.stats.pending == 0
    assert rows(collector.db, "SELECT count(*) FROM events") == [(0,)]
    assert post(collector.http_endpoint + "/v1/logs", b"\x0a\xff\xff", "application/x-protobuf")[0] == 400
