"""The LangChain adapter end to end: a real ChatOpenAI against the fake model server on
127.0.0.1, real ``@tool`` tools and runnables, recorded into a real DuckDB file; with the
openai adapter off, and on (ChatOpenAI calls the openai SDK underneath)."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from typing import Any

import pytest
import tiktoken
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import ToolException, tool
from langchain_core.tracers import context as lc_context
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_openai import ChatOpenAI

import loopscope
from fakes.model_server import Reply, ToolCall, Usage
from loopscope import LoopEndReason
from loopscope import semconv as a
from loopscope.instrument import ADAPTERS
from loopscope.models import ToolCall as ModelToolCall
from recorded import only_turn, rows, spans_of

MODEL = "gpt-test-1"
PROMPT = "Dinner outside in Paris tonight?"
FIRST_TEXT = "Let me check."
FINAL_TEXT = "21 °C and dry, and it is 19:30: a terrace works."
WEATHER_RESULT = {"city": "Paris", "temp_c": 21}
FIRST_USAGE = Usage(100, 20, cached_tokens=30, reasoning_tokens=5)
SECOND_USAGE = Usage(150, 10, cached_tokens=60)
TURN_USAGE = {"input_tokens": 250, "output_tokens": 30, "cache_read_input_tokens": 90, "cache_creation_input_tokens": 0, "reasoning_tokens": 5}


@tool
def weather(city: str) -> dict:
    """Current weather for a city."""
    return {"city": city, "temp_c": 21}


@tool
def local_time(city: str) -> str:
    """Local time in a city."""
    return "19:30"


@tool
def book_table(restaurant: str) -> str:
    """Book a table."""
    raise ToolException("the booking service timed out")


@tool
async def aweather(city: str) -> dict:
    """Current weather for a city."""
    await asyncio.sleep(0)
    return {"city": city, "temp_c": 21}


TOOLS = {t.name: t for t in (weather, local_time, book_table)}
OPENAI_TOOLS = [convert_to_openai_tool(t) for t in (weather, local_time)]
SUMMARY_FIELDS = {
    "response_content", "segments", "tool_calls_count", "round_count", "usage", "thinking", "loop_end_reason",
    "streaming", "declared_tools", "model", "provider", "error", "channel_id", "parent_correlation_id",
}


# -- fixtures: offline, and which adapters are on --------------------------------------------------


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """No LangSmith, no tiktoken download, no connection beyond loopback: any attempt fails the test."""
    for name in ("LANGCHAIN_TRACING_V2", "LANGCHAIN_TRACING", "LANGSMITH_TRACING", "LANGSMITH_TRACING_V2",
                 "LANGCHAIN_API_KEY", "LANGSMITH_API_KEY", "LANGCHAIN_ENDPOINT", "LANGSMITH_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    attempts: list[Any] = []
    connect = socket.socket.connect

    def loopback_only(self: socket.socket, address: Any) -> Any:
        if self.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in ("127.0.0.1", "::1", "localhost"):
            attempts.append(address)
            raise OSError(f"test: no connection to {address!r}")
        return connect(self, address)

    def no_tiktoken(*args: Any, **kwargs: Any) -> Any:
        attempts.append(("tiktoken", args))
        raise AssertionError("tiktoken is not needed")

    monkeypatch.setattr(socket.socket, "connect", loopback_only)
    monkeypatch.setattr(tiktoken, "get_encoding", no_tiktoken)
    monkeypatch.setattr(tiktoken, "encoding_for_model", no_tiktoken)
    yield
    assert attempts == []


def only(*names: str) -> dict[str, bool]:
    return {name: name in names for name in ADAPTERS}


@pytest.fixture(params=["langchain", "langchain+openai"])
def adapters(request, recording):
    """The langchain adapter alone, and with the openai adapter under it."""
    loopscope.instrument(**only(*request.param.split("+")))
    try:
        yield request.param
    finally:
        loopscope.uninstrument()


@pytest.fixture
def lc_only(recording):
    loopscope.instrument(**only("langchain"))
    try:
        yield recording
    finally:
        loopscope.uninstrument()



def chat_model(server: Any, **kwargs: Any) -> ChatOpenAI:
    return ChatOpenAI(model=MODEL, base_url=server.openai_base_url, api_key="test-key", max_retries=0, **kwargs)


def two_rounds(server: Any) -> None:
    server.queue(
        Reply(text=FIRST_TEXT, tool_calls=[ToolCall("weather", {"city": "Paris"}, id="call_w1"), ToolCall("local_time", {"city": "Paris"}, id="call_t1")],
              usage=FIRST_USAGE),
        Reply(text=FINAL_TEXT, usage=SECOND_USAGE),
    )


# -- reading what was recorded ---------------------------------------------------------------------


TWO_TOOL_ROWS = [
    ("message", "user", PROMPT),
    ("message", "assistant", FIRST_TEXT),
    ("tool_call_start", "weather", "call_w1", {"city": "Paris"}, None, "pending", None, None),
    ("tool_call_start", "local_time", "call_t1", {"city": "Paris"}, None, "pending", None, None),
    ("tool_call_end", "weather", "call_w1", {"city": "Paris"}, WEATHER_RESULT, "completed", "served", None),
    ("tool_call_end", "local_time", "call_t1", {"city": "Paris"}, "19:30", "completed", "served", None),
    ("message", "assistant", FINAL_TEXT),
]


def hand_summary(*, streaming: bool) -> dict[str, Any]:
    """The same two rounds through the hand API: what the adapter's summary must equal."""

    @loopscope.tool("weather")
    def hand_weather(city: str) -> dict:
        return {"city": city, "temp_c": 21}

    @loopscope.tool("local_time")
    def hand_time(city: str) -> str:
        return "19:30"

    first = {"input_tokens": 100, "output_tokens": 20, "cache_read_input_tokens": 30, "cache_creation_input_tokens": 0, "reasoning_tokens": 5}
    second = {"input_tokens": 150, "output_tokens": 10, "cache_read_input_tokens": 60, "cache_creation_input_tokens": 0, "reasoning_tokens": 0}
    calls = [ModelToolCall(id="call_w1", name="weather", arguments={"city": "Paris"}), ModelToolCall(id="call_t1", name="local_time", arguments={"city": "Paris"})]
    with loopscope.turn(session_id="hand", tools=OPENAI_TOOLS, input=PROMPT, model=MODEL, provider="openai") as t:
        with t.round(MODEL, provider="openai", stream=streaming) as rnd:
            rnd.response(FIRST_TEXT, calls, first, "tool_calls", model=MODEL)
        hand_weather("Paris")
        hand_time("Paris")
        with t.round(MODEL, provider="openai", stream=streaming) as rnd:
            rnd.response(FINAL_TEXT, None, second, "stop", model=MODEL)
    return t.response.model_dump(include=SUMMARY_FIELDS)


def check_two_tool_turn(recording: Any, server: Any, adapters: str, *, streaming: bool = False, agent: str | None = None) -> Any:
    store = recording.store
    turn = only_turn(store)
    assert rows(store, turn.session_id) == TWO_TOOL_ROWS
    assert (turn.loop_end_reason, turn.round_count, turn.tool_calls_count) == (LoopEndReason.COMPLETED, 1, 2)
    assert turn.segments == [FIRST_TEXT, FINAL_TEXT] and turn.response_content == f"{FIRST_TEXT}\n\n{FINAL_TEXT}"
    assert turn.usage == TURN_USAGE
    assert (turn.model, turn.provider, turn.streaming, turn.channel_id, turn.error) == (MODEL, "openai", streaming, agent, None)
    assert [(t.name, t.description) for t in turn.declared_tools] == [("weather", "Current weather for a city."), ("local_time", "Local time in a city.")]
    assert turn.declared_tools[0].parameters == {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    events = store.get_timeline(turn.session_id)
    assert {e.correlation_id for e in events} == {turn.correlation_id}
    assert {e.source.framework for e in events if e.type == "message"} == {"langchain"}
    ends = [e.content for e in events if e.type == "tool_call_end"]
    assert all(c.duration_ms is not None and c.duration_ms >= 0 for c in ends)
    expected = hand_summary(streaming=streaming)
    assert turn.model_dump(include=SUMMARY_FIELDS) == {**expected, "channel_id": agent}

    # one span per model call, whichever adapters are on, in one tree
    [agent_span] = [s for s in spans_of(recording, a.OP_INVOKE_AGENT) if s.attributes[a.CONVERSATION_ID] == turn.session_id]
    chats = [s for s in spans_of(recording, a.OP_CHAT) if s.attributes[a.CONVERSATION_ID] == turn.session_id]
    tools = [s for s in spans_of(recording, a.OP_EXECUTE_TOOL) if s.attributes.get(a.CONVERSATION_ID) == turn.session_id]
    assert (len(chats), len(tools), len(server.requests)) == (2, 2, 2)
    assert all(s.parent.span_id == agent_span.context.span_id for s in chats + tools)
    assert {s.context.trace_id for s in chats + tools} == {agent_span.context.trace_id}
    first = chats[0].attributes
    assert first[a.FRAMEWORK] == "langchain" and first[a.REQUEST_MODEL] == MODEL and first[a.RESPONSE_FINISH_REASONS] == ("tool_calls",)
    assert first.get(a.REQUEST_STREAM, False) is streaming
    if "openai" in adapters:  # the SDK adapter filled the round: it knows the server
        assert first["server.address"] == "127.0.0.1" and first["server.port"] == server.port
    else:
        assert "server.address" not in first
    return turn


# -- a hand-written loop: bind_tools -> tools -> ToolMessage -> model -----------------------------


def test_hand_written_two_tool_loop_is_one_turn(adapters, recording, server):
    two_rounds(server)
    model = chat_model(server).bind_tools([weather, local_time])
    messages: list[Any] = [HumanMessage(PROMPT)]
    reply = model.invoke(messages)
    assert [c["id"] for c in reply.tool_calls] == ["call_w1", "call_t1"]
    messages.append(reply)
    for call in reply.tool_calls:
        messages.append(TOOLS[call["name"]].invoke(call))
    assert model.invoke(messages).content == FINAL_TEXT
    check_two_tool_turn(recording, server, adapters)
    assert [r["id"] for r in server.requests[1].tool_results] == ["call_w1", "call_t1"]


def test_async_loop_is_one_turn(adapters, recording, server):
    two_rounds(server)

    async def main() -> str:
        model = chat_model(server).bind_tools([weather, local_time])
        messages: list[Any] = [HumanMessage(PROMPT)]
        reply = await model.ainvoke(messages)
        messages.append(reply)
        results = await asyncio.gather(*(TOOLS[c["name"]].ainvoke(c) for c in reply.tool_calls))
        messages.extend(results)
        return (await model.ainvoke(messages)).content

    assert asyncio.run(main()) == FINAL_TEXT
    check_two_tool_turn(recording, server, adapters)


@pytest.mark.parametrize("is_async", [False, True])
def test_streamed_loop_is_one_turn(is_async, adapters, recording, server):
    two_rounds(server)
    model = chat_model(server, stream_usage=True).bind_tools([weather, local_time])

    def merged(chunks: list[Any]) -> Any:
        assert len(chunks) > 2
        full = chunks[0]
        for chunk in chunks[1:]:
            full = full + chunk
        return full

    def extend(messages: list[Any], reply: Any) -> None:
        messages.append(AIMessage(content=reply.content, tool_calls=reply.tool_calls))
        messages.extend(TOOLS[call["name"]].invoke(call) for call in reply.tool_calls)

    async def aloop() -> str:
        messages: list[Any] = [HumanMessage(PROMPT)]
        extend(messages, merged([chunk async for chunk in model.astream(messages)]))
        return merged([chunk async for chunk in model.astream(messages)]).content

    def loop() -> str:
        messages: list[Any] = [HumanMessage(PROMPT)]
        extend(messages, merged(list(model.stream(messages))))
        return merged(list(model.stream(messages))).content

    assert (asyncio.run(aloop()) if is_async else loop()) == FINAL_TEXT
    check_two_tool_turn(recording, server, adapters, streaming=True)


def test_session_names_the_stitched_turn(lc_only, server):
    server.queue(Reply(text="Hello."))
    with loopscope.session("conv-7"):
        chat_model(server).invoke("hi")
    turn = only_turn(lc_only.store)
    assert (turn.session_id, turn.loop_end_reason, turn.segments) == ("conv-7", LoopEndReason.COMPLETED, ["Hello."])
    assert rows(lc_only.store, "conv-7") == [("message", "user", "hi"), ("message", "assistant", "Hello.")]


# -- runnables: an agent as one root run, and a chain per step --------------------------------------


def test_an_agent_run_is_one_turn(adapters, recording, server):
    two_rounds(server)
    model = chat_model(server).bind_tools([weather, local_time])

    def concierge(question: str) -> str:
        messages: list[Any] = [HumanMessage(question)]
        while True:
            reply = model.invoke(messages)
            messages.append(reply)
            if not reply.tool_calls:
                return reply.content
            messages.extend(TOOLS[c["name"]].invoke(c) for c in reply.tool_calls)

    agent = RunnableLambda(concierge, name="concierge")
    assert agent.invoke(PROMPT) == FINAL_TEXT
    check_two_tool_turn(recording, server, adapters, agent="concierge")


def test_a_chain_invoked_per_step_is_one_turn(adapters, recording, server):
    two_rounds(server)
    prompt = ChatPromptTemplate.from_messages([("system", "You are a concierge."), MessagesPlaceholder("messages")])
    chain = prompt | chat_model(server).bind_tools([weather, local_time])
    messages: list[Any] = [HumanMessage(PROMPT)]
    reply = chain.invoke({"messages": messages})
    messages.append(reply)
    # the first run ended while the model's calls were pending: the turn waits for them
    assert recording.store.list_turns() == []
    messages.extend(TOOLS[c["name"]].invoke(c) for c in reply.tool_calls)
    assert chain.invoke({"messages": messages}).content == FINAL_TEXT
    check_two_tool_turn(recording, server, adapters)


def test_a_run_that_serves_the_pending_calls_and_answers_ends_the_turn(lc_only, server):
    two_rounds(server)
    model = chat_model(server).bind_tools([weather, local_time])

    def act(messages: list[Any]) -> Any:
        results = [TOOLS[c["name"]].invoke(c) for c in messages[-1].tool_calls]
        return model.invoke([*messages, *results])

    messages: list[Any] = [HumanMessage(PROMPT)]
    messages.append(RunnableLambda(model.invoke, name="concierge").invoke(messages))
    assert RunnableLambda(act, name="concierge").invoke(messages).content == FINAL_TEXT
    check_two_tool_turn(lc_only, server, "langchain", agent="concierge")


def test_a_root_run_without_a_model_is_no_turn(lc_only, server):
    prompt = ChatPromptTemplate.from_messages([("human", "{question}")])
    assert prompt.invoke({"question": "hi"}).to_messages()[0].content == "hi"
    assert weather.invoke({"city": "Oslo"}) == {"city": "Oslo", "temp_c": 21}
    loopscope.flush()
    assert lc_only.store.list_turns() == []
    [call] = spans_of(lc_only, a.OP_EXECUTE_TOOL)  # a tool run on its own is still a tool call
    assert (call.attributes[a.TOOL_NAME], json.loads(call.attributes[a.TOOL_CALL_RESULT])) == ("weather", {"city": "Oslo", "temp_c": 21})


def test_calls_inside_a_hand_turn_join_it(lc_only, server):
    server.queue(Reply(text=FIRST_TEXT, tool_calls=[ToolCall("weather", {"city": "Paris"}, id="call_w1")]), Reply(text="Done."))
    model = chat_model(server).bind_tools([weather])
    with loopscope.turn(session_id="s1", agent="concierge", input=PROMPT) as t:
        messages: list[Any] = [HumanMessage(PROMPT)]
        reply = model.invoke(messages)
        messages += [reply, weather.invoke(reply.tool_calls[0])]
        model.invoke(messages)
    summary = t.response
    assert (summary.loop_end_reason, summary.round_count, summary.tool_calls_count, summary.segments) == (
        LoopEndReason.COMPLETED, 1, 1, [FIRST_TEXT, "Done."])
    assert [tool.name for tool in summary.declared_tools] == ["weather"]
    assert only_turn(lc_only.store).channel_id == "concierge"
    assert [r[0] for r in rows(lc_only.store, "s1")] == ["message", "message", "tool_call_start", "tool_call_end", "message"]


# -- failures ---------------------------------------------------------------------------------------


def test_a_failing_tool_is_failed_and_the_loop_goes_on(adapters, recording, server):
    server.queue(
        Reply(tool_calls=[ToolCall("book_table", {"restaurant": "Chez Nous"}, id="call_b1")]),
        Reply(text="The booking service is down; try again later."),
    )
    model = chat_model(server).bind_tools([book_table])
    messages: list[Any] = [HumanMessage("Book Chez Nous")]
    reply = model.invoke(messages)
    with pytest.raises(ToolException) as raised:
        book_table.invoke(reply.tool_calls[0])
    messages += [reply, ToolMessage(str(raised.value), tool_call_id="call_b1", status="error")]
    model.invoke(messages)
    turn = only_turn(recording.store)
    assert (turn.loop_end_reason, turn.tool_calls_count, turn.round_count) == (LoopEndReason.COMPLETED, 1, 1)
    end = [r for r in rows(recording.store, turn.session_id) if r[0] == "tool_call_end"]
    assert end == [("tool_call_end", "book_table", "call_b1", {"restaurant": "Chez Nous"}, None, "failed", "failed",
                    "ToolException: the booking service timed out")]


def test_a_tool_error_handled_by_langchain_is_failed(lc_only, server):
    handled = book_table.model_copy(update={"handle_tool_error": True})
    server.queue(Reply(tool_calls=[ToolCall("book_table", {"restaurant": "Chez Nous"}, id="call_b1")]), Reply(text="Sorry."))
    model = chat_model(server).bind_tools([handled])
    messages: list[Any] = [HumanMessage("Book Chez Nous")]
    reply = model.invoke(messages)
    result = handled.invoke(reply.tool_calls[0])
    assert (result.status, result.content) == ("error", "the booking service timed out")
    model.invoke([*messages, reply, result])
    turn = only_turn(lc_only.store)
    end = [r for r in rows(lc_only.store, turn.session_id) if r[0] == "tool_call_end"]
    assert end == [("tool_call_end", "book_table", "call_b1", {"restaurant": "Chez Nous"}, "the booking service timed out",
                    "failed", "failed", "the booking service timed out")]


def test_model_errors_reach_the_user_and_end_the_turn(adapters, recording, server):
    import openai

    server.queue(Reply.error(500))
    with pytest.raises(openai.InternalServerError) as raised:
        chat_model(server).invoke("hi")
    turn = only_turn(recording.store)
    assert turn.loop_end_reason == LoopEndReason.ERROR and turn.error.startswith(type(raised.value).__qualname__ + ": Error code: 500")
    [chat] = spans_of(recording, a.OP_CHAT)
    assert chat.attributes[a.ERROR_TYPE] == type(raised.value).__qualname__


def test_an_agent_run_that_raises_is_an_error(lc_only, server):
    boom = LookupError("the concierge gave up")
    server.queue(Reply(text="Thinking."))
    model = chat_model(server)

    def concierge(question: str) -> str:
        model.invoke(question)
        raise boom

    with pytest.raises(LookupError) as raised:
        RunnableLambda(concierge, name="concierge").invoke("hi")
    assert raised.value is boom
    turn = only_turn(lc_only.store)
    assert (turn.loop_end_reason, turn.error, turn.channel_id, turn.segments) == (
        LoopEndReason.ERROR, "LookupError: the concierge gave up", "concierge", ["Thinking."])


def test_an_agent_run_that_stops_with_calls_pending_is_unfinished(lc_only, server):
    server.queue(Reply(tool_calls=[ToolCall("weather", {"city": "Oslo"}, id="call_u1")]))
    model = chat_model(server).bind_tools([weather])
    RunnableLambda(lambda q: model.invoke(q).tool_calls, name="planner").invoke("Weather in Oslo?")
    assert lc_only.store.list_turns() == []  # waiting for the call's result, as a stitched turn does
    loopscope.shutdown()
    store = loopscope.Store(str(lc_only.db))
    turn = only_turn(store)
    assert (turn.loop_end_reason, turn.channel_id, turn.tool_calls_count) == (LoopEndReason.UNFINISHED, "planner", 0)
    assert [r[6] for r in rows(store, turn.session_id) if r[0] == "tool_call_end"] == ["unserved"]


def test_a_stream_closed_early_is_cancelled(adapters, recording, server):
    server.queue(Reply(text="one two three four five six seven eight nine ten", chunk_size=3))
    stream = chat_model(server).stream("count")
    next(stream)
    stream.close()
    turn = only_turn(recording.store)
    assert turn.loop_end_reason == LoopEndReason.CANCELLED and turn.streaming is True
    assert len(spans_of(recording, a.OP_CHAT)) == 1


# -- instrument / uninstrument -----------------------------------------------------------------------


def _ours() -> list[Any]:
    from loopscope.instrument.langchain import LoopscopeCallbackHandler

    return [entry for entry in lc_context._configure_hooks if isinstance(entry[0].get(), LoopscopeCallbackHandler)]


def test_instrument_twice_is_once_and_uninstrument_removes_the_handler(recording, server):
    before = list(lc_context._configure_hooks)
    server.queue(Reply(text="one"), Reply(text="two"), Reply(text="three"))
    loopscope.instrument(**only("langchain"))
    loopscope.instrument(**only("langchain"))
    try:
        assert len(_ours()) == 1 and len(lc_context._configure_hooks) == len(before) + 1
        chat_model(server).invoke("hi")
        assert len(spans_of(recording, a.OP_CHAT)) == 1
    finally:
        loopscope.uninstrument()
    assert lc_context._configure_hooks == before and _ours() == []
    chat_model(server).invoke("hi")
    assert len(spans_of(recording, a.OP_CHAT)) == 1
    loopscope.instrument(**only("langchain"))
    try:
        chat_model(server).invoke("hi")
        assert len(spans_of(recording, a.OP_CHAT)) == 2 and len(_ours()) == 1
    finally:
        loopscope.uninstrument()
    assert lc_context._configure_hooks == before


def test_nothing_happens_until_langchain_is_imported(tmp_path):
    code = (
        "import sys, loopscope\n"
        f"loopscope.configure({str(tmp_path / 'x.duckdb')!r})\n"
        "loopscope.instrument()\n"
        "assert 'langchain_core' not in sys.modules and 'mcp' not in sys.modules, 'imported too early'\n"
        "from loopscope.instrument import active\n"
        "assert 'langchain' not in active() and 'mcp' not in active()\n"
        "import langchain_core.messages, mcp\n"
        "assert 'langchain' in active() and 'mcp' in active(), active()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
