"""What one batch of the store writer costs, phase by phase, and how much of it is fixed.

The spans of the openai tool loop of ``bench_openai_overhead.py`` (in-process transport, store
on) are captured from the writer's queue, then written again and again the writer's way, in
consecutive batches of ``--calls`` model calls (cut mid-turn too, as the writer's interval
cuts them), through a ``StoreWriter`` as the in-process pipeline makes it: spans to facts
(``map``), the content policy (``scrub``), the file attached (``attach``), ``write_batch``
(every statement and the commit, with the recovery tracker's and the writer report's), the
file let go (``detach``). Per phase: the calling thread's CPU (``time.thread_time``; DuckDB runs a
write on that thread) per batch, median over ``--repeats`` batches, and per model call. Two
batch sizes give the fixed cost of a batch (the intercept) and the cost of a call (the slope):
at the rate of ``bench_openai_overhead.py`` (a batch every 30-60 calls) the fixed part is most
of the writer's CPU.

    .venv/bin/python benchmarks/batch_cost.py                 # ~1 min
    .venv/bin/python benchmarks/batch_cost.py --calls 10 200  # other batch sizes
    .venv/bin/python benchmarks/batch_cost.py --smoke         # seconds
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_openai_overhead as bench  # the loop, the fake server and the in-process client

PHASES = ("map", "scrub", "attach", "write_batch", "detach", "total", "process")
"""The phases, the whole of the batch on the calling thread (``total``), and the whole process's
CPU meanwhile, every thread (``process``: DuckDB's and the writer's own included)."""


def _capture(calls: int) -> list[Any]:
    """The ``(kind, span)`` items the writer is handed for ``calls`` model calls of the loop."""
    import loopscope
    from loopscope import pipeline

    server, rescript = bench._fake_server()
    rescript(server, 10 * calls + 100)
    try:
        client = bench._inproc_client(server.openai_base_url)
        with tempfile.TemporaryDirectory(prefix="loopscope-batch-cost-") as tmp:
            # the thread writer: its queue holds the (kind, span) items its batches are made of
            loopscope.configure(str(Path(tmp) / "capture.duckdb"), flush_interval=3600, writer="thread")  # nothing written meanwhile
            loopscope.instrument()
            try:
                bench._tool_loop(client, 8, False, "warm")
                assert loopscope.flush()
                writer = pipeline._active.writer  # type: ignore[union-attr]
                bench._tool_loop(client, calls, False, "capture")
                return [item for item in list(writer._queue) if type(item) is tuple]
            finally:
                loopscope.uninstrument()
                loopscope.shutdown()
    finally:
        server.stop()


def _batches(items: list[Any], size: int, repeats: int, folder: Path) -> dict[str, float]:
    """The median thread CPU (seconds) of each phase of writing ``items`` in consecutive
    batches of ``size`` spans, as the in-process writer does (its recovery tracker's and its
    report's statements included): batches cut wherever ``size`` falls, mid-turn as well."""
    import contextlib

    from loopscope.ingest.writer import SPANS
    from loopscope.storage import rows
    from loopscope.storage.duckdb import writer as w

    clock = time.thread_time
    spent: dict[str, list[float]] = {phase: [] for phase in PHASES}
    opened: list[float] = []  # attach and detach of each open_store block, as the writer enters and leaves it
    real_open = w.open_store

    @contextlib.contextmanager
    def timed_open(*args: Any, **kwargs: Any) -> Any:
        t0 = clock()
        with real_open(*args, **kwargs) as con:
            opened.append(clock() - t0)
            yield con
            t1 = clock()
        opened.append(clock() - t1)

    writer = w.StoreWriter(str(folder / f"batches-{size}.duckdb"), mapping=SPANS, track_turns=True)
    # the captured turns began before this writer did, as only a turn open across a writer
    # process's restart does in an application: its summary would replace a recovered one
    writer._tracker._since_us = 0  # type: ignore[union-attr]
    w.open_store = timed_open  # type: ignore[assignment]
    try:
        for i in range(repeats + 2):  # the first two warm up (the schema, pyarrow's import)
            chunk = items[i * size:(i + 1) * size]
            p0 = time.process_time()
            t0 = clock()
            facts = rows.Facts()
            SPANS.add(facts, chunk, frozenset(), None)
            t1 = clock()
            scrub_and_write(writer, facts)  # the writer's _write: the content policy, then the piece
            t4 = clock()
            process = time.process_time() - p0
            attach, detach = opened[-2:]
            del opened[:]
            scrubbing = writer_scrub[-1]
            statements = t4 - t1 - scrubbing - attach - detach
            for phase, seconds in zip(PHASES, (t1 - t0, scrubbing, attach, statements, detach, t4 - t0, process)):
                spent[phase].append(seconds)
    finally:
        w.open_store = real_open
        writer.close()
    return {phase: statistics.median(values[2:]) for phase, values in spent.items()}


writer_scrub: list[float] = []


def scrub_and_write(writer: Any, facts: Any) -> None:
    """What the writer's ``_write`` does with one batch, the content policy timed apart."""
    from loopscope.storage import scrub

    t0 = time.thread_time()
    scrub.scrubber(writer.content).apply(facts)
    writer_scrub.append(time.thread_time() - t0)
    failure = writer._write_piece(facts)
    if failure is not None:
        raise failure


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, nargs=2, default=(10, 120), metavar=("SMALL", "LARGE"),
                        help="model calls per batch, two sizes (default 10 120)")
    parser.add_argument("--repeats", type=int, default=15, help="batches per size (default 15)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks that it runs")
    args = parser.parse_args()
    sizes, repeats = ((2, 6), 2) if args.smoke else (tuple(args.calls), args.repeats)

    items = _capture((repeats + 2) * max(sizes) + 8)
    per_call = len(items) / ((repeats + 2) * max(sizes) + 8)  # spans per model call (the loop's turns are alike)
    medians = {}
    with tempfile.TemporaryDirectory(prefix="loopscope-batch-cost-") as tmp:
        for calls in sizes:
            # an odd number of spans: the batches end mid-turn (the tracker lists and closes turns)
            medians[calls] = _batches(items, round(calls * per_call) | 1, repeats, Path(tmp))
    small, large = sizes
    print(f"writer CPU per batch (ms, median of {repeats}) and what it is per model call (us), "
          f"{per_call:.1f} spans a call:")
    print(f"  {'phase':<12} {small:>5} calls  {large:>5} calls   fixed ms/batch   us per call   fixed share at {small}")
    for phase in PHASES:
        a, b = medians[small][phase], medians[large][phase]
        slope = max(0.0, (b - a) / (large - small))
        fixed = max(0.0, a - slope * small)
        share = fixed / a if a else 0.0
        print(f"  {phase:<12} {a * 1e3:10.2f}  {b * 1e3:10.2f}   {fixed * 1e3:14.2f}   {slope * 1e6:11.1f}   {share:>6.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
