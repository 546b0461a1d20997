"""The writer's record of its open turns (``loopscope_open_turns``, which crash recovery
reads) stays exact while it skips the bookkeeping statements a batch does not need: a turn
is listed from the batch with its first rows to the batch with its summary, and a turn
that starts and ends within one batch is never listed."""

from __future__ import annotations

import threading

import duckdb
import pytest

import loopscope
from loopscope.storage import recovery


def _open_turns(db) -> list[tuple[str, str]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("SELECT correlation_id, session_id FROM loopscope_open_turns ORDER BY 1").fetchall()
    finally:
        con.close()


def _spy(monkeypatch) -> list[list[str]]:
    """The bookkeeping statements of every batch, as the writer runs them."""
    seen: list[list[str]] = []
    statements = recovery.Tracker.statements

    def spy(self, facts):
        out = statements(self, facts)
        seen.append(["open" if s == self._open else "close" if s == recovery._CLOSE_SQL else s for s in out])
        return out

    monkeypatch.setattr(recovery.Tracker, "statements", spy)
    return seen


@pytest.mark.thread_writer  # its batches spied on in this process
def test_a_turn_that_ends_within_its_batch_is_never_listed_nor_looked_up(recording, monkeypatch):
    seen = _spy(monkeypatch)
    with loopscope.turn(session_id="s", agent="a", input="q") as t:
        t.generation("answer")
    assert loopscope.flush()
    assert seen == [[]]
    assert _open_turns(recording.db) == []


@pytest.mark.thread_writer  # its batches spied on in this process
def test_a_turn_across_batches_is_listed_until_its_summary_is_written(recording, monkeypatch):
    seen = _spy(monkeypatch)
    with loopscope.turn(session_id="s", agent="a", input="q", correlation_id="c-1") as t:
        t.generation("thinking")
        assert loopscope.flush()
        assert _open_turns(recording.db) == [("c-1", "s")]
        t.generation("more")  # a batch with rows of a turn listed already: nothing to note
        assert loopscope.flush()
        assert _open_turns(recording.db) == [("c-1", "s")]
        t.generation("answer")
    assert loopscope.flush()
    assert _open_turns(recording.db) == []
    assert seen == [["open"], [], ["close"]]


def _held_turn(correlation_id: str, session: str, go: threading.Event) -> threading.Thread:
    """A turn on a thread of its own (as concurrent conversations run), open until ``go``."""
    started = threading.Event()

    def run() -> None:
        with loopscope.turn(session_id=session, agent="a", input="q", correlation_id=correlation_id) as t:
            t.generation("thinking")
            started.set()
            go.wait(10)
            t.generation("answer")

    thread = threading.Thread(target=run)
    thread.start()
    assert started.wait(10)
    return thread


@pytest.mark.thread_writer  # its batches spied on in this process
def test_a_batch_that_opens_one_turn_and_ends_another_does_both(recording, monkeypatch):
    seen = _spy(monkeypatch)
    end_first, end_second = threading.Event(), threading.Event()
    first = _held_turn("c-1", "s", end_first)
    assert loopscope.flush()
    second = _held_turn("c-2", "s2", end_second)
    end_first.set()  # this batch: c-1 ends, c-2 starts and stays open
    first.join(10)
    assert loopscope.flush()
    assert _open_turns(recording.db) == [("c-2", "s2")]
    end_second.set()
    second.join(10)
    assert loopscope.flush()
    assert _open_turns(recording.db) == []
    assert seen == [["open"], ["open", "close"], ["close"]]


@pytest.mark.thread_writer  # its batches spied on in this process
def test_a_batch_that_could_not_be_written_notes_its_turns_when_it_is(recording, monkeypatch):
    writer = recording.pipeline.writer
    seen = _spy(monkeypatch)
    with loopscope.turn(session_id="s", agent="a", input="q", correlation_id="c-1") as t:
        t.generation("thinking")
        held = duckdb.connect(str(recording.db))  # another connection holds the file: the batch fails
        writer.lock_timeout = 0.2
        try:
            assert not loopscope.flush(timeout=10)
        finally:
            held.close()
        assert loopscope.flush()  # the kept rows, retried: the turn is noted with them
        assert _open_turns(recording.db) == [("c-1", "s")]
    assert loopscope.flush()
    assert _open_turns(recording.db) == []
    assert seen[-2:] == [["open"], ["close"]]
