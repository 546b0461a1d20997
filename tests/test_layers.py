"""The layer rules in pyproject.toml ([tool.importlinter]) hold: cli > dashboards > ingest
> storage, instrument > recorder > semconv and models, nothing imports cli or dashboards,
private modules stay in their package, no import cycles. import-linter checks them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tool_scripts import script

ROOT = Path(__file__).resolve().parents[1]


def test_the_layer_rules_hold() -> None:
    # this checkout's package, whichever one the environment has installed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([*script("lint-imports", "import-linter"), "--no-cache"], check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout
