"""A turn's model-call count where users read turns (issue 17, item 5): ``round_count`` keeps
RoomKit's meaning (the model calls whose tool calls ran), ``model_call_count`` counts every
call. ``Store.list_turns``, ``AsyncStore.list_turns`` and ``loopscope turns`` (table and
``--json``) say both, from a real openai SDK loop against the fake model server; a turn
whose writer did not count its calls (a foreign turn) is counted from its call rows; an
older store file, read as it is, still lists its turns."""

from __future__ import annotations

import asyncio
import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import SpanKind

import loopscope
from fakes.model_server import Reply, ToolCall
from loopscope import semconv as a
from loopscope.cli import main
from loopscope.dashboards.tables import turns_table
from loopscope.ingest.spans import OWN_SCOPE

MODEL = "gpt-4o-mini"
WEATHER = {"type": "function", "function": {"name": "weather", "description": "Weather for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
STORES = Path(__file__).resolve().parents[1] / "fixtures" / "stores"


def agent_loop(client: Any, question: str) -> str:
    """A user's tool loop on the openai SDK: call the model until it answers without a tool."""
    messages: list[Any] = [{"role": "user", "content": question}]
    while True:
        reply = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER]).choices[0].message
        if not reply.tool_calls:
            return reply.content or ""
        messages.append({"role": "assistant", "content": reply.content, "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in reply.tool_calls]})
        messages += [{"role": "tool", "tool_call_id": c.id, "content": "21 C, sunny"} for c in reply.tool_calls]


@pytest.fixture
def two_turns(instrumented: Any, server: Any) -> Any:
    """One turn of one call (no tool), then a turn of two calls (one tool round)."""
    client = server.openai_client()
    server.queue(Reply(text="Hello!"))
    with loopscope.turn(session_id="counts"):
        assert agent_loop(client, "Hi?") == "Hello!"
    server.queue(Reply(text="", tool_calls=[ToolCall("weather", {"city": "Lisbon"}, id="call_w1")]),
                 Reply(text="21 C and sunny in Lisbon."))
    with loopscope.turn(session_id="counts"):
        assert agent_loop(client, "Weather in Lisbon?") == "21 C and sunny in Lisbon."
    loopscope.flush()
    return instrumented


def run(capsys: pytest.CaptureFixture[str], *argv: Any) -> str:
    assert main([str(x) for x in argv]) == 0
    return capsys.readouterr().out


def cells(table: str) -> list[dict[str, str]]:
    """A printed table's rows by header, cut where the rule line's dashes say (cells may be empty)."""
    header, rule, *lines = table.splitlines()
    spans, start = [], 0
    for dashes in rule.split("  "):
        spans.append((start, start + len(dashes)))
        start += len(dashes) + 2
    names = [header[lo:hi].strip() for lo, hi in spans]
    return [{name: line[lo:hi].strip() for name, (lo, hi) in zip(names, spans)} for line in lines]


def test_list_turns_counts_every_model_call_beside_the_tool_rounds(two_turns):
    turns = two_turns.store.list_turns("counts")
    assert [(t.round_count, t.model_call_count) for t in turns] == [(0, 1), (1, 2)]
    newest = asyncio.run(loopscope.AsyncStore(str(two_turns.db)).list_turns("counts", newest_first=True, limit=1))
    assert [(t.round_count, t.model_call_count) for t in newest] == [(1, 2)]
    # the same figures the views give
    _, rows = two_turns.store.sql("SELECT rounds, model_calls FROM turn_summaries ORDER BY ended_at")
    assert rows == [(0, 1), (1, 2)]


def test_loopscope_turns_shows_model_calls_beside_tool_rounds(two_turns, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    rows = cells(run(capsys, "turns", "counts", "--db", two_turns.db))
    assert [(r["MODEL CALLS"], r["TOOL ROUNDS"]) for r in rows] == [("1", "0"), ("2", "1")]
    data = json.loads(run(capsys, "turns", "counts", "--db", two_turns.db, "--json"))
    assert [(t["round_count"], t["model_call_count"]) for t in data] == [(0, 1), (1, 2)]


def test_a_narrow_terminal_keeps_the_count_headers(two_turns):
    """The headers docs/cli.md names, at any width (issue 29): the text column gives up width."""
    turns = two_turns.store.list_turns("counts")
    wide, narrow = turns_table(turns, width=200), turns_table(turns, width=80)
    for table in (wide, narrow):
        assert [(r["MODEL CALLS"], r["TOOL ROUNDS"]) for r in cells(table)] == [("1", "0"), ("2", "1")]
    assert narrow.splitlines()[0].split() == wide.splitlines()[0].split()
    assert len(narrow.splitlines()[1]) < len(wide.splitlines()[1])  # the rule line: the table's width


def test_a_turn_without_its_own_count_is_counted_from_its_call_rows(tmp_path):
    """A foreign turn (collected spans without loopscope.turn.model_call_count) has as many
    model calls as its chat spans left rows; one that says its count keeps it."""
    db = tmp_path / "store.duckdb"
    provider = TracerProvider()
    loopscope.configure(db, tracer_provider=provider, flush_interval=0.05)
    try:
        tracer = provider.get_tracer(OWN_SCOPE)
        for turn_id, count, calls in (("counted", None, 3), ("said", 5, 2)):
            where = {a.CONVERSATION_ID: "foreign", a.TURN_ID: turn_id}
            agent = {a.OPERATION: a.OP_INVOKE_AGENT, **where}
            if count is not None:
                agent[a.MODEL_CALL_COUNT] = count
            with tracer.start_as_current_span("invoke_agent", attributes=agent):
                for _ in range(calls):
                    with tracer.start_as_current_span(f"chat {MODEL}", kind=SpanKind.CLIENT, attributes={
                            a.OPERATION: a.OP_CHAT, a.REQUEST_MODEL: MODEL, a.PROVIDER: "openai", **where}):
                        pass
        loopscope.flush()
    finally:
        loopscope.shutdown()
    turns = loopscope.Store(str(db)).list_turns("foreign")
    assert {t.correlation_id: t.model_call_count for t in turns} == {"counted": 3, "said": 5}


@pytest.mark.parametrize("version", [7, 6, 3])
def test_an_older_store_read_as_it_is_still_lists_its_turns(version, tmp_path, capsys, monkeypatch):
    path = tmp_path / f"schema{version}.duckdb"
    with gzip.open(STORES / f"schema{version}.duckdb.gz", "rb") as src, path.open("wb") as out:
        shutil.copyfileobj(src, out)
    turns = loopscope.Store(str(path)).list_turns(limit=None)
    assert len(turns) == 5 and all(t.model_call_count == 0 for t in turns)  # no calls were counted then
    assert any(t.round_count > 0 for t in turns)
    data = json.loads(run(capsys, "turns", "--db", path, "--json", "--limit", "0"))
    assert sorted(t["correlation_id"] for t in data) == sorted(t.correlation_id for t in turns)
    assert all(t["model_call_count"] == 0 for t in data)
    monkeypatch.setenv("COLUMNS", "200")
    rows = cells(run(capsys, "turns", "--db", path, "--limit", "0"))
    assert sorted(int(r["TOOL ROUNDS"]) for r in rows) == sorted(t.round_count for t in turns)
    assert {r["MODEL CALLS"] for r in rows} == {"0"}
