"""``loopscope collect --db chdb://...`` for users without a Collector: an agent's spans, exported as
OTLP over loopback to a ``collect`` child, land in chDB's ``otel_traces`` as the exporter writes
them (``storage/clickhouse/sink.py``), and the materialized views make of them what the DuckDB
store makes of the same spans. chDB lets one process at a time open a directory: the child holds it
while it runs, so this process reads after the child stopped.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_loop import record_sessions
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import loopscope
from children import collect_child
from loopscope.storage.queries import open_reader, open_sink
from loopscope.storage.rows import END

pytestmark = pytest.mark.stack("clickhouse")


def test_collect_writes_otlp_spans_into_chdb_and_they_read_as_in_duckdb(tmp_path: Path) -> None:
    url = f"chdb://{tmp_path}/collected"
    duck = tmp_path / "store.duckdb"
    with collect_child(url, "--no-grpc") as child:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=child.http + "/v1/traces")))
        loopscope.configure(duck, tracer_provider=provider, flush_interval=0.05, capture_content=True)
        try:
            record_sessions()
            assert loopscope.flush()
        finally:
            loopscope.shutdown()
            provider.shutdown()
        out = child.stop_ok(60)
    assert "stopped" in out
    ch, expected = open_reader(url), open_reader(str(duck))
    try:
        assert [s.session_id for s in ch.sessions()] == [s.session_id for s in expected.sessions()]
        assert [(s.event_count, s.turn_count) for s in ch.sessions()] == [(s.event_count, s.turn_count) for s in expected.sessions()]
        for session in ("alpha", "beta"):
            assert [(e.index, e.type, e.status, e.correlation_id, e.created_at) for e in ch.timeline(session)] == \
                [(e.index, e.type, e.status, e.correlation_id, e.created_at) for e in expected.timeline(session)]
        assert [(t.correlation_id, t.usage, t.tool_calls_count, t.loop_end_reason) for t in ch.turn_rows()] == \
            [(t.correlation_id, t.usage, t.tool_calls_count, t.loop_end_reason) for t in expected.turn_rows()]
        assert [r["tool"] for r in ch.tools()] == [r["tool"] for r in expected.tools()]
    finally:
        ch.close()  # type: ignore[attr-defined]


def test_the_sink_batches_and_a_resent_span_reads_once(tmp_path: Path) -> None:
    """In process: spans through ``open_sink`` in a bundle and one by one, flushed as batches, and a
    follower sees each event land once; the same spans sent again (a client's retry) change no
    answer and are no new events."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    loopscope.configure(tmp_path / "store.duckdb", tracer_provider=provider, flush_interval=0.05, capture_content=True)
    try:
        record_sessions()
        assert loopscope.flush()
    finally:
        loopscope.shutdown()
    spans = exporter.get_finished_spans()
    url = f"chdb://{tmp_path}/sunk"
    from loopscope.storage.queries import prepare

    prepare(url)
    sink = open_sink(url, mapping=None, batch_rows=20, flush_interval=60)  # type: ignore[arg-type]
    reader = open_reader(url)
    try:
        follow = reader.follow(None)  # every session's log, followed by polling
        assert follow.start(5) == []
        sink.begin_bundle()
        for span in spans[:10]:
            sink.submit_start(span)  # nothing to write: ended spans only
            sink.submit_end(span)
        sink.end_bundle([])
        for span in spans[10:]:
            sink.submit(END, span)
        assert sink.stats().queued == len(spans)
        assert sink.flush(30)
        stats = sink.stats()
        assert (stats.written_events, stats.queued, stats.batches) == (len(spans), 0, -(-len(spans) // 20))
        once = (reader.sessions(), reader.timeline("gamma"), reader.turn_rows(), reader.tools())
        landed = follow.poll()
        assert len(landed) == sum(len(reader.timeline(s.session_id)) for s in once[0])  # blocked rows left out
        assert [e.index for e in landed if e.session_id == "gamma"] == [e.index for e in once[1]]
        for span in spans:
            sink.submit_end(span)
        assert sink.flush(30)
        assert (reader.sessions(), reader.timeline("gamma"), reader.turn_rows(), reader.tools()) == once
        assert follow.poll() == []  # a resent span is no new event
        assert reader.turn_count() == 6
    finally:
        sink.close(10)
        reader.close()  # type: ignore[attr-defined]
