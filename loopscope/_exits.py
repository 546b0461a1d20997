"""Ends of a process that skip ``atexit``: ``os._exit()``, and a SIGTERM the main thread
sleeps through.

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

:func:`watch_sigterm` makes sure a SIGTERM that the pipeline's handler catches still ends the
process. Python runs a signal's handler on the main thread only, between bytecodes: the C
handler that notes the signal may run on another thread, or on the main thread just before it
goes to sleep in a wait (a lock, a read), and the main thread then sleeps on without running
it. That is how a ``multiprocessing`` pool worker outlived ``Pool.terminate()``: its main
thread asleep in the task queue's lock, left taken by a sibling that SIGTERM had killed; the
signal's default action would have ended it. Python's C handler writes the signal's number
to the wakeup fd from whatever thread it runs on, so a thread of ours reads it there, signals
the main thread again (``pthread_kill``, which interrupts its wait) until the handler runs,
and past a short bound ends the process itself.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import NoReturn

from ._guard import guard, logger

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


KICK_EVERY = 0.1
"""Seconds between the signals the watcher sends the main thread while the handler has not run."""
KICK_FOR = 2.0
"""Seconds the watcher lets the main thread take the handler before it ends the process itself
(the main thread blocks SIGTERM, or is in C code that never returns to Python)."""

_watch: tuple[int, int, Callable[..., object], Callable[[], bool], Callable[[], None]] | None = None
_watch_guard = guard("SIGTERM watch")


def watch_sigterm(handler: Callable[..., object], handled: Callable[[], bool], unhandled: Callable[[], None]) -> None:
    """From the main thread, once ``handler`` is SIGTERM's: at each SIGTERM while it still is,
    wait for ``handled()`` (the handler has started), signalling the main thread again until it
    is true, and call ``unhandled()`` (in this thread; it ends the process) if it is not within
    :data:`KICK_FOR` seconds. Only where the application watches no wakeup fd of its own (an
    event loop's signal handling: its main thread wakes up by it, and runs the handler)."""
    global _watch
    if _watch is not None or "trio" in sys.modules:
        return  # (trio takes the wakeup fd at each run and warns when another had it; its loop wakes by it)
    read, write = os.pipe()
    os.set_blocking(write, False)  # (what Python's C handler requires of it)
    try:
        previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    except (ValueError, OSError):  # not the main thread after all, or an embedded interpreter's rules
        previous = None
    if previous != -1:
        if previous is not None:  # the application's own: given back as it was
            signal.set_wakeup_fd(previous, warn_on_full_buffer=False)
        os.close(read)
        os.close(write)
        return
    _watch = (read, write, handler, handled, unhandled)
    watcher = threading.Thread(target=_watch_loop, args=(read, handler, handled, unhandled),
                               name="loopscope-sigterm-watch", daemon=True)
    try:
        watcher.start()
    except RuntimeError:  # at exit: no thread, and no need of one
        pass


def _watch_loop(read: int, handler: Callable[..., object], handled: Callable[[], bool], unhandled: Callable[[], None]) -> None:
    while True:
        try:
            numbers = os.read(read, 64)
        except OSError:  # closed (a fork let go of it)
            return
        if not numbers:
            return
        if signal.SIGTERM in numbers:
            with _watch_guard:
                _see_to_it(handler, handled, unhandled)


def _see_to_it(handler: Callable[..., object], handled: Callable[[], bool], unhandled: Callable[[], None]) -> None:
    """A SIGTERM came: make sure the handler runs, or end the process here."""
    main = threading.main_thread().ident
    deadline = time.monotonic() + KICK_FOR
    while True:
        time.sleep(KICK_EVERY)  # the usual case: the main thread has run the handler meanwhile
        if handled() or signal.getsignal(signal.SIGTERM) is not handler:
            return  # under way, or not ours to see to (the default action is back, or the application's handler)
        if time.monotonic() >= deadline or main is None:
            unhandled()
            return
        signal.pthread_kill(main, signal.SIGTERM)  # its wait ends (EINTR), and Python runs the handler


def _watch_after_fork() -> None:
    """In a fork's child: a pipe (and a watcher thread) of its own, so that its signals are not
    read by the parent's watcher, nor the parent's by it."""
    global _watch
    if _watch is None:
        return
    read, write, handler, handled, unhandled = _watch
    _watch = None
    with guard("SIGTERM watch: fork"):
        current = signal.set_wakeup_fd(-1)
        os.close(read)
        os.close(write)
        if current not in (write, -1):  # the application's own since: given back as it was
            signal.set_wakeup_fd(current, warn_on_full_buffer=False)
            return
        watch_sigterm(handler, handled, unhandled)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_watch_after_fork)


def exit_now(status: int) -> NoReturn:
    """End the process at once with ``status``, without the hook of :func:`on_os_exit`."""
    _real_exit(status)


__all__ = ["KICK_EVERY", "KICK_FOR", "exit_now", "on_os_exit", "watch_sigterm"]
