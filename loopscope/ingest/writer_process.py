"""The store's writer in a process of its own (the default where one can run: ``writer="auto"``;
``configure(writer="process")``, ``LOOPSCOPE_WRITER=process`` asks for it come what may):
the application ships spans, the child maps and writes them.

In the application (this module's :class:`ProcessSpanWriter`) a span costs what it costs
the thread writer: one deque append on the recording thread. A sender thread wakes every
:data:`SEND_WAIT` (sooner for a flush, a close, or a queue half full), reads each queued
span's fields once (kind, trace and span ids, times, the attribute dict, the status
text: what the mapping reads) into plain tuples, and writes them, ``marshal``-ed a chunk
at a time, to the child's stdin. That is all the Python the application runs for the
store: the mapping, Arrow, DuckDB and their GIL hand-offs (see ``connection._Home``) run
in the child (:mod:`loopscope.ingest.writer_child`), which feeds the same
:class:`~loopscope.storage.duckdb.writer.StoreWriter` the thread mode runs in the application, so
the rows are the same.

The writer's promises hold across the pipe:

* ``flush()`` sends a flush behind the spans it waits for; the child answers once its
  writer wrote them (a :class:`~loopscope.storage.flush.FlushRequest` there too).
* The queue here is bounded in spans and bytes as the thread writer's; what it drops is
  sent along with the next spans and counted in the child's health row (``loopscope status``).
* ``close()`` returns within its timeout: the child is told to close, behind the last
  spans. It writes what it holds within ``close_timeout`` (``configure(close_timeout=)``,
  ``LOOPSCOPE_CLOSE_TIMEOUT``, default 60 s), not within the application's wait: a child
  still writing when the application stops waiting (other writers and readers take their
  turns at the file, under load) is left to write on after the application's exit, and
  counts in the store what it could not write by its bound. A child that has not been
  handed everything in time is killed: what it had not written, and whatever this side
  still held, is counted as lost beside the store
  (:func:`~loopscope.storage.duckdb.health.record_beside`), as it is when the child dies while
  the application goes on.
* A child that dies unasked (the OOM killer, a ``kill -9``, a crash) costs what it had not
  written (counted, its pending flushes answered False); the next span starts a new one, whose
  check of the store closes the turns the dead one left open, up to :data:`RESTARTS` times,
  with a warning each time; after that, spans are dropped and counted, never queued for good.
* The child exits by itself when the application dies: its stdin ends, it writes what it
  has and closes its writer. It runs in a session of its own (a Ctrl-C in the terminal
  is the application's to handle), with ``-I`` and the application's ``sys.path``, so no
  ``sitecustomize`` (``loopscope run``'s, ``opentelemetry-instrument``'s) instruments it.
* The child starts from the sender thread, at once: ``configure()`` does not wait for it
  (its imports and the store's check take ~0.5 s, over by the time rows come).
* A fork of the application: the child process of the fork closes its copy of the pipe
  (never writes into the parent's stream) and starts a writer process of its own when it
  records, its losses counted under an id of its own (and its pid). Its end by ``os._exit()``
  (``multiprocessing``'s fork children) closes it as an exit does (``loopscope._exits``).
* Where the child cannot run (``writer="auto"``: a frozen executable, no Python at
  ``sys.executable``, a child that cannot start, dies before it says it is ready, or says
  nothing for :data:`READY_WAIT`), the writer given as ``fallback`` (the thread writer) takes
  over, with a warning once: no span is shipped before the child said it is ready, so the
  queued ones go to that writer, in their order, and nothing is lost.
* Turn recovery: the child's writer notes the turns it opens under its own process
  identity; it outlives the application long enough to write their ends (its stdin's EOF
  comes first), so a turn is taken for abandoned only once both are gone.
"""

from __future__ import annotations

import atexit
import collections
import json
import marshal
import os
import pickle
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import IO, Any

from .. import _json, _otel_sdk
from .._guard import guard, internal_error, logger, warn_once
from ..content.policy import ContentPolicy
from ..storage import recording
from ..storage.duckdb import health, wakeup
from ..storage.flush import FlushRequest, settle
from ..storage.limits import CLOSE_TIMEOUT, QUEUE_BYTES, WriterStats
from ..storage.limits import close_timeout as writer_close_timeout
from ..storage.policy import PersistencePolicy
from ..storage.rows import EVENT_TYPES
from . import big_values
from .mapping import row_counts, span_rows, span_size

__all__ = ["DEFAULT_MODE", "ENV", "MODES", "ProcessSpanWriter", "unavailable", "writer_mode"]

ENV = "LOOPSCOPE_WRITER"
"""``auto``, ``process`` or ``thread``: where the store's writer runs, when
``configure(writer=...)`` does not say (default :data:`DEFAULT_MODE`)."""
MODES = ("auto", "thread", "process")
"""``process``: a writer process, come what may (a child that cannot start: its spans are
dropped and counted); ``thread``: a thread of the application; ``auto``: the process where it
can run, else the thread (:func:`unavailable`, and a child that cannot start), with a warning."""
DEFAULT_MODE = "auto"
"""The writer process where one can run: the application then holds neither DuckDB nor Arrow
(its RSS after 20k calls ~1.2x the uninstrumented one's, against ~4.4x with the thread) and
its calls cost less wall time; ``thread`` keeps everything in one process."""

SEND_WAIT = 0.25
"""Seconds the first span queued waits before the sender ships what is queued (a flush, a
close or a queue half full ships at once): each wake costs the application's GIL a little,
so spans travel in batches; the child's writer then batches its writes as the thread
writer does. Shorter waits (0.02-0.05 s, or a wake every 64 spans) spare the calling
thread most of its garbage collection (queued spans are what gets promoted to the oldest
generation), but ship in more, smaller messages: under a CPU-bound burst (~15k spans a
second) the child then fell behind and spans were dropped, which 0.25 s never did."""
CONVERT_EVERY = 0.05
"""Seconds between the sender's readings of the spans queued while they wait for
:data:`SEND_WAIT`: each is read into the plain tuple the child gets (what shipping does
anyway, only sooner), so the span's own objects (the span, its attributes and event and
link lists: ~6-8 containers) are let go within ~50 ms, not ~250. The garbage collector
promotes what is still held at its second generation to the oldest, and those promotions
trigger full collections of the whole heap: in the in-process openai tool loop of
bench_openai_overhead.py they cost the calling thread ~20-35 us a call at 557b776, ~15 us
so, ~1 us at 0.02 s, where the wakes (each a GIL hand-off while the application runs)
cost the calls' median more than they saved. The messages to the child stay as large and
as few as before (shipping sooner in small messages dropped spans under a CPU-bound
burst: the child fell behind)."""
SEND_CHUNK = 256
"""Spans per message to the child: the sender holds the GIL for one chunk's reading and
``marshal`` at a time (~1-2 ms at most), then lets go while the pipe takes it."""
MESSAGE_BYTES = 4 << 20
"""Bytes of spans (as the queue's byte bound counts them) per message at most, one span at
least: the child holds a message twice while it unpacks it (its bytes and its values)."""
KILL_WAIT = 0.5
"""Seconds a killed child gets to go away before its pipes are let go regardless."""

# the messages, each a kind byte and the length of its payload, then the payload
HEADER = struct.Struct("<cI")
CONFIG, SPANS, FLUSH, CLOSE, ASK = b"C", b"S", b"F", b"Q", b"K"  # application -> child
QUIET = f"{ENV}=thread, or configure(writer='thread'), runs it there without this warning"
READY_WAIT = 30.0
"""Seconds a started child has to say it is ready (its imports, the store's check; ~0.5 s, a few
seconds on a loaded machine) before it is taken for one that cannot start: killed, and its
spans, none shipped yet, go to the fallback writer (or are counted as lost without one)."""
RESTARTS = 3
"""Times a writer starts a new child when its child ends without being asked to (the OOM
killer, a ``kill -9``, a crash in DuckDB): what that child had not written is lost (counted),
spans from then on go to the new one. Past this many, spans are dropped and counted from then
on: a child that keeps dying would cost the application a process start at each death."""
STATS_WAIT = 1.0
"""Seconds ``stats()`` waits for the child's counters as they are now (else: its last ones)."""
ACK, STATS, DONE, READY, ANSWER = b"A", b"T", b"D", b"R", b"N"  # child -> application
# (STATS: the counters now and then; ANSWER: the same, the answer to an ASK, behind every span
# sent before it: stats() waits for that one, not for a STATS that was on its way meanwhile)


def writer_mode(asked: str | None) -> str:
    """The writer mode: ``asked`` (``configure(writer=)``, checked: a ValueError for
    anything but :data:`MODES`), else :data:`ENV` (a bad value is said once and the default
    runs), else :data:`DEFAULT_MODE`."""
    if asked is not None:
        if asked not in MODES:
            raise ValueError(f"writer must be 'auto', 'thread' or 'process', not {asked!r}")
        return asked
    value = os.environ.get(ENV, "").strip().lower()
    if value and value not in MODES:
        warn_once(f"writer-env:{value}", "loopscope: %s=%s is not 'auto', 'thread' or 'process'; the default (%s) runs",
                  ENV, value, DEFAULT_MODE)
        return DEFAULT_MODE
    return value or DEFAULT_MODE


def unavailable() -> str | None:
    """Why no writer process can run here (None: it can): a frozen application (PyInstaller,
    cx_Freeze, ...: ``sys.executable`` is the application, not a Python), no executable
    ``sys.executable``, one not named ``python*``/``pypy*`` (a program that embeds Python), or
    a platform without subprocesses. A Python that is there but does not start the child is
    found when the child dies at once, or says nothing for :data:`READY_WAIT`."""
    if getattr(sys, "frozen", False):
        return "the application is a frozen executable (sys.frozen): sys.executable is not a Python to run it with"
    if sys.platform in ("emscripten", "wasi"):
        return f"{sys.platform} runs no subprocess"
    executable = sys.executable
    if not executable:
        return "there is no Python executable to run it with (sys.executable is empty)"
    if not os.access(executable, os.X_OK) or os.path.isdir(executable):
        return f"sys.executable ({executable}) is not an executable file"
    if not os.path.basename(executable).lower().startswith(("python", "pypy")):
        # a program that embeds Python (uWSGI, Blender, ...) would be started with the
        # child's arguments: never, it may do anything with them
        return f"sys.executable ({executable}) is no Python interpreter by its name (an embedding program?)"
    return None


def send(stream: IO[bytes], kind: bytes, payload: bytes) -> None:
    """Write one message to ``stream`` (its buffer flushed)."""
    stream.write(HEADER.pack(kind, len(payload)) + payload)
    stream.flush()


def receive(stream: IO[bytes]) -> tuple[bytes, bytes] | None:
    """Read one message from ``stream`` (buffered, or raw: short reads are read on); None at
    its end (or a torn message)."""
    head = _read_exactly(stream, HEADER.size)
    if head is None:
        return None
    kind, size = HEADER.unpack(head)
    payload = _read_exactly(stream, size) if size else b""
    if payload is None:
        return None
    return kind, payload


def _read_exactly(stream: IO[bytes], size: int) -> bytes | None:
    data = stream.read(size)
    if data is None or len(data) == size:
        return data
    parts = [data]
    got = len(data)
    while got < size:
        more = stream.read(size - got)
        if not more:
            return None
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def _unbuffered(stream: IO[bytes]) -> IO[bytes]:
    """The raw file under a buffered pipe, which the answers are read from: a thread blocked
    in a buffered read holds the buffer's lock, and should the interpreter finalise meanwhile
    (the application ends while its writer process, left writing, has not answered yet), the
    pipe's release would take that lock and abort (``Fatal Python error:
    _enter_buffered_busy``). A raw read holds no lock."""
    return getattr(stream, "raw", stream)


def _marshalable(value: Any) -> Any:
    """A value ``marshal`` refuses as the mapping would write it: text (JSON)."""
    try:
        marshal.dumps(value)
        return value
    except ValueError:
        return _json.dumps(value)


def _plain_dict(attributes: Any) -> dict[str, Any]:
    if not attributes:
        return {}
    return attributes if type(attributes) is dict else dict(attributes)


def shipped(items: list[tuple[int, Any, int]]) -> list[tuple[Any, ...]]:
    """What the mapping reads of each ``(kind, span, size)``, as plain tuples: kind, trace id,
    span id, start, end, attributes (the span's own dict: read by ``marshal`` right after),
    status text, and the size the byte bound counted. Runs on the application's sender
    thread, once per span."""
    fields = _otel_sdk.span_fields()  # an SDK span's fields without its properties' frames
    fast, bounded, bounded_dict = fields.types, fields.bounded, fields.bounded_dict
    attributes_of, context_of, start_of, end_of = fields.attributes, fields.context, fields.start_time, fields.end_time
    out: list[tuple[Any, ...]] = []
    add = out.append
    for kind, span, size in items:
        try:
            if type(span) in fast:
                attrs = attributes_of(span)
                d = bounded_dict(attrs) if type(attrs) is bounded else _plain_dict(attrs)
                ctx = context_of(span)
                add((kind, ctx[0], ctx[1], start_of(span), end_of(span), d, span.status.description, size))
            else:
                ctx = span.context
                status = getattr(span, "status", None)
                add((kind, ctx.trace_id, ctx.span_id, span.start_time, span.end_time, _plain_dict(span.attributes),
                     getattr(status, "description", None), size))
        except Exception:
            internal_error("writer process: read span")
    return out


def _dumps(payload: tuple[Any, ...]) -> bytes:
    try:
        return marshal.dumps(payload)
    except ValueError:  # a value marshal does not take (a foreign span's object): its text instead
        head, spans = payload[:-1], payload[-1]
        clean = [(*span[:5], {k: _marshalable(v) for k, v in span[5].items()}, *span[6:]) for span in spans]
        return marshal.dumps((*head, clean))


_CLOSE_MARK = object()  # queued by close(): the sender ships the rest, then tells the child to close
_ASK_MARK = object()  # queued by stats(): the child answers with its counters as they are


class _Pending:
    """A flush sent to the child: the request waiting for its answer, and how many spans
    had been sent before it (all of them written once it is answered)."""

    __slots__ = ("request", "sent")

    def __init__(self, request: FlushRequest, sent: int) -> None:
        self.request = request
        self.sent = sent


class ProcessSpanWriter:
    """The store's writer for this process's spans, run in a child process: the same
    options and methods as :class:`~loopscope.storage.duckdb.writer.StoreWriter` (``submit``,
    ``flush``, ``close``, ``stats``, ``report.otlp``). Raises ``pickle.PicklingError`` (or
    the error pickling raised) when the options cannot be sent to a child (a content hook
    that is a lambda, say): the caller runs the thread writer instead."""

    def __init__(
        self,
        path: str,
        *,
        policy: PersistencePolicy | None = None,
        flush_interval: float | None = None,
        max_queue: int = 200_000,
        max_bytes: int = QUEUE_BYTES,
        batch_size: int = 100_000,
        lock_timeout: float = 2.0,
        track_turns: bool = False,
        content: ContentPolicy | None = None,
        prices: Mapping[str, Any] | None = None,
        latest: bool = False,
        fallback: Callable[[], Any] | None = None,
        on_store_off: Callable[[str], None] | None = None,
        eager: bool = True,
        close_timeout: float | None = None,
    ) -> None:
        self.path = path
        # how long the child may write on after the close (this side waits CLOSE_TIMEOUT at most)
        self._writer_close = writer_close_timeout(close_timeout)
        # the default store: when the child finds it cannot be written, recording to it is off
        # (said by this callback), as the thread writer's configure() turns it off
        self._on_store_off = on_store_off
        self._fallback = fallback  # makes the writer that takes over from a child that cannot start
        self._delegate: Any = None  # that writer, once it took over
        self.max_queue = max_queue
        self.max_bytes = max_bytes
        self.batch_size = batch_size
        self._wake_bytes = max_bytes // 2
        self._cap_over, self._cut = big_values.cap((content or ContentPolicy()).store_max_chars or 0)
        hook = getattr(content, "redact", None)
        if hook is not None and getattr(hook, "__module__", None) in (None, "__main__"):
            # pickled by reference, a function of the application's script is not found in the child
            raise pickle.PicklingError(f"the content hook {hook!r} is defined in the application's main script")
        self._config = pickle.dumps({
            "path": path, "policy": policy, "flush_interval": flush_interval, "max_queue": max_queue,
            "max_bytes": max_bytes, "batch_size": batch_size, "lock_timeout": lock_timeout, "track_turns": track_turns,
            "content": content, "prices": dict(prices) if prices else None, "latest": latest, "app_pid": os.getpid(),
            "close_timeout": self._writer_close,
            "share_db": recording.shares(path),  # configure(share_db=True): the child migrates the file
        })
        # the event types the policy leaves out: a span lost here counts the rows the child's
        # mapping would have made of it (events and turns, as the store has them)
        allows = (policy or PersistencePolicy()).allows
        self._skip = frozenset(t for t in set(EVENT_TYPES.values()) if not allows(t))
        # the counters kept in the store come from the child's writer; the pipeline sets
        # report.otlp here (the exporter is this process's), sent along with the spans
        self.report = health.Report()
        self._reset(eager)  # (not eager: the child starts at the first span, if any comes)
        _live_writers.add(self)

    def _reset(self, eager: bool = True) -> None:
        """The state of a writer with no child yet (at the start, and in the child of a fork,
        which starts its writer process at its first span rather than at once: a fork that
        never records, a pool's worker say, starts none)."""
        self._queue: collections.deque[Any] = collections.deque()
        self._converted: list[tuple[Any, ...]] = []  # queued spans read already (_convert), in order
        self._arrived = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._closed = False  # spans are no longer taken (close() was called, or the child is gone)
        self._stopped = False  # close() was called
        self._gone = False  # the child ended (or never started): nothing more reaches the file
        self._off = False  # the default store cannot be written: recording to it is off, nothing counted
        self._done = threading.Event()  # the child answered the close, or is gone
        self._answered = threading.Event()  # counters came from the child
        self._ready = threading.Event()  # the child said it is ready: spans are shipped from now on
        self._start_settled = threading.Event()  # ... or it ended (or failed to start) before
        self._start_error: str | None = None  # why it did not start (a fallback follows)
        self.store_problem: str | None = None
        """Why the child found the store cannot be written (a newer loopscope's, no store, a
        read-only disk), said in its ready message; None: it can (or is held by another now)."""
        self._in_bytes = 0
        self._out_bytes = 0
        # losses in the store's rows (events, turns), as the child's mapping makes them of the spans
        self._dropped = self._dropped_turns = 0  # rows of the spans this side dropped (queue full, closed, child gone)
        self._forwarded = self._forwarded_turns = 0  # of those, sent to the child to count in the store
        self._lost = self._lost_turns = 0  # rows of spans queued here that no child will write
        self._sent_rows = [0, 0]  # rows of the spans sent to the current child
        self._children: list[dict[str, Any]] = []  # children that ended unasked: what each was sent (see _child_lost)
        self._lost_estimate = [0, 0]  # what those lost, as their last counters say (stats(); `status` reads the store)
        self._sent = 0
        self._settled = 0  # spans sent that the child has written (or dropped and counted)
        self._child: dict[str, Any] = {}  # the child's last counters
        self._earlier: dict[str, int] = {}  # the last counters of the children that died before it (added in stats())
        self._restarts = 0  # children started again after one died
        self._base = 0  # spans sent before the current child started (its counters count from 0)
        self._drop_base = self._drop_base_turns = 0  # this side's drops the dead children were told of (each child counts from 0)
        self._pending: dict[int, _Pending] = {}
        self._next_flush = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._last_error: str | None = None
        self._beside = False
        self._close_timeout: float | None = CLOSE_TIMEOUT
        self._handed = False  # the close message is in the child's pipe, behind every span sent
        self.left_writing = False
        """close() returned while the writer process still wrote what it was handed (it goes
        on alone, within ``close_timeout``)."""
        self._thread = threading.Thread(target=self._run, args=(eager,), name=f"loopscope-sender {self.path}", daemon=True)
        self._thread.start()

    # -- the hot path --------------------------------------------------------------------

    def submit(self, kind: int, span: Any) -> None:
        """Queue a span (``START`` or ``END``) for the child. Never blocks."""
        queue = self._queue
        size = len(queue)
        if size >= self.max_queue or self._closed or self._in_bytes - self._out_bytes >= self.max_bytes:
            delegate = self._delegate
            if delegate is not None:  # the writer that took over from a child that could not start
                delegate.submit(kind, span)
                return
            if self._off:  # recording to the store is off (said once): nothing is lost
                return
            events, turns = span_rows(kind, span, self._skip)
            self._dropped += events
            self._dropped_turns += turns
            return
        # an ended span: its content is final (a started one's is counted at its end); the
        # size travels with it, so the sender does not measure the span again
        counted = span_size(span) if kind else 0
        if counted > self._cap_over:  # a value far over the store's cap: cut before it is queued (big_values.py)
            span, counted = self._cut(span)
        self._in_bytes += counted
        queue.append((kind, span, counted))
        if not size:
            self._arrived.set()
        if size >= self.batch_size - 1 or self._in_bytes - self._out_bytes >= self._wake_bytes:
            self._wake.set()

    def submit_start(self, span: Any) -> None:
        self.submit(0, span)

    def submit_end(self, span: Any) -> None:
        self.submit(1, span)

    def _exporter_counts(self) -> tuple[int, int, tuple[int, int, int, str | None] | None]:
        """What this process's exporter counted (the child keeps it in the store): the
        spans it dropped and failed to send, and its start notices (None: no notices)."""
        otlp, notices = self.report.otlp, self.report.notices
        otlp_dropped, otlp_failed = otlp() if otlp is not None else (0, 0)
        return otlp_dropped, otlp_failed, notices() if notices is not None else None

    # -- control -------------------------------------------------------------------------

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Have the child write everything queued so far; True when it reached the file."""
        if self._delegate is not None:
            return self._took_over().flush(timeout)
        if self._gone or not self._thread.is_alive():
            return not self._queue and not self._gone
        request = FlushRequest()
        self._queue.append(request)
        self._wake.set()
        self._arrived.set()
        return request.wait(timeout)

    def close(self, timeout: float | None = CLOSE_TIMEOUT) -> None:
        """Ship the rest, have the child close its writer, and wait for it: within
        ``timeout`` seconds in all. A child that has every span by then (the close message
        behind them in its pipe) and is still writing is left to write on, within its
        ``close_timeout`` (:attr:`left_writing`): it counts what it cannot write in the store or
        beside it. One that has not got them all (the pipe full, the child stuck) is
        killed, and what it had not written is counted as lost (beside the store). Later
        spans are counted as dropped."""
        if self._stopped:
            return
        self._stopped = True
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._delegate is not None:
            _live_writers.discard(self)
            self._took_over(timeout).close(None if deadline is None else max(0.0, deadline - time.monotonic()))
            return

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        before_stop = self.report.before_stop
        if before_stop is not None and not self._gone:  # the exporters' last sends, counted in the child's last report
            with guard("writer before stop"):
                wait = left()
                before_stop(None if wait is None else wait / 2)  # half: the child's close needs its turn
        self._close_timeout = left()
        self._queue.append(_CLOSE_MARK)
        self._closed = True
        self._wake.set()
        self._arrived.set()
        if self._proc is not None or self._sent or self._queue:
            self._done.wait(left())
        self._thread.join(left())
        _live_writers.discard(self)
        proc = self._proc
        if not self._done.is_set() and proc is not None:
            if self._handed and proc.poll() is None:
                # it holds every span (the close came after them in its pipe) and is still
                # writing them, its file busy with other writers and readers: it goes on alone,
                # within its close_timeout, and counts in the store what it could not write
                self._leave(proc)
                proc = None
            else:
                self._kill(proc)
                if proc.returncode is not None:
                    wakeup.remove_left(self.path, proc.pid)  # what it held is counted lost: no FIFO stands for it
                self._child_gone("still writing when the store was closed")
        self._drain()  # what the sender did not get to in time
        events = self._dropped - self._forwarded + self._lost + self._lost_estimate[0]
        turns = self._dropped_turns - self._forwarded_turns + self._lost_turns + self._lost_estimate[1]
        if events or turns or self._children:
            self._record_beside()
        if events or turns:
            logger.warning("loopscope: %d events and %d turns could not be stored in %s (%s)", events, turns, self.path,
                           self._last_error or "queue full")
        if proc is not None:
            try:
                proc.wait(min(KILL_WAIT, left() or 0.0) if deadline is not None else KILL_WAIT)  # it exits right after its answer
            except subprocess.TimeoutExpired:
                pass  # reaped by Python's subprocess bookkeeping later, or at exit
            for stream in (proc.stdin, proc.stdout):
                try:
                    if stream is not None:
                        stream.close()
                except OSError:
                    pass

    def _leave(self, proc: subprocess.Popen[bytes]) -> None:
        """Stop waiting for ``proc``, which writes on after this process's close (or end): its
        stdin closed (it sends its output to /dev/null from then on, see
        ``writer_child._quiet_once_left``); its answers are not read any more (the answers
        thread, blocked in a raw read, ends with this process)."""
        self.left_writing = True
        with self._lock:
            self._proc = None  # what the answers thread still sees of it (its end: EOF, no DONE) is no loss
        with guard("writer process: leave"):
            if proc.stdin is not None:
                try:
                    proc.stdin.close()
                except OSError:
                    pass

    def stats(self) -> WriterStats:
        """The counters: this side's, and the child's as it says them now (its last ones
        when it does not answer within :data:`STATS_WAIT`)."""
        if self._delegate is not None:
            return self._took_over(STATS_WAIT).stats()
        if not self._closed and self._thread.is_alive():  # the child answers once it started
            self._answered.clear()
            self._queue.append(_ASK_MARK)
            self._wake.set()
            self._arrived.set()
            self._answered.wait(STATS_WAIT)
        child = self._child
        # spans queued here, in the pipe, and what the child holds (spans and rows not written)
        in_pipe = max(0, self._sent - self._base - child.get("received", 0))
        queued = sum(1 for item in list(self._queue) if type(item) is tuple) + len(self._converted) + in_pipe + child.get("queued", 0)
        earlier = self._earlier  # the counters of the children that died (a new one counts from 0)

        def count(name: str) -> int:
            return child.get(name, 0) + earlier.get(name, 0)

        return WriterStats(
            queued=0 if self._gone else queued,
            written_events=count("written_events"),
            written_turns=count("written_turns"),
            dropped=count("dropped") + self._dropped - self._forwarded + self._lost + self._lost_estimate[0],
            dropped_turns=(count("dropped_turns") + self._dropped_turns - self._forwarded_turns + self._lost_turns
                           + self._lost_estimate[1]),
            excluded=count("excluded"),
            failed_writes=count("failed_writes"),
            batches=count("batches"),
            last_error=self._last_error or child.get("last_error"),
            queued_bytes=max(0, self._in_bytes - self._out_bytes) + child.get("queued_bytes", 0),
            lost_from_file=count("lost_from_file"),
            written_calls=count("written_calls"),
        )

    def child_pid(self) -> int | None:
        """The writer process's pid (None before it started, or when the thread took over)."""
        proc = self._proc
        return proc.pid if proc is not None and self._delegate is None else None

    @property
    def mode(self) -> str:
        """``process``, or ``thread`` once the fallback writer took over from a child that
        could not start (``starting`` while a child that may yet fail starts)."""
        if self._delegate is not None:
            return "thread"
        return "process" if self._ready.is_set() or self._fallback is None else "starting"

    def wait_started(self, timeout: float | None = None) -> str:
        """Wait until the child said it is ready, or the fallback took over; the mode then."""
        self._start_settled.wait(timeout)
        if self._delegate is not None:
            self._thread.join(timeout)  # the sender hands its queue over, then ends
        return self.mode

    def _took_over(self, timeout: float | None = None) -> Any:
        """The fallback writer, once the sender handed it what was queued here (a flush,
        a close or the counters must come after those spans)."""
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        return self._delegate

    # -- the sender thread ---------------------------------------------------------------

    def _run(self, eager: bool = True) -> None:
        if eager:
            # at once, in the background: its imports and the store's check (~0.5 s) are over
            # by the time the first rows come, and configure() does not wait for them
            with guard("store writer process"):
                if self._proc is None and not self._closed:
                    self._start()
            if self._delegate is not None:
                return  # no child could start: the thread writer took over, and the queue
        while True:
            self._arrived.wait()
            self._arrived.clear()
            deadline = time.monotonic() + SEND_WAIT
            while not self._wake.wait(min(CONVERT_EVERY, max(0.0, deadline - time.monotonic()))):
                if time.monotonic() >= deadline:
                    break
                with guard("store writer process"):
                    self._convert()
            self._wake.clear()
            closing = self._closed
            with guard("store writer process"):
                self._ship()
            if closing or self._gone or self._delegate is not None:
                return
            if self._queue:
                # queued while it shipped (submit() wakes this thread only for a first span
                # in an empty queue): their wait starts now
                self._arrived.set()

    def _convert(self) -> None:
        """Read the spans at the head of the queue (up to its first mark: a flush, the
        close) into :attr:`_converted`, the tuples the child gets, ahead of shipping them."""
        if self._proc is None or self._gone or not self._ready.is_set():
            # before the child runs, _ship decides whether one is needed at all; before it is
            # ready, the spans stay SDK spans: a child that never gets ready hands them over
            # to the thread writer, which reads spans, not the child's tuples
            return
        queue, popleft = self._queue, self._queue.popleft
        items: list[tuple[int, Any, int]] = []
        while queue:
            item = popleft()
            if type(item) is not tuple:
                queue.appendleft(item)  # a mark: it and what follows wait for _ship, in order
                break
            items.append(item)
        if items:
            self._converted += shipped(items)

    def _ship(self) -> None:
        """Send what is queued now, in chunks, flushes and the close in their places."""
        if self._gone:
            return
        if self._proc is None:
            if not self._converted and not any(type(item) is tuple for item in list(self._queue)):
                # nothing to write (a fork that never recorded, closing): no process for it
                marks = [self._queue.popleft() for _ in range(len(self._queue))]
                settle([m for m in marks if type(m) is FlushRequest], True, "store writer process")
                if _CLOSE_MARK in marks:
                    self._done.set()
                if _ASK_MARK in marks:
                    self._answered.set()
                return
            if not self._start():
                return
        if not self._ready.is_set() and not self._wait_ready():
            return
        proc = self._proc
        if proc is None or proc.stdin is None:
            return  # it died right after it was ready: the next child gets what is queued
        stdin = proc.stdin
        converted, self._converted = self._converted, []  # read already: they go first
        self._out_bytes += sum([span[7] for span in converted])  # as submit() counted them
        if not self._send_spans(proc, converted):
            self._child_ended(proc)
            return
        queue, popleft = self._queue, self._queue.popleft
        left = len(queue)
        # half the byte bound queued: the child's writer writes at once too (a flush it does
        # not answer), as the thread writer would, rather than at its interval
        urgent = self._in_bytes - self._out_bytes + self._child.get("queued_bytes", 0) >= self._wake_bytes
        while left > 0:
            spans: list[tuple[int, Any, int]] = []
            mark: Any = None
            while left > 0 and len(spans) < SEND_CHUNK:
                item = popleft()
                left -= 1
                if type(item) is tuple:
                    spans.append(item)
                else:
                    mark = item
                    break
            self._out_bytes += sum([item[2] for item in spans])  # as submit() counted them
            if spans and not self._send_spans(proc, shipped(spans)):
                if type(mark) is FlushRequest:
                    settle([mark], False, "store writer process")
                elif mark is not None:  # the close, or stats()'s question: for the next child, in its place
                    queue.appendleft(mark)
                self._child_ended(proc)
                return
            try:
                if spans and urgent and not self._closed:
                    send(stdin, FLUSH, marshal.dumps(0))  # number 0: not answered
                    urgent = False
                if type(mark) is FlushRequest:
                    with self._lock:
                        number = self._next_flush = self._next_flush + 1
                        self._pending[number] = _Pending(mark, self._sent)
                    send(stdin, FLUSH, marshal.dumps(number))
                elif mark is _ASK_MARK:
                    send(stdin, ASK, b"")
                elif mark is _CLOSE_MARK:
                    timeout = self._close_timeout
                    # the child writes what it holds within close_timeout, or a little less than what
                    # this side waits if that is longer (it may go on after this side stopped
                    # waiting: see close()), with the exporters' last counts (their last sends ran in close())
                    bound = None if timeout is None else max(timeout * 0.8, self._writer_close)
                    send(stdin, CLOSE, _dumps((bound, self._drops_to_forward(), *self._exporter_counts(), [])))
                    self._handed = True
                    if self._reader is None:
                        self._read(proc, self._base)
                    return
            except (OSError, ValueError):  # a broken pipe: the child is gone (what it was sent is counted lost then)
                if type(mark) is FlushRequest:
                    settle([mark], False, "store writer process")
                elif mark is not None:
                    queue.appendleft(mark)
                self._child_ended(proc)
                return

    def _send_spans(self, proc: subprocess.Popen[bytes], tuples: list[tuple[Any, ...]]) -> bool:
        """Send read spans (:func:`shipped`'s tuples) to ``proc`` in messages of :data:`SEND_CHUNK`,
        each with this side's drop count; False when the pipe broke (the child is gone): what
        was not sent goes back to the head of :attr:`_converted`, for a new child (or counted
        as lost by :meth:`_child_gone`); what was, is counted lost by :meth:`_child_ended`."""
        stdin = proc.stdin
        assert stdin is not None
        first, count = 0, len(tuples)
        while first < count:
            # up to SEND_CHUNK spans, and MESSAGE_BYTES as the byte bound counts them (one span
            # at least): the writer process reads a message whole, then unpacks it, so a chunk of
            # large values (1 MiB tool results) would hold it twice over, past its own bounds
            end, size = first + 1, tuples[first][7]
            while end < count and end - first < SEND_CHUNK and size + tuples[end][7] <= MESSAGE_BYTES:
                size += tuples[end][7]
                end += 1
            part = tuples[first:end]
            try:
                dropped, dropped_turns = self._dropped, self._dropped_turns
                send(stdin, SPANS, _dumps(((dropped - self._drop_base, dropped_turns - self._drop_base_turns),
                                           *self._exporter_counts(), part)))
            except (OSError, ValueError):
                unsent = tuples[first:]
                self._out_bytes -= sum([span[7] for span in unsent])  # counted again when they are shipped
                self._converted[:0] = unsent
                return False
            skip = self._skip
            events = turns = 0
            for span in part:  # the rows the child's mapping makes of them (kind, attributes)
                e, t = row_counts(span[0], span[5], skip)
                events += e
                turns += t
            with self._lock:  # the answers thread may have counted this child's losses meanwhile
                self._forwarded, self._forwarded_turns = dropped, dropped_turns
                if proc is self._proc:
                    self._sent += len(part)
                    self._sent_rows[0] += events
                    self._sent_rows[1] += turns
                else:  # into a pipe whose child was found dead since: lost with it
                    self._lost += events
                    self._lost_turns += turns
            first = end
        return True

    def _drops_to_forward(self) -> tuple[int, int]:
        """This side's drops (events, turns) the current child is to count in its row."""
        return self._dropped - self._drop_base, self._dropped_turns - self._drop_base_turns

    def _child_lost(self, proc: subprocess.Popen[bytes] | None) -> None:
        """(Under the lock) the current child ended unasked (killed, crashed, or cut off at the
        close): what it was sent is noted for the record beside the store, where ``loopscope
        status`` sets it against the child's row in the store (written in each batch's
        transaction), so that what the child wrote before it ended is never counted as lost,
        and what it did not write always is. Its last counters give the estimate ``stats()``
        shows meanwhile."""
        sent_events, sent_turns = self._sent_rows
        forwarded = (self._forwarded - self._drop_base, self._forwarded_turns - self._drop_base_turns)
        if sent_events or sent_turns or any(forwarded):
            child = self._child
            accounted = (
                child.get("written_events", 0) + child.get("dropped", 0),
                child.get("written_turns", 0) + child.get("dropped_turns", 0),
            )
            self._lost_estimate[0] += max(0, sent_events + forwarded[0] - accounted[0])
            self._lost_estimate[1] += max(0, sent_turns + forwarded[1] - accounted[1])
            self._children.append({
                "pid": proc.pid if proc is not None else None, "writer_id": child.get("writer_id"),
                "sent_events": sent_events, "sent_turns": sent_turns,
                "forwarded_events": forwarded[0], "forwarded_turns": forwarded[1],
            })
        self._sent_rows = [0, 0]
        self._drop_base, self._drop_base_turns = self._forwarded, self._forwarded_turns

    def _wait_ready(self) -> bool:
        """Wait (on the sender thread) for the child to say it is ready; False when it will not
        be (the fallback writer then took over, or the child is gone), or the writer was closed
        meanwhile and the child is not ready yet."""
        proc = self._proc
        if proc is None:
            return False  # it died and was let go of meanwhile: the sender's next pass starts the next one
        if self._reader is None and proc.stdout is not None:
            # no answers thread (at exit, where no thread starts): its first message, here
            first = receive(_unbuffered(proc.stdout))
            if first is not None and first[0] == READY:
                self._said_ready(first[1])
            else:
                self._start_error = "the writer process ended before it was ready"
            self._start_settled.set()
        if not self._start_settled.wait(READY_WAIT):
            self._start_error = f"the writer process said nothing for {READY_WAIT:.0f} s after its start"
            self._kill(proc)
            self._start_settled.wait(KILL_WAIT)  # its EOF, read by the answers thread
        if self._ready.is_set():
            return not self._off and not self._gone
        reason = self._start_error or "the writer process did not start"
        if self._fallback is not None:
            self._fall_back(reason)
        else:
            self._child_gone(reason)
        return False

    def _said_ready(self, payload: bytes) -> None:
        """The child's ready message, with its check of the store."""
        self.store_problem = problem = marshal.loads(payload)
        if problem is not None:  # before the sender sees it ready: it ships nothing then
            if self._on_store_off is not None:
                self._switch_off(problem)
            else:
                # a store given explicitly that cannot be written (configure() did not wait for
                # this check): said once, its events counted as lost, beside the store (`status`)
                self._child_gone(problem)
                if self._proc is not None:
                    self._kill(self._proc)
        self._ready.set()
        self._start_settled.set()

    def _switch_off(self, problem: str) -> None:
        """The default store cannot be written (the child's check says why): recording to it
        is off, said once by ``on_store_off``, as with the thread writer, whose configure()
        finds it; the child, which has nothing it can do, is stopped, and what was queued is let
        go uncounted (no event was ever recorded to this store) and its flushes answered."""
        with self._lock:
            self._off = self._gone = self._closed = True
        with guard("writer process: store off"):
            assert self._on_store_off is not None
            self._on_store_off(problem)
        self._drain()
        self._in_bytes = self._out_bytes = 0
        self._done.set()
        self._answered.set()
        if self._proc is not None:
            self._kill(self._proc)

    def _fall_back(self, reason: str) -> None:
        """The child cannot run: the fallback writer (the thread writer) gets what is queued,
        in its order, and every span from now on; said once in a warning. Runs on the sender
        thread, which ends after it."""
        fallback, self._fallback = self._fallback, None
        assert fallback is not None
        self._proc = None
        try:
            delegate = fallback()
        except Exception as exc:  # the thread writer cannot run either: spans are dropped and counted
            internal_error("writer process: fallback")
            self._child_gone(f"{reason}; the thread writer could not start either ({exc})")
            return
        report = delegate.report
        report.otlp, report.notices, report.before_stop = self.report.otlp, self.report.notices, self.report.before_stop
        self.report = report
        delegate.count_dropped(self._dropped, self._dropped_turns)  # this side's queue was full: said in the store's row
        self._dropped = self._forwarded = self._dropped_turns = self._forwarded_turns = 0
        closing = False
        # the queue handed over; spans submitted meanwhile see _closed (set right after the
        # first pass) and go to the new writer directly: a second pass takes what came between
        self._delegate = delegate
        for _ in range(2):
            queue = self._queue
            while queue:
                item = queue.popleft()
                if type(item) is tuple:
                    delegate.submit(item[0], item[1])  # (kind, span, the size counted here)
                elif type(item) is FlushRequest:
                    delegate.flush_then(lambda ok, request=item: settle([request], ok, "store writer"))
                elif item is _ASK_MARK:
                    self._answered.set()
                elif item is _CLOSE_MARK:
                    closing = True
            self._closed = True
        self._in_bytes = self._out_bytes = 0
        warn_once("writer-fallback", "loopscope: the store's writer runs in a thread: %s (%s)", reason, QUIET)
        if closing:  # close() was called meanwhile, and waits: the new writer closes in what is left
            timeout = self._close_timeout
            delegate.close(timeout)
        self._done.set()

    def _start(self) -> bool:
        """Start the child (from the sender thread, at the first span); False when it cannot."""
        command = [sys.executable, "-I", "-c", _CHILD_CODE, json.dumps(_child_path())]
        proc = None
        try:
            if not sys.executable:
                raise OSError("no Python executable to run the writer process (sys.executable is empty)")
            proc = subprocess.Popen(  # this interpreter, a fixed module
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True, close_fds=True,
                env={**CHILD_ENV, **os.environ},
            )
            assert proc.stdin is not None
            _widen(proc.stdin)
            send(proc.stdin, CONFIG, self._config)
        except (OSError, ValueError) as exc:
            reason = f"cannot start the writer process: {exc}"
            if proc is not None:  # it started, and ended before it read its options
                code = self._exit_status(proc)
                reason = f"the writer process ended at once ({sys.executable}: exit status {code})"
            if self._fallback is not None:
                self._fall_back(reason)
                return False
            self._last_error = reason
            self._child_gone(self._last_error)
            return False
        self._proc = proc
        self._base = self._sent
        reader = threading.Thread(target=self._read, args=(proc, self._base), name=f"loopscope-answers {self.path}",
                                  daemon=True)
        try:
            reader.start()
            self._reader = reader
        except RuntimeError:  # at exit Python 3.12+ starts no thread: the answers are read after the close
            self._reader = None
        return True

    # -- the answers thread --------------------------------------------------------------

    def _read(self, proc: subprocess.Popen[bytes], base: int) -> None:
        """Read ``proc``'s answers until it ends; its counters count the spans sent to it,
        the first of which was the ``base``-th this writer sent."""
        assert proc.stdout is not None
        stdout = _unbuffered(proc.stdout)
        try:
            while True:
                message = receive(stdout)
                if message is None or proc is not self._proc:
                    break  # (a child found dead and replaced: what it still says is stale)
                kind, payload = message
                if kind == READY:
                    self._said_ready(payload)
                elif kind == ACK:
                    number, ok, counters = marshal.loads(payload)
                    self._child = counters
                    with self._lock:
                        pending = self._pending.pop(number, None)
                    if pending is not None:
                        if ok:  # every span sent before it is written
                            self._settled = max(self._settled, pending.sent)
                        settle([pending.request], ok, "store writer process")
                elif kind in (STATS, ANSWER):
                    self._child = counters = marshal.loads(payload)
                    self._settled = max(self._settled, base + counters.get("settled", 0))
                    if kind == ANSWER:  # to stats()'s question: every span queued before it counted
                        self._answered.set()
                elif kind == DONE:
                    self._child = counters = marshal.loads(payload)
                    self._settled = max(self._settled, base + counters.get("settled", 0))
                    self._done.set()
                    return
        except (OSError, ValueError, EOFError, TypeError):
            pass
        if proc is not self._proc:
            return  # replaced already (the sender found it dead first), or the fallback took over
        if not self._ready.is_set():
            code = self._exit_status(proc)
            if self._fallback is not None:
                # before it was ready: the sender hands the spans to the fallback writer
                self._start_error = self._start_error or f"the writer process ended at once ({sys.executable}: exit status {code})"
                self._start_settled.set()
                return
            self._start_settled.set()
            self._child_gone("the writer process ended" + (f" (exit status {code})" if code is not None else ""))
            return
        self._child_ended(proc)

    # -- losses --------------------------------------------------------------------------

    def _child_ended(self, proc: subprocess.Popen[bytes]) -> None:
        """``proc``, ready once, ended without being asked to close: seen by the answers thread
        (its answers end) or the sender (a broken pipe), whichever comes first; the other finds
        it replaced and does nothing. What it had not written is lost (counted, beside the store),
        and the flushes waiting on it answered False; the next span starts a new child (its
        store check closes the turns the dead one left open), up to :data:`RESTARTS` times,
        after which everything is dropped and counted (:meth:`_child_gone`). Which thread handles
        it is decided first: the other returns at once, without waiting for the child's exit."""
        pending: list[_Pending] = []
        lost = 0
        with self._lock:
            if proc is not self._proc or self._gone:
                return  # the other thread handles it
            restart = not self._stopped and not self._off and self._restarts < RESTARTS
            if restart:
                self._restarts += 1
                self._proc = None  # the sender starts the next child at the next span
                self._fallback = None  # it ran here once: a new one that cannot start is not the thread's case
                self._ready.clear()
                self._start_settled.clear()
                self._start_error = None
                pending, self._pending = list(self._pending.values()), {}
                self._settled = self._sent
                estimate = self._lost_estimate[0]
                self._child_lost(proc)
                lost = self._lost_estimate[0] - estimate
                for name, value in self._child.items():
                    if type(value) is int and name not in ("queued", "queued_bytes", "settled", "received"):
                        self._earlier[name] = self._earlier.get(name, 0) + value
                self._child = {}
            else:
                pending = self._mark_gone()
        code = self._exit_status(proc)
        if code is None:  # its pipes ended, yet it runs: it is of no use any more
            self._kill(proc)
            code = proc.returncode
        if code is not None:
            wakeup.remove_left(self.path, proc.pid)  # killed before it removed its holding FIFO
        reason = "the writer process ended" + (f" (exit status {code})" if code is not None else "")
        if not restart:
            self._lose_all(reason, pending)
            return
        self._last_error = reason
        settle([p.request for p in pending], False, "store writer process")
        self._record_beside()
        logger.warning("loopscope: %s; a new one starts (%d of %d)%s", reason, self._restarts, RESTARTS,
                       f"; {lost} events it had not written to {self.path} are lost" if lost else "")
        self._arrived.set()  # what is queued goes to the new child

    def _child_gone(self, reason: str) -> None:
        """The child ended without closing (killed, crashed, never started): what it had not
        written is lost, and so is everything from now on; counted, beside the store."""
        with self._lock:
            if self._gone:
                return
            pending = self._mark_gone()
        self._lose_all(reason, pending)

    def _mark_gone(self) -> list[_Pending]:
        """(Under the lock) nothing more reaches the file: later spans are dropped and counted;
        the flushes waiting on the child, taken for :meth:`_lose_all` to answer."""
        self._gone = True
        self._closed = True
        pending, self._pending = list(self._pending.values()), {}
        self._child_lost(self._proc)
        return pending

    def _lose_all(self, reason: str, pending: list[_Pending]) -> None:
        """After :meth:`_mark_gone`: what the child had not written, and what is queued, counted
        as lost (beside the store), its ``pending`` flushes answered False."""
        self._settled = self._sent
        self._drain()
        self._last_error = reason
        settle([p.request for p in pending], False, "store writer process")
        self._done.set()
        self._record_beside()
        warn_once(f"writer-process:{self.path}", "loopscope: %s; events for %s are dropped and counted", reason, self.path)

    def _drain(self) -> None:
        """Empty the queue for good: its spans counted as lost, its flushes answered as failed
        (with recording to the store off: nothing lost, flushes done). One pass that pops each
        item once, so a flush queued meanwhile is answered too."""
        skip = self._skip
        events = turns = 0
        for span in self._converted:
            e, t = row_counts(span[0], span[5], skip)
            events += e
            turns += t
        self._converted = []
        flushes: list[FlushRequest] = []
        queue = self._queue
        while queue:
            item = queue.popleft()
            if type(item) is tuple:
                e, t = span_rows(item[0], item[1], skip)
                events += e
                turns += t
            elif type(item) is FlushRequest:
                flushes.append(item)
        if not self._off:
            self._lost += events
            self._lost_turns += turns
        settle(flushes, self._off, "store writer process")

    def _record_beside(self) -> None:
        """Count beside the store what the child's row in it cannot hold: what this side
        dropped and did not hand on, and what was lost with the child."""
        counters = health.Counters(
            dropped_queue_full=self._dropped - self._forwarded, dropped_unwritable=self._lost,
            turns_dropped_queue_full=self._dropped_turns - self._forwarded_turns, turns_dropped_unwritable=self._lost_turns,
            last_error=self._last_error, last_error_at=time.time() if self._last_error else None, queue_size=self.max_queue,
        )
        if not (counters.dropped_queue_full or counters.dropped_unwritable or counters.turns_dropped_queue_full
                or counters.turns_dropped_unwritable or self._children or self._beside):
            return
        # an entry of its own (the child's writer keeps one under its id, which this must not replace):
        # `status` shows it as a row of the application's pid, with what its children that ended
        # unasked did not write (their rows in the store set against what they were sent)
        if health.record_beside(self.path, self.report.writer_id, counters, children=list(self._children)):
            self._beside = True

    @staticmethod
    def _exit_status(proc: subprocess.Popen[bytes]) -> int | None:
        try:
            return proc.wait(KILL_WAIT)
        except subprocess.TimeoutExpired:
            return None

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes]) -> None:
        try:
            proc.kill()
            proc.wait(KILL_WAIT)
        except (OSError, subprocess.TimeoutExpired):
            pass

    def _forked(self) -> None:
        """In the child of a fork: let go of the parent's pipes (without writing into them)
        and start afresh; a writer process of its own starts at its first span."""
        if self._delegate is not None:
            return  # the thread writer that took over sees the fork itself
        proc = self._proc
        if proc is not None:
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    # the parent's pipe let go of (its writer process sees EOF once the parent
                    # ends, whatever this process does), and /dev/null in its place: the stale
                    # file object may still close its descriptor some day, which must not be
                    # a file this process opened meanwhile
                    try:
                        null = os.open(os.devnull, os.O_RDWR)
                        os.dup2(null, stream.fileno())
                        os.close(null)
                    except (OSError, ValueError):
                        pass
            proc.returncode = 0  # not this process's child: never waited for here
        stopped = self._stopped
        self._reset(eager=False)
        self._closed = self._stopped = stopped
        # another writer: its losses are counted beside the store under an id of its own (the
        # parent's, or a sibling fork's entry must not be replaced by this one), and its writer
        # process names this process as its application
        self.report.writer_id = os.urandom(16).hex()
        with guard("writer process: fork"):
            config = pickle.loads(self._config)  # made by this writer: its own options
            config["app_pid"] = os.getpid()
            self._config = pickle.dumps(config)


CHILD_ENV = {"ARROW_DEFAULT_MEMORY_POOL": "system", "MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": "262144"}
"""The writer process's allocators, unless the application's environment sets them: Arrow's
rows through the C allocator (its default, jemalloc, kept ~30-40 MB of freed batches), which
the child gives back to the system after its writes (``malloc_trim``), in at most two arenas
(glibc makes up to eight a core, one per thread that allocates: the reader, the writer, DuckDB's).
A block of 256 KiB or more is its own mapping, returned when freed: glibc's threshold otherwise
rises to the largest block freed (up to 32 MiB), and the 1 MiB values received, queued and
copied into a batch's Arrow rows then stayed in the heap until the trim after the batch (the
writer's peak with 1 MiB tool results 360-365 MiB against 414-417, ``bench_big_values.py``).
With DuckDB's allocator settings (``connection._ALLOCATOR``) the writer process held ~200 MB
after 8,000 calls, flat, where it held 238-268 MB and grew (``benchmarks/bench_memory.py``)."""

PIPE_BYTES = 1 << 20
"""The pipe's buffer asked for (Linux's default is 64 KiB, its default ceiling 1 MiB): a chunk
of spans (up to ~300 KB) then goes in one write, where 64 KiB took several, each taking the
application's GIL back once the child had drained the pipe."""


def _widen(stream: IO[bytes]) -> None:
    try:
        import fcntl

        fcntl.fcntl(stream.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)  # pyright: ignore[reportAttributeAccessIssue]  # Linux only
    except (ImportError, AttributeError, OSError):
        pass  # another platform, or a lower ceiling: the default buffer works, in more writes


def _child_path() -> list[str]:
    """The application's import path for the child (which runs with ``-I``): loopscope's own
    folder first, so it is the same loopscope, then the rest but the ``sitecustomize``
    folders ``loopscope run`` puts first."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    root = os.path.dirname(package)
    boot = os.path.join(package, "_autostart", "boot")
    return [root, *(p for p in sys.path if p and os.path.abspath(p) not in (boot, root))]


_CHILD_CODE = "import sys, json; sys.path[:0] = json.loads(sys.argv[1]); from loopscope.ingest.writer_child import main; main()"

_live_writers: weakref.WeakSet[ProcessSpanWriter] = weakref.WeakSet()


def _after_fork() -> None:
    for writer in list(_live_writers):
        try:
            writer._forked()
        except Exception:
            internal_error("writer process: fork")


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


@atexit.register
def _close_all() -> None:
    for writer in list(_live_writers):
        try:
            writer.close()
        except Exception:
            logger.warning("loopscope: could not flush %s at exit", writer.path, exc_info=True)
