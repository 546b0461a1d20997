"""Configuration of the one pipeline: recorder spans -> store processor (-> exporters).

``configure()`` decides where spans go. If the application already installed an SDK
``TracerProvider`` (its own, Logfire's, ...), loopscope adds its processor to it;
otherwise it sets one up. Calling ``configure()`` again re-targets the store without
stacking processors.
"""

from __future__ import annotations

import atexit
import functools
import os
import pickle
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from opentelemetry import metrics, trace
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider

from . import _exits, pricing
from . import semconv as semconv_module
from ._guard import guard, internal_error, warn_once
from ._otel_sdk import exports_spans, replace_span_processors, span_processors
from ._version import __version__
from .content.policy import ContentPolicy
from .export import signals
from .export.metrics import MetricsProcessor
from .export.otlp import (
    CountingBatchProcessor,
    OTLPSettings,
    PolicyExporter,
    filtered_span,
    metric_exporter,
    span_exporter,
    with_notices,
)
from .ingest.processor import StoreSpanProcessor
from .ingest.writer_process import QUIET, ProcessSpanWriter, unavailable, writer_mode
from .recorder import settings as recorder_settings
from .recorder.conversations import conversations
from .recorder.stitch import set_idle_timeout, set_max_open
from .storage import recording
from .storage.duckdb import health, store_file
from .storage.errors import StoreError, StoreLockedError
from .storage.limits import CLOSE_TIMEOUT, QUEUE_BYTES, WriterStats
from .storage.limits import close_timeout as writer_close_timeout
from .storage.policy import PersistencePolicy
from .storage.recording import resolve

if TYPE_CHECKING:
    from .storage.duckdb.writer import StoreWriter

# DuckDB (and the writer, the schema) are imported where the thread writer or the store's
# check needs them: an application whose writer is a process of its own never loads them

SESSION_ENV = "LOOPSCOPE_SESSION"
"""The session every stitched turn of the process is in (read by ``configure()``), unless a
``loopscope.session()`` block names another; ``loopscope run --session NAME`` sets it."""

# where the store is by default: storage/recording.py, which reads without a path consult too
DEFAULT_DB, default_db_path = recording.DEFAULT_DB, recording.default_db_path


class _Dispatch(SpanProcessor):
    """Installed once per provider; forwards to whatever ``configure()`` set up last
    (the store, the OTLP exporter, the metrics), so reconfiguring never stacks processors."""

    def __init__(self) -> None:
        self._targets: tuple[SpanProcessor, ...] = ()

    @property
    def targets(self) -> tuple[SpanProcessor, ...]:
        return self._targets

    @targets.setter
    def targets(self, targets: tuple[SpanProcessor, ...]) -> None:
        self._targets = targets
        # One target (the store alone, the usual case): the provider calls its methods
        # directly, without this processor's frame, twice per span.
        if len(targets) == 1:
            self.on_start = targets[0].on_start  # type: ignore[method-assign]
            self.on_end = targets[0].on_end  # type: ignore[method-assign]
        else:
            self.__dict__.pop("on_start", None)
            self.__dict__.pop("on_end", None)

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        for target in self._targets:
            target.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        for target in self._targets:
            target.on_end(span)

    def shutdown(self) -> None:
        targets, self.targets = self.targets, ()
        for target in targets:
            target.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        flushed = [target.force_flush(timeout_millis) for target in self.targets]  # every one, whatever the first says
        return all(flushed)


@dataclass
class Pipeline:
    """What ``configure()`` set up: the provider spans go to, and the store they land in."""

    tracer_provider: TracerProvider
    tracer: trace.Tracer
    db_path: str | None
    writer: StoreWriter | ProcessSpanWriter | None
    content: ContentPolicy = field(default_factory=ContentPolicy)
    exporter: CountingBatchProcessor | None = None
    policy_exporter: PolicyExporter | None = None
    metrics: MetricsProcessor | None = None
    processors: tuple[SpanProcessor, ...] = ()
    fork_writer: Callable[[], ProcessSpanWriter | None] | None = None
    """Makes the writer a fork of this process records through when this one is the thread
    writer (whose thread, and DuckDB's, a fork does not have): a writer process of its own."""

    def stats(self) -> WriterStats | None:
        return self.writer.stats() if self.writer else None

    @property
    def writer_mode(self) -> str | None:
        """Where the store's writer runs: ``process`` (a writer process of its own),
        ``thread`` (a thread of this process; also where the writer process could not start),
        ``starting`` (a writer process that may yet fall back to the thread), None (no store)."""
        writer = self.writer
        if writer is None:
            return None
        return writer.mode if isinstance(writer, ProcessSpanWriter) else "thread"

    def dropped(self) -> dict[str, int]:
        """What had to be dropped so far, by destination (also the ``loopscope.dropped`` metric)."""
        out = {"store": self.writer.stats().dropped if self.writer else 0}
        if self.exporter is not None:
            out["otlp"] = self.exporter.dropped + (self.policy_exporter.failed_spans if self.policy_exporter else 0)
        return out


_active: Pipeline | None = None
_owned_meter_providers: list[MeterProvider] = []
on_shutdown = recorder_settings.on_shutdown  # run a hook at shutdown(), before the store's last flush
_lock = threading.RLock()
_dispatchers: dict[int, _Dispatch] = {}


def _thread_writer(path: str, options: dict[str, Any]) -> StoreWriter:
    """The store's writer as a thread of this process (its module imported only then): the seam's
    sink of a DuckDB file, given loopscope's mapping."""
    from .ingest.writer import SPANS
    from .storage.queries import open_sink

    return cast("StoreWriter", open_sink(path, mapping=SPANS, **options))


def _process_writer(
    path: str, options: dict[str, Any], prices: Mapping[str, Any] | None, latest: bool, *, auto: bool = False,
    no_child: str | None = None, default_path: bool = False, close_timeout: float | None = None,
) -> ProcessSpanWriter | None:
    """The writer process for ``path``; None (the thread writer then) when its options cannot
    be sent to a process (a content hook that is a lambda or a local function), or, with
    ``auto``, when no writer process can run here (``no_child`` says why, once, in a warning).
    With ``auto`` a child that cannot start hands its spans to the thread writer. With
    ``default_path``, a store the child finds it cannot write turns recording to it off, as
    :func:`_check_db` does."""
    if auto and no_child is not None:
        warn_once("writer-process-unavailable", "loopscope: the store's writer runs in a thread: %s (%s)", no_child,
                  QUIET)
        return None
    fallback = functools.partial(_thread_writer, path, options) if auto else None
    try:
        off = (lambda problem: _store_off(path, StoreError(problem))) if default_path else None
        return ProcessSpanWriter(path, prices=prices, latest=latest, fallback=fallback, on_store_off=off,
                                 close_timeout=close_timeout, **options)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        warn_once("writer-process-options", "loopscope: the store's writer runs in a thread: its options cannot go to a "
                  "process (%s)", exc)
        return None


def _fork_writer(path: str, options: dict[str, Any], prices: Mapping[str, Any] | None, latest: bool) -> ProcessSpanWriter | None:
    """In a fork of a process whose writer is a thread: a writer process (started at the first
    span), or None when its options cannot go to one."""
    try:
        return ProcessSpanWriter(path, prices=prices, latest=latest, eager=False, **options)
    except (pickle.PicklingError, AttributeError, TypeError):
        return None


def _check_db(path: str, *, open_it: bool = True) -> None:
    """Fail at configuration time, clearly, when the store cannot be written at all (with
    ``open_it`` false, without opening it: the writer process does that, and says so)."""
    target = Path(path)
    if target.is_dir():
        raise StoreError(f"loopscope store path {path} is a directory; give a file path such as {target / DEFAULT_DB}")
    odd = store_file.kind_problem(path)  # a FIFO, a device, a socket: refused at once, never opened
    if odd is not None:
        raise StoreError(odd)
    if not target.parent.is_dir():
        raise StoreError(f"cannot create the loopscope store {path}: folder {target.parent} does not exist")
    if not os.access(target.parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise StoreError(f"cannot write the loopscope store {path}: permission denied")
    # A file that is no DuckDB database at all (the user's notes, a SQLite file) is found here,
    # without DuckDB: its header
    _check_header(path)
    if not open_it:
        # the writer process opens it, in the background; what it alone can find (a store of a
        # newer loopscope, a damaged file, a database of the user's) is said in a warning and
        # its events counted as lost
        return
    import duckdb

    from .storage.duckdb.connection import open_store
    from .storage.duckdb.schema import migrate

    try:
        with open_store(path, read_only=False, timeout=0.5) as con:
            migrate(con)
            _recover(con)
    except StoreLockedError:
        # another process writes here too: our writer waits its turn between its batches
        return
    except (duckdb.Error, OSError) as exc:  # a read-only disk met while migrating, say
        raise StoreError(f"cannot write the loopscope store {path}: {str(exc).splitlines()[0]}") from exc


def _check_header(path: str) -> None:
    """Raise :class:`StoreError` for a file at ``path`` that is no DuckDB database (the user's
    notes, say), which the store's writer must not overwrite, or, where there is none yet, a
    folder where none can be made (a read-only file system: a file of our own made and removed
    beside it)."""
    try:
        problem = store_file.header_problem(path)  # (not opened when a FIFO: see _check_db)
    except FileNotFoundError:
        # a file of our own beside it, never the store's path itself: made and removed there, it
        # could be the very file another process's writer (or a `tail` waiting for it) just opened
        import tempfile  # only where there is no store yet

        try:
            fd, probe = tempfile.mkstemp(prefix=".loopscope-probe-", dir=os.path.dirname(path) or ".")
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise StoreError(f"cannot write the loopscope store {path}: {exc.strerror or exc}") from exc
        return
    except OSError as exc:
        raise StoreError(f"cannot open the loopscope store {path}: {exc}") from exc
    if problem is not None:
        raise StoreError(problem)


def _store_off(path: str, exc: BaseException) -> None:
    """The default store cannot be written: recording to it is off, said once (a logging
    warning, which Python prints on stderr unless the application set up logging) and,
    where the folder takes it, in the note beside the store that ``status`` reads."""
    warn_once(
        f"store-off:{path}",
        "loopscope: %s; recording to the store is off (OTLP export, if configured, still works). "
        "Set LOOPSCOPE_DB to a writable file, or call loopscope.configure(db=...)",
        exc,
    )
    # one entry per host, the last process's: a store that stays unwritable does not grow the file
    off = health.Counters(last_error=str(exc), last_error_at=time.time())
    health.record_beside(path, f"store-off {socket.gethostname()}", off, note="recording to the store was off")


def _recover(con: Any) -> None:
    """Close the turns a process that died left open (the writer tries again at its first
    batch if this cannot be done now)."""
    import duckdb

    from .ingest.recovery import recover

    try:
        recover(con)
    except duckdb.Error:
        pass
    except Exception:
        internal_error("store recovery")


def _provider(explicit: TracerProvider | None, service_name: str | None) -> TracerProvider:
    if explicit is not None:
        return explicit
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        return current
    resource = Resource.create({"service.name": service_name} if service_name else {})
    provider = TracerProvider(resource=resource)
    trace.set_tracer_provider(provider)
    installed = trace.get_tracer_provider()
    # set_tracer_provider only works once per process; keep whatever won
    return installed if isinstance(installed, TracerProvider) else provider


def configure(
    db: str | os.PathLike[str] | bool | None = None,
    *,
    policy: PersistencePolicy | None = None,
    flush_interval: float | None = None,
    queue_size: int = 200_000,
    queue_bytes: int = QUEUE_BYTES,
    tracer_provider: TracerProvider | None = None,
    service_name: str | None = None,
    stitch_idle_timeout: float | None = None,
    stitch_max_open: int | None = None,
    otlp: bool | None = None,
    otlp_endpoint: str | None = None,
    otlp_protocol: str | None = None,
    otlp_headers: Mapping[str, str] | None = None,
    capture_content: bool | None = None,
    content_policy: ContentPolicy | None = None,
    meter_provider: MeterProvider | None = None,
    prices: Mapping[str, Mapping[str, Any]] | None = None,
    writer: str | None = None,
    find_conversations: bool | None = None,
    close_timeout: float | None = None,
    share_db: bool = False,
    semconv: str | None = None,
) -> Pipeline:
    """Set up loopscope's pipeline; returns it. Safe to call again to re-target.

    Storage: ``db`` is the DuckDB file (default ``LOOPSCOPE_DB`` or
    ``./loopscope.duckdb``); ``False`` records spans without storing them.
    ``flush_interval`` (seconds) bounds how long a recorded event waits before it is in
    the file; by default (``None``) that is the last batch's CPU time x 100, within one and
    five seconds, so that the store writer's batches take about 1% of one core. loopscope's
    own readers (``Store``, the CLI, the dashboard) do not wait for it: they have the
    writers write what they hold first (docs/live-reads.md); ``loopscope.flush()`` writes
    at once, whatever the interval. ``queue_size`` (spans) and ``queue_bytes`` (their text
    content and a fixed size a span, estimated; default 64 MiB) bound the memory held for
    events not yet written (past either, events are dropped and counted, in ``loopscope
    status``; a writer that cannot write holds about twice ``queue_bytes``). A ``db`` path
    given here that cannot be written raises :class:`StoreError`, once; the default path
    (``LOOPSCOPE_DB`` or ``./loopscope.duckdb``, what ``instrument()`` and the first
    ``turn()`` configure) never raises: recording to the store is then off, said once in
    a warning, and the rest (OTLP export) works. A missing folder is never created.

    Writer: by default (``writer=None``, ``LOOPSCOPE_WRITER`` unset, or ``"auto"``) the store's
    writer runs in a child process of its own where one can run: the application only ships
    the spans' fields over a pipe, and the mapping, Arrow and DuckDB (their CPU, their memory,
    their hold on the GIL) are the child's. Where it cannot (a frozen executable,
    ``sys.executable`` no Python, a child that dies at once or is not ready within 30 s: its
    spans then go to the thread writer, none lost) it runs in a background thread, said once
    in a warning. ``writer="thread"`` (or ``LOOPSCOPE_WRITER=thread``) always runs the thread
    (one process; DuckDB in it); ``"process"`` always the child (one that cannot start costs
    the spans, counted).
    ``Pipeline.writer_mode`` and ``loopscope status`` say which runs. The promises
    are the same (``flush()`` waits for the rows, the close is bounded, losses are counted).
    At ``shutdown()`` and at exit the application waits for its writer process at most
    ``shutdown``'s bound (5 s); a writer process still writing then (its file busy with
    other writers and readers) writes on alone, for ``close_timeout`` seconds at most (default
    60, or ``LOOPSCOPE_CLOSE_TIMEOUT``), and counts what it could not write by then
    (``loopscope status``). The thread writer writes within ``shutdown``'s bound.
    A content policy that cannot be sent to a process (a hook that is a lambda) keeps the
    thread, with a warning. With a writer process the store is checked (migrated, its dead
    writers' turns closed) by the child, in the background: ``configure()`` does not wait
    for it. It raises for what it can tell without DuckDB (above, and a file that is no
    DuckDB database); a store the child then refuses (one of a newer loopscope, a damaged
    file) is said in one warning and its events are counted as lost (``loopscope status``);
    for the default path, recording to it is turned off as above.

    The store's path must be a regular file or none yet (a FIFO, a device, a socket is
    refused at once). A file that is no loopscope store is refused before anything is
    written to it: one that is no DuckDB database (a SQLite file, the user's notes), and a
    DuckDB file holding data of its own. ``share_db=True`` (or ``LOOPSCOPE_SHARE_DB=1``)
    lets loopscope put its tables beside the user's in such a file (none of which may have
    a name loopscope uses: ``events``, ``turns``, ``sessions``, ... refused still). DuckDB
    never loads or installs an extension for a file loopscope opens.

    Export: spans and metrics go over OTLP when ``otlp`` is true, or when it is left
    ``None`` and an endpoint is set (``otlp_endpoint`` or ``OTEL_EXPORTER_OTLP_ENDPOINT``).
    ``otlp_protocol`` / ``otlp_headers`` override ``OTEL_EXPORTER_OTLP_PROTOCOL`` /
    ``OTEL_EXPORTER_OTLP_HEADERS``; ``service_name`` overrides ``OTEL_SERVICE_NAME``.
    With ``otlp`` left ``None``, ``OTEL_TRACES_EXPORTER`` / ``OTEL_METRICS_EXPORTER`` set to
    ``none`` turn that signal off (loopscope provides the ``otlp`` exporter only; see
    :mod:`loopscope.export.signals`). An endpoint that refuses metrics (HTTP 404/405) is
    said once, in a warning, and sent no more metrics.
    Spans and metrics follow the current GenAI conventions (semantic-conventions-genai v0.1.0:
    ``gen_ai.client.inference.*`` metrics, ...); ``semconv="v1.37"`` (default: ``LOOPSCOPE_SEMCONV``)
    emits the older names for backends that still read them (see :mod:`loopscope.semconv` and
    docs/otlp-export.md). A value other than ``"current"`` or ``"v1.37"`` raises ValueError.
    If the application already has an SDK ``TracerProvider`` (or ``MeterProvider``),
    loopscope adds to it instead of replacing it.

    Content: message text, tool arguments and results are stored locally, and exported
    only with ``capture_content=True`` (default:
    ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``: ``SPAN_ONLY``, ``SPAN_AND_EVENT``
    or ``true``). ``content_policy`` sets
    size caps (``max_chars`` for export, ``store_max_chars`` for the store), secret
    patterns and a redaction hook for both destinations; the store applies them in its
    writer's thread, before anything reaches the file.

    Stitching: ``stitch_idle_timeout`` (seconds, default 300) is how long a turn stitched
    from SDK calls waits for the results of its tool calls before it ends as unfinished;
    ``stitch_max_open`` (default 1,000) how many such turns wait at once: past it the one
    idle the longest ends so at once, its calls unserved and counted in ``loopscope status``
    (a program that never answers tool calls holds bounded memory).
    ``LOOPSCOPE_SESSION`` puts every stitched turn in that session (a ``loopscope.session()``
    block still names its own). Otherwise a stitched turn whose request continues an earlier
    stitched turn's conversation (that turn's last request and its answer start the new
    request) joins that turn's session, so a chat loop is one session, not one per turn;
    ``find_conversations=False`` (or ``LOOPSCOPE_FIND_CONVERSATIONS=0``) gives each stitched
    turn a session of its own. The turns remembered for this belong to the store: each
    ``configure()`` starts with none.

    Exit: stitched turns still open when the process ends (normal end, ``sys.exit``, an
    uncaught exception, SIGTERM where the application has no handler of its own) end as
    ``shutdown()`` ends them, within the same bound.

    Cost: each model call is priced in USD from genai-prices' database as its row is
    written. ``prices`` sets the prices of models it does not know (custom or
    self-hosted) or overrides its own, per model name in USD per million tokens:
    ``{"my-llama": {"input": 0.2, "output": 0.6, "cache_read": 0.05, "cache_write": 0.25}}``
    (the cache prices default to the input price). They win over genai-prices and over
    the file ``LOOPSCOPE_PRICES`` names (TOML or JSON, the same tables). A call is priced as
    the provider whose server answered it (known hosts: docs/model-calls.md); another server
    (a local one, a gateway) is not priced unless ``prices["providers"]`` names the provider
    it stands for: ``{"providers": {"llm.internal": "openai", "127.0.0.1:8000": "sdk"}}``
    (``"sdk"``: the provider of the SDK calling it). A bad entry raises ValueError before
    anything else changes.
    """
    global _active
    # which GenAI conventions the spans and metrics follow (semconv=, LOOPSCOPE_SEMCONV); a bad
    # value raises before anything changes
    latest = semconv_module.conventions(semconv) == semconv_module.CURRENT
    pricing.set_overrides(prices)  # checked first: a bad entry changes nothing
    if close_timeout is not None:
        writer_close_timeout(close_timeout)  # a bad value raises before anything changes
    with _lock:
        explicit = db not in (None, True, False)
        path = None if db is False else resolve(default_db_path() if not explicit else db)  # type: ignore[arg-type]
        mode = writer_mode(writer)  # a bad value raises before anything changes
        if path is not None and share_db:
            recording.share_db(path)  # before the check (and the writer process's) migrates the file
        no_child = unavailable() if mode == "auto" else None  # why no writer process can run here
        if path is not None:
            try:
                _check_db(path, open_it=mode == "thread" or no_child is not None)
            except StoreError as exc:
                if explicit:
                    raise
                _store_off(path, exc)  # the default store: the application must not see it
                path = None
        content = content_policy or ContentPolicy(capture=capture_content)
        if content_policy is not None and capture_content is not None:
            content.capture = capture_content
        semconv_module.use_conventions(latest)
        settings = OTLPSettings(otlp_endpoint, otlp_protocol, otlp_headers)
        # per signal: OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER (otlp, none, ...); otlp= wins
        export = (settings.enabled() and signals.exports("traces")) if otlp is None else otlp
        export_metrics = (settings.enabled() and signals.exports("metrics")) if otlp is None else otlp
        _shutdown_locked()
        provider = _provider(tracer_provider, service_name)
        dispatch = _dispatchers.get(id(provider))
        if dispatch is None:
            dispatch = _dispatchers[id(provider)] = _Dispatch()
            _guard_foreign_processors(provider, content)
            provider.add_span_processor(dispatch)
        targets: list[SpanProcessor] = []
        store_writer: StoreWriter | ProcessSpanWriter | None = None
        if path is not None:
            options: dict[str, Any] = {
                "policy": policy, "flush_interval": flush_interval, "max_queue": queue_size, "max_bytes": queue_bytes,
                "track_turns": True, "content": content,
            }
            if mode != "thread":
                # not waited for: the child's imports and its check of the store (~0.5 s) run while
                # the application goes on; what the check refuses is said once and counted as lost
                store_writer = _process_writer(path, options, prices, latest, auto=mode == "auto", no_child=no_child,
                                               default_path=not explicit, close_timeout=close_timeout)
            if store_writer is None:
                store_writer = _thread_writer(path, options)
            targets.append(StoreSpanProcessor(store_writer))
        exporter = policy_exporter = None
        if export:
            spans_out, notices = with_notices(span_exporter(settings), settings)
            policy_exporter = PolicyExporter(spans_out, content)
            exporter = CountingBatchProcessor(policy_exporter, notices=notices)
            targets.append(exporter)
            if store_writer is not None:  # the store keeps the exporter's drops too (loopscope status)
                store_writer.report.otlp = lambda e=exporter, p=policy_exporter: (e.dropped, p.failed_spans)
                if notices is not None:  # and what became of the start notices
                    store_writer.report.notices = lambda n=notices: (
                        n.sent, n.refused, n.failed, None if n.enabled else n.last_error)
        pipeline = Pipeline(
            provider, provider.get_tracer("loopscope", __version__), path, store_writer, content, exporter, policy_exporter
        )
        if path is not None and not isinstance(store_writer, ProcessSpanWriter) and unavailable() is None:
            pipeline.fork_writer = functools.partial(_fork_writer, path, options, prices, latest)
        meter = _meter(meter_provider, settings if export_metrics else None, service_name)
        if meter is not None:
            pipeline.metrics = MetricsProcessor(meter, dropped=pipeline.dropped, latest=latest)
            targets.append(pipeline.metrics)
        # streamed calls' chunk gaps (time_per_output_chunk, latest conventions only): kept only then
        recorder_settings.chunk_gaps = pipeline.metrics.chunk_gaps if pipeline.metrics is not None and latest else None
        pipeline.processors = tuple(targets)
        dispatch.targets = pipeline.processors
        _active = pipeline
        recording.set_current(pipeline)
        recording.export_to_children(path)  # multiprocessing's spawned workers record to this store too
        if stitch_idle_timeout is not None:
            set_idle_timeout(stitch_idle_timeout)
        if stitch_max_open is not None:
            set_max_open(stitch_max_open)
        recorder_settings.session = os.environ.get(SESSION_ENV) or None
        conversations.clear()  # a new store's sessions are its own
        if find_conversations is not None:
            set_find_conversations(find_conversations)
        _close_at_exit()
        return pipeline


def set_find_conversations(on: bool) -> None:
    """Whether a stitched turn that continues an earlier one's conversation joins its session
    (``configure(find_conversations=)``, ``instrument(find_conversations=)``)."""
    recorder_settings.find_conversations = bool(on)


def _meter(explicit: MeterProvider | None, settings: OTLPSettings | None, service_name: str | None) -> Any:
    """A meter on the given provider, the application's SDK provider, or one loopscope makes
    for OTLP; None when metrics would go nowhere."""
    provider: Any = explicit
    if provider is None:
        current = metrics.get_meter_provider()
        if isinstance(current, MeterProvider):
            provider = current
        elif settings is not None:
            from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

            resource = Resource.create({"service.name": service_name} if service_name else {})
            provider = MeterProvider(resource=resource, metric_readers=[PeriodicExportingMetricReader(metric_exporter(settings))])
            _owned_meter_providers.append(provider)
        else:
            return None
    return provider.get_meter("loopscope", __version__)


class _PolicyGuard(SpanProcessor):
    """Wraps a processor the application installed before loopscope: it sees spans as the
    content policy lets them leave the process (content only when capture is on)."""

    def __init__(self, inner: SpanProcessor, content: ContentPolicy) -> None:
        self.inner = inner
        self.content = content

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.inner.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        self.inner.on_end(filtered_span(span, self.content))

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def _guard_foreign_processors(provider: TracerProvider, content: ContentPolicy) -> None:
    """Put the application's existing exporting processors behind the content policy.

    Spans carry content attributes so that the local store can keep them; the policy
    decides what an exporter may see. Processors added after ``configure()`` are the
    application's own business.
    """
    processors = span_processors(provider)
    if not processors:
        return
    guarded = tuple(
        p if isinstance(p, (_PolicyGuard, _Dispatch)) or not exports_spans(p) else _PolicyGuard(p, content) for p in processors
    )
    try:
        replace_span_processors(provider, guarded)
    except Exception:
        internal_error("guard foreign processors")


def active() -> Pipeline:
    """The configured pipeline, configuring the defaults on first use."""
    pipeline = _active
    if pipeline is None:
        with _lock:
            pipeline = _active or configure()
    return pipeline


def tracer() -> trace.Tracer:
    pipeline = _active
    return pipeline.tracer if pipeline is not None else active().tracer


def flush(timeout: float = 30.0) -> bool:
    """Write every recorded event to the store (and measure every span) now; True when
    all of it landed."""
    pipeline = _active
    if pipeline is None:
        return True
    if pipeline.metrics is not None:
        pipeline.metrics.drain()
    return pipeline.writer.flush(timeout) if pipeline.writer is not None else True


EXPORT_SHUTDOWN_SECONDS = 3.0
"""How long shutdown waits for OTLP exporters to send what they hold (all in parallel):
a backend that is down must not hold the application's exit hostage."""


def _shutdown_locked(timeout: float = CLOSE_TIMEOUT) -> None:
    global _active
    pipeline, _active = _active, None
    recording.set_current(None)
    if pipeline is None:
        return
    dispatch = _dispatchers.get(id(pipeline.tracer_provider))
    if dispatch is not None:
        dispatch.targets = ()
    recorder_settings.chunk_gaps = None
    closers: list[Callable[[], object]] = [
        p.shutdown for p in pipeline.processors if p is not None and not isinstance(p, StoreSpanProcessor)
    ]
    while _owned_meter_providers:
        provider = _owned_meter_providers.pop()
        closers.append(lambda provider=provider: provider.shutdown(timeout_millis=int(EXPORT_SHUTDOWN_SECONDS * 1000)))
    threads, inline = [], []
    for closer in closers:
        thread = threading.Thread(target=_quietly, args=(closer,), daemon=True)
        try:
            thread.start()
            threads.append(thread)
        except RuntimeError:  # at exit Python 3.12+ starts no thread: run it after the store's close
            inline.append(closer)
    for processor in pipeline.processors:
        if isinstance(processor, StoreSpanProcessor):
            _quietly(processor.drain)  # foreign spans still waiting for their agent run
    # one deadline for all of it: the exporters send meanwhile, in their threads
    deadline = time.monotonic() + max(timeout, EXPORT_SHUTDOWN_SECONDS)
    if pipeline.writer is not None:

        def exporters_done(wait: float | None) -> None:
            # the store's rows are written by now; the writer's last counters wait for the
            # exporters' last sends (what they drop, fail or have refused at exit), within
            # the same deadline: shutdown waits for those threads below anyway
            end = deadline if wait is None else min(deadline, time.monotonic() + wait)
            while inline and time.monotonic() < end:  # at exit: no threads, so run them here
                _quietly(inline.pop(0))
            for thread in threads:
                thread.join(max(0.0, end - time.monotonic()))

        pipeline.writer.report.before_stop = exporters_done
        pipeline.writer.close(timeout)
    for closer in inline:  # each exporter's own shutdown bounds its wait
        _quietly(closer)
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))


def _quietly(closer: Callable[[], object]) -> None:
    try:
        closer()
    except Exception:
        internal_error("exporter shutdown")


def shutdown(timeout: float = CLOSE_TIMEOUT) -> None:
    """End open stitched turns, flush every recorded event to the store and stop the writer.

    Returns within ``timeout`` seconds (default 5; OTLP exporters get at least
    :data:`EXPORT_SHUTDOWN_SECONDS`), whatever the store's writer is doing: events not
    written by then are counted as lost, in the store's health record or in the file
    beside it (``loopscope status`` shows both). The close at exit has the same bound."""
    for hook in recorder_settings.shutdown_hooks:
        try:
            hook()
        except Exception:
            internal_error("shutdown hook")
    with _lock:
        _shutdown_locked(timeout)


_exiting = False  # _at_exit runs (at exit, at os._exit(), at a SIGTERM)
_term_pending = False  # a SIGTERM came meanwhile: the process dies by it once _at_exit is done


def _at_exit() -> None:
    """The process ends: end what is still open (streams, stitched turns: their unanswered
    calls unserved, the turns unfinished, each with its time until now), then store it all."""
    global _exiting
    _exiting = True
    try:
        for hook in recorder_settings.exit_hooks:
            try:
                hook()
            except Exception:
                internal_error("exit hook")
        shutdown()
    finally:
        _exiting = False
        if _term_pending and threading.current_thread() is threading.main_thread():
            _die_by_sigterm()


def _close_at_exit() -> None:
    """Have :func:`_at_exit` run at exit before every exit hook registered so far.

    Exit hooks run last registered first, and the SDK's ``TracerProvider`` registers its
    own shutdown (which closes the store's processor) when it is made, which is in
    ``configure()`` when loopscope makes it: a hook registered at import would run after
    the store was closed, and the turns it ends would be lost. Registered again at every
    ``configure()``, it stays after the provider's. A SIGTERM, whose default action ends
    the process without exit hooks, runs it too (see :func:`_on_sigterm`)."""
    atexit.unregister(_at_exit)
    atexit.register(_at_exit)
    _catch_sigterm()
    # os._exit() runs no exit hook: a fork child of multiprocessing ends so, as may the application
    # (bounded as exit and shutdown() are: the store's 5 s, the exporters' 3 s; the counting after
    # the store's deadline runs within the latter, so a loss is not cut short unsaid)
    _exits.on_os_exit(_at_os_exit, CLOSE_TIMEOUT + EXPORT_SHUTDOWN_SECONDS)


def _at_os_exit() -> None:
    """The process calls ``os._exit()`` (a ``multiprocessing`` fork child ends so after its
    target returned): what :func:`_at_exit` does at a normal exit, when a pipeline records."""
    if _active is not None:
        _quietly(_at_exit)


def _forked() -> None:
    """In the child of a fork: the pipeline's lock anew (another thread of the parent may have
    held it at the fork; it would never be released here). The writer, the stitched turns and
    the exporters' batch processors see the fork themselves; the child records into the same
    store, through a writer process of its own started at its first span."""
    global _lock, _term_claim
    _lock = threading.RLock()
    _term_claim = threading.Lock()  # (a parent dying by SIGTERM as it forked: not the child's end)
    pipeline = _active
    if pipeline is None or pipeline.fork_writer is None or isinstance(pipeline.writer, ProcessSpanWriter):
        return
    try:
        # the thread writer's thread (and DuckDB's) stayed in the parent: this process records
        # through a writer process of its own, as a fork of a writer process's application does
        writer = pipeline.fork_writer()
        if writer is None or pipeline.writer is None:
            return
        old = pipeline.writer
        writer.report.otlp, writer.report.notices = old.report.otlp, old.report.notices
        pipeline.writer = writer
        for processor in pipeline.processors:
            if isinstance(processor, StoreSpanProcessor):
                processor.writer, processor._submit = writer, writer.submit  # pyright: ignore[reportPrivateUsage]
    except Exception:
        internal_error("pipeline: fork")


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


_EXIT_THREAD_GRACE = 1.0
"""Seconds beyond the close's own bound a SIGTERM waits for :func:`_at_exit`."""


def _catch_sigterm() -> None:
    """Install :func:`_on_sigterm` for SIGTERM, only where the application has no handler of
    its own (the default action) and only from the main thread (the only one that may)."""
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return
        signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError, AttributeError):  # no SIGTERM here, or an embedded interpreter's rules
        return
    # Python runs the handler on the main thread only, and only when it wakes: a SIGTERM that
    # comes as it falls asleep for good (a pool worker in its task queue's lock, which a sibling
    # killed by terminate() held) would never end the process, where the default action would
    with guard("SIGTERM watch"):
        _exits.watch_sigterm(_on_sigterm, _term_handled, _sigterm_unhandled)


def _on_sigterm(signum: int, frame: object) -> None:
    """SIGTERM with no handler of the application's: store what is open, within the exit
    bound, then die by SIGTERM as the default action would (same exit status).

    The closing runs in a thread of its own: the signal interrupts the main thread
    anywhere, perhaps holding a lock the closing needs; then the bound passes and the
    process dies all the same.

    A SIGTERM while :func:`_at_exit` runs already (at exit, or at ``os._exit()``: a
    ``multiprocessing`` pool's ``terminate()`` sends it to workers still storing what they
    recorded) lets that finish, within its own bound, and then ends the process by it (from
    the main thread; at ``os._exit()``, with the status asked for).

    Once only: a SIGTERM while the first one's close runs (another one sent, or the watch of
    :func:`loopscope._exits.watch_sigterm` waking the main thread) leaves the end to it."""
    global _term_pending
    if not _term_claim.acquire(blocking=False):
        return
    if _exiting:
        _term_pending = True
        return
    closer = _start_closer()
    if closer is None:
        # the interpreter is ending: this thread is in its exit (waiting for the application's
        # threads, or about to run our exit hook), not inside loopscope, so the close runs
        # here, as it would at exit, and the process dies by SIGTERM after it (returning would
        # leave the exit waiting on, perhaps for ever)
        _quietly(_at_exit)
    else:
        closer.join(CLOSE_TIMEOUT + _EXIT_THREAD_GRACE)
    _die_by_sigterm()


def _start_closer() -> threading.Thread | None:
    """:func:`_at_exit` in a thread of its own, started (the SIGTERM's close, bounded by a
    join); None where the interpreter is ending (Python 3.12+ starts no thread then)."""
    closer = threading.Thread(target=_quietly, args=(_at_exit,), name="loopscope-sigterm", daemon=True)
    try:
        closer.start()
    except RuntimeError:
        return None
    return closer


_term_claim = threading.Lock()
"""Taken by what ends the process for a SIGTERM: the handler, or the watch in its stead."""


def _term_handled() -> bool:
    return _term_claim.locked()


def _sigterm_unhandled() -> None:
    """A SIGTERM whose handler the main thread did not run (it blocks the signal, or sleeps in
    C code that never returns to Python), called by the SIGTERM watch's thread: what
    :func:`_on_sigterm` does, from here, and the process ends with the status a shell gives a
    death by SIGTERM (128 + 15; only the main thread may restore the default action)."""
    global _term_pending
    if not _term_claim.acquire(blocking=False):
        return  # the handler started meanwhile
    _term_pending = True  # an exit under way on the main thread ends by SIGTERM once it is done
    # (where the interpreter is ending, no closer: the main thread runs our exit hook itself)
    closer = None if _exiting else _start_closer()
    if closer is not None:
        closer.join(CLOSE_TIMEOUT + _EXIT_THREAD_GRACE)
    else:  # an exit under way (at exit, at os._exit()) ends the process within its bound, or this does
        time.sleep(CLOSE_TIMEOUT + EXPORT_SHUTDOWN_SECONDS + _EXIT_THREAD_GRACE)
    _exits.exit_now(128 + signal.SIGTERM)


def _die_by_sigterm() -> None:
    atexit.unregister(_at_exit)  # done (or given up): not again on the way out
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


recorder_settings.set_tracer(tracer)  # the recorder's spans start on this pipeline's tracer

__all__ = [
    "Pipeline", "active", "configure", "default_db_path", "flush", "on_shutdown", "set_find_conversations", "shutdown",
    "tracer",
]
