"""The benchmarks named by an issue's acceptance run in their smoke mode (tiny sizes), so
that one that no longer runs fails the suite. They measure nothing here: timings are the
benchmarks' own business, printed as ratios when run for real."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

SMOKE_RUNS = {
    "conversations": ["bench_conversations.py", "--smoke"],
    "faults": ["bench_faults.py", "--smoke"],
    "memory": ["bench_memory.py", "--smoke"],
    "ingest": ["bench_ingest.py", "--turns", "100", "--repeats", "1"],
    "collector-throughput": ["bench_collector.py", "--turns", "40", "--repeats", "1", "--senders", "1"],
    "collector-foreign": ["bench_collector.py", "--foreign", "--turns", "40", "--repeats", "1", "--senders", "1"],
    "collector-memory": ["bench_collector.py", "--memory", "--requests", "3", "--request-mb", "1"],
    "batch-cost": ["batch_cost.py", "--smoke"],
    "views": ["bench_views.py", "--smoke"],
    "startup": ["bench_startup.py", "--smoke"],
}


@pytest.mark.parametrize("name", sorted(SMOKE_RUNS))
def test_benchmark_runs_in_smoke_mode(name: str) -> None:
    script, *args = SMOKE_RUNS[name]
    env = {k: v for k, v in os.environ.items() if k != "LOOPSCOPE_STRICT"}
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args], check=False, capture_output=True, text=True, timeout=300, env=env,
        cwd=BENCHMARKS.parent,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert done.stdout.strip(), "the benchmark printed nothing"
