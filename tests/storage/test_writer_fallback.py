"""``writer="auto"``: the store's writer in a process of its own where one can run, the
thread where it cannot (a frozen application, no Python at ``sys.executable``, a child that
dies at once or never says it is ready), said once in a warning and in ``loopscope status``;
the spans recorded meanwhile all reach the file. Real processes, real DuckDB files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider

import loopscope
from loopscope.cli.status import read_status
from loopscope.storage.duckdb import health
from loopscope.storage.errors import StoreError
from recorded import connect_when_free

RECORDS = """
    import sys
    import loopscope
    from opentelemetry.sdk.trace import TracerProvider
    from loopscope.ingest import writer_process

    {setup}
    # the default store (./loopscope.duckdb): configure() does not wait for the writer process,
    # so the turns below are recorded before a child could have said it is ready (or been
    # found unable to start)
    pipeline = loopscope.configure(tracer_provider=TracerProvider(), writer={writer!r})
    for i in range(20):
        with loopscope.turn(session_id=f"s{{i}}", input="q") as t:
            t.generation("a", finish_reason="stop")
    assert loopscope.flush(60)
    print(pipeline.writer_mode, "duckdb" in sys.modules, flush=True)
    loopscope.shutdown()
"""


def _script(setup: str = "", writer: str = "auto") -> str:
    return RECORDS.format(setup=setup, writer=writer)


def _rows(db: Path) -> tuple[int, int]:
    con = connect_when_free(db)
    try:
        return con.execute("SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM turns)").fetchone()  # type: ignore[return-value]
    finally:
        con.close()


def _writer_rows(db: Path) -> list[tuple[object, object]]:
    return [(w["writer_mode"], w["app_pid"]) for w in read_status(str(db))["writers"]]


def _status_text(db: Path) -> str:
    """``loopscope status`` as a user runs it."""
    env = {k: v for k, v in os.environ.items() if k != "LOOPSCOPE_DB"}
    done = subprocess.run([sys.executable, "-m", "loopscope", "--db", str(db), "status"], capture_output=True, text=True,
                          timeout=120, env=env, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_auto_runs_the_writer_process_where_it_can_and_status_names_it(tmp_path: Path, spawn) -> None:
    db = tmp_path / "loopscope.duckdb"
    app = spawn("app", _script())
    assert app.finish_ok(90).split() == ["process", "False"]  # DuckDB never loaded by the application
    assert _rows(db) == (40, 20)
    assert _writer_rows(db) == [("process", app.pid)]
    assert "runs in a thread" not in app.err.read_text()
    assert f"process of {app.pid}" in _status_text(db)


@pytest.mark.writer_fallback
def test_a_frozen_application_records_with_the_thread_writer_and_says_so_once(tmp_path: Path, spawn) -> None:
    db = tmp_path / "loopscope.duckdb"
    app = spawn("app", _script("sys.frozen = True  # as PyInstaller sets it"))
    assert app.finish_ok(90).split() == ["thread", "True"]
    assert _rows(db) == (40, 20)
    assert _writer_rows(db) == [("thread", None)]
    [row] = [line.split() for line in _status_text(db).splitlines() if f" {app.pid} " in line]  # the writer's row
    assert row[row.index(str(app.pid)) + 1] == "thread"
    assert app.err.read_text().count("the store's writer runs in a thread: the application is a frozen executable") == 1


def _fake_python(tmp_path: Path, body: str) -> Path:
    """An executable named as a Python is, that is none (a broken or foreign interpreter)."""
    path = tmp_path / "python-fake"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


@pytest.mark.writer_fallback
def test_an_executable_that_is_no_python_by_its_name_is_not_started(tmp_path: Path, spawn) -> None:
    """``sys.executable`` a program that embeds Python (uWSGI, Blender): never run with the
    child's arguments; the thread writer runs, said once."""
    db = tmp_path / "loopscope.duckdb"
    app = spawn("app", _script("sys.executable = '/usr/bin/env'"))
    assert app.finish_ok(90).split()[0] == "thread"
    assert _rows(db) == (40, 20)
    err = app.err.read_text()
    assert err.count("runs in a thread: sys.executable (/usr/bin/env) is no Python interpreter by its name") == 1, err
    assert "LOOPSCOPE_WRITER=thread" in err  # how to ask for it without the warning


@pytest.mark.writer_fallback
def test_a_writer_process_that_dies_at_once_hands_every_span_to_the_thread_writer(tmp_path: Path, spawn) -> None:
    """``sys.executable`` a Python that cannot start the child (it exits at once): the spans
    recorded before that was known are written by the thread writer, none lost, with one
    warning."""
    db = tmp_path / "loopscope.duckdb"
    app = spawn("app", _script(f"sys.executable = {str(_fake_python(tmp_path, 'exit 3'))!r}"))
    assert app.finish_ok(90).split()[0] == "thread"
    assert _rows(db) == (40, 20)
    assert _writer_rows(db) == [("thread", None)]
    status = read_status(str(db))
    assert status["totals"]["dropped_queue_full"] == status["totals"]["dropped_unwritable"] == 0
    err = app.err.read_text()
    assert err.count("the store's writer runs in a thread: the writer process ended at once") == 1, err
    assert "exit status 3" in err


@pytest.mark.writer_fallback
def test_a_writer_process_that_never_says_it_is_ready_is_replaced_by_the_thread_writer(tmp_path: Path, spawn) -> None:
    silent = _fake_python(tmp_path, "exec sleep 120")  # starts, reads nothing, says nothing
    setup = f"sys.executable = {str(silent)!r}; writer_process.READY_WAIT = 1.0"
    db = tmp_path / "loopscope.duckdb"
    app = spawn("app", _script(setup))
    assert app.finish_ok(90).split()[0] == "thread"
    assert _rows(db) == (40, 20)
    assert "said nothing for 1 s after its start" in app.err.read_text()


def test_writer_process_asked_for_explicitly_does_not_fall_back(tmp_path: Path, spawn) -> None:
    """``writer="process"`` keeps its meaning: no thread writer (no DuckDB in the
    application); a child that cannot start costs the spans, dropped and counted."""
    db = tmp_path / "loopscope.duckdb"
    code = _script("sys.executable = '/bin/false'", writer="process").replace("assert loopscope.flush(60)",
                                                                               "assert not loopscope.flush(60)")
    app = spawn("app", code)
    assert app.finish_ok(90).split() == ["process", "False"]
    assert "runs in a thread" not in app.err.read_text()
    assert not db.exists()  # no writer ever opened it
    [lost] = health.read_beside(str(db)).values()  # counted beside it, where `loopscope status` reads
    # counted as the store's rows: a turn's input and generation (events) and its summary (a turn)
    assert lost["dropped_unwritable"] + lost["dropped_queue_full"] == 40
    assert lost["turns_dropped_unwritable"] + lost["turns_dropped_queue_full"] == 20


def test_a_db_given_to_configure_that_is_no_store_raises_with_the_writer_process_too(tmp_path: Path) -> None:
    """``configure(db=...)`` raises for a file that is no DuckDB database, as with the thread
    writer, without waiting for the writer process (its header says so)."""
    notes = tmp_path / "notes.duckdb"
    notes.write_text("my notes, not a database\n" * 200)
    with pytest.raises(StoreError, match="loopscope store"):
        loopscope.configure(notes, tracer_provider=TracerProvider(), writer="auto")
    loopscope.shutdown()
    assert notes.read_text() == "my notes, not a database\n" * 200
