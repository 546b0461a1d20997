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

    .venv/bin/python benchmarks/bench_faults.py [--calls N] [--repeats R]
"""

from __future__ import annotations

import argparse
import gc
import http.server
import logging
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider

import loopscope
from loopscope.storage import writer as writer_module

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
    def do_POST(self) -> None:  # noqa: N802
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


def run(n: int, db: Path, *, otlp: str | None = None, slow: bool = False) -> tuple[list[int], dict[str, int]]:
    original = writer_module.write_batch
    if slow:
        def slow_batch(*args, **kwargs):  # type: ignore[no-untyped-def]
            time.sleep(0.25)
            return original(*args, **kwargs)

        writer_module.write_batch = slow_batch
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
        info = {"dropped": stats.dropped if stats else 0, "peak_queued": peak}
    finally:
        writer_module.write_batch = original
        t0 = time.monotonic()
        loopscope.shutdown()
        info_shutdown = time.monotonic() - t0
    info["shutdown_ms"] = int(info_shutdown * 1000)
    return samples, info


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    logging.getLogger("opentelemetry").setLevel(logging.CRITICAL)  # the faults' export errors are expected
    hanging = Hanging()
    healthy = healthy_url()
    variants: list[tuple[str, Callable[[int, Path], tuple[list[int], dict[str, int]]]]] = [
        ("normal", lambda n, db: run(n, db)),
        ("slow writer", lambda n, db: run(n, db, slow=True)),
        ("otlp ok", lambda n, db: run(n, db, otlp=healthy)),
        ("otlp refused", lambda n, db: run(n, db, otlp=refused_url())),
        ("otlp hanging", lambda n, db: run(n, db, otlp=hanging.url)),
    ]
    samples: dict[str, list[int]] = {name: [] for name, _ in variants}
    medians: dict[str, list[float]] = {name: [] for name, _ in variants}
    infos: dict[str, list[dict[str, int]]] = {name: [] for name, _ in variants}
    with tempfile.TemporaryDirectory(prefix="loopscope-faults-") as tmp:
        run(2_000, Path(tmp) / "warm.duckdb")
        for r in range(args.repeats):
            order = variants[r % len(variants):] + variants[: r % len(variants)]
            for name, fn in order:
                gc.collect()
                s, info = fn(args.calls, Path(tmp) / f"{name.replace(' ', '-')}-{r}.duckdb")
                samples[name].extend(s)
                medians[name].append(statistics.median(s) / 1000)
                infos[name].append(info)
    normal = {name: statistics.median(samples["otlp ok" if name.startswith("otlp") else "normal"]) / 1000 for name in samples}
    print(f"hot path under faults: {args.calls} calls x {args.repeats} repeats per variant (python {sys.version.split()[0]})")
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
