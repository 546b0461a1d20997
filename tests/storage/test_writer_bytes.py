"""The writer's byte bound: a queue half full in bytes is written at once, not held for the
flush interval until spans are dropped (issue 19)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from opentelemetry.sdk.trace import TracerProvider

import loopscope
from children import Child, hold


def test_a_queue_half_full_in_bytes_is_written_before_the_interval_and_nothing_is_dropped(tmp_path: Path) -> None:
    bound = 256 << 10
    pipeline = loopscope.configure(tmp_path / "bytes.duckdb", tracer_provider=TracerProvider(), flush_interval=120, queue_bytes=bound)
    text = "It is 21 C and dry in Paris right now. " * 4
    try:
        recorded = 0
        for _ in range(3):  # three bursts of 0.6x the bound each: 1.8x the bound within the interval
            while pipeline.stats().queued_bytes < bound * 0.6:
                with loopscope.turn(session_id=f"s{recorded % 7}", input=text) as t:
                    t.generation(text, finish_reason="stop")
                recorded += 1
            # what is queued past half the bound is written at once; spans that arrive while
            # that batch is written (under half the bound) may wait for the interval, as any do
            deadline = time.monotonic() + 60  # a bound on the wait, not a measurement
            while pipeline.stats().queued_bytes >= bound // 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert pipeline.stats().queued_bytes < bound // 2, "the writer waited for its interval with the queue past half its bytes"
        assert loopscope.flush()
        stats = pipeline.stats()
        assert stats.dropped == 0
        assert stats.written_turns == recorded
    finally:
        loopscope.shutdown()
    [(turns,)] = loopscope.Store(str(tmp_path / "bytes.duckdb")).sql("SELECT count(*) FROM turns")[1]
    assert turns == recorded


def _batches_for(tmp_path: Path, name: str, calls: int, value_bytes: int) -> int:
    """The batches a thread writer with an 8 MiB bound takes for ``calls`` turns of one tool
    result of ``value_bytes`` each, all queued before one flush (under the half of the bound
    that wakes the writer early); every result read back whole."""
    bound = 8 << 20
    db = tmp_path / f"{name}.duckdb"
    pipeline = loopscope.configure(db, writer="thread", tracer_provider=TracerProvider(), flush_interval=120, queue_bytes=bound)

    @loopscope.tool
    def fetch(i: int) -> str:
        return chr(ord("a") + i % 26) * value_bytes

    try:
        before = pipeline.stats().batches
        for i in range(calls):
            with loopscope.turn(session_id="s", input="q"):
                fetch(i)
        assert loopscope.flush()
        stats = pipeline.stats()
        assert stats.dropped == 0
        batches = stats.batches - before
    finally:
        loopscope.shutdown()
    _, rows = loopscope.Store(str(db)).sql("SELECT length(content->>'$.result') FROM events WHERE type = 'tool_call_end'")
    assert rows == [(value_bytes,)] * calls
    return batches


def test_a_batch_of_large_values_takes_about_an_eighth_of_the_byte_bound_from_the_queue(tmp_path: Path) -> None:
    """What is queued is written in batches, not all at once: each copy writing a batch makes
    (the rows in Arrow, the content policy's, DuckDB's) is then that large, not as large as
    the whole queue (issue 30: 1 MiB tool results). A batch holding a value stored in parts
    takes about ``LARGE_SHARE`` (an eighth) of the bound: 12 results of 256 KiB (3 MiB, the
    bound 8 MiB) are three batches or more (two at a quarter)."""
    assert _batches_for(tmp_path, "large", 12, 256 << 10) >= 3


def test_a_batch_of_small_values_takes_about_a_quarter_of_the_byte_bound(tmp_path: Path) -> None:
    """Values under the size that is stored in parts keep ``BATCH_SHARE`` (a quarter) of the
    bound a batch: 128 results of 16 KiB (~2.8 MiB as the bound counts them, the bound 8 MiB) are two batches, not the
    three or more an eighth would make (each batch's fixed cost paid again)."""
    assert _batches_for(tmp_path, "small", 128, 16 << 10) == 2


def test_while_large_values_are_written_the_queue_leaves_room_for_the_copies_of_a_write(
    tmp_path: Path, spawn: Callable[..., Child]
) -> None:
    """Writing a batch of large values holds copies of it beside the queue (issue 30: the
    writer's memory was the bound plus those): once a batch holds one, the queue takes the
    bound less ``WRITE_COPIES`` batches of ``LARGE_SHARE``, and past it spans are dropped and
    counted. The file is held by another process, so the writer keeps its batch and writes
    nothing meanwhile; once it is let go, every value accepted is stored."""
    bound = 8 << 20
    db = tmp_path / "room.duckdb"
    pipeline = loopscope.configure(db, writer="thread", tracer_provider=TracerProvider(), flush_interval=120, queue_bytes=bound)

    @loopscope.tool
    def fetch(i: int) -> str:
        return chr(ord("a") + i % 26) * (256 << 10)

    room = 3 << 20  # WRITE_COPIES (3) batches of LARGE_SHARE (an eighth) of the bound
    try:
        with loopscope.turn(session_id="s", input="q"):
            fetch(0)
        assert loopscope.flush()
        with hold(spawn, db, tmp_path, give_up=120):
            with loopscope.turn(session_id="s", input="q"):
                fetch(1)
            assert not loopscope.flush(timeout=60)  # the batch of one large value is kept, the file held
            for i in range(2, 42):  # 40 values of 256 KiB: 10 MiB against the bound of 8
                with loopscope.turn(session_id="s", input="q"):
                    fetch(i)
            stats = pipeline.stats()
            assert stats.dropped > 0
            assert stats.queued_bytes <= bound - room + (300 << 10), "the queue took the room a write's copies need"
        assert loopscope.flush(timeout=60)
        written = pipeline.stats()
    finally:
        loopscope.shutdown()
    assert written.written_turns + written.dropped_turns == 42  # every turn stored or counted
    _, rows = loopscope.Store(str(db)).sql("SELECT count(*) FROM turns")
    assert rows == [(written.written_turns,)]
