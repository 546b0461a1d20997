"""Switching loopscope on twice and off again around a provider SDK's calls: what every
adapter's test of ``instrument()`` and ``uninstrument()`` checks, whatever the SDK."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import loopscope
from loopscope import semconv as a


def assert_instrument_twice_is_once(recording: Any, *, originals: Callable[[], object], calls: Callable[[], None],
                                    chats: int, after: Callable[[], None] | None = None) -> None:
    """``instrument()`` twice: what ``originals()`` reads (the SDK's methods, as their classes
    hold them; compared by identity, as a wrapper may compare equal to what it wraps) is
    replaced, and ``calls()`` makes ``chats`` model calls, each recorded once (its
    span, its row), not once per ``instrument()``. Then ``uninstrument()``: ``originals()`` reads
    what it read before, and ``after()`` (``calls`` again, by default), with clients made before
    and while loopscope was on, records nothing more: no span, no row, no turn."""
    before = originals()
    loopscope.instrument()
    loopscope.instrument()
    try:
        assert not _same(originals(), before), "instrument() replaced nothing"
        calls()
        loopscope.flush()
        assert len(recording.spans(a.OP_CHAT)) == chats
        assert _model_calls(recording) == chats
        turns = len(recording.store.list_turns(limit=None))
    finally:
        loopscope.uninstrument()
    assert _same(originals(), before), "uninstrument() left a replacement"
    (after or calls)()
    loopscope.flush()
    assert len(recording.spans(a.OP_CHAT)) == chats
    assert _model_calls(recording) == chats and len(recording.store.list_turns(limit=None)) == turns


def _model_calls(recording: Any) -> int:
    _, [(count,)] = recording.store.sql("SELECT count(*) FROM model_calls")
    return count


def _same(x: object, y: object) -> bool:
    """The same objects, one by one, in the same containers: ``==`` would not do, a proxy
    (wrapt's) compares equal to the function it wraps."""
    if isinstance(x, (tuple, list)) and isinstance(y, (tuple, list)):
        return len(x) == len(y) and all(_same(i, j) for i, j in zip(x, y))
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_same(x[k], y[k]) for k in x)
    return x is y
