"""Received spans to rows: :class:`Ingest` routes the spans of each request to the store's
writers (pending copies -> start rows, loopscope's own spans -> end rows, other
instrumentations' spans -> the :class:`~loopscope.ingest.foreign.Assembler`), and answers
once the rows are in the file; :class:`ByteBudget` bounds the payload bytes held at once."""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ... import _json
from ... import semconv as a
from ..._guard import guard, internal_error
from ...storage.queries import open_reader, open_sink, prepare
from ..foreign import AGENT, Assembler, classify
from ..scores import foreign_scores
from ..spans import Ctx, SpanRecord, is_own
from ..stitch_foreign import Stitcher
from ..writer import SPANS
from .decode import _KINDS, _STATUS, Received

_STARTS = frozenset({a.OP_INVOKE_AGENT, a.OP_EXECUTE_TOOL})
_OWN_ROLES = {a.OP_INVOKE_AGENT: AGENT, a.OP_EXECUTE_TOOL: "tool", a.OP_CHAT: "chat"}
DEFAULT_MAX_QUEUED_BYTES = 64 * 1024 * 1024
"""Payload bytes (decompressed) held at once, from reading a request to its rows' write."""


_ROUTING_GUARD, _IDLE_GUARD = guard("collector routing"), guard("collector idle traces")


def _span_key(text: Any) -> tuple[int, int] | None:
    """A span named as 48 hex digits (trace id, span id), or None."""
    if type(text) is not str or len(text) != 48:
        return None
    try:
        return int(text[:32], 16), int(text[32:], 16)
    except ValueError:
        return None


def _seen_key(ctx: Ctx) -> int:
    """A span's key among the latest requests' (see ``Ingest.dedupe_window``)."""
    return ctx.span_id ^ (ctx.trace_id & 0xFFFFFFFFFFFFFFFF) ^ (ctx.trace_id >> 64)


class StoreUnavailable(Exception):
    """The rows could not be written in time (the file is held elsewhere, the disk is full)."""


def _raw_row(received: Received, role: str | None, framework: str | None, now_us: int) -> tuple[Any, ...]:
    span = received.span
    kind = span.kind
    return (
        f"{span.context.trace_id:032x}",
        f"{span.context.span_id:016x}",
        f"{span.parent.span_id:016x}" if span.parent is not None else None,
        span.name,
        _KINDS[kind] if 0 <= kind < len(_KINDS) else str(kind),
        span.start_time // 1000,
        span.end_time // 1000,
        round((span.end_time - span.start_time) / 1e6, 3),
        _STATUS[span.status.status_code] if 0 <= span.status.status_code < 3 else str(span.status.status_code),
        span.status.description,
        _json.dumps(span.attributes),
        received.resource_json,
        _json.dumps([{"name": e.name, "time_unix_nano": e.timestamp, "attributes": e.attributes} for e in span.events]) if span.events else "[]",
        _json.dumps(span.links) if span.links else "[]",
        span.instrumentation_scope.name or None,
        span.instrumentation_scope.version,
        received.service,
        role,
        framework,
        now_us,
    )


# -- ingest: spans -> rows ------------------------------------------------------------------------


@dataclass
class CollectorStats:
    """What a collector received and refused since it started (printed when it stops).

    These count *requests*, at the receiver: what senders sent and what they were told to
    retry or were refused (4xx, 503), printed when the collector stops. A traces request
    refused whole is also counted by the store writer (:meth:`Ingest.refused`), in the
    store for ``loopscope status``: its sender does not send it again, so what it carried
    is missing from the store. What happens to the rows of accepted requests (written,
    dropped, failed writes) is the store writer's to count, in
    :class:`loopscope.storage.duckdb.health.Counters`."""

    requests: int = 0
    spans: int = 0
    pending: int = 0
    refused: int = 0  # bad requests (4xx)
    too_many_spans: int = 0  # of those, traces requests of more than max_spans spans (413)
    rejected_spans: int = 0  # spans with bad ids left out of requests otherwise stored (partial success)
    duplicates: int = 0  # spans of a request received again in this run, left out
    unavailable: int = 0  # 503: the store could not be written in time
    busy: int = 0  # 503 / RESOURCE_EXHAUSTED: over max_queued_bytes (the sender retries)
    busy_bytes: int = 0  # the payload bytes of those
    unauthorized: int = 0  # 401: no or a wrong bearer token
    misdirected: int = 0  # 421 / 403: another Host or Origin (DNS rebinding)
    metrics_requests: int = 0
    logs_requests: int = 0


_TRIM_AFTER = 16 * 1024 * 1024


_libc: list[Any] = []


def _malloc_trim() -> None:
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return
    if not _libc:
        try:
            _libc.append(ctypes.CDLL("libc.so.6").malloc_trim)
        except (OSError, AttributeError):  # another C library (musl has no malloc_trim)
            _libc.append(None)
    if _libc[0] is not None:
        _libc[0](0)


class ByteBudget:
    """The payload bytes a collector holds at once. A request takes its share before it is
    read (and more as it turns out larger, decompressed) and gives it back once its rows
    are written; one that finds the budget spent is refused (the sender retries). A
    request whose rows could not be written in time leaves its share *parked*: its spans
    are still queued, so the share comes back only once the writer's queue is empty.
    When nothing is held, any one request is let in (``max_bytes`` bounds it)."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"max_queued_bytes must be positive, got {limit}")
        self.limit = limit
        self.used = 0
        self.parked = 0
        self.peak = 0
        self._freed = 0
        self._lock = threading.Lock()

    def take(self, size: int) -> bool:
        with self._lock:
            if self.used and self.used + size > self.limit:
                return False
            self.used += size
            self.peak = max(self.peak, self.used)
            return True

    def give(self, size: int) -> None:
        with self._lock:
            self.used -= size
            self._freed += size

    def trim(self) -> None:
        """Once nothing is held and much was freed, hand the free heap back to the system:
        glibc keeps what large requests' threads freed in their arenas otherwise."""
        with self._lock:
            if self.used or self._freed < _TRIM_AFTER:
                return
            self._freed = 0
        _malloc_trim()

    def park(self, size: int) -> None:
        with self._lock:
            self.parked += size

    def unpark(self) -> None:
        with self._lock:
            self.used -= self.parked
            self.parked = 0


class _Share:
    """One request's bytes of the budget, given back once each of its ``parts`` (its
    events and turns; its raw spans) is written, or parked if one could not be."""

    __slots__ = ("_lock", "budget", "failed", "left", "size")

    def __init__(self, budget: ByteBudget, size: int, parts: int) -> None:
        self.budget, self.size, self.left, self.failed = budget, size, parts, False
        self._lock = threading.Lock()

    def done(self, ok: bool) -> None:
        with self._lock:
            self.left -= 1
            self.failed = self.failed or not ok
            if self.left:
                return
        if self.failed:
            self.budget.park(self.size)
        else:
            self.budget.give(self.size)


def _settled(ok: bool) -> None:
    """A flush nobody waits for (the row of a refused request's count)."""


class Ingest:
    """Spans in (already decoded and checked), rows out through the store's sink (``open_sink``).

    Thread-safe: requests are routed one at a time (the order of a request's spans is
    the order of their rows), and then wait together for the writer.

    A request returns once its events, turns and the raw copies of its spans (the
    ``spans`` table) are in the file. They are written in one transaction (the request's
    spans and raw rows are one entry of the writer's queue, see
    :meth:`~loopscope.storage.duckdb.writer.StoreWriter.begin_bundle`): a collector killed at any
    moment keeps a request whole or not at all, never model-call rows without the spans
    they came from (the raw copies had a writer of their own, a transaction behind).
    """

    def __init__(
        self,
        path: str,
        *,
        raw: bool = True,
        max_pending_ids: int = 100_000,
        dedupe_window: int = 200_000,
        idle_seconds: float = 60.0,
        flush_timeout: float = 30.0,
        flush_interval: float = 0.5,
        lock_timeout: float = 2.0,
        max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES,
    ) -> None:
        self.flush_timeout = flush_timeout
        self.max_pending_ids = max_pending_ids
        self.budget = ByteBudget(max_queued_bytes)
        self.path = prepare(path, timeout=max(10.0, lock_timeout))  # made or migrated for writing
        self.writer = open_sink(self.path, mapping=SPANS, flush_interval=flush_interval, lock_timeout=lock_timeout,
                                skip_stored=True)
        self.reader = open_reader(self.path, lock_timeout=flush_timeout)  # the start look-ups (_starts_stored)
        self.raw = raw  # keep the raw copies of the spans received (the ``spans`` table)
        # model calls under no agent run (a bare instrumented SDK loop) are stitched into turns
        self.assembler = Assembler(idle_seconds=idle_seconds, stitcher=Stitcher(idle_seconds=idle_seconds))
        self.stats = CollectorStats()
        self._pending: collections.OrderedDict[tuple[int, int], None] = collections.OrderedDict()
        # start notices waiting for the span they follow (see notices()), and their count
        self._held: dict[tuple[int, ...], list[tuple[SpanRecord, float]]] = {}  # (trace, span) before it, (trace, span, 1) after
        self._held_count = 0
        self.notice_wait = 10.0  # seconds a notice waits for its span; then it is written anyway
        self.max_held_notices = 100_000
        # loopscope's own model and tool calls whose agent run's start was not noticed (no
        # notices sent, or lost): held until that run's start rows are written, so that its
        # input message comes first in its turn as in-process (see _hold_unstarted)
        self._unstarted: dict[tuple[int, int], list[tuple[SpanRecord, bool, float]]] = {}  # (span, start rows due, held since)
        self._unstarted_count = 0
        # the agent runs (trace, span) whose start notice came, or one of whose tool calls'
        # did: their calls are not held (their notices order them); bounded, oldest forgotten
        self._noticed: collections.OrderedDict[tuple[int, int], None] = collections.OrderedDict()
        self.max_noticed_runs = 100_000
        # the spans of the latest requests, so that a retried request (a 503, a client that
        # gave up waiting) is not written twice: a span id is never sent again otherwise
        self.dedupe_window = dedupe_window
        self._seen: set[int] = set()
        self._seen_order: collections.deque[int] = collections.deque()
        self._stored: set[tuple[int, int]] = set()  # the routed request's starts found stored (see _starts_stored)
        self.start_lookups = 0  # requests whose stored starts were looked up (one flush and one query each)
        self._lock = threading.Lock()
        self._closed = False
        self._ticker = threading.Thread(target=self._tick, name="loopscope-collect-idle", daemon=True)
        self._stop = threading.Event()
        self._ticker.start()

    def ingest(self, received: Sequence[Received], size: int = 0) -> None:
        """Route the spans of one request to the writers, then wait until they are stored.

        ``size``: the bytes the request took from :attr:`budget`; they are given back
        once its rows are written, raw spans included (which may be after this returns).
        Raises :class:`StoreUnavailable` when they could not be written in
        ``flush_timeout`` (they stay queued and are written when the file is free).
        """
        if self._closed:
            self.budget.give(size)
            raise StoreUnavailable("the collector is shutting down")
        try:
            share = self._route_all(received, size)
        except BaseException:
            self.budget.give(size)
            raise
        ok = self.writer.flush(self.flush_timeout)
        share.done(ok)
        if not ok:
            self.stats.unavailable += 1
            stats = self.writer.stats()
            raise StoreUnavailable(
                f"could not write to {self.path} within {self.flush_timeout:g}s "
                f"({stats.last_error or 'busy'}); the spans are kept and written when it is free"
            )

    def refused(self, exc: Any, *, store: bool = True) -> None:
        """Count a request refused whole (``exc``: a :class:`~.decode.PayloadError`; a bad
        payload, a body over ``--max-bytes``, more spans than ``--max-spans``). With ``store``
        (a traces request: spans the sender meant to store, and does not send again after a
        4xx) it is counted in the writer's row of the store too, with its spans where they
        were counted, for ``loopscope status``; a flush writes the row now, not waiting."""
        spans = int(getattr(exc, "spans", 0) or 0)
        self.stats.refused += 1
        self.stats.too_many_spans += spans > 0
        if store:
            with guard("collect refusal"):
                self.writer.count_refused(spans, f"{getattr(exc, 'status', '')} {getattr(exc, 'reason', exc)}".strip())
                self.writer.flush_then(_settled)

    def notices(self, spans: Sequence[SpanRecord]) -> None:
        """Take the start notices of a logs request (already decoded: see
        :func:`~loopscope.ingest.otlp.decode.notices_of`). A notice that names the span
        that comes next in its batch (:data:`loopscope.semconv.NOTICE_BEFORE`) is held until
        that span arrives (the traces request its exporter sends next) and queued right
        before it, so that the writer maps them in one batch; the others (their span still
        runs) are queued now. This does not wait for the write: the rows of
        the spans that follow are queued after them (one writer, in order), and a notice
        lost with the collector is made good by its span, whose start rows then come from
        the ended span (see :meth:`_start_stored`). Waiting would hold every exporter's
        batch for a second write. Raises :class:`StoreUnavailable` once closing."""
        if not spans:
            return
        if self._closed:
            raise StoreUnavailable("the collector is shutting down")
        now = time.monotonic()
        with self._lock:
            held = self._held
            for span in spans:
                with _ROUTING_GUARD:
                    key = _span_key(span.attributes.pop(a.NOTICE_BEFORE, None))
                    after = _span_key(span.attributes.pop(a.NOTICE_AFTER, None))
                    if key is None and after is not None:
                        key = (after[0], after[1], 1)  # right after that span
                    if key is None:
                        self._start_notice(span)
                        continue
                    waiting = held.get(key)
                    if waiting is None:
                        held[key] = waiting = []
                    waiting.append((span, now))
                    self._held_count += 1
            if self._held_count > self.max_held_notices:
                self._release_held()  # memory is bounded: write them in the order held

    def _release_held(self, before: float = math.inf) -> None:
        """Write the notices held since before ``before`` (monotonic seconds; all by default)."""
        for key in [k for k, waiting in self._held.items() if waiting[0][1] <= before]:
            for span, _ in self._held.pop(key):
                self._held_count -= 1
                self._start_notice(span)

    def _route_all(self, received: Sequence[Received], size: int) -> _Share:
        """Route a request's spans (one request at a time) and queue them with their raw
        rows as one bundle (written in one transaction); its share of the budget."""
        now_us = int(time.time() * 1e6)
        raw_rows: list[tuple[Any, ...]] = []
        with self._lock:
            self.stats.requests += 1
            self.stats.spans += len(received)
            self._stored = self._starts_stored(received)
            self.writer.begin_bundle()
            try:
                self._route_each(received, raw_rows, now_us)
            finally:
                self.writer.end_bundle(raw_rows)
        return _Share(self.budget, size, 1)

    def _route_each(self, received: Sequence[Received], raw_rows: list[tuple[Any, ...]], now_us: int) -> None:
        """Route the spans of a request, in order, and make their raw rows (under the lock)."""
        seen, order = self._seen, self._seen_order
        held = self._held
        for item in received:
            ctx = item.span.context
            key = _seen_key(ctx)
            if key in seen:
                self.stats.duplicates += 1
                if held:
                    self._before(ctx.trace_id, ctx.span_id)
                    self._release((ctx.trace_id, ctx.span_id, 1))
                continue
            seen.add(key)
            order.append(key)
            if len(order) > self.dedupe_window:
                seen.discard(order.popleft())
            role, framework = None, None
            with _ROUTING_GUARD:
                if held:
                    self._before(ctx.trace_id, ctx.span_id)
                role, framework = self._route(item.span)
                if held:
                    self._release((ctx.trace_id, ctx.span_id, 1))
            if role != "pending" and self.raw:
                raw_rows.append(_raw_row(item, role, framework, now_us))

    def _route(self, span: SpanRecord) -> tuple[str | None, str | None]:
        """Submit the rows of one span; returns how it was understood (role, framework)."""
        writer = self.writer
        attrs = span.attributes
        tid, sid = span.context.trace_id, span.context.span_id
        if is_own(span):
            pending_for = attrs.get(a.PENDING_FOR)
            if pending_for is not None:
                self._pending_start(span, pending_for)
                return "pending", "loopscope"
            parent = span.parent
            if a.STATE_KIND in attrs and a.OPERATION not in attrs:  # a state snapshot or delta
                if parent is not None and self._not_started(tid, parent.span_id):
                    self._hold_unstarted((tid, parent.span_id), span)  # after its turn's input, as in-process
                else:
                    writer.submit_end(span)
                return "state", "loopscope"
            if a.TOOL_CORRECTION in attrs and a.OPERATION not in attrs:  # a served tool call found failed
                writer.submit_end(span)
                return "correction", "loopscope"
            if a.EVALUATION_NAME in attrs and a.OPERATION not in attrs:  # a score (loopscope.score)
                writer.submit_end(span)
                return "score", "loopscope"
            op = attrs.get(a.OPERATION)
            role = _OWN_ROLES.get(op) if isinstance(op, str) else None
            if ((op == a.OP_CHAT or op == a.OP_EXECUTE_TOOL or (op == a.OP_INVOKE_AGENT and a.PARENT_TURN_ID in attrs))
                    and parent is not None and self._not_started(tid, parent.span_id)):
                self._hold_unstarted((tid, parent.span_id), span)
                return role, "loopscope"
            self._start_own(span)
            if self._unstarted:
                self._release_unstarted((tid, sid))  # its start rows are queued: its calls follow them
            self._end_own(span)
            return role, "loopscope"
        for score in foreign_scores(span):  # another instrumentation's gen_ai.evaluation.result (rare)
            writer.submit_end(score)
        role, framework = classify(span)
        if self._unstarted:  # loopscope's calls under another instrumentation's span: before it, as they came
            self._release_unstarted((tid, sid))
        for kind, row in self.assembler.add(span):
            writer.submit(kind, row)
        return role, framework

    def _not_started(self, trace_id: int, parent_id: int) -> bool:
        """Whether the run ``parent_id`` neither sent its start notice here nor came and went."""
        return (trace_id, parent_id) not in self._noticed and _seen_key(Ctx(trace_id, parent_id)) not in self._seen

    def _start_own(self, span: SpanRecord) -> None:
        """The start rows of one of loopscope's own agent runs or tool calls, from its ended
        span, unless its notice (or a pending copy before a restart) wrote them already."""
        if self._start_needed(span):
            self.writer.submit_start(span)

    def _start_needed(self, span: SpanRecord) -> bool:
        """Whether the ended span's start rows are still to be written (decided while its
        request is routed: :meth:`_start_stored` knows that request's spans only)."""
        attrs = span.attributes
        if attrs.get(a.OPERATION) not in _STARTS:
            return False
        key = (span.context.trace_id, span.context.span_id)
        if key in self._pending:
            del self._pending[key]
            return False
        return not attrs.get(a.PENDING_SENT) or not self._start_stored(span)

    def _end_own(self, span: SpanRecord) -> None:
        """The end rows of one of loopscope's own spans (and its place in a foreign run above it)."""
        op = span.attributes.get(a.OPERATION)
        if op is None and a.STATE_KIND in span.attributes:  # a state snapshot or delta, held for its turn's start
            self.writer.submit_end(span)
            return
        if op in _STARTS or op == a.OP_CHAT:
            self.writer.submit_end(span)
        if self.assembler.tracks(span.context.trace_id):
            for kind, row in self.assembler.add(span):
                self.writer.submit(kind, row)

    def _hold_unstarted(self, run: tuple[int, int], span: SpanRecord) -> None:
        """Hold one of loopscope's own model or tool calls, or a turn nested in another,
        whose parent (its agent run, a tool call) has not started here: without its start
        notice the run's span comes after its calls (children end first), and the turn's
        input message, written at the run's start rows, would follow them. Released when the
        run's start rows are queued (its notice or its span), after ``notice_wait`` seconds,
        past ``max_held_notices``, or at close."""
        waiting = self._unstarted.get(run)
        if waiting is None:
            self._unstarted[run] = waiting = []
        waiting.append((span, self._start_needed(span), time.monotonic()))
        self._unstarted_count += 1
        if self._unstarted_count > self.max_held_notices:
            self._release_unstarted_before()  # memory is bounded: written late, in their order

    def _release_unstarted(self, run: tuple[int, int]) -> None:
        """Queue the calls held for the agent run ``run``, whose start rows are queued: the
        start rows of each (a tool call's) at its start, the end rows at its end, in time
        order as in-process (a tool call that ran beside another starts before that ends).
        What was held for those calls in turn (a nested turn's calls, a tool call's turn) goes
        with them, in the same order."""
        waiting = self._unstarted.pop(run, None)
        if waiting is None:
            return
        steps: list[tuple[int, int, int, SpanRecord]] = []
        runs = [waiting]
        order = 0
        while runs:
            held = runs.pop()
            self._unstarted_count -= len(held)
            for span, start_due, _ in held:
                if start_due:
                    steps.append((span.start_time, 0, order, span))
                steps.append((span.end_time, 1, order, span))
                order += 1
                inner = self._unstarted.pop((span.context.trace_id, span.context.span_id), None)
                if inner is not None:
                    runs.append(inner)
        steps.sort(key=lambda step: step[:3])
        for _, end, _, span in steps:
            if end:
                self._end_own(span)
            else:
                self.writer.submit_start(span)

    def _release_unstarted_before(self, before: float = math.inf) -> None:
        """Queue the calls held since before ``before`` (monotonic seconds; all by default):
        their run's start never came (lost), late rather than lost."""
        for run in [r for r, waiting in self._unstarted.items() if waiting[0][2] <= before]:
            self._release_unstarted(run)

    def _before(self, trace_id: int, span_id: int) -> None:
        """Queue the start notices held for the span ``(trace_id, span_id)``, about to be routed."""
        self._release((trace_id, span_id))

    def _release(self, key: tuple[int, ...]) -> None:
        waiting = self._held.pop(key, None)
        if waiting is not None:
            self._held_count -= len(waiting)
            for notice, _ in waiting:
                self._start_notice(notice)

    def _pending_start(self, span: SpanRecord, pending_for: Any) -> None:
        """A pending copy sent as a span (loopscope's exporter before start notices)."""
        try:
            real = int(str(pending_for), 16)
        except ValueError:
            return
        if not 0 < real < (1 << 64):
            return
        attributes = dict(span.attributes)
        del attributes[a.PENDING_FOR]
        operation = attributes.pop(a.PENDING_OPERATION, None)
        if operation:
            attributes[a.OPERATION] = operation
        self._start_notice(span.replace(context=Ctx(span.context.trace_id, real), parent=None, attributes=attributes))

    def _start_notice(self, span: SpanRecord) -> None:
        """The start rows of a span that started (its own ids), once per span. Only
        loopscope's own: another instrumentation's agent run or tool call (pydantic-ai's,
        named alike) is assembled with its run when that ends."""
        if span.attributes.get(a.OPERATION) not in _STARTS or not is_own(span):
            return
        key = (span.context.trace_id, span.context.span_id)
        if key in self._pending:
            return  # the same notice again (a retried request)
        self._pending[key] = None
        if len(self._pending) > self.max_pending_ids:
            self._pending.popitem(last=False)
        self.stats.pending += 1
        self.writer.submit_start(span)
        noticed = self._noticed
        noticed[key] = None
        if span.parent is not None:
            noticed[(key[0], span.parent.span_id)] = None
        while len(noticed) > self.max_noticed_runs:
            noticed.popitem(last=False)
        if self._unstarted:
            self._release_unstarted(key)

    def _starts_stored(self, received: Sequence[Received]) -> set[tuple[int, int]]:
        """Of a request's agent runs and tool calls whose pending copies were sent but are
        not remembered (forgotten: the memory of them is bounded; or the collector started
        since), those whose start rows the store holds already, as ``(trace, span)``: one
        flush and one query for the whole request (one per span took seconds for a
        request resent after a restart). Empty when the store cannot be read in time:
        their start rows are then written again (``skip_stored`` leaves them out)."""
        wanted: dict[str, tuple[int, int]] = {}
        seen = self._seen
        for item in received:
            span = item.span
            attrs = span.attributes
            if attrs.get(a.OPERATION) in _STARTS and attrs.get(a.PENDING_SENT) and is_own(span):
                key = (span.context.trace_id, span.context.span_id)
                if key not in self._pending and _seen_key(span.context) not in seen:  # a span received again is left out
                    prefix = f"{key[0]:032x}{key[1]:016x}"
                    wanted[prefix + "s"] = wanted[prefix + "i"] = key
        self.start_lookups += bool(wanted)
        if not wanted or not self.writer.flush(self.flush_timeout):
            return set()
        try:
            found = self.reader.stored_ids(list(wanted))
        except Exception:
            internal_error("collector start lookup")
            return set()
        return {wanted[event_id] for event_id in found}

    def _start_stored(self, span: SpanRecord) -> bool:
        """Whether the start rows of a span whose pending copy was sent are in the store
        already (looked up for its whole request by :meth:`_starts_stored`)."""
        if (span.context.trace_id, span.context.span_id) in self._stored:
            return True
        # an agent run whose pending copy had no input text has no start row to find: only
        # the pending copy's arrival would tell, and that is forgotten; its span says the same
        return (span.attributes.get(a.OPERATION) == a.OP_INVOKE_AGENT) and a.TURN_INPUT not in span.attributes

    def _tick(self) -> None:
        every = min(5.0, max(0.05, self.assembler.idle_seconds / 4))
        last = time.monotonic()
        while not self._stop.wait(min(every, 1.0)):
            with _IDLE_GUARD:
                if time.monotonic() - last >= every:
                    last = time.monotonic()
                    with self._lock:
                        for kind, row in self.assembler.expire():
                            self.writer.submit(kind, row)
                        if self._held:  # notices whose span never came (its request failed): late, not lost
                            self._release_held(time.monotonic() - self.notice_wait)
                        if self._unstarted:  # calls whose agent run never came: late, not lost
                            self._release_unstarted_before(time.monotonic() - self.notice_wait)
                if self.budget.parked and not self.writer.stats().queued:
                    self.budget.unpark()  # what could not be written in time is now
                self.budget.trim()

    def close(self, timeout: float = 30.0) -> None:
        """Map what is still held, write everything, stop the writers."""
        if self._closed:
            return
        self._stop.set()
        with self._lock:
            self._closed = True
            self._release_held()
            self._release_unstarted_before()
            for kind, row in self.assembler.drain():
                self.writer.submit(kind, row)
        self.writer.close(timeout)
