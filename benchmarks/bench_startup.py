"""Start-up: what loopscope costs before it records anything (issue 19, goal 2).

Every command runs in a fresh Python process, as often as ``--repeats`` says, the commands
of one repeat interleaved so that a baseline and what is compared with it share the
machine's noise. For each: the median wall time of the whole process (spawn to exit) and
the median CPU the child spent, all threads, user + system (``RUSAGE_CHILDREN``).

* ``python -c pass``                  -- the interpreter alone: the CLI's baseline;
* ``import opentelemetry.sdk.trace``  -- the OTel SDK's tracer: ``import loopscope``'s baseline;
* ``import loopscope``;
* ``loopscope --help``;
* ``loopscope turns``                 -- on a small store (``loopscope demo`` made it, untimed);
* ``import duckdb`` and ``duckdb engine``  -- for reference, what DuckDB alone costs a command that
  reads: the ``duckdb`` package, and its compiled engine alone (``import _duckdb`` and an
  in-memory database started, as ``loopscope turns`` reads through ``storage/duckdb/engine.py``);
* ``first line: ...``                 -- an application's first line, timed inside its process
  (its imports included, the interpreter's start and exit not): a minimal OpenTelemetry SDK
  setup (a ``TracerProvider`` set), ``import loopscope; loopscope.instrument()`` and
  ``import loopscope; loopscope.configure(db)``, which does not wait for the writer process;
* ``instrument()``                    -- in a process that imported every supported library
  (``openai``, ``anthropic``, ``roomkit``, ``agents``, ``toolnexus``, ``pydantic_ai``,
  ``langchain_core``, ``mcp``: each package as an application imports it) and
  ``loopscope``, untimed; the call alone is timed inside the child (wall, and the
  process's CPU over the call), twice: ``cold``, the first thing loopscope does (so it
  configures the default pipeline: the OTel SDK, the store's file), and ``adapters``,
  after ``loopscope.configure()`` (the adapters' own share).

Goals: ``import loopscope`` <= 2x ``import opentelemetry.sdk.trace``; ``configure(db)`` as a
first line <= 1.1x ``instrument()``'s (both also against the OTel SDK's setup); ``instrument()``
under 20 ms; ``loopscope --help`` <= 3x ``python -c pass``; ``loopscope turns`` <= 6x.
Ratios are of the medians' wall times (CPU ratios beside them).

``--against DIR`` runs every command also against another checkout's ``loopscope``
package (a folder holding ``loopscope/``, e.g. ``git archive`` of an older commit),
interleaved with this one, and prints both.

    .venv/bin/python benchmarks/bench_startup.py [--repeats N] [--against DIR] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARIES = ["openai", "anthropic", "roomkit", "agents", "toolnexus", "pydantic_ai", "langchain_core", "mcp"]

CLI = "import sys; from loopscope.cli import main; sys.argv[0] = 'loopscope'; raise SystemExit(main(sys.argv[1:]))"

# DuckDB's compiled engine without the package's Python layer, a database started (the
# package itself on a release without the engine as a module of its own)
ENGINE = (
    "try:\n    import _duckdb as duckdb\nexcept ImportError:\n    import duckdb\n"
    "duckdb.connect(':memory:').execute('SELECT 1').fetchall()"
)

INSTRUMENT = """
import importlib, json, sys, time
import loopscope
for name in {libraries!r}:
    try:
        importlib.import_module(name)
    except ImportError:
        pass
if {configure!r}:
    loopscope.configure()
wall, cpu = time.perf_counter(), time.process_time()
loopscope.instrument()
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
print(json.dumps({{"wall": wall, "cpu": cpu}}))
"""


FIRST_LINE = """
import json, sys, time
wall, cpu = time.perf_counter(), time.process_time()
{code}
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
print(json.dumps({{"wall": wall, "cpu": cpu}}))
"""
"""An application's first line, timed inside its process from before its imports to its return
(the interpreter's own start and exit left out: the same for all)."""
OTEL_SETUP = (
    "from opentelemetry import trace\nfrom opentelemetry.sdk.trace import TracerProvider\n"
    "trace.set_tracer_provider(TracerProvider())"
)


@dataclass
class Command:
    name: str
    args: list[str]
    inner: bool = False
    """The child prints its own timing (JSON ``wall``, ``cpu`` in seconds) of one call."""
    needs_root: bool = True
    """Runs loopscope (from a checkout); baselines do not."""


@dataclass
class Samples:
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    def median(self) -> tuple[float, float]:
        return statistics.median(self.wall) * 1000, statistics.median(self.cpu) * 1000


def commands(store: Path, libraries: list[str]) -> list[Command]:
    py = sys.executable
    return [
        Command("python -c pass", [py, "-c", "pass"], needs_root=False),
        Command("import opentelemetry.sdk.trace", [py, "-c", "import opentelemetry.sdk.trace"], needs_root=False),
        Command("import loopscope", [py, "-c", "import loopscope"]),
        Command("loopscope --help", [py, "-c", CLI, "--help"]),
        Command("loopscope turns", [py, "-c", CLI, "--db", str(store), "turns"]),
        Command("import duckdb", [py, "-c", "import duckdb"], needs_root=False),
        Command("duckdb engine", [py, "-c", ENGINE], needs_root=False),
        Command("instrument() cold", [py, "-c", INSTRUMENT.format(libraries=libraries, configure=False)], inner=True),
        Command("instrument() adapters", [py, "-c", INSTRUMENT.format(libraries=libraries, configure=True)], inner=True),
        # the first line of each way in (issue 29: configure(db) waited ~680 ms for the writer process)
        Command("first line: OTel SDK setup", [py, "-c", FIRST_LINE.format(code=OTEL_SETUP)], inner=True, needs_root=False),
        Command("first line: instrument()", [py, "-c", FIRST_LINE.format(code="import loopscope\nloopscope.instrument()")],
                inner=True),
        Command("first line: configure(db)", [py, "-c", FIRST_LINE.format(
            code="import loopscope\nloopscope.configure(sys.argv[1])"), str(store.with_name("first-line.duckdb"))], inner=True),
    ]


def run_once(command: Command, root: Path | None, env: dict[str, str], cwd: Path) -> tuple[float, float]:
    child_env = dict(env)
    if root is not None:
        child_env["PYTHONPATH"] = str(root)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command.args, env=child_env, cwd=cwd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{command.name} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if command.inner:
        inner = json.loads(done.stdout.strip().splitlines()[-1])
        return inner["wall"], inner["cpu"]
    return wall, cpu


def make_store(root: Path, path: Path, env: dict[str, str], cwd: Path) -> None:
    demo = Command("demo", [sys.executable, "-c", CLI, "--db", str(path), "demo"])
    run_once(demo, root, env, cwd)


GOALS = [
    # (what, against, at most (x), or None: an absolute bound in ms)
    ("import loopscope", "import opentelemetry.sdk.trace", 2.0),
    # the hand API's first line costs what the one-liner's does (1.1: the machine's noise)
    ("first line: configure(db)", "first line: instrument()", 1.1),
    ("loopscope --help", "python -c pass", 3.0),
    ("loopscope turns", "python -c pass", 6.0),
]
ABSOLUTE_MS = {"instrument() cold": 20.0, "instrument() adapters": 20.0}


def report(results: dict[tuple[str, str], Samples], roots: list[tuple[str, Path]], names: list[str]) -> None:
    labels = [label for label, _ in roots]
    width = max(len(n) for n in names) + 2
    head = "".join(f"{label + ' wall':>14}{label + ' cpu':>13}" for label in labels)
    print(f"{'command':<{width}}{head}   (median ms)")
    for name in names:
        cells = ""
        for label in labels:
            key = (label, name) if (label, name) in results else ("-", name)
            wall, cpu = results[key].median()
            cells += f"{wall:14.1f}{cpu:13.1f}"
        print(f"{name:<{width}}{cells}")
    print()
    for label in labels:
        def median(name: str, lab: str = label) -> tuple[float, float]:
            key = (lab, name) if (lab, name) in results else ("-", name)
            return results[key].median()

        for what, against, goal in GOALS:
            (w, c), (bw, bc) = median(what), median(against)
            verdict = "met" if w / bw <= goal else "NOT met"
            print(f"[{label}] {what}: {w / bw:.2f}x {against} (CPU {c / bc:.2f}x); goal <= {goal:g}x: {verdict}")
        for what in ("import duckdb", "duckdb engine"):  # what DuckDB alone takes of a reading command
            (w, c), (bw, bc) = median(what), median("python -c pass")
            print(f"[{label}] (ref) {what}: {w / bw:.2f}x python -c pass (CPU {c / bc:.2f}x)")
        for what in ("first line: instrument()", "first line: configure(db)"):  # against a plain OTel set-up
            (w, c), (bw, bc) = median(what), median("first line: OTel SDK setup")
            print(f"[{label}] (ref) {what}: {w:.1f} ms, {w / bw:.2f}x the OTel SDK's setup (CPU {c / bc:.2f}x)")
        for what, bound in ABSOLUTE_MS.items():
            w, c = median(what)
            verdict = "met" if w <= bound else "NOT met"
            print(f"[{label}] {what}: {w:.1f} ms (CPU {c:.1f} ms); goal < {bound:g} ms: {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15, help="fresh processes per command (default 15)")
    parser.add_argument("--against", type=Path, help="another checkout's folder holding loopscope/, run side by side")
    parser.add_argument("--smoke", action="store_true", help="one run each, one library: proves it runs, measures nothing")
    args = parser.parse_args()
    repeats = 1 if args.smoke else args.repeats
    libraries = ["mcp"] if args.smoke else LIBRARIES
    roots = [("new", ROOT)]
    if args.against is not None:
        roots = [("old", args.against.resolve()), ("new", ROOT)]
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        work = Path(tmp)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LOOPSCOPE_", "OTEL_", "PYTHON"))}
        stores = {}
        for label, root in roots:
            stores[label] = work / f"{label}.duckdb"
            make_store(root, stores[label], env | {"LOOPSCOPE_DB": str(work / f"{label}-app.duckdb")}, work)
        plan: list[tuple[str, Path | None, Command, dict[str, str]]] = []
        names: list[str] = []
        for label, root in roots:
            child_env = env | {"LOOPSCOPE_DB": str(work / f"{label}-app.duckdb")}
            for command in commands(stores[label], libraries):
                if command.name not in names:
                    names.append(command.name)
                if not command.needs_root:
                    if label == roots[0][0]:
                        plan.append(("-", None, command, child_env))
                    continue
                plan.append((label, root, command, child_env))
        results: dict[tuple[str, str], Samples] = {}
        if not args.smoke:
            for label, root, command, child_env in plan:  # warm the file cache, untimed
                run_once(command, root, child_env, work)
        for _ in range(repeats):
            for label, root, command, child_env in plan:
                wall, cpu = run_once(command, root, child_env, work)
                samples = results.setdefault((label, command.name), Samples())
                samples.wall.append(wall)
                samples.cpu.append(cpu)
    load = os.getloadavg()[0]
    print(f"start-up: {repeats} fresh processes per command, interleaved; load average {load:.1f}; "
          f"Python {sys.version.split()[0]}; libraries: {', '.join(libraries)}")
    report(results, roots, names)


if __name__ == "__main__":
    main()
