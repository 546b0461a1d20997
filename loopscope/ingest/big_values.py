"""Values over the store's cap, cut where their span is handed to the store's writer.

The store keeps at most ``store_max_chars`` of each content value (the content policy's cap,
applied in the writer with the masking: :mod:`loopscope.storage.scrub`). A value far over it
(a 60 MB tool result, a model's huge answer) would otherwise cost the writer's queue, the
pipe to a writer process and the rows held what it weighs, not what is kept of it: one such
value filled the queue's byte bound and the turn's own row was dropped after it. So an ended
span whose text is over the cap is replaced, in the queue, by a copy of it whose values over
the cap are cut (:func:`~loopscope.content.policy.cut_early`: a margin past the cap kept,
JSON kept JSON, the lengths the writer's markers state kept the values' own). The span
itself is the application's and the exporters': it is never changed.

Runs on the thread that ends the span, only for the spans over the cap (the writer's byte
count of a span, which it makes anyway, says which): every other span costs nothing more.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from .. import semconv as a
from .._otel_sdk import attributes_view
from ..content.policy import EARLY_MARGIN, cut_early
from .mapping import SPAN_BYTES
from .spans import record_of

__all__ = ["HOW", "cap", "capped", "threshold"]

HOW = {
    # as the store's writer caps the columns they become (storage/scrub.py's columns)
    a.TOOL_CALL_ARGUMENTS: "json", a.TOOL_CALL_RESULT: "json", a.INPUT_MESSAGES: "json", a.OUTPUT_MESSAGES: "json",
    a.SEGMENTS: "shape", a.STATE_VALUE: "shape",  # the mapping parses these: they stay JSON
    a.TURN_INPUT: "text", a.ROUND_TEXT: "text", a.THINKING: "text", a.TOOL_ERROR: "text", a.CALL_REFUSAL: "text",
    a.CALL_ERROR: "text",
}
"""The attributes the store caps, and how their values are cut: the others are stored whole."""


def threshold(limit: int) -> float:
    """The byte count (as :func:`~loopscope.ingest.mapping.span_size` counts) past which an
    ended span may hold a value over the cap ``limit`` (0: no cap, never)."""
    return SPAN_BYTES + limit + EARLY_MARGIN if limit > 0 else float("inf")


def capped(span: Any, limit: int) -> tuple[Any, int]:
    """``span``, or a copy of it with its values over the cap cut, and what it counts against
    the writer's byte bound (its text and :data:`~loopscope.ingest.mapping.SPAN_BYTES`)."""
    attributes = attributes_view(span)
    keep = limit + EARLY_MARGIN
    over = [key for key, value in attributes.items() if type(value) is str and len(value) > keep and key in HOW]
    if over:
        changed = dict(attributes)
        for key in over:
            changed[key] = cut_early(changed[key], limit, HOW[key])
        span = record_of(span).replace(attributes=changed)
        attributes = changed
    return span, SPAN_BYTES + sum(len(value) for value in attributes.values() if type(value) is str)


def cap(limit: int) -> tuple[float, Callable[[Any], tuple[Any, int]]]:
    """A writer's cap check for the store's cap ``limit`` (``store_max_chars``; 0: none):
    ``(over, cut)``, where ``over`` is :func:`threshold` and ``cut(span)`` is :func:`capped`.
    Both writers (the thread writer through its mapping, ``SpanMapping.cap``, and the writer
    process's application side) take it from here, and per ended span do only::

        if counted > over:  # counted: the span's size, which the byte bound makes anyway
            span, counted = cut(span)

    one compare of two numbers for every span not over the cap."""
    limit = max(0, int(limit or 0))
    return threshold(limit), partial(capped, limit=limit)
