"""Big values: what 1 MiB tool results cost the application's memory, and how fast the
store's writer takes them (issue 30).

Each case runs in a child process of its own (RSS is a process's): ``--calls`` turns of the
hand API, each with one ``@loopscope.tool`` call whose result is ``--value-kib`` KiB of text,
with the store's writer a thread (``writer="thread"``) and a process of its own
(``writer="process"``), on a free disk; and the same with 1 KiB results, the baseline of the
same run. Printed per case: the application's peak RSS (``VmHWM``) over its RSS before the
calls, against the byte bound (``QUEUE_BYTES``, 64 MiB) and as a ratio to the baseline's; the
writer process's peak; the MiB a second of values the writer took (from the first call to
``flush()`` returning: the calls, the pipe, the mapping, the scrubbing, DuckDB), and per second
of the writer's own CPU (its thread's or its process's: less moved by the load); and the
events written against those sent (nothing may be dropped on a free disk while the calls
wait for nothing).

    .venv/bin/python benchmarks/bench_big_values.py                  # 500 calls of 1 MiB
    .venv/bin/python benchmarks/bench_big_values.py --against ../main  # and another checkout's rows
    .venv/bin/python benchmarks/bench_big_values.py --runs 3 --against ../main  # medians of 3, taking turns
    .venv/bin/python benchmarks/bench_big_values.py --smoke          # 20 calls: checks that it runs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = textwrap.dedent("""
    import json, os, sys, time
    import loopscope

    db, mode, calls, value, gap = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])

    def status(pid="self"):
        out = {}
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key] = int(rest.split()[0])
        return out

    pipeline = loopscope.configure(db, writer=mode)
    writer = pipeline.writer
    if mode == "process":
        writer.wait_started(60)

    @loopscope.tool
    def fetch(i: int) -> str:
        return chr(ord("a") + i % 26) * value

    def cpu(stat_path):  # user + system seconds of a process or a thread (/proc's stat)
        with open(stat_path) as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def writer_cpu():
        if mode == "process":
            return cpu(f"/proc/{writer.child_pid()}/stat")
        return cpu(f"/proc/self/task/{writer._thread.native_id}/stat")

    cpu_before = writer_cpu()
    before = status()["VmRSS"]
    start = time.perf_counter()
    for i in range(calls):
        with loopscope.turn(session_id=f"s{i % 8}", input="q"):
            fetch(i)
        if gap:
            time.sleep(gap)
    ok = loopscope.flush(timeout=600)
    took = time.perf_counter() - start
    child = writer.child_pid() if mode == "process" else None
    child_peak = status(child)["VmHWM"] if child else 0
    spent = writer_cpu() - cpu_before
    stats = pipeline.stats()
    peak = status()["VmHWM"]
    loopscope.shutdown()
    print(json.dumps({"flushed": ok, "seconds": took, "before_kb": before, "peak_kb": peak, "child_peak_kb": child_peak,
                      "written": stats.written_events, "dropped": stats.dropped, "writer_cpu": spent}))
""")


def run(mode: str, calls: int, value: int, root: Path = ROOT, gap: float = 0.0) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "child.py"
        script.write_text(CHILD)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "LOOPSCOPE_"))}
        env["PYTHONPATH"] = str(root)
        done = subprocess.run([sys.executable, str(script), str(Path(tmp) / "big.duckdb"), mode, str(calls), str(value), str(gap)],
                              capture_output=True, text=True, env=env, timeout=1800, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{mode} child exited {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _medians(results: list[dict[str, float]]) -> dict[str, float]:
    """Each number's median over the runs (a field of its own: the runs' rates are medians too)."""
    import statistics

    out = {key: statistics.median(r[key] for r in results) for key in results[0] if key != "flushed"}
    out["rate"] = statistics.median(r["written"] / 3 / r["seconds"] for r in results)  # calls written a second
    out["growth_kb"] = statistics.median(r["peak_kb"] - r["before_kb"] for r in results)
    # calls written a second of the writer's own CPU (its thread's, or its process's): what a
    # write costs, where the wall-clock rate swings with the machine's load
    out["cpu_rate"] = statistics.median(r["written"] / 3 / max(r["writer_cpu"], 1e-3) for r in results)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--value-kib", type=int, default=1024)
    parser.add_argument("--modes", nargs="+", default=["thread", "process"])
    parser.add_argument("--against", type=Path, help="another checkout (main, say): its rows printed under this one's")
    parser.add_argument("--gap-ms", type=float, default=0.0,
                        help="a pause after each call: an application that leaves the writer time (0: calls back to back)")
    parser.add_argument("--runs", type=int, default=1, help="runs of each case, the checkouts taking turns: medians printed")
    parser.add_argument("--smoke", action="store_true", help="20 calls: checks that it runs, measures nothing")
    args = parser.parse_args()
    if args.smoke:
        args.calls = 20
    value = args.value_kib << 10
    sent_mib = args.calls * value / (1 << 20)
    print(f"{args.calls} calls, one tool result of {args.value_kib} KiB each ({sent_mib:.0f} MiB of values); 3 events a call; "
          f"{args.gap_ms:g} ms after each call")
    print(f"{'checkout writer':16} {'values':>7} {'app peak-before MiB':>20} {'x baseline':>10} {'writer proc peak MiB':>21} "
          f"{'MiB/s written':>13} {'MiB/writer CPU s':>16} {'written':>8} {'dropped':>8}")
    checkouts = [("this", ROOT)] + ([("against", args.against.resolve())] if args.against else [])
    if args.smoke:
        args.runs = 1
    for mode in args.modes:
        runs: dict[str, list[tuple[dict[str, float], dict[str, float]]]] = {label: [] for label, _ in checkouts}
        for _ in range(max(1, args.runs)):  # the checkouts take turns: a change of load falls on each
            for label, root in checkouts:
                runs[label].append((run(mode, args.calls, 1 << 10, root, args.gap_ms / 1000),
                                    run(mode, args.calls, value, root, args.gap_ms / 1000)))
        for label, _ in checkouts:
            base, big = _medians([r[0] for r in runs[label]]), _medians([r[1] for r in runs[label]])
            base_growth = max(1, base["growth_kb"]) / 1024
            for name, result, size in (("1 KiB", base, 1 << 10), (f"{args.value_kib} KiB", big, value)):
                growth = result["growth_kb"] / 1024
                rate = result["rate"] * size / (1 << 20)  # 3 events a call
                cpu_rate = result["cpu_rate"] * size / (1 << 20)
                print(f"{label + ' ' + mode:16} {name:>7} {growth:20.0f} {growth / base_growth:10.1f} "
                      f"{result['child_peak_kb'] / 1024:21.0f} {rate:13.1f} {cpu_rate:16.1f} {result['written']:8.0f} {result['dropped']:8.0f}")


if __name__ == "__main__":
    main()
