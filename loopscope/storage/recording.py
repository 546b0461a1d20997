"""The store this process records to, as :func:`loopscope.configure` set it.

Reads without a path read it, and a read of it first flushes what this process
recorded, so that it sees its own rows. The pipeline says which store that is
(:func:`set_current`); the store never imports the pipeline.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

DEFAULT_DB = "loopscope.duckdb"


def resolve(path: str | os.PathLike[str]) -> str:
    """A store's path as every part of loopscope names it: absolute, ``~`` expanded, links resolved."""
    return str(Path(path).expanduser().resolve())


def default_db_path() -> str:
    """``LOOPSCOPE_DB`` if set, else ``./loopscope.duckdb``."""
    return os.environ.get("LOOPSCOPE_DB") or DEFAULT_DB


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
