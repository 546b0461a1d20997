"""Model calls that another instrumentation records: SDK adapters leave them alone.

A framework that emits model-call spans of its own (pydantic-ai's ``chat`` spans) calls
an SDK that loopscope instruments too (openai, anthropic). Recording the call a second
time would give it two model-call spans and the agent run a second, stitched turn. The
framework's adapter names its instrumentation scope with :func:`defer_to`; while a
recording span of that scope that is a model call is the current span, the SDK call
under it is that framework's, and :func:`recorded_elsewhere` says so.

Reading the current span (not a flag the framework's adapter sets) also covers the
framework's streams, whose SDK calls run in another task with the span re-attached, and
leaves the SDK adapters on when the framework's own instrumentation is off. The SDK
adapter still reads the request, and :func:`note_request` puts its parameters on the
framework's span.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from opentelemetry import trace

from .. import semconv as a

_scopes: dict[str, int] = {}  # instrumentation scope -> how many adapters defer to it
_lock = threading.Lock()


def defer_to(scope: str) -> Callable[[], None]:
    """Leave the SDK calls made under a model-call span of ``scope`` to that instrumentation;
    returns the function that undoes it."""
    with _lock:
        _scopes[scope] = _scopes.get(scope, 0) + 1
    done = False

    def undo() -> None:
        nonlocal done
        with _lock:
            if done:
                return
            done = True
            left = _scopes.get(scope, 0) - 1
            if left > 0:
                _scopes[scope] = left
            else:
                _scopes.pop(scope, None)

    return undo


def recorded_elsewhere() -> bool:
    """Whether the model call about to be made is recorded by the instrumentation whose
    model-call span is current (one of those :func:`defer_to` named)."""
    if not _scopes:  # the common case: one dict check on every SDK call
        return False
    span = trace.get_current_span()
    scope = getattr(span, "instrumentation_scope", None)
    if scope is None or scope.name not in _scopes or not span.is_recording():
        return False
    attributes = getattr(span, "attributes", None) or {}
    return attributes.get(a.OPERATION) == a.OP_CHAT


def note_request(parameters: Mapping[str, Any] | None) -> None:
    """What the SDK call under a framework's model-call span (:func:`recorded_elsewhere`)
    sends, added to that span: the framework's own attributes name only some of its request
    (pydantic-ai's no tool choice, which it sends as ``required`` for a structured output)."""
    if not parameters:
        return
    attributes = a.request_attributes(parameters)
    if attributes:
        trace.get_current_span().set_attributes(attributes)


__all__ = ["defer_to", "note_request", "recorded_elsewhere"]
