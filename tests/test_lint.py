"""ruff's default rule set ([tool.ruff] in pyproject.toml) finds nothing in the tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> list[str]:
    script = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if script is None:
        pytest.fail("ruff is missing: pip install -e '.[test]' installs it")
    return [script]


def test_ruff_finds_nothing() -> None:
    paths = ["."]  # the whole tree: the package, its tests, benchmarks, scripts and examples
    # no cache: a test run writes nothing into the checkout
    env = {**os.environ, "RUFF_NO_CACHE": "true"}
    result = subprocess.run(
        [*_ruff(), "check", "--no-cache", "--output-format", "concise", *paths],
        check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
