"""The close under load, and readers beside writers (issue 30): several applications end
while their writers take turns at the file with each other, with hostile SQL and with a
program that holds the store; a writer with a short flush interval records while
``loopscope tail --follow`` and ``loopscope ui``'s API read the store without a pause.

Each application records its turns through the real openai SDK against the fake model
server, its writer a process of its own (the default), with a short flush interval. What
a writer accepted is written, however long the file stays busy after the applications
ended (the writer process writes on after its application is gone), or, past the
``close_timeout`` the user sets, counted; ``loopscope status`` agrees with what the
applications sent, and no process prints a fatal error at its end."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider

import loopscope
from fakes.model_server import FakeModelServer
from loopscope.cli.status import read_status

APPS = 4
TURNS = 40  # per application: half before the store is held, half while it is
EVENTS_PER_TURN = 2  # a stitched call without tools: its user message and its answer

APP = """
    import pathlib, sys, time
    import loopscope, openai

    base_url, db, name, go = sys.argv[1], sys.argv[2], sys.argv[3], pathlib.Path(sys.argv[4])
    turns = int(sys.argv[5])
    loopscope.configure(db=db, flush_interval=0.05)
    loopscope.instrument()
    client = openai.OpenAI(base_url=base_url, api_key="sk-test", max_retries=0)

    def call(i):
        client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": f"{name} question {i}"}])

    for i in range(turns // 2):
        call(i)
    print("flushed", loopscope.flush(timeout=60), flush=True)
    print("writer", loopscope.pipeline.active().writer.child_pid(), flush=True)
    while not go.exists():  # the test holds the store now
        time.sleep(0.01)
    for i in range(turns // 2, turns):
        call(i)
    print("recorded", flush=True)
"""

SQL_LOOP = """
    import pathlib, sys
    from loopscope import Store

    store, stop = Store(sys.argv[1], lock_timeout=60), pathlib.Path(sys.argv[2])
    ran = 0
    while not stop.exists():
        store.sql("SELECT count(*) FROM range(1000000) t(x) JOIN (SELECT count(*) AS n FROM events) ON x % 7 = n % 7")
        ran += 1
        if ran == 1:
            print("running", flush=True)
    print("queries", ran)
"""


HOLDER = """
    import pathlib, sys, time
    import duckdb

    while True:  # the file is busy (writers, the SQL): wait for a moment it is free
        try:
            con = duckdb.connect(sys.argv[1])  # read-write: nobody else can open the file now
            break
        except duckdb.IOException:
            time.sleep(0.005)
    pathlib.Path(sys.argv[2]).write_text("holding")
    release = pathlib.Path(sys.argv[3])
    while not release.exists():
        time.sleep(0.02)
    con.close()
"""
"""Holds the store open for writing (as a ``duckdb`` shell or a notebook would) until the
file named by its third argument exists (``HOLDER db holding release``)."""


def _wait_for(condition, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _gone(pid: int) -> bool:
    """Whether process ``pid`` (not a child of this one: a writer process of an application)
    has ended (a zombie nobody reaps counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _line(child, prefix: str) -> str | None:
    for line in child.out.read_text().splitlines():
        if line.startswith(prefix):
            return line[len(prefix):].strip()
    return None


def _run(tmp_path: Path, spawn, model_server: FakeModelServer, *, release_when_apps_end: bool) -> tuple[Path, list, list[int]]:
    """Apps record half their turns, then the store is held (by a program that keeps it open)
    while they record the rest and end, with SQL run on the store in a loop all along. The
    holder lets go once the applications ended (``release_when_apps_end``), or once their
    writer processes ended. Returns the store, the applications and their writers' pids."""
    db = tmp_path / "load.duckdb"
    loopscope.configure(db, tracer_provider=TracerProvider())  # the store exists, with its schema
    loopscope.shutdown()
    stop = tmp_path / "stop-sql"
    sql = spawn("sql", SQL_LOOP, db, stop)
    _wait_for(lambda: _line(sql, "running") is not None or not sql.running(), "the SQL loop never ran")
    assert sql.running(), sql.output()
    go = tmp_path / "go"
    apps = [spawn(f"app{n}", APP, model_server.openai_base_url, db, f"app{n}", go, TURNS) for n in range(APPS)]
    _wait_for(lambda: all(_line(app, "writer") is not None or not app.running() for app in apps), "apps never recorded")
    for app in apps:
        assert _line(app, "flushed") == "True", app.output()
    writers = [int(_line(app, "writer") or 0) for app in apps]
    holding, release = tmp_path / "holding", tmp_path / "release"
    holder = spawn("holder", HOLDER, db, holding, release)
    _wait_for(lambda: holding.exists() or not holder.running(), "the holder never held the store")
    assert holder.running(), holder.output()
    go.write_text("go")
    for app in apps:
        assert app.wait(120) == 0, app.output()
        assert _line(app, "recorded") == "", app.output()
    if not release_when_apps_end:
        _wait_for(lambda: all(_gone(pid) for pid in writers), "the writer processes did not end at their bound")
    release.write_text("go")
    assert holder.wait(60) == 0, holder.output()
    _wait_for(lambda: all(_gone(pid) for pid in writers), "the writer processes did not end")
    stop.write_text("stop")
    assert sql.wait(120) == 0, sql.output()
    for app in apps:
        assert "Fatal Python error" not in app.err.read_text(), app.output()
        assert "Traceback" not in app.err.read_text(), app.output()
    return db, apps, writers


def test_what_the_writers_accepted_is_written_after_their_applications_end_on_a_busy_store(
    tmp_path: Path, spawn, model_server: FakeModelServer
) -> None:
    """The store is held past the applications' exit (5 s bound): their writer processes,
    handed everything, write it once the file is free; nothing lost, nothing counted."""
    db, _, _ = _run(tmp_path, spawn, model_server, release_when_apps_end=True)
    status = read_status(str(db))
    assert status["turns"] == APPS * TURNS, status
    assert status["events"] == APPS * TURNS * EVENTS_PER_TURN, status
    assert status["totals"]["dropped_unwritable"] == 0 and status["totals"]["dropped_queue_full"] == 0, status["writers"]
    assert sum(w["events_written"] for w in status["writers"]) == APPS * TURNS * EVENTS_PER_TURN, status["writers"]
    assert all(w["alive"] == "stopped" for w in status["writers"]), status["writers"]
    assert not any("lost" in line for line in status["problems"]), status["problems"]


def test_past_close_timeout_a_writer_process_counts_what_it_could_not_write(
    tmp_path: Path, spawn, model_server: FakeModelServer, monkeypatch
) -> None:
    """The store stays held until the writer processes give up at the bound the user set
    (``LOOPSCOPE_CLOSE_TIMEOUT``): the first half is stored, and the rest is counted as
    lost in ``loopscope status``, not dropped in silence."""
    monkeypatch.setenv("LOOPSCOPE_CLOSE_TIMEOUT", "2")
    db, _, _ = _run(tmp_path, spawn, model_server, release_when_apps_end=False)
    status = read_status(str(db))
    half = APPS * TURNS // 2
    assert status["turns"] == half and status["events"] == half * EVENTS_PER_TURN, status
    assert status["totals"]["dropped_unwritable"] >= half * EVENTS_PER_TURN, status["writers"]
    assert any("lost" in line for line in status["problems"]), status["problems"]
    assert os.path.exists(str(db))


POLLED = ("overview", "sessions", "turns", "tools", "declared")


def _loopscope(tmp_path: Path, name: str, *args: object) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """A ``loopscope`` command of the user's, its output in files."""
    out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "LOOPSCOPE_"))}
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "loopscope", *map(str, args)], env=env, stdout=stdout, stderr=stderr)
    return proc, out, err


def test_a_writer_beside_tail_follow_and_the_dashboard_loses_nothing(
    tmp_path: Path, spawn, model_server: FakeModelServer
) -> None:
    """Two applications record with a 10 ms flush interval while ``tail --follow`` reads every
    20 ms and the dashboard's API is asked without a pause: the readers hold the file only
    for their reads, so every event is stored (status: nothing lost) and tail prints each once."""
    db = tmp_path / "read.duckdb"
    loopscope.configure(db, tracer_provider=TracerProvider())
    loopscope.shutdown()
    tail, tail_out, tail_err = _loopscope(tmp_path, "tail", "tail", "--follow", "--json", "--interval", "0.02", "--db", db)
    ui, ui_out, ui_err = _loopscope(tmp_path, "ui", "ui", "--port", "0", "--db", db)
    stop = threading.Event()
    answered: list[int] = []
    poller = threading.Thread()
    try:
        _wait_for(lambda: "http://" in ui_out.read_text() or ui.poll() is not None, "the dashboard never listened")
        url = re.search(r"http://\S+", ui_out.read_text())
        assert url is not None, ui_err.read_text()
        base = url.group(0).rstrip("/")

        def poll() -> None:
            while not stop.is_set():
                for page in POLLED:
                    with urllib.request.urlopen(f"{base}/api/{page}", timeout=60) as answer:
                        answered.append(answer.status)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        _wait_for(lambda: len(answered) >= len(POLLED), "the dashboard never answered")
        go = tmp_path / "go"
        go.write_text("go")  # no pause half way
        apps = [spawn(f"app{n}", APP.replace("flush_interval=0.05", "flush_interval=0.01"), model_server.openai_base_url,
                      db, f"app{n}", go, TURNS) for n in range(2)]
        for app in apps:
            assert app.wait(120) == 0, app.output()
            assert "Fatal Python error" not in app.err.read_text(), app.output()
        writers = [int(_line(app, "writer") or 0) for app in apps]
        _wait_for(lambda: all(_gone(pid) for pid in writers), "the writer processes did not end")
        expected = 2 * TURNS * EVENTS_PER_TURN
        _wait_for(lambda: len(tail_out.read_text().splitlines()) >= expected or tail.poll() is not None,
                  "tail --follow did not print every event")
    finally:
        stop.set()
        if poller.ident is not None:
            poller.join(60)
        for proc in (tail, ui):
            if proc.poll() is None:
                proc.send_signal(2)  # Ctrl-C, as a user would
            proc.wait(30)
    assert ui.returncode == 0 and tail.returncode == 0, (ui_err.read_text(), tail_err.read_text())
    assert answered and set(answered) == {200}
    printed = [json.loads(line) for line in tail_out.read_text().splitlines()]
    assert len(printed) == len({event["id"] for event in printed}) == expected
    status = read_status(str(db))
    assert status["events"] == expected and status["turns"] == 2 * TURNS, status
    assert status["totals"]["dropped_unwritable"] == 0 and status["totals"]["dropped_queue_full"] == 0, status["writers"]
    assert not any("lost" in line for line in status["problems"]), status["problems"]


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "60", True])
def test_a_close_timeout_that_is_no_number_of_seconds_is_refused_before_anything_changes(tmp_path: Path, bad: object) -> None:
    with pytest.raises(ValueError, match="close_timeout"):
        loopscope.configure(tmp_path / "bad.duckdb", tracer_provider=TracerProvider(), close_timeout=bad)  # type: ignore[arg-type]
    assert not (tmp_path / "bad.duckdb").exists()
