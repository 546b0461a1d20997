"""The RoomKit adapter end to end: real RoomKit kits with its MockAIProvider (no network), or
with its OpenAI / Anthropic providers against the fake model server on 127.0.0.1, recorded
into a real DuckDB file and compared field by field with what RoomKit itself reported (the
AIResponseEvent its ON_AI_RESPONSE hooks get, its persisted tool rows)."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import subprocess
import sys
from typing import Any

import pytest
from roomkit import (
    AIChannel,
    ChannelCategory,
    HookExecution,
    HookTrigger,
    InboundMessage,
    RoomKit,
    TextContent,
    ToolRefusedError,
    WebSocketChannel,
)
from roomkit.core.mixins._streaming_segments import SegmentWriter
from roomkit.models.enums import EventType
from roomkit.providers.ai import MockAIProvider
from roomkit.providers.ai.base import AIResponse, AITool, AIToolCall
from roomkit.telemetry.config import TelemetryConfig
from roomkit.telemetry.mock import MockTelemetryProvider

import loopscope
from loopscope import _guard
from loopscope import semconv as a
from loopscope.instrument import ADAPTERS

ROOM = "room-1"
AGENT = "assistant"
CITY_PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [
    AITool(name="weather", description="Weather for a city", parameters=CITY_PARAMS),
    AITool(name="book", description="Book a table", parameters={"type": "object", "properties": {"at": {"type": "string"}}}),
]
TOOL_ROWS = (EventType.TOOL_CALL_START, EventType.TOOL_CALL_END)


def only_roomkit() -> dict[str, bool]:
    return {name: name == "roomkit" for name in ADAPTERS}


@pytest.fixture
def instrumented(recording):
    errors = _guard.error_count
    loopscope.instrument(**only_roomkit())
    try:
        yield recording
    finally:
        loopscope.uninstrument()
    # hooks swallow what they raise: a strict-mode internal error shows here instead
    assert _guard.error_count == errors


async def tools(name: str, arguments: dict[str, Any]) -> str:
    await asyncio.sleep(0.02 if name == "weather" else 0.005)
    if name == "book":
        raise RuntimeError("the booking service timed out")
    city = arguments.get("city", "?")
    return f'{{"city": "{city}", "temp_c": 21}}'


class Run:
    """One kit, one room, one AI channel; what RoomKit reported of each turn."""

    def __init__(
        self, provider: Any, slow_transport: bool = False, telemetry: Any = None, streamed_to: list[Any] | None = None, **channel: Any
    ) -> None:
        self.kit = RoomKit(telemetry=telemetry) if telemetry is not None else RoomKit()
        self.slow_transport = slow_transport
        self.streamed_to = streamed_to  # a user's socket that renders the answer as it streams
        self.responses: list[Any] = []
        self.provider = provider
        channel.setdefault("tools", TOOLS)
        channel.setdefault("tool_handler", tools)
        self.channel = AIChannel(AGENT, provider=provider, **channel)

        @self.kit.hook(HookTrigger.ON_AI_RESPONSE, execution=HookExecution.ASYNC, name="test_response")
        async def on_response(event: Any, context: Any) -> None:
            self.responses.append(event)

    async def start(self) -> None:
        kit = self.kit
        ws = WebSocketChannel("ws")
        if self.slow_transport:
            # a user whose connection takes its time: every row's AFTER_BROADCAST comes late
            async def receive(connection: str, event: Any) -> None:
                await asyncio.sleep(0.05)

            ws.register_connection("user-conn", receive, room_id=ROOM)
        elif self.streamed_to is not None:
            frames = self.streamed_to

            async def deliver(connection: str, event: Any) -> None:
                frames.append(event)

            async def stream(connection: str, message: Any) -> None:
                frames.append(message)

            ws.register_connection("user-conn", deliver, room_id=ROOM, stream_send_fn=stream)
        kit.register_channel(ws)
        kit.register_channel(self.channel)
        await kit.create_room(room_id=ROOM)
        await kit.attach_channel(ROOM, "ws")
        await kit.attach_channel(ROOM, AGENT, category=ChannelCategory.INTELLIGENCE)

    async def say(self, text: str) -> None:
        await self.kit.process_inbound(InboundMessage(channel_id="ws", sender_id="user", content=TextContent(body=text)))
        await self.kit.hook_engine.drain_observers()

    async def rows(self) -> list[Any]:
        """RoomKit's own persisted rows of the AI channel, in order."""
        events = await self.kit.store.list_events(ROOM, limit=1000)
        return [e for e in events if e.source.channel_id == AGENT]


PROMPT = "Dinner outside tonight?"


def run(
    provider: Any, prompt: str = PROMPT, slow_transport: bool = False, streamed_to: list[Any] | None = None,
    **channel: Any,
) -> tuple[Run, list[Any]]:
    async def main() -> tuple[Run, list[Any]]:
        r = Run(provider, slow_transport, streamed_to=streamed_to, **channel)
        await r.start()
        await r.say(prompt)
        return r, await r.rows()

    return asyncio.run(main())


# -- comparing ours with RoomKit's ------------------------------------------------------------


def declared(tools: list[Any]) -> list[dict[str, Any]]:
    return [{"name": t.name, "description": t.description, "parameters": t.parameters, "origin": t.origin} for t in tools]


def assert_same_summary(ours: Any, theirs: Any, correlation_id: str) -> None:
    assert ours.segments == theirs.segments
    assert ours.response_content == theirs.response_content
    assert ours.tool_calls_count == theirs.tool_calls_count
    assert ours.round_count == theirs.round_count
    assert ours.usage == theirs.usage
    assert ours.loop_end_reason is not None and ours.loop_end_reason.value == theirs.loop_end_reason
    assert declared(ours.declared_tools) == declared(theirs.declared_tools)
    assert ours.thinking == theirs.thinking
    assert ours.streaming == theirs.streaming
    assert ours.session_id == theirs.room_id == ROOM
    assert ours.channel_id == theirs.channel_id == AGENT
    assert ours.correlation_id == correlation_id


def tool_fields(content: Any) -> tuple[Any, ...]:
    return (content.tool_name, content.tool_id, content.status, content.outcome, content.duration_ms,
            content.arguments, content.result, content.error)


def assert_same_timeline(store: loopscope.Store, theirs: list[Any]) -> None:
    """Our events of the session are RoomKit's rows of the turn: the same kinds in the same
    order, the same texts, the same tool rows field by field."""
    timeline = store.get_timeline(ROOM)
    # the turn opens with what it answers: the user's message
    asked = [e for e in timeline if e.type == "message" and e.content.role == "user"]
    assert [e.content.body for e in asked] == [PROMPT]
    assert timeline.index(asked[0]) == 0 and asked[0].correlation_id == theirs[0].correlation_id
    ours = [e for e in timeline if e.type in ("tool_call_start", "tool_call_end") or e.type == "message" and e.content.role == "assistant"]
    assert [e.type for e in ours] == [str(r.type) for r in theirs]
    for mine, row in zip(ours, theirs):
        assert mine.correlation_id == row.correlation_id
        assert mine.source.channel_id == AGENT
        assert mine.source.framework == "roomkit"
        if row.type == EventType.MESSAGE:
            assert mine.content.body == row.content.body
        else:
            assert tool_fields(mine.content) == tool_fields(row.content)


def check_turn(recording: Any, r: Run, rows: list[Any]) -> Any:
    """The one turn RoomKit ran, as we stored it, checked against what RoomKit said; returned."""
    assert len(r.responses) == 1
    theirs = r.responses[0]
    correlation = {row.correlation_id for row in rows}
    assert len(correlation) == 1
    store = recording.store
    stored = store.list_turns(ROOM)
    assert len(stored) == 1
    assert_same_summary(stored[0], theirs, correlation.pop())
    assert_same_timeline(store, rows)
    return stored[0]


def turn_tree(recording: Any) -> tuple[Any, list[Any], list[Any]]:
    """The invoke_agent span, its chat spans (in time order) and its execute_tool spans."""
    spans = recording.spans()
    agents = [s for s in spans if s.attributes.get(a.OPERATION) == a.OP_INVOKE_AGENT]
    assert len(agents) == 1
    agent = agents[0]
    assert agent.attributes[a.FRAMEWORK] == "roomkit"
    children = [s for s in spans if s.parent is not None and s.parent.span_id == agent.context.span_id]
    assert {s.context.trace_id for s in children} == {agent.context.trace_id}
    chats = sorted((s for s in children if s.attributes.get(a.OPERATION) == a.OP_CHAT), key=lambda s: s.start_time)
    tools_ = [s for s in children if s.attributes.get(a.OPERATION) == a.OP_EXECUTE_TOOL]
    assert len(chats) + len(tools_) == len(children)
    return agent, chats, tools_


def round_usage(span: Any) -> dict[str, int]:
    return {k: span.attributes[v] for k, v in a.USAGE_ATTRIBUTES.items() if v in span.attributes}


# -- the turns --------------------------------------------------------------------------------


def test_failing_tool(instrumented):
    provider = MockAIProvider(ai_responses=[
        AIResponse(content="Let me book it.", tool_calls=[AIToolCall(id="call_b", name="book", arguments={"at": "20:00"})],
                   usage={"input_tokens": 120, "output_tokens": 18}, finish_reason="tool_calls"),
        AIResponse(content="The booking service is down, sorry.", usage={"input_tokens": 160, "output_tokens": 9},
                   finish_reason="stop"),
    ])
    r, rows = run(provider)
    assert [row.type for row in rows] == [EventType.MESSAGE, *TOOL_ROWS, EventType.MESSAGE]
    ended = rows[2].content
    assert (ended.status, ended.outcome) == ("failed", "failed")

    summary = check_turn(instrumented, r, rows)
    assert summary.usage == {"input_tokens": 280, "output_tokens": 27}
    assert summary.loop_end_reason.value == "completed"
    assert [t.name for t in summary.declared_tools][:2] == ["weather", "book"]

    _agent, chats, tool_spans = turn_tree(instrumented)
    assert [round_usage(c) for c in chats] == [{"input_tokens": 120, "output_tokens": 18}, {"input_tokens": 160, "output_tokens": 9}]
    assert [c.attributes.get(a.ROUND_TEXT) for c in chats] == ["Let me book it.", "The booking service is down, sorry."]
    assert len(tool_spans) == 1
    (book,) = tool_spans
    assert book.attributes[a.TOOL_OUTCOME] == "failed"
    # the tool ran between the two generations
    assert chats[0].end_time <= book.start_time <= chats[1].start_time


def two_weather_calls() -> MockAIProvider:
    """A model that asks for the weather in Paris and in Lyon at once, then answers."""
    return MockAIProvider(ai_responses=[
        AIResponse(content="Checking both.", tool_calls=[
            AIToolCall(id="call_p", name="weather", arguments={"city": "Paris"}),
            AIToolCall(id="call_l", name="weather", arguments={"city": "Lyon"}),
        ], usage={"input_tokens": 50, "output_tokens": 12}, finish_reason="tool_calls"),
        AIResponse(content="Paris and Lyon: 21 °C.", usage={"input_tokens": 90, "output_tokens": 8}, finish_reason="stop"),
    ])


@pytest.mark.parametrize("slow_transport", [False, True], ids=["prompt", "slow-transport"])
def test_two_parallel_calls(instrumented, slow_transport):
    provider = two_weather_calls()
    r, rows = run(provider, slow_transport=slow_transport)
    assert [row.type for row in rows] == [EventType.MESSAGE, *[TOOL_ROWS[0]] * 2, *[TOOL_ROWS[1]] * 2, EventType.MESSAGE]

    summary = check_turn(instrumented, r, rows)
    assert (summary.tool_calls_count, summary.round_count) == (2, 1)

    _agent, chats, tool_spans = turn_tree(instrumented)
    assert len(chats) == 2
    assert sorted(s.attributes[a.TOOL_CALL_ID] for s in tool_spans) == ["call_l", "call_p"]
    # one round: both calls ran at once, after the first generation and before the second
    first, second = sorted(tool_spans, key=lambda s: s.start_time)
    assert first.end_time > second.start_time
    assert all(chats[0].end_time <= s.start_time <= chats[1].start_time for s in tool_spans)


def test_cut_off_by_max_tool_rounds(instrumented):
    provider = MockAIProvider(ai_responses=[
        AIResponse(content=f"Looking, take {n}.", tool_calls=[AIToolCall(id=f"call_{n}", name="weather", arguments={"city": "Oslo"})],
                   usage={"input_tokens": 10 * n, "output_tokens": n}, finish_reason="tool_calls")
        for n in (1, 2, 3)
    ])
    r, rows = run(provider, max_tool_rounds=2)
    summary = check_turn(instrumented, r, rows)
    assert summary.loop_end_reason.value == "max_rounds"
    assert (summary.round_count, summary.tool_calls_count) == (2, 2)
    assert summary.usage == {"input_tokens": 60, "output_tokens": 6}
    assert summary.segments == ["Looking, take 1.", "Looking, take 2.", "Looking, take 3."]

    agent, chats, tool_spans = turn_tree(instrumented)
    # three generations; the third asked for a call the loop never ran
    assert [round_usage(c) for c in chats] == [{"input_tokens": 10 * n, "output_tokens": n} for n in (1, 2, 3)]
    assert sorted(s.attributes[a.TOOL_CALL_ID] for s in tool_spans) == ["call_1", "call_2"]
    assert agent.attributes[a.LOOP_END_REASON] == "max_rounds"


def test_streaming_channel(instrumented):
    provider = MockAIProvider(ai_responses=[
        AIResponse(content="One moment.", tool_calls=[AIToolCall(id="call_s", name="weather", arguments={"city": "Nice"})],
                   usage={"input_tokens": 30, "output_tokens": 6}, finish_reason="tool_calls"),
        AIResponse(content="Sunny in Nice.", usage={"input_tokens": 44, "output_tokens": 5}, finish_reason="stop"),
    ], streaming=True, tool_call_delta_chunks=3)
    frames: list[Any] = []
    r, rows = run(provider, streamed_to=frames)
    assert r.responses[0].streaming is True
    kinds = [type(f).__name__ for f in frames]
    assert kinds[0] == "StreamStart" and kinds[-1] == "StreamEnd" and "StreamChunk" in kinds  # rendered as it streamed
    summary = check_turn(instrumented, r, rows)
    assert summary.segments == ["One moment.", "Sunny in Nice."]
    _agent, chats, tool_spans = turn_tree(instrumented)
    assert [round_usage(c) for c in chats] == [{"input_tokens": 30, "output_tokens": 6}, {"input_tokens": 44, "output_tokens": 5}]
    assert len(tool_spans) == 1


def test_tool_search_origins_and_a_refused_call(instrumented):
    catalogue = [AITool(name=f"tool_{i}", description=f"Does thing {i}. " * 20, parameters=CITY_PARAMS) for i in range(30)]

    async def handler(name: str, arguments: dict[str, Any]) -> str:
        if name == "tool_3":
            raise ToolRefusedError("tool_3 is not for this room")
        return "done"

    provider = MockAIProvider(ai_responses=[
        AIResponse(content="Searching.", tool_calls=[AIToolCall(id="call_f", name="find_tools", arguments={"query": "thing 7"})],
                   usage={"input_tokens": 5, "output_tokens": 1}),
        AIResponse(content="Using them.", tool_calls=[
            AIToolCall(id="call_7", name="tool_7", arguments={"city": "Bern"}),
            AIToolCall(id="call_3", name="tool_3", arguments={"city": "Bern"}),
            AIToolCall(id="call_x", name="no_such_tool", arguments={}),  # refused at its gate: it never runs
        ], usage={"input_tokens": 6, "output_tokens": 1}),
        AIResponse(content="Done.", usage={"input_tokens": 7, "output_tokens": 1}),
    ])
    r, rows = run(provider, slow_transport=True, tools=catalogue, tool_handler=handler, tool_search=True, tool_search_pinned=["tool_1"])
    summary = check_turn(instrumented, r, rows)
    origins = {t.name: t.origin for t in summary.declared_tools}
    assert (origins["tool_1"], origins["find_tools"], origins["tool_7"]) == ("pinned", "always", "revealed")
    assert "tool_3" not in origins  # hidden by Tool Search: called, never declared
    outcomes = {e.content.tool_id: e.content.outcome for e in instrumented.store.get_timeline(ROOM) if e.type == "tool_call_end"}
    assert outcomes == {"call_f": "served", "call_7": "served", "call_3": "refused", "call_x": "refused"}


def test_turns_of_one_room_stay_apart(instrumented):
    provider = MockAIProvider(ai_responses=[
        AIResponse(content="First answer.", usage={"input_tokens": 5, "output_tokens": 2}, finish_reason="stop"),
        AIResponse(content="Second answer.", usage={"input_tokens": 7, "output_tokens": 3}, finish_reason="stop"),
    ])

    async def main() -> tuple[Run, list[Any]]:
        r = Run(provider)
        await r.start()
        await r.say("first")
        await r.say("second")
        return r, await r.rows()

    r, rows = asyncio.run(main())
    stored = instrumented.store.list_turns(ROOM)
    assert len(stored) == 2 == len(r.responses)
    by_correlation = {t.correlation_id: t for t in stored}
    assert set(by_correlation) == {row.correlation_id for row in rows}
    timeline = instrumented.store.get_timeline(ROOM)
    assert [(e.content.role, e.content.body) for e in timeline] == [
        ("user", "first"), ("assistant", "First answer."), ("user", "second"), ("assistant", "Second answer."),
    ]
    assert [e.correlation_id for e in timeline] == [rows[0].correlation_id] * 2 + [rows[1].correlation_id] * 2
    for theirs, row in zip(r.responses, rows):
        assert_same_summary(by_correlation[row.correlation_id], theirs, row.correlation_id)
        assert by_correlation[row.correlation_id].parent_correlation_id is None  # neither is inside the other


@pytest.mark.parametrize("given", ["provider", "config"])
def test_the_applications_telemetry_still_gets_everything(instrumented, given):
    mine = MockTelemetryProvider()
    provider = MockAIProvider(ai_responses=[
        AIResponse(content="Checking.", tool_calls=[AIToolCall(id="call_t", name="weather", arguments={"city": "Rome"})],
                   usage={"input_tokens": 3, "output_tokens": 1}, finish_reason="tool_calls"),
        AIResponse(content="Warm.", usage={"input_tokens": 4, "output_tokens": 1}, finish_reason="stop"),
    ])

    async def main() -> Run:
        # the application's own provider, given as it is or in a TelemetryConfig
        r = Run(provider, telemetry=mine if given == "provider" else TelemetryConfig(provider=mine, metadata={"env": "test"}))
        await r.start()
        await r.say("Rome?")
        return r

    r = asyncio.run(main())
    assert r.kit.telemetry.inner is mine
    spans = {s.id: s for s in mine.spans}
    generate = [s for s in spans.values() if s.name == "llm.generate"]
    tool = [s for s in spans.values() if s.name == "tool.weather"]
    assert len(generate) == 1 and len(tool) == 1
    # its ids, its parent links, its ends: ours never reach it
    assert tool[0].parent_id == generate[0].id
    assert generate[0].end_time is not None and generate[0].attributes["llm.tool_count"] == 1
    assert [m["name"] for m in mine.metrics].count("roomkit.llm.input_tokens") == 2
    assert len(instrumented.store.list_turns(ROOM)) == 1


# -- switching it on and off --------------------------------------------------------------------


def test_uninstrument_restores_and_reinstrument_works(recording):
    errors = _guard.error_count
    original_init = RoomKit.__dict__["__init__"]
    original_writer = SegmentWriter.__dict__["__init__"]
    reply = [AIResponse(content="Hello.", usage={"input_tokens": 1, "output_tokens": 1}, finish_reason="stop")]

    async def one_turn(prompt: str) -> Run:
        r = Run(MockAIProvider(ai_responses=reply))
        await r.start()
        await r.say(prompt)
        return r

    async def main() -> None:
        loopscope.instrument(**only_roomkit())
        assert RoomKit.__dict__["__init__"] is not original_init
        assert RoomKit().hook_engine.has_hooks(HookTrigger.AFTER_BROADCAST)
        held = Run(MockAIProvider(ai_responses=reply))  # a kit made while on
        await one_turn("on")
        loopscope.uninstrument()
        assert RoomKit.__dict__["__init__"] is original_init
        assert SegmentWriter.__dict__["__init__"] is original_writer
        assert not held.kit.hook_engine.has_hooks(HookTrigger.AFTER_BROADCAST)
        assert not held.kit.turn_executor.hooks.has_hooks(HookTrigger.AFTER_TOOL_ROUND)
        assert not held.kit.hook_engine.remove_global_hook("loopscope_ai_response")
        await held.start()
        await held.say("off, on a kit made while on")
        await one_turn("off")
        loopscope.instrument(**only_roomkit())
        await one_turn("on again")
        await held.say("on again, on a kit made while on before")
        loopscope.uninstrument()

    asyncio.run(main())
    stored = recording.store.list_turns(ROOM)
    assert [t.response_content for t in stored] == ["Hello."] * 3
    assert _guard.error_count == errors


def test_instrument_is_idempotent(instrumented):
    loopscope.instrument(**only_roomkit())
    r, rows = run(MockAIProvider(ai_responses=[
        AIResponse(content="Once.", tool_calls=[AIToolCall(id="call_o", name="weather", arguments={"city": "Riga"})],
                   usage={"input_tokens": 1, "output_tokens": 1}),
        AIResponse(content="Only once.", usage={"input_tokens": 2, "output_tokens": 1}),
    ]))
    check_turn(instrumented, r, rows)  # one turn, each row once


def test_nothing_happens_without_roomkit_imported(tmp_path):
    code = (
        "import sys, loopscope\n"
        "loopscope.configure(sys.argv[1])\n"
        "on = loopscope.instrument()\n"
        "adapters = sys.modules['loopscope.instrument']\n"
        "assert 'roomkit' in on, on\n"
        "assert 'roomkit' not in sys.modules and 'loopscope.instrument.roomkit' not in sys.modules\n"
        "assert 'roomkit' not in adapters.active()\n"
        "loopscope.uninstrument()\n"
        "assert 'roomkit' not in sys.modules\n"
        # on again, then imported: the adapter activates with the import
        "loopscope.instrument()\n"
        "import roomkit, wrapt\n"
        "assert 'roomkit' in adapters.active()\n"
        "assert isinstance(vars(roomkit.RoomKit)['__init__'], wrapt.FunctionWrapper)\n"
        "loopscope.uninstrument()\n"
        "assert not isinstance(vars(roomkit.RoomKit)['__init__'], wrapt.FunctionWrapper)\n"
        "print('ok')\n"
    )
    env = {**os.environ, "LOOPSCOPE_STRICT": "1"}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "store.duckdb")], check=False, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# -- a provider that calls the openai SDK underneath ------------------------------------------------


def sdk_provider(sdk: str, server: Any) -> Any:
    if sdk == "openai":
        from roomkit.providers.openai import OpenAIAIProvider, OpenAIConfig

        return OpenAIAIProvider(OpenAIConfig(api_key="test-key", base_url=server.openai_base_url, model="gpt-test-1"))
    from roomkit.providers.anthropic import AnthropicAIProvider, AnthropicConfig

    return AnthropicAIProvider(AnthropicConfig(api_key="test-key", base_url=server.anthropic_base_url, model="claude-test-1"))


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_sdk_calls_under_a_roomkit_provider_are_its_rounds(recording, model_server, sdk):
    from fakes.model_server import Reply, ToolCall, Usage

    errors = _guard.error_count
    model_server.queue(
        Reply(text="Let me check.", tool_calls=[ToolCall("weather", {"city": "Paris"}, id="call_w")], usage=Usage(100, 20)),
        Reply(text="21 °C in Paris.", usage=Usage(150, 10)),
    )
    loopscope.instrument(**{name: name in ("roomkit", sdk) for name in ADAPTERS})
    try:
        r, rows = run(sdk_provider(sdk, model_server), slow_transport=True)
    finally:
        loopscope.uninstrument()
    assert _guard.error_count == errors
    assert len(model_server.requests) == 2

    check_turn(recording, r, rows)
    assert [s.session_id for s in recording.store.list_sessions()] == [ROOM]  # no second, stitched turn
    _agent, chats, tool_spans = turn_tree(recording)
    # the rounds are the SDK calls, as the SDK adapter saw them: one chat span per call
    assert len(chats) == 2
    assert [c.attributes.get(a.PROVIDER) for c in chats] == [sdk, sdk]
    assert [c.attributes.get(a.USAGE_OUTPUT) for c in chats] == [20, 10]
    assert {c.attributes[a.TURN_ID] for c in chats} == {rows[0].correlation_id}
    assert [s.attributes[a.TOOL_CALL_ID] for s in tool_spans] == ["call_w"]
    # no other model-call span of the SDK's own beside ours
    assert len([s for s in recording.spans() if s.attributes.get(a.OPERATION) == a.OP_CHAT]) == 2


def test_a_loop_that_raises_ends_its_turn_as_error(instrumented, model_server, monkeypatch):
    from fakes.model_server import Reply

    monkeypatch.setattr(importlib.import_module("loopscope.instrument._roomkit_turn"), "GRACE_SECONDS", 0.05)
    model_server.queue(Reply(status=500, error_message="the model is overloaded"))
    provider = sdk_provider("openai", model_server)

    async def main() -> Run:
        r = Run(provider)
        await r.start()
        await r.say("Anyone there?")
        await asyncio.sleep(0.3)  # RoomKit reports no summary of it: the turn ends after a grace period
        return r

    r = asyncio.run(main())
    assert r.responses == []  # RoomKit fires no ON_AI_RESPONSE for it
    (stored,) = instrumented.store.list_turns(ROOM)
    assert stored.loop_end_reason.value == "error"
    assert stored.error is not None and "overloaded" in stored.error
    assert (stored.session_id, stored.channel_id) == (ROOM, AGENT)
    assert [(e.type, e.content.body) for e in instrumented.store.get_timeline(ROOM)] == [("message", "Anyone there?")]


# -- decorated tools under RoomKit: each call recorded once ------------------------------------


@loopscope.tool
async def weather(city: str) -> str:
    await asyncio.sleep(0.01)
    return json.dumps({"city": city, "temp_c": await geocode(city)})


@loopscope.tool
async def geocode(city: str) -> int:
    """A tool the weather tool calls itself: a call of its own, which RoomKit never sees."""
    return 21


async def dispatching(name: str, arguments: dict[str, Any]) -> str:
    return await weather(**arguments)


@pytest.mark.parametrize("handler", [dispatching, loopscope.tool(dispatching)], ids=["decorated-tools", "decorated-handler"])
def test_a_decorated_tool_is_the_call_roomkit_runs_and_recorded_once(instrumented, handler):
    provider = two_weather_calls()
    _, rows = run(provider, tool_handler=handler)
    timeline = instrumented.store.get_timeline(ROOM)
    ours = [e for e in timeline if e.type in ("tool_call_start", "tool_call_end") and e.content.tool_name == "weather"]
    theirs = [row for row in rows if row.type in TOOL_ROWS]
    assert [tool_fields(e.content) for e in ours] == [tool_fields(row.content) for row in theirs]  # once each
    nested = [e for e in timeline if e.type in ("tool_call_start", "tool_call_end") and e.content.tool_name == "geocode"]
    assert len(nested) == 4 and {e.content.outcome for e in nested if e.type == "tool_call_end"} == {"served"}
    spans = [s for s in instrumented.spans() if s.attributes.get(a.OPERATION) == a.OP_EXECUTE_TOOL]
    by_name: dict[str, list[str]] = {}
    for s in spans:
        by_name.setdefault(s.attributes[a.TOOL_NAME], []).append(s.attributes[a.TOOL_CALL_ID])
    assert sorted(by_name["weather"]) == ["call_l", "call_p"]  # RoomKit's calls, once each
    # the tool the weather tool called is its own execution, in the same turn
    assert len(by_name["geocode"]) == 2 and not {"call_l", "call_p"} & set(by_name["geocode"])
    assert set(by_name) == {"weather", "geocode"}
    assert {s.attributes[a.TURN_ID] for s in spans} == {rows[0].correlation_id}


def test_decorated_tools_are_recorded_again_once_roomkit_is_uninstrumented(recording):
    loopscope.instrument(**only_roomkit())
    loopscope.uninstrument()
    with loopscope.turn(session_id="s", agent="a", input="q"):
        asyncio.run(weather("Oslo"))
    names = sorted(s.attributes[a.TOOL_NAME] for s in recording.spans() if s.attributes.get(a.OPERATION) == a.OP_EXECUTE_TOOL)
    assert names == ["geocode", "weather"]
