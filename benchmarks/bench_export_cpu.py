"""The CPU loopscope's OTLP export costs a model call, part by part, against the official
genai-openai instrumentation's OTLP exporter, for the same model calls (issue 31: within 2x).

``bench_openai_overhead.py`` measures the export as the difference between two instrumented
processes' whole CPU a call; on a loaded two-core machine its cells swing by more than the
export costs. This benchmark measures the export path alone:

1. **Capture, once.** In one process of the ``peers`` stack (tests/stacks.toml: loopscope
   ``-e .`` and ``opentelemetry-instrumentation-genai-openai`` on the same OpenTelemetry SDK),
   the same openai tool loop (``bench_openai_overhead._tool_loop``: a question, a
   ``get_weather`` call, its result, the answer; non-streaming) runs ``--calls`` model calls
   through the real openai SDK over the in-process transport ``bench_openai_overhead`` uses,
   first under loopscope (``configure(False)`` + ``instrument()``), then under genai-openai
   (with a ``MeterProvider``, so it records its metrics). A span processor captures every
   span's start (its start attributes) and end; genai-openai's metric measurements (the SDK's
   ``Histogram.record`` / ``Counter.add``) are captured in the same order.
2. **Replay, timed.** Each variant replays a capture through a ``TracerProvider`` of its own:
   the same spans started and ended in the captured order (the captured names, kinds, scopes,
   start attributes, then the rest of the attributes, events and status at the end), the
   measurements recorded where they were, and every ``--leave-every`` model calls a batch
   leaves (the span processors' ``force_flush``: what a batch processor's 5 s timer does to
   an app whose calls take about a second; it lands mid-turn, where loopscope's start
   notices are made). At the end of a replay (``--calls`` calls: a minute of such an app,
   the metric readers' 60 s interval) everything is flushed: spans, notices and metrics
   sent. The whole process's CPU (``process_time``: every thread, the batch and metrics
   threads included) over the replay is the replay's cost; a variant's export cost is that
   minus the same replay with no processor and no meter provider (``*.base``).

   * ``loopscope.spans``: ``CountingBatchProcessor`` -> ``PolicyExporter`` -> loopscope's
     OTLP span exporter (its own encoder), start notices off (``LOOPSCOPE_OTLP_PENDING=0``);
   * ``loopscope.notices``: the same with start notices on (``/v1/logs``), the default;
   * ``loopscope.metrics``: ``MetricsProcessor`` (the current conventions' metrics) into a
     ``MeterProvider`` with the OTLP metric exporter, no spans;
   * ``loopscope.all``: spans, notices and metrics: what ``configure(otlp_endpoint=)`` makes;
   * ``genai.spans``: the SDK's ``BatchSpanProcessor`` -> the SDK's OTLP span exporter;
   * ``genai.metrics``: its measurements on a ``MeterProvider`` with the OTLP metric exporter;
   * ``genai.all``: both.

   Everything goes over http/protobuf to a loopback OTLP sink that answers and discards,
   run by the orchestrating process (``bench_openai_overhead._OtlpSink``): its CPU is not
   counted. The variants take turns replay by replay (the order rotating), ``--reps`` replays
   each per round; a round's figure is each variant's minimum (and median) over its replays,
   minus its base's; the table gives the median over ``--rounds`` rounds and their spread.
   The cyclic garbage collector is off during a replay and run between them (what it would
   cost is the objects' count, alike for both).
3. **Encoding alone.** The captured ended spans of one replay encoded as an
   ``ExportTraceServiceRequest`` (loopscope's ``SpanEncoder`` against the SDK's
   ``encode_spans``), repeated: the encoding's share of the spans' figure.

Not covered: streamed calls (loopscope's per-chunk metric values come from the recorder,
not from the span; bench_openai_overhead's ``loopscope-metrics`` variant measures them).

    .venv/bin/python benchmarks/bench_export_cpu.py             # both scenarios: ~6-8 min at load 12
    .venv/bin/python benchmarks/bench_export_cpu.py --smoke     # checks that it runs
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_openai_overhead as overhead  # the tool loop, the in-process client, the sink, the peers' venv

EXPORT_GOAL = overhead.EXPORT_GOAL
START, END, METRIC, LEAVE, DRAIN = 0, 1, 2, 3, 4
SCENARIOS = {
    # name: (a batch leaves every N model calls, loopscope's metrics thread drains every N calls), with what they model
    "a call a second": (5, 1, "the batch processors' 5 s timer, the metrics thread's 0.5 s"),
    "flat out": (0, 0, "calls back to back: a replay is over before any timer fires; all sent at its end"),
}


# ----------------------------------------------------------------------------------------------------------------------
# Capture (in the peers' venv)
# ----------------------------------------------------------------------------------------------------------------------


class Capture:
    """One instrumentation's spans and measurements for the same model calls, in the order
    they happened: ``ops`` is the replay's plan (START / END / METRIC / LEAVE entries)."""

    def __init__(self) -> None:
        self.ops: list[tuple[Any, ...]] = []
        self.spans: list[dict[str, Any]] = []  # per span: name, kind, scope, parent, start attributes, the ended span
        self.index: dict[int, int] = {}  # span id -> its place in ``spans``
        self.instruments: list[dict[str, Any]] = []
        self.calls = 0
        self.resource: Any = None

    def processor(self, leave_every: int, drain_every: int) -> Any:
        from opentelemetry.sdk.trace import SpanProcessor

        capture = self

        class Recorder(SpanProcessor):
            def on_start(self, span: Any, parent_context: Any = None) -> None:
                i = len(capture.spans)
                capture.index[span.context.span_id] = i
                parent = capture.index.get(span.parent.span_id) if span.parent is not None else None
                capture.resource = span.resource
                capture.spans.append({"name": span.name, "kind": span.kind, "scope": span.instrumentation_scope,
                                      "parent": parent, "start": dict(span.attributes or {}), "t0": span.start_time})
                capture.ops.append((START, i))

            def on_end(self, span: Any) -> None:
                i = capture.index.get(span.context.span_id)
                if i is None:
                    return
                capture.spans[i]["ended"] = span
                capture.ops.append((END, i))
                if (span.attributes or {}).get("gen_ai.operation.name") == "chat":
                    capture.calls += 1
                    if drain_every and capture.calls % drain_every == 0:
                        capture.ops.append((DRAIN,))
                    if leave_every and capture.calls % leave_every == 0:
                        capture.ops.append((LEAVE,))

        return Recorder()

    def plan(self) -> list[tuple[Any, ...]]:
        """The ops with what a replay needs spelled out, spans that never ended left out."""
        from opentelemetry.trace import StatusCode

        done = {i for i, s in enumerate(self.spans) if "ended" in s}
        out: list[tuple[Any, ...]] = []
        for op in self.ops:
            if op[0] == START and op[1] in done:
                s = self.spans[op[1]]
                parent = s["parent"] if s["parent"] in done else None
                out.append((START, op[1], s["scope"], s["name"], parent, s["kind"], s["start"], s["t0"]))
            elif op[0] == END and op[1] in done:
                s = self.spans[op[1]]
                ended = s["ended"]
                start = s["start"]
                rest = {k: v for k, v in (ended.attributes or {}).items() if k not in start or start[k] != v}
                status = ended.status if ended.status.status_code is not StatusCode.UNSET else None
                events = [(e.name, dict(e.attributes or {}), e.timestamp) for e in ended.events]
                out.append((END, op[1], rest, events, status, ended.end_time))
            elif op[0] in (METRIC, LEAVE, DRAIN):
                out.append(op)
        return out

    def ended(self) -> list[Any]:
        """The ended spans, in the order they ended (a replay's batches hold them so)."""
        return [self.spans[op[1]]["ended"] for op in self.ops if op[0] == END and "ended" in self.spans[op[1]]]


def _client() -> tuple[Any, Callable[[], None]]:
    """The in-process openai client of bench_openai_overhead (the fake server's bytes, captured
    once; the server is stopped after that), and what stops it."""
    server, rescript = overhead._fake_server()
    rescript(server, 40)
    client = overhead._inproc_client(server.openai_base_url)
    return client, server.stop


def capture_loopscope(calls: int, leave_every: int, drain_every: int) -> Capture:
    import loopscope
    import loopscope.pipeline

    capture = Capture()
    pipeline = loopscope.configure(False)  # recording only: the spans loopscope's exporter would get
    pipeline.tracer_provider.add_span_processor(capture.processor(leave_every, drain_every))
    loopscope.instrument()
    client, stop = _client()
    try:
        overhead._tool_loop(client, calls, False, "capture")
    finally:
        loopscope.uninstrument()
        loopscope.shutdown()  # ends what a stitched turn still holds open
        stop()
    return capture


def capture_genai(calls: int, leave_every: int, drain_every: int) -> Capture:
    from opentelemetry.instrumentation.genai.openai import OpenAIInstrumentor
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics._internal import instrument as sdk_instrument
    from opentelemetry.sdk.trace import TracerProvider

    capture = Capture()
    provider = TracerProvider()
    provider.add_span_processor(capture.processor(leave_every, drain_every))
    meters = MeterProvider()
    known: dict[int, int] = {}

    def measured(method: Any, kind: str) -> Any:
        def wrapper(self: Any, amount: Any, attributes: Any = None, context: Any = None) -> Any:
            j = known.get(id(self))
            if j is None:
                j = known[id(self)] = len(capture.instruments)
                advisory = getattr(getattr(self, "_advisory", None), "explicit_bucket_boundaries", None)
                capture.instruments.append({"kind": kind, "name": self.name, "unit": self.unit,
                                            "description": self.description, "buckets": advisory,
                                            "scope": self.instrumentation_scope})
            capture.ops.append((METRIC, j, amount, dict(attributes or {})))
            return method(self, amount, attributes, context)

        return wrapper

    record, add = sdk_instrument.Histogram.record, sdk_instrument.Counter.add
    sdk_instrument.Histogram.record = measured(record, "histogram")  # type: ignore[method-assign]
    sdk_instrument.Counter.add = measured(add, "counter")  # type: ignore[method-assign]
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=provider, meter_provider=meters)
    client, stop = _client()
    try:
        overhead._tool_loop(client, calls, False, "capture")
    finally:
        instrumentor.uninstrument()
        sdk_instrument.Histogram.record, sdk_instrument.Counter.add = record, add  # type: ignore[method-assign]
        provider.shutdown()
        meters.shutdown()
        stop()
    return capture


# ----------------------------------------------------------------------------------------------------------------------
# Replay: the variants
# ----------------------------------------------------------------------------------------------------------------------


class Variant:
    """A capture replayed through a tracer provider with ``processors`` (and measurements on
    ``meters``, when given); ``leave`` runs where a batch leaves, ``flush`` at the end."""

    def __init__(self, key: str, capture: Capture, processors: list[Any], meters: Any = None,
                 on_meter: Callable[[Any], list[Any]] | None = None, metrics_processor: Any = None) -> None:
        from opentelemetry.sdk.trace import TracerProvider

        self.key = key
        self.capture = capture
        self.provider = TracerProvider(resource=capture.resource)
        self.processors = processors
        for p in processors:
            self.provider.add_span_processor(p)
        # loopscope's metrics processor: not flushed where a batch leaves (its thread drains it
        # every half second), flushed at the end before the meter provider exports
        if metrics_processor is not None:
            self.provider.add_span_processor(metrics_processor)
        self.meters = meters
        self.instruments = on_meter(meters) if on_meter is not None and meters is not None else None
        self.plan = capture.plan()
        self.leave = [p.force_flush for p in processors]
        self.drain = [metrics_processor.drain] if metrics_processor is not None else []
        self.flush = (self.leave + ([metrics_processor.force_flush] if metrics_processor is not None else [])
                      + ([meters.force_flush] if meters is not None else []))
        self.tracers: dict[Any, Any] = {}
        self.samples: list[list[float]] = []  # per round: CPU ns of each replay

    def tracer(self, scope: Any) -> Any:
        tracer = self.tracers.get(scope)
        if tracer is None:
            tracer = self.tracers[scope] = self.provider.get_tracer(scope.name, scope.version, scope.schema_url)
        return tracer

    def replay(self) -> None:
        from opentelemetry.context import Context
        from opentelemetry.trace import set_span_in_context

        live: dict[int, Any] = {}
        tracers = {s["scope"]: self.tracer(s["scope"]) for s in self.capture.spans}
        instruments = self.instruments
        root = Context()
        for op in self.plan:
            kind = op[0]
            if kind == START:
                _, i, scope, name, parent, span_kind, attributes, t0 = op
                context = set_span_in_context(live[parent]) if parent is not None else root
                live[i] = tracers[scope].start_span(name, context=context, kind=span_kind, attributes=attributes, start_time=t0)
            elif kind == END:
                _, i, rest, events, status, t1 = op
                span = live.pop(i)
                if rest:
                    span.set_attributes(rest)
                for name, attributes, at in events:
                    span.add_event(name, attributes, at)
                if status is not None:
                    span.set_status(status)
                span.end(end_time=t1)
            elif kind == METRIC:
                if instruments is not None:
                    _, j, amount, attributes = op
                    instrument = instruments[j]
                    (instrument.record if hasattr(instrument, "record") else instrument.add)(amount, attributes)
            elif kind == LEAVE:
                for leave in self.leave:
                    leave()
            else:
                for drain in self.drain:
                    drain()
        for flush in self.flush:
            flush()

    def timed(self) -> int:
        gc.collect()
        gc.disable()
        try:
            t0 = time.process_time_ns()
            self.replay()
            return time.process_time_ns() - t0
        finally:
            gc.enable()

    def shutdown(self) -> None:
        self.provider.shutdown()
        if self.meters is not None:
            self.meters.shutdown()


def loopscope_variants(capture: Capture, sink: str) -> list[Variant]:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource

    import loopscope
    from loopscope.content.policy import ContentPolicy
    from loopscope.export.metrics import MetricsProcessor
    from loopscope.export.otlp import (
        CountingBatchProcessor,
        OTLPSettings,
        PolicyExporter,
        metric_exporter,
        span_exporter,
        with_notices,
    )

    settings = OTLPSettings(sink)

    def spans(notices: bool) -> Any:  # as pipeline.configure() makes them
        out, sender = with_notices(span_exporter(settings), settings) if notices else (span_exporter(settings), None)
        return CountingBatchProcessor(PolicyExporter(out, ContentPolicy()), notices=sender)

    def metrics() -> tuple[Any, Any]:  # pipeline._meter()'s provider, and the MetricsProcessor on it
        meters = MeterProvider(resource=Resource.create({}), metric_readers=[PeriodicExportingMetricReader(metric_exporter(settings))])
        processor = MetricsProcessor(meters.get_meter("loopscope", loopscope.__version__), dropped=lambda: {"otlp": 0}, latest=True)
        return meters, processor

    m_meters, m_proc = metrics()
    a_meters, a_proc = metrics()
    return [
        Variant("loopscope.base", capture, []),
        Variant("loopscope.spans", capture, [spans(False)]),
        Variant("loopscope.notices", capture, [spans(True)]),
        Variant("loopscope.metrics", capture, [], m_meters, metrics_processor=m_proc),
        Variant("loopscope.all", capture, [spans(True)], a_meters, metrics_processor=a_proc),
    ]


def genai_variants(capture: Capture, sink: str) -> list[Variant]:
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    def meters() -> Any:
        return MeterProvider(metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter(f"{sink}/v1/metrics"))])

    def instruments(provider: Any) -> list[Any]:  # the instrumentation's own, made again on this provider
        out = []
        for inst in capture.instruments:
            scope = inst["scope"]
            meter = provider.get_meter(scope.name, scope.version, scope.schema_url)
            if inst["kind"] == "histogram":
                out.append(meter.create_histogram(inst["name"], unit=inst["unit"], description=inst["description"],
                                                  explicit_bucket_boundaries_advisory=inst["buckets"]))
            else:
                out.append(meter.create_counter(inst["name"], unit=inst["unit"], description=inst["description"]))
        return out

    def spans() -> Any:
        return BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{sink}/v1/traces"))

    return [
        Variant("genai.base", capture, []),
        Variant("genai.spans", capture, [spans()]),
        Variant("genai.metrics", capture, [], meters(), instruments),
        Variant("genai.all", capture, [spans()], meters(), instruments),
    ]


# ----------------------------------------------------------------------------------------------------------------------
# Encoding alone
# ----------------------------------------------------------------------------------------------------------------------


def encoding_ns(spans: list[Any], encode: Callable[[list[Any]], bytes], repeats: int) -> tuple[float, int]:
    """The minimum CPU ns of encoding ``spans`` as one request, over ``repeats``, and its bytes."""
    best = None
    size = len(encode(spans))
    for _ in range(repeats):
        gc.collect()
        gc.disable()
        try:
            t0 = time.process_time_ns()
            encode(spans)
            took = time.process_time_ns() - t0
        finally:
            gc.enable()
        best = took if best is None else min(best, took)
    return float(best or 0), size


# ----------------------------------------------------------------------------------------------------------------------
# The worker: capture, replay, report
# ----------------------------------------------------------------------------------------------------------------------


def _say(msg: str) -> None:
    print(msg, flush=True)


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):7.1f} [{min(values):6.1f}..{max(values):6.1f}]"


def worker(args: argparse.Namespace) -> int:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    import loopscope
    from loopscope.export.encoder import SpanEncoder

    versions = overhead.versions(("openai", "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-http",
                                  "opentelemetry-instrumentation-genai-openai", "opentelemetry-util-genai"))
    leave_every, drain_every, modelled = SCENARIOS[args.scenario]
    _say("")
    _say(f"== scenario: {args.scenario} ({modelled}) ==")
    _say(f"versions: loopscope {loopscope.__version__} ({Path(loopscope.__file__).parent}), "
         + ", ".join(f"{k} {v}" for k, v in versions.items()))
    mine = capture_loopscope(args.calls, leave_every, drain_every)
    theirs = capture_genai(args.calls, leave_every, drain_every)
    for name, c in (("loopscope", mine), ("genai-openai", theirs)):
        _say(f"captured {name}: {c.calls} model calls, {len(c.ended())} spans, "
             f"{sum(1 for op in c.ops if op[0] == METRIC)} metric measurements, {sum(1 for op in c.ops if op[0] == LEAVE)} "
             f"batches leaving mid-run")
    if mine.calls != theirs.calls or not mine.calls:
        _say(f"the captures differ ({mine.calls} and {theirs.calls} model calls): no comparison")
        return 1
    calls = mine.calls
    variants = loopscope_variants(mine, args.sink_url) + genai_variants(theirs, args.sink_url)
    by_key = {v.key: v for v in variants}
    for v in variants:  # warm-up: connections, caches, the first batch's imports
        v.replay()
    notices = [p.notices for p in by_key["loopscope.notices"].processors if p.notices is not None]
    sent_before = sum(n.sent for n in notices)
    t_start = time.monotonic()
    for r in range(args.rounds):
        times: dict[str, list[int]] = {v.key: [] for v in variants}
        for rep in range(args.reps):
            k = (r * args.reps + rep) % len(variants)
            for v in variants[k:] + variants[:k]:  # each replay in turn, the order rotating
                times[v.key].append(v.timed())
        for v in variants:
            v.samples.append([t / calls for t in times[v.key]])
        _say(f"  round {r + 1}/{args.rounds} ({time.monotonic() - t_start:.0f}s)")
    notices_per_replay = (sum(n.sent for n in notices) - sent_before) / (args.rounds * args.reps)

    def cost(key: str, base: str, stat: Callable[[list[float]], float]) -> list[float]:
        """Per round: the variant's CPU ns a call over its base's, in us."""
        return [(stat(a) - stat(b)) / 1000 for a, b in zip(by_key[key].samples, by_key[base].samples)]

    for title, stat in (("block minima", min), ("block medians", statistics.median)):
        _say("")
        _say(f"export CPU per model call, us ({args.scenario}: whole process, {calls} calls a replay; {title} of "
             f"{args.reps} replays, over its base; median [min..max] over {args.rounds} rounds):")
        _say(f"  {'base replay (spans made, no export)':<44} loopscope {_spread([stat(s) / 1000 for s in by_key['loopscope.base'].samples])}"
             f"   genai-openai {_spread([stat(s) / 1000 for s in by_key['genai.base'].samples])}")
        rows = [
            ("spans (processor, policy, encoding, HTTP)", cost("loopscope.spans", "loopscope.base", stat),
             cost("genai.spans", "genai.base", stat)),
            ("start notices (spans+notices - spans)",
             [x - y for x, y in zip(cost("loopscope.notices", "loopscope.base", stat), cost("loopscope.spans", "loopscope.base", stat))],
             None),
            ("spans + notices", cost("loopscope.notices", "loopscope.base", stat), cost("genai.spans", "genai.base", stat)),
            ("metrics", cost("loopscope.metrics", "loopscope.base", stat), cost("genai.metrics", "genai.base", stat)),
            ("all (spans, notices, metrics)", cost("loopscope.all", "loopscope.base", stat), cost("genai.all", "genai.base", stat)),
        ]
        for label, ours, peer in rows:
            _say(f"  {label:<44} loopscope {_spread(ours)}   genai-openai {_spread(peer) if peer else '      -'}")
        _say(f"  export CPU ratio (goal <= {EXPORT_GOAL:.0f}x; per round, loopscope / genai-openai), {args.scenario}, {title}:")
        pairs = (
            ("spans+notices / spans", "loopscope.notices", "genai.spans"),
            ("spans+notices+metrics / spans", "loopscope.all", "genai.spans"),
            ("spans+notices+metrics / spans+metrics", "loopscope.all", "genai.all"),
        )
        for label, ours_key, peer_key in pairs:
            ours = cost(ours_key, ours_key.split(".")[0] + ".base", stat)
            peer = cost(peer_key, "genai.base", stat)
            ratios = [x / y for x, y in zip(ours, peer) if y > 0]
            if not ratios:
                _say(f"    {label:<40} n/a (genai-openai's cost <= 0 in every round: noise)")
                continue
            mid = statistics.median(ratios)
            _say(f"    {label:<40} {mid:5.2f}x [{min(ratios):.2f}..{max(ratios):.2f}] -> {'MET' if mid <= EXPORT_GOAL else 'NOT MET'}")
    _say(f"  start notices sent: {notices_per_replay:.1f} a replay ({notices_per_replay / calls:.2f} a call)")

    repeats = max(3, args.reps)
    ours_ns, ours_bytes = encoding_ns(mine.ended(), SpanEncoder().encode, repeats)
    peer_ns, peer_bytes = encoding_ns(theirs.ended(), lambda spans: encode_spans(spans).SerializeToString(), repeats)
    _say("")
    _say(f"encoding alone (one replay's ended spans as one request; minimum of {repeats}): loopscope's encoder "
         f"{ours_ns / calls / 1000:.1f} us a call ({len(mine.ended()) / calls:.1f} spans, {ours_bytes / calls:.0f} B), "
         f"the SDK's encode_spans {peer_ns / calls / 1000:.1f} us a call ({len(theirs.ended()) / calls:.1f} spans, "
         f"{peer_bytes / calls:.0f} B)")
    for v in variants:
        v.shutdown()
    return 0


# ----------------------------------------------------------------------------------------------------------------------
# The orchestrator (any venv): the sink, and the worker in the peers' venv
# ----------------------------------------------------------------------------------------------------------------------


def orchestrate(args: argparse.Namespace) -> int:
    started = time.monotonic()
    _say(f"export CPU: {args.calls} model calls captured once per instrumentation, replayed {args.rounds} rounds x "
         f"{args.reps} replays per variant")
    why = overhead.ensure_venv(overhead.PEERS, setup=not args.no_setup)
    if why:
        _say(f"not measured: the peers' venv: {why}")
        return 0
    sink = overhead._OtlpSink()
    _say(f"OTLP sink: {sink.url} (in this process: its CPU is not the export's)")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "TRACELOOP_", "OPENINFERENCE_", "LOOPSCOPE_", "PYTHONPATH"))}
    failed = 0
    try:
        for scenario in SCENARIOS if args.scenario == "both" else (args.scenario,):
            cmd = [str(overhead.PEERS.python), str(Path(__file__).resolve()), "--worker", "--sink-url", sink.url,
                   "--calls", str(args.calls), "--reps", str(args.reps), "--rounds", str(args.rounds),
                   "--scenario", scenario]
            failed = failed or subprocess.run(cmd, cwd=ROOT, env=env, check=False).returncode
    finally:
        sink.stop()
    _say(f"OTLP sink: {sink.requests} requests, {sink.bytes} bytes ("
         + ", ".join(f"{path} {n} / {size} B" for path, (n, size) in sorted(sink.by_path.items())) + ")")
    _say(f"total {time.monotonic() - started:.0f}s")
    return failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=60,
                        help="model calls captured and replayed (a replay; default 60: a minute of one call a second)")
    parser.add_argument("--reps", type=int, default=10, help="replays per variant per round (default 10)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--scenario", choices=[*SCENARIOS, "both"], default="both",
                        help="when batches leave and metrics are drained (default both, one after the other)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks that it runs, measures nothing")
    parser.add_argument("--no-setup", action="store_true", help="do not build the peers' venv when missing")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sink-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.calls, args.reps, args.rounds = 10, 2, 1
    return worker(args) if args.worker else orchestrate(args)


if __name__ == "__main__":
    raise SystemExit(main())
