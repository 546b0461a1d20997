"""The OpenAI Agents SDK adapter end to end: real ``agents.Runner`` runs (async, sync and
streamed) against the fake model server on 127.0.0.1, recorded into a real DuckDB file.

Every test runs with the SDK's default trace processor set aside, so nothing is exported
to OpenAI's tracing backend; loopscope's processor is the only one the SDK calls.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import agents
import pytest
from agents import (
    Agent,
    MaxTurnsExceeded,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    function_tool,
)
from agents.agent import AgentBase
from agents.run import AgentRunner
from openai import AsyncOpenAI
from pydantic import BaseModel

import loopscope
from fakes.model_server import Reply, ToolCall, Usage
from loopscope import LoopEndReason, _guard
from loopscope import semconv as a
from loopscope.instrument import active
from loopscope.instrument.openai_agents import LoopscopeProcessor
from recorded import only_turn, rows

API_KEY = "sk-test-NEVER-RECORD-THIS-0123456789"
MODEL = "gpt-test-1"
PROMPT = "Dinner outside in Paris tonight?"
FIRST_TEXT = "Let me check the weather and the time."
FINAL_TEXT = "21 °C and dry at 19:00: a terrace works."
FIRST_USAGE = Usage(100, 20, cached_tokens=30, reasoning_tokens=5)
SECOND_USAGE = Usage(150, 10, cached_tokens=60)
TURN_USAGE = {"input_tokens": 250, "output_tokens": 30, "cache_read_input_tokens": 90, "cache_creation_input_tokens": 0, "reasoning_tokens": 5}
WEATHER_RESULT = {"city": "Paris", "temp_c": 21}
TIME_RESULT = "19:00"
APIS = ["responses", "chat"]
ADAPTERS = ["with_openai_adapter", "agents_only"]

PATCHED = [(AgentRunner, "run"), (AgentRunner, "run_streamed"), (AgentBase, "get_all_tools"),
           (OpenAIResponsesModel, "get_response"), (OpenAIResponsesModel, "stream_response")]


# -- tools: the weather call waits until the time call has run, so the rows have one order ----------


_time_ran: asyncio.Event | None = None


def _event() -> asyncio.Event:
    global _time_ran
    if _time_ran is None:
        _time_ran = asyncio.Event()
    return _time_ran


@function_tool
async def get_weather(city: str) -> dict[str, Any]:
    """Current weather for a city."""
    await _event().wait()
    return {"city": city, "temp_c": 21}


@function_tool
async def local_time(city: str) -> str:
    """Local time in a city."""
    _event().set()
    return TIME_RESULT


def _book(city: str) -> str:
    """Book a table."""
    raise ValueError(f"no tables left in {city}")


def _explain(ctx: Any, error: Exception) -> str:
    return f"Booking failed: {error}"


book_table = function_tool(_book, name_override="book_table")  # the SDK's default: the model gets a fixed message
book_table_explained = function_tool(_book, name_override="book_table", failure_error_function=_explain)
book_table_strict = function_tool(_book, name_override="book_table", failure_error_function=None)  # raises


# -- fixtures -------------------------------------------------------------------------------------


@pytest.fixture
def sdk_tracing(monkeypatch):
    """The SDK's default processor (an exporter to OpenAI's tracing backend) is set aside, and
    no API key is in the environment for it; the processors are put back afterwards."""
    global _time_ran
    _time_ran = None
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    provider = agents.tracing.get_trace_provider()
    before = list(provider._multi_processor._processors)
    agents.set_trace_processors([])
    try:
        yield provider
    finally:
        agents.set_trace_processors(before)


def _instrument(recording: Any, sdk_tracing: Any, **switches: bool) -> Any:
    errors = _guard.error_count  # the SDK swallows a processor's exceptions: count ours instead
    loopscope.instrument(anthropic=False, **switches)
    registered = sdk_tracing._multi_processor._processors
    assert len(registered) == 1 and isinstance(registered[0], LoopscopeProcessor)  # nothing exports elsewhere
    return errors


@pytest.fixture(params=ADAPTERS)
def instrumented(request, recording, sdk_tracing):
    """Both adapters on (the SDK's model calls go through the instrumented openai SDK), or only this one."""
    errors = _instrument(recording, sdk_tracing, **({} if request.param == "with_openai_adapter" else {"openai": False}))
    try:
        yield recording
    finally:
        loopscope.uninstrument()
    assert _guard.error_count == errors



def make_model(server: Any, api: str = "responses") -> Any:
    client = AsyncOpenAI(base_url=server.openai_base_url, api_key=API_KEY, max_retries=0)
    if api == "chat":
        return OpenAIChatCompletionsModel(MODEL, client)
    return OpenAIResponsesModel(MODEL, client)


def concierge(server: Any, api: str = "responses", tools: list[Any] | None = None, **kwargs: Any) -> Agent:
    settings = ModelSettings(include_usage=True) if api == "chat" else ModelSettings()
    return Agent(name="concierge", instructions="Be brief.", tools=tools if tools is not None else [get_weather, local_time],
                 model=make_model(server, api), model_settings=settings, **kwargs)


def two_tools(server: Any) -> None:
    server.queue(
        Reply(text=FIRST_TEXT, tool_calls=[ToolCall("get_weather", {"city": "Paris"}, id="call_w"),
                                           ToolCall("local_time", {"city": "Paris"}, id="call_t")], usage=FIRST_USAGE),
        Reply(text=FINAL_TEXT, usage=SECOND_USAGE),
    )


# -- reading what was recorded --------------------------------------------------------------------


def genai_spans(recording: Any) -> list[Any]:
    return [s for s in recording.spans() if s.attributes.get(a.OPERATION)]


TWO_TOOL_ROWS = [
    ("message", "user", PROMPT),
    ("message", "assistant", FIRST_TEXT),
    ("tool_call_start", "get_weather", "call_w", {"city": "Paris"}, None, "pending", None, None),
    ("tool_call_start", "local_time", "call_t", {"city": "Paris"}, None, "pending", None, None),
    ("tool_call_end", "local_time", "call_t", {"city": "Paris"}, TIME_RESULT, "completed", "served", None),
    ("tool_call_end", "get_weather", "call_w", {"city": "Paris"}, WEATHER_RESULT, "completed", "served", None),
    ("message", "assistant", FINAL_TEXT),
]


def check_two_tool_turn(recording: Any, server: Any, *, streaming: bool) -> Any:
    store = recording.store
    turn = only_turn(store)
    assert rows(store, turn.session_id) == TWO_TOOL_ROWS
    events = store.get_timeline(turn.session_id)
    assert {e.correlation_id for e in events} == {turn.correlation_id}
    assert {e.source.framework for e in events} == {"openai_agents"}
    assert all(e.content.duration_ms is not None for e in events if e.type == "tool_call_end")

    assert turn.channel_id == "concierge" and turn.session_id.startswith("trace_")
    assert turn.segments == [FIRST_TEXT, FINAL_TEXT]
    assert turn.response_content == f"{FIRST_TEXT}\n\n{FINAL_TEXT}"
    assert (turn.round_count, turn.tool_calls_count) == (1, 2)
    assert turn.usage == TURN_USAGE
    assert turn.loop_end_reason == LoopEndReason.COMPLETED and turn.error is None
    assert (turn.model, turn.provider, turn.streaming) == (MODEL, "openai", streaming)
    assert turn.parent_correlation_id is None
    offered = {t["name"] if "name" in t else t["function"]["name"]: t for t in server.requests[0].body["tools"]}
    assert [t.name for t in turn.declared_tools] == ["get_weather", "local_time"] == list(offered)
    weather = turn.declared_tools[0]
    assert weather.description == "Current weather for a city."
    assert weather.parameters == get_weather.params_json_schema
    assert weather.parameters == (offered["get_weather"].get("parameters") or offered["get_weather"]["function"]["parameters"])

    spans = genai_spans(recording)
    [agent_span] = [s for s in spans if s.attributes[a.OPERATION] == a.OP_INVOKE_AGENT]
    chats = [s for s in spans if s.attributes[a.OPERATION] == a.OP_CHAT]
    tools = [s for s in spans if s.attributes[a.OPERATION] == a.OP_EXECUTE_TOOL]
    assert len(spans) == 5 and len(chats) == 2 and len(tools) == 2  # one chat span per model call, nothing stitched
    assert len(server.requests) == 2
    assert {s.context.trace_id for s in spans} == {agent_span.context.trace_id}
    assert all(s.parent.span_id == agent_span.context.span_id for s in chats + tools)
    assert agent_span.attributes[a.AGENT_NAME] == "concierge" and agent_span.attributes[a.FRAMEWORK] == "openai_agents"
    assert [c.attributes[a.RESPONSE_FINISH_REASONS] for c in chats] == [("tool_calls",), ("stop",)]
    assert [c.attributes["gen_ai.usage.input_tokens"] for c in chats] == [100, 150]
    assert [c.attributes[a.REQUEST_MODEL] for c in chats] == [MODEL, MODEL] or [c.attributes[a.RESPONSE_MODEL] for c in chats] == [MODEL, MODEL]
    assert sorted(t.attributes[a.TOOL_CALL_ID] for t in tools) == ["call_t", "call_w"]
    return turn


# -- the two-tool turn, every way of running ------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
def test_async_run_is_one_turn(api, instrumented, server):
    two_tools(server)
    result = asyncio.run(Runner.run(concierge(server, api), PROMPT))
    assert result.final_output == FINAL_TEXT
    check_two_tool_turn(instrumented, server, streaming=False)
    sent = server.requests[1].tool_results
    assert {r["id"] for r in sent} == {"call_w", "call_t"}


def test_run_sync_is_one_turn(instrumented, server):
    two_tools(server)
    assert Runner.run_sync(concierge(server), PROMPT).final_output == FINAL_TEXT
    check_two_tool_turn(instrumented, server, streaming=False)


@pytest.mark.parametrize("api", APIS)
def test_streamed_run_is_one_turn(api, instrumented, server):
    two_tools(server)

    async def main() -> Any:
        result = Runner.run_streamed(concierge(server, api), PROMPT)
        kinds = [event.type async for event in result.stream_events()]
        assert "raw_response_event" in kinds
        return result.final_output

    assert asyncio.run(main()) == FINAL_TEXT
    check_two_tool_turn(instrumented, server, streaming=True)
    assert all(s.attributes[a.REQUEST_STREAM] is True for s in genai_spans(instrumented) if s.attributes[a.OPERATION] == a.OP_CHAT)


class Advice(BaseModel):
    support_advice: str
    block_card: bool
    risk: int


ADVICE = {"support_advice": "We have blocked your card.", "block_card": True, "risk": 8}


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("api", APIS)
def test_a_structured_output_is_the_assistants_message(api, streamed, instrumented, server):
    """``output_type`` asks for a JSON schema answer (no output tool, unlike pydantic-ai's
    default): the answer is the turn's assistant message and response, and no tool is
    declared that the model never called."""
    server.queue(
        Reply(tool_calls=[ToolCall("local_time", {"city": "Paris"}, id="call_t")], usage=FIRST_USAGE),
        Reply(text=json.dumps(ADVICE), usage=SECOND_USAGE),
    )
    agent = concierge(server, api, tools=[local_time], output_type=Advice)

    async def main() -> Any:
        if not streamed:
            return (await Runner.run(agent, "I just lost my card!")).final_output
        result = Runner.run_streamed(agent, "I just lost my card!")
        async for _ in result.stream_events():
            pass
        return result.final_output

    assert asyncio.run(main()) == Advice(**ADVICE)
    assert "schema" in json.dumps(server.requests[-1].body.get("response_format") or server.requests[-1].body.get("text"))
    store = instrumented.store
    turn = only_turn(store)
    assert rows(store, turn.session_id) == [
        ("message", "user", "I just lost my card!"),
        ("tool_call_start", "local_time", "call_t", {"city": "Paris"}, None, "pending", None, None),
        ("tool_call_end", "local_time", "call_t", {"city": "Paris"}, TIME_RESULT, "completed", "served", None),
        ("message", "assistant", json.dumps(ADVICE)),
    ]
    assert (turn.segments, turn.response_content) == ([json.dumps(ADVICE)], json.dumps(ADVICE))
    assert [(t.name, t.origin) for t in turn.declared_tools] == [("local_time", "always")]


# -- the model asked for and the model that answered ---------------------------------------------


def call_models(recording: Any) -> list[tuple[str | None, str | None]]:
    """Each stored model call's (request_model, response_model), oldest first."""
    return [(c.request_model, c.response_model) for c in loopscope.Store(str(recording.db)).model_calls()]


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize("api", APIS)
def test_every_call_has_the_model_asked_for_and_the_one_that_answered(api, streamed, instrumented, server, monkeypatch, request):
    """Upstream's examples name no model: the SDK's provider asks for its default, and a dated
    snapshot of it answers. Each call's row says both, the first call's included (it was null,
    and the later ones held the answering model as the one asked for)."""
    monkeypatch.setenv("OPENAI_DEFAULT_MODEL", "gpt-test-default")
    answered = "gpt-test-default-2026-01-01"
    server.queue(
        Reply(text=FIRST_TEXT, tool_calls=[ToolCall("local_time", {"city": "Paris"}, id="call_t")], model=answered),
        Reply(tool_calls=[ToolCall("transfer_to_billing", {}, id="call_h")], model=answered),
        Reply(text=FINAL_TEXT, model="gpt-test-billing-0601"),
    )
    client = AsyncOpenAI(base_url=server.openai_base_url, api_key=API_KEY, max_retries=0)
    billing = Agent(name="billing", instructions="Bill.", model="gpt-test-billing")  # a name the provider resolves
    agent = Agent(name="concierge", instructions="Be brief.", tools=[local_time], handoffs=[billing],
                  model_settings=ModelSettings(include_usage=True) if api == "chat" else ModelSettings())
    config = RunConfig(model_provider=agents.OpenAIProvider(openai_client=client, use_responses=api == "responses"))

    async def main() -> Any:
        if not streamed:
            return (await Runner.run(agent, PROMPT, run_config=config)).final_output
        result = Runner.run_streamed(agent, PROMPT, run_config=config)
        async for _ in result.stream_events():
            pass
        return result.final_output

    assert asyncio.run(main()) == FINAL_TEXT
    assert [r.model for r in server.requests] == ["gpt-test-default", "gpt-test-default", "gpt-test-billing"]
    # without the openai adapter, a Chat Completions answer reaches loopscope only as the
    # SDK's span, which drops the answering model: unknown, not the one asked for
    seen = "with_openai_adapter" in request.node.name or api == "responses"
    assert call_models(instrumented) == [
        ("gpt-test-default", answered if seen else None),
        ("gpt-test-default", answered if seen else None),
        ("gpt-test-billing", "gpt-test-billing-0601" if seen else None),
    ]


# -- failures and limits --------------------------------------------------------------------------


def test_a_failing_tool_is_failed_with_its_error(instrumented, server):
    server.queue(
        Reply(text="Booking.", tool_calls=[ToolCall("book_table", {"city": "Paris"}, id="call_b1")]),
        Reply(text="Booking.", tool_calls=[ToolCall("book_table", {"city": "Rome"}, id="call_b2")]),
        Reply(text="No tables anywhere."),
    )
    agent = concierge(server, tools=[book_table])
    assert Runner.run_sync(agent, "Book Paris").final_output == "No tables anywhere."
    agent = concierge(server, tools=[book_table_explained])  # an error function that shows the error
    server.queue(Reply(text="Booking.", tool_calls=[ToolCall("book_table", {"city": "Rome"}, id="call_b3")]), Reply(text="None."))
    Runner.run_sync(agent, "Book Rome")
    first, second = instrumented.store.list_turns()
    tool_rows = [r for r in rows(instrumented.store, first.session_id) if r[0] == "tool_call_end"]
    # the SDK's own default message for the model (0.25 dropped its "Please try again.")
    default_message = agents.tool.default_tool_error_function(None, RuntimeError("no tables"))  # type: ignore[arg-type]
    redacted = "Error running tool (non-fatal): Tool execution failed. Error details are redacted."
    assert tool_rows == [
        ("tool_call_end", "book_table", "call_b1", {"city": "Paris"}, default_message, "failed", "failed", redacted),
        ("tool_call_end", "book_table", "call_b2", {"city": "Rome"}, default_message, "failed", "failed", redacted),
    ]
    assert (first.loop_end_reason, first.tool_calls_count, first.round_count) == (LoopEndReason.COMPLETED, 2, 2)
    [end] = [r for r in rows(instrumented.store, second.session_id) if r[0] == "tool_call_end"]
    assert end == ("tool_call_end", "book_table", "call_b3", {"city": "Rome"}, "Booking failed: no tables left in Rome",
                   "failed", "failed", "Error running tool (non-fatal): no tables left in Rome")
    failed = [s for s in genai_spans(instrumented) if s.attributes.get(a.TOOL_OUTCOME) == "failed"]
    assert len(failed) == 3 and all(s.status.status_code.name == "ERROR" for s in failed)


def test_a_tool_error_that_stops_the_run_is_an_error(instrumented, server):
    server.queue(Reply(text="Booking.", tool_calls=[ToolCall("book_table", {"city": "Paris"}, id="call_b1")]))
    with pytest.raises(agents.UserError, match="no tables left in Paris"):
        Runner.run_sync(concierge(server, tools=[book_table_strict]), "Book Paris")
    turn = only_turn(instrumented.store)
    assert turn.loop_end_reason == LoopEndReason.ERROR and "no tables left in Paris" in turn.error
    [end] = [r for r in rows(instrumented.store, turn.session_id) if r[0] == "tool_call_end"]
    assert end[5:7] == ("failed", "failed") and "no tables left in Paris" in end[7]


@pytest.mark.parametrize("streamed", [False, True])
def test_max_turns_exceeded_is_max_rounds(streamed, instrumented, server):
    server.queue(*[Reply(text=f"Again {n}.", tool_calls=[ToolCall("local_time", {"city": "Paris"}, id=f"call_{n}")]) for n in range(4)])
    agent = concierge(server, tools=[local_time])

    async def main() -> None:
        if streamed:
            result = Runner.run_streamed(agent, "Loop", max_turns=2)
            async for _ in result.stream_events():
                pass
        else:
            await Runner.run(agent, "Loop", max_turns=2)

    with pytest.raises(MaxTurnsExceeded):
        asyncio.run(main())
    turn = only_turn(instrumented.store)
    assert (turn.loop_end_reason, turn.error) == (LoopEndReason.MAX_ROUNDS, None)
    assert (turn.round_count, turn.tool_calls_count, turn.segments) == (2, 2, ["Again 0.", "Again 1."])
    assert [r[0] for r in rows(instrumented.store, turn.session_id)] == [
        "message", "message", "tool_call_start", "tool_call_end", "message", "tool_call_start", "tool_call_end",
    ]
    assert len(server.requests) == 2


def test_a_model_error_ends_the_turn_as_error(instrumented, server):
    server.queue(Reply.error(500, "the model is down"))
    with pytest.raises(Exception, match="the model is down") as raised:
        Runner.run_sync(concierge(server), PROMPT)
    turn = only_turn(instrumented.store)
    assert turn.loop_end_reason == LoopEndReason.ERROR
    assert turn.error == f"{type(raised.value).__qualname__}: {raised.value}"
    [chat] = [s for s in genai_spans(instrumented) if s.attributes[a.OPERATION] == a.OP_CHAT]
    assert chat.status.status_code.name == "ERROR"


def test_cancellation_is_cancelled(instrumented, server):
    started = asyncio.Event()

    @function_tool
    async def slow_lookup(city: str) -> str:
        """Takes forever."""
        started.set()
        await asyncio.sleep(60)
        return "never"

    server.queue(Reply(tool_calls=[ToolCall("slow_lookup", {"city": "Paris"}, id="call_s")]))

    async def main() -> None:
        task = asyncio.create_task(Runner.run(concierge(server, tools=[slow_lookup]), PROMPT))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    turn = only_turn(instrumented.store)
    assert turn.loop_end_reason == LoopEndReason.CANCELLED
    [end] = [r for r in rows(instrumented.store, turn.session_id) if r[0] == "tool_call_end"]
    assert end[1:3] == ("slow_lookup", "call_s") and end[5:7] == ("failed", "cancelled")


# -- sessions, handoffs, agents as tools, hand turns ----------------------------------------------


def test_group_id_and_loopscope_session_name_the_session(instrumented, server):
    server.queue(Reply(text="One."), Reply(text="Two."), Reply(text="Three."))
    agent = concierge(server)
    Runner.run_sync(agent, "first", run_config=RunConfig(group_id="chat-7"))
    Runner.run_sync(agent, "second", run_config=RunConfig(group_id="chat-7"))
    with loopscope.session("mine"):
        Runner.run_sync(agent, "third", run_config=RunConfig(group_id="chat-7"))
    assert [e.content.body for e in instrumented.store.get_timeline("chat-7")] == ["first", "One.", "second", "Two."]
    assert [e.content.body for e in instrumented.store.get_timeline("mine")] == ["third", "Three."]


def test_an_sdk_session_names_the_session_when_there_is_no_group_id(instrumented, server):
    server.queue(Reply(text="One."), Reply(text="Two."))
    memory = agents.SQLiteSession("conv-3")  # in memory
    agent = concierge(server)
    Runner.run_sync(agent, "first", session=memory)
    Runner.run_sync(agent, "second", session=memory)
    assert [e.content.body for e in instrumented.store.get_timeline("conv-3")] == ["first", "One.", "second", "Two."]
    assert "One." in json.dumps(server.requests[1].body["input"])  # the SDK session did its part


@pytest.mark.parametrize("tool_name", ["transfer_to_billing", "escalate"])
def test_a_handoff_serves_its_call_and_the_next_agent_follows(tool_name, instrumented, server):
    billing = Agent(name="billing", instructions="Bill.", model=make_model(server), tools=[local_time])
    route = billing if tool_name == "transfer_to_billing" else agents.handoff(billing, tool_name_override=tool_name)
    triage = Agent(name="triage", instructions="Route.", model=make_model(server), handoffs=[route])
    server.queue(
        Reply(text="Passing you on.", tool_calls=[ToolCall(tool_name, {}, id="call_h")]),
        Reply(tool_calls=[ToolCall("local_time", {"city": "Paris"}, id="call_t")]),
        Reply(text="Billed at 19:00."),
    )
    result = Runner.run_sync(triage, "Bill me", run_config=RunConfig(group_id="support-1"))
    assert result.final_output == "Billed at 19:00." and result.last_agent is billing
    first, second = sorted(instrumented.store.list_turns(), key=lambda t: t.timestamp)
    assert (first.channel_id, first.loop_end_reason, first.tool_calls_count) == ("triage", LoopEndReason.COMPLETED, 1)
    assert [t.name for t in first.declared_tools] == [tool_name]
    assert first.declared_tools[0].description == server.requests[0].body["tools"][0]["description"]
    assert (second.channel_id, second.loop_end_reason, second.segments) == ("billing", LoopEndReason.COMPLETED, ["Billed at 19:00."])
    assert [t.name for t in second.declared_tools] == ["local_time"]
    assert (second.parent_correlation_id, second.session_id) == (None, first.session_id)
    assert rows(instrumented.store, "support-1") == [
        ("message", "user", "Bill me"),
        ("message", "assistant", "Passing you on."),
        ("tool_call_start", tool_name, "call_h", {}, None, "pending", None, None),
        ("tool_call_end", tool_name, "call_h", {}, {"assistant": "billing"}, "completed", "served", None),
        ("tool_call_start", "local_time", "call_t", {"city": "Paris"}, None, "pending", None, None),
        ("tool_call_end", "local_time", "call_t", {"city": "Paris"}, TIME_RESULT, "completed", "served", None),
        ("message", "assistant", "Billed at 19:00."),
    ]


def test_an_agent_used_as_a_tool_is_a_nested_turn(instrumented, server):
    forecaster = Agent(name="forecaster", instructions="Forecast.", model=make_model(server), tools=[local_time])
    main = concierge(server, tools=[forecaster.as_tool(tool_name="ask_forecaster", tool_description="Ask the forecaster.")])
    server.queue(
        Reply(tool_calls=[ToolCall("ask_forecaster", {"input": "Paris tonight?"}, id="call_a")]),
        Reply(tool_calls=[ToolCall("local_time", {"city": "Paris"}, id="call_t")]),
        Reply(text="Clear at 19:00."),
        Reply(text="Clear skies tonight."),
    )
    assert Runner.run_sync(main, PROMPT).final_output == "Clear skies tonight."
    turns = {t.channel_id: t for t in instrumented.store.list_turns()}
    outer, inner = turns["concierge"], turns["forecaster"]
    assert inner.parent_correlation_id == outer.correlation_id and outer.parent_correlation_id is None
    assert inner.session_id == outer.session_id
    assert (inner.segments, inner.tool_calls_count) == (["Clear at 19:00."], 1)
    assert (outer.segments, outer.tool_calls_count) == (["Clear skies tonight."], 1)
    by_turn = [(e.correlation_id == inner.correlation_id, e.type) for e in instrumented.store.get_timeline(outer.session_id)]
    assert by_turn == [
        (False, "message"), (False, "tool_call_start"), (True, "message"), (True, "tool_call_start"),
        (True, "tool_call_end"), (True, "message"), (False, "tool_call_end"), (False, "message"),
    ]
    spans = {s.name: s for s in genai_spans(instrumented)}
    assert spans["invoke_agent forecaster"].parent.span_id == spans["execute_tool ask_forecaster"].context.span_id


def test_a_run_inside_a_hand_turn_nests_under_it(instrumented, server):
    server.queue(Reply(text="Nested answer."))
    with loopscope.turn(session_id="outer", agent="app", input="go") as hand:
        Runner.run_sync(concierge(server), PROMPT)
        hand.generation("Done.")
    turns = {t.channel_id: t for t in instrumented.store.list_turns("outer")}
    assert turns["concierge"].parent_correlation_id == turns["app"].correlation_id
    assert turns["concierge"].segments == ["Nested answer."] and turns["app"].segments == ["Done."]


def test_concurrent_runs_stay_apart(instrumented, server):
    cities = [f"City{n}" for n in range(8)]
    for n, city in enumerate(cities):
        server.queue(
            Reply(text=f"Checking {city}.", tool_calls=[ToolCall("local_time", {"city": city}, id=f"call_{n}")]),
            Reply(text=f"{city}: 19:00."),
            match=f"[{city}]",
        )
    agent = concierge(server, tools=[local_time])

    async def main() -> list[Any]:
        return await asyncio.gather(*(Runner.run(agent, f"[{city}] time?", run_config=RunConfig(group_id=city)) for city in cities))

    assert [r.final_output for r in asyncio.run(main())] == [f"{city}: 19:00." for city in cities]
    for n, city in enumerate(cities):
        assert rows(instrumented.store, city) == [
            ("message", "user", f"[{city}] time?"),
            ("message", "assistant", f"Checking {city}."),
            ("tool_call_start", "local_time", f"call_{n}", {"city": city}, None, "pending", None, None),
            ("tool_call_end", "local_time", f"call_{n}", {"city": city}, TIME_RESULT, "completed", "served", None),
            ("message", "assistant", f"{city}: 19:00."),
        ]
    assert len(genai_spans(instrumented)) == 8 * 4


def test_with_sdk_tracing_off_the_model_calls_are_still_one_turn(recording, sdk_tracing, server):
    errors = _instrument(recording, sdk_tracing)
    try:
        two_tools(server)
        Runner.run_sync(concierge(server), PROMPT, run_config=RunConfig(tracing_disabled=True))
    finally:
        loopscope.uninstrument()
    turn = only_turn(recording.store)  # stitched by the openai adapter from the calls alone
    assert (turn.channel_id, turn.round_count, turn.tool_calls_count) == (None, 1, 2)
    assert [r[0] for r in rows(recording.store, turn.session_id)] == [
        "message", "message", "tool_call_start", "tool_call_start", "tool_call_end", "tool_call_end", "message",
    ]
    assert _guard.error_count == errors


# -- instrument / uninstrument --------------------------------------------------------------------


def test_instrument_twice_is_once_and_uninstrument_restores(recording, sdk_tracing, server):
    originals = {(cls, name): cls.__dict__[name] for cls, name in PATCHED}
    errors = _instrument(recording, sdk_tracing)
    loopscope.instrument(anthropic=False)
    try:
        assert "openai_agents" in active()
        assert all(cls.__dict__[name] is not originals[cls, name] for cls, name in PATCHED)
        server.queue(Reply(text="Once."))
        Runner.run_sync(concierge(server), PROMPT)
        assert len(recording.store.list_turns()) == 1
    finally:
        loopscope.uninstrument()
    assert all(cls.__dict__[name] is originals[cls, name] for cls, name in PATCHED)
    assert sdk_tracing._multi_processor._processors == ()  # the processor is gone, nothing else touched
    server.queue(Reply(text="Not recorded."))
    Runner.run_sync(concierge(server), PROMPT)
    assert len(recording.store.list_turns()) == 1

    _instrument(recording, sdk_tracing)  # on again: one new processor, the same recording
    try:
        server.queue(Reply(text="Again."))
        Runner.run_sync(concierge(server), PROMPT)
        assert [t.segments for t in recording.store.list_turns()].count(["Again."]) == 1
    finally:
        loopscope.uninstrument()
    assert _guard.error_count == errors


def test_uninstrument_leaves_the_users_processors(recording, sdk_tracing):
    class Mine(agents.TracingProcessor):
        def on_trace_start(self, trace: Any) -> None: ...
        def on_trace_end(self, trace: Any) -> None: ...
        def on_span_start(self, span: Any) -> None: ...
        def on_span_end(self, span: Any) -> None: ...
        def shutdown(self) -> None: ...
        def force_flush(self) -> None: ...

    mine = Mine()
    agents.add_trace_processor(mine)
    loopscope.instrument(anthropic=False)
    ours = sdk_tracing._multi_processor._processors[-1]
    assert isinstance(ours, LoopscopeProcessor)
    later = Mine()
    agents.add_trace_processor(later)
    loopscope.uninstrument()
    assert sdk_tracing._multi_processor._processors == (mine, later)


def test_without_agents_imported_nothing_happens():
    code = (
        "import sys, loopscope\n"
        "from loopscope.instrument import active\n"
        "loopscope.configure(False)\n"
        "names = loopscope.instrument()\n"
        "assert 'openai_agents' in names and 'openai_agents' not in active(), active()\n"
        "assert 'agents' not in sys.modules and 'loopscope.instrument.openai_agents' not in sys.modules\n"
        "import agents\n"
        "assert 'openai_agents' in active()\n"
        "from loopscope.instrument.openai_agents import LoopscopeProcessor\n"
        "processors = agents.tracing.get_trace_provider()._multi_processor._processors\n"
        "assert sum(isinstance(p, LoopscopeProcessor) for p in processors) == 1\n"
        "loopscope.uninstrument()\n"
        "processors = agents.tracing.get_trace_provider()._multi_processor._processors\n"
        "assert not any(isinstance(p, LoopscopeProcessor) for p in processors)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


def test_nothing_reaches_a_hosted_tracing_endpoint(instrumented, server):
    two_tools(server)
    Runner.run_sync(concierge(server), PROMPT)
    assert [r.path for r in server.requests] == ["/v1/responses"] * 2 or [r.path for r in server.requests] == ["/v1/chat/completions"] * 2
    assert all(isinstance(p, LoopscopeProcessor) for p in agents.tracing.get_trace_provider()._multi_processor._processors)
    for span in instrumented.spans():
        assert API_KEY not in json.dumps(dict(span.attributes), default=str)

