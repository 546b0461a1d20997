"""``loopscope collect`` under requests built to be costly: a long chain of parent links,
more spans than it takes in one request, and spans whose start notices never arrived
(a request resent after a restart). Each goes over real OTLP/HTTP on loopback."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.trace import TracerProvider
from test_collector import events, rows, turns

import loopscope
from children import collect_child
from exporting import batch_leaves
from loopscope.ingest.otlp.collector import Collector

T0 = 1_700_000_000_000_000_000


def post(url: str, body: bytes, timeout: float = 60) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/x-protobuf"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _kv(key: str, value: str) -> common_pb2.KeyValue:
    return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(string_value=value))


def _agents_and_chats(i: int) -> str:
    return "chat" if i % 2 else "invoke_agent"


def chain_payload(n: int, *, trace: int = 7, parents_first: bool = True, first_id: int = 1,
                  kind: Callable[[int], str | None] = _agents_and_chats) -> bytes:
    """One OTLP request of ``n`` spans of the official GenAI instrumentation, each the
    parent of the next: by default agent runs and model calls by turns (``invoke_agent``,
    ``chat``, ``invoke_agent``, ...; ``kind(i)``: None for a span of no GenAI kind),
    parents first (the order that made the search quadratic)."""
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.append(_kv("service.name", "chain"))
    scope_spans = resource_spans.scope_spans.add()
    scope_spans.scope.name = "opentelemetry.instrumentation.openai_v2"
    spans = []
    for i in range(n):
        span = trace_pb2.Span(trace_id=trace.to_bytes(16, "big"), span_id=(first_id + i).to_bytes(8, "big"),
                              start_time_unix_nano=T0 + i * 1000, end_time_unix_nano=T0 + 10**9 - i * 1000)
        if i:
            span.parent_span_id = (first_id + i - 1).to_bytes(8, "big")
        op = kind(i)
        if op == "invoke_agent":
            span.name = f"invoke_agent a{i}"
            span.attributes.extend([_kv("gen_ai.operation.name", "invoke_agent"), _kv("gen_ai.agent.name", f"a{i}")])
        elif op == "chat":
            span.name = "chat m"
            span.attributes.extend([_kv("gen_ai.operation.name", "chat"), _kv("gen_ai.request.model", "m"),
                                    _kv("gen_ai.provider.name", "openai")])
        else:
            span.name = f"step {i}"
        spans.append(span)
    scope_spans.spans.extend(spans if parents_first else spans[::-1])
    return request.SerializeToString()


def test_a_chain_of_twenty_thousand_spans_is_stored_in_one_request(tmp_path):
    """On the command's collector (a child process, killed if it hangs): the request is
    answered well within the generous timeout (the descendant search was quadratic:
    2,000 spans took 8 s, 20,000 would take many minutes), and every span has its row."""
    db = tmp_path / "chain.duckdb"
    n = 20_000
    with collect_child(db, "--no-grpc", "--idle", "3600") as child:
        status, _ = post(child.http + "/v1/traces", chain_payload(n), timeout=240)
        assert status == 200
        # and a one-span request after it is answered too (it waited behind the chain before)
        assert post(child.http + "/v1/traces", chain_payload(1, trace=8, first_id=n + 1), timeout=60)[0] == 200
        out = child.stop_ok()
    assert "stopped;" in out
    # every agent run a turn of its own, every model call a row (those under no agent run
    # that has not ended: mapped alone when the collector stops, each a stitched turn)
    assert rows(db, "SELECT count(*) FROM model_calls") == [(n // 2,)]
    assert rows(db, "SELECT count(*) FROM turns") == [(n + 1,)]
    assert rows(db, "SELECT count(*) FROM spans") == [(n + 1,)]


def test_children_first_each_agent_run_gets_the_model_call_under_it(tmp_path):
    """The order exporters send (children end first), deeper than any fixed search depth:
    each agent run's turn holds the one model call below it."""
    n = 2_000
    with Collector(str(tmp_path / "c.duckdb"), http_port=0, grpc_port=None, flush_interval=0.05) as collector:
        assert post(collector.http_endpoint + "/v1/traces", chain_payload(n, parents_first=False), timeout=120)[0] == 200
    calls = rows(collector.db, "SELECT correlation_id, agent, span_id FROM model_calls")
    assert len(calls) == n // 2
    for correlation_id, agent, span_id in calls:
        run = int(span_id, 16) - 1  # the agent run right above it (span ids count from 1)
        assert (correlation_id, agent) == (f"{run:016x}", f"a{run - 1}")
    assert rows(collector.db, "SELECT count(*) FROM turns") == [(n // 2,)]


def test_a_model_call_far_below_its_agent_run_joins_its_turn(tmp_path):
    """An agent run, 1,000 spans of no GenAI kind below it, a model call below those (sent
    children first): the model call is the run's, however deep (the search stopped at 256)."""
    n = 1_002

    def kind(i: int) -> str | None:
        return "invoke_agent" if i == 0 else "chat" if i == n - 1 else None

    with Collector(str(tmp_path / "c.duckdb"), http_port=0, grpc_port=None, flush_interval=0.05) as collector:
        assert post(collector.http_endpoint + "/v1/traces", chain_payload(n, parents_first=False, kind=kind))[0] == 200
    assert rows(collector.db, "SELECT correlation_id, agent FROM model_calls") == [(f"{1:016x}", "a0")]
    assert rows(collector.db, "SELECT correlation_id FROM turns") == [(f"{1:016x}",)]  # one turn, not a stitched one beside


def test_more_spans_than_the_bound_are_refused_whole_and_counted(tmp_path):
    with Collector(str(tmp_path / "c.duckdb"), http_port=0, grpc_port=0, flush_interval=0.05, max_spans=100) as collector:
        status, answer = post(collector.http_endpoint + "/v1/traces", chain_payload(101))
        assert status == 413
        assert b"101 spans" in answer and b"at most 100" in answer
        with grpc.insecure_channel(f"127.0.0.1:{collector.grpc_port}") as channel:
            request = ExportTraceServiceRequest()
            request.ParseFromString(chain_payload(101, trace=9))
            with pytest.raises(grpc.RpcError) as refused:
                trace_service_pb2_grpc.TraceServiceStub(channel).Export(request, timeout=30)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "at most 100" in (refused.value.details() or "")
        # at the bound: taken
        assert post(collector.http_endpoint + "/v1/traces", chain_payload(100, trace=10))[0] == 200
        assert collector.ingest.stats.too_many_spans == 2 and collector.ingest.stats.refused == 2
    assert rows(collector.db, "SELECT count(*) FROM spans") == [(100,)]
    assert rows(collector.db, "SELECT DISTINCT trace_id FROM spans") == [(f"{10:032x}",)]


def test_a_request_resent_without_its_start_notices_opens_the_store_once(tmp_path, monkeypatch):
    """Spans whose start notices went to a collector that then restarted (the spans say a
    notice was sent): the new collector looks their start rows up in the store once for
    the whole request, not once per span, and stores the same rows as the application."""
    from fakes import otlp_receiver

    receiver, server = otlp_receiver.start()
    local = tmp_path / "local.duckdb"
    try:
        pipeline = loopscope.configure(local, tracer_provider=TracerProvider(), otlp_endpoint=receiver.endpoint, capture_content=True,
                                       flush_interval=0.05, writer="thread")

        @loopscope.tool
        def step(n: int) -> int:
            batch_leaves()  # while the turn and the tool run: both send their start notice
            return n

        for i in range(24):  # 24 turns of 5 spans: 120 spans, 72 of them (agent runs, tool calls) with a start notice
            with loopscope.turn(session_id=f"resent-{i}", agent="a", input=f"go {i}") as t:
                t.generation("", tool_calls=[{"id": f"s{i}-{k}", "name": "step", "arguments": {"n": k}} for k in range(2)])
                step(0)
                step(1)
                t.generation("done", finish_reason="stop")
        loopscope.shutdown()
        assert pipeline.dropped() == {"store": 0, "otlp": 0}
    finally:
        server.shutdown()
    request = ExportTraceServiceRequest()
    for path, body in receiver.bodies:
        if path.endswith("/v1/traces"):
            request.MergeFromString(body)  # the batches as one request: as resent together
    sent = [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert len(sent) == 120
    assert sum(any(kv.key == "loopscope.pending_sent" for kv in s.attributes) for s in sent) == 72

    # the look-ups of stored start rows go through the store's query API (the seam), not a
    # connection routing opens itself: counted there
    opened = []

    with Collector(str(tmp_path / "c.duckdb"), http_port=0, grpc_port=None, flush_interval=0.05) as collector:
        real_lookup = collector.ingest.reader.stored_ids

        def counting_lookup(*args, **kwargs):
            opened.append(args)
            return real_lookup(*args, **kwargs)

        monkeypatch.setattr(collector.ingest.reader, "stored_ids", counting_lookup)
        assert post(collector.http_endpoint + "/v1/traces", request.SerializeToString(), timeout=120)[0] == 200
        assert len(opened) == 1  # one look-up for the request (it was one per agent run and tool call)
        assert collector.ingest.start_lookups == 1
        # sent again (the sender never saw the answer): nothing new, and no look-up either
        assert post(collector.http_endpoint + "/v1/traces", request.SerializeToString(), timeout=120)[0] == 200
        assert len(opened) == 1
    # the same rows (the start rows come with the ended spans, so a turn's input follows its tools)
    stored, recorded = events(collector.db), events(local)
    assert len(stored) == len(recorded) == 24 * 6
    assert {r[0]: r[3:] for r in stored} == {r[0]: r[3:] for r in recorded}
    assert turns(collector.db) == turns(local)
