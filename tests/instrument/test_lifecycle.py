"""Every adapter: instrument, uninstrument and instrument again, with the originals back in
between; and an adapter whose library is missing stays dormant without error."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
import wrapt

import loopscope
import stacks
from loopscope.instrument._patch import Patch, Registration

registry = importlib.import_module("loopscope.instrument")  # the package: the root's ``instrument`` is its function


def test_every_adapter_module_is_in_the_one_registry_and_nothing_else_is() -> None:
    """``ADAPTERS`` is the one list: each public module of ``loopscope/instrument`` is an
    adapter there, with a ``patch()``."""
    from pathlib import Path

    folder = Path(registry.__file__).parent
    modules = {f"loopscope.instrument.{p.stem}" for p in folder.glob("*.py") if not p.stem.startswith("_")}
    assert {adapter.module for adapter in registry.ADAPTERS.values()} == modules
    for adapter in registry.ADAPTERS.values():
        source = (folder / f"{adapter.module.rsplit('.', 1)[1]}.py").read_text()
        assert "\ndef patch(" in source and "\nTARGET" not in source, adapter.module


# the frameworks' adapters are checked in their stacks (test_framework_lifecycle.py), the SDKs' here
FRAMEWORKS = {name for name in registry.ADAPTERS if stacks.of_adapter(name) in stacks.load()}


@pytest.mark.parametrize("name", sorted(set(registry.ADAPTERS) - FRAMEWORKS))
def test_instrument_uninstrument_reinstrument_restores_the_originals(recording, name: str) -> None:
    check_lifecycle(name)


def check_lifecycle(name: str) -> None:
    """Instrument one adapter alone, twice, uninstrument, instrument again: the originals come
    back each time, the very objects, and nothing is wrapped twice."""
    target, _ = registry.ADAPTERS[name]
    importlib.import_module(target)  # installed where this runs: a missing library fails, not skips
    others = {other: False for other in registry.ADAPTERS if other != name}
    loopscope.instrument(**others)
    try:
        assert registry.active() == [name]
        patches = list(registry._patches[name])
        assert patches, f"{name} patched nothing"
        originals = [(p, p.owner.__dict__[p.name]) for p in patches if isinstance(p, Patch)]
        for patch, current in originals:
            assert isinstance(current, wrapt.FunctionWrapper) and current.__wrapped__ is patch.original
        assert all(isinstance(p, (Patch, Registration)) for p in patches)
        loopscope.instrument(**others)  # idempotent: nothing wrapped twice
        assert [(p.owner, p.name) for p in registry._patches[name] if isinstance(p, Patch)] == [
            (p.owner, p.name) for p, _ in originals
        ]
        for patch, current in originals:
            assert patch.owner.__dict__[patch.name] is current
    finally:
        loopscope.uninstrument()
    assert registry.active() == []
    for patch, _ in originals:
        assert patch.owner.__dict__[patch.name] is patch.original  # the very object, not a copy
    loopscope.instrument(**others)
    try:
        again = [p for p in registry._patches[name] if isinstance(p, Patch)]
        assert [(p.owner, p.name) for p in again] == [(p.owner, p.name) for p, _ in originals]
        assert all(isinstance(p.owner.__dict__[p.name], wrapt.FunctionWrapper) for p in again)
        assert all(p.original is orig.original for p, (orig, _) in zip(again, originals))
        assert len(registry._patches[name]) == len(patches)
    finally:
        loopscope.uninstrument()


def test_adapters_of_missing_libraries_stay_dormant(tmp_path) -> None:
    """In a process where none of the libraries can be imported, instrument() turns every
    adapter on (waiting for an import that never comes) and nothing fails."""
    blocked = sorted({target for target, _ in registry.ADAPTERS.values()})
    code = f"""
import sys, importlib.abc
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {blocked!r}:
            raise ImportError('blocked for the test: ' + name)
sys.meta_path.insert(0, Block())
import importlib, loopscope
registry = importlib.import_module('loopscope.instrument')
loopscope.configure({str(tmp_path / 'd.duckdb')!r})
on = loopscope.instrument()
assert on == sorted(registry.ADAPTERS), on
assert registry.active() == [], registry.active()
for target in {blocked!r}:
    assert target not in sys.modules, target
with loopscope.turn(session_id='s') as t:
    t.generation('still works', finish_reason='stop')
loopscope.uninstrument()
loopscope.shutdown()
print('ok')
"""
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120,
                          env={"LOOPSCOPE_STRICT": "1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
    assert "Traceback" not in proc.stderr


def test_importing_loopscope_imports_no_sdk_or_framework(tmp_path) -> None:
    targets = sorted({target for target, _ in registry.ADAPTERS.values()})
    code = (
        "import sys, loopscope; loopscope.instrument(); "
        f"print(sorted(t for t in {targets!r} if t in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120,
                          env={"LOOPSCOPE_DB": str(tmp_path / "d.duckdb"), "PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
