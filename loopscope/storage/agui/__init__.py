"""Kept so that ``loopscope.storage.agui`` (which README names) still imports: AG-UI import
and export live in :mod:`loopscope.ingest.agui`. Remove once README names that (the layer
rules allow this one upward import)."""

from __future__ import annotations

from ...ingest.agui import *  # noqa: F403
from ...ingest.agui import __all__  # noqa: F401
