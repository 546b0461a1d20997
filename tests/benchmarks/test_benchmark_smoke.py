"""Every benchmark script runs in its smoke mode (tiny sizes), so
that one that no longer runs fails the suite. They measure nothing here: timings are the
benchmarks' own business, printed as ratios when run for real."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import stacks

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"

SMOKE_RUNS = {
    "conversations": ["bench_conversations.py", "--smoke"],
    "history": ["bench_history.py", "--smoke"],
    "faults": ["bench_faults.py", "--smoke"],
    "memory": ["bench_memory.py", "--smoke"],
    "big-values": ["bench_big_values.py", "--smoke"],
    "value-layout": ["bench_value_layout.py", "--smoke"],
    "row-groups": ["bench_row_groups.py", "--smoke"],
    "ingest": ["bench_ingest.py", "--turns", "100", "--repeats", "1"],
    "collector-throughput": ["bench_collector.py", "--turns", "40", "--repeats", "1", "--senders", "1"],
    "collector-foreign": ["bench_collector.py", "--foreign", "--turns", "40", "--repeats", "1", "--senders", "1"],
    "collector-memory": ["bench_collector.py", "--memory", "--requests", "3", "--request-mb", "1"],
    "collect-load": ["bench_collect_load.py", "--smoke"],
    "batch-cost": ["batch_cost.py", "--smoke"],
    # --against: this very checkout as the other one, so that path runs too
    "views": ["bench_views.py", "--smoke", "--against", str(Path(__file__).resolve().parents[2])],
    "startup": ["bench_startup.py", "--smoke"],
    "stream-chunks": ["bench_stream_chunks.py", "--smoke", "--against", str(Path(__file__).resolve().parents[2])],
    # the scripts with size arguments only: their smallest sizes are their smoke mode
    "tool-call": ["bench_tool_call.py", "--calls", "200", "--repeats", "1"],
    "openai-overhead": ["bench_openai_overhead.py", "--no-setup", "--variants", "loopscope", "loopscope-metrics", "loopscope-process", "otel-genai-openai", "otel-genai-openai-otlp",
                        "loopscope-otlp",
                        "--rounds", "1", "--block", "8", "--inproc-block", "8", "--warmup", "4",
                        # --against: this very checkout as the "older" one, so that path runs too
                        "--against", str(Path(__file__).resolve().parents[2])],
    # the peers' stacks (peers-litellm, peers-gemini) are built before this test runs (their `drives`)
    "provider-overhead": ["bench_provider_overhead.py", "--smoke", "--no-setup"],
    # issue 31's per-part export CPU (the peers stack is built before this test runs: its `drives`)
    "export-cpu": ["bench_export_cpu.py", "--smoke", "--no-setup"],
    # issue 34: chDB beside DuckDB (the clickhouse stack is built before this test runs: its `drives`)
    "clickhouse": ["bench_clickhouse.py", "--smoke", "--no-setup"],
    "stub-openai-cpu": ["stub_openai_cpu.py", "--store", "--blocks", "2", "--calls", "10"],
    "wrapper-own-time": ["wrapper_own_time.py", "--calls", "40"],
    "writer-cpu": ["writer_cpu.py", "--calls", "40", "--rounds", "1"],
    # issue 32: LiteLLM's streamed rounds; in the peers-litellm stack's interpreter (IN_STACK)
    "litellm-stream-wait": ["bench_litellm_stream_wait.py", "--smoke"],
    "litellm-call-counts": ["litellm_call_counts.py", "--smoke"],
}
IN_STACK = {"litellm-stream-wait": "peers-litellm", "litellm-call-counts": "peers-litellm"}
"""The runs whose script imports a library of a stack (run with that stack's Python; built
before this test runs: the stack's ``drives``), not the core venv's."""


@pytest.mark.parametrize("name", sorted(SMOKE_RUNS))
def test_benchmark_runs_in_smoke_mode(name: str) -> None:
    script, *args = SMOKE_RUNS[name]
    env = {k: v for k, v in os.environ.items() if k != "LOOPSCOPE_STRICT"}
    python = str(stacks.require(IN_STACK[name]) / "bin" / "python") if name in IN_STACK else sys.executable
    done = subprocess.run(
        [python, str(BENCHMARKS / script), *args], check=False, capture_output=True, text=True, timeout=300, env=env,
        cwd=BENCHMARKS.parent,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert done.stdout.strip(), "the benchmark printed nothing"
    if name == "openai-overhead" and "not measured: otel-genai-openai" not in done.stdout:
        # issue 31: the export's cost, as a ratio to the SDK's OTLP exporter's, with its goal
        assert "loopscope export CPU / genai-openai OTLP exporter CPU (goal <= 2x" in done.stdout, done.stdout[-3000:]
    if name == "export-cpu" and "not measured" not in done.stdout:
        # issue 31: each scenario's ratio, loopscope's export CPU to genai-openai's exporter's, with its goal
        assert done.stdout.count("export CPU ratio (goal <= 2x") == 4 and "spans+notices+metrics / spans+metrics" in done.stdout, \
            done.stdout[-3000:]
    if name == "clickhouse":
        # issue 34: the reads side by side as ratios, and the insert rate with the views on and off
        assert "views on / off rate:" in done.stdout and done.stdout.count("x  50, 50") >= 2, done.stdout[-3000:]
    if name == "provider-overhead":
        # issue 32: each SDK's verdict against OpenInference (or why there is none)
        assert "goal (issue 32" in done.stdout and "  litellm " in done.stdout and "  google-genai " in done.stdout, done.stdout[-3000:]


def test_every_benchmark_script_has_a_smoke_run() -> None:
    # a script added to benchmarks/ without an entry above would rot unseen (issue 19)
    scripts = {p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_")}
    assert scripts == {script for script, *_ in SMOKE_RUNS.values()}
