"""loopscope's span-to-row mapping, as the store's writer takes it (the seam's ``open_sink(db,
mapping=SPANS)``: DuckDB's ``StoreWriter``, or the ClickHouse engine's sink, which leaves the
mapping to ClickHouse's materialized views).

The store's writer knows facts, not spans (:class:`~loopscope.storage.rows.SpanMapping`
is the seam); :data:`SPANS` is the mapping it is given here: spans to facts
(:func:`.mapping.add_spans`), a queued span's size (:func:`.mapping.span_size`), its values
over the store's cap cut before it is queued (:func:`.big_values.cap`), and
the closing of turns a dead process left open (:func:`.recovery.recover`).
"""

from __future__ import annotations

from typing import Any

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


__all__ = ["SPANS"]
