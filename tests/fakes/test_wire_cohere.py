"""The fake model server's Cohere v2 wire (wires/cohere.py), driven by the real cohere SDK's ClientV2 (the `cohere`
stack): what the SDK hands the user (content or tool plan, tool calls, usage, finish reason, its error types) and
what the server recorded of each request."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import cohere
import pytest
from cohere.core.api_error import ApiError

from .model_server import FakeModelServer, Reply
from .weather_loop import ANSWER, QUESTION, TOOLS, queue_tool_loop

MODEL = "command-a-03-2025"



def second_messages(plan: str, calls: list[Any]) -> list[Any]:
    return [QUESTION, {"role": "assistant", "tool_plan": plan, "tool_calls": calls},
            *({"role": "tool", "tool_call_id": c.id, "content": [{"type": "document", "document": {
                "data": '{"temp_c": 21}'}}]} for c in calls)]


def check_rounds(server: FakeModelServer, plan: str, calls: list[Any], first_end: Any, text: str, second_end: Any,
                 *, stream: bool) -> None:
    """``first_end`` / ``second_end``: what holds finish_reason and usage (the response, or message-end's delta)."""
    assert plan == "I will look up the weather."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert calls[0].id
    assert first_end.finish_reason == "TOOL_CALL"
    u = first_end.usage
    assert (u.tokens.input_tokens, u.tokens.output_tokens, u.billed_units.input_tokens, u.cached_tokens) == \
        (100, 20, 100, 30)
    assert text == ANSWER
    assert second_end.finish_reason == "COMPLETE" and second_end.usage.tokens.input_tokens == 140

    one, two = server.requests
    assert one.path == "/v2/chat" and one.wire == "cohere" and one.model == MODEL and one.stream is stream
    assert one.headers["authorization"] == "Bearer test-key"
    assert one.first_user_text == "Weather in Paris?"
    assert [t["function"]["name"] for t in one.body["tools"]] == ["get_weather"]
    assert one.body["max_tokens"] == 256
    assert [r["id"] for r in two.tool_results] == [calls[0].id]
    assert two.body["messages"][1]["tool_plan"] == plan


def test_tool_loop_sync(model_server: FakeModelServer) -> None:
    queue_tool_loop(model_server, text="I will look up the weather.", cached_tokens=30)
    client = model_server.cohere_client()
    first = client.chat(model=MODEL, messages=[QUESTION], tools=TOOLS, max_tokens=256)
    assert first.message.content is None  # with tool calls the text is the plan
    second = client.chat(model=MODEL, messages=second_messages(first.message.tool_plan, first.message.tool_calls),
                         tools=TOOLS, max_tokens=256)
    assert second.message.tool_calls is None
    check_rounds(model_server, first.message.tool_plan, first.message.tool_calls, first,
                 second.message.content[0].text, second, stream=False)


def test_tool_loop_async(model_server: FakeModelServer) -> None:
    queue_tool_loop(model_server, text="I will look up the weather.", cached_tokens=30)
    client = model_server.async_cohere_client()

    async def run() -> tuple[Any, Any]:
        first = await client.chat(model=MODEL, messages=[QUESTION], tools=TOOLS, max_tokens=256)
        second = await client.chat(model=MODEL, tools=TOOLS, max_tokens=256,
                                   messages=second_messages(first.message.tool_plan, first.message.tool_calls))
        return first, second

    first, second = asyncio.run(run())
    check_rounds(model_server, first.message.tool_plan, first.message.tool_calls, first,
                 second.message.content[0].text, second, stream=False)


def gather(events: list[Any]) -> tuple[str, str, list[Any], Any]:
    """What a user's loop makes of a stream: text, tool plan, the calls (arguments joined), message-end's delta."""
    text = "".join(e.delta.message.content.text for e in events if e.type == "content-delta")
    plan = "".join(e.delta.message.tool_plan for e in events if e.type == "tool-plan-delta")
    calls: list[Any] = []
    for e in events:
        if e.type == "tool-call-start":
            calls.append(e.delta.message.tool_calls)
        elif e.type == "tool-call-delta":
            calls[e.index].function.arguments += e.delta.message.tool_calls.function.arguments
    assert events[0].type == "message-start" and events[-1].type == "message-end"
    return text, plan, calls, events[-1].delta


def test_tool_loop_streamed(model_server: FakeModelServer) -> None:
    queue_tool_loop(model_server, text="I will look up the weather.", cached_tokens=30)
    client = model_server.cohere_client()
    events = list(client.chat_stream(model=MODEL, messages=[QUESTION], tools=TOOLS, max_tokens=256))
    kinds = [e.type for e in events]
    assert kinds[0] == "message-start" and "tool-plan-delta" in kinds and "content-delta" not in kinds
    assert kinds[-4:] == ["tool-call-delta", "tool-call-delta", "tool-call-end", "message-end"]
    _, plan, calls, first_end = gather(events)

    async def run() -> list[Any]:
        stream = model_server.async_cohere_client().chat_stream(
            model=MODEL, messages=second_messages(plan, calls), tools=TOOLS, max_tokens=256)
        return [e async for e in stream]

    text, _, _, second_end = gather(asyncio.run(run()))
    check_rounds(model_server, plan, calls, first_end, text, second_end, stream=True)


@pytest.mark.parametrize(("stop", "expected"), [("MAX_TOKENS", "MAX_TOKENS"), ("length", "MAX_TOKENS"),
                                                ("STOP_SEQUENCE", "STOP_SEQUENCE")])
def test_finish_reasons(model_server: FakeModelServer, stop: str, expected: str) -> None:
    model_server.queue(Reply(text="Cut", stop=stop), Reply(text="Cut", stop=stop))
    client = model_server.cohere_client()
    assert client.chat(model=MODEL, messages=[QUESTION]).finish_reason == expected
    assert list(client.chat_stream(model=MODEL, messages=[QUESTION]))[-1].delta.finish_reason == expected


@pytest.mark.parametrize(("status", "kind"), [(400, cohere.BadRequestError), (429, cohere.TooManyRequestsError),
                                              (500, cohere.InternalServerError)])
def test_http_errors(model_server: FakeModelServer, status: int, kind: type[ApiError]) -> None:
    model_server.queue(Reply.error(status, "no such luck"), Reply.error(status, "no such luck"))
    client = model_server.cohere_client()
    with pytest.raises(kind) as caught:
        client.chat(model=MODEL, messages=[QUESTION])
    assert caught.value.status_code == status and caught.value.body["message"] == "no such luck"
    with pytest.raises(kind):
        list(client.chat_stream(model=MODEL, messages=[QUESTION]))
    assert len(model_server.requests) == 2  # no retries


def test_mid_stream_error(model_server: FakeModelServer) -> None:
    """A failure after three events ends the stream with message-end, finish_reason ERROR and the message."""
    model_server.queue(Reply.stream_failure(after=3, message="model overloaded"))
    events = list(model_server.cohere_client().chat_stream(model=MODEL, messages=[QUESTION]))
    assert [e.type for e in events] == ["message-start", "content-start", "content-delta", "message-end"]
    assert (events[-1].delta.finish_reason, events[-1].delta.error) == ("ERROR", "model overloaded")
