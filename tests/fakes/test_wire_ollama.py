"""The fake model server's Ollama wire (wires/ollama.py), driven by the real ollama SDK (the `ollama` stack): what
the SDK hands the user (text, tool calls without ids, counts, done_reason, ResponseError) and what the server
recorded of each request."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from ollama import ChatResponse, ResponseError

from .model_server import FakeModelServer, Reply
from .weather_loop import ANSWER, QUESTION, TOOLS, queue_tool_loop

MODEL = "llama3.2"



def second_messages(first: Any) -> list[Any]:
    return [QUESTION, first, {"role": "tool", "content": '{"temp_c": 21}', "tool_name": "get_weather"}]


def check_rounds(server: FakeModelServer, first: ChatResponse, second: ChatResponse, *, stream: bool) -> None:
    assert first.message.tool_calls is not None
    assert [(c.function.name, dict(c.function.arguments)) for c in first.message.tool_calls] == \
        [("get_weather", {"city": "Paris"})]
    assert (first.prompt_eval_count, first.eval_count, first.done, first.done_reason) == (100, 20, True, "stop")
    assert (second.prompt_eval_count, second.eval_count, second.done_reason) == (140, 9, "stop")
    assert second.message.content == ANSWER

    one, two = server.requests
    assert one.path == "/api/chat" and one.wire == "ollama" and one.model == MODEL and one.stream is stream
    assert one.first_user_text == "Weather in Paris?"
    assert [t["function"]["name"] for t in one.body["tools"]] == ["get_weather"]
    assert one.body["options"] == {"num_predict": 256}
    assert two.tool_results == [{"id": None, "name": "get_weather", "content": '{"temp_c": 21}'}]
    sent_call = two.body["messages"][1]["tool_calls"][0]
    assert sent_call["function"] == {"name": "get_weather", "arguments": {"city": "Paris"}}


def test_tool_loop_sync(model_server: FakeModelServer) -> None:
    queue_tool_loop(model_server)
    client = model_server.ollama_client()
    first = client.chat(model=MODEL, messages=[QUESTION], tools=TOOLS, options={"num_predict": 256})
    assert first.message.content == "Let me look."
    second = client.chat(model=MODEL, messages=second_messages(first.message), tools=TOOLS,
                         options={"num_predict": 256})
    check_rounds(model_server, first, second, stream=False)


def test_tool_loop_async(model_server: FakeModelServer) -> None:
    queue_tool_loop(model_server)
    client = model_server.async_ollama_client()

    async def run() -> tuple[ChatResponse, ChatResponse]:
        first = await client.chat(model=MODEL, messages=[QUESTION], tools=TOOLS, options={"num_predict": 256})
        second = await client.chat(model=MODEL, messages=second_messages(first.message), tools=TOOLS,
                                   options={"num_predict": 256})
        return first, second

    check_rounds(model_server, *asyncio.run(run()), stream=False)


def joined(parts: list[ChatResponse]) -> ChatResponse:
    """One response from a stream's parts, as a user's loop builds it: the text joined, the calls gathered, the
    counts and done_reason of the last (``done: true``) part."""
    last = parts[-1]
    calls = [c for p in parts for c in p.message.tool_calls or ()]
    message = last.message.model_copy(update={"content": "".join(p.message.content or "" for p in parts),
                                              "tool_calls": calls or None})
    return last.model_copy(update={"message": message})


def test_tool_loop_streamed(model_server: FakeModelServer) -> None:
    """NDJSON lines: text in pieces, the call whole in one line, then ``done: true`` with the counts."""
    queue_tool_loop(model_server)
    client = model_server.ollama_client()
    parts = list(client.chat(model=MODEL, messages=[QUESTION], tools=TOOLS, options={"num_predict": 256},
                             stream=True))
    assert len(parts) > 3 and [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert parts[0].prompt_eval_count is None  # counts come in the last line only
    first = joined(parts)
    assert first.message.content == "Let me look."

    async def run() -> list[ChatResponse]:
        stream = await model_server.async_ollama_client().chat(
            model=MODEL, messages=second_messages(first.message), tools=TOOLS, options={"num_predict": 256},
            stream=True)
        return [p async for p in stream]

    check_rounds(model_server, first, joined(asyncio.run(run())), stream=True)


def test_done_reason_length(model_server: FakeModelServer) -> None:
    model_server.queue(Reply(text="Cut", stop="length"), Reply(text="Cut", stop="max_tokens"))
    client = model_server.ollama_client()
    assert client.chat(model=MODEL, messages=[QUESTION], stream=False).done_reason == "length"
    assert list(client.chat(model=MODEL, messages=[QUESTION], stream=True))[-1].done_reason == "length"


@pytest.mark.parametrize("status", [404, 500])
def test_http_errors(model_server: FakeModelServer, status: int) -> None:
    model_server.queue(Reply.error(status, "model 'nope' not found"), Reply.error(status, "model 'nope' not found"))
    client = model_server.ollama_client()
    with pytest.raises(ResponseError) as caught:
        client.chat(model="nope", messages=[QUESTION])
    assert (caught.value.status_code, caught.value.error) == (status, "model 'nope' not found")
    with pytest.raises(ResponseError) as caught:
        list(client.chat(model="nope", messages=[QUESTION], stream=True))
    assert caught.value.status_code == status


def test_mid_stream_error(model_server: FakeModelServer) -> None:
    """Two lines of text, then ``{"error": ...}`` as a line: the SDK raises ResponseError."""
    model_server.queue(Reply.stream_failure(after=2, message="llama runner crashed"),
                       Reply.stream_failure(after=2, message="llama runner crashed"))
    client = model_server.ollama_client()
    got: list[str] = []
    with pytest.raises(ResponseError) as caught:
        for part in client.chat(model=MODEL, messages=[QUESTION], stream=True):
            got.append(part.message.content or "")
    assert got == ["This ", "reply "] and caught.value.error == "llama runner crashed"

    async def run() -> None:
        async for _ in await model_server.async_ollama_client().chat(model=MODEL, messages=[QUESTION], stream=True):
            pass

    with pytest.raises(ResponseError):
        asyncio.run(run())
