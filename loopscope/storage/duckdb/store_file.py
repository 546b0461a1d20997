"""What a store's path may be, and how the files loopscope keeps beside it are opened.

Without DuckDB: ``configure()`` checks the path with these before a writer process starts.

A store is a regular file holding a DuckDB database, or nothing yet. Anything else at the
path is refused at once, found with ``stat`` and never by opening it: opening a FIFO for
reading waits for a writer (``configure()`` took 46 s), a device or a socket is no file
to write rows to. A file that is not a DuckDB database (the user's notes, a SQLite file)
is told by its header, before DuckDB sees it.

Beside the store loopscope keeps small files of its own (``<store>.loopscope-lost.json``,
its lock, a writer's marker). A store may sit in a folder others can write (``/tmp``), where
anyone may plant a symbolic link at such a name, pointing at a file of the user's: writing
through it would overwrite that file. So a side file is opened without following a link
(``O_NOFOLLOW``), created with mode 0o600, and a side file that is a link (or no regular
file) is refused, not written through; a new one is written to a file made for it
(``O_EXCL``, a name nobody could know ahead) and renamed over the old, never over a link.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

MAGIC = b"DUCK"
"""DuckDB's file header: a checksum (8 bytes), then this."""

_SQLITE = b"SQLite format 3\x00"

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)  # (POSIX; Windows has no symbolic links one could plant)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO planted at the name must not hold the open
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_BINARY = getattr(os, "O_BINARY", 0)


def kind_problem(path: str) -> str | None:
    """Why ``path`` cannot be a store by what it is (a folder, a FIFO, a device, a socket),
    or None: a regular file, or nothing there yet. ``stat`` only: nothing is opened."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None  # nothing there (or not ours to see): the writer's own open says why
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        what = "a directory"
    elif stat.S_ISFIFO(mode):
        what = "a named pipe (FIFO)"
    elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        what = "a device"
    elif stat.S_ISSOCK(mode):
        what = "a socket"
    else:
        what = "not a regular file"
    return f"loopscope store path {path} is {what}, not a regular file; give the path of a file"


def header_problem(path: str) -> str | None:
    """Why the file at ``path`` is no DuckDB database (its first bytes say so), or None: it is
    one, it is empty, or it is not there. Raises OSError when it cannot be read."""
    fd = os.open(path, os.O_RDONLY | _NONBLOCK | _CLOEXEC | _BINARY)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # put there since kind_problem looked
            return kind_problem(path) or f"loopscope store path {path} is not a regular file"
        head = os.read(fd, 16)
    finally:
        os.close(fd)
    if not head or head[8:12] == MAGIC:
        return None
    what = "a SQLite database" if head.startswith(_SQLITE) else "not a DuckDB database"
    return f"cannot open the loopscope store {path}: the file is {what}"


# -- files beside the store ---------------------------------------------------------------------


def open_side(path: str, flags: int) -> int:
    """A descriptor of the side file ``path`` (created with mode 0o600 when ``flags`` say
    ``O_CREAT``), never through a symbolic link: OSError (ELOOP) for a link, as for anything
    that is not a regular file."""
    fd = os.open(path, flags | _NOFOLLOW | _NONBLOCK | _CLOEXEC | _BINARY, 0o600)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def refuse_link(path: str) -> None:
    """OSError (ELOOP) when ``path`` is a symbolic link or no regular file (nothing there is fine)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISLNK(mode):
        raise OSError(errno.ELOOP, "a symbolic link, not written through", path)
    if not stat.S_ISREG(mode):
        raise OSError(errno.EINVAL, "not a regular file", path)


def read_side(path: str) -> str | None:
    """The text of the side file ``path``; None when there is none. OSError when it is a link
    (not followed) or cannot be read."""
    try:
        fd = open_side(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as handle:
        return handle.read().decode("utf-8", errors="replace")


def write_side(path: str, text: str) -> None:
    """Make ``text`` the side file ``path``'s, at once for its readers (they see the old file or
    the new one, never half of one). Written to a new file of its own beside it (``O_EXCL``,
    mode 0o600, a random name: nothing planted there first), renamed over ``path``; OSError,
    and nothing written, when ``path`` is a symbolic link or no regular file."""
    refuse_link(path)
    tmp = f"{path}.{os.getpid()}.{os.urandom(6).hex()}.tmp"
    fd = open_side(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode("utf-8"))
        refuse_link(path)  # again: a link put there meanwhile would be replaced, never written through
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def touch_side(path: str) -> None:
    """Create the side file ``path`` (mode 0o600) or set its modification time to now, never
    through a symbolic link (OSError then)."""
    fd = open_side(path, os.O_WRONLY | os.O_CREAT)
    try:
        if os.utime in os.supports_fd:
            os.utime(fd)
        else:  # pragma: no cover - (Windows)
            os.utime(path)
    finally:
        os.close(fd)
