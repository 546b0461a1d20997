"""OTLP out: real export over loopback, the content policy, metrics, counted drops."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import loopscope
from fakes import otlp_receiver
from loopscope.content.policy import ContentPolicy

SECRET = "sk-proj-ABCDEFGHIJKLMNOPQRSTUVWX1234"


@pytest.fixture
def receiver() -> Iterator[otlp_receiver.OTLPReceiver]:
    rec, server = otlp_receiver.start()
    yield rec
    server.shutdown()


def record_turn(password: str = "hunter2") -> loopscope.Turn:
    @loopscope.tool
    def login(user: str, password: str) -> str:
        return f"token for {user}: {SECRET}"

    with loopscope.turn(session_id="exp", agent="ops", input=f"log me in, my key is {SECRET}", model="m", provider="openai") as t:
        t.generation("Logging in.", tool_calls=[{"id": "c1", "name": "login", "arguments": {"user": "ann", "password": password}}],
                     usage={"input_tokens": 30, "output_tokens": 4})
        login("ann", password)
        t.generation("Done.", finish_reason="stop", usage={"input_tokens": 50, "output_tokens": 2})
    return t


def configure(tmp_path: Path, receiver: otlp_receiver.OTLPReceiver, **kwargs) -> loopscope.Pipeline:
    return loopscope.configure(tmp_path / "s.duckdb", tracer_provider=TracerProvider(), otlp_endpoint=receiver.endpoint, flush_interval=0.05, **kwargs)


def test_spans_are_exported_over_otlp_without_content_by_default(tmp_path, receiver):
    configure(tmp_path, receiver)
    record_turn()
    loopscope.shutdown()
    assert receiver.wait_for(lambda r: len(r.spans) >= 4)
    names = sorted(s.name for s in receiver.spans)
    assert names == ["chat m", "chat m", "execute_tool login", "invoke_agent ops"]
    tool = next(s for s in receiver.spans if s.name == "execute_tool login")
    assert tool.attributes["gen_ai.tool.name"] == "login" and tool.attributes["gen_ai.tool.call.id"] == "c1"
    assert tool.attributes["loopscope.tool.outcome"] == "served"
    agent = next(s for s in receiver.spans if s.name == "invoke_agent ops")
    assert agent.attributes["loopscope.turn.loop_end_reason"] == "completed"
    for span in receiver.spans:  # content stays home unless the user opts in
        for key in ("gen_ai.tool.call.arguments", "gen_ai.tool.call.result", "gen_ai.output.messages",
                    "loopscope.turn.segments", "loopscope.round.text", "loopscope.turn.input"):
            assert key not in span.attributes
    # ...while the local store has all of it
    store = loopscope.Store(str(tmp_path / "s.duckdb"))
    end = next(e for e in store.get_timeline("exp") if e.type == "tool_call_end")
    assert end.content.arguments["user"] == "ann"


def test_content_is_exported_on_opt_in_and_scrubbed(tmp_path, receiver, monkeypatch):
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    configure(tmp_path, receiver)
    record_turn()
    loopscope.shutdown()
    assert receiver.wait_for(lambda r: len(r.spans) >= 4)
    tool = next(s for s in receiver.spans if s.name == "execute_tool login")
    arguments = json.loads(tool.attributes["gen_ai.tool.call.arguments"])
    assert arguments == {"user": "ann", "password": "[REDACTED]"}
    assert "[REDACTED]" in tool.attributes["gen_ai.tool.call.result"]
    agent = next(s for s in receiver.spans if s.name == "invoke_agent ops")
    assert "[REDACTED]" in agent.attributes["loopscope.turn.input"]
    blob = json.dumps([s.attributes for s in receiver.spans])
    assert SECRET not in blob and "hunter2" not in blob


def test_size_cap_and_redaction_hook(tmp_path, receiver):
    policy = ContentPolicy(capture=True, max_chars=40, redact=lambda where, text: text.replace("ann", "<user>"))
    configure(tmp_path, receiver, content_policy=policy)
    record_turn(password="x" * 500)
    loopscope.shutdown()
    assert receiver.wait_for(lambda r: len(r.spans) >= 4)
    tool = next(s for s in receiver.spans if s.name == "execute_tool login")
    text = tool.attributes["gen_ai.tool.call.arguments"]
    assert "<user>" in text and "ann" not in text
    assert text.endswith("chars]") and "…[truncated: " in text


def test_environment_configures_export_resource_and_headers(tmp_path, receiver):
    script = tmp_path / "agent.py"
    script.write_text(textwrap.dedent(f"""
        import loopscope
        loopscope.configure({str(tmp_path / "env.duckdb")!r})
        with loopscope.turn(session_id="env", agent="a") as t:
            t.generation("hi")
    """))
    env = {
        **os.environ,
        "LOOPSCOPE_STRICT": "1",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=acme,x-team=agents",
        "OTEL_SERVICE_NAME": "checkout-agent",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test",
    }
    subprocess.run([sys.executable, str(script)], env=env, check=True, timeout=60)
    assert receiver.wait_for(lambda r: any(s.name == "invoke_agent a" for s in r.spans))
    span = next(s for s in receiver.spans if s.name == "invoke_agent a")
    assert span.resource["service.name"] == "checkout-agent"
    assert span.resource["deployment.environment"] == "test"
    assert any(h.get("x-tenant") == "acme" and h.get("x-team") == "agents" for h in receiver.headers)
    assert any(m for m in receiver.metrics), "metrics go to the same endpoint"


def test_users_own_exporters_see_the_policy(tmp_path):
    mine = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(mine))
    loopscope.configure(tmp_path / "u.duckdb", tracer_provider=provider, flush_interval=0.05)
    record_turn()
    loopscope.shutdown()
    spans = mine.get_finished_spans()
    assert {s.name for s in spans} >= {"invoke_agent ops", "execute_tool login"}
    assert all("gen_ai.tool.call.arguments" not in s.attributes for s in spans)
    assert all(s.attributes.get("gen_ai.operation.name") for s in spans)


def test_metrics_names_units_attributes_and_buckets(tmp_path, monkeypatch):
    # the older conventions' metrics (the current ones: tests/export/test_conventions.py, test_semconv_models.py)
    monkeypatch.setenv("LOOPSCOPE_SEMCONV", "v1.37")
    reader = InMemoryMetricReader()
    loopscope.configure(tmp_path / "m.duckdb", tracer_provider=TracerProvider(), meter_provider=MeterProvider(metric_readers=[reader]))
    record_turn()
    with pytest.raises(RuntimeError), loopscope.turn(session_id="exp2", agent="ops"):
        raise RuntimeError("boom")
    loopscope.flush()  # also turns queued spans into measurements
    data = reader.get_metrics_data()
    metrics = {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    tokens = metrics["gen_ai.client.token.usage"]
    assert tokens.unit == "{token}"
    points = tokens.data.data_points
    by_type = {p.attributes["gen_ai.token.type"]: p for p in points}
    assert by_type["input"].sum == 80 and by_type["output"].sum == 6
    assert list(by_type["input"].explicit_bounds) == [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864]
    assert by_type["input"].attributes["gen_ai.operation.name"] == "chat"
    assert by_type["input"].attributes["gen_ai.provider.name"] == "openai"
    duration = metrics["gen_ai.client.operation.duration"]
    assert duration.unit == "s" and list(duration.data.data_points[0].explicit_bounds)[:3] == [0.01, 0.02, 0.04]
    tool = metrics["gen_ai.execute_tool.duration"].data.data_points[0]
    assert tool.attributes["gen_ai.tool.name"] == "login" and tool.count == 1
    calls = metrics["loopscope.tool.calls"].data.data_points[0]
    assert (calls.value, calls.attributes["loopscope.tool.outcome"]) == (1, "served")
    turns = {p.attributes["loopscope.turn.loop_end_reason"]: p.value for p in metrics["loopscope.turns"].data.data_points}
    assert turns == {"completed": 1, "error": 1}
    dropped = {p.attributes["loopscope.destination"]: p.value for p in metrics["loopscope.dropped"].data.data_points}
    assert dropped["store"] == 0
    loopscope.shutdown()


def test_export_drops_are_counted_and_reported(tmp_path, receiver, caplog):
    receiver.delay = 0.5  # a slow backend
    pipeline = configure(tmp_path, receiver)
    pipeline.exporter.max_queue_size = 5  # a tiny queue, to see drops without a flood
    batch = getattr(pipeline.exporter, "_batch_processor", None)
    if batch is not None:
        batch._queue = __import__("collections").deque([], 5)
        batch._max_queue_size = 5
    else:  # the oldest SDK loopscope supports (1.30) keeps its queue on the processor
        pipeline.exporter.queue = __import__("collections").deque([], 5)
    for _ in range(10):
        record_turn()
    assert pipeline.dropped()["otlp"] > 0
    assert any("OTLP export queue is full" in r.getMessage() for r in caplog.records)
    # the store lost nothing
    loopscope.flush()
    assert len(loopscope.Store(str(tmp_path / "s.duckdb")).list_turns("exp", limit=None)) == 10
    loopscope.shutdown()


def test_unreachable_endpoint_does_not_break_the_app(tmp_path):
    loopscope.configure(tmp_path / "d.duckdb", tracer_provider=TracerProvider(), otlp_endpoint="http://127.0.0.1:9", flush_interval=0.05)
    t = record_turn()
    assert t.response.loop_end_reason == loopscope.LoopEndReason.COMPLETED
    loopscope.shutdown()
    assert len(loopscope.Store(str(tmp_path / "d.duckdb")).list_turns("exp")) == 1


def test_the_export_queue_is_bounded_in_bytes_and_its_drops_are_counted(tmp_path, receiver):
    """A slow backend and spans of ~100 KB: the export queue holds about ``max_queue_bytes``
    of them (not 65,536 spans, 6 GB), the rest are dropped and counted; the store keeps all."""
    receiver.delay = 2.0  # a slow backend: the queue fills meanwhile
    pipeline = configure(tmp_path, receiver)
    pipeline.exporter.max_queue_bytes = 1 << 20
    big = "x" * (100 << 10)
    for i in range(60):
        with loopscope.turn(session_id="big", input=f"{i} {big}") as t:
            t.generation(big, finish_reason="stop")
    assert pipeline.dropped()["otlp"] > 60  # of 120 spans, ~10 queued at ~100 KB each
    loopscope.flush()
    assert len(loopscope.Store(str(tmp_path / "s.duckdb")).list_turns("big", limit=None)) == 60
    loopscope.shutdown()
