"""What the pipeline tells the recorder: where its spans go, and what to run at shutdown.

The recorder never imports :mod:`loopscope.pipeline` (which imports the recorder to set
it up): the pipeline installs its ``tracer`` function here when it is imported, and runs
the hooks recorder modules register here when it shuts down. ``import loopscope`` imports
neither (start-up is lazy): the package hands its public recorder names out only after
:func:`use_pipeline` named where the pipeline is, so the first span imports it and
configures the defaults (``LOOPSCOPE_DB`` or ``./loopscope.duckdb``) as ``instrument()`` does.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from opentelemetry import trace

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from .chunks import ChunkGaps


def _no_pipeline() -> trace.Tracer:
    raise RuntimeError("loopscope.pipeline is not imported: use the recorder through the loopscope package")


tracer: Callable[[], trace.Tracer] = _no_pipeline
"""The tracer loopscope's spans start on (the pipeline's, configured with the defaults at
first use); call it for each span: ``configure()`` may change it."""

session: str | None = None
"""The session every stitched turn of the process is in when no ``loopscope.session()``
block names one (``LOOPSCOPE_SESSION``, ``loopscope run --session``; ``configure()`` reads it)."""

FIND_CONVERSATIONS_ENV = "LOOPSCOPE_FIND_CONVERSATIONS"
"""``0`` (or ``false``, ``no``, ``off``) turns :data:`find_conversations` off for the process."""


def _env_on(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("0", "false", "no", "off")


find_conversations = _env_on(FIND_CONVERSATIONS_ENV)
"""Whether a new stitched turn that continues an earlier one's conversation joins its
session (:mod:`loopscope.recorder.conversations`) when nothing names the session: on unless
``LOOPSCOPE_FIND_CONVERSATIONS=0`` (read when the recorder is first imported), or
``configure(find_conversations=False)`` / ``instrument(find_conversations=False)``: then
each stitched turn is a session of its own."""

chunk_gaps: Callable[[Span, ChunkGaps], None] | None = None
"""Who takes a streamed call's chunk gaps (:mod:`loopscope.recorder.chunks`) as its ``chat``
span ends: the metrics side, when it records ``gen_ai.client.operation.time_per_output_chunk``
(``configure()`` sets it). ``None``: stream proxies' stamps are not kept at all."""

shutdown_hooks: list[Callable[[], None]] = []
"""Run at ``loopscope.shutdown()``, in order, before the store's last flush."""

exit_hooks: list[Callable[[], None]] = []
"""Run when the process ends (normal end, ``sys.exit``, an uncaught exception, SIGTERM),
in order, before :data:`shutdown_hooks` and the store's last flush: what only an ending
process may cut short (streams still open)."""


def set_tracer(source: Callable[[], trace.Tracer]) -> None:
    """Make :data:`tracer` call ``source`` (the pipeline, at its import)."""
    global tracer
    tracer = source


def use_pipeline(source: Callable[[], trace.Tracer]) -> None:
    """Make :data:`tracer` call ``source`` until the pipeline is imported (the package, when it
    hands out a recorder name: ``source`` imports the pipeline, which then installs its own)."""
    global tracer
    if tracer is _no_pipeline:
        tracer = source


def on_shutdown(hook: Callable[[], None]) -> None:
    """Run ``hook`` at ``loopscope.shutdown()``, before the store's last flush (ends open turns)."""
    shutdown_hooks.append(hook)


def on_exit(hook: Callable[[], None]) -> None:
    """Run ``hook`` when the process ends, before the shutdown hooks and the store's last flush."""
    exit_hooks.append(hook)


__all__ = ["exit_hooks", "on_exit", "on_shutdown", "set_tracer", "shutdown_hooks", "tracer", "use_pipeline"]
