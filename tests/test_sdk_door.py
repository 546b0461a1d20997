"""The SDK door (loopscope/_otel_sdk.py): the only module that uses private names of the
OpenTelemetry SDK and API; its switch turns every fast path off, and the SDK's public path
then gives the same spans and the same rows."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

import loopscope
from loopscope import _otel_sdk
from recorded import connect_when_free
from sample_tools import book, weather

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "loopscope"
DOOR = PACKAGE / "_otel_sdk.py"

# loopscope's own objects whose fields share a name with a private field of the SDK's
OWN = {
    ("turn", "_context"),  # Turn._context(): the context a turn's children start in
    ("rnd", "_start_time"), ("rnd", "_end_time"),  # a Round's times (recorder/turn.py)
}


# private names of some SDK versions and not others (the check runs on the oldest and the newest)
_VERSIONED = {"_on_ending", "_batch_processor", "_queue", "_tracer_metrics", "_tracer_config", "_record_end_metrics"}


def _sdk_private_names() -> set[str]:
    """The private fields and methods of the SDK's objects loopscope meets, as this SDK has
    them, and those of other versions."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    batch = BatchSpanProcessor(exporter)
    provider.add_span_processor(batch)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("probe", "1")
    live = tracer.start_span("probe", attributes={"k": "v"})
    live.end()
    ended = exporter.get_finished_spans()[0]
    objects: list[Any] = [
        provider, tracer, live, ended, provider._active_span_processor, batch, SimpleSpanProcessor(exporter), exporter,
        BoundedAttributes(attributes={"k": "v"}), BoundedList(3), InstrumentationScope("probe"), SpanLimits(),
        Resource.create({}), otel_context.get_current(), otel_context._RUNTIME_CONTEXT,
    ]
    names: set[str] = set(_VERSIONED)
    for obj in objects:
        for name in [*getattr(obj, "__dict__", {}), *dir(type(obj))]:
            if name.startswith("_") and not name.startswith("__"):
                names.add(name)
    batch.shutdown()
    return names


def _violations(path: Path, private: set[str]) -> list[str]:
    found: list[str] = []
    tree = ast.parse(path.read_text(), str(path))
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("opentelemetry"):
            parts = (node.module or "").split(".")
            for alias in node.names:
                if alias.name.startswith("_") or any(p.startswith("_") for p in parts):
                    found.append(f"{where}:{node.lineno}: from {node.module} import {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("opentelemetry") and any(p.startswith("_") for p in alias.name.split(".")):
                    found.append(f"{where}:{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.Attribute) and node.attr in private:
            receiver = node.value.id if isinstance(node.value, ast.Name) else None
            if receiver in ("self", "cls") or (receiver, node.attr) in OWN:
                continue
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
            and len(node.args) > 1
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in private
        ):
            found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_private_sdk_name_outside_the_door() -> None:
    private = _sdk_private_names()
    assert {"_attributes", "_dict", "_span_processors", "_on_ending", "_batch_processor"} <= private  # the check sees them
    found = [v for path in sorted(PACKAGE.rglob("*.py")) if path != DOOR for v in _violations(path, private)]
    assert not found, (
        "private names of the OpenTelemetry SDK belong in loopscope/_otel_sdk.py only (a field of loopscope's own "
        "object that shares a name goes in OWN above):\n" + "\n".join(found)
    )


def test_the_check_finds_private_names(tmp_path: Path) -> None:
    """The check above is not blind: each kind of use it looks for, in a module outside the door."""
    source = textwrap.dedent('''
        from opentelemetry.sdk.trace import _Span
        from opentelemetry.trace.propagation import _SPAN_KEY
        def f(span, provider, processor):
            span._attributes._dict
            provider._active_span_processor._span_processors
            getattr(processor, "_batch_processor", None)
            self._attributes  # a class's own field: not reported
    ''')
    module = tmp_path / "elsewhere.py"
    module.write_text(source)
    found = _violations(module, _sdk_private_names())
    # two imports, four attributes (each link of a chain), one getattr; not the class's own field
    assert len(found) == 7, found
    assert not any("self." in v for v in found)


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), **env},
    )


_WHICH_PATH = """
    import sys
    from opentelemetry.sdk.trace import Span, Tracer, TracerProvider
    from loopscope import _otel_sdk

    called = set()
    def watch(frame, event, arg):
        if event == "call":
            called.add(frame.f_code)
    tracer = TracerProvider(shutdown_on_exit=False).get_tracer("loopscope")
    sys.setprofile(watch)
    span = _otel_sdk.start_span(tracer, "chat", None, {"gen_ai.operation.name": "chat"})
    _otel_sdk.set_attributes(span, {"n": 1})
    _otel_sdk.end_span(span, None, {"m": 2})
    sys.setprofile(None)
    sdk = {f.__name__ for f in (Tracer.start_span, Span.set_attributes, Span.end) if f.__code__ in called}
    print(_otel_sdk.fast_path(), sorted(sdk), dict(span.attributes))
"""


def test_the_fast_path_builds_spans_itself_and_the_switch_turns_it_off() -> None:
    attributes = "{'gen_ai.operation.name': 'chat', 'n': 1, 'm': 2}"
    off = _run(_WHICH_PATH, LOOPSCOPE_SDK_FAST_PATH="0")
    assert off.returncode == 0, off.stderr
    assert off.stdout.strip() == f"False ['end', 'set_attributes', 'start_span'] {attributes}"  # the SDK's own path
    on = _run(_WHICH_PATH)
    assert on.returncode == 0, on.stderr
    if _otel_sdk.fast_path():
        assert on.stdout.strip() == f"True [] {attributes}"  # none of the SDK's own start, set or end ran
    else:  # this SDK's spans are not the ones the fast path builds: they start and end the SDK's way
        assert on.stdout.strip().startswith("False ['end', ") and "'start_span'" in on.stdout


def test_set_fast_path_switches_at_run_time() -> None:
    was = _otel_sdk.fast_path()
    try:
        assert _otel_sdk.set_fast_path(False) is False
        assert _otel_sdk.span_fields().types == frozenset() and _otel_sdk.span_fields().bounded is None
    finally:
        assert _otel_sdk.set_fast_path(True) is was  # back on only where the probes passed


# -- both paths, the same spans and rows -------------------------------------------------------



def _workload() -> None:
    with loopscope.session("s1"), loopscope.turn(agent="concierge", input="Dinner outside?", correlation_id="t1") as t:
        t.generation(
            "Let me check.", tool_calls=[{"id": "c1", "name": "weather", "arguments": {"city": "Paris"}}],
            usage={"input_tokens": 100, "output_tokens": 10}, model="m-1", provider="scripted",
        )
        weather("Paris")
        t.generation("Booking.", tool_calls=[{"id": "c2", "name": "book", "arguments": {"when": "never"}}])
        with pytest.raises(LookupError):
            book("never")
        loopscope.state_snapshot({"step": 2})
        t.generation("Could not book.", finish_reason="stop", usage={"input_tokens": 200, "output_tokens": 6})


_RANDOM = {"id", "created_at", "trace_id", "span_id", "timestamp", "latency_ms", "tool_duration_ms", "last_seen"}


def _rows(db: Path) -> dict[str, list[tuple[Any, ...]]]:
    """The events and turns the store holds, without ids and times (random on each run)."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    with connect_when_free(db) as con:
        for table, order in (("events", "idx"), ("turns", "correlation_id")):
            cursor = con.execute(f"SELECT * FROM {table} ORDER BY {order}")
            columns = [d[0] for d in cursor.description]
            out[table] = [tuple(_steady(v) for c, v in zip(columns, row) if c not in _RANDOM) for row in cursor.fetchall()]
    return out


def _steady(value: Any) -> Any:
    """A row's JSON content without the durations in it."""
    if isinstance(value, str) and value.startswith("{"):
        content = json.loads(value)
        if isinstance(content, dict) and "duration_ms" in content:
            content["duration_ms"] = content["duration_ms"] is not None
            return json.dumps(content, sort_keys=True)
    return value


def _span_shape(span: ReadableSpan, names: dict[int, str]) -> tuple[Any, ...]:
    """What an exporter reads from a span, ids and times aside (the parent by name)."""
    volatile = {"gen_ai.response.id"}
    attributes = {k: v for k, v in span.attributes.items() if k not in volatile}
    if "loopscope.turn.latency_ms" in attributes:
        attributes.pop("loopscope.turn.latency_ms")
    return (
        span.name, span.kind, names.get(span.parent.span_id) if span.parent else None, json.dumps(attributes, sort_keys=True),
        [(e.name, sorted(e.attributes.items())) for e in span.events], span.status.status_code, span.status.description,
        span.instrumentation_scope, span.dropped_attributes, span.dropped_events,
    )


@pytest.fixture
def fast_path_restored() -> Iterator[None]:
    was = _otel_sdk.fast_path()
    yield
    _otel_sdk.set_fast_path(was)


def test_both_paths_give_the_same_spans_and_rows(tmp_path: Path, fast_path_restored: None) -> None:
    seen: dict[bool, tuple[Any, ...]] = {}
    for fast in (True, False):
        _otel_sdk.set_fast_path(fast)
        exporter = InMemorySpanExporter()
        provider = TracerProvider(shutdown_on_exit=False)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        db = tmp_path / f"fast-{fast}.duckdb"
        loopscope.configure(db, tracer_provider=provider, flush_interval=0.05, capture_content=True)
        try:
            _workload()
        finally:
            loopscope.shutdown()
        spans = exporter.get_finished_spans()
        names = {s.context.span_id: s.name for s in spans}
        assert all(type(s) is ReadableSpan for s in spans)
        seen[fast] = (sorted(map(repr, (_span_shape(s, names) for s in spans))), _rows(db))
    spans, rows = seen[True]
    assert len(spans) == 7  # the turn, three rounds, two tools and the state snapshot
    assert len(rows["turns"]) == 1 and len(rows["events"]) >= 7  # the input, tool starts and ends, texts, the state
    assert seen[True] == seen[False]


def test_the_span_tests_pass_with_the_switch_off() -> None:
    """tests/recorder/test_spans.py, whose spans are compared with the SDK's own, on the
    SDK's public path (the whole suite runs on the fast path)."""
    env = {
        **os.environ, "LOOPSCOPE_SDK_FAST_PATH": "0", "LOOPSCOPE_EXPECT_SDK_FAST_PATH": "0",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/recorder/test_spans.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and " failed" not in result.stdout
