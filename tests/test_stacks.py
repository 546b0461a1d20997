"""The suite's stacks (tests/stacks.toml) and the runner's plan (scripts/test.py): a selection of
tests builds only the stacks its tests need, and every test runs in exactly one venv."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest

import stacks

ROOT = Path(__file__).resolve().parents[1]


def _runner():
    spec = importlib.util.spec_from_file_location("loopscope_test_runner", ROOT / "scripts" / "test.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


runner = _runner()
ALL = stacks.load()


def planned(*paths: str, named: tuple[str, ...] = ()) -> tuple[dict[str, list[str]], set[str]]:
    runs, needed = runner.plan(list(paths), list(named), ALL)
    return {run.stack: run.paths for run in runs}, needed


def test_a_core_folder_builds_no_stack():
    runs, needed = planned("tests/cli")
    assert runs == {"core": ["tests/cli"]} and needed == set()


def test_one_framework_file_builds_its_stack_alone():
    runs, needed = planned("tests/instrument/test_roomkit.py")
    assert runs == {"roomkit": ["tests/instrument/test_roomkit.py"]} and needed == {"roomkit"}


def test_a_file_two_stacks_share_runs_in_both():
    runs, needed = planned("tests/instrument/test_mcp.py")
    assert runs == {"mcp": ["tests/instrument/test_mcp.py"], "langchain": ["tests/instrument/test_mcp.py"]}
    assert needed == {"mcp", "langchain"}


def test_a_file_that_drives_a_peer_builds_that_peer():
    runs, needed = planned("tests/ingest/test_agents_bridges.py")
    assert runs == {"core": ["tests/ingest/test_agents_bridges.py"]} and needed == {"agents-otel", "agents-oi", "openai-agents"}


def test_a_folder_with_framework_files_runs_them_in_their_stacks_and_the_rest_in_core():
    runs, needed = planned("tests/instrument")
    assert runs["core"] == ["tests/instrument"]
    assert runs["roomkit"] == sorted(ALL["roomkit"].runs) and "tests/instrument/test_roomkit.py" in runs["roomkit"]
    assert {"roomkit", "langchain", "mcp", "toolnexus", "openai-agents", "pydantic-ai"} <= needed
    assert "oldsdk" not in runs  # an `again` stack runs in the full suite only


def test_the_full_suite_runs_every_stack_and_builds_every_driven_peer():
    runs, needed = planned()
    assert set(runs) == {"core"} | {s.name for s in ALL.values() if s.runs}
    assert needed >= {s.name for s in ALL.values() if s.runs or s.drives}


def test_the_stacks_no_core_test_drives_are_built_beside_the_core_run():
    runs, needed = runner.plan([], [], ALL)
    first, later = runner.build_order(runs, needed, ALL)
    # built before any test: those whose programs core tests start (openai-agents is both)
    assert first == sorted(s.name for s in ALL.values() if s.drives)
    assert "openai-agents" in first and "peers" in first
    # the frameworks' own runs and the `again` stacks wait for their builds, not the core run
    assert later == sorted(needed - set(first)) and {"roomkit", "mcp", "oldsdk", "py310"} <= set(later)
    # a selection without a core run builds everything in the second group, each awaited by its run
    runs, needed = runner.plan(["tests/instrument/test_roomkit.py"], [], ALL)
    assert runner.build_order(runs, needed, ALL) == ([], ["roomkit"])


def test_a_named_again_stack_runs_alone():
    runs, needed = planned(named=("oldsdk",))
    assert set(runs) == {"oldsdk"} and needed == {"oldsdk"}


def test_a_test_inside_a_stack_file_is_run_as_given():
    node = "tests/instrument/test_roomkit.py::test_something"
    runs, _ = planned(node)
    assert runs == {"roomkit": [node]}


def test_arguments_that_name_paths_select_and_the_rest_go_to_pytest():
    paths, rest = runner.split_arguments(["tests/cli", "-x", "-k", "tests", "-q", "tests/test_lint.py::test_x"])
    assert paths == ["tests/cli", "tests/test_lint.py::test_x"]
    assert rest == ["-x", "-k", "tests", "-q"]


def test_the_oldest_sdk_stack_pins_the_lower_bound_of_the_sdk_requirement():
    with (ROOT / "pyproject.toml").open("rb") as f:
        deps = stacks.tomllib.load(f)["project"]["dependencies"]
    (lowest,) = [m.group(1) for d in deps if (m := re.fullmatch(r"opentelemetry-sdk>=([\d.]+)", d.replace(" ", "")))]
    pins = ALL["oldsdk"].requires
    for dist in ("opentelemetry-api", "opentelemetry-sdk", "opentelemetry-exporter-otlp"):
        assert f"{dist}=={lowest}.*" in pins, (dist, pins)


def test_every_path_a_stack_names_exists():
    for stack in ALL.values():
        for path in (*stack.runs, *stack.drives):
            assert (ROOT / path).exists(), f"{stack.name}: {path}"
    for package in stacks.load_system().values():
        for path in package.tests:
            assert (ROOT / path).exists(), f"{package.name}: {path}"


def test_a_stack_hash_changes_with_what_goes_in_it(tmp_path):
    base = ALL["mcp"]
    other = stacks.Stack(**{**base.__dict__, "requires": ("httpx",)})
    assert stacks.stack_hash(base) == stacks.stack_hash(base)
    assert stacks.stack_hash(other) != stacks.stack_hash(base)


def test_an_unknown_key_in_the_manifest_is_an_error(tmp_path):
    bad = tmp_path / "stacks.toml"
    bad.write_text('[stacks.x]\nrequire = ["a"]\n')
    with pytest.raises(ValueError, match="unknown keys"):
        stacks.load(bad)


def test_a_serial_pass_runs_only_where_a_test_is_marked_serial(tmp_path, monkeypatch):
    folder = tmp_path / "tests"
    folder.mkdir()
    (folder / "test_alone.py").write_text("import pytest\n\n@pytest.mark.serial\ndef test_x():\n    pass\n")
    (folder / "test_beside.py").write_text("def test_y():\n    pass\n")
    monkeypatch.setattr(runner, "ROOT", tmp_path)
    assert runner.serial_paths(["tests"]) == ["tests/test_alone.py"]
    assert runner.serial_paths(["tests/test_beside.py"]) == []
    run = runner.Run("core", Path(sys.executable), ["tests"])
    passes = runner.pytest_passes(run, ["-x", "-m", "slow"], "4", tmp_path)
    assert [(name, paths) for name, paths, _, _ in passes] == [("parallel", ["tests"]), ("serial", ["tests/test_alone.py"])]
    parallel, serial = (cmd for _, _, cmd, _ in passes)
    assert parallel[parallel.index("-m", 3) + 1] == "(slow) and not serial" and parallel[parallel.index("-n") + 1] == "4"
    assert serial[serial.index("-m", 3) + 1] == "(slow) and serial" and "no:xdist" in serial and "-x" in serial


def _fake_apt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, locked_tries: int) -> tuple[Path, Path]:
    """An apt-get on PATH that says another process holds the lock ``locked_tries`` times, then
    installs: it creates the package's binary. Returns (the binary, the log of its calls)."""
    bin_dir, binary, log, tries = tmp_path / "bin", tmp_path / "chromium", tmp_path / "apt.log", tmp_path / "tries"
    bin_dir.mkdir()
    tries.write_text("0")
    script = bin_dir / "apt-get"
    script.write_text(f"""#!/bin/sh
echo "$@" >> {log}
n=$(cat {tries}); echo $((n + 1)) > {tries}
if [ "$n" -lt {locked_tries} ]; then
  echo "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242 (apt-get)" >&2
  exit 100
fi
case "$*" in *install*) touch {binary} ;; esac
""")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(runner.os, "geteuid", lambda: 0)
    monkeypatch.setattr(runner.time, "sleep", lambda seconds: None)
    return binary, log


def test_a_package_install_waits_for_the_package_managers_lock(tmp_path, monkeypatch):
    binary, log = _fake_apt(tmp_path, monkeypatch, locked_tries=3)
    package = stacks.SystemPackage("chromium", "chromium", str(binary), ("tests/dashboards/test_web_ui.py",))
    assert runner.install_system(package, in_ci=True) is None
    calls = log.read_text().splitlines()
    assert len(calls) == 5 and all("update" in c for c in calls[:4]) and "install" in calls[4]
    assert binary.exists()


def test_a_lock_held_past_the_bound_is_a_clear_failure(tmp_path, monkeypatch):
    binary, _ = _fake_apt(tmp_path, monkeypatch, locked_tries=10**6)
    monkeypatch.setattr(runner, "LOCK_WAIT", 0.0)
    package = stacks.SystemPackage("chromium", "chromium", str(binary), ("tests/dashboards/test_web_ui.py",))
    why = runner.install_system(package, in_ci=True)
    assert why is not None and "Could not get lock" in why and not binary.exists()


def test_a_worker_count_given_to_pytest_is_the_one_used():
    run = runner.Run("core", Path(sys.executable), ["tests/cli"])
    [(_, _, cmd, _)] = runner.pytest_passes(run, ["-n", "2"], "4", Path("/tmp"))
    assert cmd.count("-n") == 1 and cmd[cmd.index("-n") + 1] == "2"


def test_the_slowest_files_sum_every_runs_test_times(tmp_path):
    """The budget line: worker-seconds per test file, summed over the runs' junit files (a test
    in a class counts for its file)."""
    for name, cases in (("core-parallel", [("tests.cli.test_a", 3.0), ("tests.cli.test_a", 2.5), ("tests.test_b.TestX", 1.0)]),
                        ("py310-parallel", [("tests.cli.test_a", 4.0)])):
        rows = "".join(f'<testcase classname="{c}" name="t{i}" time="{t}"/>' for i, (c, t) in enumerate(cases))
        (tmp_path / f"{name}.xml").write_text(f'<testsuites><testsuite tests="{len(cases)}">{rows}</testsuite></testsuites>')
    tally = runner.Tally()
    for xml in sorted(tmp_path.glob("*.xml")):
        tally.add_junit(xml)
    assert tally.slowest() == "tests/cli/test_a.py 10s, tests/test_b.py 1s"
    assert tally.counts["passed"] == 4
