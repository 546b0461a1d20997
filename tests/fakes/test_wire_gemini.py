"""The fake model server's Gemini wire (wires/gemini.py), driven by the real google-genai SDK (the `gemini` stack):
what the SDK hands the user (text, function calls, usage, finish reason, its own error types) and what the server
recorded of each request, for the adapters' tests to check what was sent."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from google.genai import errors, types

from .model_server import FakeModelServer, Reply, ToolCall, Usage

MODEL = "gemini-2.5-flash"
WEATHER = types.Tool(function_declarations=[types.FunctionDeclaration(
    name="get_weather", description="The weather in a city.",
    parameters_json_schema={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)])
CONFIG = types.GenerateContentConfig(tools=[WEATHER], max_output_tokens=256)


def script(server: FakeModelServer) -> None:
    server.queue(
        Reply(text="Let me look.", tool_calls=[ToolCall("get_weather", {"city": "Paris"})],
              usage=Usage(100, 20, cached_tokens=30, reasoning_tokens=5)),
        Reply(text="21 °C and dry in Paris.", usage=Usage(140, 9)),
    )


def second_turn(first: types.GenerateContentResponse) -> list[types.Content]:
    """The conversation after round one: the question, the model's turn as it came, the function's result."""
    assert first.candidates and first.candidates[0].content
    return [
        types.Content(role="user", parts=[types.Part(text="Weather in Paris?")]),
        first.candidates[0].content,
        types.Content(role="user", parts=[types.Part.from_function_response(name="get_weather",
                                                                           response={"temp_c": 21})]),
    ]


def check_rounds(server: FakeModelServer, first: Any, second: Any, *, stream: bool) -> None:
    """What the user got from both rounds, and what the server recorded."""
    assert [(c.name, c.args) for c in first.function_calls] == [("get_weather", {"city": "Paris"})]
    assert first.function_calls[0].id is None  # the Developer API sends none
    u = first.usage_metadata
    assert (u.prompt_token_count, u.candidates_token_count, u.thoughts_token_count, u.cached_content_token_count,
            u.total_token_count) == (100, 20, 5, 30, 125)
    assert first.candidates[0].finish_reason == types.FinishReason.STOP
    assert second.usage_metadata.prompt_token_count == 140 and second.usage_metadata.thoughts_token_count is None
    assert second.candidates[0].finish_reason == types.FinishReason.STOP

    one, two = server.requests
    method = "streamGenerateContent" if stream else "generateContent"
    assert one.path.endswith(f"/models/{MODEL}:{method}") and one.wire == "gemini"
    assert one.model == MODEL and one.stream is stream and ("alt=sse" in one.query) is stream
    assert one.headers["x-goog-api-key"] == "test-key"
    assert one.first_user_text == "Weather in Paris?"
    declared = one.body["tools"][0]["functionDeclarations"]
    assert [d["name"] for d in declared] == ["get_weather"]
    assert one.body["generationConfig"]["maxOutputTokens"] == 256
    assert two.tool_results == [{"id": None, "name": "get_weather", "content": {"temp_c": 21}}]
    model_turn = two.body["contents"][1]
    assert model_turn["role"] == "model"
    assert {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}} in model_turn["parts"]


def test_tool_loop_sync(model_server: FakeModelServer) -> None:
    script(model_server)
    client = model_server.gemini_client()
    first = client.models.generate_content(model=MODEL, contents="Weather in Paris?", config=CONFIG)
    assert first.text == "Let me look."
    second = client.models.generate_content(model=MODEL, contents=second_turn(first), config=CONFIG)
    assert second.text == "21 °C and dry in Paris."
    check_rounds(model_server, first, second, stream=False)


def test_tool_loop_async(model_server: FakeModelServer) -> None:
    script(model_server)
    client = model_server.gemini_client()

    async def run() -> tuple[Any, Any]:
        first = await client.aio.models.generate_content(model=MODEL, contents="Weather in Paris?", config=CONFIG)
        second = await client.aio.models.generate_content(model=MODEL, contents=second_turn(first), config=CONFIG)
        return first, second

    first, second = asyncio.run(run())
    assert second.text == "21 °C and dry in Paris."
    check_rounds(model_server, first, second, stream=False)


def test_tool_loop_streamed(model_server: FakeModelServer) -> None:
    """Text in several chunks, the function call whole in one, finish reason and full usage in the last."""
    script(model_server)
    client = model_server.gemini_client()
    chunks = list(client.models.generate_content_stream(model=MODEL, contents="Weather in Paris?", config=CONFIG))
    assert len(chunks) > 2
    assert "".join(c.text or "" for c in chunks) == "Let me look."
    assert [c.candidates[0].finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    calls = [fc for c in chunks for fc in c.function_calls or ()]
    # the second round as a user's loop builds it from the chunks: their parts, in order
    first_turn = types.Content(role="model", parts=[p for c in chunks for p in c.candidates[0].content.parts])

    async def run() -> list[Any]:
        turns = [types.Content(role="user", parts=[types.Part(text="Weather in Paris?")]), first_turn,
                 types.Content(role="user", parts=[types.Part.from_function_response(
                     name="get_weather", response={"temp_c": 21})])]
        stream = await client.aio.models.generate_content_stream(model=MODEL, contents=turns, config=CONFIG)
        return [c async for c in stream]

    again = asyncio.run(run())
    assert "".join(c.text or "" for c in again) == "21 °C and dry in Paris."
    assert [(fc.name, fc.args) for fc in calls] == [("get_weather", {"city": "Paris"})]

    class Joined:  # what check_rounds reads: the calls of the whole stream, the last chunk's usage and finish
        def __init__(self, chunks: list[Any], calls: list[Any]) -> None:
            self.function_calls, self.usage_metadata, self.candidates = calls, chunks[-1].usage_metadata, \
                chunks[-1].candidates

    check_rounds(model_server, Joined(chunks, calls), Joined(again, []), stream=True)


def test_automatic_function_calling(model_server: FakeModelServer) -> None:
    """The SDK calls the user's function itself and sends its result back: two requests for one call."""
    script(model_server)
    seen: list[str] = []

    def get_weather(city: str) -> dict[str, int]:
        """The weather in a city."""
        seen.append(city)
        return {"temp_c": 21}

    client = model_server.gemini_client()
    response = client.models.generate_content(model=MODEL, contents="Weather in Paris?",
                                              config=types.GenerateContentConfig(tools=[get_weather]))
    assert response.text == "21 °C and dry in Paris." and seen == ["Paris"]
    one, two = model_server.requests
    assert one.body["tools"][0]["functionDeclarations"][0]["name"] == "get_weather"
    assert two.tool_results == [{"id": None, "name": "get_weather", "content": {"result": {"temp_c": 21}}}]
    history = response.automatic_function_calling_history
    assert history and [p.function_call.name for c in history for p in c.parts or () if p.function_call] == \
        ["get_weather"]


def test_chat_session(model_server: FakeModelServer) -> None:
    script(model_server)
    client = model_server.gemini_client()  # kept: a Client closes its HTTP client when collected
    chat = client.chats.create(model=MODEL, config=CONFIG)
    first = chat.send_message("Weather in Paris?")
    assert first.function_calls and first.function_calls[0].name == "get_weather"
    second = chat.send_message(types.Part.from_function_response(name="get_weather", response={"temp_c": 21}))
    assert second.text == "21 °C and dry in Paris."
    assert model_server.requests[1].tool_results[0]["name"] == "get_weather"
    assert len(model_server.requests[1].body["contents"]) == 3


@pytest.mark.parametrize(("stop", "expected"), [
    ("MAX_TOKENS", "MAX_TOKENS"), ("length", "MAX_TOKENS"), ("SAFETY", "SAFETY"), ("content_filter", "SAFETY"),
    ("RECITATION", "RECITATION"), ("tool_calls", "STOP"),
])
def test_finish_reasons(model_server: FakeModelServer, stop: str, expected: str) -> None:
    model_server.queue(Reply(text="Cut", stop=stop), Reply(text="Cut", stop=stop))
    client = model_server.gemini_client()
    assert client.models.generate_content(model=MODEL, contents="x").candidates[0].finish_reason == expected
    chunks = list(client.models.generate_content_stream(model=MODEL, contents="x"))
    assert chunks[-1].candidates[0].finish_reason == expected


@pytest.mark.parametrize(("status", "kind", "name"), [
    (400, errors.ClientError, "INVALID_ARGUMENT"), (429, errors.ClientError, "RESOURCE_EXHAUSTED"),
    (503, errors.ServerError, "UNAVAILABLE"),
])
def test_http_errors(model_server: FakeModelServer, status: int, kind: type[errors.APIError], name: str) -> None:
    model_server.queue(Reply.error(status, "no such luck"), Reply.error(status, "no such luck"))
    client = model_server.gemini_client()
    with pytest.raises(kind) as caught:
        client.models.generate_content(model=MODEL, contents="x")
    assert (caught.value.code, caught.value.status, caught.value.message) == (status, name, "no such luck")

    async def run() -> None:
        await client.aio.models.generate_content(model=MODEL, contents="x")

    with pytest.raises(kind):
        asyncio.run(run())
    assert [r.status for r in model_server.requests] == [status, status]


def test_mid_stream_error(model_server: FakeModelServer) -> None:
    """Two chunks of text, then Google's error object as a `data:` line: the SDK raises ServerError."""
    model_server.queue(Reply.stream_failure(after=2, message="backend fell over"),
                       Reply.stream_failure(after=2, message="backend fell over"))
    client = model_server.gemini_client()
    got: list[str] = []
    with pytest.raises(errors.ServerError) as caught:
        for chunk in client.models.generate_content_stream(model=MODEL, contents="x"):
            got.append(chunk.text or "")
    assert got == ["This ", "reply "]
    assert (caught.value.code, caught.value.message) == (500, "backend fell over")

    async def run() -> list[str]:
        out: list[str] = []
        async for chunk in await client.aio.models.generate_content_stream(model=MODEL, contents="x"):
            out.append(chunk.text or "")
        return out

    with pytest.raises(errors.ServerError):
        asyncio.run(run())


def test_vertex_mode(model_server: FakeModelServer) -> None:
    """Vertex AI's paths (project and location in them, an OAuth bearer token) answer the same bodies."""
    script(model_server)
    client = model_server.gemini_client(vertex=True)
    first = client.models.generate_content(model=MODEL, contents="Weather in Paris?", config=CONFIG)
    assert first.function_calls and first.function_calls[0].args == {"city": "Paris"}
    chunks = list(client.models.generate_content_stream(model=MODEL, contents=second_turn(first), config=CONFIG))
    assert "".join(c.text or "" for c in chunks) == "21 °C and dry in Paris."
    one, two = model_server.requests
    prefix = f"/v1beta1/projects/fake-project/locations/us-central1/publishers/google/models/{MODEL}"
    assert (one.path, two.path) == (f"{prefix}:generateContent", f"{prefix}:streamGenerateContent")
    assert one.model == MODEL and two.stream and one.headers["authorization"] == "Bearer fake-token"
    assert two.tool_results == [{"id": None, "name": "get_weather", "content": {"temp_c": 21}}]
