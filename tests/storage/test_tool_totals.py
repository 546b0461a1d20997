"""The per-tool totals behind tool_stats are kept exactly, however the rows reach the file:
batch after batch with and without tool rows, a batch written in halves after a failure,
spans sent again (the idempotent path leaves out stored rows), the conversation store's
rows, a file migrated from before the totals; rows written by another program make
tool_stats read events again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

import analytics_store as workload
import loopscope
from loopscope.ingest.writer import SPANS
from loopscope.storage.duckdb import tool_totals
from loopscope.storage.duckdb import writer as writer_module
from loopscope.storage.duckdb.conversations import DuckDBConversationStore
from loopscope.storage.duckdb.schema import SCHEMA_VERSION, migrate
from loopscope.storage.duckdb.views import SCORE_VIEWS, SORTED_DURATIONS, TOOL_DURATIONS, TOOL_TOTALS
from loopscope.storage.queries import open_sink
from loopscope.storage.rows import END, START
from recorded import connect_when_free
from tool_totals_check import assert_totals_exact


class Keep(SpanProcessor):
    """Every span's start and end, in order, to be written again by a writer of our own."""

    def __init__(self) -> None:
        self.items: list[tuple[int, Any]] = []

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.items.append((START, span))

    def on_end(self, span: Any) -> None:
        self.items.append((END, span))


def record(db: Path, writer: str | None = None) -> list[tuple[int, Any]]:
    """The analytics workload recorded into ``db`` (many small batches: some with tool rows,
    some without); returns its spans' starts and ends. ``writer="thread"``: written in this
    process (where a test's changes to the module apply)."""
    provider = TracerProvider()
    kept = Keep()
    provider.add_span_processor(kept)
    loopscope.configure(db, tracer_provider=provider, flush_interval=0.01, writer=writer)
    try:
        workload._record()
        loopscope.flush()
    finally:
        loopscope.shutdown()
    return kept.items


def test_batches_with_and_without_tool_rows(tmp_path: Path) -> None:
    db = tmp_path / "store.duckdb"
    record(db)
    assert_totals_exact(db)


def test_a_batch_written_in_halves_after_failures(tmp_path: Path, monkeypatch: Any) -> None:
    items = record(tmp_path / "first.duckdb")
    original, failed = writer_module.write_batch, []

    def refusing_big_batches(con: Any, facts: Any, **kwargs: Any) -> Any:
        if facts.event_rows > 2:  # every bigger piece fails: the writer halves it down to pieces of two
            failed.append(facts.event_rows)
            raise duckdb.ConstraintException("refused for the test")
        return original(con, facts, **kwargs)

    monkeypatch.setattr(writer_module, "write_batch", refusing_big_batches)
    db = tmp_path / "halves.duckdb"
    writer = open_sink(str(db), mapping=SPANS, flush_interval=60)
    try:
        for kind, span in items:
            writer.submit(kind, span)
        assert writer.flush()
    finally:
        writer.close()
    assert failed and writer.stats().dropped == 0
    assert_totals_exact(db)


def test_folded_back_to_one_row_per_key_now_and_then(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(tool_totals, "COMPACT_AFTER", 3)
    monkeypatch.setattr(tool_totals, "_appended", 0)
    db = tmp_path / "store.duckdb"
    record(db)
    assert_totals_exact(db)
    con = connect_when_free(db)
    try:
        rows, keys = con.execute(f"SELECT count(*), count(DISTINCT (tool, has_tool, agent, has_agent, bucket)) FROM {TOOL_TOTALS}").fetchone()
    finally:
        con.close()
    assert rows < 3 + keys  # folded: at most the rows appended since the last fold are extra


def test_durations_are_folded_into_the_sorted_table_now_and_then(tmp_path: Path, monkeypatch: Any) -> None:
    """Each process checks every SORT_CHECK_AFTER durations it appended whether the unsorted
    ones reach 1/SORT_SHARE of the sorted, and folds them in (in key order) if so: tool_stats
    reads the same, and the unsorted table it scans whole stays a fraction of the sorted."""
    monkeypatch.setattr(tool_totals, "SORT_CHECK_AFTER", 2)
    monkeypatch.setattr(tool_totals, "_SORT_SQL", tool_totals.sort_sql(4))
    monkeypatch.setattr(tool_totals, "_durations_appended", 0)
    db = tmp_path / "store.duckdb"
    record(db, writer="thread")
    assert_totals_exact(db)
    con = connect_when_free(db)
    try:
        unsorted = con.execute(f"SELECT count(*) FROM {TOOL_DURATIONS}").fetchone()[0]
        folded = con.execute(f"SELECT count(*) FROM {SORTED_DURATIONS}").fetchone()[0]
    finally:
        con.close()
    assert folded > 0 and unsorted * 4 < folded + 4 * 16  # at most a check's worth past the share (batches of a few)


def test_a_store_of_schema_12_read_as_it_is_gives_the_same_tool_stats(tmp_path: Path) -> None:
    """A file of the loopscope before m013_sorted_durations, read without migrating it
    (Store.sql gives it this loopscope's views): its durations are all in the old table."""
    db = tmp_path / "store.duckdb"
    record(db)
    store = loopscope.Store(str(db))
    now = store.sql("SELECT * FROM tool_stats")
    con = duckdb.connect(str(db))
    try:  # as the loopscope before m013 left it
        con.execute(f"INSERT INTO {TOOL_DURATIONS} SELECT tool, has_tool, bucket, duration_ms FROM {SORTED_DURATIONS}")
        con.execute(f"DROP TABLE {SORTED_DURATIONS}")
        con.execute("DELETE FROM loopscope_migrations WHERE name = 'm013_sorted_durations'")
        con.execute("UPDATE loopscope_meta SET value = '12' WHERE key = 'schema_version'")
        con.execute("DROP VIEW tool_stats")  # its definition read the dropped table
    finally:
        con.close()
    assert store.sql("SELECT * FROM tool_stats") == now
    assert store.sql(f"SELECT count(*) FROM {TOOL_DURATIONS}")[1][0][0] > 0


def test_spans_sent_again_are_counted_once(tmp_path: Path) -> None:
    items = record(tmp_path / "first.duckdb")
    db = tmp_path / "resent.duckdb"
    writer = open_sink(str(db), mapping=SPANS, skip_stored=True, flush_interval=60)
    try:
        half = len(items) // 2
        for kind, span in items[:half]:
            writer.submit(kind, span)
        assert writer.flush()
        for kind, span in items:  # the first half again, with the rest
            writer.submit(kind, span)
        assert writer.flush()
    finally:
        writer.close()
    assert writer.already_stored > 0
    assert_totals_exact(db)
    first = connect_when_free(tmp_path / "first.duckdb")
    again = connect_when_free(db)
    try:
        query = "SELECT tool, calls, finished, served, failed FROM tool_stats ORDER BY tool"
        assert again.execute(query).fetchall() == first.execute(query).fetchall()
    finally:
        first.close()
        again.close()


def test_a_file_from_before_the_totals_is_filled_when_migrated(tmp_path: Path) -> None:
    db = tmp_path / "store.duckdb"
    record(db)
    con = duckdb.connect(str(db))
    try:  # the file as the loopscope before m010_tool_totals left it
        con.execute(f"DROP TABLE {TOOL_TOTALS}")
        con.execute(f"DROP TABLE {TOOL_DURATIONS}")
        con.execute(f"DROP TABLE {SORTED_DURATIONS}")
        for view in SCORE_VIEWS:  # m018's scores, which that file had not either
            con.execute(f"DROP VIEW {view}")
        con.execute("DROP TABLE scores")
        con.execute("DELETE FROM loopscope_migrations WHERE name >= 'm010'")  # m010 and every later one
        con.execute("UPDATE loopscope_meta SET value = '9' WHERE key = 'schema_version'")
        assert migrate(con) == 9 and SCHEMA_VERSION >= 13
    finally:
        con.close()
    assert_totals_exact(db)


def test_rows_inserted_by_another_program_make_tool_stats_read_events(tmp_path: Path) -> None:
    db = tmp_path / "store.duckdb"
    record(db)
    before = dict(connect_when_free(db).execute("SELECT tool, calls FROM tool_stats").fetchall())
    con = duckdb.connect(str(db))
    try:  # a plain INSERT keeps neither the totals nor the session's counters
        con.execute("""INSERT INTO events (id, session_id, idx, type, created_at, status, content, tool_name)
            VALUES ('x-s', 'elsewhere', 1, 'tool_call_start', now(), 'delivered', '{"type":"tool_call","tool_name":"refund"}', 'refund')""")
        after = dict(con.execute("SELECT tool, calls FROM tool_stats").fetchall())
    finally:
        con.close()
    assert after == before | {"refund": before["refund"] + 1}


def test_the_conversation_store_keeps_them(tmp_path: Path) -> None:
    db = tmp_path / "store.duckdb"
    record(db)
    store = DuckDBConversationStore(str(db))
    store.save_sync("conv", [
        {"role": "user", "content": "book a table"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "book", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "booked"},
    ])
    con = connect_when_free(db)
    try:
        assert con.execute("SELECT count(*) FROM events WHERE session_id = 'conv' AND type LIKE 'tool_call_%'").fetchone()[0] > 0
    finally:
        con.close()
    assert_totals_exact(db)
