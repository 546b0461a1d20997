"""Short-lived connections to a store file, shared fairly between one writer and many readers.

DuckDB lets one process hold a file open for writing, and while it does no other
process can open it, not even read-only. So nobody keeps the file open: the writer
opens it for each batch and closes it again, readers open it for each query. A lock
met on the way is waited out briefly and retried; inside one process a lock per path
keeps our own writer and readers from colliding (DuckDB refuses two configurations of
one file in one process).

Readers do not start a DuckDB database of their own for each query: starting one costs
~15 ms (its catalog of built-in functions), more than a whole timeline page. They share
one in-memory database per process and ``ATTACH`` the store file read-only to it for the
query, ``DETACH`` after it (~1 ms): the file is still held only for the query.
"""

from __future__ import annotations

import contextlib
import itertools
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


def _locked(path: str, exc: BaseException, timeout: float) -> StoreLockedError:
    return StoreLockedError(
        f"the loopscope store {path} is held by {lock_holder(exc)} and was not released within "
        f"{timeout:g}s. A loopscope writer lets go between batches; a program that keeps the file "
        "open (a duckdb shell, a notebook) blocks everyone else until it closes it."
    )


_reader: tuple[int, duckdb.DuckDBPyConnection] | None = None
_reader_lock = threading.Lock()
_aliases = itertools.count(1)


def _reader_database() -> duckdb.DuckDBPyConnection:
    """The in-memory database readers attach store files to; a new one after a fork."""
    global _reader
    with _reader_lock:
        if _reader is None or _reader[0] != os.getpid():
            _reader = (os.getpid(), duckdb.connect(":memory:"))
        return _reader[1]


def _quiet(con: duckdb.DuckDBPyConnection) -> None:
    # DuckDB draws a progress bar on stdout for a query that runs over two seconds, into
    # the application's output (or a command's JSON): never for our connections
    con.execute("SET enable_progress_bar = false")


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


@contextlib.contextmanager
def _attached(path: str, timeout: float) -> Iterator[duckdb.DuckDBPyConnection]:
    """A cursor of the shared reader database with ``path`` attached read-only and in use."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    alias = f"loopscope_store_{next(_aliases)}"
    with gate(path):
        try:
            con = _reader_database().cursor()
        except duckdb.ConnectionException:  # closed under us somehow: start a new one
            global _reader
            with _reader_lock:
                _reader = None
            con = _reader_database().cursor()
        try:
            while True:
                try:
                    con.execute(f"ATTACH {_sql_text(path)} AS {alias} (READ_ONLY)")
                    break
                except duckdb.Error as exc:
                    if not is_lock_error(exc):
                        raise StoreError(f"cannot open the loopscope store {path}: {exc}") from exc
                    if time.monotonic() >= deadline:
                        raise _locked(path, exc, timeout) from None
                    time.sleep(delay * (0.5 + random.random()))
                    delay = min(delay * 2, 0.1)
            try:
                con.execute(f"USE {alias}")
                _quiet(con)
                yield con
            finally:
                _detach(con, alias)
        finally:
            con.close()


def _detach(con: duckdb.DuckDBPyConnection, alias: str) -> None:
    """Let go of the file: detach it, whatever state the block left the cursor in."""
    try:
        con.execute("ROLLBACK")  # a transaction the block left open (usually none)
    except duckdb.Error:
        pass
    try:
        con.execute("USE memory")
        con.execute(f"DETACH {alias}")
        return
    except duckdb.Error:
        pass
    # the block closed or broke its cursor: the attachment belongs to the database, so a
    # fresh cursor can still detach it
    try:
        other = _reader_database().cursor()
        try:
            other.execute(f"DETACH DATABASE IF EXISTS {alias}")
        finally:
            other.close()
    except duckdb.Error:
        # never keep holding the file: forget the shared database (it closes with its
        # last cursor) and start a fresh one for the next read
        global _reader
        with _reader_lock:
            _reader = None


@contextlib.contextmanager
def open_store(
    path: str, *, read_only: bool, timeout: float = 10.0, isolated: bool = False
) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection to ``path`` held only for the ``with`` block.

    Waits up to ``timeout`` seconds for another process to let go of the file, then
    raises :class:`StoreLockedError` naming who holds it. A read-only connection is the
    store file attached to the process's shared reader database (and made its default,
    so plain table names work); it is detached when the block ends. ``isolated=True``
    gives a read-only database of its own instead, for SQL that is not ours (it may
    attach files or change settings, which must not outlive it).
    """
    if read_only:
        if not os.path.exists(path):
            raise StoreError(f"no loopscope store at {path} (run an instrumented agent, or `loopscope demo`, first)")
        if not isolated:
            with _attached(path, timeout) as con:
                yield con
            return
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
                    raise _locked(path, exc, timeout) from None
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 0.1)
        try:
            _quiet(con)
            yield con
        finally:
            con.close()
