"""Other instrumentations' GenAI spans -> tool calls and turns.

The fixtures in ``tests/fixtures/foreign/`` are OTLP/JSON recorded from the real packages
by ``tests/fixtures/foreign/record.py`` (one openai tool loop against the fake model
server); the live tests record them again, over OTLP to a running collector, when the
peers' venvs exist.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import stacks
from fakes.model_server import STANDS_FOR
from loopscope import pricing
from loopscope import semconv as a
from loopscope.ingest.foreign import AGENT, CHAT, CONTAINER, TOOL, Assembler, classify, normalize
from loopscope.ingest.otlp.collector import Collector
from loopscope.ingest.otlp.decode import parse_fixture
from loopscope.ingest.spans import Ctx, Scope, SpanEvent, SpanRecord, Status
from loopscope.storage.duckdb.connection import open_store

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "foreign"


@pytest.fixture(autouse=True)
def _fake_server_stands_for_its_providers():
    """The fixtures were recorded against the fake model server (127.0.0.1), which stands for
    OpenAI here: priced as OpenAI, as the rows below expect (an unknown server is unpriced)."""
    pricing.set_overrides(STANDS_FOR)
    yield
    pricing.set_overrides(None)
FRAMEWORKS = {
    "otel-genai": "opentelemetry-genai",
    "openllmetry": "openllmetry",
    "openinference": "openinference",
    "pydantic-ai": "pydantic-ai",
    "pydantic-ai-v2": "pydantic-ai",
}
# the stack (tests/stacks.toml) whose venv has each instrumentation
PEERS = {
    "otel-genai": "peers",
    "openllmetry": "peers",
    "openinference": "peers",
    "pydantic-ai": "peers-pydantic-ai",
    "pydantic-ai-v2": "peers-pydantic-ai",
}
PROMPT = "What's the weather in Paris?"
ANSWER = "It is 21 °C and dry in Paris."


def query(db: str, sql: str) -> list[tuple[Any, ...]]:
    with open_store(str(Path(db).resolve()), read_only=True) as con:
        return con.execute(sql).fetchall()


def check_weather_loop(db: str, framework: str) -> None:
    """The one tool loop the fixtures hold, as loopscope rows."""
    events = query(db, "SELECT session_id, idx, type, correlation_id, source_channel_id, source_framework, content::VARCHAR "
                       "FROM events ORDER BY session_id, idx")
    assert [(e[1], e[2]) for e in events] == [(1, "message"), (2, "tool_call_start"), (3, "tool_call_end"), (4, "message")]
    assert len({e[0] for e in events}) == 1  # one session
    (turn,) = query(db, "SELECT correlation_id, session_id, channel_id, response_content, tool_calls_count, round_count, "
                        "input_tokens, output_tokens, loop_end_reason, declared_tools::VARCHAR, model, provider, latency_ms FROM turns")
    assert all(e[3] == turn[0] for e in events), "every event belongs to the turn"
    assert all(e[4] == "weather-agent" and e[5] == framework for e in events)
    assert turn[1] == events[0][0]
    contents = [json.loads(e[6]) for e in events]
    assert contents[0] == {"type": "text", "body": PROMPT, "role": "user"}
    start, end = contents[1], contents[2]
    assert (start["tool_name"], start["tool_id"], start["arguments"], start["status"]) == ("get_weather", "call_weather_1", {"city": "Paris"}, "pending")
    assert (end["status"], end["outcome"], end["result"]) == ("completed", "served", {"city": "Paris", "temperature_c": 21, "sky": "dry"})
    assert end["duration_ms"] >= 0
    assert contents[3] == {"type": "text", "body": ANSWER, "role": "assistant"}
    assert turn[2:9] == ("weather-agent", ANSWER, 1, 1, 155, 23, "completed")
    assert [t["name"] for t in json.loads(turn[9])] == ["get_weather"]
    assert turn[10:12] == ("gpt-4o-mini", "openai")
    assert turn[12] > 0
    # each of the two model calls a row of the turn, priced
    calls = query(db, "SELECT turn_id, session_id, position, provider, framework, agent, request_model, "
                      "response_model, outcome, input_tokens, output_tokens, price_source, cost_usd, duration_ms "
                      "FROM model_call_summaries ORDER BY started_at")
    assert [c[:12] for c in calls] == [
        (turn[0], turn[1], 1, "openai", framework, "weather-agent", "gpt-4o-mini", "gpt-4o-mini", "completed", 60, 12, "genai-prices"),
        (turn[0], turn[1], 2, "openai", framework, "weather-agent", "gpt-4o-mini", "gpt-4o-mini", "completed", 95, 11, "genai-prices"),
    ]
    assert all(c[12] > 0 and c[13] > 0 for c in calls)
    (cost,) = query(db, "SELECT cost_usd FROM turn_summaries")
    assert cost == (pytest.approx(calls[0][12] + calls[1][12]),)


def post_json(endpoint: str, body: bytes) -> int:
    request = urllib.request.Request(endpoint + "/v1/traces", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status


@pytest.mark.parametrize("lib", sorted(FRAMEWORKS))
def test_recorded_spans_map_to_tool_calls_and_turns(tmp_path, lib):
    db = str(tmp_path / f"{lib}.duckdb")
    with Collector(db, http_port=0, grpc_port=None, flush_interval=0.05) as collector:
        assert post_json(collector.http_endpoint, (FIXTURES / f"{lib}.json").read_bytes()) == 200
        assert collector.ingest.assembler.held == 0  # the agent run's end released its spans
    check_weather_loop(db, FRAMEWORKS[lib])
    # and every span is kept raw, with how it was understood
    raw = query(db, "SELECT role, framework, count(*) FROM spans GROUP BY ALL ORDER BY role")
    assert raw == [(AGENT, FRAMEWORKS[lib], 1), (CHAT, FRAMEWORKS[lib], 2), (TOOL, FRAMEWORKS[lib], 1)]


@pytest.mark.parametrize("lib", sorted(FRAMEWORKS))
def test_an_agent_run_collected_with_content_off_keeps_its_message_rows_without_text(tmp_path, lib):
    """``<lib>-no-content.json``: the same loop recorded with each library's content capture off
    (``record.py --lib <lib> --no-content``). The user's input and the answer are message rows,
    without their text where the instrumentation did not capture it (OpenLLMetry's agent
    decorator still captures the input); the tool call and the two model calls keep their
    rows, tokens and all."""
    db = str(tmp_path / f"{lib}-no-content.duckdb")
    with Collector(db, http_port=0, grpc_port=None, flush_interval=0.05) as collector:
        assert post_json(collector.http_endpoint, (FIXTURES / f"{lib}-no-content.json").read_bytes()) == 200
    events = query(db, "SELECT idx, type, content::VARCHAR FROM events ORDER BY idx")
    assert [(e[0], e[1]) for e in events] == [(1, "message"), (2, "tool_call_start"), (3, "tool_call_end"), (4, "message")]
    said = {"type": "text", "body": PROMPT if lib == "openllmetry" else "", "role": "user"}
    assert json.loads(events[0][2]) == said
    assert json.loads(events[3][2]) == {"type": "text", "body": "", "role": "assistant"}
    end = json.loads(events[2][2])
    assert (end["tool_name"], end["status"]) == ("get_weather", "completed")
    # what the instrumentation withheld is not stored as if it were the text (OpenInference's mask)
    assert "__REDACTED__" not in json.dumps([e[2] for e in events])
    (turn,) = query(db, "SELECT input_tokens, output_tokens, tool_calls_count, loop_end_reason FROM turns")
    assert turn == (155, 23, 1, "completed")
    assert query(db, "SELECT count(*) FROM model_call_summaries") == [(2,)]


@pytest.mark.parametrize("lib", sorted(FRAMEWORKS))
def test_live_spans_from_the_real_instrumentation(tmp_path, lib):
    python = stacks.require(PEERS[lib]) / "bin" / "python"
    db = str(tmp_path / f"live-{lib}.duckdb")
    with Collector(db, http_port=0, grpc_port=None, flush_interval=0.05) as collector:
        done = subprocess.run(
            [str(python), "-W", "ignore", str(FIXTURES / "record.py"), "--lib", lib, "--endpoint", collector.http_endpoint],
            check=False, capture_output=True, text=True, timeout=180, cwd=ROOT,
        )
        assert done.returncode == 0, done.stderr[-2000:]
    check_weather_loop(db, FRAMEWORKS[lib])


# -- shapes the fixtures do not hold: older releases ---------------------------------------------

_ids = iter(range(1, 1 << 30))


def span(name: str, attributes: dict[str, Any], parent: SpanRecord | None = None, *, trace: int = 7, start: int = 0,
         end: int = 0, scope: str = "peer", events: list[SpanEvent] | None = None, error: str | None = None) -> SpanRecord:
    sid = next(_ids)
    return SpanRecord(
        name, Ctx(trace, sid), Ctx(trace, parent.context.span_id) if parent is not None else None,
        start * 1_000_000, end * 1_000_000, attributes, events=events or [],
        status=Status(2, error) if error else Status(), instrumentation_scope=Scope(scope),
    )


def collect_rows(spans: list[SpanRecord], assembler: Assembler | None = None) -> list[tuple[int, Any]]:
    assembler = assembler or Assembler()
    out = []
    for s in spans:
        out += assembler.add(s)
    return out


def test_openllmetry_before_gen_ai_messages_and_a_workflow_root():
    root = span("weather.workflow", {"traceloop.span.kind": "workflow", "traceloop.entity.name": "weather",
                                     "traceloop.entity.input": json.dumps({"args": [], "kwargs": {"question": PROMPT}}),
                                     "traceloop.association.properties.session_id": "tl-1"}, start=0, end=10)
    chat = span("openai.chat", {
        "llm.request.type": "chat", "gen_ai.system": "OpenAI", "gen_ai.request.model": "gpt-4o",
        "gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": PROMPT,
        "gen_ai.completion.0.role": "assistant", "gen_ai.completion.0.content": "",
        "gen_ai.completion.0.finish_reason": "tool_calls",
        "gen_ai.completion.0.tool_calls.0.id": "c1", "gen_ai.completion.0.tool_calls.0.name": "get_weather",
        "gen_ai.completion.0.tool_calls.0.arguments": '{"city": "Paris"}',
        "llm.request.functions.0.name": "get_weather", "llm.request.functions.0.description": "Weather",
        "llm.usage.prompt_tokens": 10, "llm.usage.completion_tokens": 3,
    }, root, start=1, end=2, scope="opentelemetry.instrumentation.openai.v1")
    tool = span("get_weather.tool", {"traceloop.span.kind": "tool", "traceloop.entity.name": "get_weather",
                                     "traceloop.entity.input": json.dumps({"args": [], "kwargs": {"city": "Paris"}})},
                root, start=3, end=4, error="boom")
    final = span("openai.chat", {"llm.request.type": "chat", "gen_ai.system": "OpenAI", "gen_ai.completion.0.content": ANSWER,
                                 "gen_ai.completion.0.role": "assistant", "gen_ai.usage.prompt_tokens": 20,
                                 "gen_ai.usage.completion_tokens": 5}, root, start=5, end=6)
    assert classify(root) == (CONTAINER, "openllmetry") and classify(chat) == (CHAT, "openllmetry")
    rows = collect_rows([chat, tool, final, root])
    kinds = [(k, r.attributes[a.OPERATION]) for k, r in rows]
    # in time order; the first model call has no text (the mapping writes no row for it)
    assert kinds == [(0, "invoke_agent"), (1, "chat"), (0, "execute_tool"), (1, "execute_tool"), (1, "chat"), (1, "invoke_agent")]
    assert a.ROUND_TEXT not in rows[1][1].attributes
    agent = rows[-1][1].attributes
    assert agent[a.TURN_INPUT] == PROMPT and agent[a.CONVERSATION_ID] == "tl-1"
    assert agent[a.TOOL_CALLS_COUNT] == 1 and agent[a.USAGE_INPUT] == 30 and agent[a.USAGE_OUTPUT] == 8
    assert json.loads(agent[a.DECLARED_TOOLS])[0]["name"] == "get_weather"
    failed = rows[3][1].attributes
    assert (failed[a.TOOL_OUTCOME], failed[a.TOOL_STATUS], failed[a.TOOL_ERROR]) == ("failed", "failed", "boom")
    assert failed[a.TOOL_CALL_ID] == "c1" and failed[a.CONVERSATION_ID] == "tl-1"
    assert rows[4][1].attributes[a.ROUND_TEXT] == ANSWER


def test_official_genai_span_events_of_older_releases():
    agent = span("invoke_agent helper", {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "helper"}, start=0, end=9)
    chat = span("chat gpt-4o", {"gen_ai.operation.name": "chat", "gen_ai.system": "openai", "gen_ai.request.model": "gpt-4o"},
                agent, start=1, end=2, events=[
                    SpanEvent("gen_ai.user.message", 1, {"content": "hello?"}),
                    SpanEvent("gen_ai.choice", 2, {"index": 0, "finish_reason": "length",
                                                   "message": json.dumps({"role": "assistant", "content": "Hi th"})}),
                ])
    rows = collect_rows([chat, agent])
    assert rows[0][1].attributes[a.TURN_INPUT] == "hello?"
    assert rows[1][1].attributes[a.ROUND_TEXT] == "Hi th"
    turn = rows[-1][1].attributes
    assert turn[a.LOOP_END_REASON] == "truncated"  # the last answer was cut at its length
    assert json.loads(turn[a.SEGMENTS]) == ["Hi th"]


def test_a_failed_agent_run_ends_in_error():
    agent = span("weather-agent", {"openinference.span.kind": "AGENT", "input.value": "x"}, start=0, end=2, error="ValueError: bad")
    (_start, end) = collect_rows([agent])
    assert end[1].attributes[a.LOOP_END_REASON] == "error"
    assert end[1].attributes[a.TURN_INPUT] == "x"


def test_an_agent_run_with_content_on_but_no_user_message_keeps_no_input_row():
    """Content captured (the call's messages are there) with no user message among them: no
    input was given, so no row without text is made up; nor is one for a run without calls."""
    agent = span("invoke_agent planner", {"gen_ai.operation.name": "invoke_agent"}, start=0, end=3)
    chat = span("chat gpt-4o-mini", {
        "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o-mini", "gen_ai.usage.input_tokens": 12,
        a.INPUT_MESSAGES: json.dumps([{"role": "system", "parts": [{"type": "text", "content": "Plan the day."}]}]),
        a.OUTPUT_MESSAGES: json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "Done."}], "finish_reason": "stop"}]),
    }, agent, start=1, end=2)
    rows = collect_rows([chat, agent])
    run_start = next(r for kind, r in rows if r.attributes.get(a.OPERATION) == "invoke_agent")
    assert a.TURN_INPUT not in run_start.attributes and a.CONTENT_WITHHELD not in run_start.attributes
    answer = next(r for kind, r in rows if r.attributes.get(a.OPERATION) == "chat")
    assert answer.attributes[a.ROUND_TEXT] == "Done." and a.CONTENT_WITHHELD not in answer.attributes
    lonely = span("invoke_agent idle", {"gen_ai.operation.name": "invoke_agent"}, start=0, end=1, trace=8)
    (start, _end) = collect_rows([lonely])
    assert a.CONTENT_WITHHELD not in start[1].attributes


def test_model_calls_without_an_agent_run_are_stored_alone():
    chat = span("ChatCompletion", {"openinference.span.kind": "LLM", "llm.output_messages.0.message.role": "assistant",
                                   "llm.output_messages.0.message.content": "hi", "session.id": "s9"}, trace=99)
    rows = collect_rows([chat])  # a root: nothing to wait for
    assert [(k, r.attributes[a.OPERATION]) for k, r in rows] == [(1, "chat")]
    assert rows[0][1].attributes[a.CONVERSATION_ID] == "s9" and a.TURN_ID not in rows[0][1].attributes
    # under a root that is no GenAI span: held until that root ends
    http = span("GET /ask", {"http.method": "GET"}, trace=98, start=0, end=5)
    tool = span("lookup", {"openinference.span.kind": "TOOL", "tool.name": "lookup", "input.value": "{}"}, http, trace=98, start=1, end=2)
    assembler = Assembler()
    assert assembler.add(tool) == [] and assembler.held == 1
    rows = assembler.add(http)
    assert [(k, r.attributes[a.OPERATION]) for k, r in rows] == [(0, "execute_tool"), (1, "execute_tool")]
    assert assembler.held == 0


def test_held_spans_are_released_when_idle_and_memory_is_bounded():
    now = [0.0]
    assembler = Assembler(idle_seconds=30, max_spans=3, clock=lambda: now[0])
    parent = span("remote parent", {}, trace=50)  # never arrives
    held = [span("chat", {"gen_ai.operation.name": "chat", "loopscope.round.text": "x"}, parent, trace=50, start=i, end=i)
            for i in range(2)]
    for s in held:
        assert assembler.add(s) == []
    now[0] = 29.0
    assert assembler.expire() == []
    now[0] = 31.0
    assert len(assembler.expire()) == 2 and assembler.held == 0
    # past max_spans the oldest trace goes first
    for trace in (60, 61):
        p = span("p", {}, trace=trace)
        for i in range(2):
            assembler.add(span("t", {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t"}, p, trace=trace))
    assert assembler.held == 2 and not assembler.tracks(60) and assembler.tracks(61)
    assert len(assembler.drain()) == 4 and assembler.held == 0


def test_loopscope_turns_claim_foreign_spans_recorded_inside_them():
    own_turn = span("invoke_agent a", {a.OPERATION: a.OP_INVOKE_AGENT}, trace=70, scope="loopscope", start=0, end=5)
    own_round = span("chat m", {a.OPERATION: a.OP_CHAT}, own_turn, trace=70, scope="loopscope", start=1, end=3)
    theirs = span("ChatCompletion", {"openinference.span.kind": "LLM"}, own_round, trace=70, start=1, end=2)
    assembler = Assembler()
    assert assembler.add(theirs) == []
    assert assembler.add(own_round) == []
    assert assembler.add(own_turn) == []  # the same model call, recorded twice: loopscope's is kept
    assert assembler.held == 0 and not assembler.tracks(70)


def test_normalize_one_span_and_pass_our_own_through():
    ours = span("execute_tool t", {a.OPERATION: a.OP_EXECUTE_TOOL, a.TOOL_NAME: "t"}, scope="loopscope")
    assert normalize(ours).attributes is ours.attributes
    tool = span("running tool", {"gen_ai.tool.name": "get_weather", "tool_arguments": '{"city":"Paris"}',
                                 "tool_response": "sunny", "gen_ai.conversation.id": "c1"}, scope="pydantic-ai")
    out = normalize(tool).attributes
    assert out[a.OPERATION] == a.OP_EXECUTE_TOOL and out[a.TOOL_CALL_ARGUMENTS] == '{"city":"Paris"}'
    assert out[a.TOOL_CALL_RESULT] == "sunny" and out[a.CONVERSATION_ID] == "c1" and out[a.TOOL_OUTCOME] == "served"
    assert normalize(span("SELECT", {"db.system": "postgresql"})) is None


@pytest.mark.parametrize("lib", sorted(FRAMEWORKS))
def test_the_in_process_store_maps_foreign_spans_as_the_collector_does(tmp_path, lib):
    """Foreign spans that end in this process (pydantic-ai's, with loopscope.instrument()) go
    through the store's span processor: the same rows as the collector's."""
    from loopscope.ingest.processor import StoreSpanProcessor
    from loopscope.ingest.writer import SPANS
    from loopscope.storage.queries import open_sink

    db = str(tmp_path / f"{lib}.duckdb")
    processor = StoreSpanProcessor(open_sink(db, mapping=SPANS, flush_interval=0.05))
    for record in parse_fixture(json.loads((FIXTURES / f"{lib}.json").read_text())):
        processor.on_end(record)
    processor.shutdown()
    check_weather_loop(db, FRAMEWORKS[lib])


@pytest.mark.parametrize(("exception", "message", "reason"), [
    ("pydantic_ai.exceptions.UsageLimitExceeded", "The next request would exceed the request_limit of 3", "max_rounds"),
    ("pydantic_ai.exceptions.UsageLimitExceeded", "Exceeded the output_tokens_limit of 10 (output_tokens=12)", "budget_exceeded"),
    ("pydantic_ai.exceptions.UsageLimitExceeded", "The next tool call(s) would exceed the tool_calls_limit of 2", "budget_exceeded"),
    ("pydantic_ai.exceptions.RunTimedOut", "the run took longer than 5 s", "timeout"),
    ("asyncio.exceptions.CancelledError", "", "cancelled"),
    ("ValueError", "bad", "error"),
])
def test_why_a_failed_agent_run_stopped(exception, message, reason):
    event = SpanEvent("exception", 2_000_000, {"exception.type": exception, "exception.message": message})
    agent = span("invoke_agent a", {a.OPERATION: a.OP_INVOKE_AGENT, "agent_name": "a"}, start=0, end=2,
                 scope="pydantic-ai", events=[event], error=f"{exception}: {message}")
    *_, end = collect_rows([agent])
    assert end[1].attributes[a.LOOP_END_REASON] == reason


def test_anthropic_usage_without_cached_tokens_is_normalized():
    # an instrumentation that reports Anthropic's input_tokens as the API gives them (3: the
    # uncached rest of a prompt with 1,111 tokens read from the cache and 418 written to it)
    agent = span("invoke_agent a", {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "a"}, trace=80, start=0, end=5)
    raw = span("chat claude", {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "anthropic", "gen_ai.request.model": "claude-x",
        "gen_ai.usage.input_tokens": 3, "gen_ai.usage.output_tokens": 20,
        "gen_ai.usage.cache_read_input_tokens": 1111, "gen_ai.usage.cache_creation_input_tokens": 418,
    }, agent, trace=80, start=1, end=2)
    # one that counts them in already, as the GenAI conventions say: left as it is
    counted = span("chat claude", {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "anthropic", "gen_ai.request.model": "claude-x",
        "gen_ai.usage.input_tokens": 1532, "gen_ai.usage.output_tokens": 20,
        "gen_ai.usage.cache_read.input_tokens": 1111, "gen_ai.usage.cache_creation.input_tokens": 418,
    }, agent, trace=80, start=3, end=4)
    rows = [r for kind, r in collect_rows([raw, counted, agent]) if kind == 1]  # the ends
    chats = [r.attributes for r in rows if r.attributes[a.OPERATION] == a.OP_CHAT]
    assert [c[a.USAGE_INPUT] for c in chats] == [1532, 1532]
    assert json.loads(chats[0][a.USAGE_PROVIDER])["input_tokens"] == 3 and a.USAGE_PROVIDER not in chats[1]
    [turn] = [r.attributes for r in rows if r.attributes[a.OPERATION] == a.OP_INVOKE_AGENT]
    assert (turn[a.USAGE_INPUT], turn[a.MODEL_CALL_COUNT]) == (3064, 2)
