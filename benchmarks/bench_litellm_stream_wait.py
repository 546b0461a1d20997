"""A streamed LiteLLM tool loop's second request: does it wait for LiteLLM's report of the first?

LiteLLM reports a call to its callbacks after it returned it (a thread pool). Until session 23
the request that sent a stream's tool results back waited, bounded, for loopscope's callback
to record that stream; now the response LiteLLM assembles at the stream's end, in the caller's
thread, is kept and ends the call at once (``loopscope/instrument/litellm.py``). This times the
second request of the streamed two-round loop (from the call until its last chunk was read)
both ways, call by call in one process under the same load: ``kept`` (this tree) and
``waits`` (the kept response thrown away, as before). ``--slow-ms``: an application logger
registered before loopscope's that takes that long to report each call (I/O of its own), what
the wait then includes. The fake model server runs in a child process, so that its threads do
not take the caller's GIL.

    .stacks/peers-litellm/bin/python benchmarks/bench_litellm_stream_wait.py --calls 120
    .stacks/peers-litellm/bin/python benchmarks/bench_litellm_stream_wait.py --calls 60 --slow-ms 20
    .stacks/peers-litellm/bin/python benchmarks/bench_litellm_stream_wait.py --smoke      # that it runs (CI)

(``peers-litellm``: the stack ``bench_provider_overhead.py`` builds, LiteLLM and loopscope in one venv.)
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM's shipped price map, not fetched

from _litellm_loops import WARMUP, WEATHER  # benchmarks/: the script's own folder is on sys.path
from _litellm_loops import route as fake_route


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=120, help="loops timed, half each way")
    parser.add_argument("--slow-ms", type=float, default=0.0, help="an application logger's time to report a call")
    parser.add_argument("--smoke", action="store_true", help="four loops after one warm-up: that it runs (CI)")
    args = parser.parse_args()
    warmup = 1 if args.smoke else WARMUP
    if args.smoke:
        args.calls = 4  # two each way: the quartiles need two

    import litellm
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    import loopscope

    class Null(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    route = fake_route(warmup + args.calls)

    if args.slow_ms:
        from litellm.integrations.custom_logger import CustomLogger

        class Slow(CustomLogger):  # the application's, in the list before loopscope's
            def log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
                time.sleep(args.slow_ms / 1000)

        litellm.success_callback.append(Slow())
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Null()))
    loopscope.configure(False, tracer_provider=provider)
    loopscope.instrument()
    adapter = importlib.import_module("loopscope.instrument.litellm")
    keep = adapter._stream_answered

    def loop(i: int) -> tuple[int, int]:
        messages: list[Any] = [{"role": "user", "content": f"q{i} weather in Paris?"}]
        options = {"tools": [WEATHER], "stream": True, "stream_options": {"include_usage": True}, **route}
        list(litellm.completion(messages=messages, **options))
        messages += [{"role": "assistant", "content": None, "tool_calls": [{"id": f"c{i}", "type": "function", "function": {
                         "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                     {"role": "tool", "tool_call_id": f"c{i}", "content": "sunny"}]
        wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
        list(litellm.completion(messages=messages, **options))
        return time.perf_counter_ns() - wall, time.thread_time_ns() - cpu

    for i in range(warmup):
        loop(i)
    walls: dict[bool, list[float]] = {True: [], False: []}
    cpus: dict[bool, list[float]] = {True: [], False: []}
    for i in range(warmup, warmup + args.calls):
        kept = i % 2 == 0
        adapter._stream_answered = keep if kept else (lambda stream, response: None)
        wall, cpu = loop(i)
        walls[kept].append(wall / 1e3)
        cpus[kept].append(cpu / 1e3)
        time.sleep(0.05)  # the last loop's reports are done before the next
    adapter._stream_answered = keep
    from importlib.metadata import version

    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(f"LiteLLM {version('litellm')}, {args.calls} loops, application logger {args.slow_ms:g} ms, load {load}")
    for kept in (False, True):
        q = statistics.quantiles(walls[kept], n=4)
        label = "kept (this tree)" if kept else "waits (before)"
        print(f"  {label:18s} second request: wall median {statistics.median(walls[kept]):7.0f} us [p25 {q[0]:.0f}, "
              f"p75 {q[2]:.0f}]; caller thread CPU median {statistics.median(cpus[kept]):6.0f} us")


if __name__ == "__main__":
    main()
