"""DuckDB's engine, without the Python layer of the ``duckdb`` package when a read needs none.

The ``duckdb`` package (1.4 and later) is a Python layer (the relational API, expressions,
Arrow sources, its version read from the package's metadata) over the compiled engine,
the module ``_duckdb``, whose names it re-exports: ``duckdb.connect is _duckdb.connect``,
``duckdb.Error is _duckdb.Error``. Importing ``duckdb`` costs about 5x a bare interpreter's
start, the engine alone about 0.7x (``benchmarks/bench_startup.py``): a command that
connects, runs SQL and fetches rows needs nothing more, so the store's connections use the
engine, and ``loopscope turns`` does not pay for the rest.

This is the one module that names ``_duckdb`` (and DuckDB's allocator: :func:`mallctl`), and ``LOOPSCOPE_DUCKDB_ENGINE=0`` turns it off
(the package itself then, as for a ``duckdb`` release whose engine is no module of its own). Code that hands DuckDB
Arrow tables (the writers) imports the package: it registers the Arrow sources with the
engine as it loads.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

# the switch off (or type checking): the public package
if TYPE_CHECKING or os.environ.get("LOOPSCOPE_DUCKDB_ENGINE", "1").strip() == "0":
    import duckdb
else:
    try:
        import _duckdb as duckdb
    except ImportError:  # a duckdb release from before the engine was a module of its own
        import duckdb

__all__ = ["duckdb"]


def mallctl() -> Any | None:
    """DuckDB's own ``mallctl`` (its Linux builds link a jemalloc of their own into the
    engine, its functions prefixed ``duckdb_je_``), as a ctypes function; None where there is
    none (a build with the system allocator: macOS, Windows), when the engine is not loaded,
    or with ``LOOPSCOPE_DUCKDB_PURGE=0``. A private name of DuckDB's library, so it is looked
    up here, beside ``_duckdb``, and behind its own switch: :mod:`~loopscope.storage.duckdb.allocator`
    uses it to give back what a batch freed."""
    import ctypes
    import sys

    if os.environ.get("LOOPSCOPE_DUCKDB_PURGE", "1").strip() == "0":
        return None
    path = getattr(sys.modules.get("_duckdb"), "__file__", None)
    if not isinstance(path, str):
        return None
    try:  # the engine is loaded already: this is the same library, the same jemalloc
        function = ctypes.CDLL(path).duckdb_je_mallctl
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    function.restype = ctypes.c_int
    return function
