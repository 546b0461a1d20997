"""The store writer's CPU per openai call under a steady load: a pinned interval against the default.

The tool loop of ``bench_openai_overhead.py`` runs through the in-process transport (the
whole SDK, no socket) in rounds of ``--calls`` calls, loopscope instrumenting it with the
store on (the thread writer, whose CPU is its thread's); the rounds alternate between
``flush_interval=0.5`` (a batch every half second), the default before session 11 (the wait
after a batch its CPU time / 5%, whatever the load) and the default (``None``: the same, but
/ 2% after a batch of ``BUSY_ROWS`` rows or more), all within 0.5-5 s. Per round: the CPU
of the writer's thread per call, the round's last flush included, and the number of
batches. Prints the medians and their ratios.

    .venv/bin/python benchmarks/writer_cpu.py              # ~1 min
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_openai_overhead as bench  # the loop, the fake server and the in-process client


def _writer_cpu(writer: object) -> float:
    """Seconds of CPU the writer's thread has used (its own clock)."""
    thread = writer._thread  # type: ignore[attr-defined]
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1200, help="calls per round (default 1200)")
    parser.add_argument("--rounds", type=int, default=6, help="rounds per setting (default 6)")
    args = parser.parse_args()

    import loopscope
    from loopscope import pipeline

    server, rescript = bench._fake_server()
    rescript(server, 100)
    from loopscope.storage import writer as store_writer

    busy_rows = store_writer.BUSY_ROWS
    # name: (flush_interval, BUSY_ROWS): a batch never counts as busy with BUSY_ROWS out of reach
    settings = {"pinned 0.5 s": (0.5, busy_rows), "5% always (before)": (None, 1 << 62),
                "default (2% when busy)": (None, busy_rows)}
    results: dict[str, list[tuple[float, int]]] = {name: [] for name in settings}
    try:
        client = bench._inproc_client(server.openai_base_url)
        with tempfile.TemporaryDirectory(prefix="loopscope-writer-cpu-") as tmp:
            for r in range(args.rounds):
                for name in (list(settings) if r % 2 == 0 else list(settings)[::-1]):
                    interval, store_writer.BUSY_ROWS = settings[name]
                    loopscope.configure(str(Path(tmp) / f"w{r}-{len(results[name])}.duckdb"),
                                        flush_interval=interval, writer="thread")
                    loopscope.instrument()
                    bench._tool_loop(client, 100, False, "warm")
                    loopscope.flush()
                    writer = pipeline._active.writer  # type: ignore[union-attr]
                    cpu, batches = _writer_cpu(writer), writer.stats().batches
                    calls = len(bench._tool_loop(client, args.calls, False, f"r{r}"))
                    loopscope.flush()
                    results[name].append(((_writer_cpu(writer) - cpu) / calls * 1e6, writer.stats().batches - batches))
                    loopscope.uninstrument()
                    loopscope.shutdown()
    finally:
        server.stop()
        store_writer.BUSY_ROWS = busy_rows
    print(f"store writer's CPU per call, {args.rounds} rounds of {args.calls} calls per setting (median [min..max]):")
    medians = {}
    for name, rows in results.items():
        us = [x for x, _ in rows]
        medians[name] = statistics.median(us)
        print(f"  {name:<24} {medians[name]:6.1f} us/call [{min(us):.1f}..{max(us):.1f}], "
              f"{statistics.median(n for _, n in rows):.0f} batches a round")
    pinned, before, default = medians.values()
    print(f"default / pinned: {default / pinned:.2f}x; default / before: {default / before:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
