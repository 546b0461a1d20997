"""The store writer's batches: what each one writes besides the events (session counters,
its own row), and when it writes them (after the first queued row has waited the interval,
which by default follows the writer's own cost)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from opentelemetry.sdk.trace import TracerProvider

import loopscope
from loopscope.ingest.writer import SPANS
from loopscope.storage.duckdb import writer
from loopscope.storage.queries import open_sink
from recorded import connect_when_free


def _turn(session: str, text: str) -> None:
    @loopscope.tool
    def lookup(q: str) -> str:
        return q.upper()

    with loopscope.turn(session_id=session, agent="a", input=text, tools=[lookup]) as t:
        t.generation("looking up", tool_calls=[{"id": f"c-{session}-{text}", "name": "lookup", "arguments": {"q": text}}])
        lookup(text)
        t.generation(f"answer to {text}")


def _read(db, sql: str):
    con = connect_when_free(db)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def _count_elsewhere(db) -> int | None:
    """The events another process sees in the file (as a dashboard or the CLI would);
    None when it could not read them."""
    code = "import duckdb, sys; print(duckdb.connect(sys.argv[1], read_only=True).execute('SELECT count(*) FROM events').fetchone()[0])"
    probe = subprocess.run([sys.executable, "-c", code, str(db)], capture_output=True, text=True, timeout=60, check=False)
    return int(probe.stdout) if probe.returncode == 0 else None


def test_a_batch_of_known_and_new_sessions_numbers_each_on_from_its_own_last_index(recording):
    _turn("known", "q1")
    assert loopscope.flush()
    _turn("known", "q2")  # this batch: a session the file has, and one it has not
    _turn("new", "q1")
    assert loopscope.flush()
    loopscope.shutdown()
    indices = _read(recording.db, "SELECT session_id, list(idx ORDER BY idx) FROM events GROUP BY session_id ORDER BY 1")
    assert indices == [("known", list(range(1, 11))), ("new", [1, 2, 3, 4, 5])]
    sessions = _read(recording.db, "SELECT session_id, last_index, first_at <= last_at FROM sessions ORDER BY 1")
    assert sessions == [("known", 10, True), ("new", 5, True)]
    first, last = _read(recording.db, "SELECT min(created_at), max(created_at) FROM events WHERE session_id = 'known'")[0]
    assert _read(recording.db, "SELECT first_at, last_at FROM sessions WHERE session_id = 'known'") == [(first, last)]


def test_a_batch_of_known_sessions_only_moves_their_counters_on(recording):
    # the three ways a batch writes session counters (all new, all known, both) in turn
    _turn("a", "q1")
    assert loopscope.flush()
    _turn("a", "q2")
    _turn("b", "q1")
    assert loopscope.flush()
    _turn("a", "q3")
    _turn("b", "q2")
    assert loopscope.flush()
    loopscope.shutdown()
    assert _read(recording.db, "SELECT session_id, last_index FROM sessions ORDER BY 1") == [("a", 15), ("b", 10)]
    spans = _read(recording.db, "SELECT session_id, min(created_at), max(created_at) FROM events GROUP BY 1 ORDER BY 1")
    assert _read(recording.db, "SELECT session_id, first_at, last_at FROM sessions ORDER BY 1") == spans


def test_the_writer_keeps_one_row_of_its_own_up_to_date_across_batches(recording):
    for n in range(3):
        _turn("s", f"q{n}")
        assert loopscope.flush()
    rows = _read(recording.db, "SELECT events_written, turns_written, stopped_at IS NULL FROM loopscope_writers")
    assert rows == [(15, 3, True)]
    loopscope.shutdown()
    assert _read(recording.db, "SELECT events_written, stopped_at IS NOT NULL FROM loopscope_writers") == [(15, True)]


def test_by_default_rows_reach_the_file_within_seconds_without_a_flush_or_a_reader(tmp_path):
    db = tmp_path / "auto.duckdb"
    loopscope.configure(db, tracer_provider=TracerProvider())
    try:
        _turn("s", "q")
        started = time.monotonic()
        count = 0
        while time.monotonic() - started < 10 and count < 5:
            time.sleep(0.05)
            # another process reads the file, as a dashboard would
            count = _count_elsewhere(db) or 0  # None while the file is not there yet
        assert count == 5
        # one batch, written a second after the first row at the soonest: not a
        # write per interval before the rows came, nor one per span
        assert loopscope.pipeline._active.writer.stats().batches == 1
    finally:
        loopscope.shutdown()


def test_a_flush_with_nothing_queued_answers_at_once_and_writes_nothing(tmp_path):
    w = open_sink(str(tmp_path / "idle.duckdb"), mapping=SPANS)
    try:
        time.sleep(0.2)
        started = time.monotonic()
        assert w.flush()
        assert time.monotonic() - started < 0.4  # not after the interval the writer sleeps
        assert w.stats().batches == 0
    finally:
        w.close()


@pytest.mark.parametrize(
    ("cost", "wait"),
    [(0.0, 1.0), (0.005, 1.0), (0.02, 2.0), (0.035, 3.5), (0.05, 5.0), (1.0, 5.0)],
)
def test_the_default_interval_follows_the_cost_of_the_last_batch(tmp_path, cost, wait):
    w = open_sink(str(tmp_path / "w.duckdb"), mapping=SPANS)
    try:
        # a batch that took `cost` s of the writer's CPU is followed by a wait 100x as long
        # (1% of a core), within one second and five; loopscope's readers do not wait for it
        # (test_wakeup.py)
        assert w._wait_after(cost) == pytest.approx(wait)
    finally:
        w.close()


def test_a_given_interval_is_kept_whatever_a_batch_costs(tmp_path):
    w = open_sink(str(tmp_path / "w.duckdb"), mapping=SPANS, flush_interval=0.2)
    try:
        assert w._wait_after(0.0) == w._wait_after(3.0) == 0.2
    finally:
        w.close()


@pytest.mark.thread_writer  # its batches counted in this process
def test_rows_reach_the_file_while_the_application_records_without_a_pause(recording):
    # a steady stream of turns: the queue is seldom empty when the writer looks, and each
    # batch ends with what was queued when it began, not with a pause in the stream
    writer = recording.pipeline.writer
    started = looked = time.monotonic()
    n = 0
    during = writer.stats()
    # until two batches were written (a loaded machine's writer takes longer to get there;
    # the stream never pauses meanwhile), for 30 s at most
    while during.batches < 2 and time.monotonic() - started < 30:
        _turn(f"s{n % 7}", f"q{n}")
        n += 1
        time.sleep(0.0002)
        if time.monotonic() - looked > 0.25:
            during, looked = writer.stats(), time.monotonic()
    assert during.batches >= 2
    assert 0 < during.written_events < 5 * n
    assert loopscope.flush()
    assert writer.stats().written_events == 5 * n


def test_a_full_batch_is_written_without_waiting_for_the_interval(tmp_path):
    db = tmp_path / "full.duckdb"
    loopscope.configure(db, tracer_provider=TracerProvider(), flush_interval=3600, writer="thread")
    writer = loopscope.pipeline._active.writer
    writer.batch_size = 5  # a turn queues more than that
    try:
        _turn("s", "q")
        started = time.monotonic()
        while not writer.stats().batches and time.monotonic() - started < 10:
            time.sleep(0.02)
        assert writer.stats().batches >= 1 and writer.stats().written_events > 0  # not an hour later
    finally:
        loopscope.shutdown()


def _wal(db) -> int:
    wal = db.parent / (db.name + ".wal")
    return wal.stat().st_size if wal.exists() else 0


def test_batches_leave_their_rows_in_the_wal_where_every_reader_sees_them(recording):
    _turn("s", "q1")
    assert loopscope.flush()
    _turn("s", "q2")
    assert loopscope.flush()
    # the second batch did not rewrite the tables: its rows (and the first's) are in the
    # WAL, on disk, and a reader in another process replays it
    assert _wal(recording.db) > 0
    assert _count_elsewhere(recording.db) == 10
    assert recording.pipeline.writer.stats().batches == 2
    loopscope.shutdown()
    assert _wal(recording.db) == 0  # a closed store's file holds every row by itself
    assert _count_elsewhere(recording.db) == 10


@pytest.mark.thread_writer  # CHECKPOINT_IDLE set in this process is the writer's
def test_an_idle_writer_checkpoints_what_it_left_in_the_wal(recording, monkeypatch):
    monkeypatch.setattr(writer, "CHECKPOINT_IDLE", 0.3)
    _turn("s", "q1")
    assert loopscope.flush()
    _turn("s", "q2")  # waits in the queue: the idle wait starts again after this batch
    assert loopscope.flush()
    assert _wal(recording.db) > 0
    started = time.monotonic()
    while _wal(recording.db) and time.monotonic() - started < 10:
        time.sleep(0.05)
    assert _wal(recording.db) == 0
    assert time.monotonic() - started >= 0.2  # after the quiet, not at once
    assert _count_elsewhere(recording.db) == 10


@pytest.mark.thread_writer  # WAL_LIMIT patched in this process
def test_a_commit_checkpoints_once_the_wal_has_grown_past_its_limit(recording, monkeypatch):
    monkeypatch.setattr(writer, "WAL_LIMIT", 1)
    after = []
    for n in range(3):
        _turn("s", f"q{n}")
        assert loopscope.flush()
        after.append(_wal(recording.db) > 0)
    # the first batch found no WAL and left one; the second found it over the limit and its
    # commit checkpointed both; the third started a WAL again
    assert after == [True, False, True]
    assert _count_elsewhere(recording.db) == 15
