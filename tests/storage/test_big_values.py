"""Values far over the store's cap (issue 30): they cost the queue what the store keeps of them,
so a turn never loses its rows to its own big tool result or answer; and an exit while the
writer is inside DuckDB with a batch of large values ends the process cleanly, the batch
counted as lost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import loopscope
from fakes.model_server import Reply
from loopscope.cli.status import read_status

MIB = 1 << 20
CAP = 1_048_576  # ContentPolicy.store_max_chars by default


def _marker(length: int) -> str:
    return f"…[truncated: {length} chars]"


@pytest.mark.serial  # two values of 60 and 100 MB, a few copies each: the machine's memory
def test_tool_results_of_60_and_100_mb_keep_their_turns_and_are_capped(tmp_path: Path) -> None:
    """With the default writer, a 60 MB tool result left its turn without a row (the turn's
    span found the queue full), a 100 MB one too: both turns are stored now, each result as
    its first 1 MiB and the marker, and nothing is counted as dropped."""
    db = tmp_path / "big.duckdb"
    loopscope.configure(db, flush_interval=0.05)
    sizes = (60_000_000, 100_000_000)

    @loopscope.tool
    def fetch(size: int) -> str:
        return "x" * size

    try:
        for n, size in enumerate(sizes):
            with loopscope.turn(session_id=f"big-{n}", input="fetch it"):
                assert len(fetch(size)) == size
        assert loopscope.flush(timeout=120)
    finally:
        loopscope.shutdown()
    store = loopscope.Store(str(db))
    _, turns = store.sql("SELECT session_id FROM turns ORDER BY session_id")
    assert turns == [("big-0",), ("big-1",)]
    _, results = store.sql(
        "SELECT session_id, content->>'$.result' FROM events WHERE type = 'tool_call_end' ORDER BY session_id"
    )
    for (session, result), size in zip(results, sizes):
        assert result == "x" * CAP + _marker(size), (session, len(result), result[-40:])
    status = read_status(str(db))
    assert status["totals"]["dropped_queue_full"] == 0 and status["totals"]["dropped_unwritable"] == 0, status["writers"]


def test_a_model_answer_far_over_the_cap_keeps_its_turn(tmp_path: Path, model_server) -> None:
    """A real openai call whose answer is 6 MB of text, with an 8 MiB queue: the round's
    text and its output messages (12 MB on one span) no longer push the turn's own span out
    of the queue; the answer is stored capped."""
    db = tmp_path / "answer.duckdb"
    text = "word " * 1_200_000  # 6,000,000 characters
    model_server.queue(Reply(text=text))
    loopscope.configure(db, flush_interval=0.05, queue_bytes=8 * MIB)
    loopscope.instrument()
    try:
        with loopscope.turn(session_id="long-answer", input="Say it all."):
            answer = model_server.openai_client().chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": "Say it all."}])
            assert answer.choices[0].message.content == text
        assert loopscope.flush(timeout=60)
    finally:
        loopscope.uninstrument()
        loopscope.shutdown()
    store = loopscope.Store(str(db))
    _, turns = store.sql("SELECT response_content FROM turns WHERE session_id = 'long-answer'")
    assert len(turns) == 1
    assert turns[0][0] == text[:CAP] + _marker(len(text))
    _, calls = store.sql("SELECT output_messages FROM model_calls")
    assert len(calls) == 1 and len(calls[0][0]) < 3 * CAP
    status = read_status(str(db))
    assert status["totals"]["dropped_queue_full"] == 0 and status["totals"]["dropped_unwritable"] == 0, status["writers"]


EXIT_IN_A_WRITE = """
    import sys, threading
    import loopscope
    from loopscope.storage.duckdb import writer as store_writer

    db, size, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    writing = threading.Event()
    write_batch = store_writer.write_batch

    def watched(*args, **kwargs):
        writing.set()  # the writer's thread is about to run the batch's statements in DuckDB
        return write_batch(*args, **kwargs)

    store_writer.write_batch = watched
    loopscope.configure(db, writer="thread", flush_interval=60, queue_bytes=1 << 32)

    @loopscope.tool
    def fetch(i: int) -> str:
        return chr(ord("a") + i % 26) * size

    for i in range(calls):
        with loopscope.turn(session_id=f"s{i % 4}", input="q"):
            fetch(i)
    loopscope.flush(timeout=0)  # write now, without waiting
    assert writing.wait(120)
    [thread] = [t for t in threading.enumerate() if t.name.startswith("loopscope-writer")]
    loopscope.shutdown(timeout=0.01)  # the batch is still being written: it is given up
    print("exiting", flush=True)


    class Teardown:
        # kept until the interpreter clears this module, after it stopped running other
        # threads' Python: a writer thread still inside DuckDB comes back meanwhile (and was
        # stopped there, aborting the process), unless it left DuckDB before
        def __del__(self):
            import time
            deadline = time.monotonic() + 30
            while thread.is_alive() and time.monotonic() < deadline:
                time.sleep(0.05)


    teardown = Teardown()
"""


STALLED_IN_DUCKDB = """
    import sys, threading, time
    import pyarrow as pa
    import loopscope
    from loopscope.storage.duckdb import writer as store_writer

    db, calls, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    inside = threading.Event()
    write_batch = store_writer.write_batch

    def stalled(con, facts, **kwargs):
        # a DuckDB statement that does not end within the exit's bound, as on a disk that
        # stalls: DuckDB waits for a batch it asked for, and no interrupt() stops that wait
        def batches():
            inside.set()
            time.sleep(8)
            yield pa.record_batch([pa.array([1])], names=["x"])

        stall = pa.RecordBatchReader.from_batches(pa.schema([("x", pa.int64())]), batches())
        con.execute("SELECT count(*) FROM stall").fetchall()
        return write_batch(con, facts, **kwargs)

    store_writer.write_batch = stalled
    loopscope.configure(db, writer="thread", flush_interval=60)

    @loopscope.tool
    def fetch(i: int) -> str:
        return "x" * 100

    for i in range(calls):
        with loopscope.turn(session_id=f"s{i % 4}", input="q"):
            fetch(i)
    loopscope.flush(timeout=0)
    assert inside.wait(120)
    [thread] = [t for t in threading.enumerate() if t.name.startswith("loopscope-writer")]
    loopscope.shutdown(timeout=0.01)
    print("exiting", flush=True)


    class Teardown:  # as in EXIT_IN_A_WRITE: the interpreter's teardown waits for the thread
        def __del__(self):
            deadline = time.monotonic() + 30
            while thread.is_alive() and time.monotonic() < deadline:
                time.sleep(0.05)


    teardown = Teardown()
    if how == "raises":
        raise RuntimeError("the application fails")
"""


@pytest.mark.serial  # a batch of 120 MiB: the machine's memory
def test_an_exit_while_the_writer_is_inside_duckdb_ends_cleanly_and_counts_the_batch(tmp_path: Path, spawn) -> None:
    """The thread writer is inside DuckDB with a batch of large values when the application
    closes it and exits: the process aborted (SIGABRT, exit status 134, `FATAL: exception not
    rethrown`) in 4 runs of 10, as the thread came back from DuckDB while the interpreter
    finalised (the interrupt was sent while it prepared the batch in Arrow, and lost; it went
    on into DuckDB after). Now a writer given up on starts no DuckDB call, the one it is in
    is interrupted, and the exit waits for it: the process exits 0 and `status` counts the
    batch as lost."""
    db = tmp_path / "exit.duckdb"
    calls = 120
    child = spawn("exit_in_a_write", EXIT_IN_A_WRITE, db, MIB, calls)
    assert child.finish_ok(180).strip() == "exiting"
    status = read_status(str(db))
    sent_events = calls * 3  # the input, the tool call's start and its end
    lost = status["totals"]["dropped_unwritable"]
    assert lost > 0, status["writers"]
    assert status["events"] + lost >= sent_events, (status["events"], lost)
    assert "still writing when the store was closed" in json.dumps(status["writers"], default=str)


@pytest.mark.parametrize("how", ["ends", "raises"])
def test_an_exit_while_the_writer_stays_inside_duckdb_ends_the_process_cleanly(tmp_path: Path, spawn, how: str) -> None:
    """The thread writer is inside a DuckDB statement that no interrupt ends (a stalled
    disk) past the exit's bound: the process aborted (exit status 134) every run, as the
    thread came back from DuckDB while the interpreter finalised. Now the process ends once
    the exit hooks have run, by os._exit, with a line saying so and the exit status Python
    gives (0, or 1 after an uncaught exception, its traceback shown), and `status` counts
    every event the writer held as lost."""
    db = tmp_path / "stalled.duckdb"
    calls = 20
    child = spawn("stalled_in_duckdb", STALLED_IN_DUCKDB, db, calls, how)
    assert child.wait(60) == (1 if how == "raises" else 0), child.output()
    assert child.out.read_text().strip() == "exiting"
    err = child.err.read_text()
    assert "still inside DuckDB" in err
    assert ("RuntimeError: the application fails" in err) == (how == "raises")
    status = read_status(str(db))
    assert (status["events"], status["totals"]["dropped_unwritable"]) == (0, calls * 3), status["writers"]
    assert "still writing when the store was closed" in json.dumps(status["writers"], default=str)
