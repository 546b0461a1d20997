"""What costly requests cost ``loopscope collect`` (issue 30): a parent chain, and spans whose
start notices never arrived.

* ``chain N``: one OTLP/HTTP traces request of N spans of the official GenAI
  instrumentation, each the parent of the next (agent run, model call, agent run, ...),
  parents first: the shape that made the assembler's descendant search quadratic (2,000
  spans took 8 s). Printed: the request's time (sent to answered: its rows are written),
  the time per span, and that per-span time as a ratio to the smallest N's: linear is ~1.
* ``notices``: 24 recorded turns (120 spans: agent runs, model calls, tool calls) whose
  start notices were sent, as one traces request: ``with`` (the logs requests of the
  notices first, then the spans: the collector remembers them) and ``without`` (only the
  spans: a collector that restarted in between; each started span's rows are looked up in
  the store, which took one open and flush per span: 5.7-9 s), and their ratio.

Each case runs on a fresh collector and store, in interleaved repeats; medians are printed.

    .venv/bin/python benchmarks/bench_collect_load.py [--repeats R] [--sizes 500,2000,5000] [--smoke]
"""

from __future__ import annotations

import argparse
import http.server
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.trace import TracerProvider

import loopscope
from loopscope.ingest.otlp.collector import Collector

T0 = 1_700_000_000_000_000_000


def _kv(key: str, value: str) -> common_pb2.KeyValue:
    return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(string_value=value))


def chain(n: int) -> bytes:
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.append(_kv("service.name", "chain"))
    scope_spans = resource_spans.scope_spans.add()
    scope_spans.scope.name = "opentelemetry.instrumentation.openai_v2"
    for i in range(n):
        span = scope_spans.spans.add(trace_id=(7).to_bytes(16, "big"), span_id=(i + 1).to_bytes(8, "big"),
                                     start_time_unix_nano=T0 + i * 1000, end_time_unix_nano=T0 + 10**9 - i * 1000)
        if i:
            span.parent_span_id = i.to_bytes(8, "big")
        op = "chat" if i % 2 else "invoke_agent"
        span.name = op
        span.attributes.append(_kv("gen_ai.operation.name", op))
        if op == "chat":
            span.attributes.extend([_kv("gen_ai.request.model", "m"), _kv("gen_ai.provider.name", "openai")])
    assert isinstance(span, trace_pb2.Span)
    return request.SerializeToString()


def post(url: str, body: bytes) -> float:
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/x-protobuf"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        assert response.status == 200, response.status
        response.read()
    return time.perf_counter() - start


def recorded(turns: int) -> tuple[list[bytes], bytes]:
    """The logs requests (start notices) and one traces request of ``turns`` recorded turns,
    as loopscope's exporter sent them to a receiver that keeps the bodies."""
    bodies: list[tuple[str, bytes]] = []

    class Keep(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            bodies.append((self.path, self.rfile.read(int(self.headers.get("content-length", 0)))))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Keep)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        loopscope.configure(False, tracer_provider=TracerProvider(), otlp_endpoint=f"http://127.0.0.1:{server.server_port}",
                            capture_content=True)

        @loopscope.tool
        def step(n: int) -> int:
            return n

        for i in range(turns):
            with loopscope.turn(session_id=f"s{i}", agent="a", input=f"go {i}") as t:
                t.generation("", tool_calls=[{"id": f"c{i}-{k}", "name": "step", "arguments": {"n": k}} for k in range(2)])
                step(0)
                step(1)
                t.generation("done", finish_reason="stop")
        loopscope.shutdown()
    finally:
        server.shutdown()
    traces = ExportTraceServiceRequest()
    for path, body in bodies:
        if path.endswith("/v1/traces"):
            traces.MergeFromString(body)
    return [body for path, body in bodies if path.endswith("/v1/logs")], traces.SerializeToString()


def timed(folder: Path, name: str, send: Any) -> float:
    with Collector(str(folder / f"{name}.duckdb"), http_port=0, grpc_port=None, idle_seconds=3600, flush_interval=0.05) as collector:
        return send(collector.http_endpoint)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", default="500,2000,5000", help="chain lengths, the first the baseline (default 500,2000,5000)")
    parser.add_argument("--turns", type=int, default=24, help="recorded turns of the notices case (default 24: 120 spans)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks that it runs, measures nothing")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.smoke:
        sizes, args.repeats, args.turns = [20, 40], 1, 3
    payloads = {n: chain(n) for n in sizes}
    logs, traces = recorded(args.turns)
    times: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        timed(folder, "warm-up", lambda url: post(url + "/v1/traces", chain(10)) + post(url + "/v1/traces", traces))  # imports, first store
        for r in range(args.repeats):
            for n in sizes:
                times.setdefault(f"chain {n}", []).append(timed(folder, f"c{n}-{r}", lambda url, n=n: post(url + "/v1/traces", payloads[n])))

            def with_notices(url: str) -> float:
                return sum(post(url + "/v1/logs", body) for body in logs) + post(url + "/v1/traces", traces)

            times.setdefault("notices with", []).append(timed(folder, f"w{r}", with_notices))
            times.setdefault("notices without", []).append(timed(folder, f"n{r}", lambda url: post(url + "/v1/traces", traces)))
    median = {k: statistics.median(v) for k, v in times.items()}
    base = median[f"chain {sizes[0]}"] / sizes[0]
    print(f"chain (parents first), median of {args.repeats}:")
    for n in sizes:
        per = median[f"chain {n}"] / n
        print(f"  N={n:>6}: {median[f'chain {n}']:8.3f} s  {per * 1e6:8.1f} us/span  ratio to N={sizes[0]}: {per / base:5.2f}")
    spans = sum(len(ss.spans) for rs in ExportTraceServiceRequest.FromString(traces).resource_spans for ss in rs.scope_spans)
    print(f"a request of {spans} spans whose start notices were sent ({args.turns} turns), median of {args.repeats}:")
    print(f"  with its notices (logs requests first): {median['notices with']:.3f} s")
    print(f"  without them (a restarted collector):   {median['notices without']:.3f} s  ratio: "
          f"{median['notices without'] / median['notices with']:.2f}")


if __name__ == "__main__":
    main()
