"""Per-call cost of the hand API: ``@loopscope.tool`` inside ``with loopscope.turn(...)``.

Variants of the same tool call ``add(i, 2)``, timed interleaved in the same run:

* ``bare``     -- the plain function call;
* ``otel``     -- one bare OpenTelemetry SDK span carrying the same GenAI attributes
  (operation, tool name, tool type, call id, arguments as JSON, conversation id, and the
  result as JSON set at the end) via ``tracer.start_as_current_span`` on an SDK
  ``TracerProvider`` with no processors. Its call id is ``os.urandom(16).hex()``, as
  cheap as loopscope's own, so that the baseline is the least an app could pay;
* ``hand``     -- the loopscope decorator inside a turn, with storage configured to a real
  DuckDB file in a temp dir (the background writer maps and writes the rows meanwhile);
* ``unstored`` -- for reference, the same with storage off (``configure(False)``): what
  recording alone costs.

Two metrics per variant:

* **per-call latency** (the goal metric): each call timed on its own with
  ``perf_counter_ns``; the median over all calls of all repeats. This is what the
  calling thread of the application sees.
* **throughput mean**: wall time of the whole loop divided by the number of calls. For
  ``hand`` this also holds the background writer's CPU, which competes for the GIL
  (and it is shown a second time including the final ``flush()``).

Goal: hand per-call latency <= 1.3x the bare OTel span. The machine is noisy: the
script prints medians over interleaved repeats and ratios measured in the same run.

    .venv/bin/python benchmarks/bench_tool_call.py [--calls N] [--repeats R]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider

import loopscope

GOAL = 1.3


def add(a: int, b: int) -> int:
    return a + b


def _timed_calls(call, n: int) -> tuple[list[int], int]:
    """Time ``n`` calls one by one; returns the per-call ns and the loop's wall ns."""
    clock = time.perf_counter_ns
    samples = [0] * n
    begin = clock()
    for i in range(n):
        t0 = clock()
        call(i)
        samples[i] = clock() - t0
    return samples, clock() - begin


def run_bare(n: int) -> tuple[list[int], int, int]:
    samples, wall = _timed_calls(lambda i: add(i, 2), n)
    return samples, wall, wall


def run_otel(n: int) -> tuple[list[int], int, int]:
    tracer = TracerProvider().get_tracer("bench")  # an SDK provider with no processors
    session = os.urandom(16).hex()

    def call(i: int) -> int:
        arguments = {"a": i, "b": 2}
        with tracer.start_as_current_span(
            "execute_tool add",
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "add",
                "gen_ai.tool.type": "function",
                "gen_ai.tool.call.id": os.urandom(16).hex(),  # as cheap an id as loopscope's
                "gen_ai.tool.call.arguments": json.dumps(arguments, ensure_ascii=False),
                "gen_ai.conversation.id": session,
            },
        ) as span:
            result = add(**arguments)
            span.set_attribute("gen_ai.tool.call.result", json.dumps(result, ensure_ascii=False))
            return result

    samples, wall = _timed_calls(call, n)
    return samples, wall, wall


def run_hand(n: int, folder: Path, repeat: int) -> tuple[list[int], int, int]:
    db = folder / f"hand-{repeat}.duckdb"
    pipeline = loopscope.configure(db, tracer_provider=TracerProvider())
    tool = loopscope.tool(add)
    try:
        with loopscope.turn(session_id=f"bench-{repeat}", agent="bench"):
            samples, wall = _timed_calls(lambda i: tool(i, 2), n)
            t0 = time.perf_counter_ns()
            loopscope.flush()
            flushed = wall + time.perf_counter_ns() - t0
        stats = pipeline.stats()
        assert stats is not None and stats.written_events == 2 * n and stats.dropped == 0, stats
    finally:
        loopscope.shutdown()
    return samples, wall, flushed


def run_hand_unstored(n: int) -> tuple[list[int], int, int]:
    """For reference: the hand API recording spans with storage off (``configure(False)``)."""
    loopscope.configure(False, tracer_provider=TracerProvider())
    tool = loopscope.tool(add)
    try:
        with loopscope.turn(session_id="bench-unstored", agent="bench"):
            samples, wall = _timed_calls(lambda i: tool(i, 2), n)
    finally:
        loopscope.shutdown()
    return samples, wall, wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20_000, help="calls per variant per repeat")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    n, repeats = args.calls, args.repeats

    names = ("bare", "otel", "hand", "unstored")
    samples: dict[str, list[int]] = {k: [] for k in names}
    means: dict[str, list[float]] = {k: [] for k in names}
    means_flush: list[float] = []
    with tempfile.TemporaryDirectory(prefix="loopscope-bench-") as tmp:
        folder = Path(tmp)
        run_hand(2_000, folder, -1)  # warm up: imports, schema, first file
        run_otel(2_000)
        for r in range(repeats):
            # interleaved, rotating order so that drift in the machine's load hits all alike
            order = [("bare", run_bare), ("otel", run_otel), ("hand", lambda k, r=r: run_hand(k, folder, r)), ("unstored", run_hand_unstored)]
            order = order[r % 4:] + order[: r % 4]
            for name, fn in order:
                gc.collect()
                s, wall, flushed = fn(n)
                samples[name].extend(s)
                means[name].append(wall / n)
                if name == "hand":
                    means_flush.append(flushed / n)

    lat = {k: statistics.median(v) / 1000 for k, v in samples.items()}
    thr = {k: statistics.median(v) / 1000 for k, v in means.items()}
    thr_flush = statistics.median(means_flush) / 1000
    p90 = {k: statistics.quantiles(v, n=10)[-1] / 1000 for k, v in samples.items()}

    print(f"tool-call cost: {n} calls x {repeats} repeats per variant (python {sys.version.split()[0]})")
    print(f"{'variant':<30} {'median/call':>11} {'vs otel':>8} {'p90/call':>9} {'throughput mean':>16} {'vs otel':>8}")
    rows = (
        ("bare", "bare function call"),
        ("otel", "bare OTel SDK span"),
        ("hand", "loopscope hand API + store"),
        ("unstored", "  (ref) loopscope, store off"),
    )
    for k, label in rows:
        print(f"{label:<30} {lat[k]:>9.2f}us {lat[k] / lat['otel']:>7.2f}x {p90[k]:>7.2f}us {thr[k]:>14.2f}us {thr[k] / thr['otel']:>7.2f}x")
    print(f"{'  incl. the final flush()':<30} {'':>11} {'':>8} {'':>9} {thr_flush:>14.2f}us {thr_flush / thr['otel']:>7.2f}x")
    ratio_lat = lat["hand"] / lat["otel"]
    print()
    print(f"per-call latency ratio  hand/otel = {ratio_lat:.2f}x   <- goal metric (latency seen by the app)")
    print(f"throughput-mean ratio   hand/otel = {thr['hand'] / thr['otel']:.2f}x   (the loop's wall time / calls: includes the")
    print("                                            writer thread's CPU and GIL time while the loop runs)")
    print(f"overhead over a bare call: otel {lat['otel'] - lat['bare']:.2f}us, loopscope {lat['hand'] - lat['bare']:.2f}us")
    met = ratio_lat <= GOAL
    print(f"goal (hand <= {GOAL}x bare otel span, per-call median): {'MET' if met else 'NOT MET'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
