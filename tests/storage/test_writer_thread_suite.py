"""The key writer tests again, with the store's writer the thread of the recording process
(``LOOPSCOPE_WRITER=thread``, what ``configure(writer="thread")`` forces): the default runs a
writer process where one can run, so the core run checks that one (a test whose writer falls
back to the thread fails there: tests/conftest.py), and this file the thread. Each module in a
pytest of its own, so that every ``configure()`` in it (its children's too) runs the thread."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

MODULES = [
    "tests/storage/test_model_calls.py",
    "tests/storage/test_writer_losses.py",
    "tests/storage/test_writer_bytes.py",
    "tests/storage/test_live_reads.py",
    "tests/storage/test_tool_totals.py",
    "tests/recorder/test_exit.py",
    "tests/hardening/test_recovery.py",
    "tests/cli/test_status.py",
    "tests/storage/test_writer_batches.py",
]


@pytest.mark.parametrize("module", MODULES)
def test_the_writer_tests_pass_with_the_writer_in_a_thread(module: str) -> None:
    env = {**os.environ, "LOOPSCOPE_WRITER": "thread", "PYTHONPATH": os.pathsep.join(
        [str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", module]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
