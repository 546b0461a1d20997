"""Ingestion rate of the store against a plain columnar bulk insert into DuckDB.

First a realistic workload is recorded once with the hand API (turns with an input
message, three generation rounds, two tool calls), capturing every span the store's
processor would see, in order. Then, timed, with several repeats:

* ``store``       -- the spans fed through ``StoreSpanProcessor.on_start/on_end`` to a
  fresh ``StoreWriter`` (its background thread reduces them to facts in Arrow record
  batches, numbers the rows per session, and makes and writes them in SQL into a fresh
  DuckDB file), from the first submit until ``flush()`` returns;
  (with bounds that hold the whole burst: the default ones would drop part of it);
* ``writer-only`` -- the same, submitting straight to ``StoreWriter.submit_start/end``
  (the processor's filter skipped);
* ``baseline``    -- the very same rows, already as Python column lists, inserted into a
  fresh file with the same schema the plain way: ``pyarrow`` table ->
  ``INSERT INTO ... SELECT * FROM`` it, one transaction. The rows are the store's own:
  read back, in the order written, from a store run made before the timed ones.

Rates are rows/s (events + turn summaries + model calls). Also shown, each alone on one thread, where
the store's time goes: the submit on the application's thread, spans to facts (the
Python half of the mapping), and ``write_batch`` on the writer's batches (the SQL half
and the write), with the file opened and closed per batch as the writer does.

Goal: store rate >= 0.5x baseline. The machine is noisy: medians over repeats, and
the ratio of medians measured in the same run.

    .venv/bin/python benchmarks/bench_ingest.py [--turns N] [--repeats R]
"""

from __future__ import annotations

import argparse
import gc
import inspect
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

import loopscope
from loopscope.ingest import mapping
from loopscope.ingest.processor import StoreSpanProcessor
from loopscope.ingest.writer import SPANS
from loopscope.storage.duckdb import writer as store_writer
from loopscope.storage.duckdb.connection import open_store
from loopscope.storage.duckdb.schema import migrate
from loopscope.storage.duckdb.writer import write_batch
from loopscope.storage.queries import open_sink
from loopscope.storage.rows import END as _END
from loopscope.storage.rows import START as _START
from loopscope.storage.rows import Facts

GOAL = 0.5
SESSIONS = 200
TOOLS = [
    {"name": "search", "description": "Search the docs", "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}},
    {"name": "fetch", "description": "Fetch a page", "parameters": {"type": "object", "properties": {"url": {"type": "string"}}}},
]


class _Capture(SpanProcessor):
    """Keeps every span start and end, in order, as the store's processor would see them."""

    def __init__(self) -> None:
        self.items: list[tuple[int, Any]] = []

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.items.append((_START, span))

    def on_end(self, span: Any) -> None:
        self.items.append((_END, span))


def record(turns: int) -> list[tuple[int, Any]]:
    """Record ``turns`` turns with the hand API; returns the captured span sequence."""
    capture = _Capture()
    provider = TracerProvider()
    provider.add_span_processor(capture)
    loopscope.configure(False, tracer_provider=provider)

    @loopscope.tool
    def search(query: str, limit: int = 5) -> dict[str, Any]:
        return {"hits": [{"title": f"{query} {i}", "score": 1.0 / (i + 1)} for i in range(3)], "limit": limit}

    @loopscope.tool
    def fetch(url: str) -> str:
        return f"<html>{url}</html>"

    try:
        for t in range(turns):
            session = f"session-{t % SESSIONS:04d}"
            with loopscope.turn(session_id=session, agent="bench", tools=TOOLS, input=f"question {t}: how do I frobnicate?") as turn:
                turn.generation(
                    "Let me search for that.",
                    tool_calls=[{"id": f"c{t}a", "name": "search", "arguments": {"query": f"frobnicate {t}", "limit": 5}}],
                    usage={"input_tokens": 120, "output_tokens": 20},
                    finish_reason="tool_calls",
                    model="gpt-bench",
                    provider="openai",
                )
                search(f"frobnicate {t}", limit=5)
                turn.generation(
                    "Found it; fetching the page.",
                    tool_calls=[{"id": f"c{t}b", "name": "fetch", "arguments": {"url": f"https://example.com/{t}"}}],
                    usage={"input_tokens": 200, "output_tokens": 25},
                    finish_reason="tool_calls",
                )
                fetch(f"https://example.com/{t}")
                turn.generation("Here is how you frobnicate: ... " * 4, usage={"input_tokens": 400, "output_tokens": 90}, finish_reason="stop")
    finally:
        loopscope.shutdown()
    return capture.items


def fresh_db(folder: Path, name: str) -> str:
    path = str(folder / f"{name}.duckdb")
    con = duckdb.connect(path)
    migrate(con)  # configure() creates the schema up front too
    con.close()
    return path


NO_BOUND = 1 << 62


def run_store(items: list[tuple[int, Any]], path: str, via_processor: bool) -> tuple[float, int]:
    # bounds that hold the whole burst, at every size (the smoke run's too): the default ones
    # (200,000 spans, 64 MiB) drop part of a 15,000-turn burst submitted at once (counted: 141,757
    # events at the full size, issue 29), and a rate of what was kept is no rate of ingestion
    writer = open_sink(path, mapping=SPANS, max_queue=len(items) + 1, max_bytes=NO_BOUND)
    try:
        processor = StoreSpanProcessor(writer)
        t0 = time.perf_counter()
        if via_processor:
            on_start, on_end = processor.on_start, processor.on_end
            for kind, span in items:
                if kind == _START:
                    on_start(span, None)
                else:
                    on_end(span)
        else:
            submit = writer.submit
            for kind, span in items:
                submit(kind, span)
        ok = writer.flush(120)
        elapsed = time.perf_counter() - t0
        stats = writer.stats()
    finally:
        writer.close()
    assert ok and stats.dropped == 0 and stats.failed_writes == 0, stats
    return elapsed, stats.written_events + stats.written_turns + stats.written_calls


def map_all(items: list[tuple[int, Any]]) -> Facts:
    """The Python half of the mapping: every span reduced to the facts of its rows, in
    Arrow record batches."""
    return mapping.facts_of(items)


def stored_columns(path: str) -> tuple[dict[str, list[Any]], dict[str, list[Any]], dict[str, list[Any]]]:
    """The rows a store run wrote, in the order written, as plain Python column lists:
    times as epoch microseconds and JSON as text, as the baseline inserts them."""
    con = duckdb.connect(path, read_only=True)
    try:
        def columns(table: str, times: str, jsons: tuple[str, ...]) -> dict[str, list[Any]]:
            names = [r[0] for r in con.execute(f"SELECT name FROM pragma_table_info('{table}') ORDER BY cid").fetchall()]
            select = ", ".join(f"epoch_us({n})" if n in times.split() else f"{n}::VARCHAR" if n in jsons else n for n in names)
            rows = con.execute(f"SELECT {select} FROM {table} ORDER BY rowid").fetchall()
            return dict(zip(names, map(list, zip(*rows))))

        return (
            columns("events", "created_at", ("content",)),
            columns("turns", "timestamp", ("segments", "usage", "declared_tools")),
            columns("model_calls", "started_at ended_at", ("finish_reasons", "provider_usage", "parameters", "input_messages",
                                                  "output_messages")),
        )
    finally:
        con.close()


_EVENT_TYPES = {"idx": pa.int64(), "created_at": pa.timestamp("us", tz="UTC"), "tool_duration_ms": pa.float64()}
_TURN_TYPES = {
    "tool_calls_count": pa.int32(), "round_count": pa.int32(), "input_tokens": pa.int64(), "output_tokens": pa.int64(),
    "latency_ms": pa.float64(), "streaming": pa.bool_(), "timestamp": pa.timestamp("us", tz="UTC"),
    "model_call_count": pa.int32(), "cost_usd": pa.float64(),
}
_CALL_TYPES = {
    "position": pa.int32(), "streaming": pa.bool_(), "started_at": pa.timestamp("us", tz="UTC"),
    "ended_at": pa.timestamp("us", tz="UTC"),
    "duration_ms": pa.float64(), "time_to_first_chunk_ms": pa.float64(), "input_tokens": pa.int64(),
    "output_tokens": pa.int64(), "cache_read_input_tokens": pa.int64(), "cache_creation_input_tokens": pa.int64(),
    "reasoning_tokens": pa.int64(), "cost_usd": pa.float64(),
}


def run_baseline(ev_cols: dict[str, list[Any]], tu_cols: dict[str, list[Any]], ca_cols: dict[str, list[Any]],
                 path: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    con = duckdb.connect(path)
    con.execute("BEGIN TRANSACTION")
    events = pa.table({k: pa.array(v, _EVENT_TYPES.get(k, pa.string())) for k, v in ev_cols.items()})
    con.register("ev", events)
    con.execute("INSERT INTO events SELECT * FROM ev")
    turns = pa.table({k: pa.array(v, _TURN_TYPES.get(k, pa.string())) for k, v in tu_cols.items()})
    con.register("tu", turns)
    con.execute("INSERT INTO turns SELECT * FROM tu")
    calls = pa.table({k: pa.array(v, _CALL_TYPES.get(k, pa.string())) for k, v in ca_cols.items()})
    con.register("ca", calls)
    con.execute("INSERT INTO model_calls SELECT * FROM ca")
    con.execute("COMMIT")
    con.close()
    elapsed = time.perf_counter() - t0
    return elapsed, events.num_rows + turns.num_rows + calls.num_rows


def run_write_only(batches: list[Facts], path: str) -> float:
    """``write_batch`` alone (facts to rows in SQL, and the write) on the writer's own
    batches, opening the file per batch as the writer does (through ``open_store``, which
    leaves the burst's rows in the WAL and checkpoints its last)."""
    t0 = time.perf_counter()
    for i, facts in enumerate(batches):
        with open_store(path, read_only=False, timeout=10.0, checkpoint=i == len(batches) - 1) as con:
            write_batch(con, facts)
    return time.perf_counter() - t0


def run_submit_only(items: list[tuple[int, Any]], path: str) -> float:
    """The calling thread's share: the processor's filter and the deque append, nothing drained."""
    writer = open_sink(path, mapping=SPANS, flush_interval=3600, batch_size=1 << 60, max_queue=1 << 60, max_bytes=NO_BOUND)
    try:
        processor = StoreSpanProcessor(writer)
        on_start, on_end = processor.on_start, processor.on_end
        t0 = time.perf_counter()
        for kind, span in items:
            if kind == _START:
                on_start(span, None)
            else:
                on_end(span)
        return time.perf_counter() - t0
    finally:
        writer._queue.clear()  # not the point here: drop what was queued
        writer.close()


def writer_batches(items: list[tuple[int, Any]], batch_size: int) -> list[Facts]:
    """The facts of each batch the writer takes in a burst: ``batch_size`` queued spans at a time."""
    queued = [item for item in items if item[1].attributes.get("gen_ai.operation.name") in
              (("execute_tool", "invoke_agent") if item[0] == _START else ("execute_tool", "invoke_agent", "chat"))]
    return [map_all(queued[i:i + batch_size]) for i in range(0, len(queued), batch_size)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=15_000, help="turns recorded (12 rows each: 3 of them model calls)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    t0 = time.perf_counter()
    items = record(args.turns)
    recorded = time.perf_counter() - t0
    facts = map_all(items)
    rows = facts.rows
    batches = writer_batches(items, inspect.signature(store_writer.StoreWriter).parameters["batch_size"].default)
    with tempfile.TemporaryDirectory(prefix="loopscope-bench-") as tmp:
        reference = fresh_db(Path(tmp), "reference")
        run_store(items, reference, False)  # untimed: the rows the baseline inserts are the store's own
        ev_cols, tu_cols, ca_cols = stored_columns(reference)
    assert len(ev_cols["id"]) + len(tu_cols["correlation_id"]) + len(ca_cols["session_id"]) == rows
    print(f"ingest: {args.turns} turns -> {len(items)} span starts/ends -> {facts.event_rows} events + {facts.turn_rows} turns "
          f"+ {facts.call_rows} model calls = {rows} rows "
          f"(recorded in {recorded:.1f}s; python {sys.version.split()[0]}, duckdb {duckdb.__version__}, pyarrow {pa.__version__})")

    rates: dict[str, list[float]] = {k: [] for k in ("store", "writer-only", "baseline", "submit", "map", "write_batch")}
    with tempfile.TemporaryDirectory(prefix="loopscope-bench-") as tmp:
        folder = Path(tmp)
        for r in range(args.repeats):
            runs = [
                ("store", lambda r=r: run_store(items, fresh_db(folder, f"store-{r}"), True)),
                ("writer-only", lambda r=r: run_store(items, fresh_db(folder, f"writer-{r}"), False)),
                ("baseline", lambda r=r: run_baseline(ev_cols, tu_cols, ca_cols, fresh_db(folder, f"base-{r}"))),
            ]
            runs = runs[r % 3:] + runs[: r % 3]  # rotate the order: drift in load hits all alike
            for name, fn in runs:
                gc.collect()
                elapsed, n = fn()
                assert n == rows, (name, n, rows)
                rates[name].append(n / elapsed)
            # where the store's time goes, each part alone on one thread
            gc.collect()
            rates["submit"].append(rows / run_submit_only(items, fresh_db(folder, f"submit-{r}")))
            gc.collect()
            t = time.perf_counter()
            map_all(items)
            rates["map"].append(rows / (time.perf_counter() - t))
            gc.collect()
            rates["write_batch"].append(rows / run_write_only(batches, fresh_db(folder, f"wb-{r}")))

    med = {k: statistics.median(v) for k, v in rates.items()}
    labels = {
        "store": "store (processor+writer)",
        "writer-only": "store (writer.submit only)",
        "baseline": "baseline (arrow bulk insert)",
        "submit": "  part: submit (app thread)",
        "map": "  part: spans->facts (Python)",
        "write_batch": "  part: write_batch+open/close",
    }
    print(f"{'path':<31} {'median rows/s':>13} {'us/row':>7}   runs (k rows/s)")
    for k, label in labels.items():
        print(f"{label:<31} {med[k]:>13,.0f} {1e6 / med[k]:>7.2f}   {' '.join(f'{x / 1000:.0f}' for x in rates[k])}")
    parts = 1 / (1 / med["submit"] + 1 / med["map"] + 1 / med["write_batch"])
    print(f"{'  parts in series':<31} {parts:>13,.0f} {1e6 / parts:>7.2f}   ({len(batches)} writer batches)")
    ratio = med["store"] / med["baseline"]
    print()
    print(f"store / baseline       = {ratio:.2f}x")
    print(f"writer-only / baseline = {med['writer-only'] / med['baseline']:.2f}x")
    print(f"goal (store >= {GOAL}x baseline): {'MET' if ratio >= GOAL else 'NOT MET'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
