"""Every framework adapter, in its stack's venv (tests/stacks.toml): instrument, uninstrument and
instrument again, with the originals back in between (the SDKs' adapters: test_lifecycle.py)."""

from __future__ import annotations

import pytest
from test_lifecycle import FRAMEWORKS, check_lifecycle

import stacks


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.stack(stacks.of_adapter(n))) for n in sorted(FRAMEWORKS)])
def test_instrument_uninstrument_reinstrument_restores_the_originals(recording, name: str) -> None:
    check_lifecycle(name)
