"""The instrumentation's own time per ``chat.completions.create``, inside the real SDK loop.

The same tool loop as ``bench_openai_overhead.py`` runs through the in-process transport
(the whole SDK, no socket). The wrapper that an instrumentation put on
``Completions.create`` is wrapped once more, so that each call times the wrapper and the
SDK call inside it separately: what is left is the instrumentation's own work on the
calling thread (request reading, span start and end, stitching), with the SDK's code
around it as it really is (caches cold, unlike a micro-benchmark's). Non-streamed calls
only: a stream's chunks are read outside ``create``.

    .venv/bin/python benchmarks/wrapper_own_time.py                          # loopscope, store on
    .venv/bin/python benchmarks/wrapper_own_time.py --nostore                # loopscope, no store
    .stacks/peers-otel-v2/bin/python benchmarks/wrapper_own_time.py \\
        --peer opentelemetry.instrumentation.openai_v2                       # a peer, from its venv

Prints the median and mean microseconds per call; run each a few times, the machine is noisy.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_openai_overhead as bench  # the loop, the fake server and the in-process client


def _instrument(args: argparse.Namespace, tmp: str) -> tuple[str, Any]:
    """Instrument as the variant asks; its name and what ends it (flushes loopscope's store)."""
    if args.peer:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

        class Dropped(SpanExporter):
            def export(self, spans: Any) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(Dropped()))
        importlib.import_module(args.peer).OpenAIInstrumentor().instrument(tracer_provider=provider)
        return args.peer, provider.shutdown
    import loopscope

    loopscope.configure(False if args.nostore else str(Path(tmp) / "own.duckdb"))
    loopscope.instrument()
    return "loopscope" + (" (no store)" if args.nostore else " (store on)"), loopscope.shutdown


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peer", help="a peer's instrumentor module (run from that peer's venv)")
    parser.add_argument("--nostore", action="store_true", help="loopscope with configure(False)")
    parser.add_argument("--calls", type=int, default=4000)
    args = parser.parse_args()

    import wrapt
    from openai.resources.chat.completions import completions as chat

    server, rescript = bench._fake_server()
    rescript(server, 100)
    try:
        client = bench._inproc_client(server.openai_base_url)
        with tempfile.TemporaryDirectory(prefix="loopscope-own-time-") as tmp:
            name, finish = _instrument(args, tmp)
            installed = chat.Completions.__dict__["create"]
            theirs = getattr(installed, "_self_wrapper", None)
            if theirs is None:
                print(f"{name}: Completions.create is not wrapped: nothing to time", file=sys.stderr)
                return 1
            clock = time.perf_counter_ns
            own: list[int] = []

            def timing(wrapped: Any, instance: Any, call_args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
                inner = [0]

                def sdk(*a: Any, **k: Any) -> Any:
                    t = clock()
                    try:
                        return wrapped(*a, **k)
                    finally:
                        inner[0] += clock() - t

                t0 = clock()
                result = theirs(sdk, instance, call_args, kwargs)
                own.append(clock() - t0 - inner[0])
                return result

            chat.Completions.create = wrapt.FunctionWrapper(installed.__wrapped__, timing)
            bench._tool_loop(client, 500, False, "warm")
            own.clear()
            bench._tool_loop(client, args.calls, False, "timed")
            print(f"{name}: own time per call: median {statistics.median(own) / 1000:.1f} us, "
                  f"mean {statistics.mean(own) / 1000:.1f} us ({len(own)} calls)")
            finish()  # before the temporary folder goes: the store's last rows are written
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
