"""A flush request: the marker both of the store's background writers (the rows writer,
:mod:`loopscope.storage.duckdb.writer`, and the raw-span writer, :mod:`loopscope.storage.duckdb.raw_spans`)
queue behind the items it waits for."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from .._guard import guard


class FlushRequest:
    """A flush request travelling through a writer's queue behind the items it waits for.

    The writer's thread settles it (:func:`settle`) once those items are written (``ok``)
    or failed to be; the caller waits on ``done``, or gave ``then``, called with ``ok``
    by the writer's thread.
    """

    __slots__ = ("done", "ok", "then")

    def __init__(self, then: Callable[[bool], None] | None = None) -> None:
        self.done = threading.Event()
        self.ok = False
        self.then = then

    def wait(self, timeout: float | None) -> bool:
        """Whether what was queued before this request reached the file within ``timeout``."""
        return self.done.wait(timeout) and self.ok


def settle(requests: Iterable[FlushRequest], ok: bool, where: str) -> None:
    """Answer ``requests``: what they waited for was written (``ok``) or not. A ``then``
    callback that raises is an internal error of ``where``, and the others still run."""
    for request in requests:
        request.ok = ok
        request.done.set()
        if request.then is not None:
            with guard(where):
                request.then(ok)
