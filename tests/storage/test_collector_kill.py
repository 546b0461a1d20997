"""``loopscope collect`` killed (SIGKILL) while it takes requests over HTTP and gRPC keeps
each request whole or not at all: every model-call row has the raw span it came from (and
every model call's raw span its row), and every request it acknowledged is stored."""

from __future__ import annotations

import signal
import subprocess
import threading
import urllib.error
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_collector import post, rows

import loopscope
from children import collect_child
from fakes.model_server import Reply, Usage

ROUNDS = 3
REQUESTS = 16  # per round and protocol


def _payloads(model_server: Any, count: int) -> list[tuple[bytes, str]]:
    """``count`` export requests, each one turn of one model call through the real openai
    SDK against the fake model server, recorded by loopscope: (body, the turn's trace id)."""
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    loopscope.configure(False, tracer_provider=provider, capture_content=True)
    loopscope.instrument(anthropic=False)
    client = model_server.openai_client()
    out = []
    try:
        for i in range(count):
            model_server.queue(Reply(text=f"answer {i}", usage=Usage(20, 4)))
            with loopscope.turn(session_id=f"kill-{i % 4}", agent="k", input=f"question {i}"):
                client.chat.completions.create(model="gpt-test", messages=[{"role": "user", "content": f"question {i}"}])
            spans = memory.get_finished_spans()
            memory.clear()
            out.append((encode_spans(spans).SerializeToString(), f"{spans[0].context.trace_id:032x}"))
    finally:
        loopscope.shutdown()
    return out


def _over_http(proc: subprocess.Popen, http: str, batch: list[tuple[bytes, str]], kill_after: int, acknowledged: list[str],
               lock: threading.Lock) -> None:
    """Send ``batch`` one request at a time; SIGKILL the collector right after the
    ``kill_after``-th answer (while the gRPC sender goes on)."""
    for n, (body, trace) in enumerate(batch):
        try:
            status = post(http + "/v1/traces", body)[0]
        except (OSError, urllib.error.URLError):
            return  # killed
        if status != 200:
            return
        with lock:
            acknowledged.append(trace)
        if n + 1 == kill_after:
            proc.send_signal(signal.SIGKILL)
            return


def _over_grpc(target: str, batch: list[tuple[bytes, str]], acknowledged: list[str], lock: threading.Lock) -> None:
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    with grpc.insecure_channel(target) as channel:
        stub = trace_service_pb2_grpc.TraceServiceStub(channel)
        for body, trace in batch:
            try:
                stub.Export(ExportTraceServiceRequest.FromString(body), timeout=60)
            except grpc.RpcError:
                return  # killed
            with lock:
                acknowledged.append(trace)


@pytest.mark.serial
def test_a_collector_killed_mid_load_keeps_each_request_whole(tmp_path, model_server):
    db = tmp_path / "killed.duckdb"
    payloads = _payloads(model_server, ROUNDS * REQUESTS * 2)
    acknowledged: list[str] = []
    lock = threading.Lock()
    for round_ in range(ROUNDS):
        with collect_child(db, "--idle", "3600") as child:
            assert child.grpc is not None
            mine = payloads[round_ * REQUESTS * 2:(round_ + 1) * REQUESTS * 2]
            kill_after = 4 + 3 * round_  # HTTP acknowledgements before the kill, a different moment each round

            senders = [threading.Thread(target=_over_http, args=(child.proc, child.http, mine[::2], kill_after, acknowledged, lock)),
                       threading.Thread(target=_over_grpc, args=(child.grpc, mine[1::2], acknowledged, lock))]
            for sender in senders:
                sender.start()
            for sender in senders:
                sender.join(300)
            child.kill()  # killed already, unless every request was answered first

    # a last collector opens the file (the WAL replayed) and stops cleanly
    with collect_child(db, "--idle", "3600") as child:
        child.stop_ok()

    assert len(acknowledged) >= ROUNDS * 4
    calls = rows(db, "SELECT trace_id, span_id FROM model_calls")
    chat_spans = rows(db, "SELECT trace_id, span_id FROM spans WHERE role = 'chat'")
    assert calls  # some requests were stored before each kill
    # every model-call row has the raw span it came from, and every model call's raw span its row
    assert sorted(calls) == sorted(chat_spans)
    # every turn has its raw agent span and the other way round
    turns = rows(db, "SELECT trace_id FROM turns")
    assert sorted(turns) == sorted(rows(db, "SELECT trace_id FROM spans WHERE role = 'agent'"))
    # what the collector acknowledged is stored, whole: its turn, its model call, its spans
    stored_turns = {t for (t,) in turns}
    stored_calls = {t for t, _ in calls}
    spans_per_trace = dict(rows(db, "SELECT trace_id, count(*) FROM spans GROUP BY 1"))
    per_request = {trace: len(ExportTraceServiceRequest.FromString(body).resource_spans[0].scope_spans[0].spans)
                   for body, trace in payloads}
    missing = [t for t in acknowledged if t not in stored_turns or t not in stored_calls or spans_per_trace.get(t) != per_request[t]]
    assert not missing, f"{len(missing)} of {len(acknowledged)} acknowledged requests are not stored whole"
    # and no request stored in part: a trace's spans are all there or none
    assert all(count == per_request[trace] for trace, count in spans_per_trace.items())
