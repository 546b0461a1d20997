"""Configuration of the one pipeline: recorder spans -> store processor (-> exporters).

``configure()`` decides where spans go. If the application already installed an SDK
``TracerProvider`` (its own, Logfire's, ...), loopscope adds its processor to it;
otherwise it sets one up. Calling ``configure()`` again re-targets the store without
stacking processors.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider

from ._guard import internal_error
from .storage.connection import open_store, resolve
from .storage.errors import StoreError, StoreLockedError
from .storage.policy import PersistencePolicy
from .storage.processor import StoreSpanProcessor
from .storage.schema import migrate
from .storage.writer import StoreWriter, WriterStats

DEFAULT_DB = "loopscope.duckdb"


def default_db_path() -> str:
    """``LOOPSCOPE_DB`` if set, else ``./loopscope.duckdb``."""
    return os.environ.get("LOOPSCOPE_DB") or DEFAULT_DB


class _Dispatch(SpanProcessor):
    """Installed once per provider; forwards to whichever store is configured now."""

    def __init__(self) -> None:
        self.target: SpanProcessor | None = None

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        target = self.target
        if target is not None:
            target.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        target = self.target
        if target is not None:
            target.on_end(span)

    def shutdown(self) -> None:
        target, self.target = self.target, None
        if target is not None:
            target.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        target = self.target
        return target.force_flush(timeout_millis) if target is not None else True


@dataclass
class Pipeline:
    """What ``configure()`` set up: the provider spans go to, and the store they land in."""

    tracer_provider: TracerProvider
    tracer: trace.Tracer
    db_path: str | None
    writer: StoreWriter | None

    def stats(self) -> WriterStats | None:
        return self.writer.stats() if self.writer else None


_active: Pipeline | None = None
_shutdown_hooks: list[Callable[[], None]] = []


def on_shutdown(hook: Callable[[], None]) -> None:
    """Run ``hook`` at ``shutdown()``, before the store's last flush (ends open turns)."""
    _shutdown_hooks.append(hook)
_lock = threading.RLock()
_dispatchers: dict[int, _Dispatch] = {}


def _check_db(path: str) -> None:
    """Fail at configuration time, clearly, when the store cannot be written at all."""
    target = Path(path)
    if target.is_dir():
        raise StoreError(f"loopscope store path {path} is a directory; give a file path such as {target / DEFAULT_DB}")
    if not target.parent.is_dir():
        raise StoreError(f"cannot create the loopscope store {path}: folder {target.parent} does not exist")
    if not os.access(target.parent, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise StoreError(f"cannot write the loopscope store {path}: permission denied")
    try:
        with open_store(path, read_only=False, timeout=0.5) as con:
            migrate(con)
    except StoreLockedError:
        # another process writes here too: our writer waits its turn between its batches
        return


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
    flush_interval: float = 0.5,
    queue_size: int = 200_000,
    tracer_provider: TracerProvider | None = None,
    service_name: str | None = None,
    stitch_idle_timeout: float | None = None,
) -> Pipeline:
    """Set up loopscope's pipeline; returns it. Safe to call again to re-target.

    ``db`` is the DuckDB file (default ``LOOPSCOPE_DB`` or ``./loopscope.duckdb``);
    ``False`` records spans without storing them. ``flush_interval`` bounds how long a
    recorded event waits before other processes can read it; ``queue_size`` bounds the
    memory held for events not yet written (past it, events are dropped and counted).
    ``stitch_idle_timeout`` (seconds, default 300) is how long a turn stitched from
    SDK calls waits for the results of its tool calls before it ends as unfinished.
    A path that cannot be written raises :class:`StoreError` here, once.
    """
    global _active
    with _lock:
        path = None if db is False else resolve(default_db_path() if db in (None, True) else db)  # type: ignore[arg-type]
        if path is not None:
            _check_db(path)
        _shutdown_locked()
        provider = _provider(tracer_provider, service_name)
        dispatch = _dispatchers.get(id(provider))
        if dispatch is None:
            dispatch = _dispatchers[id(provider)] = _Dispatch()
            provider.add_span_processor(dispatch)
        writer = None
        if path is not None:
            writer = StoreWriter(path, policy=policy, flush_interval=flush_interval, max_queue=queue_size)
            dispatch.target = StoreSpanProcessor(writer)
        else:
            dispatch.target = None
        from . import __version__

        _active = Pipeline(provider, provider.get_tracer("loopscope", __version__), path, writer)
        if stitch_idle_timeout is not None:
            from .recorder.stitch import set_idle_timeout

            set_idle_timeout(stitch_idle_timeout)
        return _active


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
    """Write every recorded event to the store now; True when all of it landed."""
    pipeline = _active
    if pipeline is None or pipeline.writer is None:
        return True
    return pipeline.writer.flush(timeout)


def _shutdown_locked() -> None:
    global _active
    pipeline, _active = _active, None
    if pipeline is None:
        return
    dispatch = _dispatchers.get(id(pipeline.tracer_provider))
    if dispatch is not None:
        dispatch.target = None
    if pipeline.writer is not None:
        pipeline.writer.close()


def shutdown() -> None:
    """End open stitched turns, flush every recorded event to the store and stop the writer."""
    for hook in _shutdown_hooks:
        try:
            hook()
        except Exception:
            internal_error("shutdown hook")
    with _lock:
        _shutdown_locked()


__all__ = ["Pipeline", "active", "configure", "default_db_path", "flush", "on_shutdown", "shutdown", "tracer"]
