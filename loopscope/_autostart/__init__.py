"""Zero-code start: turn loopscope on in a process that never imports it.

Two doors lead here. ``loopscope run -- python app.py`` puts the ``boot`` folder beside
this file first on ``PYTHONPATH``, whose ``sitecustomize`` calls :func:`start` when the
child interpreter starts; ``opentelemetry-instrument python app.py`` finds
:class:`loopscope._autostart.otel.LoopscopeInstrumentor` under the
``opentelemetry_instrumentor`` entry point, which calls :func:`start` too. Settings come
from the environment, so the application's code stays as it is.
"""

from __future__ import annotations

import os

DISABLED_ENV = "LOOPSCOPE_DISABLED_ADAPTERS"
"""Comma-separated adapter names to leave alone (``anthropic,mcp``)."""


def switches() -> dict[str, bool]:
    """Adapter switches from ``LOOPSCOPE_DISABLED_ADAPTERS``; unknown names are an error."""
    from ..instrument import ADAPTERS

    names = {n.strip().replace("-", "_") for n in os.environ.get(DISABLED_ENV, "").split(",") if n.strip()}
    unknown = names - set(ADAPTERS)
    if unknown:
        raise ValueError(
            f"{DISABLED_ENV} names unknown adapters: {', '.join(sorted(unknown))} (known: {', '.join(ADAPTERS)})"
        )
    return {name: False for name in names}


def start() -> list[str]:
    """Configure the defaults from the environment and turn every adapter on (stitched
    turns that continue an earlier one's conversation join its session, as in every mode,
    unless ``LOOPSCOPE_FIND_CONVERSATIONS=0``).

    Never raises into the starting application: a problem is logged once (and raised in
    strict mode) and the application runs uninstrumented.
    """
    from .._guard import guard  # here: ``loopscope run``'s parser reads DISABLED_ENV and nothing else

    with guard("autostart"):
        from ..instrument import instrument

        return instrument(**switches())
    return []
