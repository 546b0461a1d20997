"""Short-lived connections to a store file, shared fairly between one writer and many readers.

DuckDB lets one process hold a file open for writing, and while it does no other
process can open it, not even read-only. So nobody keeps the file open: the writer
opens it for each batch and closes it again, readers open it for each query. A lock
met on the way is waited out briefly and retried; inside one process a lock per path
keeps our own writer and readers from colliding (DuckDB refuses two configurations of
one file in one process).
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb

from .errors import StoreError, StoreLockedError

_gates: dict[str, threading.Lock] = {}
_gates_lock = threading.Lock()
_LOCK_MESSAGE = re.compile(r"(Could not set lock|Conflicting lock|database is locked)", re.I)
_PID = re.compile(r"PID (\d+)")


def gate(path: str) -> threading.Lock:
    """The in-process lock for one store file."""
    with _gates_lock:
        lock = _gates.get(path)
        if lock is None:
            lock = _gates[path] = threading.Lock()
        return lock


def is_lock_error(exc: BaseException) -> bool:
    return isinstance(exc, duckdb.Error) and bool(_LOCK_MESSAGE.search(str(exc)))


def lock_holder(exc: BaseException) -> str:
    match = _PID.search(str(exc))
    return f"process {match.group(1)}" if match else "another process"


def resolve(path: str | os.PathLike[str]) -> str:
    return str(Path(path).expanduser().resolve())


@contextlib.contextmanager
def open_store(path: str, *, read_only: bool, timeout: float = 10.0) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection to ``path`` held only for the ``with`` block.

    Waits up to ``timeout`` seconds for another process to let go of the file, then
    raises :class:`StoreLockedError` naming who holds it.
    """
    if read_only and not os.path.exists(path):
        raise StoreError(f"no loopscope store at {path} (run an instrumented agent, or `loopscope demo`, first)")
    deadline = time.monotonic() + timeout
    delay = 0.005
    with gate(path):
        while True:
            try:
                con = duckdb.connect(path, read_only=read_only)
                break
            except duckdb.Error as exc:
                if not is_lock_error(exc):
                    raise StoreError(f"cannot open the loopscope store {path}: {exc}") from exc
                if time.monotonic() >= deadline:
                    raise StoreLockedError(
                        f"the loopscope store {path} is held by {lock_holder(exc)} and was not released within "
                        f"{timeout:g}s. A loopscope writer lets go between batches; a program that keeps the file "
                        "open (a duckdb shell, a notebook) blocks everyone else until it closes it."
                    ) from None
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 0.1)
        try:
            yield con
        finally:
            con.close()
