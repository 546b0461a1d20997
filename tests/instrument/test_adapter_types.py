"""pyright finds no error in each framework adapter, checked in the adapter's stack against the
framework as installed from PyPI (the stack's `checks` in tests/stacks.toml; the core venv checks
the rest of the package: tests/test_types.py)."""

from __future__ import annotations

import pytest

import stacks
from test_types import pyright_errors

CHECKED = {name: stack.checks for name, stack in stacks.load().items() if stack.checks}


@pytest.mark.parametrize("stack", [pytest.param(name, marks=pytest.mark.stack(name)) for name in sorted(CHECKED)])
def test_pyright_finds_no_error_in_the_adapter(stack: str) -> None:
    errors = pyright_errors(list(CHECKED[stack]))
    assert errors == [], "\n".join(errors)
