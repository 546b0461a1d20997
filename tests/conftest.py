"""Shared fixtures: a real DuckDB file per test, and an in-memory copy of every span."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

os.environ["LOOPSCOPE_STRICT"] = "1"  # internal errors fail tests instead of being logged
# pytest-xdist's workers inherit COLUMNS=80 and LINES=24 from their launcher; the tables the
# commands print are checked at the width a pipe gets (tests that want a width set COLUMNS)
for _size in ("COLUMNS", "LINES"):
    os.environ.pop(_size, None)
# a suite started in the background (`cmd &` in a script, nohup) inherits Ctrl-C ignored, and so
# would every child it starts: the tests that press Ctrl-C on a command want it as a terminal has it
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import loopscope
import stacks
from fakes.model_server import STANDS_FOR, FakeModelServer
from loopscope import _guard
from loopscope.semconv import OPERATION

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

    def spans(self, operation: str | None = None):
        """Every finished span (a tuple of ReadableSpan), or a list of those of one
        ``gen_ai.operation.name``."""
        found = self.exporter.get_finished_spans()
        if operation is None:
            return found
        return [s for s in found if s.attributes.get(OPERATION) == operation]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "thread_writer: the test's `recording` pipeline runs the thread writer (a test of its insides)")
    config.addinivalue_line("markers", "writer_fallback: the test makes the default writer fall back to the thread (a test of that)")
    config.addinivalue_line("markers", "serial: runs alone, after the parallel tests, with nothing beside it (docs/testing.md)")
    config.addinivalue_line("markers", "stack(name): runs in that stack's venv (tests/stacks.toml), in no other")


# -- stacks (tests/stacks.toml): each test runs in one venv ---------------------------------------------

_STACKS = stacks.load()
_HERE = stacks.current()
if _HERE != "core" and _HERE not in _STACKS:
    raise pytest.UsageError(f"LOOPSCOPE_STACK={_HERE} names no stack of tests/stacks.toml")


def pytest_ignore_collect(collection_path: Path) -> bool | None:
    """In the core venv, the files a stack runs are not collected (their libraries are not here)."""
    if _HERE == "core" and collection_path.suffix == ".py" and stacks.owned(str(collection_path), _STACKS):
        return True
    return None


def _stack_of(item: pytest.Item) -> str:
    marker = item.get_closest_marker("stack")
    if marker is not None:
        name = marker.args[0]
        if name not in _STACKS:
            raise pytest.UsageError(f"{item.nodeid}: stack({name!r}) is no stack of tests/stacks.toml")
        if name not in stacks.owned(str(item.path), _STACKS):  # it would run nowhere
            raise pytest.UsageError(f"{item.nodeid}: stack({name!r}), but that stack's `runs` do not hold its file")
        return name
    owners = stacks.owned(str(item.path), _STACKS)
    if len(owners) > 1:
        raise pytest.UsageError(f"{item.nodeid}: its file is run by the stacks {owners}: mark it @pytest.mark.stack(NAME)")
    return owners[0] if owners else "core"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the tests of this venv's stack (an `again` stack reruns core tests)."""
    keep_as = "core" if _HERE != "core" and _STACKS[_HERE].again else _HERE
    kept, dropped = [], []
    for item in items:
        (kept if _stack_of(item) == keep_as else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


# the warnings of a default writer (``auto``) that runs the thread instead of a writer process:
# no child could start, or none can run here (loopscope.ingest.writer_process)
FELL_BACK = frozenset({"writer-fallback", "writer-process-unavailable"})


@pytest.fixture(autouse=True)
def _writer_process_kept(request: pytest.FixtureRequest) -> Iterator[None]:
    """The default writer runs a writer process here: a test whose writer fell back to the thread
    fails, unless it is marked ``writer_fallback`` (a test of the fallback). So every test that
    records under the default checks the writer process, and none passes on the thread unseen
    (docs/testing.md: what test_writer_process_suite.py did). Children: the ``spawn`` fixture."""
    yield
    with _guard._seen_lock:
        fell = _guard._seen & FELL_BACK
        _guard._seen -= FELL_BACK  # said again by the next test whose writer falls back
    if fell and not request.node.get_closest_marker("writer_fallback"):
        pytest.fail(f"the store's writer fell back to the thread ({', '.join(sorted(fell))}): see the warning above")


@pytest.fixture(scope="session")
def _empty_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store made by loopscope itself (``prepare``: every migration run), once per worker: each
    ``recording`` starts from a copy, so that its writer opens an existing store, as every
    writer after a store's first does, instead of running the 17 migrations again (~0.3 s of
    each of some 1,500 tests; tests of a store's making use paths of their own)."""
    from loopscope.storage.queries import prepare

    path = tmp_path_factory.mktemp("empty-store") / "store.duckdb"
    prepare(str(path))
    return path


@pytest.fixture
def recording(tmp_path: Path, request: pytest.FixtureRequest, _empty_store: Path) -> Iterator[Recording]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    db = tmp_path / "store.duckdb"
    shutil.copyfile(_empty_store, db)
    # the exporter here checks the span tree against the rows: it may see content
    writer = "thread" if request.node.get_closest_marker("thread_writer") else None  # else the default's
    # the fake model server stands for the provider of each SDK that calls it (its calls are priced)
    pipeline = loopscope.configure(db, tracer_provider=provider, flush_interval=0.05, capture_content=True, writer=writer,
                                   prices=STANDS_FOR)
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
