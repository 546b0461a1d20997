"""The MCP adapter end to end: a real FastMCP server in process, a real ``ClientSession``
connected to it over memory streams, recorded into a real DuckDB file; standalone, inside
a hand turn, and inside a turn stitched from openai SDK calls to the fake model server."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import anyio
import pytest
from mcp.client.session import ClientSession
from mcp.server.fastmcp import FastMCP
from mcp.shared.exceptions import McpError
from mcp.shared.memory import create_connected_server_and_client_session

import loopscope
from fakes.model_server import Reply, ToolCall
from loopscope import LoopEndReason
from loopscope import semconv as a
from loopscope.instrument import ADAPTERS
from loopscope.models import ToolCall as ModelToolCall
from recorded import rows as tool_rows

# the mcp stack's tests (tests/stacks.toml); one of them is the langchain stack's
pytestmark = pytest.mark.stack("mcp")

WEATHER_RESULT = {"city": "Paris", "temp_c": 21}
BOOM = "Error executing tool book_table: the booking service timed out"
OPENAI_TOOLS = [
    {"type": "function", "function": {"name": "weather", "description": "Current weather for a city.",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "book_table", "description": "Book a table.",
                                      "parameters": {"type": "object", "properties": {"restaurant": {"type": "string"}}}}},
]


def mcp_server() -> FastMCP:
    server = FastMCP("concierge-tools")

    @server.tool()
    def weather(city: str) -> dict:
        """Current weather for a city."""
        return {"city": city, "temp_c": 21}

    @server.tool()
    def book_table(restaurant: str) -> str:
        """Book a table."""
        raise RuntimeError("the booking service timed out")

    @server.tool()
    async def slow(seconds: float) -> str:
        """Takes its time."""
        await anyio.sleep(seconds)
        return "done"

    return server


def only(*names: str) -> dict[str, bool]:
    return {name: name in names for name in ADAPTERS}


@pytest.fixture
def instrumented(recording):
    loopscope.instrument(**only("mcp", "openai"))
    try:
        yield recording
    finally:
        loopscope.uninstrument()


def with_session(body: Any) -> Any:
    async def main() -> Any:
        async with create_connected_server_and_client_session(mcp_server()) as session:
            return await body(session)

    return asyncio.run(main())


def tool_spans(recording: Any) -> list[Any]:
    return [s for s in recording.spans() if s.attributes.get(a.OPERATION) == a.OP_EXECUTE_TOOL]


def stored_calls(recording: Any) -> list[tuple[Any, ...]]:
    loopscope.flush()
    _, found = recording.store.sql(
        "SELECT tool, arguments, result, status, outcome, error FROM tool_calls ORDER BY start_index, started_at"
    )
    return [(t, json.loads(args) if args else None, json.loads(res) if res else None, st, out, err) for t, args, res, st, out, err in found]


# -- standalone calls ---------------------------------------------------------------------------------


def test_each_call_is_a_tool_call_and_an_error_result_is_failed(instrumented):
    async def body(session: ClientSession) -> Any:
        served = await session.call_tool("weather", {"city": "Paris"})
        failed = await session.call_tool("book_table", arguments={"restaurant": "Chez Nous"})
        return served, failed

    served, failed = with_session(body)
    assert not served.isError and json.loads(served.content[0].text) == WEATHER_RESULT  # the caller's result is MCP's
    assert failed.isError and failed.content[0].text == BOOM
    assert sorted(stored_calls(instrumented)) == sorted([
        ("weather", {"city": "Paris"}, WEATHER_RESULT, "completed", "served", None),
        ("book_table", {"restaurant": "Chez Nous"}, BOOM, "failed", "failed", BOOM),
    ])
    spans = tool_spans(instrumented)
    assert [s.attributes[a.TOOL_NAME] for s in spans] == ["weather", "book_table"]
    assert all(s.end_time > s.start_time for s in spans)


def test_an_exception_is_failed_and_reaches_the_caller_unchanged(instrumented):
    raised: list[BaseException] = []

    async def body(session: ClientSession) -> None:
        try:
            await session.call_tool("slow", {"seconds": 5}, read_timeout_seconds=timedelta(seconds=0.05))
        except McpError as exc:
            raised.append(exc)

    with_session(body)
    [exc] = raised
    [call] = stored_calls(instrumented)
    assert call == ("slow", {"seconds": 5}, None, "failed", "failed", f"McpError: {exc}")
    assert "Timed out" in str(exc)


# -- inside turns -------------------------------------------------------------------------------------


def test_calls_serve_what_the_model_asked_for_in_a_hand_turn(instrumented):
    calls = [ModelToolCall(id="call_w1", name="weather", arguments={"city": "Paris"}),
             ModelToolCall(id="call_b1", name="book_table", arguments={"restaurant": "Chez Nous"})]

    async def body(session: ClientSession) -> loopscope.Turn:
        async with loopscope.turn(session_id="s1", agent="concierge", tools=OPENAI_TOOLS, input="Dinner?") as t:
            t.generation("Let me check.", tool_calls=calls, finish_reason="tool_calls")
            await session.call_tool("weather", {"city": "Paris"})
            await session.call_tool("book_table", {"restaurant": "Chez Nous"})
            t.generation("It is 21 °C, but the booking failed.", finish_reason="stop")
        return t

    turn = with_session(body).response
    assert (turn.loop_end_reason, turn.round_count, turn.tool_calls_count) == (LoopEndReason.COMPLETED, 1, 2)
    assert tool_rows(instrumented.store, "s1") == [
        ("message", "user", "Dinner?"),
        ("message", "assistant", "Let me check."),
        ("tool_call_start", "weather", "call_w1", {"city": "Paris"}, None, "pending", None, None),
        ("tool_call_end", "weather", "call_w1", {"city": "Paris"}, WEATHER_RESULT, "completed", "served", None),
        ("tool_call_start", "book_table", "call_b1", {"restaurant": "Chez Nous"}, None, "pending", None, None),
        ("tool_call_end", "book_table", "call_b1", {"restaurant": "Chez Nous"}, BOOM, "failed", "failed", BOOM),
        ("message", "assistant", "It is 21 °C, but the booking failed."),
    ]
    assert len(tool_spans(instrumented)) == 2


def test_calls_serve_a_stitched_openai_turn(instrumented, model_server):
    model_server.queue(
        Reply(text="Let me check.", tool_calls=[ToolCall("weather", {"city": "Paris"}, id="call_w1"),
                                                ToolCall("book_table", {"restaurant": "Chez Nous"}, id="call_b1")]),
        Reply(text="21 °C; the booking service is down."),
    )

    async def body(session: ClientSession) -> str:
        client = model_server.async_openai_client()
        listed = await session.list_tools()
        tools = [{"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.inputSchema}}
                 for t in listed.tools if t.name != "slow"]
        messages: list[Any] = [{"role": "user", "content": "Dinner at Chez Nous?"}]
        while True:
            reply = (await client.chat.completions.create(model="gpt-test-1", messages=messages, tools=tools)).choices[0].message
            messages.append(reply)
            if not reply.tool_calls:
                return reply.content
            for call in reply.tool_calls:
                result = await session.call_tool(call.function.name, json.loads(call.function.arguments))
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result.content[0].text})

    assert with_session(body) == "21 °C; the booking service is down."
    [turn] = instrumented.store.list_turns()
    assert (turn.loop_end_reason, turn.round_count, turn.tool_calls_count) == (LoopEndReason.COMPLETED, 1, 2)
    assert [t.name for t in turn.declared_tools] == ["weather", "book_table"]
    assert tool_rows(instrumented.store, turn.session_id) == [
        ("message", "user", "Dinner at Chez Nous?"),
        ("message", "assistant", "Let me check."),
        ("tool_call_start", "weather", "call_w1", {"city": "Paris"}, None, "pending", None, None),
        ("tool_call_start", "book_table", "call_b1", {"restaurant": "Chez Nous"}, None, "pending", None, None),
        ("tool_call_end", "weather", "call_w1", {"city": "Paris"}, WEATHER_RESULT, "completed", "served", None),
        ("tool_call_end", "book_table", "call_b1", {"restaurant": "Chez Nous"}, BOOM, "failed", "failed", BOOM),
        ("message", "assistant", "21 °C; the booking service is down."),
    ]
    assert len(tool_spans(instrumented)) == 2
    assert [r["id"] for r in model_server.requests[1].tool_results] == ["call_w1", "call_b1"]


@pytest.mark.stack("langchain")  # both libraries: the langchain stack has mcp too (tests/stacks.toml)
def test_a_call_inside_a_langchain_tool_of_that_name_is_that_call(recording, model_server):
    from langchain_core.messages import HumanMessage
    from langchain_core.tools import StructuredTool
    from langchain_openai import ChatOpenAI

    loopscope.instrument(**only("mcp", "langchain"))
    model_server.queue(Reply(tool_calls=[ToolCall("weather", {"city": "Paris"}, id="call_w1")]), Reply(text="21 °C."))

    async def body(session: ClientSession) -> str:
        async def weather(city: str) -> str:
            return (await session.call_tool("weather", {"city": city})).content[0].text

        tool = StructuredTool.from_function(coroutine=weather, name="weather", description="Current weather for a city.")
        model = ChatOpenAI(model="gpt-test-1", base_url=model_server.openai_base_url, api_key="test-key", max_retries=0).bind_tools([tool])
        messages: list[Any] = [HumanMessage("Weather in Paris?")]
        reply = await model.ainvoke(messages)
        messages += [reply, await tool.ainvoke(reply.tool_calls[0])]
        return (await model.ainvoke(messages)).content

    try:
        assert with_session(body) == "21 °C."
    finally:
        loopscope.uninstrument()
    [turn] = recording.store.list_turns()
    assert (turn.loop_end_reason, turn.tool_calls_count) == (LoopEndReason.COMPLETED, 1)
    ends = [r for r in tool_rows(recording.store, turn.session_id) if r[0] == "tool_call_end"]
    assert ends == [("tool_call_end", "weather", "call_w1", {"city": "Paris"}, WEATHER_RESULT, "completed", "served", None)]
    assert len(tool_spans(recording)) == 1


# -- instrument / uninstrument ------------------------------------------------------------------------


def test_instrument_twice_is_once_and_uninstrument_restores(recording):
    original = ClientSession.__dict__["call_tool"]

    async def call(session: ClientSession) -> None:
        await session.call_tool("weather", {"city": "Paris"})

    loopscope.instrument(**only("mcp"))
    loopscope.instrument(**only("mcp"))
    try:
        assert ClientSession.__dict__["call_tool"] is not original
        assert ClientSession.__dict__["call_tool"].__wrapped__ is original  # wrapped once, not twice
        with_session(call)
        assert len(tool_spans(recording)) == 1
    finally:
        loopscope.uninstrument()
    assert ClientSession.__dict__["call_tool"] is original
    with_session(call)
    assert len(tool_spans(recording)) == 1
    loopscope.instrument(**only("mcp"))
    try:
        with_session(call)
        assert len(tool_spans(recording)) == 2
    finally:
        loopscope.uninstrument()
    assert ClientSession.__dict__["call_tool"] is original
