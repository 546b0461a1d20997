"""An internal error injected under each framework adapter (issue 7): the framework's call
returns exactly what it returns uninstrumented. The faults sit in the recorder parts
every adapter goes through (span start and end, JSON, the turn summary, the model-call
placement), with strict mode off as in production; each case checks the fault was hit."""

from __future__ import annotations

import asyncio
import importlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import loopscope
import stacks
from fakes.model_server import Reply, ToolCall
from loopscope import _guard, semconv

registry = importlib.import_module("loopscope.instrument")
spans_module = importlib.import_module("loopscope._otel_sdk")
json_module = importlib.import_module("loopscope._json")
stitch_module = importlib.import_module("loopscope.recorder.stitch")
calls_module = importlib.import_module("loopscope.instrument._calls")
foreign_module = importlib.import_module("loopscope.ingest.foreign")


def _boom(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("injected internal error")


FAULTS: dict[str, list[tuple[Any, str]]] = {
    "span start": [(spans_module, "_fast_start")],
    "span end": [(spans_module, "_fast_end"), (spans_module, "set_attributes")],
    "json": [(json_module, "dumps")],
    "turn summary": [(semconv, "turn_attributes")],
    "model call placement": [(stitch_module, "start_model_call"), (calls_module, "start_model_call")],
    # pydantic-ai records its own spans; loopscope's part is the store's assembler of them
    "foreign spans": [(foreign_module.Assembler, "add")],
}
# the adapter's own reading code, per framework (module, attribute path)
ADAPTER_CODE: dict[str, list[tuple[str, str]]] = {
    "langchain": [("loopscope.instrument.langchain", "_usage"), ("loopscope.instrument.langchain", "_request")],
    "mcp": [("loopscope.instrument.mcp", "_content")],
    "openai_agents": [("loopscope.instrument.openai_agents", "_input_text"), ("loopscope.instrument.openai_agents", "_tool_spec")],
    "pydantic_ai": [("loopscope.instrument.pydantic_ai", "_LiveTracer._current")],
    "toolnexus": [("loopscope.instrument.toolnexus", "_result_of"), ("loopscope.instrument.toolnexus", "_text_of")],
    "roomkit": [("loopscope.instrument.roomkit", "_Turns.row"), ("loopscope.instrument.roomkit", "_Turns.response")],
}
NOT_ON_PATH = {
    ("mcp", "model call placement"),  # no model call at all
    ("toolnexus", "model call placement"),  # its in-process model calls no SDK
    ("roomkit", "model call placement"),  # RoomKit's mock provider calls no SDK
    ("pydantic_ai", "span start"),  # pydantic-ai's spans are its own
    ("pydantic_ai", "span end"),
    ("pydantic_ai", "model call placement"),  # the SDK adapter stands aside for pydantic-ai
}


def _queue(server: Any) -> None:
    server.queue(
        Reply(text="Checking.", tool_calls=[ToolCall("weather", {"city": "Paris"}, id="call_w1")]),
        Reply(text="Sunny in Paris."),
    )


def weather(city: str) -> str:
    """Current weather for a city."""
    return json.dumps({"city": city, "temp_c": 21})


def _langchain(server: Any) -> Any:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    lc_weather = tool(weather)
    model = ChatOpenAI(model="m", base_url=server.openai_base_url, api_key="test-key", max_retries=0).bind_tools([lc_weather])
    messages: list[Any] = [HumanMessage("Weather?")]
    reply = model.invoke(messages)
    messages.append(reply)
    for call in reply.tool_calls:
        messages.append(ToolMessage(lc_weather.invoke(call["args"]), tool_call_id=call["id"]))
    return [reply.tool_calls, model.invoke(messages).content]


def _mcp(server: Any) -> Any:
    from mcp.server.fastmcp import FastMCP
    from mcp.shared.memory import create_connected_server_and_client_session

    app = FastMCP("faults")
    app.tool()(weather)

    async def main() -> Any:
        async with create_connected_server_and_client_session(app._mcp_server) as session:
            async with loopscope.turn(session_id="mcp-faults", agent="mcp-agent"):  # the call joins a turn
                result = await session.call_tool("weather", {"city": "Paris"})
            return [result.isError, [c.model_dump() for c in result.content]]

    return asyncio.run(main())


def _openai_agents(server: Any) -> Any:
    import agents
    from openai import AsyncOpenAI

    model = agents.OpenAIChatCompletionsModel("m", AsyncOpenAI(base_url=server.openai_base_url, api_key="test-key", max_retries=0))
    agent = agents.Agent(name="concierge", instructions="Be brief.", tools=[agents.function_tool(weather)], model=model)
    result = agents.Runner.run_sync(agent, "Weather?")
    return [result.final_output, [type(item).__name__ for item in result.new_items]]


def _pydantic_ai(server: Any) -> Any:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    agent = Agent(OpenAIChatModel("m", provider=OpenAIProvider(base_url=server.openai_base_url, api_key="test-key")))
    agent.tool_plain(weather)
    result = agent.run_sync("Weather?")
    return [result.output, len(result.all_messages())]


def _toolnexus(server: Any) -> Any:
    import toolnexus

    def generate(request: dict[str, Any]) -> dict[str, Any]:
        if request["messages"][-1]["role"] == "user":
            return {"tool_calls": [{"id": "call_w", "name": "weather", "arguments": {"city": "Paris"}}]}
        return {"content": f"done after {len(request['messages'])} messages"}

    async def main() -> Any:
        client = toolnexus.create_in_process_client(model="in-proc", generate=generate)
        tk = await toolnexus.create_toolkit(builtins=False, extra_tools=[toolnexus.tool(weather)])
        result = await client.ask("Weather?", tk, id="conv-faults")
        return result.text

    return asyncio.run(main())


def _roomkit(server: Any) -> Any:
    import test_roomkit as rk  # its kit, room and channel set-up
    from roomkit.providers.ai import MockAIProvider
    from roomkit.providers.ai.base import AIResponse, AIToolCall

    provider = MockAIProvider(ai_responses=[
        AIResponse(content="Checking.", tool_calls=[AIToolCall(id="call_w", name="weather", arguments={"city": "Paris"})],
                   usage={"input_tokens": 10, "output_tokens": 2}, finish_reason="tool_calls"),
        AIResponse(content="Sunny in Paris.", usage={"input_tokens": 20, "output_tokens": 3}, finish_reason="stop"),
    ])
    r, rows = rk.run(provider)
    # what RoomKit itself did and said: its rows (ids and times aside) and its turn summary
    return [
        [(row.type, getattr(row.content, "body", None), getattr(row.content, "outcome", None)) for row in rows],
        [(e.response_content, e.tool_calls_count, e.loop_end_reason) for e in r.responses],
    ]


SCENARIOS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "roomkit": ("roomkit", _roomkit),
    "langchain": ("langchain_core", _langchain),
    "mcp": ("mcp", _mcp),
    "openai_agents": ("agents", _openai_agents),
    "pydantic_ai": ("pydantic_ai", _pydantic_ai),
    "toolnexus": ("toolnexus", _toolnexus),
}


@pytest.fixture
def no_agents_export(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The Agents SDK's default trace exporter is set aside (it would call OpenAI's backend)."""
    try:
        import agents
    except ImportError:
        yield
        return
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    provider = agents.tracing.get_trace_provider()
    before = list(provider._multi_processor._processors)
    agents.set_trace_processors([])
    try:
        yield
    finally:
        agents.set_trace_processors(before)


# each framework's cases run in its own stack's venv (tests/stacks.toml), where its library is
@pytest.mark.parametrize("framework", [pytest.param(f, marks=pytest.mark.stack(stacks.of_adapter(f))) for f in sorted(SCENARIOS)])
@pytest.mark.parametrize("fault", [*sorted(FAULTS), "adapter code"])
def test_an_internal_error_under_a_framework_changes_nothing_for_the_app(
    recording, model_server, quiet, no_agents_export, monkeypatch, framework: str, fault: str
) -> None:
    target, scenario = SCENARIOS[framework]
    importlib.import_module(target)  # its stack has it: a missing library fails, not skips
    _queue(model_server)
    expected = scenario(model_server)  # uninstrumented
    if fault == "adapter code":
        targets = []
        for module, path in ADAPTER_CODE[framework]:
            owner: Any = importlib.import_module(module)
            *parents, name = path.split(".")
            for parent in parents:
                owner = getattr(owner, parent)
            targets.append((owner, name))
    else:
        targets = FAULTS[fault]
    for owner, name in targets:
        monkeypatch.setattr(owner, name, _boom)
    before = _guard.error_count
    loopscope.instrument(**{other: other in (framework, "openai") for other in registry.ADAPTERS})
    try:
        _queue(model_server)
        got = scenario(model_server)
    finally:
        loopscope.uninstrument()
    assert got == expected
    loopscope.flush(timeout=5)
    if (framework, fault) not in NOT_ON_PATH and (fault != "foreign spans" or framework == "pydantic_ai"):
        assert _guard.error_count > before, f"the fault in {fault} was not reached under {framework}"
