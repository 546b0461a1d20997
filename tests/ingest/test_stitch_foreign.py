"""Bare instrumented SDK loops (no agent span) sent to ``loopscope collect``: stitched into
the turn loopscope stores for the same loop in-process.

The live tests drive the real openai SDK under each peer instrumentation (installed from
PyPI in the peers stack, .stacks/peers (tests/stacks.toml), pinned in benchmarks/requirements-peers.txt)
against the fake model server, exporting real OTLP over loopback to a collector, and run
the same loop in this process under ``loopscope.instrument()``; the fixture tests replay
the spans those instrumentations sent (tests/fixtures/foreign/*-bare*.json, recorded by
``record.py --lib <lib>-bare [--no-content]``).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

import loopscope
import stacks
from fakes.model_server import STANDS_FOR
from loopscope import semconv as a
from loopscope.ingest.foreign import Assembler
from loopscope.ingest.otlp.collector import Collector
from loopscope.ingest.spans import Ctx, Scope, SpanRecord, Status
from loopscope.ingest.stitch_foreign import Stitcher
from loopscope.storage.duckdb.connection import open_store

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "foreign"
FRAMEWORKS = {"otel-genai": "opentelemetry-genai", "openllmetry": "openllmetry", "openinference": "openinference"}
CONTENT = {"on": [], "off": ["--no-content"]}


def query(db: Path | str, sql: str) -> list[tuple[Any, ...]]:
    with open_store(str(Path(db).resolve()), read_only=True) as con:
        return con.execute(sql).fetchall()


def _record_module() -> Any:
    spec = importlib.util.spec_from_file_location("foreign_record", FIXTURES / "record.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stored(db: Path | str) -> dict[str, Any]:
    """What a store holds of one loop, without what differs between two runs (ids, times)."""
    events = query(db, "SELECT type, tool_name, tool_call_id, content::VARCHAR FROM events ORDER BY session_id, idx")
    turns = query(db, "SELECT response_content, tool_calls_count, round_count, input_tokens, output_tokens, loop_end_reason, "
                      "model, provider, model_call_count, declared_tools::VARCHAR, correlation_id, session_id FROM turns")
    calls = query(db, "SELECT position, request_model, response_model, outcome, streaming, input_tokens, output_tokens, "
                      "cost_usd, turn_id, session_id, duration_ms FROM model_call_summaries ORDER BY started_at")
    rows = []
    for kind, tool, call_id, content in events:
        body = json.loads(content)
        if kind == "message":
            rows.append((kind, body["role"], body["body"]))
        else:
            rows.append((kind, tool, call_id, body["arguments"], body["result"], body["status"], body["outcome"]))
    return {
        "events": rows,
        "turns": [(*t[:9], [d["name"] for d in json.loads(t[9])]) for t in turns],
        "calls": [c[:8] for c in calls],
        # every call and event belongs to the one turn, in its session
        "joined": all(c[8] == t[10] and c[9] == t[11] for c in calls for t in turns)
        and len({t[11] for t in turns}) == len(turns),
        "durations": all(c[10] is not None and c[10] > 0 for c in calls),
    }


def expected(loop: dict[str, Any], lib: str, content: str) -> dict[str, Any]:
    """What a collector can know of ``loop`` from ``lib``'s spans: all of it with content on;
    with content off the messages without their text, no tool calls (nothing names them) and
    no declared tools (each of them leaves the tool definitions out with the content)."""
    if content == "on":
        return loop
    out = dict(loop)
    out["events"] = [(e[0], e[1], "") for e in loop["events"] if e[0] == "message"]
    out["turns"] = [("", 0, *t[2:-1], []) for t in loop["turns"]]
    return out


@pytest.fixture(scope="module")
def in_process(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same loop recorded in this process by loopscope's own openai adapter."""
    record = _record_module()
    db = tmp_path_factory.mktemp("in-process") / "in.duckdb"
    # the fake server stands for OpenAI: its calls priced as OpenAI's, as the peers' spans without a server are
    loopscope.configure(db, flush_interval=0.05, prices=STANDS_FOR)
    loopscope.instrument(anthropic=False)
    server = record.script_server()
    try:
        from openai import OpenAI

        client = OpenAI(base_url=server.openai_base_url, api_key="test-key", max_retries=0)
        assert record.hand_loop(client, lambda name, call_id, arguments: record.weather(**arguments)) == record.ANSWER
    finally:
        server.stop()
        loopscope.uninstrument()
        loopscope.shutdown()
    return stored(db)


def check(collected: dict[str, Any], expected: dict[str, Any]) -> None:
    assert collected["events"] == expected["events"]
    assert collected["turns"] == expected["turns"]
    assert collected["calls"] == expected["calls"]
    assert collected["joined"] and collected["durations"]


@pytest.mark.parametrize("content", sorted(CONTENT))
@pytest.mark.parametrize("lib", sorted(FRAMEWORKS))
def test_a_bare_loop_of_the_real_instrumentation_is_stored_as_in_process(tmp_path, in_process, lib, content):
    python = stacks.require("peers") / "bin" / "python"
    db = tmp_path / f"{lib}-{content}.duckdb"
    with Collector(str(db), http_port=0, grpc_port=None, flush_interval=0.05) as collector:
        done = subprocess.run(
            [str(python), "-W", "ignore", str(FIXTURES / "record.py"), "--lib", f"{lib}-bare", *CONTENT[content],
             "--endpoint", collector.http_endpoint],
            check=False, capture_output=True, text=True, timeout=180, cwd=ROOT,
        )
        assert done.returncode == 0, done.stderr[-2000:]
    check(stored(db), expected(in_process, lib, content))
    assert {f for (f,) in query(db, "SELECT DISTINCT framework FROM model_calls")} == {FRAMEWORKS[lib]}


@pytest.mark.parametrize("content", sorted(CONTENT))
@pytest.mark.parametrize("lib", sorted(FRAMEWORKS))
def test_recorded_bare_loops_are_stitched_into_one_turn(tmp_path, in_process, lib, content):
    suffix = "" if content == "on" else "-no-content"
    db = tmp_path / "fixture.duckdb"
    with Collector(str(db), http_port=0, grpc_port=None, flush_interval=0.05) as collector:
        request = (FIXTURES / f"{lib}-bare{suffix}.json").read_bytes()
        import urllib.request

        with urllib.request.urlopen(urllib.request.Request(
                collector.http_endpoint + "/v1/traces", data=request, headers={"Content-Type": "application/json"}), timeout=30) as answer:
            assert answer.status == 200
    check(stored(db), expected(in_process, lib, content))


def test_the_in_process_store_stitches_a_bare_loop_as_the_collector_does(tmp_path, in_process):
    """Foreign spans that end in this process go through the store's span processor: the same turn."""
    from loopscope.ingest.otlp.decode import parse_fixture
    from loopscope.ingest.processor import StoreSpanProcessor
    from loopscope.ingest.writer import SPANS
    from loopscope.storage.queries import open_sink

    db = tmp_path / "local.duckdb"
    processor = StoreSpanProcessor(open_sink(str(db), mapping=SPANS, flush_interval=0.05))
    for record in parse_fixture(json.loads((FIXTURES / "otel-genai-bare.json").read_text())):
        processor.on_end(record)
    processor.shutdown()
    check(stored(db), in_process)


# -- the stitcher alone ----------------------------------------------------------------------------

_ids = iter(range(1, 1 << 30))


def chat(*, out: list[tuple[str, str]] = (), results: list[tuple[str, str]] = (), user: str | None = "hi",
         text: str = "", reason: str = "stop", start: int, end: int, process: str = "p1", content: bool = True,
         error: str | None = None, history: list[dict[str, Any]] = ()) -> SpanRecord:
    """A lone official-GenAI chat span: ``out`` the tool calls it asks for, ``results`` the
    results its request carries (call id, result)."""
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "m",
        "gen_ai.usage.input_tokens": 10, "gen_ai.usage.output_tokens": 2, "gen_ai.response.finish_reasons": (reason,),
    }
    if content:
        inputs = list(history) + ([{"role": "user", "parts": [{"type": "text", "content": user}]}] if user else [])
        inputs += [{"role": "tool", "parts": [{"type": "tool_call_response", "id": i, "response": r}]} for i, r in results]
        parts = [{"type": "text", "content": text}] if text else []
        parts += [{"type": "tool_call", "id": i, "name": n, "arguments": {"q": i}} for i, n in out]
        attrs[a.INPUT_MESSAGES] = json.dumps(inputs)
        attrs[a.OUTPUT_MESSAGES] = json.dumps([{"role": "assistant", "parts": parts, "finish_reason": reason}])
    sid = next(_ids)
    return SpanRecord("chat m", Ctx(1000 + sid, sid), None, start * 1_000_000, end * 1_000_000, attrs,
                      status=Status(2, error) if error else Status(), resource={"service.instance.id": process},
                      instrumentation_scope=Scope("opentelemetry.instrumentation.genai.openai"))


def rows_of(spans: list[SpanRecord], stitcher: Stitcher | None = None) -> list[tuple[int, dict[str, Any]]]:
    assembler = Assembler(stitcher=stitcher or Stitcher())
    out = []
    for span in spans:
        out += [(kind, row.attributes) for kind, row in assembler.add(span)]
    return out


def turns_of(rows: list[tuple[int, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    return {r[a.TURN_ID]: r for kind, r in rows if kind == 1 and r[a.OPERATION] == a.OP_INVOKE_AGENT}


def test_interleaved_loops_are_told_apart_by_call_id():
    spans = [
        chat(out=[("a1", "search")], reason="tool_calls", user="first", start=0, end=1),
        chat(out=[("b1", "fetch"), ("b2", "fetch")], reason="tool_calls", user="second", start=1, end=2),
        chat(results=[("b1", "B1"), ("b2", "B2")], user="second", text="done b", start=3, end=4),
        chat(results=[("a1", "A1")], out=[("a2", "search")], reason="tool_calls", user="first", start=4, end=5),
        chat(results=[("a2", "A2")], user="first", text="done a", start=6, end=7),
    ]
    rows = rows_of(spans)
    turns = turns_of(rows)
    assert sorted((t[a.TURN_INPUT], t[a.TOOL_CALLS_COUNT], t[a.ROUND_COUNT], t[a.MODEL_CALL_COUNT], t[a.USAGE_INPUT])
                  for t in turns.values()) == [("first", 2, 2, 3, 30), ("second", 2, 1, 2, 20)]
    ends = [r for kind, r in rows if kind == 1 and r[a.OPERATION] == a.OP_EXECUTE_TOOL]
    assert {(r[a.TOOL_CALL_ID], r[a.TOOL_CALL_RESULT], turns[r[a.TURN_ID]][a.TURN_INPUT]) for r in ends} == {
        ("a1", "A1", "first"), ("a2", "A2", "first"), ("b1", "B1", "second"), ("b2", "B2", "second")}
    positions = [(r[a.TURN_ID], r[a.CALL_POSITION]) for kind, r in rows if r[a.OPERATION] == a.OP_CHAT]
    assert [p for t, p in positions if turns[t][a.TURN_INPUT] == "first"] == [1, 2, 3]


def test_without_content_calls_join_by_position_in_their_process_only():
    spans = [
        chat(content=False, reason="tool_calls", start=0, end=1, process="p1"),
        chat(content=False, reason="tool_calls", start=0, end=1, process="p2"),
        chat(content=False, start=2, end=3, process="p1"),
        chat(content=False, start=2, end=3, process="p2"),
    ]
    rows = rows_of(spans)
    turns = turns_of(rows)
    assert sorted((t[a.MODEL_CALL_COUNT], t[a.ROUND_COUNT], t[a.TOOL_CALLS_COUNT], t[a.LOOP_END_REASON]) for t in turns.values()) == [
        (2, 1, 0, "completed"), (2, 1, 0, "completed")]
    # the messages are kept without their text: the turn's input, each answer
    starts = [r for kind, r in rows if kind == 0 and r[a.OPERATION] == a.OP_INVOKE_AGENT]
    assert len(starts) == 2 and all(r[a.CONTENT_WITHHELD] and a.TURN_INPUT not in r for r in starts)
    answers = [r for kind, r in rows if r[a.OPERATION] == a.OP_CHAT and r.get(a.CONTENT_WITHHELD)]
    assert [r[a.CALL_POSITION] for r in answers] == [2, 2]


def test_without_content_two_loops_at_once_in_one_process_are_not_merged():
    first = chat(content=False, reason="tool_calls", start=0, end=1)
    second = chat(content=False, reason="tool_calls", start=0, end=2)
    third = chat(content=False, start=3, end=4)
    stitcher = Stitcher()
    rows = rows_of([first, second, third], stitcher)
    # two loops wait in that process: the third call cannot tell whose it is, so it is a turn of its own
    assert [t[a.MODEL_CALL_COUNT] for t in turns_of(rows).values()] == [1]
    assert stitcher.open_turns == 2
    ended = turns_of([(kind, r.attributes) for kind, r in stitcher.drain()])
    assert [t[a.LOOP_END_REASON] for t in ended.values()] == ["unfinished", "unfinished"]
    # a call that started before the waiting one ended does not continue it either
    rows = rows_of([chat(content=False, reason="tool_calls", start=0, end=5), chat(content=False, start=1, end=2)])
    assert [t[a.MODEL_CALL_COUNT] for t in turns_of(rows).values()] == [1]


def test_an_idle_turn_ends_unfinished_and_its_unanswered_calls_unserved():
    now = [0.0]
    stitcher = Stitcher(idle_seconds=30, clock=lambda: now[0])
    rows = rows_of([chat(out=[("c1", "slow")], reason="tool_calls", start=0, end=1)], stitcher)
    assert turns_of(rows) == {} and stitcher.open_turns == 1
    now[0] = 29.0
    assert stitcher.expire() == []
    now[0] = 31.0
    rows = [(kind, r.attributes) for kind, r in stitcher.expire()]
    (tool,) = [r for kind, r in rows if r[a.OPERATION] == a.OP_EXECUTE_TOOL]
    assert (tool[a.TOOL_CALL_ID], tool[a.TOOL_OUTCOME]) == ("c1", "unserved")
    (turn,) = turns_of(rows).values()
    assert turn[a.LOOP_END_REASON] == "unfinished" and stitcher.open_turns == 0
    # a result that comes after that starts a turn of its own
    rows = rows_of([chat(results=[("c1", "late")], start=40, end=41)], stitcher)
    assert [t[a.MODEL_CALL_COUNT] for t in turns_of(rows).values()] == [1]


def test_open_turns_are_bounded():
    stitcher = Stitcher(max_turns=3)
    rows = rows_of([chat(out=[(f"c{i}", "t")], reason="tool_calls", start=i, end=i + 1) for i in range(5)], stitcher)
    assert stitcher.open_turns == 3
    assert len(turns_of(rows)) == 2  # the two oldest ended, unfinished


def test_a_failed_call_ends_its_turn_in_error():
    rows = rows_of([
        chat(out=[("c1", "t")], reason="tool_calls", start=0, end=1),
        chat(results=[("c1", "r")], start=2, end=3, error="server error"),
    ])
    (turn,) = turns_of(rows).values()
    assert turn[a.LOOP_END_REASON] == "error" and turn[a.MODEL_CALL_COUNT] == 2


def test_the_same_payload_twice_gives_the_same_rows():
    spans = [chat(out=[("c1", "t")], reason="tool_calls", start=0, end=1), chat(results=[("c1", "r")], start=2, end=3)]
    first = [(k, r.context.trace_id, r.context.span_id) for s in [rows_of_spans(spans)] for k, r in s]
    second = [(k, r.context.trace_id, r.context.span_id) for s in [rows_of_spans(spans)] for k, r in s]
    assert first == second


def rows_of_spans(spans: list[SpanRecord]) -> list[tuple[int, SpanRecord]]:
    assembler = Assembler(stitcher=Stitcher())
    out = []
    for span in spans:
        out += assembler.add(span)
    return out


def test_a_turn_that_continues_a_conversation_joins_its_session():
    def said(role: str, text: str) -> dict[str, Any]:
        return {"role": role, "parts": [{"type": "text", "content": text}]}

    stitcher = Stitcher()
    first = turns_of(rows_of([chat(user="Weather in Paris?", text="Sunny.", start=0, end=1)], stitcher))
    # the next question sends the conversation so far: it continues the first turn's
    follow = chat(user="And tomorrow?", text="Rain.", history=[said("user", "Weather in Paris?"), said("assistant", "Sunny.")],
                  start=2, end=3)
    second = turns_of(rows_of([follow], stitcher))
    # another conversation that asks the same first question, answered otherwise, does not
    other = chat(user="And tomorrow?", text="Snow.", history=[said("user", "Weather in Paris?"), said("assistant", "Cloudy.")],
                 start=4, end=5)
    third = turns_of(rows_of([other], stitcher))
    (one,), (two,), (three,) = first.values(), second.values(), third.values()
    assert two[a.CONVERSATION_ID] == one[a.CONVERSATION_ID]
    assert two[a.TURN_INPUT] == "And tomorrow?"
    assert three[a.CONVERSATION_ID] != one[a.CONVERSATION_ID]


def test_an_answer_ends_the_turn_and_its_unanswered_calls_unserved():
    rows = rows_of([
        chat(out=[("c1", "t"), ("c2", "t")], reason="tool_calls", start=0, end=1),
        chat(results=[("c1", "r")], text="Done without c2.", start=2, end=3),
    ])
    ends = {r[a.TOOL_CALL_ID]: r[a.TOOL_OUTCOME] for kind, r in rows if kind == 1 and r[a.OPERATION] == a.OP_EXECUTE_TOOL}
    assert ends == {"c1": "served", "c2": "unserved"}
    (turn,) = turns_of(rows).values()
    assert turn[a.LOOP_END_REASON] == "completed" and turn[a.TOOL_CALLS_COUNT] == 2
