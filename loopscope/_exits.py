"""Ends of a process that skip ``atexit``: ``os._exit()``.

A process that ends through ``os._exit()`` runs no exit hook, so what loopscope recorded and
had not handed to the store yet (a writer process gets spans every 0.25 s; a stitched turn is
open until the process ends) would be lost without a word. That is how every child of
``multiprocessing``'s fork start method ends (``Process``, ``Pool`` workers,
``ProcessPoolExecutor``: ``popen_fork`` calls ``os._exit`` after the target returns), and how
applications end a fork of their own, or end at once.

:func:`on_os_exit` wraps ``os._exit`` (once, in the ``os`` module: code that looks it up
there at call time, as ``multiprocessing`` does, goes through the wrap) so that it first runs
the hook the pipeline gives (the same end as at a normal exit: open turns ended, the store's
writer closed within its bound, what could not be written counted), in a thread of its own
joined for at most the bound, then exits as asked. A hook that hangs (a lock held by a thread
that did not survive a fork) costs the bound, never the exit. Peers do the same at a fork's
end: OpenTelemetry's batch processor re-initialises in the child and flushes at its shutdown;
``multiprocessing`` runs its own finalizers before it calls ``os._exit``.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from typing import NoReturn

from ._guard import logger

_real_exit = os._exit
_hook: Callable[[], None] | None = None
_bound = 6.0
_running = False


def on_os_exit(hook: Callable[[], None], bound: float) -> None:
    """Run ``hook`` (for at most ``bound`` seconds) when the process calls ``os._exit()``;
    installs the wrap the first time."""
    global _hook, _bound
    _hook, _bound = hook, bound
    if getattr(os._exit, "__wrapped__", None) is not _real_exit:
        os._exit = _exit


@functools.wraps(_real_exit)
def _exit(status: int, /) -> NoReturn:
    global _running
    hook = _hook
    try:
        if hook is not None and not _running:
            _running = True  # once: a second os._exit (another thread, the hook itself) exits at once
            runner = threading.Thread(target=hook, name="loopscope-os-exit", daemon=True)
            runner.start()  # (no thread at interpreter exit: RuntimeError, and the exit as asked)
            runner.join(_bound)
            if runner.is_alive():  # what it had not stored or counted yet is lost unsaid: said here at least
                logger.warning("loopscope: os._exit() did not wait longer than %.0f s to store or count what was "
                               "recorded", _bound)
    finally:  # whatever happened meanwhile (an interrupt too): the exit the application asked for
        _real_exit(status)


__all__ = ["on_os_exit"]
