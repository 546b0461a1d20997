"""The fake model server's Groq wire (wires/groq.py), driven by the real groq SDK (the `groq` stack): what the SDK
hands the user (text, tool calls, usage with Groq's timings, x_groq, finish reason, its error types) and what the
server recorded of each request."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import groq
import pytest

from .model_server import FakeModelServer, Reply
from .weather_loop import ANSWER, QUESTION, TOOLS, queue_tool_loop

MODEL = "llama-3.3-70b-versatile"



def second_messages(text: str, calls: list[Any]) -> list[Any]:
    return [QUESTION, {"role": "assistant", "content": text, "tool_calls": [
        {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
        for c in calls]},
        *({"role": "tool", "tool_call_id": c.id, "content": '{"temp_c": 21}'} for c in calls)]


def check_rounds(server: FakeModelServer, calls: list[Any], usage: Any, finish: str, text: str, usage2: Any,
                 *, stream: bool) -> None:
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert (usage.prompt_tokens, usage.completion_tokens, usage.prompt_tokens_details.cached_tokens, finish) == \
        (100, 20, 30, "tool_calls")
    assert usage.queue_time and usage.total_time
    assert (text, usage2.prompt_tokens) == (ANSWER, 140)
    one, two = server.requests
    assert one.path == "/openai/v1/chat/completions" and one.wire == "groq" and one.model == MODEL
    assert one.stream is stream and one.headers["authorization"] == "Bearer test-key"
    assert one.first_user_text == "Weather in Paris?" and one.body["max_completion_tokens"] == 256
    assert [t["function"]["name"] for t in one.body["tools"]] == ["get_weather"]
    assert two.tool_results == [{"id": calls[0].id, "content": '{"temp_c": 21}'}]


def test_tool_loop_sync(model_server: FakeModelServer) -> None:
    queue_tool_loop(model_server, cached_tokens=30)
    client = model_server.groq_client()
    first = client.chat.completions.create(model=MODEL, messages=[QUESTION], tools=TOOLS, max_completion_tokens=256)
    m = first.choices[0].message
    assert first.x_groq and first.x_groq.id.startswith("req_")
    second = client.chat.completions.create(model=MODEL, messages=second_messages(m.content, m.tool_calls),
                                            tools=TOOLS, max_completion_tokens=256)
    check_rounds(model_server, m.tool_calls, first.usage, first.choices[0].finish_reason,
                 second.choices[0].message.content, second.usage, stream=False)


def test_tool_loop_async(model_server: FakeModelServer) -> None:
    queue_tool_loop(model_server, cached_tokens=30)
    client = model_server.async_groq_client()

    async def run() -> tuple[Any, Any]:
        first = await client.chat.completions.create(model=MODEL, messages=[QUESTION], tools=TOOLS,
                                                     max_completion_tokens=256)
        m = first.choices[0].message
        second = await client.chat.completions.create(model=MODEL, messages=second_messages(m.content, m.tool_calls),
                                                      tools=TOOLS, max_completion_tokens=256)
        return first, second

    first, second = asyncio.run(run())
    check_rounds(model_server, first.choices[0].message.tool_calls, first.usage, first.choices[0].finish_reason,
                 second.choices[0].message.content, second.usage, stream=False)


class Call:
    def __init__(self, id: str) -> None:
        self.id, self.function = id, type("F", (), {"name": "", "arguments": ""})()


def gather(chunks: list[Any]) -> tuple[str, list[Any], Any, str]:
    """A user's loop over a Groq stream: text, calls from their fragments, and x_groq.usage of the final chunk."""
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    calls: list[Any] = []
    for c in chunks:
        for tc in c.choices[0].delta.tool_calls or ():
            if tc.id:
                calls.append(Call(tc.id))
            calls[tc.index].function.name += tc.function.name or ""
            calls[tc.index].function.arguments += tc.function.arguments or ""
    assert chunks[0].x_groq and chunks[0].x_groq.id
    last = chunks[-1]
    assert last.x_groq and last.x_groq.usage
    return text, calls, last.x_groq.usage, last.choices[0].finish_reason


def test_tool_loop_streamed(model_server: FakeModelServer) -> None:
    queue_tool_loop(model_server, cached_tokens=30)
    client = model_server.groq_client()
    text, calls, usage, finish = gather(list(client.chat.completions.create(
        model=MODEL, messages=[QUESTION], tools=TOOLS, max_completion_tokens=256, stream=True)))
    assert text == "Let me look."

    async def run() -> list[Any]:
        stream = await model_server.async_groq_client().chat.completions.create(
            model=MODEL, messages=second_messages(text, calls), tools=TOOLS, max_completion_tokens=256, stream=True)
        return [c async for c in stream]

    text2, _, usage2, finish2 = gather(asyncio.run(run()))
    assert finish2 == "stop"
    check_rounds(model_server, calls, usage, finish, text2, usage2, stream=True)


@pytest.mark.parametrize(("status", "kind"), [(400, groq.BadRequestError), (429, groq.RateLimitError),
                                              (503, groq.InternalServerError)])
def test_http_errors(model_server: FakeModelServer, status: int, kind: type[groq.APIStatusError]) -> None:
    model_server.queue(Reply.error(status, "no such luck"))
    with pytest.raises(kind) as caught:
        model_server.groq_client().chat.completions.create(model=MODEL, messages=[QUESTION])
    assert caught.value.status_code == status and "no such luck" in str(caught.value)


def test_mid_stream_error(model_server: FakeModelServer) -> None:
    model_server.queue(Reply.stream_failure(after=2, message="model overloaded"))
    got: list[str] = []
    with pytest.raises(groq.APIError, match="model overloaded"):
        for chunk in model_server.groq_client().chat.completions.create(model=MODEL, messages=[QUESTION],
                                                                        stream=True):
            got.append(chunk.choices[0].delta.content or "")
    assert got == ["", "This "]
