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


# the modules of loopscope/instrument every adapter shares (the kit's instrument side): their
# private names are the adapters' to use; any other module there belongs to one adapter
SHARED = {"_calls", "_history", "_json_body", "_openai_compat", "_patch", "_raw", "_read", "_streams", "__init__"}


def _private_uses(path: Path) -> list[str]:
    """Private names ``path`` takes from another adapter's modules: ``from .x import _name``,
    and ``x._name`` where ``x`` is such a module imported by name."""
    import ast

    own = path.stem
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found, modules = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = (node.module or "").removeprefix("loopscope.instrument.") if node.level == 0 else node.module
            if node.level == 0 and not (node.module or "").startswith("loopscope.instrument."):
                continue
            if node.level not in (0, 1):
                continue
            if source is None:  # from . import x [as y]
                for alias in node.names:
                    if alias.name not in SHARED and alias.name != own:
                        modules[alias.asname or alias.name] = alias.name
                continue
            if source in SHARED or source == own:
                continue
            found += [f"{own}: from {source} import {a.name}" for a in node.names if a.name.startswith("_")]
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            found.append(f"{own}: {modules[node.value.id]}.{node.attr}")
    return found


def test_adapters_take_no_private_names_of_another_adapter() -> None:
    """An adapter that reuses another's private functions breaks when those change, and once
    switched the openai adapter off for the whole process (issue 32): what adapters share is
    the kit (recorder.adapter, the shared modules above, _openai_compat), by public names."""
    found = [use for path in sorted((ROOT / "loopscope" / "instrument").glob("*.py")) for use in _private_uses(path)]
    assert not found, found


def test_the_private_names_rule_sees_both_forms(tmp_path: Path) -> None:
    module = tmp_path / "groq.py"
    module.write_text("from .openai import _chat_request\nfrom . import anthropic as a\nfrom ._read import get\nx = a._request\n")
    assert _private_uses(module) == ["groq: from openai import _chat_request", "groq: anthropic._request"]
