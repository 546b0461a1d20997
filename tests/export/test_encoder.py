"""loopscope's own OTLP span encoder (loopscope/export/encoder.py) against the SDK's
``encode_spans``: the same request, byte for byte and decoded with opentelemetry-proto,
over spans with every attribute type, events, links, status, unicode, big ints and
arrays; and loopscope's exporter sends what the SDK's encoder would have made of the
spans a real openai SDK tool loop recorded (as an exporter of the application's sees
them, through the same content policy)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

import loopscope
from fakes import otlp_receiver
from fakes.model_server import FakeModelServer, Reply, ToolCall
from loopscope import _otel_sdk
from loopscope.export.encoder import SpanEncoder
from loopscope.export.otlp import OTLPSettings, span_exporter

VALUES: dict[str, Any] = {
    "text": "plain", "empty": "", "unicode": "h\u00e9llo \u2603 \U0001f600 \u65e5\u672c", "long": "x" * 5000,
    "true": True, "false": False, "zero": 0, "one": 1, "negative": -5, "int64.max": 2**63 - 1, "int64.min": -(2**63),
    "varint.edges": (127, 128, 16383, 16384, 2**32, 2**56),
    "float": 0.7, "float.negzero": -0.0, "float.big": 1e308, "float.inf": float("inf"), "float.nan": float("nan"),
    "texts": ("a", "\u00e9", ""), "ints": (1, -1, 2**40), "floats": (0.5, -2.25), "bools": (True, False), "nothing": (),
    "list": ["a", "b"],
}
# values the SDK's encoder leaves out of the span (logged), the rest of it sent
REFUSED: dict[str, Any] = {
    "int.too.big": 2**63, "int.too.small": -(2**63) - 1, "ints.too.big": (1, 2**64), "surrogate": "a\ud800", "surrogates": ("\udc00",),
}


def _sdk_bytes(spans: Any) -> bytes:
    return encode_spans(spans).SerializePartialToString()


def _made_spans(**limits: Any) -> list[ReadableSpan]:
    """Spans of two resources and three scopes (one with a schema URL and attributes),
    every field set somewhere."""
    memory = InMemorySpanExporter()
    resources = (Resource.create({"service.name": "encoder-test", "n": 3}), Resource({"service.name": "other"}, "https://res/1"))
    for resource in resources:
        provider = TracerProvider(resource=resource, span_limits=SpanLimits(**limits), shutdown_on_exit=False)
        provider.add_span_processor(SimpleSpanProcessor(memory))
        own = provider.get_tracer("loopscope", "1.2.3", schema_url="https://opentelemetry.io/schemas/1.30.0",
                                  attributes={"scope.attr": "s", "scope.n": 1})
        other = provider.get_tracer("another.lib")
        bare = provider.get_tracer("")
        remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1),
                             trace_state=TraceState([("vendor", "v1"), ("k", "x=y")]))
        with own.start_as_current_span("invoke_agent \u2603", kind=SpanKind.CLIENT, attributes={**VALUES, **REFUSED},
                                       context=set_span_in_context(NonRecordingSpan(remote))) as root:
            root.add_event("gen_ai.choice", {"index": 0, "finish_reason": "stop", "big": 2**63}, timestamp=123)
            root.add_event("")
            root.set_status(Status(StatusCode.ERROR, "boom: \u00e9"))
            links = [Link(remote, {"link.attr": "v", "link.n": 2}), Link(SpanContext(1, 2, False))]
            with other.start_as_current_span("chat", kind=SpanKind.SERVER, links=links) as chat:
                chat.set_attribute("x", 1.5)
                chat.set_status(Status(StatusCode.OK))
            with bare.start_as_current_span("", kind=SpanKind.CONSUMER):
                pass
            for kind in (SpanKind.PRODUCER, SpanKind.INTERNAL):
                with own.start_as_current_span(f"k{kind.value}", kind=kind, attributes={"text": "plain", "one": 1}):
                    pass
    spans = list(memory.get_finished_spans())
    # a span made by hand: no times, no parent, no status description, plain dict attributes
    ctx = SpanContext(5, 6, False)
    spans.append(ReadableSpan("by hand", context=ctx, resource=resources[0], attributes={"a": "b"}))
    return spans


@pytest.fixture
def fast_path_restored() -> Iterator[None]:
    yield
    _otel_sdk.set_fast_path(_otel_sdk._wanted())


@pytest.mark.parametrize("fast", [True, False], ids=["fields", "public-properties"])
def test_the_same_bytes_as_the_sdks_encoder(caplog, fast_path_restored, fast):
    """Read through the SDK's fields (the fast path) or its public properties (switched off)."""
    spans = _made_spans()
    _otel_sdk.set_fast_path(fast)
    with caplog.at_level(logging.ERROR):
        expected = _sdk_bytes(spans)
        encoded = SpanEncoder().encode(spans)
    assert encoded == expected
    decoded = ExportTraceServiceRequest.FromString(encoded)
    assert decoded == ExportTraceServiceRequest.FromString(expected)
    # what the test means to cover is there: two resources, scopes, every value, the refused ones left out
    assert len(decoded.resource_spans) == 2
    root = next(s for rs in decoded.resource_spans for ss in rs.scope_spans for s in ss.spans if s.name == "invoke_agent \u2603")
    keys = [kv.key for kv in root.attributes]
    assert keys == list(VALUES)
    assert not set(REFUSED) & set(keys)
    assert [e.name for e in root.events] == ["gen_ai.choice", ""] and root.status.message == "boom: \u00e9"
    assert "int.too.big" in caplog.text


def test_the_same_bytes_again_from_its_caches():
    """The second batch of the same spans comes from the caches (keys, short values,
    resources, scopes): still the same bytes, and for a batch in another order too."""
    spans = _made_spans()
    encoder = SpanEncoder()
    assert encoder.encode(spans) == _sdk_bytes(spans)
    assert encoder.encode(spans) == _sdk_bytes(spans)
    backwards = spans[::-1]
    assert encoder.encode(backwards) == _sdk_bytes(backwards)
    for one in spans:
        assert encoder.encode([one]) == _sdk_bytes([one])
    assert encoder.encode([]) == _sdk_bytes([])


def test_dropped_counts_are_encoded():
    spans = _made_spans(max_span_attributes=4, max_events=1, max_links=1, max_event_attributes=1, max_link_attributes=1)
    assert any(s.dropped_attributes for s in spans) and any(s.dropped_events for s in spans)
    assert any(s.dropped_links for s in spans)
    assert SpanEncoder().encode(spans) == _sdk_bytes(spans)


def test_equal_resources_are_one_group():
    """Two equal resource objects are one ``ResourceSpans``, as the SDK's dict keys make them."""
    memory = InMemorySpanExporter()
    for _ in range(2):
        provider = TracerProvider(resource=Resource({"service.name": "same"}), shutdown_on_exit=False)
        provider.add_span_processor(SimpleSpanProcessor(memory))
        with provider.get_tracer("loopscope", "1").start_as_current_span("s"):
            pass
    spans = memory.get_finished_spans()
    assert spans[0].resource is not spans[1].resource
    encoded = SpanEncoder().encode(spans)
    assert encoded == _sdk_bytes(spans)
    assert len(ExportTraceServiceRequest.FromString(encoded).resource_spans) == 1


# -- loopscope's exporter ---------------------------------------------------------------------------


@pytest.fixture
def receiver() -> Iterator[otlp_receiver.OTLPReceiver]:
    rec, server = otlp_receiver.start()
    yield rec
    server.shutdown()


def _tool_loop(server: FakeModelServer) -> None:
    @loopscope.tool
    def weather(city: str) -> str:
        return f"sunny in {city} \u2600, password=hunter2"

    server.queue(Reply(tool_calls=[ToolCall("weather", {"city": "K\u00f8benhavn"}, id="call_w")]), Reply(text="Sunny. \U0001f60e"))
    client = server.openai_client()
    messages: list[Any] = [{"role": "user", "content": "weather in K\u00f8benhavn? my password=hunter2"}]
    first = client.chat.completions.create(model="gpt-4o", messages=messages)
    call = first.choices[0].message.tool_calls[0]
    result = weather(**json.loads(call.function.arguments))
    messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": result}]
    client.chat.completions.create(model="gpt-4o", messages=messages)


@pytest.mark.parametrize("fast", [True, False], ids=["own-encoder", "switch-off"])
def test_the_exporter_sends_what_the_sdks_encoder_makes(tmp_path, receiver, model_server, monkeypatch, fast):
    """A tool loop through the real openai SDK, exported with content on: each span the
    receiver decoded is the one the SDK's encoder makes of the span an exporter of the
    application's got (the same content policy). With the fast path switched off the
    SDK's own encoder runs, with the same result."""
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    calls: list[int] = []
    real_encode = SpanEncoder.encode
    monkeypatch.setattr(SpanEncoder, "encode", lambda self, spans: calls.append(len(spans)) or real_encode(self, spans))
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))  # the application's: sees spans as they leave
    _otel_sdk.set_fast_path(fast)
    try:
        loopscope.configure(tmp_path / "s.duckdb", tracer_provider=provider, otlp_endpoint=receiver.endpoint, flush_interval=0.05)
        loopscope.instrument()
        try:
            _tool_loop(model_server)
        finally:
            loopscope.uninstrument()
            loopscope.shutdown()
    finally:
        _otel_sdk.set_fast_path(_otel_sdk._wanted())
    mine = [s for s in memory.get_finished_spans() if s.instrumentation_scope and s.instrumentation_scope.name == "loopscope"]
    assert {s.name for s in mine} >= {"chat gpt-4o", "execute_tool weather"}
    received = {}
    for path, body in receiver.bodies:
        if path.endswith("/v1/traces"):
            for rs in ExportTraceServiceRequest.FromString(body).resource_spans:
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        received[span.span_id] = (rs.resource, ss.scope, ss.schema_url, span)
    expected = ExportTraceServiceRequest.FromString(_sdk_bytes(mine))
    compared = 0
    for rs in expected.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                assert received[span.span_id] == (rs.resource, ss.scope, ss.schema_url, span)
                compared += 1
    assert compared == len(mine) == len(received)
    assert "hunter2" not in str(received) and "K\u00f8benhavn" in str(received)  # scrubbed, unicode kept
    assert bool(calls) is fast and sum(calls) == (len(mine) if fast else 0)


def test_loopscopes_exporters_encode_with_it_and_no_other():
    """Both protocols' exporters loopscope makes use it; an exporter of another kind (the
    application's own, say) is left as it is."""
    http = span_exporter(OTLPSettings(endpoint="http://127.0.0.1:9"))
    grpc = span_exporter(OTLPSettings(endpoint="http://127.0.0.1:9", protocol="grpc"))
    assert "export" in vars(http) and "_translate_data" in vars(grpc)
    spans = _made_spans()
    assert grpc._translate_data(spans) == ExportTraceServiceRequest.FromString(_sdk_bytes(spans))  # type: ignore[attr-defined]
    grpc.shutdown()
    http.shutdown()

    class Mine(InMemorySpanExporter):
        pass

    exporter = Mine()
    assert not _otel_sdk.own_encoder(exporter, SpanEncoder().encode)
    assert "export" not in vars(exporter)


def test_a_batch_it_cannot_encode_goes_to_the_sdks_encoder(receiver, monkeypatch):
    def broken(self: SpanEncoder, spans: Any) -> bytes:
        raise RuntimeError("a span it cannot read")

    monkeypatch.setattr(SpanEncoder, "encode", broken)
    exporter = span_exporter(OTLPSettings(endpoint=receiver.endpoint))
    spans = _made_spans()
    assert exporter.export(spans).name == "SUCCESS"
    exporter.shutdown()
    assert [body for path, body in receiver.bodies if path.endswith("/v1/traces")] == [_sdk_bytes(spans)]
