"""pytest fixtures for the fake model server.

tests/conftest.py names this module in ``pytest_plugins``: every test may ask for ``model_server``
(``tests/`` is on ``sys.path`` because ``tests/conftest.py`` has no package ``__init__``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .model_server import FakeModelServer


@pytest.fixture
def model_server() -> Iterator[FakeModelServer]:
    """A running :class:`FakeModelServer` on 127.0.0.1 (a fresh one per test; starting one takes about 1 ms).

    ``.openai_base_url`` is ``http://127.0.0.1:PORT/v1``, ``.anthropic_base_url`` is ``http://127.0.0.1:PORT``;
    ``.openai_client()`` / ``.async_openai_client()`` / ``.anthropic_client()`` / ``.async_anthropic_client()`` build
    real SDK clients pointed at it (``api_key="test-key"``, ``max_retries=0``; keyword arguments override).
    The test fails at teardown if the server itself raised (``server.errors``).
    """
    with FakeModelServer() as server:
        yield server
    if server.errors:  # exceptions inside the fake (a bug, or a match predicate that raised)
        pytest.fail(f"the fake model server raised: {server.errors!r}")
