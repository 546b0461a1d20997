"""The fake model server's Mistral wire (wires/mistral.py), driven by the real mistralai SDK (the `mistral` stack):
what the SDK hands the user (text, tool calls, usage, finish reason, its error types) and what the server recorded
of each request."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from mistralai.client import errors

from .model_server import FakeModelServer, Reply
from .weather_loop import ANSWER, QUESTION, TOOLS, queue_tool_loop

MODEL = "mistral-large-latest"



def second_messages(text: str, calls: list[Any]) -> list[Any]:
    return [QUESTION, {"role": "assistant", "content": text, "tool_calls": calls},
            *({"role": "tool", "tool_call_id": c.id, "name": c.function.name, "content": '{"temp_c": 21}'}
              for c in calls)]


def check_rounds(server: FakeModelServer, calls: list[Any], usage: Any, finish: str, text: str, usage2: Any,
                 finish2: str, *, stream: bool) -> None:
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert len(calls[0].id) == 9
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens, finish) == (100, 20, 120, "tool_calls")
    assert (text, usage2.prompt_tokens, finish2) == (ANSWER, 140, "stop")
    one, two = server.requests
    assert one.path == "/mistral/v1/chat/completions" and one.wire == "mistral" and one.model == MODEL
    assert one.stream is stream and one.headers["authorization"] == "Bearer test-key"
    assert one.first_user_text == "Weather in Paris?" and one.body["max_tokens"] == 256
    assert [t["function"]["name"] for t in one.body["tools"]] == ["get_weather"]
    assert two.tool_results == [{"id": calls[0].id, "name": "get_weather", "content": '{"temp_c": 21}'}]


def test_tool_loop_sync(model_server: FakeModelServer) -> None:
    queue_tool_loop(model_server)
    client = model_server.mistral_client()
    first = client.chat.complete(model=MODEL, messages=[QUESTION], tools=TOOLS, max_tokens=256)
    m = first.choices[0].message
    assert m.content == "Let me look."
    second = client.chat.complete(model=MODEL, messages=second_messages(m.content, m.tool_calls), tools=TOOLS,
                                  max_tokens=256)
    check_rounds(model_server, m.tool_calls, first.usage, first.choices[0].finish_reason,
                 second.choices[0].message.content, second.usage, second.choices[0].finish_reason, stream=False)


def test_tool_loop_async(model_server: FakeModelServer) -> None:
    queue_tool_loop(model_server)
    client = model_server.mistral_client()

    async def run() -> tuple[Any, Any]:
        first = await client.chat.complete_async(model=MODEL, messages=[QUESTION], tools=TOOLS, max_tokens=256)
        m = first.choices[0].message
        second = await client.chat.complete_async(model=MODEL, messages=second_messages(m.content, m.tool_calls),
                                                  tools=TOOLS, max_tokens=256)
        return first, second

    first, second = asyncio.run(run())
    check_rounds(model_server, first.choices[0].message.tool_calls, first.usage, first.choices[0].finish_reason,
                 second.choices[0].message.content, second.usage, second.choices[0].finish_reason, stream=False)


def gather(events: list[Any]) -> tuple[str, list[Any], Any, str]:
    chunks = [e.data for e in events]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if isinstance(c.choices[0].delta.content, str))
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert all(c.usage is None for c in chunks[:-1])
    return text, calls, chunks[-1].usage, chunks[-1].choices[0].finish_reason


def test_tool_loop_streamed(model_server: FakeModelServer) -> None:
    """Text in pieces, each call whole in one delta, usage and finish reason in the last chunk."""
    queue_tool_loop(model_server)
    client = model_server.mistral_client()
    text, calls, usage, finish = gather(list(client.chat.stream(model=MODEL, messages=[QUESTION], tools=TOOLS,
                                                                 max_tokens=256)))
    assert text == "Let me look."

    async def run() -> list[Any]:
        stream = await client.chat.stream_async(model=MODEL, messages=second_messages(text, calls), tools=TOOLS,
                                                max_tokens=256)
        return [e async for e in stream]

    text2, _, usage2, finish2 = gather(asyncio.run(run()))
    check_rounds(model_server, calls, usage, finish, text2, usage2, finish2, stream=True)


@pytest.mark.parametrize(("stop", "expected"), [("length", "length"), ("model_length", "model_length"),
                                                ("max_tokens", "length")])
def test_finish_reasons(model_server: FakeModelServer, stop: str, expected: str) -> None:
    model_server.queue(Reply(text="Cut", stop=stop), Reply(text="Cut", stop=stop))
    client = model_server.mistral_client()
    assert client.chat.complete(model=MODEL, messages=[QUESTION]).choices[0].finish_reason == expected
    assert list(client.chat.stream(model=MODEL, messages=[QUESTION]))[-1].data.choices[0].finish_reason == expected


@pytest.mark.parametrize(("status", "kind"), [(401, errors.SDKError), (422, errors.HTTPValidationError),
                                              (429, errors.SDKError), (503, errors.SDKError)])
def test_http_errors(model_server: FakeModelServer, status: int, kind: type[errors.MistralError]) -> None:
    model_server.queue(Reply.error(status, "no such luck"), Reply.error(status, "no such luck"))
    client = model_server.mistral_client()
    with pytest.raises(kind) as caught:
        client.chat.complete(model=MODEL, messages=[QUESTION])
    assert caught.value.status_code == status and "no such luck" in caught.value.body
    with pytest.raises(kind):
        list(client.chat.stream(model=MODEL, messages=[QUESTION]))
    assert len(model_server.requests) == 2  # no retries


def test_mid_stream_error(model_server: FakeModelServer) -> None:
    """Two chunks, then Mistral's error object as a `data:` line, which the SDK raises as not a chunk."""
    model_server.queue(Reply.stream_failure(after=2, message="model overloaded"))
    got: list[str] = []
    with pytest.raises(errors.ResponseValidationError) as caught:
        for event in model_server.mistral_client().chat.stream(model=MODEL, messages=[QUESTION]):
            got.append(event.data.choices[0].delta.content)
    assert got == ["", "This "] and "model overloaded" in caught.value.body
