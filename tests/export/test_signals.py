"""The standard exporter switches (OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER) and an endpoint
that takes spans but refuses metrics, over HTTP and over gRPC (a tracing backend's gRPC port with no
metrics service: said once, not the SDK's raw ``UNIMPLEMENTED`` error at every export): real OTLP
over loopback, from a real program that exits."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from fakes import otlp_receiver

METRICS = "/v1/metrics"


@pytest.fixture
def receiver() -> Iterator[otlp_receiver.OTLPReceiver]:
    rec, server = otlp_receiver.start()
    yield rec
    server.shutdown()


def agent(tmp_path: Path, endpoint: str, *, wait: float = 0.0, **env: str) -> subprocess.CompletedProcess[str]:
    """A program recording one turn, OTLP pointed at ``endpoint``, run to its exit."""
    script = tmp_path / "agent.py"
    script.write_text(textwrap.dedent(f"""
        import time
        import loopscope
        loopscope.configure({str(tmp_path / "a.duckdb")!r}, flush_interval=0.05)
        with loopscope.turn(session_id="sig", agent="a", model="m", provider="openai") as t:
            t.generation("hi", usage={{"input_tokens": 3, "output_tokens": 1}})
        loopscope.flush()
        time.sleep({wait})
    """))
    full = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    full.update({"LOOPSCOPE_STRICT": "1", "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, **env})
    done = subprocess.run([sys.executable, str(script)], env=full, check=False, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def run_agent(tmp_path: Path, receiver: otlp_receiver.OTLPReceiver, *, wait: float = 0.0, **env: str) -> str:
    """:func:`agent` against ``receiver``; its stderr."""
    done = agent(tmp_path, receiver.endpoint, wait=wait, **env)
    assert receiver.wait_for(lambda r: any(s.name == "invoke_agent a" for s in r.spans)), "spans are sent either way"
    return done.stderr


def test_metrics_exporter_none_sends_no_metrics(tmp_path, receiver):
    receiver.refuse[METRICS] = 405
    stderr = run_agent(tmp_path, receiver, OTEL_METRICS_EXPORTER="none")
    assert receiver.paths.count(METRICS) == 0
    assert "metrics" not in stderr.lower()


def test_metrics_are_sent_by_default(tmp_path, receiver):
    run_agent(tmp_path, receiver)
    assert receiver.paths.count(METRICS) >= 1 and receiver.metrics


def test_an_endpoint_refusing_metrics_is_said_once_and_left_alone(tmp_path, receiver):
    receiver.refuse[METRICS] = 405
    # exports every 50 ms for a second, then at exit: one refusal, then no more requests
    stderr = run_agent(tmp_path, receiver, wait=1.0, OTEL_METRIC_EXPORT_INTERVAL="50")
    assert receiver.paths.count(METRICS) == 1
    lines = [line for line in stderr.splitlines() if "metrics" in line.lower()]
    assert len(lines) == 1, stderr
    assert f"{receiver.endpoint}{METRICS} refused metrics (HTTP 405" in lines[0]
    assert "OTEL_METRICS_EXPORTER=none" in lines[0]
    assert "Failed to export" not in stderr


def test_a_404_is_a_refusal_too_and_said_at_exit(tmp_path, receiver):
    receiver.refuse[METRICS] = 404
    stderr = run_agent(tmp_path, receiver)  # the first (and only) export is at exit
    assert receiver.paths.count(METRICS) == 1
    assert "refused metrics (HTTP 404" in stderr and "Failed to export" not in stderr


def test_traces_exporter_none_sends_no_spans_but_metrics(tmp_path, receiver):
    script = tmp_path / "agent.py"
    script.write_text(textwrap.dedent(f"""
        import loopscope
        loopscope.configure({str(tmp_path / "t.duckdb")!r}, flush_interval=0.05)
        with loopscope.turn(session_id="sig", agent="a") as t:
            t.generation("hi", usage={{"input_tokens": 3, "output_tokens": 1}})
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_TRACES_EXPORTER": "none"})
    subprocess.run([sys.executable, str(script)], env=env, check=True, timeout=60)
    assert receiver.wait_for(lambda r: r.paths.count(METRICS) >= 1)
    assert "/v1/traces" not in receiver.paths


@pytest.mark.parametrize("value", ["console", "zipkin,console"])
def test_exporters_loopscope_does_not_provide_are_said_and_not_sent(tmp_path, receiver, value):
    script = tmp_path / "agent.py"
    script.write_text(textwrap.dedent(f"""
        import loopscope
        loopscope.configure({str(tmp_path / "c.duckdb")!r}, flush_interval=0.05)
        with loopscope.turn(session_id="sig", agent="a") as t:
            t.generation("hi")
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_TRACES_EXPORTER": value, "OTEL_METRICS_EXPORTER": "none"})
    done = subprocess.run([sys.executable, str(script)], env=env, check=True, timeout=60, capture_output=True, text=True)
    assert receiver.paths == []
    said = [line for line in done.stderr.splitlines() if "OTEL_TRACES_EXPORTER" in line]
    assert len(said) == 1 and "does not provide" in said[0] and "console" in said[0]


def test_otlp_in_a_list_still_sends(tmp_path, receiver):
    run_agent(tmp_path, receiver, OTEL_TRACES_EXPORTER="console, OTLP", OTEL_METRICS_EXPORTER="otlp")
    assert "/v1/traces" in receiver.paths and METRICS in receiver.paths


def traces_only_server() -> tuple[Any, int, list[str], threading.Event]:
    """A gRPC server with the OTLP trace service alone; the names of the spans it got."""
    names: list[str] = []
    got = threading.Event()

    class Traces(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    names.extend(span.name for span in scope.spans)
            got.set()
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, port, names, got


def test_a_grpc_endpoint_without_a_metrics_service_is_said_once(tmp_path: Path):
    server, port, names, got = traces_only_server()
    try:
        done = agent(tmp_path, f"http://127.0.0.1:{port}", wait=1.0,
                     OTEL_EXPORTER_OTLP_PROTOCOL="grpc", OTEL_METRIC_EXPORT_INTERVAL="50")
        assert got.wait(30) and "invoke_agent a" in names, "spans are sent either way"
    finally:
        server.stop(None)
    lines = [line for line in done.stderr.splitlines() if "metrics" in line.lower()]
    assert len(lines) == 1, done.stderr
    assert f"127.0.0.1:{port} refused metrics (gRPC UNIMPLEMENTED" in lines[0]
    assert "OTEL_METRICS_EXPORTER=none" in lines[0]
    assert "Failed to export metrics" not in done.stderr
