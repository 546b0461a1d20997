"""Shared fixtures: a real DuckDB file per test, and an in-memory copy of every span."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

os.environ["LOOPSCOPE_STRICT"] = "1"  # internal errors fail tests instead of being logged

import loopscope
from fakes.model_server import FakeModelServer
from loopscope import _guard

_guard.set_strict(True)

# fixtures every test may name: ``spawn`` (a child interpreter, tests/children.py) and
# ``model_server`` (the fake model server, tests/fakes/fixtures.py)
pytest_plugins = ["children", "fakes.fixtures"]


@dataclass
class Recording:
    """A configured pipeline writing to ``db``; ``spans`` holds every finished span."""

    db: Path
    exporter: InMemorySpanExporter
    pipeline: loopscope.Pipeline

    @property
    def store(self) -> loopscope.Store:
        return loopscope.Store(str(self.db))

    def spans(self):  # a tuple of ReadableSpan
        return self.exporter.get_finished_spans()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "thread_writer: the test's `recording` pipeline runs the thread writer (a test of its insides)")


@pytest.fixture
def recording(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Recording]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    db = tmp_path / "store.duckdb"
    # the exporter here checks the span tree against the rows: it may see content
    writer = "thread" if request.node.get_closest_marker("thread_writer") else None  # else the default's
    pipeline = loopscope.configure(db, tracer_provider=provider, flush_interval=0.05, capture_content=True, writer=writer)
    try:
        yield Recording(db, exporter, pipeline)
    finally:
        loopscope.shutdown()


@pytest.fixture
def instrumented(recording: Recording) -> Iterator[Recording]:
    """:func:`recording` with every adapter on (a module that needs fewer defines its own)."""
    loopscope.instrument()
    try:
        yield recording
    finally:
        loopscope.uninstrument()


@pytest.fixture
def server(model_server: FakeModelServer) -> FakeModelServer:
    """The fake model server (:func:`fakes.fixtures.model_server`), as the adapter tests name it."""
    return model_server


@pytest.fixture
def quiet() -> Iterator[None]:
    """Internal errors logged and swallowed, as in production (the fault-injection tests)."""
    _guard.set_strict(False)
    try:
        yield
    finally:
        _guard.set_strict(True)
