"""What finding conversations costs per model call, at 10 and at 500 messages.

In every mode (unless ``LOOPSCOPE_FIND_CONVERSATIONS=0``) a stitched turn whose request
continues an ended turn's conversation joins its session (loopscope/recorder/conversations.py). The request's whole
history comes with every call, so a match that compared histories would cost more with
every message. This measures, with conversations of 10 and of 500 messages (each message
~200 characters, a system message first):

* ``match``: the matching alone, per call: the key of the request's boundary looked up
  (``Conversations.find``), the request's boundary taken (``boundary``) and the answer
  remembered (``Conversations.remember``) -- everything the recorder adds for it;
* ``call on`` / ``call off``: one whole stitched model call through the recorder
  (``start_model_call`` with the messages, then ``finish``; spans recorded, store off),
  with conversations looked for and without; ``added`` is their difference.

Each variant is timed in interleaved repeats; the median per call over repeats is printed
(wall, and whole-process CPU from ``time.process_time``), then the 500/10 ratios: flat is ~1.
On a loaded machine the wall times wander (other processes hold the cores); the CPU times
are this process's own.

    .venv/bin/python benchmarks/bench_conversations.py [--calls N] [--repeats R] [--smoke]
"""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any

from _args import calls_and_repeats  # benchmarks/: the script's own folder is on sys.path
from opentelemetry.sdk.trace import TracerProvider

import loopscope
from loopscope.recorder import adapter, settings
from loopscope.recorder.conversations import Conversations, boundary, conversations

SIZES = (10, 500)
POOL = 50  # conversations in flight, each continued in turn


def _history(n: int, k: int) -> list[dict[str, Any]]:
    """A conversation of ``n`` messages (the k-th of the pool: its own first message)."""
    body = "lorem ipsum dolor sit amet " * 7  # ~190 characters
    messages: list[dict[str, Any]] = [{"role": "system", "content": f"You are agent {k}. {body}"}]
    for i in range(1, n):
        messages.append({"role": "user" if i % 2 else "assistant", "content": f"{i}: {body}"})
    if messages[-1]["role"] != "user":
        messages.append({"role": "user", "content": f"question: {body}"})
    return messages


def _requests(n: int) -> list[tuple[list[dict[str, Any]], str]]:
    """For each conversation of the pool: the request that continues its last answer, and
    that answer (remembered before timing, so every look-up finds its conversation)."""
    out = []
    for k in range(POOL):
        history = _history(n - 2, k)
        answer = f"answer {k}: " + "consectetur adipiscing elit " * 6
        out.append((history + [{"role": "assistant", "content": answer}, {"role": "user", "content": "and then?"}], answer))
    return out


def run_match(n: int, calls: int) -> tuple[float, float]:
    """The matching alone: (wall ns, CPU ns) per call."""
    remembered = Conversations()
    requests = _requests(n)
    for request, answer in requests:
        remembered.remember(boundary(request[:-2]), answer, "s")  # type: ignore[arg-type]
    gc.collect()
    wall, cpu = time.perf_counter_ns(), time.process_time_ns()
    for i in range(calls):
        request, answer = requests[i % POOL]
        found = remembered.find(request)
        assert found is not None
        remembered.remember(boundary(request), answer, found)  # type: ignore[arg-type]
    return (time.perf_counter_ns() - wall) / calls, (time.process_time_ns() - cpu) / calls


def run_calls(n: int, calls: int, find: bool) -> tuple[float, float]:
    """Whole stitched calls through the recorder: (wall ns, CPU ns) per call."""
    was, settings.find_conversations = settings.find_conversations, find
    conversations.clear()
    requests = _requests(n)
    for request, answer in requests:
        conversations.remember(boundary(request[:-2]), answer, "s")  # type: ignore[arg-type]
    gc.collect()
    wall, cpu = time.perf_counter_ns(), time.process_time_ns()
    for i in range(calls):
        request, answer = requests[i % POOL]
        call = adapter.start_model_call(adapter.ModelRequest("openai", "gpt-test", messages=request))
        assert call is not None
        call.finish(adapter.ModelResponse(text=answer, finish_reason="stop"))
    settings.find_conversations = was
    return (time.perf_counter_ns() - wall) / calls, (time.process_time_ns() - cpu) / calls


def main() -> int:
    args = calls_and_repeats(__doc__, 20_000, 200)
    loopscope.configure(False, tracer_provider=TracerProvider())  # spans recorded, nothing stored
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    try:
        for _ in range(args.repeats):
            for n in SIZES:  # interleaved: the machine's drift falls on every variant alike
                results.setdefault(("match", n), []).append(run_match(n, args.calls))
                results.setdefault(("call off", n), []).append(run_calls(n, args.calls // 4, False))
                results.setdefault(("call on", n), []).append(run_calls(n, args.calls // 4, True))
    finally:
        loopscope.shutdown()
        conversations.clear()

    def median(variant: str, n: int, which: int) -> float:
        return statistics.median(r[which] for r in results[(variant, n)])

    print(f"conversation matching, per call (median of {args.repeats} repeats; {args.calls} matches, "
          f"{args.calls // 4} calls per repeat)")
    print(f"{'variant':<12}" + "".join(f"{f'{n} msgs wall':>16}{f'{n} msgs CPU':>16}" for n in SIZES)
          + f"{'500/10 wall':>13}{'500/10 CPU':>13}")
    rows = [("match", lambda n, w: median("match", n, w)),
            ("call off", lambda n, w: median("call off", n, w)),
            ("call on", lambda n, w: median("call on", n, w)),
            ("added", lambda n, w: median("call on", n, w) - median("call off", n, w))]
    for name, value in rows:
        cells = "".join(f"{value(n, 0) / 1000:>13.2f} us{value(n, 1) / 1000:>13.2f} us" for n in SIZES)
        ratios = ""
        for which in (0, 1):
            small, large = value(SIZES[0], which), value(SIZES[1], which)
            ratios += f"{large / small:>12.2f}x" if small > 0 else f"{'-':>13}"
        print(f"{name:<12}{cells}{ratios}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
