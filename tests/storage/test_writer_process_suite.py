"""The key writer tests again, with the store's writer a process of its own
(``LOOPSCOPE_WRITER=process``): each module in a pytest of its own, so that every
``configure()`` in it (its children's too) runs the process mode. Left out: the tests of
the thread writer's insides (its tracker spied on, its batch size or WAL limit patched in
the application's process, where the child does not see them) and the status of a killed
application's writer (in process mode its writer process closes cleanly: ``stopped``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

MODULES = {
    "tests/storage/test_model_calls.py": None,
    "tests/storage/test_writer_losses.py": None,
    "tests/storage/test_writer_bytes.py": None,
    "tests/storage/test_live_reads.py": None,
    "tests/storage/test_tool_totals.py": None,
    "tests/recorder/test_exit.py": None,
    "tests/hardening/test_recovery.py": None,
    "tests/cli/test_status.py": "not test_a_killed_writer_shows_as_gone",
    "tests/storage/test_writer_batches.py": (
        "not test_rows_reach_the_file_while_the_application_records_without_a_pause "
        "and not test_a_full_batch_is_written_without_waiting_for_the_interval "
        "and not test_a_commit_checkpoints_once_the_wal_has_grown_past_its_limit"
    ),
}


@pytest.mark.parametrize("module", list(MODULES))
def test_the_writer_tests_pass_with_the_writer_in_a_process(module: str) -> None:
    env = {**os.environ, "LOOPSCOPE_WRITER": "process", "PYTHONPATH": os.pathsep.join(
        [str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    select = MODULES[module]
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", module, *(["-k", select] if select else [])]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
