"""Fixtures of the storage tests: a running OTLP collector (test_collector*.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from loopscope.ingest.otlp.collector import Collector


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Collector]:
    """A collector on free ports writing ``collected.duckdb`` in the test's folder."""
    c = Collector(str(tmp_path / "collected.duckdb"), http_port=0, grpc_port=0, flush_interval=0.05).start()
    try:
        yield c
    finally:
        c.stop()
