"""loopscope's own span start and end (loopscope/_otel_sdk.py, the SDK door): the spans every processor and
exporter sees are the ones the SDK's Tracer would make, and any configuration the fast
path does not know goes through the SDK."""

from __future__ import annotations

import os
from typing import Any

import pytest
from opentelemetry import context, trace
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, TraceIdRatioBased
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from loopscope import _otel_sdk
from loopscope._otel_sdk import attach_span, detach, end_span, start_span

ATTRIBUTES = {"gen_ai.operation.name": "chat", "n": 3, "f": 0.5, "b": True, "t": ("stop",)}


class Seen(SpanProcessor):
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, Any]] = []

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.calls.append(("start", span, parent_context))

    def _on_ending(self, span: Any) -> None:
        self.calls.append(("ending", span, None))

    def on_end(self, span: ReadableSpan) -> None:
        self.calls.append(("end", span, None))


def _ending() -> list[str]:
    """What the SDK calls on a processor when a span ends: ``_on_ending`` then ``on_end``
    (since 1.3x), or ``on_end`` alone (older)."""
    seen = Seen()
    tp = TracerProvider(shutdown_on_exit=False)
    tp.add_span_processor(seen)
    tp.get_tracer("probe").start_span("probe").end()
    return [k for k, _, _ in seen.calls[1:]]


def provider(**kwargs: Any) -> tuple[TracerProvider, Seen]:
    seen = Seen()
    tp = TracerProvider(shutdown_on_exit=False, **kwargs)
    tp.add_span_processor(seen)
    return tp, seen


def shape(span: ReadableSpan) -> tuple[Any, ...]:
    """What an exporter reads from a span, ids and times aside."""
    ctx = span.get_span_context()
    return (
        span.name, span.kind, span.parent, list(span.attributes.items()),
        [(e.name, dict(e.attributes), e.timestamp) for e in span.events], span.links, span.status.status_code,
        span.resource, span.instrumentation_scope, ctx.is_remote, ctx.trace_flags, ctx.trace_state, ctx.is_valid,
        span.dropped_attributes, span.dropped_events, span.dropped_links,
    )


ENDING = _ending()


def test_the_fast_path_is_on_for_this_sdk() -> None:
    # the probes found the SDK's spans to be the ones built here; .ci/run's run against the
    # oldest supported SDK (whose spans are built otherwise) expects the SDK's own path
    # there, and the run with the switch off expects it off
    expected = os.environ.get("LOOPSCOPE_EXPECT_SDK_FAST_PATH", "1") != "0"
    assert _otel_sdk.fast_path() is expected


@pytest.mark.parametrize("with_parent", [False, True])
def test_spans_are_the_sdks_own(with_parent: bool) -> None:
    tp, seen = provider()
    tracer = tp.get_tracer("loopscope", "1.0")
    parent = tracer.start_span("invoke_agent") if with_parent else None
    ctx = trace.set_span_in_context(parent) if parent is not None else None
    theirs = tracer.start_span("chat m", context=ctx, attributes=dict(ATTRIBUTES), start_time=10)
    mine = start_span(tracer, "chat m", ctx, dict(ATTRIBUTES), 10)
    assert type(mine) is type(theirs)
    assert [(k, s, p) for k, s, p in seen.calls[-2:]] == [("start", theirs, ctx), ("start", mine, ctx)]
    if parent is not None:
        assert mine.parent == parent.get_span_context()
        assert mine.get_span_context().trace_id == parent.get_span_context().trace_id
    else:
        assert mine.parent is None
        assert mine.get_span_context().trace_id != theirs.get_span_context().trace_id
    assert mine.get_span_context().span_id != theirs.get_span_context().span_id
    # later attributes and events behave the same on both
    for span in (theirs, mine):
        span.set_attribute("late", "x")
        span.add_event("note", {"k": 1}, timestamp=11)
    seen.calls.clear()
    theirs.end(end_time=20)
    sdk_calls = list(seen.calls)
    seen.calls.clear()
    end_span(mine, 20)
    kinds = [k for k, _, _ in seen.calls]
    assert kinds == [k for k, _, _ in sdk_calls] == ENDING
    assert all(s is mine for k, s, _ in seen.calls if k == "ending")
    ended_theirs, ended_mine = sdk_calls[-1][1], seen.calls[-1][1]
    assert type(ended_mine) is type(ended_theirs) is ReadableSpan
    assert shape(ended_mine) == shape(ended_theirs)
    assert (ended_mine.start_time, ended_mine.end_time) == (10, 20)
    assert not mine.is_recording()
    mine.set_attribute("after", 1)  # ignored after the end, as the SDK does
    assert "after" not in mine.attributes


def test_an_ended_span_ends_once() -> None:
    tp, seen = provider()
    span = start_span(tp.get_tracer("loopscope"), "chat", None, {"a": "b"})
    end_span(span)
    end_span(span)  # the SDK warns and does nothing
    assert [k for k, _, _ in seen.calls] == ["start", *ENDING]


def test_a_parent_that_is_not_sampled_gives_what_the_sdk_gives() -> None:
    tp, _ = provider()
    tracer = tp.get_tracer("loopscope")
    unsampled = NonRecordingSpan(SpanContext(1, 2, is_remote=True, trace_flags=TraceFlags(0)))
    span = start_span(tracer, "chat", trace.set_span_in_context(unsampled), {"a": "b"})
    assert not span.is_recording()
    assert span.get_span_context().trace_id == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"sampler": ALWAYS_OFF},
        {"sampler": TraceIdRatioBased(1.0)},  # not the default sampler: the SDK decides
        {"span_limits": SpanLimits(max_span_attribute_length=3)},
        {"span_limits": SpanLimits(max_span_attributes=2)},
    ],
    ids=["always-off", "ratio", "value-length", "attribute-count"],
)
def test_other_configurations_take_the_sdks_path(kwargs: dict[str, Any]) -> None:
    tp, _ = provider(**kwargs)
    tracer = tp.get_tracer("loopscope")
    theirs = tracer.start_span("chat", attributes={"a": "long value", "b": 1, "c": 2})
    mine = start_span(tracer, "chat", None, {"a": "long value", "b": 1, "c": 2})
    assert type(mine) is type(theirs)
    if mine.is_recording():
        assert dict(mine.attributes) == dict(theirs.attributes)  # truncated or dropped the same way
        assert mine.dropped_attributes == theirs.dropped_attributes


def test_always_on_records_under_an_unsampled_parent_like_the_sdk() -> None:
    tp, _ = provider(sampler=ALWAYS_ON)
    tracer = tp.get_tracer("loopscope")
    ctx = trace.set_span_in_context(NonRecordingSpan(SpanContext(1, 2, is_remote=True, trace_flags=TraceFlags(0))))
    theirs = tracer.start_span("chat", context=ctx)
    mine = start_span(tracer, "chat", ctx, {})
    assert mine.is_recording() and theirs.is_recording()
    assert mine.get_span_context().trace_flags == theirs.get_span_context().trace_flags


def test_values_the_sdk_would_clean_take_its_path() -> None:
    tp, _ = provider()
    tracer = tp.get_tracer("loopscope")
    values = {"list": ["a", "b"], "none": None, "obj": object()}
    theirs = tracer.start_span("chat", attributes=dict(values))
    mine = start_span(tracer, "chat", None, dict(values))
    assert list(mine.attributes.items()) == list(theirs.attributes.items())


def test_attach_and_detach() -> None:
    tp, _ = provider()
    span = start_span(tp.get_tracer("loopscope"), "chat", None, {})
    before = context.get_current()
    token = attach_span(span)
    assert trace.get_current_span() is span
    detach(token)
    assert context.get_current() is before
