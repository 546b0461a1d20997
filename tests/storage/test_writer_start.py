"""``configure(db)`` does not wait for the writer process: the child's imports and its check
of the store run while the application goes on (issue 29: it waited ~680 ms, where
``instrument()`` costs 80-95 ms). What the check then refuses is said once and counted as
lost, in ``loopscope status``. Real processes, real DuckDB files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider

import loopscope
from loopscope.cli.status import read_status
from loopscope.storage.duckdb import health
from recorded import connect_when_free
from store_files import newer_store


def _held_python(tmp_path: Path) -> tuple[Path, Path]:
    """A Python that starts only once a file exists: the writer process cannot have checked
    the store before the test says so (no timing involved)."""
    go = tmp_path / "go"
    path = tmp_path / "python-held"
    path.write_text(f"#!/bin/sh\nwhile [ ! -e {go} ]; do sleep 0.05; done\nexec {sys.executable} \"$@\"\n")
    path.chmod(0o755)
    return path, go


def test_configure_with_a_db_returns_before_the_writer_process_checked_the_store(tmp_path: Path, spawn) -> None:
    held, go = _held_python(tmp_path)
    db = tmp_path / "app.duckdb"
    app = spawn("app", f"""
        import sys
        from pathlib import Path
        import loopscope
        from opentelemetry.sdk.trace import TracerProvider

        sys.executable = {str(held)!r}  # the writer process starts once the test makes {go.name!r}
        pipeline = loopscope.configure({str(db)!r}, tracer_provider=TracerProvider())
        print(pipeline.writer_mode, flush=True)  # returned: the child has not even started Python
        with loopscope.turn(session_id="s", input="q") as t:
            t.generation("a", finish_reason="stop")
        Path({str(go)!r}).touch()
        assert loopscope.flush(60)
        print(pipeline.writer_mode, "duckdb" in sys.modules, flush=True)
        loopscope.shutdown()
    """)
    assert app.finish_ok(90).split() == ["starting", "process", "False"]
    con = connect_when_free(db)
    try:
        assert con.execute("SELECT count(*) FROM events WHERE session_id = 's'").fetchone() == (2,)
    finally:
        con.close()


def test_a_store_the_writer_process_refuses_is_said_once_and_its_events_counted_lost(tmp_path: Path, spawn) -> None:
    db = tmp_path / "newer.duckdb"
    newer_store(db)
    before = db.read_bytes()
    app = spawn("app", f"""
        import loopscope
        from opentelemetry.sdk.trace import TracerProvider

        pipeline = loopscope.configure({str(db)!r}, tracer_provider=TracerProvider())  # does not raise
        for i in range(5):
            with loopscope.turn(session_id=f"s{{i}}", input="q") as t:
                t.generation("a", finish_reason="stop")
        print(loopscope.flush(60), flush=True)  # not written
        loopscope.shutdown()
    """)
    assert app.finish_ok(90).split() == ["False"]
    err = app.err.read_text()
    assert err.count("upgrade loopscope to use it; events for") == 1, err  # said once, when found
    assert "10 events and 5 turns could not be stored" in err  # and counted in the store's rows, at the close
    assert db.read_bytes() == before  # left as it was
    [lost] = health.read_beside(str(db)).values()
    # five turns, as the store counts them: their input and generation (events), their summary (a turn)
    assert lost["dropped_unwritable"] + lost["dropped_queue_full"] == 10
    assert lost["turns_dropped_unwritable"] + lost["turns_dropped_queue_full"] == 5
    # `loopscope status` says so (it cannot read the store itself: a newer loopscope's)
    env = {k: v for k, v in os.environ.items() if k != "LOOPSCOPE_DB"}
    done = subprocess.run([sys.executable, "-m", "loopscope", "--db", str(db), "status", "--json"], capture_output=True,
                          text=True, timeout=120, env=env, check=False)
    assert "newer loopscope" in done.stdout + done.stderr
    if done.returncode == 0:
        assert json.loads(done.stdout)


def test_the_writer_process_holds_what_its_bounds_allow_under_a_flood_and_counts_the_rest(tmp_path: Path) -> None:
    """Another process holds the store (the writer cannot write): the writer process keeps its
    queue and the rows it failed to write within ``queue_bytes`` each, as the application's
    queue is, and what it drops is counted in ``loopscope status`` once the store is free."""
    db = tmp_path / "held.duckdb"
    bound = 1 << 20
    pipeline = loopscope.configure(db, tracer_provider=TracerProvider(), writer="process", queue_bytes=bound)
    try:
        with loopscope.turn(session_id="warm", input="q") as t:
            t.generation("a", finish_reason="stop")
        assert loopscope.flush(60)  # the writer process runs, the store is made
        hold = "import duckdb, sys; c = duckdb.connect(sys.argv[1]); print('held', flush=True); sys.stdin.read()"
        holder = subprocess.Popen([sys.executable, "-c", hold, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
            text = "lorem ipsum " * 170  # ~2 KB, three times a turn: ~30 MB of spans as the bound counts them
            for i in range(2000):
                with loopscope.turn(session_id=f"flood-{i % 50}", input=text) as t:
                    t.generation(text, finish_reason="stop")
            stats = pipeline.stats()  # the writer process's counters, asked for
            assert stats is not None and stats.dropped > 0
            # the application's queue, the writer process's queue and the rows it keeps: each bounded
            assert stats.queued_bytes <= 3 * bound + 64 * 1024, stats
        finally:
            assert holder.stdin is not None
            holder.stdin.close()
            holder.wait(30)
        loopscope.flush(60)
        dropped = pipeline.stats().dropped  # type: ignore[union-attr]
    finally:
        loopscope.shutdown()
    totals = read_status(str(db))["totals"]
    assert totals["dropped_queue_full"] + totals["dropped_unwritable"] == dropped > 0, totals


PATH_WATCH = """
import os, sys
db = os.path.realpath(sys.argv[1])
touched = []

def watch(event, args):
    # this process's own opens that create a file, and its removals, at the store's path
    if event == "open" and args and isinstance(args[0], str) and os.path.realpath(args[0]) == db:
        flags = args[2] if len(args) > 2 and isinstance(args[2], int) else 0
        if flags & os.O_CREAT:
            touched.append("create")
    elif event in ("os.remove", "os.unlink") and args and os.path.realpath(str(args[0])) == db:
        touched.append("remove")

sys.addaudithook(watch)
import loopscope
loopscope.configure(db, writer="process")
with loopscope.turn(session_id="s", input="hi") as turn:
    turn.generation("hello")
assert loopscope.flush(60)
loopscope.shutdown()
print(touched)
"""


def test_configure_never_makes_or_removes_a_file_at_the_stores_path(tmp_path: Path) -> None:
    """Where no store is there yet, configure() checks that the folder takes a file with a file
    of its own: one made and removed at the store's path itself could be the very file another
    process's writer, or a `loopscope tail` waiting for it, had just opened (whose rows then
    went to a removed file, and the follower stayed on it)."""
    db = tmp_path / "store.duckdb"
    done = subprocess.run([sys.executable, "-c", PATH_WATCH, str(db)], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert loopscope.Store(str(db)).last_indices() == {"s": 2}
    assert not list(tmp_path.glob(".loopscope-probe-*"))


def test_the_writer_process_starts_without_pydantic() -> None:
    """Every store's writer process imports what it maps and writes with, not the public models
    (pydantic's ~0.1 s, paid again by each writer start: docs/architecture.md, _segments.py)."""
    code = "import sys, loopscope.ingest.writer_child; print(sorted(m for m in ('pydantic', 'loopscope.models') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-I", "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
