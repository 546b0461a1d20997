"""ruff's default rule set ([tool.ruff] in pyproject.toml) finds nothing in the tree."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tool_scripts import script

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing() -> None:
    paths = ["."]  # the whole tree: the package, its tests, benchmarks, scripts and examples
    # no cache: a test run writes nothing into the checkout
    env = {**os.environ, "RUFF_NO_CACHE": "true"}
    result = subprocess.run(
        [*script("ruff", "ruff"), "check", "--no-cache", "--output-format", "concise", *paths],
        check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
