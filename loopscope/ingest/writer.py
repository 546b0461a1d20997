"""The store's writer fed spans: :class:`~loopscope.storage.duckdb.writer.StoreWriter` with
loopscope's span-to-row mapping.

The store's writer knows facts, not spans (:class:`~loopscope.storage.rows.SpanMapping`
is the seam); :data:`SPANS` is the mapping it is given here: spans to facts
(:func:`.mapping.add_spans`), a queued span's size (:func:`.mapping.span_size`), its values
over the store's cap cut before it is queued (:func:`.big_values.cap`), and
the closing of turns a dead process left open (:func:`.recovery.recover`).
"""

from __future__ import annotations

from typing import Any

from ..storage.duckdb.writer import StoreWriter
from ..storage.rows import SpanMapping
from . import big_values, recovery
from .mapping import add_spans, span_rows, span_size


class _Spans:
    """loopscope's span mapping as the writer takes it. Plain functions, not methods: the
    writer calls ``size`` once per ended span on the application's thread."""

    __slots__ = ()

    add = staticmethod(add_spans)
    size = staticmethod(span_size)
    rows = staticmethod(span_rows)
    cap = staticmethod(big_values.cap)

    @staticmethod
    def recover(con: Any) -> int:
        return recovery.recover(con)  # looked up at each call (once per writer)


SPANS: SpanMapping = _Spans()


class SpanWriter(StoreWriter):
    """A :class:`~loopscope.storage.duckdb.writer.StoreWriter` that takes spans in loopscope's
    conventions (``submit(START or END, span)``); the options are the store writer's."""

    def __init__(self, path: str, **options: Any) -> None:
        super().__init__(path, mapping=SPANS, **options)


__all__ = ["SPANS", "SpanWriter"]
