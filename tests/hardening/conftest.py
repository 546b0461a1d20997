"""Every fault-injection test must leave the thread's context as it found it: an internal
error that left a turn, a round or a span current would put every later call of the
application into it."""

from __future__ import annotations

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
