"""google-genai: the real SDK from PyPI (the `gemini` stack) at the fake model server's Gemini wire."""

from __future__ import annotations

import asyncio
import gc
import json
from functools import partial
from typing import Any

import pytest
from google.genai import errors, types

import interleaved
import loopscope
import switching
from fakes.model_server import FakeModelServer, Reply, ToolCall, Usage
from loopscope import LoopEndReason
from loopscope import semconv as a
from recorded import (
    SUMMARY_FIELDS,
    assert_never_recorded,
    assert_one_cancelled_call,
    assert_one_failed_call,
    hand_tool_loop,
    only_turn,
    rows,
)

API_KEY = "AIzaSy-genai-test-4f1d7c2e9b8a0635-secret"
MODEL = "gemini-2.5-flash"
QUESTION = "Weather in Paris?"
FIRST, FINAL = "Let me look.", "21 °C and dry in Paris."
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = types.Tool(function_declarations=[types.FunctionDeclaration(
    name="get_weather", description="The weather in a city.", parameters_json_schema=SCHEMA)])
CONFIG = types.GenerateContentConfig(tools=[WEATHER], max_output_tokens=256, temperature=0.2)
RESULT = {"temp_c": 21}
# what the turn's usage is: Gemini's thoughts counted into the output (20 + 5, + 9)
USAGES = ({"input_tokens": 100, "output_tokens": 25, "cache_read_input_tokens": 30, "reasoning_tokens": 5},
          {"input_tokens": 140, "output_tokens": 9})


def script(server: FakeModelServer, tag: str | None = None, *, call_id: str = "", city: str = "Paris",
           delay: float = 0.0) -> None:
    server.queue(
        Reply(text=FIRST, tool_calls=[ToolCall("get_weather", {"city": city}, id=call_id)], delay=delay,
              usage=Usage(100, 20, cached_tokens=30, reasoning_tokens=5)),
        Reply(text=f"21 °C and dry in {city}." if tag is None else f"It is 21 °C and sunny in {city}.",
              usage=Usage(140, 9)),
        match=tag,
    )


def get_weather(city: str) -> dict[str, int]:
    """The weather in a city."""
    return RESULT


# -- a hand-written loop in each of the SDK's ways ---------------------------------------------------


def merged(chunks: list[Any]) -> types.Content:
    """The model's turn a stream's chunks make: their parts, in order."""
    return types.Content(role="model", parts=[p for c in chunks for p in c.candidates[0].content.parts or ()])


def answer(content: types.Content, result: Any = RESULT) -> types.Part:
    [call] = [p.function_call for p in content.parts or () if p.function_call]
    assert call.args == {"city": "Paris"} or call.args["city"].startswith("city-")
    return types.Part(function_response=types.FunctionResponse(id=call.id, name=call.name, response=result))


def loop(client: Any, mode: str, question: str = QUESTION, result: Any = RESULT) -> None:
    """The two rounds, the function's result sent back by the application."""
    if mode.startswith("chat"):
        chat = client.chats.create(model=MODEL, config=CONFIG)
        if mode == "chat":
            first = chat.send_message(question).candidates[0].content
            chat.send_message(answer(first, result))
        else:
            first = merged(list(chat.send_message_stream(question)))
            list(chat.send_message_stream(answer(first, result)))
        return
    turns: list[Any] = [types.Content(role="user", parts=[types.Part(text=question)])]
    if mode == "sync":
        first = client.models.generate_content(model=MODEL, contents=turns, config=CONFIG).candidates[0].content
    else:
        first = merged(list(client.models.generate_content_stream(model=MODEL, contents=turns, config=CONFIG)))
    turns += [first, types.Content(role="user", parts=[answer(first, result)])]
    if mode == "sync":
        client.models.generate_content(model=MODEL, contents=turns, config=CONFIG)
    else:
        list(client.models.generate_content_stream(model=MODEL, contents=turns, config=CONFIG))


async def aloop(client: Any, mode: str, question: str = QUESTION, result: Any = RESULT) -> None:
    aio = client.aio
    if mode.startswith("achat"):
        chat = aio.chats.create(model=MODEL, config=CONFIG)
        if mode == "achat":
            first = (await chat.send_message(question)).candidates[0].content
            await chat.send_message(answer(first, result))
        else:
            first = merged([c async for c in await chat.send_message_stream(question)])
            [c async for c in await chat.send_message_stream(answer(first, result))]
        return
    turns: list[Any] = [types.Content(role="user", parts=[types.Part(text=question)])]
    if mode == "async":
        first = (await aio.models.generate_content(model=MODEL, contents=turns, config=CONFIG)).candidates[0].content
    else:
        first = merged([c async for c in await aio.models.generate_content_stream(model=MODEL, contents=turns,
                                                                                  config=CONFIG)])
    turns += [first, types.Content(role="user", parts=[answer(first, result)])]
    if mode == "async":
        await aio.models.generate_content(model=MODEL, contents=turns, config=CONFIG)
    else:
        [c async for c in await aio.models.generate_content_stream(model=MODEL, contents=turns, config=CONFIG)]


SYNC, ASYNC = ["sync", "stream", "chat", "chat_stream"], ["async", "astream", "achat", "achat_stream"]


def run(server: FakeModelServer, mode: str, **kwargs: Any) -> None:
    client = server.gemini_client(api_key=API_KEY, **kwargs)
    if mode in SYNC:
        loop(client, mode)
    else:
        asyncio.run(aloop(client, mode))


# -- what is recorded ---------------------------------------------------------------------------------


ROWS = [
    ("message", "user", QUESTION),
    ("message", "assistant", FIRST),
    ("tool_call_start", "get_weather", "", {"city": "Paris"}, None, "pending", None, None),
    ("tool_call_end", "get_weather", "", {"city": "Paris"}, RESULT, "completed", "served", None),
    ("message", "assistant", FINAL),
]


def hand_summary(recording: Any, *, streaming: bool, provider: str = "gcp.gemini") -> dict[str, Any]:
    """The same two rounds through the hand API (loopscope.turn, Turn.round, @loopscope.tool)."""

    t = hand_tool_loop("hand", model=MODEL, provider=provider, streaming=streaming, tools=[WEATHER], question=QUESTION,
                       texts=(FIRST, FINAL), usages=USAGES, stops=("STOP", "STOP"), result=RESULT, response_model=MODEL)
    loopscope.flush()
    assert rows(recording.store, "hand") == ROWS
    return t.response.model_dump(include=SUMMARY_FIELDS)


@pytest.mark.parametrize("mode", SYNC + ASYNC)
def test_a_tool_loop_is_the_turn_the_hand_api_records(instrumented, server, mode):
    script(server)
    with loopscope.session("conv-1"):
        run(server, mode)
    turn = only_turn(instrumented)
    assert rows(instrumented.store, "conv-1") == ROWS
    streaming = "stream" in mode
    summary = turn.model_dump(include=SUMMARY_FIELDS)
    assert summary == hand_summary(instrumented, streaming=streaming)
    assert summary["usage"] == {"input_tokens": 240, "output_tokens": 34, "cache_read_input_tokens": 30,
                                "reasoning_tokens": 5}
    assert (turn.loop_end_reason, turn.round_count, turn.provider) == (LoopEndReason.COMPLETED, 1, "gcp.gemini")

    chats = instrumented.spans(a.OP_CHAT)
    [agent] = [s for s in instrumented.spans(a.OP_INVOKE_AGENT) if s.attributes[a.CONVERSATION_ID] == "conv-1"]
    assert len(chats) == 4 and len(server.requests) == 2  # the SDK's two calls, the hand API's two rounds
    mine = [c for c in chats if c.parent.span_id == agent.context.span_id]
    assert len(mine) == 2
    first = mine[0].attributes
    assert (first[a.PROVIDER], first[a.REQUEST_MODEL], first[a.RESPONSE_MODEL]) == ("gcp.gemini", MODEL, MODEL)
    assert first[a.RESPONSE_FINISH_REASONS] == ("STOP",) and first[a.RESPONSE_ID] == "fake00001"
    assert (first["server.address"], first["server.port"]) == ("127.0.0.1", server.port)
    assert first["gen_ai.request.max_tokens"] == 256 and first["gen_ai.request.temperature"] == 0.2
    assert first.get(a.REQUEST_STREAM, False) is streaming
    assert json.loads(first["gen_ai.tool.definitions"]) == [
        {"type": "function", "name": "get_weather", "description": "The weather in a city.", "parameters": SCHEMA}]
    asked, *saids, sent = json.loads(mine[1].attributes[a.INPUT_MESSAGES])
    said = {"role": saids[0]["role"], "parts": [p for m in saids for p in m["parts"]]}  # a chat keeps each chunk's
    assert asked == {"role": "user", "parts": [{"type": "text", "content": QUESTION}]}
    assert said["role"] == "assistant"  # a streamed answer sent back as its chunks' parts: a text part each
    assert "".join(p["content"] for p in said["parts"] if p["type"] == "text") == FIRST
    assert said["parts"][-1] == {"type": "tool_call", "id": None, "name": "get_weather", "arguments": {"city": "Paris"}}
    assert sent == {"role": "tool", "parts": [{"type": "tool_call_response", "id": None, "response": RESULT}]}
    _, calls = instrumented.store.sql("SELECT provider, outcome, input_tokens, output_tokens, cost_usd FROM model_calls "
                                      "WHERE session_id = 'conv-1' ORDER BY started_at")
    assert [c[:4] for c in calls] == [("gcp.gemini", "completed", 100, 25), ("gcp.gemini", "completed", 140, 9)]
    assert all(c[4] is not None and c[4] > 0 for c in calls)  # priced as Google's gemini-2.5-flash


# -- automatic function calling: the SDK runs the functions -------------------------------------------------


AFC_CONFIG = types.GenerateContentConfig(tools=[get_weather])


def afc(server: FakeModelServer, mode: str, function: Any = get_weather) -> Any:
    client = server.gemini_client(api_key=API_KEY)
    config = types.GenerateContentConfig(tools=[function])
    if mode == "sync":
        return client.models.generate_content(model=MODEL, contents=QUESTION, config=config).text
    if mode == "stream":
        return "".join(c.text or "" for c in client.models.generate_content_stream(model=MODEL, contents=QUESTION,
                                                                                   config=config))
    if mode == "chat":
        return client.chats.create(model=MODEL, config=config).send_message(QUESTION).text

    async def main() -> Any:
        if mode == "async":
            return (await client.aio.models.generate_content(model=MODEL, contents=QUESTION, config=config)).text
        if mode == "achat":
            return (await client.aio.chats.create(model=MODEL, config=config).send_message(QUESTION)).text
        stream = await client.aio.models.generate_content_stream(model=MODEL, contents=QUESTION, config=config)
        return "".join([c.text or "" async for c in stream])

    return asyncio.run(main())


@pytest.mark.parametrize("mode", ["sync", "stream", "chat", "async", "astream", "achat"])
def test_automatic_function_calling_is_one_turn_with_the_functions_runs(instrumented, server, mode):
    script(server)
    ran: list[str] = []

    def get_weather(city: str) -> dict[str, int]:
        """The weather in a city."""
        ran.append(city)
        return RESULT

    with loopscope.session("afc"):
        assert afc(server, mode, get_weather) == (FIRST + FINAL if "stream" in mode else FINAL)  # a stream: both rounds
    assert ran == ["Paris"]
    turn = only_turn(instrumented)
    assert rows(instrumented.store, "afc") == ROWS
    assert (turn.loop_end_reason, turn.round_count, turn.tool_calls_count) == (LoopEndReason.COMPLETED, 1, 1)
    assert [(d.name, d.description, d.parameters) for d in turn.declared_tools] == [
        ("get_weather", "The weather in a city.", {"type": "object", "properties": {"city": {"title": "City", "type": "string"}},
                                                   "required": ["city"], "additionalProperties": False})]
    [end] = [e.content for e in instrumented.store.get_timeline("afc") if e.type == "tool_call_end"]
    assert end.duration_ms is not None and end.duration_ms >= 0
    [tool] = instrumented.spans(a.OP_EXECUTE_TOOL)
    [agent] = instrumented.spans(a.OP_INVOKE_AGENT)
    chats = instrumented.spans(a.OP_CHAT)
    assert len(chats) == 2 == len(server.requests)
    assert all(s.parent.span_id == agent.context.span_id for s in [*chats, tool])


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_function_that_raises_is_a_failed_tool_call(instrumented, server, mode):
    script(server)

    def get_weather(city: str) -> dict[str, int]:
        """The weather in a city."""
        raise ValueError(f"no weather station in {city}")

    with loopscope.session("afc-err"):
        afc(server, mode, get_weather)
    assert server.requests[1].tool_results[0]["content"]["error"].endswith("no weather station in Paris")
    [end] = [e.content for e in instrumented.store.get_timeline("afc-err") if e.type == "tool_call_end"]
    assert (end.status, end.outcome) == ("failed", "failed")
    assert "ValueError" in end.error and "no weather station in Paris" in end.error
    assert only_turn(instrumented).tool_calls_count == 1


# -- the answer: finish reasons, thoughts, cached tokens, a blocked prompt ----------------------------------


@pytest.mark.parametrize(("stop", "outcome", "end"), [
    ("MAX_TOKENS", "truncated", LoopEndReason.TRUNCATED),
    ("SAFETY", "content_filter", LoopEndReason.CONTENT_FILTER),
    ("RECITATION", "content_filter", LoopEndReason.CONTENT_FILTER),
    ("BLOCKLIST", "content_filter", LoopEndReason.CONTENT_FILTER),
    ("PROHIBITED_CONTENT", "content_filter", LoopEndReason.CONTENT_FILTER),
    ("SPII", "content_filter", LoopEndReason.CONTENT_FILTER),
    ("OTHER", "completed", LoopEndReason.COMPLETED),
])
@pytest.mark.parametrize("stream", [False, True])
def test_finish_reasons_give_the_outcome(instrumented, server, stop, outcome, end, stream):
    server.queue(Reply(text="Cut", stop=stop))
    client = server.gemini_client()  # kept: a client closes its HTTP client when collected
    models = client.models
    if stream:
        list(models.generate_content_stream(model=MODEL, contents="x"))
    else:
        models.generate_content(model=MODEL, contents="x")
    turn = only_turn(instrumented)
    assert turn.loop_end_reason == end
    _, [(reason, got)] = instrumented.store.sql("SELECT finish_reasons, outcome FROM model_calls")
    assert (json.loads(reason), got) == ([stop], outcome)


def body(parts: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
    return {"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
            "modelVersion": MODEL, "responseId": "resp-1", **more}


def test_thoughts_are_the_turns_thinking_counted_apart_from_the_answer(instrumented, server):
    usage = {"promptTokenCount": 50, "candidatesTokenCount": 7, "thoughtsTokenCount": 40, "cachedContentTokenCount": 20,
             "totalTokenCount": 97}
    server.queue(Reply(raw_body=body([{"text": "The user wants a haiku.", "thought": True}, {"text": "Autumn moon."}],
                                     usageMetadata=usage)))
    config = types.GenerateContentConfig(thinking_config=types.ThinkingConfig(include_thoughts=True, thinking_budget=64),
                                         cached_content="cachedContents/abc")
    client = server.gemini_client()
    response = client.models.generate_content(model=MODEL, contents="A haiku", config=config)
    assert response.text == "Autumn moon."
    turn = only_turn(instrumented)
    assert (turn.thinking, turn.segments) == ("The user wants a haiku.", ["Autumn moon."])
    assert turn.usage == {"input_tokens": 50, "output_tokens": 47, "cache_read_input_tokens": 20, "reasoning_tokens": 40}
    [chat] = instrumented.spans(a.OP_CHAT)
    assert json.loads(chat.attributes[a.USAGE_PROVIDER])["thoughts_token_count"] == 40
    _, [(parameters,)] = instrumented.store.sql("SELECT parameters FROM model_calls")
    stored = json.loads(parameters)
    assert stored["thinking"] == {"include_thoughts": True, "thinking_budget": 64}
    assert stored["other"] == {"cached_content": "cachedContents/abc"}


def test_streamed_thoughts_are_the_turns_thinking(instrumented, server):
    """Thought parts come in chunks of their own before the answer's; the last chunk has the usage."""
    chunks = [body([{"text": "Thinking of ", "thought": True}]), body([{"text": "a haiku.", "thought": True}]),
              body([{"text": "Autumn "}]), body([{"text": "moon."}], usageMetadata={
                  "promptTokenCount": 50, "candidatesTokenCount": 7, "thoughtsTokenCount": 40, "totalTokenCount": 97})]
    for chunk in chunks[:-1]:
        del chunk["candidates"][0]["finishReason"]
    server.queue(Reply(raw_body="".join(f"data: {json.dumps(c)}\r\n\r\n" for c in chunks)))
    client = server.gemini_client()
    stream = client.models.generate_content_stream(model=MODEL, contents="A haiku")
    assert "".join(c.text or "" for c in stream) == "Autumn moon."
    turn = only_turn(instrumented)
    assert (turn.thinking, turn.segments) == ("Thinking of a haiku.", ["Autumn moon."])
    assert turn.usage == {"input_tokens": 50, "output_tokens": 47, "reasoning_tokens": 40}
    [chat] = instrumented.spans(a.OP_CHAT)
    assert chat.attributes[a.REQUEST_STREAM] is True and chat.attributes[a.RESPONSE_FINISH_REASONS] == ("STOP",)


def test_a_blocked_prompt_is_a_content_filter(instrumented, server):
    server.queue(Reply(raw_body={"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": {"promptTokenCount": 8},
                                 "modelVersion": MODEL}))
    client = server.gemini_client()
    response = client.models.generate_content(model=MODEL, contents="something bad")
    assert response.prompt_feedback.block_reason == types.BlockedReason.SAFETY
    assert only_turn(instrumented).loop_end_reason == LoopEndReason.CONTENT_FILTER
    _, [(reason, outcome)] = instrumented.store.sql("SELECT finish_reasons, outcome FROM model_calls")
    assert (json.loads(reason), outcome) == (["SAFETY"], "content_filter")


def test_system_instruction_and_plain_contents(instrumented, server):
    server.queue(Reply(text="Bonjour."))
    config = {"system_instruction": "Answer in French.", "top_k": 4, "stop_sequences": ["END"], "seed": 7}
    client = server.gemini_client()
    client.models.generate_content(model="models/" + MODEL, contents=["Hello", "there"], config=config)
    [chat] = instrumented.spans(a.OP_CHAT)
    attributes = chat.attributes
    assert attributes[a.REQUEST_MODEL] == MODEL
    assert json.loads(attributes["gen_ai.system_instructions"]) == [{"type": "text", "content": "Answer in French."}]
    assert json.loads(attributes[a.INPUT_MESSAGES]) == [
        {"role": "user", "parts": [{"type": "text", "content": "Hello"}, {"type": "text", "content": "there"}]}]
    assert (attributes["gen_ai.request.top_k"], attributes["gen_ai.request.seed"]) == (4, 7)
    assert attributes["gen_ai.request.stop_sequences"] == ("END",)


# -- errors ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "kind"), [(429, errors.ClientError), (503, errors.ServerError)])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_http_error_is_a_failed_call(instrumented, server, status, kind, mode):
    server.queue(Reply.error(status, "no such luck"))
    client = server.gemini_client()
    with pytest.raises(kind):
        if mode == "sync":
            client.models.generate_content(model=MODEL, contents="x")
        else:
            asyncio.run(client.aio.models.generate_content(model=MODEL, contents="x"))
    assert_one_failed_call(instrumented, kind.__qualname__)


@pytest.mark.parametrize("mode", ["stream", "astream"])
def test_a_mid_stream_error_is_a_failed_call_with_what_came(instrumented, server, mode):
    server.queue(Reply.stream_failure(after=2, message="backend fell over"))
    client = server.gemini_client()
    with pytest.raises(errors.ServerError):
        if mode == "stream":
            list(client.models.generate_content_stream(model=MODEL, contents="x"))
        else:
            async def main() -> None:
                [c async for c in await client.aio.models.generate_content_stream(model=MODEL, contents="x")]

            asyncio.run(main())
    chat = assert_one_failed_call(instrumented, "ServerError")
    assert chat.attributes[a.ROUND_TEXT] == "This reply "


# -- streams let go early ------------------------------------------------------------------------------------


COUNT = "one two three four five six seven eight nine ten eleven twelve"


def test_a_stream_closed_early_ends_its_call_once(instrumented, server):
    server.queue(Reply(text=COUNT), Reply(text="Hello."))
    client = server.gemini_client()
    models = client.models
    stream = models.generate_content_stream(model=MODEL, contents="Count")
    for _, _chunk in zip(range(3), stream):
        pass
    stream.close()
    assert_one_cancelled_call(instrumented, then=lambda: models.generate_content(model=MODEL, contents="Hi"))
    assert instrumented.spans(a.OP_CHAT)[0].attributes[a.ROUND_TEXT].startswith("one two")


def test_a_stream_dropped_unread_is_collected(instrumented, server):
    server.queue(Reply(text=COUNT))
    client = server.gemini_client()
    stream = client.models.generate_content_stream(model=MODEL, contents="Count")
    next(stream)
    del stream
    gc.collect()
    assert_one_cancelled_call(instrumented)


def test_an_async_stream_closed_early_ends_its_call_once(instrumented, server):
    server.queue(Reply(text=COUNT))

    async def main() -> None:
        client = server.gemini_client()
        stream = await client.aio.models.generate_content_stream(model=MODEL, contents="Count")
        async for _chunk in stream:
            break
        await stream.aclose()

    asyncio.run(main())
    # aclose() closes the SDK's outer generator; the inner ones (its continuation's, our proxy's)
    # are left to asyncio's finalizer, in a cycle with the loop's: collected, they end the call
    gc.collect()
    assert_one_cancelled_call(instrumented)


# -- concurrency ----------------------------------------------------------------------------------------------


def test_twenty_interleaved_async_conversations(instrumented, server):
    """One client; a chat keeps its messages itself, so each conversation is :func:`aloop` whole."""
    client = server.gemini_client()
    interleaved.run_async(instrumented, server, seed=5, queue=partial(script, server), call_id="call_c{i:02d}",
                          client=lambda i: client, modes=ASYNC,
                          loop=lambda client, mode, i: aloop(client, mode, f"[conv-{i}] weather?", {"output": f"sunny in city-{i}"}))


# -- Vertex AI ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "astream"])
def test_vertex_ai_is_its_own_provider(instrumented, server, mode):
    script(server)
    with loopscope.session("vertex"):
        client = server.gemini_client(vertex=True)
        if mode == "sync":
            loop(client, "sync")
        else:
            asyncio.run(aloop(client, "astream"))
    turn = only_turn(instrumented)
    assert rows(instrumented.store, "vertex") == ROWS
    assert turn.model_dump(include=SUMMARY_FIELDS) == hand_summary(instrumented, streaming=mode == "astream",
                                                                    provider="gcp.vertex_ai")
    assert server.requests[0].path.startswith("/v1beta1/projects/fake-project/")
    assert {c.attributes[a.PROVIDER] for c in instrumented.spans(a.OP_CHAT)} == {"gcp.vertex_ai"}


# -- secrets, instrumenting, one record per call -----------------------------------------------------------------


def test_api_keys_and_auth_headers_are_never_recorded(instrumented, server):
    script(server)
    script(server)
    run(server, "stream")
    with loopscope.session("vertex"):
        client = server.gemini_client(vertex=True)
        loop(client, "sync")
    loopscope.flush()
    assert server.requests[0].headers["x-goog-api-key"] == API_KEY
    assert server.requests[-1].headers["authorization"] == "Bearer fake-token"
    assert_never_recorded(instrumented, API_KEY, "x-goog-api-key", "fake-token", "Bearer", present=("get_weather", "Paris"))


def test_instrument_twice_is_once_and_uninstrument_restores(recording, server):
    from google.genai import _extra_utils, models

    def originals() -> tuple[Any, ...]:
        return (models.Models.__dict__["_generate_content"], models.AsyncModels.__dict__["_generate_content_stream"],
                _extra_utils.invoke_function_from_dict_args)

    before = originals()

    def calls() -> None:
        assert originals()[0] is not before[0]
        script(server)
        afc(server, "sync")
        loopscope.flush()
        assert len(recording.spans(a.OP_EXECUTE_TOOL)) == 1

    def after() -> None:
        script(server)
        afc(server, "sync")

    switching.assert_instrument_twice_is_once(recording, chats=2, calls=calls, after=after, originals=originals)
    assert len(server.requests) == 4 and len(recording.spans(a.OP_EXECUTE_TOOL)) == 1


@pytest.mark.parametrize("mode", ["chat", "achat"])
def test_a_chats_questions_are_turns_of_one_session(instrumented, server, mode):
    server.queue(Reply(text="Hello to you."), Reply(text="Fine, thanks."))
    client = server.gemini_client()
    if mode == "chat":
        chat = client.chats.create(model=MODEL)
        chat.send_message("Hello")
        chat.send_message("How are you?")
    else:
        async def main() -> None:
            chat = client.aio.chats.create(model=MODEL)
            await chat.send_message("Hello")
            await chat.send_message("How are you?")

        asyncio.run(main())
    loopscope.flush()
    turns = instrumented.store.list_turns(limit=None)
    assert sorted(t.response_content for t in turns) == ["Fine, thanks.", "Hello to you."]
    assert len({t.session_id for t in turns}) == 1  # the second continues the first's conversation
    _, [(count,)] = instrumented.store.sql("SELECT count(*) FROM model_calls")
    assert count == len(server.requests) == 2  # one call, one record
