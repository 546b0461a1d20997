"""Collector ingest rate against the rate the OTel SDK's own OTLP exporter can send at.

A realistic workload is recorded once with the hand API (turns with an input message,
three generation rounds, two tool calls, 200 sessions) and captured as the export stream
loopscope's OTLP exporter sends: every ended span, plus the pending copy of each started
``invoke_agent`` / ``execute_tool`` span, in order, content included. Then, timed, per
repeat, the SDK's ``OTLPSpanExporter`` (HTTP/protobuf) sends those spans in batches of
2,048 (loopscope's export batch size), one ``export()`` after the other as the batch
processor's worker does, to:

* ``null sink``           -- an HTTP server in another process that reads each body and
  answers 200: what the exporter itself can send on this machine (encoding, HTTP);
* ``collector``           -- ``loopscope collect`` in another process (a fresh store
  file each repeat): each answer comes once the batch's rows are written, raw spans too;
* ``collector --no-raw``  -- the same without the raw ``spans`` table (reference).

Each sender is a process of its own that records its spans once; ``--senders 1,4`` runs
the comparison with one sender (an exporter waits for each answer, so the collector's
time adds to the exporter's) and with four at once (what many agent processes do: their
requests share the collector's writes).

Rates are spans/s: spans sent / time from "go" until the last sender's last ``export()``
returned. The ratio collector / null sink says how much of the exporters' own rate the
collector keeps up with (1.0: the collector costs nothing). Medians over interleaved
repeats; the machine is noisy, compare ratios.

    .venv/bin/python benchmarks/bench_collector.py [--turns N] [--repeats R] [--senders 1,4] [--grpc]

``--foreign`` sends instead what a bare instrumented SDK loop exports: the official GenAI
openai instrumentation's ``chat`` spans (content on, each its own trace, no agent span, no
pending copies; three calls a turn, two asking for a tool), which the collector stitches
into turns by tool-call id. ``--baseline PATH`` adds ``collector (baseline)``: the same
collector run from another checkout (e.g. ``git worktree add /tmp/before main``), timed
in the same interleaved repeats, so the cost of a change is a ratio measured in one run:

    .venv/bin/python benchmarks/bench_collector.py --foreign --baseline /tmp/before --senders 1

``--memory`` measures instead the collector's resident memory (RSS, from /proc) while
``--requests`` senders each POST one request of ``--request-mb`` MB at once (spans of
100 KB attributes; a 503 is retried a second later, as OTLP senders do): before, at its
peak, and 5 s after the last answer; with how many requests were answered 503 first
(``--max-queued-bytes``) and the rows stored. Smoke: ``--memory --requests 4 --request-mb 2``.

    .venv/bin/python benchmarks/bench_collector.py --memory [--requests 20] [--request-mb 11]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider

import loopscope
from loopscope import semconv as a
from loopscope.content.policy import ContentPolicy
from loopscope.export.otlp import _PENDING_OPS, filtered_span, pending_span

ROOT = Path(__file__).resolve().parents[1]
BATCH = 2048
SESSIONS = 200

NULL_SINK = textwrap.dedent("""
    import http.server, sys
    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def log_message(self, *args): pass
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()
    class S(http.server.ThreadingHTTPServer):
        daemon_threads = True
    server = S(("127.0.0.1", 0), H)
    print(f"http://127.0.0.1:{server.server_port}", flush=True)
    server.serve_forever()
""")

NULL_GRPC_SINK = textwrap.dedent("""
    from concurrent import futures
    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
    class T(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):
            return trace_service_pb2.ExportTraceServiceResponse()
    server = grpc.server(futures.ThreadPoolExecutor(4), options=[("grpc.max_receive_message_length", 64 << 20)])
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(T(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"http://127.0.0.1:{port}", flush=True)
    server.wait_for_termination()
""")


class _ExportStream(SpanProcessor):
    """The spans loopscope's export processor would queue, in its order: a pending copy at
    each agent run's and tool call's start, every span at its end."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        attributes = span.attributes.copy()
        if attributes.get(a.OPERATION) in _PENDING_OPS:
            self.spans.append(pending_span(span, attributes))

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)


def record(turns: int) -> list[ReadableSpan]:
    stream = _ExportStream()
    provider = TracerProvider()
    provider.add_span_processor(stream)
    loopscope.configure(False, tracer_provider=provider)

    @loopscope.tool
    def search(query: str) -> list[str]:
        return [f"result for {query}", "another result"]

    @loopscope.tool
    def fetch(url: str) -> str:
        return f"<html>{url}</html>"

    tools = [{"name": "search", "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}},
             {"name": "fetch", "parameters": {"type": "object", "properties": {"url": {"type": "string"}}}}]
    for n in range(turns):
        with loopscope.turn(session_id=f"bench-{n % SESSIONS}", agent="researcher", input=f"question {n}: what is new?",
                            model="gpt-bench", provider="openai", tools=tools) as t:
            t.generation("Searching.", tool_calls=[{"id": f"s{n}", "name": "search", "arguments": {"query": f"q{n}"}}],
                         usage={"input_tokens": 120, "output_tokens": 12})
            search(f"q{n}")
            t.generation("Reading a page.", tool_calls=[{"id": f"f{n}", "name": "fetch", "arguments": {"url": f"https://x/{n}"}}],
                         usage={"input_tokens": 180, "output_tokens": 14})
            fetch(f"https://x/{n}")
            t.generation(f"Here is what is new ({n}).", finish_reason="stop", usage={"input_tokens": 240, "output_tokens": 30})
    loopscope.shutdown()
    policy = ContentPolicy(capture=True)  # content exported: the heaviest case
    return [filtered_span(s, policy) for s in stream.spans]


def record_foreign(turns: int) -> list[ReadableSpan]:
    """A bare loop's export stream under the official GenAI openai instrumentation: three
    ``chat`` spans a turn, each the root of its own trace, with the conventions' messages."""
    import json
    import uuid

    from opentelemetry.sdk.resources import Resource

    stream = _ExportStream()
    provider = TracerProvider(resource=Resource.create({"service.name": "bench-bare", "service.instance.id": str(uuid.uuid4())}))
    provider.add_span_processor(stream)
    tracer = provider.get_tracer("opentelemetry.instrumentation.genai.openai")
    steps = (("search", "query", 120, 12), ("fetch", "url", 180, 14), (None, None, 240, 30))
    for n in range(turns):
        history: list[dict[str, Any]] = [{"role": "user", "parts": [{"type": "text", "content": f"question {n}: what is new?"}]}]
        for step, (tool, key, tokens_in, tokens_out) in enumerate(steps):
            attributes: dict[str, Any] = {
                "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "gpt-4o-mini",
                "gen_ai.response.model": "gpt-4o-mini", "gen_ai.response.id": f"chatcmpl-{n}-{step}",
                "gen_ai.usage.input_tokens": tokens_in, "gen_ai.usage.output_tokens": tokens_out,
                "server.address": "127.0.0.1", "server.port": 8000,
                "gen_ai.input.messages": json.dumps(history),
            }
            if tool is not None:
                call_id = f"call_{n}_{step}"
                output = {"role": "assistant", "parts": [{"type": "tool_call", "id": call_id, "name": tool,
                                                          "arguments": {key: f"{key}-{n}"}}], "finish_reason": "tool_call"}
                attributes["gen_ai.response.finish_reasons"] = ("tool_calls",)
            else:
                output = {"role": "assistant", "parts": [{"type": "text", "content": f"Here is what is new ({n})."}], "finish_reason": "stop"}
                attributes["gen_ai.response.finish_reasons"] = ("stop",)
            attributes["gen_ai.output.messages"] = json.dumps([output])
            tracer.start_span("chat gpt-4o-mini", attributes=attributes).end()
            if tool is not None:
                history += [output, {"role": "tool", "parts": [{"type": "tool_call_response", "id": call_id,
                                                                "response": f"result of {tool} {n}"}]}]
    return list(stream.spans)


def _start(cmd: list[str], env: dict[str, str], grpc: bool) -> tuple[subprocess.Popen[str], str]:
    """Start a sink; its first line of output names its endpoint(s) (the collector's: HTTP, then gRPC)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()  # type: ignore[union-attr]
    urls = ["http://" + part.split()[0].rstrip(",") for part in line.split("http://")[1:]]
    if not urls:
        proc.kill()
        raise RuntimeError(f"{cmd[:4]} did not start: {line}{proc.stderr.read()}")  # type: ignore[union-attr]
    return proc, urls[-1] if grpc else urls[0]


def _cpu_seconds(pid: int) -> float:
    """A process's CPU time so far (user + system, all its threads), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


def _exporter(endpoint: str, grpc: bool) -> Any:
    if grpc:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(endpoint=endpoint, insecure=True, timeout=120)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=endpoint + "/v1/traces", timeout=120)


def send(spans: list[ReadableSpan], endpoint: str, grpc: bool) -> float:
    """Seconds to export all spans in batches, one export() after the other."""
    from opentelemetry.sdk.trace.export import SpanExportResult

    exporter = _exporter(endpoint, grpc)
    exporter.export(spans[:1])  # connect (not timed; the collector dedupes the span later)
    started = time.perf_counter()
    for i in range(0, len(spans), BATCH):
        if exporter.export(spans[i:i + BATCH]) is not SpanExportResult.SUCCESS:
            raise RuntimeError(f"export to {endpoint} failed")
    elapsed = time.perf_counter() - started
    exporter.shutdown()
    return elapsed


def sender(turns: int, grpc: bool, foreign: bool = False) -> int:
    """A sender process: records its spans, says ready, then sends them to each endpoint it
    is given on stdin and answers with the seconds it took."""
    spans = record_foreign(turns) if foreign else record(turns)
    print(f"ready {len(spans)}", flush=True)
    for line in sys.stdin:
        endpoint = line.strip()
        if not endpoint:
            break
        print(f"{send(spans, endpoint, grpc):.6f}", flush=True)
    return 0


def _rss_mb(pid: int, field: str = "VmRSS") -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def _big_request(mb: float) -> bytes:
    """An OTLP/protobuf export request of about ``mb`` MB: spans with a 100 KB attribute each."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    spans = request.resource_spans.add().scope_spans.add().spans
    trace = os.urandom(16)
    for _ in range(max(1, int(mb * 10))):
        span = spans.add(trace_id=trace, span_id=os.urandom(8), name="big", start_time_unix_nano=time.time_ns(),
                         end_time_unix_nano=time.time_ns())
        attribute = span.attributes.add(key="payload")
        attribute.value.string_value = os.urandom(51_200).hex()
    return request.SerializeToString()


def memory(requests: int, mb: float, env: dict[str, str], extra: tuple[str, ...] = ()) -> int:
    import http.client
    import threading

    folder = Path(tempfile.mkdtemp(prefix="bench-collector-memory-"))
    proc, endpoint = _start([sys.executable, "-m", "loopscope", "--db", str(folder / "m.duckdb"), "collect",
                             "--http-port", "0", "--no-grpc", *extra], env, False)
    host, port = endpoint.split("//")[1].rsplit(":", 1)
    bodies = [_big_request(mb) for _ in range(requests)]
    answers: list[int] = []
    lock = threading.Lock()

    def post(body: bytes) -> None:
        while True:
            con = http.client.HTTPConnection(host, int(port), timeout=300)
            try:
                con.request("POST", "/v1/traces", body, {"Content-Type": "application/x-protobuf"})
                status = con.getresponse().status
            finally:
                con.close()
            with lock:
                answers.append(status)
            if status != 503:
                return
            time.sleep(1.0)

    try:
        before = _rss_mb(proc.pid)
        started = time.perf_counter()
        threads = [threading.Thread(target=post, args=(b,)) for b in bodies]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.perf_counter() - started
        time.sleep(5)
        after = _rss_mb(proc.pid)
        peak = _rss_mb(proc.pid, "VmHWM")
    finally:
        _stop(proc)
    stored = loopscope.Store(str(folder / "m.duckdb")).sql("SELECT count(*) FROM spans")[1][0][0]
    print(f"collector memory: {requests} requests x {sum(map(len, bodies)) / requests / 1e6:.1f} MB at once, "
          f"OTLP/HTTP protobuf, {seconds:.1f} s")
    print(f"  RSS before {before:,.0f} MB, peak {peak:,.0f} MB, 5 s after {after:,.0f} MB")
    print(f"  answers: {answers.count(200)} x 200, {answers.count(503)} x 503 (retried); "
          f"spans stored {stored:,} of {requests * max(1, int(mb * 10)):,}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=4000, help="turns recorded per sender (each: 9 spans incl. 3 pending copies)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--senders", default="1,4", help="comma-separated numbers of concurrent sender processes (default: 1,4)")
    parser.add_argument("--grpc", action="store_true", help="OTLP/gRPC instead of OTLP/HTTP")
    parser.add_argument("--foreign", action="store_true",
                        help="send a bare loop's spans (official GenAI openai instrumentation, no agent span) instead")
    parser.add_argument("--baseline", help="also time the collector of this checkout (a folder holding loopscope/)")
    parser.add_argument("--sender", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--memory", action="store_true", help="measure the collector's RSS under large concurrent requests")
    parser.add_argument("--requests", type=int, default=20, help="--memory: concurrent requests (default: 20)")
    parser.add_argument("--request-mb", type=float, default=11.0, help="--memory: MB per request (default: 11)")
    args = parser.parse_args()
    if args.sender:
        return sender(args.turns, args.grpc, args.foreign)

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("LOOPSCOPE_STRICT", None)
    if args.memory:
        return memory(args.requests, args.request_mb, env)
    counts = [int(n) for n in args.senders.split(",")]
    protocol = "OTLP/gRPC" if args.grpc else "OTLP/HTTP protobuf"
    folder = Path(tempfile.mkdtemp(prefix="bench-collector-"))
    port_flags = ["--http-port", "0", "--grpc-port", "0"] if args.grpc else ["--http-port", "0", "--no-grpc"]
    variants: tuple[str, ...] = ("null sink", "collector", "collector --no-raw")
    if args.baseline:
        variants = ("null sink", "collector (baseline)", "collector")
        baseline_env = {**env, "PYTHONPATH": str(Path(args.baseline).resolve())}
    results: dict[int, dict[str, float]] = {}
    cpu_medians: dict[int, dict[str, float]] = {}
    for count in counts:
        senders = [subprocess.Popen([sys.executable, __file__, "--sender", "--turns", str(args.turns)] + (["--grpc"] if args.grpc else [])
                                    + (["--foreign"] if args.foreign else []),
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env) for _ in range(count)]
        per = [int(p.stdout.readline().split()[1]) for p in senders]  # type: ignore[union-attr]
        total = sum(per)
        what = "a bare loop's chat spans, stitched" if args.foreign else "pending copies included"
        print(f"collector ingest: {count} sender(s) x {per[0]} spans ({args.turns} turns each, {what}), "
              f"batches of {BATCH}, {protocol}, {args.repeats} interleaved repeats", flush=True)
        times: dict[str, list[float]] = {v: [] for v in variants}
        cpus: dict[str, list[float]] = {v: [] for v in variants}
        for repeat in range(args.repeats):
            for variant in variants:
                if variant == "null sink":
                    proc, endpoint = _start([sys.executable, "-c", NULL_GRPC_SINK if args.grpc else NULL_SINK], env, args.grpc)
                else:
                    name = "".join(c for c in variant if c.isalnum())
                    db = folder / f"s{count}-r{repeat}-{name}.duckdb"
                    flags = port_flags + (["--no-raw"] if "no-raw" in variant else [])
                    proc, endpoint = _start([sys.executable, "-m", "loopscope", "--db", str(db), "collect", *flags],
                                            baseline_env if "baseline" in variant else env, args.grpc)
                try:
                    started = time.perf_counter()
                    for p in senders:
                        p.stdin.write(endpoint + "\n")  # type: ignore[union-attr]
                        p.stdin.flush()  # type: ignore[union-attr]
                    for p in senders:
                        p.stdout.readline()  # type: ignore[union-attr]
                    seconds = time.perf_counter() - started
                    cpu = _cpu_seconds(proc.pid)  # the receiver's whole process, every thread
                finally:
                    _stop(proc)
                times[variant].append(seconds)
                cpus[variant].append(cpu)
                print(f"  repeat {repeat + 1} {variant:<22} {total / seconds:>10,.0f} spans/s  receiver CPU {cpu:6.2f} s", flush=True)
        for p in senders:
            p.stdin.close()  # type: ignore[union-attr]
            p.wait(timeout=60)
        results[count] = {k: total / statistics.median(v) for k, v in times.items()}
        cpu_medians[count] = {k: statistics.median(v) for k, v in cpus.items()}
    print()
    print(f"{'senders':>7}  {'destination':<22} {'median spans/s':>15} {'vs exporter':>12} {'receiver CPU s':>15}")
    for count, rates in results.items():
        base = rates["null sink"]
        for name, rate in rates.items():
            print(f"{count:>7}  {name:<22} {rate:>15,.0f} {rate / base:>11.2f}x {cpu_medians[count][name]:>15.2f}")
    for count, rates in results.items():
        print(f"ratio collector / exporter's own rate, {count} sender(s): {rates['collector'] / rates['null sink']:.2f}x")
        if "collector (baseline)" in rates:
            print(f"ratio collector / baseline collector, {count} sender(s): {rates['collector'] / rates['collector (baseline)']:.2f}x "
                  f"spans/s, {cpu_medians[count]['collector'] / cpu_medians[count]['collector (baseline)']:.2f}x receiver CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
