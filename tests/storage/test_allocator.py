"""The store's writer gives back to the system what DuckDB's allocator kept after a batch.

DuckDB's Linux builds allocate through a jemalloc of their own, which keeps the pages a
batch freed until DuckDB allocates again: a writer idle between batches kept them all (the
writer process's anonymous memory grew by 13-32 MB after each batch, see
``benchmarks/bench_memory.py``, where the memory itself is measured). Here: the allocator's
own counters (what it has allocated, what it holds) after calls recorded through the real
openai SDK and flushed, and the rows all stored.
"""

from __future__ import annotations

import os

import duckdb
import pytest

import loopscope
from loopscope.storage.duckdb import allocator
from recorded import connect_when_free

MiB = 1 << 20

pytestmark = pytest.mark.skipif(allocator.kept() is None, reason="this DuckDB build has no jemalloc of its own (not Linux)")

CALLS = 40
TEXT = "the tool said it is 21 degrees and dry in Paris, with a light breeze from the west. " * 600  # ~50 KB a message


def _excess() -> int:
    """What DuckDB's allocator holds beyond what it has allocated, in bytes."""
    kept = allocator.kept()
    assert kept is not None
    return kept[1] - kept[0]


def _baseline() -> int:
    """The excess left once everything freed so far is given back: jemalloc's metadata and
    partly used slabs of this test worker's earlier tests (5-7 MB in a fresh process, about
    20 MB after a few hundred tests), which this test does not measure."""
    allocator.give_back()
    return _excess()


def _record(model_server) -> None:
    client = model_server.openai_client()
    for i in range(CALLS):
        client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": f"{i}: {TEXT}"}])
    assert loopscope.flush(timeout=60)


@pytest.mark.thread_writer  # in this process, where the test reads the allocator's counters
def test_after_a_flush_duckdbs_allocator_holds_little_more_than_it_uses(instrumented, model_server) -> None:
    base = _baseline()
    _record(model_server)
    # beyond what the process held before: not the pages the batches freed (31-36 MB
    # without the writer's give-back)
    assert _excess() - base < 12 * MiB, (base, allocator.kept())
    con = connect_when_free(instrumented.db)
    try:
        assert con.execute("SELECT count(*) FROM model_calls").fetchone() == (CALLS,)
    finally:
        con.close()


def test_give_back_returns_the_pages_a_query_freed() -> None:
    base = _baseline()
    con = duckdb.connect(":memory:")
    try:
        con.execute("SET threads = 1")
        # a sort of ~50 MB of strings: DuckDB allocates and frees it in its own allocator
        con.execute("SELECT count(*) FROM (SELECT repeat('x', 400) || i AS s FROM range(120000) t(i) ORDER BY s DESC)").fetchall()
        before = allocator.kept()
        allocator.give_back()
        after = allocator.kept()
    finally:
        con.close()
    assert before is not None and after is not None
    assert before[1] - before[0] - base > 24 * MiB, (base, before)  # the sort's pages, freed but kept
    assert after[1] - after[0] - base < 12 * MiB, (base, before, after)


def test_the_purge_switch_off_leaves_duckdbs_allocator_alone() -> None:
    """``LOOPSCOPE_DUCKDB_PURGE=0``: DuckDB's allocator is not looked up (its ``mallctl`` is a
    private name of DuckDB's library), so nothing is purged, and a write still works."""
    import subprocess
    import sys

    script = (
        "import duckdb\n"
        "from loopscope.storage.duckdb import allocator, engine\n"
        "duckdb.connect().execute('SELECT 1').fetchall()\n"
        "allocator.give_back(c_heap=True)\n"
        "print(engine.mallctl() is None, allocator.kept() is None)\n"
    )
    for switch, expected in (("0", "True True"), ("1", "False False")):
        env = {**os.environ, "LOOPSCOPE_DUCKDB_PURGE": switch}
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == expected, (switch, done.stdout, done.stderr)


_BLOCKS_SCRIPT = """
import ctypes, os, sys
import duckdb
from loopscope.storage.duckdb import connection

class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = Mallinfo2
path = sys.argv[1]
con = duckdb.connect(path)
con.execute("CREATE TABLE t (a INTEGER, b VARCHAR)")
con.close()

def batches(n):
    for i in range(n):
        with connection.open_store(path, read_only=False) as block:
            block.execute("INSERT INTO t VALUES (?, ?)", [i, "x" * 100])

batches(50)  # DuckDB's and Python's first allocations
before = libc.mallinfo2().uordblks
batches(600)
print(libc.mallinfo2().uordblks - before)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="glibc's heap counters (Linux)")
def test_a_writers_heap_does_not_grow_with_the_batches_it_writes(tmp_path) -> None:
    """DuckDB keeps ~3 KB of C++ memory (glibc's heap, outside its allocator and buffer
    manager) for each write block attached to its database, ~35 KB a batch in the writer
    process: a writer's memory grew with every batch it wrote, until its database was
    closed (``connection.RENEW_AFTER``). 600 write blocks here, in a process of their own
    (the C heap is the process's): ~1.8 MB kept without the renewal."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _BLOCKS_SCRIPT, str(tmp_path / "s.duckdb")],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    grown = int(done.stdout.strip().splitlines()[-1])
    assert grown < 700 * 1024, grown
