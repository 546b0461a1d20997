"""Every fault-injection test must leave the thread's context as it found it: an internal
error that left a turn, a round or a span current would put every later call of the
application into it."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from opentelemetry import trace

from loopscope.recorder.context import current_round, current_turn


@pytest.fixture(autouse=True)
def context_is_put_back() -> Iterator[None]:
    before = (current_turn.get(), current_round.get(), trace.get_current_span())
    yield
    after = (current_turn.get(), current_round.get(), trace.get_current_span())
    assert after == before, f"the test left the context changed: turn, round, span = {after}"


@pytest.fixture
def thread_writer_everywhere() -> Iterator[None]:
    """The faults of the modules that ask for this are injected into the store's writer in the
    test's process (patched writes and mappings, file-size limits, stuck writes): the thread
    writer, in this process and in the children it starts. The writer process's own faults (a
    child that dies, is killed, cannot start): tests/storage/test_writer_process.py and
    test_writer_fallback.py."""
    # not monkeypatch: asked for first, its undoing would come after the tests' own fixtures'
    before = os.environ.get("LOOPSCOPE_WRITER")
    os.environ["LOOPSCOPE_WRITER"] = "thread"
    yield
    if before is None:
        os.environ.pop("LOOPSCOPE_WRITER", None)
    else:
        os.environ["LOOPSCOPE_WRITER"] = before
