"""Python function calls per LiteLLM request, every thread counted: a measure of added work that
the machine's load does not move (``bench_provider_overhead.py``'s CPU figures swing by more
than the difference between the variants when the load is high).

One process per variant and series; the two-round tool loop (the model asks for
``get_weather``, the result goes back, the model answers) against the fake model server in a
child process; after a warm-up, every Python function call in every thread of the process
(``threading.setprofile_all_threads``) is counted over ``--loops`` loops, LiteLLM's background
reports included (the count goes on for a while after the last loop), and grouped by package.
Variants: ``none`` (LiteLLM alone), ``noop`` (a ``CustomLogger`` that does nothing, in the
lists loopscope's goes in: what LiteLLM does for any logger), ``loopscope`` (spans only:
``configure(False, tracer_provider=...)``), ``openinference`` (its LiteLLM instrumentor); the
two instrumentations' spans go to a ``SimpleSpanProcessor`` into a null exporter alike.
A count is not a CPU time (a call into C, pydantic's validation, JSON encoding, weigh more than
a Python call), but it does not depend on the load.

    .stacks/peers-litellm/bin/python benchmarks/litellm_call_counts.py           # every variant, both series
    .stacks/peers-litellm/bin/python benchmarks/litellm_call_counts.py --loops 20 --variants none loopscope
    .stacks/peers-litellm/bin/python benchmarks/litellm_call_counts.py --smoke      # that it runs (CI)
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import threading
import time
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM's shipped price map, not fetched

from _litellm_loops import WARMUP, WEATHER  # benchmarks/: the script's own folder is on sys.path
from _litellm_loops import route as fake_route

VARIANTS = ("none", "noop", "loopscope", "openinference")
SERIES = ("stream", "nonstream")



def _instrument(variant: str) -> None:
    import litellm

    if variant == "noop":
        from litellm.integrations.custom_logger import CustomLogger

        noop = CustomLogger()
        for name in ("callbacks", "input_callback", "success_callback", "failure_callback", "_async_success_callback",
                     "_async_failure_callback"):
            getattr(litellm, name).append(noop)
        return
    if variant == "none":
        return
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    class Null(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Null()))
    if variant == "loopscope":
        import loopscope

        loopscope.configure(False, tracer_provider=provider)
        loopscope.instrument()
    else:
        from openinference.instrumentation.litellm import LiteLLMInstrumentor

        LiteLLMInstrumentor().instrument(tracer_provider=provider)


def _package(filename: str) -> str:
    if "/loopscope/" in filename:
        return "loopscope"
    if "site-packages/" in filename:
        name = filename.split("site-packages/")[-1].split("/")[0]
        return "opentelemetry" if name == "opentelemetry" else name
    return "stdlib"


def worker(variant: str, series: str, loops: int, warmup: int = WARMUP) -> None:
    import litellm

    route = fake_route(warmup + loops)
    _instrument(variant)
    stream = series == "stream"
    options: dict[str, Any] = {"tools": [WEATHER], **route}
    if stream:
        options.update(stream=True, stream_options={"include_usage": True})

    def request(messages: list[Any]) -> None:
        if stream:
            list(litellm.completion(messages=messages, **options))
        else:
            litellm.completion(messages=messages, **options)

    def loop(i: int) -> None:
        messages: list[Any] = [{"role": "user", "content": f"q{i} weather in Paris?"}]
        request(messages)
        messages += [{"role": "assistant", "content": None, "tool_calls": [{"id": f"c{i}", "type": "function", "function": {
                         "name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                     {"role": "tool", "tool_call_id": f"c{i}", "content": "sunny"}]
        request(messages)

    for i in range(warmup):
        loop(i)
    time.sleep(1.0)
    counts: collections.Counter[str] = collections.Counter()

    def count(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            counts[_package(frame.f_code.co_filename)] += 1

    threading.setprofile_all_threads(count)  # type: ignore[attr-defined]  # Python 3.12+
    for i in range(warmup, warmup + loops):
        loop(i)
    time.sleep(1.5)  # LiteLLM's reports of the last calls, on its pool
    threading.setprofile_all_threads(None)  # type: ignore[attr-defined]
    requests = 2 * loops
    top = ", ".join(f"{name} {n / requests:,.0f}" for name, n in counts.most_common(6))
    print(f"{variant:14s} {series:9s} {sum(counts.values()) / requests:8,.0f} calls a request ({top})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--loops", type=int, default=20)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--series", nargs="+", default=list(SERIES), choices=SERIES)
    parser.add_argument("--warmup", type=int, default=WARMUP, help="loops run before the counted ones")
    parser.add_argument("--smoke", action="store_true", help="one loop, loopscope's variant, streamed: that it runs (CI)")
    parser.add_argument("--worker", nargs=2, metavar=("VARIANT", "SERIES"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.loops, args.warmup, args.variants, args.series = 1, 1, ["loopscope"], ["stream"]
    if args.worker:
        worker(args.worker[0], args.worker[1], args.loops, args.warmup)
        return
    if not hasattr(threading, "setprofile_all_threads"):
        raise SystemExit("Python 3.12 or later: threading.setprofile_all_threads counts every thread's calls")
    for series in args.series:
        for variant in args.variants:
            subprocess.run([sys.executable, __file__, "--loops", str(args.loops), "--warmup", str(args.warmup), "--worker", variant, series],
                           check=True)


if __name__ == "__main__":
    main()
