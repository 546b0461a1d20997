"""Readers ask the writers that hold rows to write them now.

A store writer batches: after a batch it waits seconds before the next (its CPU is mostly a
batch's fixed cost, see ``writer.AUTO_SHARE``), so a row recorded meanwhile is not in the
file yet. loopscope's own readers (``Store``, the CLI, the dashboard) must not see a store
that lags what the application recorded, and an application that nobody reads must not
pay for batches written for nobody. So a writer holding rows says so with a FIFO beside the
store (:class:`Holding`, ``<store>.loopscope-holding.<pid>.<random>``, mode 0o600), made
when its first row arrives and removed once the batch is written; a reader that finds one
writes a byte into it (:func:`ask`) and waits, briefly, for it to go (:func:`wait_written`). Nothing is
written to the store or beside it by a reader: the byte lives in the kernel's pipe.

A FIFO left by a writer that died is not open for reading: the reader's open fails at once
(``ENXIO``) and it is skipped. Other users' FIFOs, links and anything that is not a FIFO are
skipped too. Where there are no FIFOs (Windows), writers hold rows for their interval and
readers read what is written.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import stat
import threading
import time

from ..._guard import guarded

SUFFIX = ".loopscope-holding."
"""A holding FIFO's name after the store's path: ``<store>.loopscope-holding.<pid>.<random>``."""
CATCH_UP = 10.0
"""Seconds a reader waits at most for the writers it woke to write what they hold, unless it
says otherwise (``open_store`` gives its lock timeout: a read waits for writers as long as it
would for the file). A batch takes tens of milliseconds; on a loaded machine, seconds."""
POLL = 0.1
"""Seconds between a holding writer's looks at its FIFO while it waits for its batch."""
ASK_GAP = 0.5
"""Seconds after a batch before an asked writer writes again: a reader that polls (``loopscope
tail --follow``, four times a second) gets batches twice a second at most, as the writer's
shortest wait was before readers could ask."""

_local = threading.local()
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class Holding:
    """A writer's FIFO beside ``store`` while it holds rows not yet written: made by
    :meth:`open` (False where none can be made), looked at by :meth:`asked`, removed by
    :meth:`close`. One writer thread uses it: no lock."""

    def __init__(self, store: str) -> None:
        self.store = store
        self.path: str | None = None
        self._fd: int | None = None

    @guarded("holding FIFO", default=False)
    def open(self) -> bool:
        """Say that this writer holds rows: a FIFO of its own beside the store."""
        if self._fd is not None:
            return True
        mkfifo = getattr(os, "mkfifo", None)
        if mkfifo is None:  # pragma: no cover - (Windows)
            return False
        path = f"{self.store}{SUFFIX}{os.getpid()}.{os.urandom(4).hex()}"
        try:
            mkfifo(path, 0o600)  # fails on anything already there: nothing planted is used
        except OSError:
            return False
        try:
            # read end, non-blocking: open at once without a writer, and read() never waits
            self._fd = os.open(path, os.O_RDONLY | _NONBLOCK | _NOFOLLOW | _CLOEXEC)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(path)  # the FIFO made just above
            return False
        self.path = path
        return True

    @guarded("holding FIFO", default=False)
    def asked(self) -> bool:
        """Whether a reader asked for the rows since the last look (what it wrote is read)."""
        if self._fd is None:
            return False
        try:
            return bool(os.read(self._fd, 4096))
        except OSError:  # BlockingIOError: nothing written since the last look
            return False

    @guarded("holding FIFO")
    def unlink(self) -> None:
        """From another thread than the writer's (a close that gave up on a write that does not
        end): the FIFO's name goes, so that no reader waits for rows that will not be written;
        its descriptor stays the writer thread's (closing it here could close another file
        that reused the number)."""
        path = self.path
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)

    @guarded("holding FIFO")
    def close(self) -> None:
        """The rows are written (or the writer stops): the FIFO goes, and readers waiting on it read."""
        fd, path, self._fd, self.path = self._fd, self.path, None, None
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


@guarded("removing a dead writer's FIFOs")
def remove_left(store: str, pid: int) -> None:
    """The holding FIFOs writer process ``pid`` left beside ``store`` when it ended without
    removing them (killed; or past its close bound, its thread still in a write): removed by
    the process that saw it end, so that none stays beside the store (readers skip them, but
    a program that opens every file beside the store would wait on one). Ours only: FIFOs of
    this user, no links."""
    for path in glob.glob(glob.escape(store) + SUFFIX + f"{pid}.*"):
        with contextlib.suppress(OSError):
            st = os.lstat(path)
            if stat.S_ISFIFO(st.st_mode) and (not hasattr(os, "getuid") or st.st_uid == os.getuid()):
                os.unlink(path)


def _holders(store: str) -> list[str]:
    return glob.glob(glob.escape(store) + SUFFIX + "*")


def _ask(path: str) -> bool:
    """Write a byte into the holding FIFO ``path``; False when it is not a live writer's of ours."""
    try:
        fd = os.open(path, os.O_WRONLY | _NONBLOCK | _NOFOLLOW | _CLOEXEC)
    except OSError:  # ENXIO: nobody reads it (its writer died); ELOOP: a link; gone meanwhile
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISFIFO(st.st_mode) or (hasattr(os, "getuid") and st.st_uid != os.getuid()):
            return False
        try:
            os.write(fd, b"w")
        except OSError as exc:
            if exc.errno != errno.EAGAIN:  # a full pipe has been asked already
                return False
        return True
    finally:
        os.close(fd)


@guarded("asking the writers", default=[])
def ask(store: str) -> list[str]:
    """Before a read of ``store``: ask every writer that holds rows for it to write them now;
    the FIFOs of those asked (:func:`wait_written` waits for them). None from a writer's own
    thread (:func:`writer_thread`): it would wait for itself."""
    if _NONBLOCK == 0 or getattr(_local, "writer", False):  # pragma: no cover - (Windows: no FIFOs)
        return []
    return [path for path in _holders(store) if _ask(path)]


@guarded("waiting for the writers")
def wait_written(asked: list[str], timeout: float = CATCH_UP) -> None:
    """Wait up to ``timeout`` seconds for the writers :func:`ask` asked to have written what
    they held (their FIFOs gone); then the read reads what is there."""
    deadline = time.monotonic() + timeout
    while asked and time.monotonic() < deadline:
        time.sleep(0.005)
        asked = [path for path in asked if os.path.lexists(path)]


def writer_thread() -> None:
    """Mark the calling thread as a store writer's: its reads ask no writer (see :func:`ask`)."""
    _local.writer = True
