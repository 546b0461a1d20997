"""Run the test suite, or part of it, across its stacks (tests/stacks.toml); ./scripts/test.sh
calls it with the core venv's Python after making that venv.

    ./scripts/test.sh                               # everything: the core venv, then every stack
    ./scripts/test.sh tests/cli -x                  # the core venv alone: no stack is built
    ./scripts/test.sh tests/instrument/test_mcp.py  # builds the mcp stack and runs the file there
    ./scripts/test.sh --stack oldsdk                # one stack's tests (an `again` stack included)

Arguments that name existing paths (``path`` or ``path::test``) select tests; every other argument
goes to pytest as it is. For each venv the tests run twice: in parallel on pytest-xdist workers
(``-n``: $LOOPSCOPE_TEST_WORKERS, else 4), then the tests marked ``serial``, one at a time, with
nothing beside them. The last line sums every run's outcome, whatever pytest's own verbosity;
before it, where the time went: per venv, and the slowest test files in worker-seconds. Each
run's junit file is kept in $LOOPSCOPE_TEST_JUNIT (a folder) when it is set.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import stacks

CORE = "core"
OUTCOMES = ("passed", "failed", "errors", "skipped")


def say(message: str) -> None:
    print(f"loopscope tests: {message}", file=sys.stderr, flush=True)


@dataclass
class Run:
    """One pytest run: a venv, the paths it selects, what it leaves out."""

    stack: str
    python: Path
    paths: list[str]
    ignore: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Tally:
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    failed_runs: list[str] = field(default_factory=list)
    times: list[tuple[str, float]] = field(default_factory=list)
    file_seconds: dict[str, float] = field(default_factory=dict)  # worker-seconds per test file, every run's

    def add_junit(self, xml: Path) -> None:
        if not xml.exists():
            return
        root = ET.parse(xml).getroot()
        for case in root.iter("testcase"):  # classname: tests.cli.test_x, or tests.cli.test_x.TestClass
            parts = case.get("classname", "").split(".")
            while len(parts) > 1 and not parts[-1].startswith("test_"):
                parts.pop()
            name = "/".join(parts) + ".py"
            self.file_seconds[name] = self.file_seconds.get(name, 0.0) + float(case.get("time", 0) or 0)
        for suite in root.iter("testsuite"):
            tests, failures, errors, skipped = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
            self.counts["failed"] += failures
            self.counts["errors"] += errors
            self.counts["skipped"] += skipped
            self.counts["passed"] += tests - failures - errors - skipped

    def slowest(self, count: int = 12) -> str:
        ranked = sorted(self.file_seconds.items(), key=lambda item: -item[1])[:count]
        return ", ".join(f"{name} {seconds:.0f}s" for name, seconds in ranked)

    def line(self, seconds: float) -> str:
        said = ", ".join(f"{n} {k}" for k, n in self.counts.items() if n or k == "passed")
        runs = f"; failing runs: {', '.join(self.failed_runs)}" if self.failed_runs else ""
        return f"{said} in {seconds:.0f}s{runs}"


def split_arguments(argv: list[str]) -> tuple[list[str], list[str]]:
    """(test paths, other pytest arguments). A path is an argument naming something that exists."""
    paths, rest = [], []
    after_value_option = False
    for arg in argv:
        if not after_value_option and not arg.startswith("-") and (ROOT / arg.split("::", 1)[0]).exists():
            paths.append(arg)
        else:
            rest.append(arg)
        # an option whose value follows it (`-k expr`, `-m expr`, ...): that value is no path
        after_value_option = arg in {"-k", "-m", "-p", "-n", "-c", "-o", "--maxfail", "--deselect", "--ignore", "--rootdir",
                                     "--basetemp", "--durations", "--junitxml", "--tb", "-W", "--log-level", "--dist"}
    return paths, rest


def plan(paths: list[str], named: list[str], all_stacks: dict[str, stacks.Stack]) -> tuple[list[Run], set[str]]:
    """The pytest runs a selection needs, and the stacks that must be built for them."""
    full = not paths and not named
    selected = paths or ["tests"]
    runs: list[Run] = []
    needed: set[str] = set()
    if not named or CORE in named:
        # the core run: the selection, less every test file a stack runs instead
        core_paths = [p for p in selected if not stacks.owned(p, all_stacks)]
        ignore = sorted({r for s in all_stacks.values() if not s.again for r in s.runs
                         if any(stacks.overlaps(p, r) for p in core_paths)})
        if core_paths:
            runs.append(Run(CORE, Path(sys.executable), core_paths, ignore))
            needed |= {s.name for s in all_stacks.values() if any(stacks.overlaps(p, d) for p in core_paths for d in s.drives)}
    for stack in all_stacks.values():
        if not stack.runs or (named and stack.name not in named) or (stack.again and not (full or stack.name in named)):
            continue
        chosen = sorted({narrower(p, r) for r in stack.runs for p in selected if stacks.overlaps(p, r)})
        if chosen:
            runs.append(Run(stack.name, stack.executable, chosen, env={**stack.env, "LOOPSCOPE_STACK": stack.name}))
            needed.add(stack.name)
    return runs, needed


def narrower(selected: str, path: str) -> str:
    """Of a selected path and a manifest path that overlap, the one inside the other."""
    return selected if stacks.inside(selected, path) else path


SERIAL = re.compile(r"^\s*(@pytest\.mark\.serial\b|pytestmark\b.*\bmark\.serial\b)", re.MULTILINE)


def serial_paths(paths: list[str]) -> list[str]:
    """Of ``paths``, what holds tests marked ``serial``: a folder gives its files that mark one (read
    as text, no collection), a file or a test is kept if its file does. Empty: no serial pass."""
    found = []
    for path in paths:
        top = ROOT / path.split("::", 1)[0]
        files = [top] if top.is_file() else sorted(top.rglob("test_*.py"))
        marked = [f for f in files if SERIAL.search(f.read_text(errors="replace"))]
        found += [path] if top.is_file() and marked else [str(f.relative_to(ROOT)) for f in marked if not top.is_file()]
    return found


def _workers_option(arg: str) -> bool:
    """Whether ``arg`` is pytest-xdist's worker count (``-n 2``, ``-n2``, ``--numprocesses=2``)."""
    return arg in ("-n", "--numprocesses") or arg.startswith(("-n", "--numprocesses="))


def pytest_passes(run: Run, extra: list[str], workers: str, xml_dir: Path) -> list[tuple[str, list[str], list[str], Path]]:
    """The parallel pass and, where a test is marked serial, the serial pass of one run:
    (which, its paths, command, its junit file)."""
    user_marks = [extra[i + 1] for i, a in enumerate(extra[:-1]) if a == "-m"]
    rest = [a for i, a in enumerate(extra) if a != "-m" and (i == 0 or extra[i - 1] != "-m")]
    both = f"({user_marks[-1]}) and " if user_marks else ""
    passes = []
    for name, marks, paths in (("parallel", f"{both}not serial", run.paths), ("serial", f"{both}serial", serial_paths(run.paths))):
        if not paths:
            continue
        xml = xml_dir / f"{run.stack}-{name}.xml"
        if name == "parallel":
            spread = [] if any(map(_workers_option, rest)) else ["-n", workers] if workers != "0" else ["-p", "no:xdist"]
        else:  # one at a time: a worker count given to pytest is for the parallel pass
            spread = ["-p", "no:xdist"]
            rest = [a for i, a in enumerate(rest) if not (_workers_option(a) or (i and rest[i - 1] in ("-n", "--numprocesses")))]
        cmd = [str(run.python), "-m", "pytest", *paths, *(f"--ignore={i}" for i in run.ignore), "-p", "no:cacheprovider",
               "-m", marks, f"--junitxml={xml}", *spread, *rest]
        passes.append((name, paths, cmd, xml))
    return passes


LOCK_WAIT = 600.0  # seconds a package install waits for another process's apt/dpkg lock


def install_system(package: stacks.SystemPackage, in_ci: bool) -> str | None:
    """Install a Debian package the selected tests need, if it is missing; None when it is there,
    else why not. Another process holding the package manager's lock is waited for, up to
    LOCK_WAIT seconds, instead of failing at once."""
    if Path(package.binary).exists():
        return None
    if os.geteuid() == 0:
        sudo: list[str] = []
    elif in_ci and shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"], capture_output=True, check=False).returncode == 0:
        sudo = ["sudo", "-n"]
    else:
        return f"no {package.binary}, and installing it needs root: sudo apt-get install {package.package}"
    if not shutil.which("apt-get"):
        return f"no {package.binary}, and no apt-get to install it"
    say(f"installing Debian's {package.package} (apt-get install {package.package}) for {', '.join(package.tests)}")
    deadline = time.monotonic() + LOCK_WAIT
    for step in (["update", "-q"], ["install", "-y", "-q", package.package]):
        while True:
            done = subprocess.run([*sudo, "env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-o", "DPkg::Lock::Timeout=60", *step],
                                  capture_output=True, text=True, check=False)
            if done.returncode == 0:
                break
            said = done.stdout + done.stderr
            if "Could not get lock" in said and time.monotonic() < deadline:
                held = next((ln for ln in said.splitlines() if "Could not get lock" in ln), "")
                say(f"waiting for the package manager's lock ({held.strip()})")
                time.sleep(5)
                continue
            return f"apt-get {step[0]} failed ({done.returncode}):\n  " + "\n  ".join(said.splitlines()[-15:])
    return None if Path(package.binary).exists() else f"apt-get installed {package.package}, but there is no {package.binary}"


def build_order(runs: list[Run], needed: set[str], all_stacks: dict[str, stacks.Stack]) -> tuple[list[str], list[str]]:
    """The stacks to build before any test runs (those the core run's tests drive: they start
    those venvs' programs), and those built beside the core run, each waited for before its own
    run (and all of them before a serial pass)."""
    core_paths = [p for run in runs if run.stack == CORE for p in run.paths]
    first = sorted(n for n in needed if any(stacks.overlaps(p, d) for p in core_paths for d in all_stacks[n].drives))
    return first, sorted(needed - set(first))


def build_or_why(stack: stacks.Stack) -> str | None:
    """Build a stack if it is missing or stale; None when it is ready, else why not."""
    try:
        stacks.build(stack, say=say)
    except stacks.BuildError as e:
        return str(e)
    return None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--stack", action="append", default=[])
    own, argv = parser.parse_known_args(argv)
    all_stacks = stacks.load()
    unknown = [n for n in own.stack if n != CORE and n not in all_stacks]
    if unknown:
        say(f"no stack named {', '.join(unknown)} (tests/stacks.toml has: core, {', '.join(all_stacks)})")
        return 4
    paths, extra = split_arguments(argv)
    runs, needed = plan(paths, own.stack, all_stacks)
    in_ci = os.environ.get("CI") in ("true", "1")
    started = time.monotonic()
    tally = Tally()
    unbuilt: dict[str, str] = {}
    first, later = build_order(runs, needed, all_stacks)
    # a few at once: uv downloads in parallel anyway, and compiling bytecode takes a core
    builder = ThreadPoolExecutor(max_workers=3)
    for name, error in zip(first, builder.map(lambda n: build_or_why(all_stacks[n]), first)):
        if error is not None:
            unbuilt[name] = error
            say(f"stack {name} could not be built: {error}")
    if unbuilt and in_ci:
        say("CI needs every stack it runs: stopping")
        builder.shutdown(cancel_futures=True)
        return 1
    # the stacks no core test drives are built while the core's parallel pass runs (their
    # downloads wait on the network, not on the cores); each stack's run waits for its own
    building = {name: builder.submit(build_or_why, all_stacks[name]) for name in later}
    core_paths = [p for run in runs if run.stack == CORE for p in run.paths]
    for package in stacks.load_system().values():
        if any(stacks.overlaps(p, t) for p in core_paths for t in package.tests):
            why = install_system(package, in_ci)
            if why is not None:
                say(f"{why}: the tests that need it will {'fail (CI)' if in_ci else 'be skipped'}")
    tally.times.append(("set-up", time.monotonic() - started))
    workers = os.environ.get("LOOPSCOPE_TEST_WORKERS", "4")
    keep_junit = Path(os.environ["LOOPSCOPE_TEST_JUNIT"]) if os.environ.get("LOOPSCOPE_TEST_JUNIT") else None
    stop_at_first = any(a in ("-x", "--exitfirst") for a in extra)
    status = 0
    # bytecode caches written (a machine may turn them off): pytest's rewritten test modules and
    # loopscope's own are then compiled once, not in every worker and child interpreter
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    env = {**os.environ, "LOOPSCOPE_REQUIRE_STACKS": "1" if in_ci else os.environ.get("LOOPSCOPE_REQUIRE_STACKS", "0")}

    def built(names: list[str], label: str) -> None:
        """Wait for these stacks' builds (started beside the core run); note those that failed,
        and the wait, when there was one, in the times (as ``label``)."""
        waited = time.monotonic()
        for name in names:
            future = building.pop(name, None)
            error = future.result() if future is not None else None
            if error is not None:
                unbuilt[name] = error
                say(f"stack {name} could not be built: {error}")
        if time.monotonic() - waited > 1:
            tally.times.append((label, time.monotonic() - waited))

    def runnable(run: Run) -> bool:
        """Whether ``run``'s stack is built (waited for); one that could not be is said, and a
        failure unless the stack is not for this Python."""
        nonlocal status
        built([run.stack], f"{run.stack} build")
        if run.stack not in unbuilt:
            return True
        if stacks.too_old(all_stacks[run.stack]) is not None:  # not for this Python: CI (3.12) runs it
            say(f"{run.stack}: not run ({' '.join(run.paths)}): {unbuilt[run.stack]}")
        else:
            say(f"{run.stack}: not run ({' '.join(run.paths)}): its stack could not be built")
            tally.failed_runs.append(run.stack)
            status = status or 1
        return False

    def one_pass(run: Run, cmd: list[str], output: Path | None = None) -> tuple[int, float]:
        """Run one pytest pass, its output to the terminal or to ``output``: (exit code, seconds)."""
        began = time.monotonic()
        if output is None:
            code = subprocess.run(cmd, cwd=ROOT, env={**env, **run.env}, check=False).returncode
        else:
            with output.open("w") as out:
                code = subprocess.run(cmd, cwd=ROOT, env={**env, **run.env}, check=False, stdout=out,
                                      stderr=subprocess.STDOUT).returncode
        return code, time.monotonic() - began

    def passed(run: Run, kind: str, xml: Path, code: int, seconds: float) -> bool:
        """Count a finished pass; True when the suite stops there (``-x`` and a failure)."""
        nonlocal status
        tally.times.append((run.stack if kind == "parallel" else f"{run.stack} serial", seconds))
        tally.add_junit(xml)
        if keep_junit:
            keep_junit.mkdir(parents=True, exist_ok=True)
            if xml.exists():
                shutil.copy(xml, keep_junit / xml.name)
        if code in (0, 5):  # 5: nothing selected (no serial test in these paths, say)
            return False
        tally.failed_runs.append(f"{run.stack} {kind}")
        status = status or code
        return stop_at_first  # -x: the first failing run is the last

    with tempfile.TemporaryDirectory(prefix="loopscope-tests-") as tmp:
        # the core run first (its serial pass alone), then the stacks' runs: one after another, or
        # several at once ($LOOPSCOPE_TEST_STACKS_AT_ONCE: each run's start-up and tail leave the
        # cores idle, but on a quiet machine it gained nothing: docs/testing.md), then their serial passes alone
        at_once = max(1, int(os.environ.get("LOOPSCOPE_TEST_STACKS_AT_ONCE", "1")))
        stack_runs = [r for r in runs if r.stack != CORE]
        together = stack_runs if at_once > 1 and len(stack_runs) > 1 else []
        stopped = False
        for run in runs:
            if run in together or stopped or not runnable(run):
                continue
            for kind, paths, cmd, xml in pytest_passes(run, extra, workers, Path(tmp)):
                if kind == "serial":  # serial tests run with nothing beside them: no build either
                    built(list(building), "builds left")
                say(f"{run.stack} ({kind}): {' '.join(paths)}")
                if stopped := passed(run, kind, xml, *one_pass(run, cmd)):
                    break
        if together and not stopped:
            # each stack's passes: {stack: {"parallel" or "serial": (paths, command, junit file)}}
            planned = {r.stack: {kind: (paths, cmd, xml) for kind, paths, cmd, xml in pytest_passes(r, extra, workers, Path(tmp))}
                       for r in together}

            def in_background(run: Run) -> tuple[int, float] | None:
                """A stack's parallel pass, its output to a file, once its stack is built (None:
                it could not be, or it has no parallel pass)."""
                future = building.get(run.stack)
                if (future is not None and future.result() is not None) or "parallel" not in planned[run.stack]:
                    return None
                return one_pass(run, planned[run.stack]["parallel"][1], Path(tmp) / f"{run.stack}.out")

            say(f"the stacks' runs, {at_once} at once (each one's output once it ends): {', '.join(r.stack for r in together)}")
            with ThreadPoolExecutor(max_workers=at_once) as pool:
                futures = {pool.submit(in_background, r): r for r in together}
                for future in as_completed(futures):
                    run = futures[future]
                    if future.cancelled() or not runnable(run) or (result := future.result()) is None:
                        continue
                    paths, _, xml = planned[run.stack]["parallel"]
                    say(f"{run.stack} (parallel): {' '.join(paths)}")
                    sys.stdout.write((Path(tmp) / f"{run.stack}.out").read_text(errors="replace"))
                    sys.stdout.flush()
                    if stopped := passed(run, "parallel", xml, *result):
                        for other in futures:
                            other.cancel()
                        break
            for run in together:  # then their serial passes, one at a time
                if stopped or run.stack in unbuilt or "serial" not in planned[run.stack]:
                    continue
                paths, cmd, xml = planned[run.stack]["serial"]
                built(list(building), "builds left")
                say(f"{run.stack} (serial): {' '.join(paths)}")
                stopped = passed(run, "serial", xml, *one_pass(run, cmd))
    builder.shutdown(cancel_futures=True)  # -x: builds not started are not needed
    # where the time went (docs/testing.md: the budget), then the one summary line
    say("times: " + ", ".join(f"{label} {seconds:.0f}s" for label, seconds in tally.times))
    if tally.file_seconds:  # the test files that took longest, in worker-seconds (junit's times summed)
        say("slowest files: " + tally.slowest())
    print(f"loopscope tests: {tally.line(time.monotonic() - started)}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
