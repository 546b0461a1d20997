"""The store writer's CPU per openai call: a pinned interval, the default before session 21, the default.

The tool loop of ``bench_openai_overhead.py`` runs through the in-process transport (the
whole SDK, no socket) in rounds of ``--calls`` calls, as fast as it goes or ``--rate`` calls
a second (an agent whose model answers in a second or two makes one or two), loopscope
instrumenting it with the store on (the thread writer, whose CPU is its thread's); the
rounds alternate between ``flush_interval=0.5`` (a batch every half second), the default
before session 21 (the wait after a batch its CPU time / 5%, within 0.5-5 s) and the default
(``None``: its CPU time / 1%, within 1-5 s; loopscope's readers have held rows written first,
``storage/duckdb/wakeup.py``). Per round: the CPU of the writer's thread per call, the round's last
flush included, and the number of batches. Prints the medians and their ratios.

    .venv/bin/python benchmarks/writer_cpu.py                          # ~1 min: a steady load
    .venv/bin/python benchmarks/writer_cpu.py --rate 2 --calls 40      # ~4 min: a real agent's pace
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


def _paced(client: object, calls: int, rate: float, tag: str) -> int:
    """Make ``calls`` calls of the loop (two a turn), ``rate`` a second (0: as fast as it goes)."""
    if rate <= 0:
        return len(bench._tool_loop(client, calls, False, tag))
    started, made = time.monotonic(), 0
    while made < calls:
        made += len(bench._tool_loop(client, 2, False, f"{tag}-{made}"))
        time.sleep(max(0.0, started + made / rate - time.monotonic()))
    return made


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1200, help="calls per round (default 1200)")
    parser.add_argument("--rounds", type=int, default=6, help="rounds per setting (default 6)")
    parser.add_argument("--rate", type=float, default=0.0, help="calls a second (default 0: as fast as they go)")
    args = parser.parse_args()

    import loopscope
    from loopscope import pipeline

    server, rescript = bench._fake_server()
    rescript(server, 100)
    from loopscope.storage.duckdb import writer as store_writer

    default = (store_writer.AUTO_SHARE, store_writer.AUTO_INTERVAL)
    # name: (flush_interval, AUTO_SHARE, AUTO_INTERVAL)
    settings = {"pinned 0.5 s": (0.5, *default), "5%, 0.5-5 s (before)": (None, 0.05, (0.5, 5.0)),
                "default (1%, 1-5 s)": (None, *default)}
    results: dict[str, list[tuple[float, int]]] = {name: [] for name in settings}
    try:
        client = bench._inproc_client(server.openai_base_url)
        with tempfile.TemporaryDirectory(prefix="loopscope-writer-cpu-") as tmp:
            for r in range(args.rounds):
                for name in (list(settings) if r % 2 == 0 else list(settings)[::-1]):
                    interval, store_writer.AUTO_SHARE, store_writer.AUTO_INTERVAL = settings[name]
                    loopscope.configure(str(Path(tmp) / f"w{r}-{len(results[name])}.duckdb"),
                                        flush_interval=interval, writer="thread")
                    loopscope.instrument()
                    bench._tool_loop(client, 100, False, "warm")
                    loopscope.flush()
                    writer = pipeline._active.writer  # type: ignore[union-attr]
                    cpu, batches = _writer_cpu(writer), writer.stats().batches
                    calls = _paced(client, args.calls, args.rate, f"r{r}")
                    loopscope.flush()
                    results[name].append(((_writer_cpu(writer) - cpu) / calls * 1e6, writer.stats().batches - batches))
                    loopscope.uninstrument()
                    loopscope.shutdown()
    finally:
        server.stop()
        store_writer.AUTO_SHARE, store_writer.AUTO_INTERVAL = default
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
