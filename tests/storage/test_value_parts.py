"""Large values kept in parts (issue 30): a tool result of a few MiB is stored as 4 KiB
parts in ``loopscope_values`` (a checkpoint then rewrites row groups of parts, not of whole
values: the writer's memory stays bounded, measured by ``benchmarks/bench_big_values.py``),
and every read gives it back whole: the timeline (``Store`` and ``loopscope timeline``), the
dashboard's API, ``Store.sql`` and ``loopscope sql``, the store's own views. A store made
by the previous schema migrates, its values in ``events.content`` read as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pytest

import loopscope
from fakes.model_server import FakeModelServer, Reply, ToolCall
from loopscope.cli import main
from loopscope.content.policy import ContentPolicy
from loopscope.dashboards.web import api
from loopscope.storage.duckdb import values
from recorded import connect_when_free

TOOLS = [{"type": "function", "function": {"name": "fetch_page", "parameters": {"type": "object", "properties": {}}}}]


def _value(n: int) -> str:
    """About ``n`` characters that JSON escapes in several ways (quotes, backslashes,
    newlines, a control character, non-ASCII), so that parts end inside escapes."""
    line = 'row {:07d}: "quoted" \\ back é ✓ 🙂 \x01 tab\t\n'
    count = n // len(line.format(0)) + 1
    return "".join(line.format(i) for i in range(count))


def _loop(server: FakeModelServer, session: str, value: str) -> None:
    """A real openai tool loop: the model asks for ``fetch_page``, the decorated tool
    returns ``value``, the result goes back in the next request."""

    @loopscope.tool
    def fetch_page() -> str:
        return value

    server.queue(Reply(text="Fetching.", tool_calls=[ToolCall("fetch_page", {}, id=f"call_{session}")]), Reply(text="Read it."))
    client = server.openai_client(api_key="sk-test")
    messages: list[Any] = [{"role": "user", "content": "Fetch the page."}]
    with loopscope.turn(session_id=session, input="Fetch the page."):
        message = client.chat.completions.create(model="gpt-4o", messages=messages, tools=TOOLS).choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or ():
            messages.append({"role": "tool", "tool_call_id": call.id, "content": fetch_page()})
        client.chat.completions.create(model="gpt-4o", messages=messages, tools=TOOLS)


def _configure(db: Path) -> None:
    # no cap: the whole value is stored (the default cap keeps 1 MiB of it)
    loopscope.configure(db, flush_interval=0.05, capture_content=True, content_policy=ContentPolicy(store_max_chars=0))
    loopscope.instrument()


def _stop() -> None:
    loopscope.uninstrument()
    loopscope.shutdown()


def _cli_json(capsys: pytest.CaptureFixture[str], *argv: Any) -> Any:
    capsys.readouterr()
    assert main([str(a) for a in argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_value_of_a_few_mib_is_stored_in_parts_and_read_back_whole_everywhere(
    tmp_path: Path, model_server: FakeModelServer, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "parts.duckdb"
    value = _value(3 << 20)
    _configure(db)
    try:
        _loop(model_server, "big", value)
        assert loopscope.flush(timeout=60)
    finally:
        _stop()

    # in the file: the row's content in parts, none of them over PART_BYTES, the column NULL
    con = connect_when_free(db)
    try:
        (end_id,) = con.execute("SELECT id FROM events WHERE type = 'tool_call_end'").fetchone() or (None,)
        assert con.execute("SELECT content FROM events WHERE id = ?", [end_id]).fetchone() == (None,)
        parts = con.execute("SELECT count(*), max(strlen(text)) FROM loopscope_values WHERE id = ?", [end_id]).fetchone()
        assert parts is not None and parts[0] > 100 and parts[1] <= values.PART_BYTES
        small = con.execute("SELECT count(*) FROM events WHERE content IS NOT NULL").fetchone()
        assert small is not None and small[0] >= 4  # the messages and the call's start row stay whole
    finally:
        con.close()

    store = loopscope.Store(str(db))
    timeline = store.get_timeline("big")
    ends = [e for e in timeline if e.type == "tool_call_end"]
    assert len(ends) == 1 and ends[0].content.result == value  # type: ignore[union-attr]
    assert [e.type for e in timeline if e.type != "message"] == ["tool_call_start", "tool_call_end"]
    event = store.get_event(end_id)
    assert event is not None and event.content.result == value  # type: ignore[union-attr]
    assert [e.content.result for e in store.list_recent_events(3) if e.type == "tool_call_end"] == [value]  # type: ignore[union-attr]

    # loopscope timeline --json
    printed = _cli_json(capsys, "timeline", "big", "--db", db, "--json")
    assert [e["content"]["result"] for e in printed if e["type"] == "tool_call_end"] == [value]

    # the dashboard's API: the page cuts long contents (and says so), the event is whole
    page = api.timeline(store, "big")
    (shown,) = [e for e in page["events"] if e["type"] == "tool_call_end"]
    assert shown["truncated"] and shown["content"]["result"].endswith(f"[{len(value):,} characters in all]")
    after = api.timeline(store, "big", after_index=0)
    assert [e["id"] for e in after["events"]] == [e["id"] for e in page["events"]]
    whole = api.event(store, end_id)
    assert whole is not None and whole["content"]["result"] == value and not whole["truncated"]

    # SQL: Store.sql and loopscope sql read `events` whole, the store's views too
    _, rows = store.sql("SELECT content->>'$.result' FROM events WHERE type = 'tool_call_end'")
    assert rows == [(value,)]
    _, rows = store.sql("SELECT count(*) FROM events WHERE content IS NULL")
    assert rows == [(0,)]
    _, rows = store.sql("SELECT tool, status FROM tool_calls")
    assert rows == [("fetch_page", "succeeded")] or rows[0][0] == "fetch_page"
    printed = _cli_json(capsys, "sql", "--db", db, "--json", "SELECT content->>'$.result' AS result FROM events WHERE type = 'tool_call_end'")
    assert printed == [{"result": value}]

    # loopscope export --parquet: the events' Parquet holds the value whole
    out = tmp_path / "export"
    capsys.readouterr()
    assert main(["export", "--db", str(db), "--parquet", str(out), "--tables", "events"]) == 0
    parquet = duckdb.connect()
    try:
        exported = parquet.execute(
            "SELECT content::JSON->>'$.result' FROM read_parquet(?, hive_partitioning = true) WHERE type = 'tool_call_end'",
            [str(out / "events" / "*" / "*.parquet")],
        ).fetchall()
    finally:
        parquet.close()
    assert exported == [(value,)]


def test_parts_are_at_most_4_kib_and_read_back_whole(tmp_path: Path, model_server: FakeModelServer) -> None:
    """Parts of more than 4 KiB made DuckDB's checkpoint hold several times a batch
    (values.PART_BYTES, benchmarks/README.md): every part of a 1 MiB value is 4,096 bytes
    at most, and the value reads back whole."""
    db = tmp_path / "small-parts.duckdb"
    value = _value(1 << 20)
    _configure(db)
    try:
        _loop(model_server, "big", value)
        assert loopscope.flush(timeout=60)
    finally:
        _stop()
    con = connect_when_free(db)
    try:
        found = con.execute("SELECT count(*), max(strlen(text)), count(DISTINCT id) FROM loopscope_values").fetchone()
    finally:
        con.close()
    assert found is not None
    count, longest, ids = found
    assert ids == 1 and longest <= 4096 and count >= len(value.encode()) // 4096
    (end,) = [e for e in loopscope.Store(str(db)).get_timeline("big") if e.type == "tool_call_end"]
    assert end.content.result == value  # type: ignore[union-attr]


def test_a_normal_store_has_no_parts_and_sql_reads_the_table(tmp_path: Path, model_server: FakeModelServer) -> None:
    """Values under the threshold stay in ``events.content``: nothing in parts, and
    ``Store.sql``'s ``events`` is the table itself (a DELETE says the store is read-only)."""
    db = tmp_path / "normal.duckdb"
    _configure(db)
    try:
        _loop(model_server, "small", "x" * (values.CUT_OVER - 200))
        assert loopscope.flush(timeout=60)
    finally:
        _stop()
    store = loopscope.Store(str(db))
    _, rows = store.sql("SELECT count(*) FROM loopscope_values")
    assert rows == [(0,)]
    with pytest.raises(duckdb.Error, match="read-only"):
        store.sql("DELETE FROM events")


def _to_previous_schema(db: Path) -> None:
    """Make ``db`` what the loopscope before ``m017_value_parts`` wrote: every value whole in
    ``events.content``, no ``loopscope_values``, 16 migrations."""
    con = duckdb.connect(str(db))
    try:
        con.execute(
            "UPDATE events SET content = v.whole FROM (SELECT id, string_agg(text, '' ORDER BY part) AS whole "
            "FROM loopscope_values GROUP BY id) v WHERE events.id = v.id"
        )
        con.execute("DROP TABLE loopscope_values")
        con.execute("DELETE FROM loopscope_migrations WHERE name = 'm017_value_parts'")
        con.execute("UPDATE loopscope_meta SET value = '16' WHERE key = 'schema_version'")
    finally:
        con.close()


def test_a_store_of_the_previous_schema_migrates_and_reads_old_and_new_values_whole(
    tmp_path: Path, model_server: FakeModelServer
) -> None:
    db = tmp_path / "old.duckdb"
    old, new = _value(1 << 20), _value(2 << 20)[::-1]
    _configure(db)
    try:
        _loop(model_server, "old", old)
        assert loopscope.flush(timeout=60)
    finally:
        _stop()
    _to_previous_schema(db)

    store = loopscope.Store(str(db))  # read as it is, before any writer migrates it
    assert [e.content.result for e in store.get_timeline("old") if e.type == "tool_call_end"] == [old]  # type: ignore[union-attr]
    _, rows = store.sql("SELECT content->>'$.result' FROM events WHERE type = 'tool_call_end'")
    assert rows == [(old,)]

    _configure(db)  # the next recording migrates the file
    try:
        _loop(model_server, "new", new)
        assert loopscope.flush(timeout=60)
    finally:
        _stop()
    con = connect_when_free(db)
    try:
        assert con.execute("SELECT count(*) FROM loopscope_migrations WHERE name = 'm017_value_parts'").fetchone() == (1,)
        # the old value stays where it was; the new one is in parts
        lengths = con.execute(
            "SELECT session_id, length(content) IS NOT NULL FROM events WHERE type = 'tool_call_end' ORDER BY session_id"
        ).fetchall()
        assert lengths == [("new", False), ("old", True)]
    finally:
        con.close()
    for session, value in (("old", old), ("new", new)):
        assert [e.content.result for e in store.get_timeline(session) if e.type == "tool_call_end"] == [value]  # type: ignore[union-attr]
    _, rows = store.sql("SELECT session_id, content->>'$.result' FROM events WHERE type = 'tool_call_end' ORDER BY session_id")
    assert rows == [("new", new), ("old", old)]


# -- the cut itself: parts put together are the content the store held whole before -------------

AT_US = 1_700_000_000_123_456


def _large_facts() -> list[Any]:
    """Facts whose rows' contents pass the threshold in every way a row is made: a JSON
    result, a text result full of escapes with multi-byte characters where parts end, long
    arguments, a long message body, and one fact under the threshold beside them."""
    from loopscope.storage import rows

    edge = "é" * (values.PART_BYTES // 2 - 7) + "🙂✓\x01\"\\"  # multi-byte characters across the first cuts
    texts = [
        json.dumps({"rows": [{"n": i, "text": f"line {i} é"} for i in range(6000)]}),
        (edge + 'plain "text" \\ with\tescapes\n') * 40,
        "x" * (values.CUT_OVER + 1),
    ]
    facts = []
    for i, text in enumerate(texts):
        common = {"trace_id": bytes([i + 1]) * 16, "span_id": bytes([i + 2]) * 8, "created_us": AT_US + i, "session_id": "s",
                  "correlation_id": "t", "source_channel_id": "agent", "source_provider": "p", "source_framework": None,
                  "blocked": False}
        facts += [
            rows.EventFact(code=rows.TOOL_START, **common, tool_name="f", tool_id=f"c{i}", arguments=text),
            rows.EventFact(code=rows.TOOL_END, **common, tool_name="f", tool_id=f"c{i}", arguments="{}", result=text,
                           tool_status="completed", outcome="served", duration_ms=1.5),
            rows.EventFact(code=rows.ROUND_MESSAGE, **common, body=text),
        ]
    small = {"trace_id": bytes([9]) * 16, "span_id": bytes([9]) * 8, "created_us": AT_US + 9, "session_id": "s",
             "correlation_id": "t", "source_channel_id": None, "source_provider": None, "source_framework": None, "blocked": False}
    facts.append(rows.EventFact(code=rows.INPUT_MESSAGE, **small, body="short"))
    return facts


def _stored_whole(path: Path) -> list[tuple[Any, ...]]:
    """Every ``events`` row of the file, each content put together from its parts."""
    con = connect_when_free(path)
    try:
        return con.execute(
            "SELECT e.* REPLACE (coalesce(e.content, v.whole::JSON) AS content) FROM events e LEFT JOIN ("
            "SELECT id, string_agg(text, '' ORDER BY part) AS whole FROM loopscope_values GROUP BY id) v USING (id) "
            "ORDER BY idx"
        ).fetchall()
    finally:
        con.close()


def _write(path: Path) -> None:
    from loopscope.storage import rows
    from loopscope.storage.duckdb.connection import open_store
    from loopscope.storage.duckdb.schema import migrate
    from loopscope.storage.duckdb.writer import write_batch

    facts = rows.Facts()
    facts.append(_large_facts(), [])
    with open_store(str(path), read_only=False) as con:
        migrate(con)
        write_batch(con, facts)


def test_parts_put_together_are_the_rows_either_way_of_making_them_stored_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rows made in Arrow and the rows DuckDB's SQL makes (read back as Arrow) are cut
    alike, and put together they are what the store held whole before (no cut)."""
    from loopscope.storage.duckdb import arrow_rows

    _write(tmp_path / "arrow.duckdb")
    with monkeypatch.context() as patch:
        patch.setattr(arrow_rows, "event_rows", lambda table, **_: None)
        _write(tmp_path / "sql.duckdb")
    with monkeypatch.context() as patch:
        patch.setattr(values, "may_cut", lambda events: False)
        patch.setattr(arrow_rows, "event_rows", lambda table, **_: None)
        _write(tmp_path / "whole.duckdb")

    whole = _stored_whole(tmp_path / "whole.duckdb")
    assert len(whole) == 10 and all(row[10] is not None for row in whole)
    assert _stored_whole(tmp_path / "arrow.duckdb") == whole
    assert _stored_whole(tmp_path / "sql.duckdb") == whole
    for name in ("arrow", "sql"):
        con = connect_when_free(tmp_path / f"{name}.duckdb")
        try:
            cut = con.execute("SELECT count(*) FROM events WHERE content IS NULL").fetchone()
            longest = con.execute("SELECT max(strlen(text)) FROM loopscope_values").fetchone()
        finally:
            con.close()
        assert cut == (9,) and longest is not None and longest[0] <= values.PART_BYTES, name


@pytest.mark.parametrize("text_type", ["string", "large_string"])
def test_a_cut_over_a_table_in_several_slices_reads_each_value_whole_from_its_parts(text_type: str) -> None:
    """The parts are read in place from the content's Arrow buffers (no copy of a batch's
    values): a table of several chunks, each a slice of a larger array (offsets that do not
    start at 0), long values between short and NULL ones, gives each long value's parts in
    order, 4 KiB at most, each cut at a character's start."""
    import pyarrow as pa

    kind = getattr(pa, text_type)()
    long = [_value((70 << 10) + i * 5000) for i in range(4)]
    contents = [long[0], "short", None, long[1], long[2], "{}", long[3]]
    ids = [f"e{i}" for i in range(len(contents))]
    whole = pa.array(["padding", *contents, "tail"], kind)
    chunks = [whole.slice(1, 3), whole.slice(4, 4)]  # slices of one array: their offsets start past 0
    made = pa.table({"id": pa.chunked_array([pa.array(ids[:3]), pa.array(ids[3:])]),
                     "content": pa.chunked_array(chunks, kind)})

    kept, parts = values.cut(made)

    assert parts is not None
    assert kept.column("content").to_pylist() == [None, "short", None, None, None, "{}", None]
    assert kept.column("id").to_pylist() == ids
    by_id: dict[str, list[tuple[int, str]]] = {}
    for event_id, number, text in zip(*(parts.column(n).to_pylist() for n in ("id", "part", "text")), strict=True):
        assert len(text.encode()) <= values.PART_BYTES
        by_id.setdefault(event_id, []).append((number, text))
    assert sorted(by_id) == ["e0", "e3", "e4", "e6"]
    for event_id, value in zip(["e0", "e3", "e4", "e6"], long, strict=True):
        numbered = by_id[event_id]
        assert [n for n, _ in numbered] == list(range(len(numbered)))
        assert "".join(text for _, text in numbered) == value
