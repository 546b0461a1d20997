"""The writer process (``configure(writer="process")``): spans in on stdin, rows out to the store.

Started by :class:`~loopscope.ingest.writer_process.ProcessSpanWriter` (``python -I -c``,
the application's import path, a session of its own). Its first message is the writer's
options; then spans, as the plain tuples :func:`~loopscope.ingest.writer_process.shipped`
made, go to the same :class:`~loopscope.storage.duckdb.writer.StoreWriter` and mapping the thread mode runs in
the application (same mapping, same batches, same health row and turn recovery); a flush
is answered once its writer wrote what came before it; its counters go back now and then.
At a close message, or when stdin ends (the application died), it closes the writer
(writing what it has, within the close's bound) and exits.
"""

from __future__ import annotations

import functools
import marshal
import os
import pickle
import signal
import sys
import threading
from collections.abc import Callable
from typing import IO, Any

import duckdb

from .. import pricing, semconv
from .._guard import logger
from ..storage.duckdb.allocator import give_back
from ..storage.duckdb.writer import CLOSE_TIMEOUT, StoreWriter
from ..storage.recording import share_db
from .spans import Ctx, Status
from .writer import SPANS as SPAN_MAPPING
from .writer_process import ACK, ANSWER, ASK, CLOSE, CONFIG, DONE, FLUSH, READY, SPANS, STATS, receive, send

STATS_EVERY = 0.5
"""Seconds between two reports of the writer's counters to the application (when they changed)."""


class _Span:
    """A shipped span as the mapping reads it (like :class:`~loopscope.ingest.spans.SpanRecord`,
    with only what the mapping reads)."""

    __slots__ = ("attributes", "context", "end_time", "size", "start_time", "status")

    def __init__(self, attributes: dict[str, Any], context: Ctx, start_time: int, end_time: int | None, status: Status,
                 size: int) -> None:
        self.attributes = attributes
        self.context = context
        self.start_time = start_time
        self.end_time = end_time
        self.status = status
        self.size = size


def _uncut(span: _Span) -> tuple[_Span, int]:
    return span, span.size


class _Shipped:
    """loopscope's span mapping (:data:`~loopscope.ingest.writer.SPANS`), a shipped span's
    size being what the application's byte bound counted for it."""

    __slots__ = ()

    add = staticmethod(SPAN_MAPPING.add)
    recover = staticmethod(SPAN_MAPPING.recover)
    rows = staticmethod(SPAN_MAPPING.rows)

    @staticmethod
    def size(span: _Span) -> int:
        return span.size

    @staticmethod
    def cap(limit: int) -> tuple[float, Callable[[Any], tuple[Any, int]]]:
        return float("inf"), _uncut  # cut in the application already, before it was queued there


_OK = Status()


class _Answers:
    """Messages to the application, from any thread, one at a time; a gone reader is ignored."""

    def __init__(self, stream: IO[bytes], writer: StoreWriter) -> None:
        self._stream = stream
        self._writer = writer
        self._lock = threading.Lock()
        self.received = 0
        self.settled = 0
        self._last: dict[str, Any] | None = None
        self._gone = False  # the application stopped reading

    def counters(self) -> dict[str, Any]:
        received = self.received  # read before the queue: all of these are settled when it is empty
        stats = self._writer.stats()
        # nothing queued, and no drain under way (read after the queue: a drain that took the
        # spans may be mapping them, counted nowhere yet): all received is written or kept
        if stats.queued == 0 and not self._writer.draining:
            self.settled = max(self.settled, received)
        return {
            "queued": stats.queued, "written_events": stats.written_events, "written_turns": stats.written_turns,
            "written_calls": stats.written_calls, "dropped": stats.dropped, "dropped_turns": stats.dropped_turns,
            "excluded": stats.excluded,
            "failed_writes": stats.failed_writes, "batches": stats.batches, "last_error": stats.last_error,
            "queued_bytes": stats.queued_bytes, "lost_from_file": stats.lost_from_file, "settled": self.settled,
            "received": received,
            "writer_id": self._writer._row_id() or self._writer.report.writer_id,
        }

    def send(self, kind: bytes, payload: Any) -> None:
        data = marshal.dumps(payload)
        with self._lock:
            if self._gone:
                return
            try:
                send(self._stream, kind, data)
            except (OSError, ValueError):
                # the application is gone (an os._exit, a kill): the rows are written all the
                # same; what the stream's buffer still holds goes nowhere, so the interpreter's
                # last flush has no broken pipe to print into the application's stderr
                self._gone = True
                _to_null(self._stream)

    def stats_loop(self, stop: threading.Event) -> None:
        while not stop.wait(STATS_EVERY):
            counters = self.counters()
            if counters != self._last:
                self._last = counters
                self.send(STATS, counters)


def _to_null(stream: IO[bytes]) -> None:
    """Point ``stream``'s descriptor at the null device (its unwritten buffer is let go there)."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, stream.fileno())
        os.close(null)
    except (OSError, ValueError):
        pass


def _prepare(path: str, recover: bool) -> str | None:
    """What ``configure()`` does in thread mode, before the first batch: the schema made or
    migrated, the turns of dead writers closed, in a connection of its own (whose close
    checkpoints, so the first batch's rows alone go to the WAL). A store held by another
    process is left to the writer (it retries, says why, and counts what it loses). Returns
    why the store cannot be written (None: it can, or another process holds it now), which
    the ready message tells the application, whose words those are."""
    from ..storage.duckdb.connection import open_store
    from ..storage.duckdb.schema import migrate
    from ..storage.errors import StoreError, StoreLockedError
    from .recovery import recover as close_dead_turns

    try:
        with open_store(path, read_only=False, timeout=0.5) as con:
            migrate(con)
            if recover:
                close_dead_turns(con)
    except (StoreError, OSError, duckdb.Error) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, StoreLockedError):
            logger.warning("loopscope: the store %s cannot be prepared now (%s); the writer will retry", path, first)
            return None
        # not said here: the application says it once, in the words that fit its case (recording
        # off for the default store, configure's StoreError, or the writer's first failed batch)
        return str(exc) if isinstance(exc, StoreError) else f"cannot write the loopscope store {path}: {first}"
    return None


def main() -> None:
    """Run the writer until the application says close or goes away."""
    # a Ctrl-C or a SIGTERM (a container's stop) is the application's to handle: its close, or
    # its end (EOF on stdin), tells this process to write what it has and go
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    first = receive(stdin)
    if first is None or first[0] != CONFIG:
        return
    config = pickle.loads(first[1])  # from the process that started this one, over its pipe
    if config.get("share_db"):
        share_db(config["path"])  # the user's configure(share_db=True), for the migration below
    problem = _prepare(config["path"], config["track_turns"])
    if problem is not None:  # the application stops recording to the store, or counts its events lost
        send(stdout, READY, marshal.dumps(problem))
        return
    pricing.set_overrides(config["prices"])
    semconv.use_conventions(config["latest"])
    writer = StoreWriter(
        config["path"], mapping=_Shipped(), policy=config["policy"], flush_interval=config["flush_interval"], max_queue=config["max_queue"],
        max_bytes=config["max_bytes"], batch_size=config["batch_size"], lock_timeout=config["lock_timeout"],
        track_turns=config["track_turns"], content=config["content"],
        # its row in the store says what it wrote at every batch: should it be killed, the
        # application's record of what it sent is set against that, never against a stale count
        report_each_batch=True,
    )
    # this process is the writer's own: the C heap's free pages go back after each batch too
    # (Arrow's rows, see writer_process.CHILD_ENV), beside DuckDB's (StoreWriter's default)
    writer.after_write = functools.partial(give_back, c_heap=True)
    otlp = [0, 0]
    writer.report.otlp = lambda: (otlp[0], otlp[1])
    writer.report.mode, writer.report.app_pid = "process", config.get("app_pid")  # what `loopscope status` shows
    notices: list[Any] = [None]  # the application's start notices: (sent, refused, failed, off) once it sends any
    writer.report.notices = lambda: notices[0] or (0, 0, 0, None)
    answers = _Answers(stdout, writer)
    stop = threading.Event()
    answers.send(READY, problem)  # the first message: from now on the application ships its spans here
    stats_thread = threading.Thread(target=answers.stats_loop, args=(stop,), name="loopscope-stats", daemon=True)
    stats_thread.start()
    submit = writer.submit
    dropped = (0, 0)  # the application's drops counted so far (events, turns)
    timeout: float | None = config.get("close_timeout", CLOSE_TIMEOUT)
    while True:
        message = receive(stdin)
        if message is None:
            break  # the application ended: write what we have
        kind, payload = message
        if kind == SPANS:
            parent_dropped, otlp[0], otlp[1], notices[0], spans = marshal.loads(payload)
            writer.count_dropped(parent_dropped[0] - dropped[0], parent_dropped[1] - dropped[1])
            dropped = parent_dropped
            for span_kind, trace_id, span_id, start, end, attributes, description, size in spans:
                status = _OK if description is None else Status(2, description)
                submit(span_kind, _Span(attributes, Ctx(trace_id, span_id), start, end, status, size))
            answers.received += len(spans)
        elif kind == FLUSH:
            number = marshal.loads(payload)
            if not number:  # write now, unanswered (the application's queue was half full in bytes)
                writer.flush_then(lambda ok: None)
                continue

            def answer(ok: bool, number: int = number) -> None:
                answers.send(ACK, (number, ok, answers.counters()))

            writer.flush_then(answer)
        elif kind == ASK:
            answers.send(ANSWER, answers.counters())
        elif kind == CLOSE:  # with the application's last counts
            timeout, parent_dropped, otlp[0], otlp[1], notices[0], _ = marshal.loads(payload)
            writer.count_dropped(parent_dropped[0] - dropped[0], parent_dropped[1] - dropped[1])
            # the application may leave before this writer is done (it waits CLOSE_TIMEOUT at
            # most): from then on this process speaks through the store (`loopscope status`)
            threading.Thread(target=_quiet_once_left, args=(stdin,), name="loopscope-left", daemon=True).start()
            break
    writer.close(timeout)
    stop.set()
    stats_thread.join()  # it writes to stdout: never while the interpreter ends (_end)
    answers.settled = answers.received  # each written, or counted as lost by the close: none is left to count
    answers.send(DONE, answers.counters())
    _end()


def _quiet_once_left(stdin: IO[bytes]) -> None:
    """After the close message: wait for the application to let go of the pipe (it has left,
    or stopped waiting for this writer), then send this process's output and its log lines
    to /dev/null. The application's stderr may be a pipe its own parent reads to the end
    (``subprocess.run(capture_output=True)``): held by this process, it would keep that
    parent waiting for as long as this writer writes. What it still loses is counted in
    the store or beside it, where ``loopscope status`` reads it."""
    try:
        while stdin.read(1 << 16):
            pass
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.close(null)
    except (OSError, ValueError):
        pass


def _end() -> None:
    """Exit now, once the streams are flushed: a thread of the writer's still at work (one
    abandoned inside a write that did not end within the close's bound, counted already)
    must not run, or print, while the interpreter finalises (a daemon thread holding
    stderr's lock then makes it abort with ``Fatal Python error: _enter_buffered_busy``)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


if __name__ == "__main__":
    main()
