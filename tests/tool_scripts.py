"""The commands the test extras install (ruff, lint-imports), found beside the interpreter
the tests run in, else on PATH: a missing one fails the test and says how to get it."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest


def script(name: str, package: str) -> list[str]:
    """The command line that runs ``name``, which ``pip install -e '.[test]'`` installs
    with ``package``."""
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is missing: pip install -e '.[test]' installs {package}")
    return [found]
