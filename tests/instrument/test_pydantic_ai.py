"""The pydantic-ai adapter end to end: real ``Agent`` runs on ``OpenAIChatModel`` against the
fake model server on 127.0.0.1, recorded through pydantic-ai's own spans into a real DuckDB
file, with the openai adapter on underneath."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from pydantic import BaseModel, Field
from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai.exceptions import UsageLimitExceeded
from pydantic_ai.models.instrumented import InstrumentationSettings
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.usage import UsageLimits

import loopscope
from fakes.model_server import Reply, ToolCall, Usage
from loopscope import LoopEndReason
from loopscope import semconv as a
from loopscope.ingest.otlp.collector import Collector
from loopscope.instrument import active
from loopscope.storage.duckdb.connection import open_store
from recorded import only_turn, rows, spans_of

MODEL = "gpt-test-1"
AGENT = "concierge"
PROMPT = "Weather and time in Paris?"
FIRST_TEXT = "Let me check the weather."
FINAL_TEXT = "21 °C and dry; it is 14:05 in Paris."
CITY_PARAMS = {"additionalProperties": False, "properties": {"city": {"type": "string"}}, "required": ["city"], "type": "object"}
FRAMEWORK = "pydantic-ai"




def make_agent(server: Any, model_class: type = OpenAIChatModel, **kwargs: Any) -> Agent:
    model = model_class(MODEL, provider=OpenAIProvider(base_url=server.openai_base_url, api_key="test-key"))
    agent = Agent(model, name=AGENT, instructions="Answer briefly.", **kwargs)

    @agent.tool_plain
    def weather(city: str) -> dict[str, Any]:
        """Current weather for a city."""
        return {"city": city, "temp_c": 21}

    @agent.tool_plain
    def local_time(city: str) -> str:
        """Local time in a city."""
        return "14:05"

    @agent.tool_plain
    def book(city: str) -> str:
        """Book a table in a city."""
        if city == "Atlantis":
            raise ValueError("no such city")
        raise ModelRetry("fully booked, try another city")

    return agent


def two_tools(server: Any) -> None:
    server.queue(
        Reply(text=FIRST_TEXT, tool_calls=[ToolCall("weather", {"city": "Paris"}, id="call_w1")], usage=Usage(100, 20, cached_tokens=30)),
        Reply(tool_calls=[ToolCall("local_time", {"city": "Paris"}, id="call_t1")], usage=Usage(150, 10)),
        Reply(text=FINAL_TEXT, usage=Usage(170, 15)),
    )


# -- reading what was recorded ------------------------------------------------------------------


def query(db: Any, sql: str) -> list[tuple[Any, ...]]:
    with open_store(str(Path(db).resolve()), read_only=True) as con:
        return con.execute(sql).fetchall()


WEATHER_ROWS = [
    ("message", "user", PROMPT),
    ("message", "assistant", FIRST_TEXT),
    ("tool_call_start", "weather", "call_w1", {"city": "Paris"}, None, "pending", None, None),
    ("tool_call_end", "weather", "call_w1", {"city": "Paris"}, {"city": "Paris", "temp_c": 21}, "completed", "served", None),
    ("tool_call_start", "local_time", "call_t1", {"city": "Paris"}, None, "pending", None, None),
    ("tool_call_end", "local_time", "call_t1", {"city": "Paris"}, "14:05", "completed", "served", None),
    ("message", "assistant", FINAL_TEXT),
]


def check_two_tool_turn(recording: Any, server: Any, *, requests: int = 3) -> Any:
    store = recording.store
    turn = only_turn(store)
    assert rows(store, turn.session_id) == WEATHER_ROWS
    events = store.get_timeline(turn.session_id)
    assert [e.index for e in events] == list(range(1, 8))
    assert {e.correlation_id for e in events} == {turn.correlation_id}
    assert {(e.source.channel_id, e.source.framework) for e in events} == {(AGENT, FRAMEWORK)}
    assert all(e.content.duration_ms >= 0 for e in events if e.type == "tool_call_end")

    assert turn.channel_id == AGENT
    assert turn.loop_end_reason == LoopEndReason.COMPLETED
    assert turn.segments == [FIRST_TEXT, FINAL_TEXT]
    assert turn.response_content == FIRST_TEXT + "\n\n" + FINAL_TEXT
    assert (turn.round_count, turn.tool_calls_count) == (2, 2)
    assert turn.usage == {"input_tokens": 420, "output_tokens": 45, "cache_read_input_tokens": 30}
    assert [t.name for t in turn.declared_tools] == ["weather", "local_time", "book"]
    assert [t.description for t in turn.declared_tools] == ["Current weather for a city.", "Local time in a city.", "Book a table in a city."]
    assert all(t.parameters == CITY_PARAMS and t.origin == "always" for t in turn.declared_tools)
    assert (turn.model, turn.provider, turn.streaming, turn.error) == (MODEL, "openai", False, None)
    assert turn.latency_ms > 0

    # one tree: pydantic-ai's spans only, one model-call span per request the server saw
    chats = spans_of(recording, a.OP_CHAT)
    assert len(chats) == 3 and len(server.requests) == requests
    assert {s.instrumentation_scope.name for s in recording.spans()} == {"pydantic-ai"}
    [run] = spans_of(recording, a.OP_INVOKE_AGENT)
    assert all(s.context.trace_id == run.context.trace_id for s in recording.spans())
    assert turn.correlation_id == f"{run.context.span_id:016x}"
    return turn


# -- turns ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model_class", [OpenAIChatModel, OpenAIResponsesModel])
def test_run_sync_two_tools_is_one_turn(instrumented, server, model_class):
    two_tools(server)
    result = make_agent(server, model_class).run_sync(PROMPT)
    assert result.output == FINAL_TEXT
    check_two_tool_turn(instrumented, server)
    assert {r.api for r in server.requests} == {"chat" if model_class is OpenAIChatModel else "responses"}
    assert [[t["id"] for t in r.tool_results] for r in server.requests] == [[], ["call_w1"], ["call_w1", "call_t1"]]


def test_async_run_and_iter(instrumented, server):
    agent = make_agent(server)

    async def main() -> None:
        two_tools(server)
        assert (await agent.run(PROMPT)).output == FINAL_TEXT
        two_tools(server)
        async with agent.iter(PROMPT) as run:
            async for _ in run:
                pass
        assert run.result is not None and run.result.output == FINAL_TEXT

    asyncio.run(main())
    store = instrumented.store
    turns = store.list_turns()
    assert len(turns) == 2
    for turn in turns:
        assert rows(store, turn.session_id) == WEATHER_ROWS
        assert (turn.loop_end_reason, turn.round_count, turn.tool_calls_count) == (LoopEndReason.COMPLETED, 2, 2)
    assert len(spans_of(instrumented, a.OP_CHAT)) == len(server.requests) == 6


def test_streamed_run(instrumented, server):
    server.queue(
        Reply(tool_calls=[ToolCall("weather", {"city": "Paris"}, id="call_w1")], usage=Usage(100, 20)),
        Reply(text=FINAL_TEXT, usage=Usage(150, 10)),
    )
    agent = make_agent(server)

    async def main() -> str:
        async with agent.run_stream(PROMPT) as stream:
            return "".join([delta async for delta in stream.stream_text(delta=True)])

    assert asyncio.run(main()) == FINAL_TEXT
    store = instrumented.store
    turn = only_turn(store)
    assert rows(store, turn.session_id) == [
        ("message", "user", PROMPT),
        ("tool_call_start", "weather", "call_w1", {"city": "Paris"}, None, "pending", None, None),
        ("tool_call_end", "weather", "call_w1", {"city": "Paris"}, {"city": "Paris", "temp_c": 21}, "completed", "served", None),
        ("message", "assistant", FINAL_TEXT),
    ]
    assert (turn.loop_end_reason, turn.streaming, turn.round_count, turn.tool_calls_count) == (LoopEndReason.COMPLETED, True, 1, 1)
    assert turn.segments == [FINAL_TEXT]
    assert turn.usage == {"input_tokens": 250, "output_tokens": 30}
    assert all(r.body.get("stream") for r in server.requests)
    assert len(spans_of(instrumented, a.OP_CHAT)) == len(server.requests) == 2  # the openai adapter stood aside


# -- failures and limits ----------------------------------------------------------------------------------


def test_a_tool_that_raises_fails_the_call_and_the_turn(instrumented, server):
    server.queue(Reply(text="Booking.", tool_calls=[ToolCall("book", {"city": "Atlantis"}, id="call_b1")], usage=Usage(50, 5)))
    with pytest.raises(ValueError, match="no such city"):
        make_agent(server).run_sync("Book Atlantis")
    store = instrumented.store
    turn = only_turn(store)
    assert rows(store, turn.session_id) == [
        ("message", "user", "Book Atlantis"),
        ("message", "assistant", "Booking."),
        ("tool_call_start", "book", "call_b1", {"city": "Atlantis"}, None, "pending", None, None),
        ("tool_call_end", "book", "call_b1", {"city": "Atlantis"}, None, "failed", "failed", "ValueError: no such city"),
    ]
    assert turn.loop_end_reason == LoopEndReason.ERROR
    assert turn.error == "error: ValueError: no such city"
    assert (turn.round_count, turn.tool_calls_count, turn.usage) == (1, 1, {"input_tokens": 50, "output_tokens": 5})


def test_model_retry_fails_the_call_and_the_turn_goes_on(instrumented, server):
    server.queue(
        Reply(tool_calls=[ToolCall("book", {"city": "Paris"}, id="call_b1")], usage=Usage(50, 5)),
        Reply(text="Paris is fully booked.", usage=Usage(80, 6)),
    )
    assert make_agent(server).run_sync("Book Paris").output == "Paris is fully booked."
    store = instrumented.store
    turn = only_turn(store)
    retry = "fully booked, try another city"
    assert rows(store, turn.session_id)[1:3] == [
        ("tool_call_start", "book", "call_b1", {"city": "Paris"}, None, "pending", None, None),
        ("tool_call_end", "book", "call_b1", {"city": "Paris"}, retry, "failed", "failed", f"pydantic_ai.exceptions.ToolRetryError: {retry}"),
    ]
    assert (turn.loop_end_reason, turn.round_count, turn.tool_calls_count) == (LoopEndReason.COMPLETED, 1, 1)
    assert "fully booked" in json.dumps(server.requests[1].tool_results)


def test_request_limit_is_max_rounds(instrumented, server):
    two_tools(server)
    with pytest.raises(UsageLimitExceeded, match="request_limit of 1"):
        make_agent(server).run_sync(PROMPT, usage_limits=UsageLimits(request_limit=1))
    store = instrumented.store
    turn = only_turn(store)
    assert turn.loop_end_reason == LoopEndReason.MAX_ROUNDS
    assert rows(store, turn.session_id) == WEATHER_ROWS[:4]  # the tool ran; the next request was refused
    assert (turn.round_count, turn.tool_calls_count, turn.usage) == (1, 1, {"input_tokens": 100, "output_tokens": 20, "cache_read_input_tokens": 30})
    assert len(server.requests) == 1


def test_token_limit_is_budget_exceeded(instrumented, server):
    two_tools(server)
    with pytest.raises(UsageLimitExceeded, match="total_tokens_limit"):
        make_agent(server).run_sync(PROMPT, usage_limits=UsageLimits(total_tokens_limit=50))
    turn = only_turn(instrumented.store)
    assert turn.loop_end_reason == LoopEndReason.BUDGET_EXCEEDED
    assert (turn.round_count, turn.tool_calls_count, turn.segments) == (0, 0, [FIRST_TEXT])


# -- the openai adapter underneath ----------------------------------------------------------------


def test_without_pydantic_ai_spans_the_openai_adapter_records_the_calls(recording, server):
    loopscope.instrument(pydantic_ai=False)
    try:
        two_tools(server)
        assert make_agent(server).run_sync(PROMPT).output == FINAL_TEXT
    finally:
        loopscope.uninstrument()
    store = recording.store
    turn = only_turn(store)  # stitched from the SDK calls by their tool call ids
    assert rows(store, turn.session_id) == WEATHER_ROWS
    assert (turn.round_count, turn.tool_calls_count, turn.loop_end_reason) == (2, 2, LoopEndReason.COMPLETED)
    assert {s.instrumentation_scope.name for s in recording.spans()} == {"loopscope"}


def test_an_agent_with_instrumentation_off_is_recorded_by_the_openai_adapter(instrumented, server):
    two_tools(server)
    agent = make_agent(server)
    agent.instrument = False  # this agent's choice wins over Agent.instrument_all()
    assert agent.run_sync(PROMPT).output == FINAL_TEXT
    turn = only_turn(instrumented.store)
    assert rows(instrumented.store, turn.session_id) == WEATHER_ROWS
    assert {s.instrumentation_scope.name for s in instrumented.spans()} == {"loopscope"}


def test_an_anthropic_model_has_one_span_per_call(instrumented, server):
    """The anthropic SDK traces its calls itself; under pydantic-ai's ``chat`` span it does not."""
    import anthropic
    from pydantic_ai.models.anthropic import AnthropicModel
    from pydantic_ai.providers.anthropic import AnthropicProvider

    client = anthropic.AsyncAnthropic(base_url=server.anthropic_base_url, api_key="test-key", max_retries=0,
                                      open_telemetry={"tracer_provider": instrumented.pipeline.tracer_provider})
    agent = Agent(AnthropicModel("claude-test-1", provider=AnthropicProvider(anthropic_client=client)), name=AGENT)

    @agent.tool_plain
    def weather(city: str) -> dict[str, Any]:
        """Current weather for a city."""
        return {"city": city, "temp_c": 21}

    server.queue(
        Reply(text=FIRST_TEXT, tool_calls=[ToolCall("weather", {"city": "Paris"}, id="toolu_w1")], usage=Usage(100, 20)),
        Reply(text=FINAL_TEXT, usage=Usage(150, 10)),
    )
    assert agent.run_sync(PROMPT).output == FINAL_TEXT
    turn = only_turn(instrumented.store)
    assert rows(instrumented.store, turn.session_id) == [
        ("message", "user", PROMPT),
        ("message", "assistant", FIRST_TEXT),
        ("tool_call_start", "weather", "toolu_w1", {"city": "Paris"}, None, "pending", None, None),
        ("tool_call_end", "weather", "toolu_w1", {"city": "Paris"}, {"city": "Paris", "temp_c": 21}, "completed", "served", None),
        ("message", "assistant", FINAL_TEXT),
    ]
    assert (turn.provider, turn.model, turn.usage) == ("anthropic", "claude-test-1", {"input_tokens": 250, "output_tokens": 30})
    chats = spans_of(instrumented, a.OP_CHAT)
    assert len(chats) == len(server.requests) == 2
    assert {s.instrumentation_scope.name for s in instrumented.spans()} == {"pydantic-ai"}
    # the trace context the SDK sent is that of pydantic-ai's span for the call
    assert [r.headers["traceparent"].split("-")[2] for r in server.requests] == [f"{s.context.span_id:016x}" for s in chats]


# -- on and off ---------------------------------------------------------------------------------------------


def test_instrument_uninstrument_reinstrument(recording, server):
    assert Agent._instrument_default is False
    loopscope.instrument()
    assert "pydantic_ai" in active()
    ours = Agent._instrument_default
    assert isinstance(ours, InstrumentationSettings) and ours.include_content
    loopscope.instrument()  # idempotent
    assert Agent._instrument_default is ours

    loopscope.uninstrument()
    assert Agent._instrument_default is False and "pydantic_ai" not in active()
    two_tools(server)
    make_agent(server).run_sync(PROMPT)
    assert recording.store.list_turns() == [] and recording.spans() == ()

    loopscope.instrument()
    try:
        two_tools(server)
        make_agent(server).run_sync(PROMPT)
    finally:
        loopscope.uninstrument()
    check_two_tool_turn(recording, server, requests=6)


def test_the_applications_own_settings_stand(recording, server):
    theirs = InstrumentationSettings(tracer_provider=TracerProvider(), include_content=False)
    Agent.instrument_all(theirs)
    try:
        loopscope.instrument()
        assert Agent._instrument_default is theirs
        loopscope.uninstrument()
        assert Agent._instrument_default is theirs
        # settings the application makes after loopscope's are not undone either
        Agent.instrument_all(False)
        loopscope.instrument()
        Agent.instrument_all(theirs)
        loopscope.uninstrument()
        assert Agent._instrument_default is theirs
    finally:
        Agent.instrument_all(False)


def test_spans_follow_a_reconfigured_pipeline(instrumented, server, tmp_path):
    loopscope.configure(tmp_path / "second.duckdb", tracer_provider=TracerProvider(), flush_interval=0.05, capture_content=True)
    two_tools(server)
    make_agent(server).run_sync(PROMPT)
    second = loopscope.Store(str(tmp_path / "second.duckdb"))
    assert rows(second, only_turn(second).session_id) == WEATHER_ROWS
    assert instrumented.store.list_turns() == []


def test_without_pydantic_ai_imported_nothing_happens():
    code = (
        "import sys, loopscope\n"
        "from loopscope.instrument import active\n"
        "loopscope.configure(False)\n"
        "names = loopscope.instrument()\n"
        "assert 'pydantic_ai' in names and 'pydantic_ai' not in active(), active()\n"
        "assert 'pydantic_ai' not in sys.modules and 'loopscope.instrument.pydantic_ai' not in sys.modules\n"
        "import pydantic_ai\n"
        "assert 'pydantic_ai' in active() and pydantic_ai.Agent._instrument_default is not False\n"
        "loopscope.uninstrument()\n"
        "assert pydantic_ai.Agent._instrument_default is False\n"
    )
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120, cwd=Path(__file__).parent)
    assert done.returncode == 0, done.stderr[-3000:]


# -- the collector sees the same -----------------------------------------------------------------------


def test_the_collector_stores_the_same_rows(tmp_path, server):
    local = tmp_path / "local.duckdb"
    with Collector(str(tmp_path / "collected.duckdb"), http_port=0, grpc_port=None, flush_interval=0.05) as collector:
        loopscope.configure(local, tracer_provider=TracerProvider(), otlp_endpoint=collector.http_endpoint,
                            capture_content=True, flush_interval=0.05)
        loopscope.instrument()
        try:
            two_tools(server)
            make_agent(server).run_sync(PROMPT)
            server.queue(Reply(text="Booking.", tool_calls=[ToolCall("book", {"city": "Atlantis"}, id="call_b1")]))
            with pytest.raises(ValueError):
                make_agent(server).run_sync("Book Atlantis")
        finally:
            loopscope.uninstrument()
            loopscope.shutdown()
    events = "SELECT id, session_id, idx, type, correlation_id, source_channel_id, source_framework, content::VARCHAR FROM events ORDER BY session_id, idx"
    turns = ("SELECT correlation_id, session_id, channel_id, loop_end_reason, segments::VARCHAR, round_count, tool_calls_count, "
             "input_tokens, output_tokens, declared_tools::VARCHAR, model, provider, error FROM turns ORDER BY correlation_id")
    assert len(query(local, events)) == 7 + 4
    assert query(tmp_path / "collected.duckdb", events) == query(local, events)
    assert query(tmp_path / "collected.duckdb", turns) == query(local, turns)
    assert sorted(t[3] for t in query(local, turns)) == ["completed", "error"]


def test_a_run_inside_a_hand_turn_is_a_turn_of_its_own(instrumented, server):
    two_tools(server)
    with loopscope.turn(session_id="outer", agent="router", input=PROMPT) as outer:
        make_agent(server).run_sync(PROMPT)
        outer.generation("Delegated.", finish_reason="stop")
    store = instrumented.store
    inner = [t for t in store.list_turns() if t.channel_id == AGENT]
    assert len(inner) == 1 and rows(store, inner[0].session_id) == WEATHER_ROWS
    [hand] = store.list_turns("outer")
    assert (hand.segments, hand.round_count, hand.tool_calls_count) == (["Delegated."], 0, 0)
    assert len(spans_of(instrumented, a.OP_CHAT)) == 3 + 1  # pydantic-ai's three, the hand turn's one


def test_content_stays_in_the_store_unless_capture_is_on(tmp_path, server):
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))  # the application's exporter
    loopscope.configure(tmp_path / "store.duckdb", tracer_provider=provider, flush_interval=0.05, capture_content=False)
    loopscope.instrument()
    try:
        two_tools(server)
        make_agent(server).run_sync(PROMPT)
    finally:
        loopscope.uninstrument()
    store = loopscope.Store(str(tmp_path / "store.duckdb"))
    assert rows(store, only_turn(store).session_id) == WEATHER_ROWS
    loopscope.shutdown()
    exported = exporter.get_finished_spans()
    assert len(exported) == 6
    said = {PROMPT, FIRST_TEXT, FINAL_TEXT, "Paris", "14:05"}
    for s in exported:
        for key, value in s.attributes.items():
            assert not any(text in str(value) for text in said), (s.name, key)


def test_a_conversation_continued_with_its_history_is_one_session(instrumented, server):
    agent = make_agent(server)
    two_tools(server)
    first = agent.run_sync(PROMPT)
    server.queue(Reply(text="You are welcome.", usage=Usage(300, 4)))
    second = agent.run_sync("Thanks!", message_history=first.all_messages())
    assert second.output == "You are welcome."
    store = instrumented.store
    turns = store.list_turns()
    assert len(turns) == 2 and len({t.session_id for t in turns}) == 1
    assert rows(store, turns[0].session_id) == WEATHER_ROWS + [("message", "user", "Thanks!"), ("message", "assistant", "You are welcome.")]
    later = max(turns, key=lambda t: t.timestamp)
    assert (later.segments, later.round_count, later.usage) == (["You are welcome."], 0, {"input_tokens": 300, "output_tokens": 4})


# -- structured output: pydantic-ai's output tool ---------------------------------------------------


class SupportOutput(BaseModel):
    """pydantic-ai's bank-support example's output type."""

    support_advice: str = Field(description="Advice returned to the customer")
    block_card: bool = Field(description="Whether to block their card or not")
    risk: int = Field(description="Risk level of query", ge=0, le=10)


@dataclass
class SupportDependencies:
    customer_id: int


BALANCE_ADVICE = {"support_advice": "Your balance is $123.45.", "block_card": False, "risk": 1}
BLOCK_ADVICE = {"support_advice": "We have blocked your card.", "block_card": True, "risk": 8}


def support_agent(server: Any, output_type: Any = SupportOutput, model: Any = None, **kwargs: Any) -> Agent[SupportDependencies, Any]:
    """The bank-support example's agent: deps, a dynamic system prompt, one tool, a structured output."""
    model = model or OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=server.openai_base_url, api_key="test-key"))
    agent = Agent(model, name="support_agent", deps_type=SupportDependencies, output_type=output_type, **kwargs,
                  system_prompt="You are a support agent in our bank, give the customer support and judge the risk level of their query.")

    @agent.system_prompt
    async def add_customer_name(ctx: RunContext[SupportDependencies]) -> str:
        return "The customer's name is 'John'" if ctx.deps.customer_id == 123 else "Unknown customer"

    @agent.tool
    async def customer_balance(ctx: RunContext[SupportDependencies], include_pending: bool) -> float:
        """Returns the customer's current account balance."""
        return 123.45

    return agent


def compact(value: dict[str, Any]) -> str:
    """A structured output as pydantic-ai's run reports it (its ``final_result``): compact JSON."""
    return json.dumps(value, separators=(",", ":"))


def declared(db: Any) -> str:
    """What ``loopscope tools --declared`` prints for the store."""
    env = {**os.environ, "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-m", "loopscope", "tools", "--declared", "--db", str(db)], check=False,
                          capture_output=True, text=True, timeout=120, cwd=Path(__file__).parent, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_bank_support_examples_output_tool_is_its_answer(instrumented, server):
    """The output tool (``final_result``) is how the model answers: the structured output is
    the turn's assistant message and response, the tool is declared with origin ``output``,
    and ``tools --declared`` does not call it "offered but never called"."""
    server.queue(
        Reply(tool_calls=[ToolCall("customer_balance", {"include_pending": True}, id="call_b1")], usage=Usage(100, 10)),
        Reply(tool_calls=[ToolCall("final_result", BALANCE_ADVICE, id="call_f1")], usage=Usage(150, 20)),
        Reply(tool_calls=[ToolCall("final_result", BLOCK_ADVICE, id="call_f2")], usage=Usage(120, 20)),
    )
    agent = support_agent(server)
    deps = SupportDependencies(customer_id=123)
    assert agent.run_sync("What is my balance?", deps=deps).output == SupportOutput(**BALANCE_ADVICE)
    assert agent.run_sync("I just lost my card!", deps=deps).output == SupportOutput(**BLOCK_ADVICE)

    loopscope.flush()  # the rows are written before another process reads the file
    out = declared(instrumented.db)
    assert "customer_balance" in out and "final_result" not in out and "never called" not in out
    assert query(instrumented.db, "SELECT agent, tool, turns_offered, turns_used, calls FROM declared_vs_used") == [
        ("support_agent", "customer_balance", 2, 1, 1),
    ]
    assert query(instrumented.db, "SELECT DISTINCT tool FROM tool_calls") == [("customer_balance",)]

    store = instrumented.store
    balance, block = sorted(store.list_turns(), key=lambda t: t.timestamp)
    assert rows(store, balance.session_id) == [
        ("message", "user", "What is my balance?"),
        ("tool_call_start", "customer_balance", "call_b1", {"include_pending": True}, None, "pending", None, None),
        ("tool_call_end", "customer_balance", "call_b1", {"include_pending": True}, 123.45, "completed", "served", None),
        ("message", "assistant", compact(BALANCE_ADVICE)),
    ]
    assert rows(store, block.session_id) == [("message", "user", "I just lost my card!"), ("message", "assistant", compact(BLOCK_ADVICE))]
    for turn, output in ((balance, BALANCE_ADVICE), (block, BLOCK_ADVICE)):
        assert turn.loop_end_reason == LoopEndReason.COMPLETED
        assert (turn.segments, turn.response_content) == ([compact(output)], compact(output))
        assert [(t.name, t.origin) for t in turn.declared_tools] == [("customer_balance", "always"), ("final_result", "output")]
    # an answer is neither a tool call nor a tool round
    assert [(t.round_count, t.tool_calls_count) for t in (balance, block)] == [(1, 1), (0, 0)]


def test_a_structured_output_streamed_after_text_follows_the_text(instrumented, server):
    server.queue(Reply(text="Let me look into it.", tool_calls=[ToolCall("final_result", BLOCK_ADVICE, id="call_f1")], usage=Usage(100, 20)))
    agent = support_agent(server)

    async def main() -> Any:
        async with agent.run_stream("I just lost my card!", deps=SupportDependencies(customer_id=123)) as stream:
            return await stream.get_output()

    assert asyncio.run(main()) == SupportOutput(**BLOCK_ADVICE)
    turn = only_turn(instrumented.store)
    said = "Let me look into it.\n\n" + compact(BLOCK_ADVICE)
    assert rows(instrumented.store, turn.session_id) == [("message", "user", "I just lost my card!"), ("message", "assistant", said)]
    assert (turn.segments, turn.streaming, turn.tool_calls_count) == ([said], True, 0)


def test_an_output_the_run_rejected_is_not_the_answer(instrumented, server):
    """pydantic-ai asks again when the output tool's arguments do not validate: only the
    output the run returned is the turn's answer (the rejected one is in the model call)."""
    server.queue(
        Reply(tool_calls=[ToolCall("final_result", {"support_advice": "Blocked."}, id="call_f1")], usage=Usage(100, 10)),
        Reply(tool_calls=[ToolCall("final_result", BLOCK_ADVICE, id="call_f2")], usage=Usage(150, 20)),
    )
    result = support_agent(server).run_sync("I just lost my card!", deps=SupportDependencies(customer_id=123))
    assert result.output == SupportOutput(**BLOCK_ADVICE) and len(server.requests) == 2
    turn = only_turn(instrumented.store)
    assert rows(instrumented.store, turn.session_id) == [("message", "user", "I just lost my card!"), ("message", "assistant", compact(BLOCK_ADVICE))]
    assert (turn.segments, turn.round_count, turn.tool_calls_count) == ([compact(BLOCK_ADVICE)], 0, 0)


def test_an_output_function_runs_as_a_tool_and_its_return_is_the_answer(instrumented, server):
    """An output function is the application's code: its run is a tool call (of the output
    tool the model called), and what it returned is the turn's answer, told after it ran."""

    def escalate(support_advice: str, block_card: bool, risk: int) -> str:
        """Escalate to a human."""
        return f"escalated (risk {risk})"

    server.queue(Reply(tool_calls=[ToolCall("final_result", BLOCK_ADVICE, id="call_f1")], usage=Usage(100, 20)))
    assert support_agent(server, output_type=escalate).run_sync("I just lost my card!", deps=SupportDependencies(customer_id=123)).output == "escalated (risk 8)"
    turn = only_turn(instrumented.store)  # (reading the store flushes the pipeline first)
    assert rows(instrumented.store, turn.session_id) == [
        ("message", "user", "I just lost my card!"),
        ("tool_call_start", "final_result", "call_f1", BLOCK_ADVICE, None, "pending", None, None),
        ("tool_call_end", "final_result", "call_f1", BLOCK_ADVICE, "escalated (risk 8)", "completed", "served", None),
        ("message", "assistant", "escalated (risk 8)"),
    ]
    assert [(t.name, t.origin) for t in turn.declared_tools] == [("customer_balance", "always"), ("final_result", "output")]
    assert query(instrumented.db, "SELECT tool, turns_offered, calls, undeclared_calls FROM declared_vs_used") == [("customer_balance", 1, 0, 0)]


@pytest.mark.parametrize("capture", [True, False])
def test_the_collector_reads_the_output_tool_the_same(tmp_path, server, capture):
    """Collected over OTLP the output tool is an output tool too: pydantic-ai names it in its
    request parameters, which are no content (the answer itself is, so it stays home when
    content capture is off)."""
    local = tmp_path / "local.duckdb"
    with Collector(str(tmp_path / "collected.duckdb"), http_port=0, grpc_port=None, flush_interval=0.05) as collector:
        loopscope.configure(local, tracer_provider=TracerProvider(), otlp_endpoint=collector.http_endpoint,
                            capture_content=capture, flush_interval=0.05)
        loopscope.instrument()
        try:
            server.queue(
                Reply(tool_calls=[ToolCall("customer_balance", {"include_pending": True}, id="call_b1")], usage=Usage(100, 10)),
                Reply(tool_calls=[ToolCall("final_result", BALANCE_ADVICE, id="call_f1")], usage=Usage(150, 20)),
            )
            support_agent(server).run_sync("What is my balance?", deps=SupportDependencies(customer_id=123))
        finally:
            loopscope.uninstrument()
            loopscope.shutdown()
    collected = tmp_path / "collected.duckdb"
    declared_tools = "SELECT declared_tools::VARCHAR FROM turns"
    vs_used = "SELECT agent, tool, turns_offered, turns_used, calls, undeclared_calls FROM declared_vs_used"
    assert query(collected, vs_used) == query(local, vs_used) == [("support_agent", "customer_balance", 1, 1, 1, 0)]
    assert [[(t["name"], t["origin"]) for t in json.loads(v)] for (v,) in query(collected, declared_tools)] == [
        [("customer_balance", "always"), ("final_result", "output")]
    ]
    answers = "SELECT content->>'body' FROM events WHERE type = 'message' AND content->>'role' = 'assistant'"
    assert query(local, answers) == [(compact(BALANCE_ADVICE),)]
    assert query(collected, answers) == ([(compact(BALANCE_ADVICE),)] if capture else [])



# -- each model call's row: what the provider said and what was sent ------------------------------


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("model_class", [OpenAIChatModel, OpenAIResponsesModel])
def test_each_model_call_row_has_the_response_id_finish_reason_parameters_and_usage(instrumented, server, model_class, streamed):
    """A structured output with a tool before it (the bank-support example, with settings):
    pydantic-ai sends ``tool_choice: "required"`` (the answer must be a tool call), the
    temperature and the token cap. Each row has the provider's response id, a finish
    reason that says the model called tools, every parameter sent and the usage the
    provider reported."""
    server.queue(
        Reply(tool_calls=[ToolCall("customer_balance", {"include_pending": True}, id="call_b1")],
              usage=Usage(100, 10, cached_tokens=30, reasoning_tokens=4)),
        Reply(tool_calls=[ToolCall("final_result", BALANCE_ADVICE, id="call_f1")], usage=Usage(150, 20)),
    )
    model = model_class(MODEL, provider=OpenAIProvider(base_url=server.openai_base_url, api_key="test-key"))
    agent = support_agent(server, model=model, model_settings={"temperature": 0.3, "max_tokens": 200})

    async def main() -> Any:
        deps = SupportDependencies(customer_id=123)
        if not streamed:
            return (await agent.run("What is my balance?", deps=deps)).output
        async with agent.run_stream("What is my balance?", deps=deps) as stream:
            return await stream.get_output()

    assert asyncio.run(main()) == SupportOutput(**BALANCE_ADVICE)
    assert [r.body["tool_choice"] for r in server.requests] == ["required", "required"]
    first, second = loopscope.Store(str(instrumented.db)).model_calls()
    prefix = "chatcmpl-fake" if model_class is OpenAIChatModel else "resp_fake_"  # the ids the server sent
    assert [c.response_id for c in (first, second)] == [f"{prefix}00001", f"{prefix}00002"]
    for call in (first, second):
        assert call.finish_reasons == ["tool_call"] and call.outcome == "completed"
        assert call.streaming is streamed and (call.time_to_first_chunk_ms is not None) is streamed
        assert {k: call.parameters.get(k) for k in ("tool_choice", "temperature", "max_tokens", "server_address")} == {
            "tool_choice": "required", "temperature": 0.3, "max_tokens": 200, "server_address": "127.0.0.1",
        }
    assert first.provider_usage is not None and first.provider_usage["input_tokens"] == 100
    assert first.provider_usage["output_tokens"] == 10 and first.provider_usage["details"]["reasoning_tokens"] == 4
    assert (first.usage["input_tokens"], first.usage["cache_read_input_tokens"]) == (100, 30)
    # and, content being captured, the messages each call sent and got back
    first, second = loopscope.Store(str(instrumented.db)).model_calls(with_messages=True)
    assert first.input_messages[-1]["parts"][-1]["content"] == "What is my balance?"
    assert [p.get("name") for p in first.output_messages[0]["parts"]] == ["customer_balance"]
    assert [p.get("name") for p in second.output_messages[0]["parts"]] == ["final_result"]

