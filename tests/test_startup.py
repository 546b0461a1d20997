"""Start-up stays light (issue 19): what a fresh process imports, not how long it takes
(the times are benchmarks/bench_startup.py's business). Each check runs in a child
interpreter and asserts on its ``sys.modules``."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

HEAVY = ["duckdb", "pydantic", "pyarrow", "wrapt", "opentelemetry.sdk.trace", "opentelemetry.sdk.metrics"]
RECORDING = ["loopscope.recorder", "loopscope.pipeline", "loopscope.export", "loopscope.pricing", "loopscope._otel_sdk"]

CLI = "from loopscope.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"


def loaded(code: str, names: list[str], cwd: Path | None = None, env_extra: dict[str, str] | None = None) -> dict[str, bool]:
    """Run ``code`` in a fresh interpreter; which of ``names`` it imported."""
    report = f"\nimport json as _j, sys as _s\nprint(_j.dumps({{n: n in _s.modules for n in {names!r}}}))\n"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **(env_extra or {})}
    done = subprocess.run(
        [sys.executable, "-c", code + report], cwd=cwd or ROOT, env=env, capture_output=True, text=True, timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_loopscope_imports_no_store_no_pydantic_no_otel_sdk():
    found = loaded("import loopscope", HEAVY + RECORDING + ["loopscope.models", "asyncio"])
    assert not any(found.values()), [name for name, is_in in found.items() if is_in]


def test_every_public_name_is_there_when_asked_for():
    code = (
        "import loopscope\n"
        "missing = [n for n in loopscope.__all__ if getattr(loopscope, n, None) is None]\n"
        "assert not missing, missing\n"
        "assert set(loopscope.__all__) <= set(dir(loopscope))\n"
        "import loopscope.instrument.openai  # a submodule import must not hide the function\n"
        "assert callable(loopscope.instrument) and loopscope.instrument.__module__ == 'loopscope.instrument'\n"
        "from loopscope import *  # noqa: F403\n"
        "assert Store is loopscope.storage.store.Store and turn is loopscope.recorder.turn\n"
        "try:\n"
        "    loopscope.no_such_name\n"
        "except AttributeError as exc:\n"
        "    assert 'no_such_name' in str(exc)\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')\n"
    )
    loaded(code, [])


def test_help_imports_no_store_no_models_no_otel_sdk():
    found = loaded(CLI.format(argv=["--help"]), HEAVY + RECORDING + ["loopscope.models", "asyncio", "opentelemetry"])
    assert not any(found.values()), [name for name, is_in in found.items() if is_in]


def test_turns_reads_the_store_without_the_recorder_or_exporters(tmp_path):
    db = str(tmp_path / "demo.duckdb")
    loaded(CLI.format(argv=["--db", db, "demo"]), [])
    found = loaded(CLI.format(argv=["--db", db, "turns"]), [*RECORDING, "pyarrow", "opentelemetry.sdk.trace"])
    assert not any(found.values()), [name for name, is_in in found.items() if is_in]


@pytest.mark.parametrize(("command", "shown"), [
    ("turns", "concierge"), ("calls", "scripted-concierge"), ("stats", "loop end reasons"), ("tools", "get_weather"),
    ("status", "schema"),
])
def test_terminal_reads_print_plain_rows_without_pydantic_or_opentelemetry(tmp_path, command, shown):
    """The common terminal reads (``turns``, ``calls``, ``stats``, ``tools``, ``status``) print plain
    rows: no pydantic, no public models, no OpenTelemetry, and of DuckDB the engine alone
    where it is a module of its own (the ``duckdb`` package's Python layer costs ~4x a
    bare interpreter's start)."""
    db = str(tmp_path / "demo.duckdb")
    loaded(CLI.format(argv=["--db", db, "demo"]), [])
    code = "import io, contextlib\nout = io.StringIO()\nwith contextlib.redirect_stdout(out):\n" + "".join(
        "    " + line + "\n" for line in CLI.format(argv=["--db", db, command]).splitlines()
    ) + f"assert {shown!r} in out.getvalue().lower(), out.getvalue()\n"
    heavy = ["pydantic", "pydantic_core", "loopscope.models", "loopscope.storage.store", "opentelemetry", "pyarrow"]
    found = loaded(code, [*heavy, "duckdb", "_duckdb"])
    engine_alone = importlib.util.find_spec("_duckdb") is not None
    assert found.pop("_duckdb" if engine_alone else "duckdb")  # it did read the store
    if not engine_alone:
        found.pop("_duckdb")
    assert not any(found.values()), [name for name, is_in in found.items() if is_in]


def test_with_the_engine_switch_off_terminal_reads_use_the_duckdb_package(tmp_path):
    """``LOOPSCOPE_DUCKDB_ENGINE=0`` turns off the one use of DuckDB's private engine module:
    the reads then go through the public ``duckdb`` package and print the same table."""
    db = str(tmp_path / "demo.duckdb")
    loaded(CLI.format(argv=["--db", db, "demo"]), [])
    code = "import io, contextlib\nout = io.StringIO()\nwith contextlib.redirect_stdout(out):\n" + "".join(
        "    " + line + "\n" for line in CLI.format(argv=["--db", db, "turns"]).splitlines()
    ) + "assert 'concierge' in out.getvalue().lower(), out.getvalue()\n"
    code += "import loopscope.storage.engine as _e, duckdb as _d\nassert _e.duckdb is _d, _e.duckdb\n"
    found = loaded(code, ["duckdb"], env_extra={"LOOPSCOPE_DUCKDB_ENGINE": "0"})
    assert found["duckdb"]


def test_after_uninstrument_a_later_import_is_left_alone():
    code = (
        "import openai\n"
        "import loopscope\n"
        "loopscope.configure(False)\n"
        "loopscope.instrument()\n"
        "loopscope.uninstrument()\n"
        "import wrapt\n"
        "from openai.resources.chat.completions import completions\n"
        "assert not isinstance(completions.Completions.__dict__['create'], wrapt.FunctionWrapper)\n"
    )
    loaded(code, [])
