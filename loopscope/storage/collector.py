"""Kept so that ``loopscope.storage.collector.Collector`` (which README names) still
imports: the OTLP receiver lives in :mod:`loopscope.ingest.otlp`. Remove once README
names :mod:`loopscope.ingest.otlp.collector` (the layer rules allow this one upward import)."""

from __future__ import annotations

from ..ingest.otlp.collector import *  # noqa: F403
from ..ingest.otlp.collector import __all__  # noqa: F401
