"""DuckDB's engine, without the Python layer of the ``duckdb`` package when a read needs none.

The ``duckdb`` package (1.4 and later) is a Python layer (the relational API, expressions,
Arrow sources, its version read from the package's metadata) over the compiled engine,
the module ``_duckdb``, whose names it re-exports: ``duckdb.connect is _duckdb.connect``,
``duckdb.Error is _duckdb.Error``. Importing ``duckdb`` costs about 5x a bare interpreter's
start, the engine alone about 0.7x (``benchmarks/bench_startup.py``): a command that
connects, runs SQL and fetches rows needs nothing more, so the store's connections use the
engine, and ``loopscope turns`` does not pay for the rest.

This is the one module that names ``_duckdb``. Where the engine is no module of its own
(older ``duckdb`` releases), ``duckdb`` is the package itself. Code that hands DuckDB
Arrow tables (the writers) imports the package: it registers the Arrow sources with the
engine as it loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import duckdb
else:
    try:
        import _duckdb as duckdb
    except ImportError:  # a duckdb release from before the engine was a module of its own
        import duckdb

__all__ = ["duckdb"]
