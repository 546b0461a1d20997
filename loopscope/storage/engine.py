"""DuckDB's engine, without the Python layer of the ``duckdb`` package when a read needs none.

The ``duckdb`` package (1.4 and later) is a Python layer (the relational API, expressions,
Arrow sources, its version read from the package's metadata) over the compiled engine,
the module ``_duckdb``, whose names it re-exports: ``duckdb.connect is _duckdb.connect``,
``duckdb.Error is _duckdb.Error``. Importing ``duckdb`` costs about 5x a bare interpreter's
start, the engine alone about 0.7x (``benchmarks/bench_startup.py``): a command that
connects, runs SQL and fetches rows needs nothing more, so the store's connections use the
engine, and ``loopscope turns`` does not pay for the rest.

This is the one module that names ``_duckdb``, and ``LOOPSCOPE_DUCKDB_ENGINE=0`` turns it off
(the package itself then, as for a ``duckdb`` release whose engine is no module of its own). Code that hands DuckDB
Arrow tables (the writers) imports the package: it registers the Arrow sources with the
engine as it loads.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

# the switch off (or type checking): the public package
if TYPE_CHECKING or os.environ.get("LOOPSCOPE_DUCKDB_ENGINE", "1").strip() == "0":
    import duckdb
else:
    try:
        import _duckdb as duckdb
    except ImportError:  # a duckdb release from before the engine was a module of its own
        import duckdb

__all__ = ["duckdb"]


def library() -> str | None:
    """The file of DuckDB's compiled engine, once loaded (None when it is not, or has no file):
    where :mod:`~loopscope.storage.allocator` finds DuckDB's own allocator."""
    import sys

    module = sys.modules.get("_duckdb")
    path = getattr(module, "__file__", None)
    return path if isinstance(path, str) else None
