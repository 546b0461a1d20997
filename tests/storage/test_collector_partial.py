"""``loopscope collect`` answers a request with some bad spans by OTLP's partial success: the
good spans are stored, the bad ones counted in ``partial_success.rejected_spans`` with a
message, over OTLP/HTTP (protobuf and JSON) and OTLP/gRPC, and the count is printed when
the collector stops."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from test_collector import _one_turn_payload, _otlp_json, post, rows

from children import Collect, collect_child


def _with_bad_span(body: bytes) -> tuple[bytes, int]:
    """The export request ``body`` with one more span, whose trace id is all zeros (an
    invalid id); and how many good spans it holds."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = request.resource_spans[0].scope_spans[0].spans
    good = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
    bad = spans.add()
    bad.CopyFrom(spans[0])
    bad.trace_id = bytes(16)
    bad.span_id = (0xBAD).to_bytes(8, "big")
    return request.SerializeToString(), good


@pytest.fixture
def collect(tmp_path) -> Iterator[tuple[str, Collect]]:
    """A ``loopscope collect`` child on free ports (HTTP and gRPC): (db, the child)."""
    db = str(tmp_path / "partial.duckdb")
    with collect_child(db, "--idle", "3600") as child:
        yield db, child


def test_a_span_with_an_all_zero_trace_id_is_rejected_alone_over_http_and_grpc(collect):
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

    db, child = collect
    http, grpc_target = child.http, child.grpc
    assert grpc_target is not None
    stored = 0
    answers: list[ExportTraceServiceResponse] = []

    # OTLP/HTTP, protobuf
    body, good = _with_bad_span(_one_turn_payload())
    status, answer, headers = post(http + "/v1/traces", body)
    assert status == 200, answer
    assert headers["Content-Type"] == "application/x-protobuf"
    answers.append(ExportTraceServiceResponse.FromString(answer))
    stored += good

    # OTLP/HTTP, JSON (ids as hex, as OTLP/JSON has them)
    body, good = _with_bad_span(_one_turn_payload())
    status, answer, headers = post(http + "/v1/traces", json.dumps(_otlp_json(body)).encode(), "application/json")
    assert status == 200, answer
    assert headers["Content-Type"] == "application/json"
    answers.append(json_format.Parse(answer, ExportTraceServiceResponse()))
    assert json.loads(answer)["partialSuccess"]["rejectedSpans"] in ("1", 1)
    stored += good

    # OTLP/gRPC
    body, good = _with_bad_span(_one_turn_payload())
    with grpc.insecure_channel(grpc_target) as channel:
        answers.append(trace_service_pb2_grpc.TraceServiceStub(channel).Export(ExportTraceServiceRequest.FromString(body), timeout=60))
    stored += good

    for answer in answers:
        assert answer.partial_success.rejected_spans == 1
        assert "traceId is all zeros" in answer.partial_success.error_message

    out = child.stop_ok()
    assert "3 spans with bad ids rejected" in out
    # every good span is stored, as received and as rows: one turn per request
    assert rows(db, "SELECT count(*), count(*) FILTER (WHERE trace_id = repeat('0', 32)) FROM spans") == [(stored, 0)]
    assert rows(db, "SELECT count(*), count(DISTINCT trace_id) FROM turns") == [(3, 3)]
    assert rows(db, "SELECT count(*) FROM events WHERE type = 'tool_call_end'") == [(3,)]


def test_a_request_whose_every_span_is_bad_is_refused_whole(collect):
    """Nothing to store: a 400 with the reason, as before."""
    db, child = collect
    request = ExportTraceServiceRequest()
    request.ParseFromString(_with_bad_span(_one_turn_payload())[0])
    spans = request.resource_spans[0].scope_spans[0].spans
    for span in spans:
        span.trace_id = bytes(16)
    status, answer, _ = post(child.http + "/v1/traces", request.SerializeToString())
    assert status == 400 and b"traceId is all zeros" in answer
    child.stop()
    assert rows(db, "SELECT count(*) FROM spans") == [(0,)]
