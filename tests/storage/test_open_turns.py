"""The writer's record of its open turns (``loopscope_open_turns``, which crash recovery
reads) stays exact while it skips the bookkeeping statements a batch does not need: a turn
is listed from the batch with its first rows to the batch with its summary, and a turn
that starts and ends within one batch is never listed."""

from __future__ import annotations

import threading
import time

import duckdb
import pytest

import loopscope
from loopscope.storage.duckdb import recovery
from recorded import connect_when_free


def _open_turns(db) -> list[tuple[str, str]]:
    con = connect_when_free(db)
    try:
        return con.execute("SELECT correlation_id, session_id FROM loopscope_open_turns ORDER BY 1").fetchall()
    finally:
        con.close()


def _spy(monkeypatch) -> list[list[str]]:
    """The bookkeeping statements of every batch, as the writer runs them."""
    seen: list[list[str]] = []
    statements = recovery.Tracker.statements

    def spy(self, facts, tables=None):
        out = statements(self, facts, tables)
        # the statements read the batch's turns (tables made of them, or the facts)
        seen.append([
            "open" if s.lstrip().startswith(f"INSERT INTO {recovery.OPEN_TURNS}")
            else "close" if s.lstrip().startswith(f"DELETE FROM {recovery.OPEN_TURNS}") else s
            for s in out
        ])
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


def _hold(db) -> duckdb.DuckDBPyConnection:
    """A connection of the test's own to the file, once the writer's batch (the turn's start,
    written meanwhile) has let it go."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return duckdb.connect(str(db))
        except (duckdb.IOException, duckdb.Error):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


@pytest.mark.thread_writer  # its batches spied on in this process
def test_a_batch_that_could_not_be_written_notes_its_turns_when_it_is(recording, monkeypatch):
    writer = recording.pipeline.writer
    seen = _spy(monkeypatch)
    with loopscope.turn(session_id="s", agent="a", input="q", correlation_id="c-1") as t:
        t.generation("thinking")
        held = _hold(recording.db)  # another connection holds the file: the batch fails
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


def _event(correlation, session, at, agent, trace=b"\x01" * 16):
    from loopscope.storage import rows

    return rows.EventFact(code=rows.INPUT_MESSAGE, trace_id=trace, span_id=bytes(8), created_us=at, session_id=session,
                          correlation_id=correlation, source_channel_id=agent, source_provider=None,
                          source_framework=None, blocked=False, body="b")


def _summary(correlation, session):
    from loopscope.storage import rows

    return rows.TurnFact(
        trace_id=b"\x01" * 16, span_id=bytes(8), correlation_id=correlation, session_id=session, channel_id=None,
        parent_correlation_id=None, response_content="", segments="[]", tool_calls_count=0, round_count=1,
        input_tokens=None, output_tokens=None, cache_read_input_tokens=None, cache_creation_input_tokens=None,
        reasoning_tokens=None, usage=None, thinking="", loop_end_reason="final_answer", latency_ms=1.0, streaming=False,
        timestamp_us=100, declared_tools="[]", model=None, provider=None, error=None,
    )


def _listed_after(path, batches, *, made: bool) -> list[tuple]:
    """loopscope_open_turns after ``batches`` (lists of event facts, and of (correlation,
    session) turns to end) went through a tracker's statements and write_batch: over the
    tables of turns the tracker ``made``, or over the facts."""
    from loopscope.storage import rows
    from loopscope.storage.duckdb.connection import open_store
    from loopscope.storage.duckdb.schema import migrate
    from loopscope.storage.duckdb.writer import write_batch

    tracker = recovery.Tracker()
    with open_store(path, read_only=False) as con:
        migrate(con)
        con.execute(f"INSERT INTO {recovery.OPEN_TURNS} VALUES ('theirs', 's', 'other', NULL, NULL, NULL)")
    for events, ended in batches:
        facts = rows.Facts()
        facts.append(events, [_summary(c, s) for c, s in ended])
        with open_store(path, read_only=False) as con:
            write_batch(con, facts, extra=tracker.statements(facts, con if made else None))
        tracker.committed()
    with open_store(path, read_only=True) as con:
        return con.execute(f"SELECT correlation_id, session_id, trace_id, started_at, agent, writer_id = 'other' "
                           f"FROM {recovery.OPEN_TURNS} ORDER BY ALL").fetchall()


def test_the_turns_listed_from_the_tables_made_of_them_are_the_turns_the_statements_over_the_facts_list(tmp_path):
    # quotes, a turn whose first row has no agent, an earlier row later in the batch, a turn
    # another writer listed already, a NUL character, many turns in one batch
    batches = [
        ([_event("it's", "s", 20, None), _event("it's", "s", 10, "a'gent"), _event("theirs", "s", 5, "x"),
          _event("c2", "s'2", 7, "b", trace=b"\x02" * 16), _event(None, "s", 1, "z")], []),
        ([_event("c3", "s", 30, "c"), _event("c2", "s'2", 31, "b")], [("it's", "s")]),
        ([_event("nul\0", "s", 40, "d")], [("c2", "s'2")]),
        ([_event(f"many-{i}", "s", 50 + i, None) for i in range(300)], [("c3", "s"), ("many-7", "s")]),
    ]
    made = _listed_after(str(tmp_path / "made.duckdb"), batches, made=True)
    read = _listed_after(str(tmp_path / "read.duckdb"), batches, made=False)
    assert made == read
    assert len(made) == 1 + 1 + 299  # theirs, the NUL one, the many but one
