"""The store this process records to, as :func:`loopscope.configure` set it.

Reads without a path read it, and a read of it first flushes what this process
recorded, so that it sees its own rows. The pipeline says which store that is
(:func:`set_current`); the store never imports the pipeline.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Protocol

DEFAULT_DB = "loopscope.duckdb"


def resolve(path: str | os.PathLike[str]) -> str:
    """A store's path as every part of loopscope names it: absolute, ``~`` expanded, links resolved."""
    return str(Path(path).expanduser().resolve())


PARENT_ENV = "LOOPSCOPE_PARENT_STORE"
"""``<pid>:<store>``: the store the process ``pid`` records to (set by ``configure()``), for its
``multiprocessing`` children started by spawn or forkserver, which run the application's module
afresh (its ``if __name__ == "__main__":`` block, where ``configure()`` usually is, not)."""


def default_db_path() -> str:
    """In a ``multiprocessing`` child of a process that records, that process's store
    (:data:`PARENT_ENV`); else ``LOOPSCOPE_DB`` if set, else ``./loopscope.duckdb``."""
    return parent_store() or os.environ.get("LOOPSCOPE_DB") or DEFAULT_DB


def parent_store() -> str | None:
    """The store of the process that started this one through ``multiprocessing`` (its
    ``parent_process()``), when that process records to one; None otherwise (a subprocess
    the application started otherwise, a grandchild: their environment may hold the value too)."""
    value = os.environ.get(PARENT_ENV)
    if not value:
        return None
    pid, _, path = value.partition(":")
    process = sys.modules.get("multiprocessing.process")
    parent = getattr(process, "parent_process", lambda: None)() if process is not None else None
    if parent is None or str(getattr(parent, "pid", None)) != pid:
        return None
    return path or None


def export_to_children(path: str | None) -> None:
    """Name ``path`` (None: no store) as this process's store for its ``multiprocessing`` children
    (:data:`PARENT_ENV`; the environment is what a spawned child inherits)."""
    if path is None:
        os.environ.pop(PARENT_ENV, None)
    else:
        os.environ[PARENT_ENV] = f"{os.getpid()}:{path}"


SHARE_ENV = "LOOPSCOPE_SHARE_DB"
_shared: set[str] = set()


def share_db(path: str) -> None:
    """Let loopscope put its tables in the database file at ``path`` beside the user's own
    (``configure(share_db=True)``); a file that is not loopscope's is refused otherwise."""
    _shared.add(resolve(path))


def shares(path: str) -> bool:
    """Whether loopscope may put its tables beside the user's in the file at ``path``: the
    user said so for it (:func:`share_db`) or for every file (``LOOPSCOPE_SHARE_DB=1``)."""
    if os.environ.get(SHARE_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        return True
    return bool(path) and resolve(path) in _shared


class Recording(Protocol):
    """What the reads need of the pipeline that records: its store and its writer."""

    db_path: str | None
    writer: Any  # a StoreWriter, or None when recording to the store is off


_current: Recording | None = None


def set_current(recording: Recording | None) -> None:
    """The pipeline that records now (None: none)."""
    global _current
    _current = recording


def configured_path() -> str | None:
    """The store the current pipeline records to, if any."""
    current = _current
    return current.db_path if current is not None else None


def flush_own(path: str) -> None:
    """Write what this process recorded to ``path`` so far (nothing when it records elsewhere)."""
    current = _current
    if current is not None and current.db_path == path and current.writer is not None:
        current.writer.flush()
