"""Adapters use the recorder only through its adapter-facing API (issue 16).

Every module of ``loopscope/instrument`` imports nothing from the recorder but
``loopscope.recorder.adapter`` (imports inside functions included), and touches no
private attribute of the recorder's objects (a turn's ``_span``, a tool execution's
``_finish``...): a new adapter has one contract to follow, not internals to copy.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

# the packages themselves (``loopscope.instrument`` is also the name of a function)
INSTRUMENT = Path(importlib.import_module("loopscope.instrument").__path__[0])
RECORDER = Path(importlib.import_module("loopscope.recorder").__path__[0])
ALLOWED = "loopscope.recorder.adapter"


def _modules() -> list[Path]:
    return sorted(INSTRUMENT.rglob("*.py"))


def _imported(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports (absolute names), with the line it does so on."""
    package = "loopscope.instrument"
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            # ``from ..recorder import stitch`` imports the submodule ``stitch``
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names if module == "loopscope.recorder"]
    return found


def _recorder_private_attributes() -> set[str]:
    """The private attribute and method names the recorder's classes define."""
    names: set[str] = set()
    for path in RECORDER.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        names.add(item.name)
                    elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        names.add(item.target.id)
                    elif isinstance(item, ast.Assign):
                        names.update(t.id for t in item.targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                names.add(node.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_the_adapters_import_nothing_from_the_recorder_but_its_adapter_api() -> None:
    offending = [
        f"{path.relative_to(INSTRUMENT.parent)}:{line} imports {module}"
        for path in _modules()
        for line, module in _imported(path)
        if (module == "loopscope.recorder" or module.startswith("loopscope.recorder.")) and module != ALLOWED
    ]
    assert offending == []
    assert any(module == ALLOWED for path in _modules() for _, module in _imported(path))  # the check reads real imports


def test_the_adapters_touch_no_private_attribute_of_the_recorders_objects() -> None:
    private = _recorder_private_attributes()
    assert {"_span", "_finish", "_start", "_claim_call", "_turn"} <= private  # what adapters used to reach for
    offending = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and node.attr in private:
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    continue  # the adapter's own classes' attributes
                offending.append(f"{path.relative_to(INSTRUMENT.parent)}:{node.lineno} .{node.attr}")
    assert offending == []
