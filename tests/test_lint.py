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


@pytest.mark.parametrize(
    "paths",
    [
        pytest.param(["tests", "benchmarks", "scripts", "examples"], id="around-the-package"),
        pytest.param(
            ["loopscope"],
            id="package",
            marks=pytest.mark.skip(reason="issue 16 item 8: loopscope/ is being cleaned; the lead turns this on"),
        ),
    ],
)
def test_ruff_finds_nothing(paths: list[str]) -> None:
    # no cache: a test run writes nothing into the checkout
    env = {**os.environ, "RUFF_NO_CACHE": "true"}
    result = subprocess.run(
        [*_ruff(), "check", "--no-cache", "--output-format", "concise", *paths],
        check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
