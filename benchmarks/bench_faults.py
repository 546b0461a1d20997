"""The hot path under faults: per-call cost of a recorded tool call while the store's
writer is artificially slow, and while the OTLP endpoint refuses connections or hangs.

Each variant is the hand API's tool call (``@loopscope.tool`` inside a turn, as in
``bench_tool_call.py``) with a real DuckDB store; timed one call at a time, interleaved
across repeats in the same run:

* ``normal``        -- store on, no export;
* ``slow writer``   -- every store batch takes an extra 250 ms (``write_batch`` wrapped
  with a sleep), with a small queue (``queue_size=5000`` rows) so the backlog fills and
  events are dropped and counted;
* ``otlp ok``       -- OTLP export to a healthy loopback endpoint (answers 200): the
  normal value for the two OTLP faults;
* ``otlp refused``  -- OTLP export to a loopback port where nothing listens;
* ``otlp hanging``  -- OTLP export to a loopback endpoint that accepts connections and
  never answers.

Goal (issue 7): each fault's per-call median within 1.5x its normal value (``slow
writer`` against ``normal``, the OTLP faults against ``otlp ok``). Also printed: what
the slow writer had to drop (counted, never silent), and the peak queue length, which the
queue bound caps.

Then (issue 15), each in a child process of its own, whose writer is stuck inside a write
that takes 100 s (``write_batch`` wrapped with a sleep), ``--big-calls`` tool calls that
each return 1 MiB:

* ``1 MiB, no byte bound`` -- ``queue_bytes`` so large it never binds: the baseline, what
  the queue held before it was bounded in bytes;
* ``1 MiB, byte bound``    -- the default ``queue_bytes`` (``QUEUE_BYTES``: 64 MiB).

For each: the per-call median and the whole process's CPU per call during the loop, the
growth of peak RSS over the process's RSS before the loop, what was dropped (counted),
and the exit time: from the child's last call to the end of its process, with the writer
still stuck (the close bound, ``CLOSE_TIMEOUT``, is 5 s; before issue 15 it was the
stuck write's 100 s).

    .venv/bin/python benchmarks/bench_faults.py [--calls N] [--repeats R] [--big-calls M] [--quick | --smoke]
"""

from __future__ import annotations

import argparse
import gc
import http.server
import json
import logging
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider

import loopscope
from loopscope.ingest import writer_process
from loopscope.storage.duckdb import writer as writer_module

GOAL = 1.5
SMALL_QUEUE = 5_000


def add(a: int, b: int) -> int:
    return a + b


class Hanging:
    """A loopback endpoint that accepts connections and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.conns.append(self.sock.accept()[0])
            except OSError:
                return

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"


class _Ok(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def healthy_url() -> str:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


def refused_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


def faulted_child(pause: float) -> str:
    """The writer process's code (``writer_process._CHILD_CODE``) with each of its batches
    ``pause`` seconds longer: the writer that runs by default is that child, not this
    process's ``write_batch`` (issue 29: faulting only this one measured nothing)."""
    return (
        "import sys, json, time; sys.path[:0] = json.loads(sys.argv[1])\n"
        "from loopscope.storage.duckdb import writer\n"
        "original = writer.write_batch\n"
        "def faulted(*args, **kwargs):\n"
        f"    time.sleep({pause!r})\n"
        "    return original(*args, **kwargs)\n"
        "writer.write_batch = faulted\n"
        "from loopscope.ingest.writer_child import main; main()\n"
    )


def fault_writer(pause: float) -> Callable[[], None]:
    """Make every store batch ``pause`` seconds longer, in whichever writer runs: the writer
    process (the default) and the thread writer (where no child can run). Returns the undo."""
    original, child_code = writer_module.write_batch, writer_process._CHILD_CODE

    def slow_batch(*args, **kwargs):  # type: ignore[no-untyped-def]
        time.sleep(pause)
        return original(*args, **kwargs)

    writer_module.write_batch = slow_batch
    writer_process._CHILD_CODE = faulted_child(pause)

    def undo() -> None:
        writer_module.write_batch, writer_process._CHILD_CODE = original, child_code

    return undo


def run(n: int, db: Path, *, otlp: str | None = None, slow: bool = False) -> tuple[list[int], dict[str, Any]]:
    undo = fault_writer(0.25) if slow else (lambda: None)
    pipeline = loopscope.configure(
        db, tracer_provider=TracerProvider(), otlp_endpoint=otlp, queue_size=SMALL_QUEUE if slow else 200_000
    )
    tool = loopscope.tool(add)
    clock = time.perf_counter_ns
    samples = [0] * n
    peak = 0
    try:
        with loopscope.turn(session_id="bench", agent="bench"):
            for i in range(n):
                t0 = clock()
                tool(i, 2)
                samples[i] = clock() - t0
                if slow and i % 500 == 0:
                    peak = max(peak, pipeline.stats().queued)  # type: ignore[union-attr]
        stats = pipeline.stats()
        info: dict[str, Any] = {"dropped": stats.dropped if stats else 0, "peak_queued": peak, "mode": pipeline.writer_mode}
    finally:
        undo()
        t0 = time.monotonic()
        loopscope.shutdown()
        info_shutdown = time.monotonic() - t0
    info["shutdown_ms"] = int(info_shutdown * 1000)
    return samples, info


BIG_CHILD = textwrap.dedent(
    """
    import json, resource, statistics, sys, time
    import loopscope
    from loopscope.storage.duckdb import writer

    def stuck(*args, **kwargs):
        time.sleep(100)  # the writer is inside a write that takes 100 s

    def peak_rss_kb(path="/proc/self/status"):
        # VmHWM: this process's own peak (ru_maxrss starts from the parent's at fork, and execve keeps it)
        try:
            with open(path) as status:
                return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
        except (OSError, StopIteration):
            return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    writer.write_batch = stuck
    db, calls, queue_bytes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    from loopscope.ingest import writer_process
    writer_process._CHILD_CODE = sys.argv[4]  # the writer process (the default) stuck too
    pipeline = loopscope.configure(db, queue_bytes=queue_bytes)
    value = "v" * (1 << 20)

    @loopscope.tool
    def fetch(i: int) -> str:
        return value[:-1] + chr(97 + i % 26)  # a new 1 MiB string per call, as a real result is

    def writer_peak_kb():
        pid = getattr(pipeline.writer, "child_pid", lambda: None)()
        return peak_rss_kb(f"/proc/{pid}/status") if pid else 0

    def writer_growth():
        return (writer_peak_kb() - writer_before) / 1024

    fetch(0)
    rss_before = peak_rss_kb()
    time.sleep(2)  # the writer process's start (its imports, the store's check): before the calls
    writer_before = writer_peak_kb()
    samples = []
    clock = time.perf_counter_ns
    cpu0 = time.process_time()
    with loopscope.turn(session_id="big", agent="bench"):
        for i in range(calls):
            t0 = clock()
            fetch(i)
            samples.append(clock() - t0)
    cpu = time.process_time() - cpu0
    last_call = time.monotonic()
    stats = pipeline.stats()
    print(json.dumps({
        "median_us": statistics.median(samples) / 1000, "cpu_us_per_call": cpu / calls * 1e6,
        "rss_growth_mb": (peak_rss_kb() - rss_before) / 1024,
        "dropped": stats.dropped, "queued_bytes_mb": stats.queued_bytes / (1 << 20), "last_call": last_call,
        "mode": pipeline.writer_mode, "writer_rss_growth_mb": writer_growth(),
    }), flush=True)
    """
)
"""A child process that makes 1 MiB tool results with its writer stuck, then exits (at
exit: the close bound); prints its measures as JSON, and when its last call ended."""


def big_values(calls: int, tmp: Path, name: str, queue_bytes: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPSCOPE_", "OTEL_"))}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    proc = subprocess.Popen([sys.executable, "-c", BIG_CHILD, str(tmp / f"{name}.duckdb"), str(calls), str(queue_bytes),
                             faulted_child(100.0)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    proc.wait(300)
    ended = time.monotonic()  # CLOCK_MONOTONIC: the same clock in the child
    out = json.loads(line)
    out["exit_s"] = ended - out.pop("last_call")
    return out


NO_BYTE_BOUND = 1 << 62


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--big-calls", type=int, default=500, help="1 MiB tool results per child (issue 15)")
    parser.add_argument("--quick", action="store_true", help="a short run: 2,000 calls, 2 repeats, 200 big calls")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (seconds), for CI: proves it runs, measures nothing")
    args = parser.parse_args()
    if args.quick:
        args.calls, args.repeats, args.big_calls = 2_000, 2, 200
    if args.smoke:
        args.calls, args.repeats, args.big_calls = 200, 1, 12
    logging.getLogger("opentelemetry").setLevel(logging.CRITICAL)  # the faults' export errors are expected
    hanging = Hanging()
    healthy = healthy_url()
    variants: list[tuple[str, Callable[[int, Path], tuple[list[int], dict[str, Any]]]]] = [
        ("normal", lambda n, db: run(n, db)),
        ("slow writer", lambda n, db: run(n, db, slow=True)),
        ("otlp ok", lambda n, db: run(n, db, otlp=healthy)),
        ("otlp refused", lambda n, db: run(n, db, otlp=refused_url())),
        ("otlp hanging", lambda n, db: run(n, db, otlp=hanging.url)),
    ]
    samples: dict[str, list[int]] = {name: [] for name, _ in variants}
    medians: dict[str, list[float]] = {name: [] for name, _ in variants}
    infos: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in variants}
    with tempfile.TemporaryDirectory(prefix="loopscope-faults-") as tmp:
        run(min(2_000, args.calls), Path(tmp) / "warm.duckdb")
        for r in range(args.repeats):
            order = variants[r % len(variants):] + variants[: r % len(variants)]
            for name, fn in order:
                gc.collect()
                s, info = fn(args.calls, Path(tmp) / f"{name.replace(' ', '-')}-{r}.duckdb")
                samples[name].extend(s)
                medians[name].append(statistics.median(s) / 1000)
                infos[name].append(info)
    normal = {name: statistics.median(samples["otlp ok" if name.startswith("otlp") else "normal"]) / 1000 for name in samples}
    modes = sorted({str(i["mode"]) for runs in infos.values() for i in runs})
    print(f"hot path under faults: {args.calls} calls x {args.repeats} repeats per variant (python {sys.version.split()[0]}; "
          f"the store's writer: {', '.join(modes)}, faulted there)")
    print(f"{'variant':<14} {'median/call':>11} {'vs its normal':>13} {'p90/call':>9}  {'repeat medians (us)':<34} notes")
    met = True
    for name, _ in variants:
        med = statistics.median(samples[name]) / 1000
        p90 = statistics.quantiles(samples[name], n=10)[-1] / 1000
        ratio = med / normal[name]
        if name not in ("normal", "otlp ok"):
            met = met and ratio <= GOAL
        notes = ""
        if name == "slow writer":
            notes = (f"dropped {statistics.median(i['dropped'] for i in infos[name]):.0f} events per repeat (counted), "
                     f"peak queue {max(i['peak_queued'] for i in infos[name])} <= {SMALL_QUEUE}")
        elif name in ("otlp refused", "otlp hanging"):
            notes = f"shutdown {statistics.median(i['shutdown_ms'] for i in infos[name]):.0f} ms (bounded)"
        runs = " ".join(f"{m:.1f}" for m in medians[name])
        print(f"{name:<14} {med:>9.2f}us {ratio:>12.2f}x {p90:>7.2f}us  {runs:<34} {notes}")
    print()
    print(f"goal (every fault <= {GOAL}x normal, per-call median): {'MET' if met else 'NOT MET'}")
    print()
    from loopscope.storage.duckdb.writer import CLOSE_TIMEOUT, QUEUE_BYTES

    print(f"writer stuck in a 100 s write, {args.big_calls} tool calls returning 1 MiB each, one child process per variant")
    print(f"{'variant':<22} {'median/call':>11} {'cpu/call':>9} {'peak RSS growth':>15} {'writer process':>14} {'dropped':>8} "
          f"{'held at end':>11} {'exit after last call':>20}")
    results = {}
    with tempfile.TemporaryDirectory(prefix="loopscope-big-") as tmp:
        for name, bound in (("1 MiB, no byte bound", NO_BYTE_BOUND), ("1 MiB, byte bound", QUEUE_BYTES)):
            r = results[name] = big_values(args.big_calls, Path(tmp), name.replace(" ", "-").replace(",", ""), bound)
            print(f"{name:<22} {r['median_us']:>9.1f}us {r['cpu_us_per_call']:>7.1f}us {r['rss_growth_mb']:>12.0f} MB "
                  f"{r['writer_rss_growth_mb']:>11.0f} MB {r['dropped']:>8} {r['queued_bytes_mb']:>8.0f} MB {r['exit_s']:>18.2f} s"
                  f"  (writer: {r['mode']})")
    before, after = results["1 MiB, no byte bound"], results["1 MiB, byte bound"]
    print(f"byte bound vs none: median/call {after['median_us'] / before['median_us']:.2f}x, "
          f"cpu/call {after['cpu_us_per_call'] / before['cpu_us_per_call']:.2f}x, "
          f"peak RSS growth {after['rss_growth_mb']:.0f} MB vs {before['rss_growth_mb']:.0f} MB "
          f"(bound {QUEUE_BYTES >> 20} MiB); exit within the close bound ({CLOSE_TIMEOUT:g} s, +2 s for the interpreter to end): "
          f"{'MET' if max(after['exit_s'], before['exit_s']) <= CLOSE_TIMEOUT + 2 else 'NOT MET'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
