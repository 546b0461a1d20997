"""An OTLP/gRPC endpoint that takes spans but has no metrics service (a tracing backend's gRPC
port): said once, as over HTTP (tests/export/test_signals.py), not the SDK's raw
``UNIMPLEMENTED`` error at every export. Real OTLP/gRPC over loopback from a real program."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


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
        script = tmp_path / "agent.py"
        script.write_text(textwrap.dedent(f"""
            import time
            import loopscope
            loopscope.configure({str(tmp_path / "a.duckdb")!r}, flush_interval=0.05)
            with loopscope.turn(session_id="sig", agent="a", model="m", provider="openai") as t:
                t.generation("hi", usage={{"input_tokens": 3, "output_tokens": 1}})
            loopscope.flush()
            time.sleep(1.0)
        """))
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env.update({"LOOPSCOPE_STRICT": "1", "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
                    "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_METRIC_EXPORT_INTERVAL": "50"})
        done = subprocess.run([sys.executable, str(script)], env=env, check=False, capture_output=True, text=True, timeout=90)
        assert done.returncode == 0, done.stderr[-3000:]
        assert got.wait(30) and "invoke_agent a" in names, "spans are sent either way"
    finally:
        server.stop(None)
    lines = [line for line in done.stderr.splitlines() if "metrics" in line.lower()]
    assert len(lines) == 1, done.stderr
    assert f"127.0.0.1:{port} refused metrics (gRPC UNIMPLEMENTED" in lines[0]
    assert "OTEL_METRICS_EXPORTER=none" in lines[0]
    assert "Failed to export metrics" not in done.stderr
