"""What DuckDB's allocator and the C heap keep after a write, given back to the system.

DuckDB's Linux builds allocate through a jemalloc of their own, linked into the engine
(``_duckdb*.so``, its functions prefixed ``duckdb_je_``). What a batch freed stays in
jemalloc's arenas as dirty pages, to be reused or returned after a decay time that only
DuckDB's next allocation measures: a writer idle between batches keeps them all. In the
writer process they were 13-32 MB after a batch (``stats.resident`` against 2 MB
``stats.allocated``), and most of what its anonymous memory grew by after its start
(``benchmarks/bench_memory.py``). :func:`give_back` purges every arena (jemalloc's
``arena.<all>.purge``, what DuckDB itself runs when a database closes) and the calling
thread's cache, and in the writer process trims the C heap too (glibc's ``malloc_trim``:
Arrow's batches, Python's large objects): ~1-2 ms a batch, where DuckDB's ``allocator_flush_threshold`` at ``0b``,
which flushes inside every statement, cost the writer a third more CPU.

Nothing here is needed for correctness: on a platform or a DuckDB build without either
allocator, :func:`give_back` does what it can and nothing else. ``LOOPSCOPE_DUCKDB_PURGE=0``
turns the purge off (DuckDB's allocator is found by a private name of its library:
:func:`~loopscope.storage.duckdb.engine.mallctl`).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from ..._guard import guarded
from . import engine

_ARENAS_ALL = 4096
"""jemalloc's ``MALLCTL_ARENAS_ALL``: ``arena.4096.purge`` purges every arena (jemalloc 5)."""

_lock = threading.Lock()
_loaded: tuple[Any, Any] | None = None


def _functions() -> tuple[Any, Any]:
    """DuckDB's ``mallctl`` and glibc's ``malloc_trim``, each None where there is none (looked up once)."""
    global _loaded
    with _lock:
        if _loaded is None:
            mallctl, trim = engine.mallctl(), None
            try:
                trim = ctypes.CDLL("libc.so.6").malloc_trim
                trim.argtypes = [ctypes.c_size_t]
            except (OSError, AttributeError):
                trim = None
            _loaded = (mallctl, trim)
        return _loaded


@guarded("allocator give-back")
def give_back(c_heap: bool = False) -> None:
    """Hand back to the system the pages DuckDB's allocator keeps free (after a write, once
    its database is detached), and with ``c_heap`` the C heap's too. Safe while DuckDB runs:
    jemalloc locks each arena. The C heap is the whole process's: trimmed only where the
    process is the writer's own (``writer_child``), never inside an application, whose
    threads would wait on its arenas' locks meanwhile."""
    mallctl, trim = _functions()
    if mallctl is not None:
        mallctl(b"thread.tcache.flush", None, None, None, 0)  # this thread's cache, into its arena
        mallctl(f"arena.{_ARENAS_ALL}.purge".encode(), None, None, None, 0)
    if c_heap and trim is not None:
        trim(0)


def kept() -> tuple[int, int] | None:
    """DuckDB's allocator now, in bytes: what is allocated, and what it holds in pages
    (jemalloc's ``stats.allocated`` and ``stats.resident``: the difference is free but kept).
    None without it. What the tests and the benchmark read."""
    mallctl, _ = _functions()
    if mallctl is None:
        return None
    epoch = ctypes.c_uint64(1)
    size = ctypes.c_size_t(ctypes.sizeof(epoch))
    mallctl(b"epoch", ctypes.byref(epoch), ctypes.byref(size), ctypes.byref(epoch), ctypes.sizeof(epoch))
    out = []
    for name in (b"stats.allocated", b"stats.resident"):
        value = ctypes.c_size_t(0)
        size = ctypes.c_size_t(ctypes.sizeof(value))
        if mallctl(name, ctypes.byref(value), ctypes.byref(size), None, 0) != 0:
            return None
        out.append(value.value)
    return out[0], out[1]
