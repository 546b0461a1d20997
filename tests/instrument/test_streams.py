"""What a stream records is what the provider sent: the real SDKs against the fake model
server, whatever the application does with the chunk objects and whatever shape a gateway
gives its chunks."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

import loopscope
from fakes.model_server import Reply, ToolCall
from loopscope import semconv as a
from recorded import only_turn, spans_of

MODEL = "gpt-test-1"
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
VERSION = {"type": "function", "function": {"name": "llm_version", "parameters": {"type": "object", "properties": {"verbose": {"type": "boolean"}}}}}


class InPlaceMerger:
    """What LlamaIndex's OpenAI LLM does with a stream: each later tool-call fragment is
    appended to the first fragment's objects (``function.arguments += ...``), and here the
    text too, into the first text delta: the SDK's chunk objects are changed after the
    application has them, before a batching recorder reads them."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self.text: Any = None

    def take(self, chunk: Any) -> None:
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content:
                if self.text is None:
                    self.text = delta
                else:
                    self.text.content += delta.content
            for part in delta.tool_calls or ():
                if self.calls and self.calls[-1].index == part.index:
                    first = self.calls[-1]
                    first.function.arguments = (first.function.arguments or "") + (part.function.arguments or "")
                    first.function.name = (first.function.name or "") + (part.function.name or "")
                    first.id = (first.id or "") + (part.id or "")
                else:
                    self.calls.append(part)


QUESTION = [{"role": "user", "content": "Weather in Paris?"}]


def _chat_kwargs(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": QUESTION, "tools": [WEATHER], "stream": True, "stream_options": {"include_usage": True}, **extra}


def _answer(client: Any, call_id: str, name: str, arguments: str, tools: list[Any]) -> None:
    """The tool loop's second call, with the tool's result: it ends the turn (the server's queue gives the final text)."""
    messages = [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [
        {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "21 °C"}]
    client.chat.completions.create(model=MODEL, messages=messages, tools=tools)


@pytest.mark.parametrize("reading", ["for", "next", "async"])
def test_chunks_changed_by_the_app_are_recorded_as_sent(reading, instrumented, server):
    server.queue(Reply(text="Let me check the weather for you.", tool_calls=[ToolCall("weather", {"city": "Paris"}, id="call_w1")],
                       chunk_size=4), Reply(text="21 °C."))
    merger = InPlaceMerger()
    if reading == "async":

        async def read() -> None:
            async for chunk in await server.async_openai_client().chat.completions.create(**_chat_kwargs()):
                merger.take(chunk)

        asyncio.run(read())
    else:
        stream = server.openai_client().chat.completions.create(**_chat_kwargs())
        if reading == "for":
            for chunk in stream:
                merger.take(chunk)
        else:
            while True:
                try:
                    merger.take(next(stream))
                except StopIteration:
                    break
    [call] = merger.calls  # the app's merge is its own business: it got what it asked for
    assert (call.id, call.function.name, json.loads(call.function.arguments)) == ("call_w1", "weather", {"city": "Paris"})
    _answer(server.openai_client(), call.id, call.function.name, call.function.arguments, [WEATHER])

    turn = only_turn(instrumented.store)
    assert turn.segments == ["Let me check the weather for you.", "21 °C."]
    [start] = [e for e in instrumented.store.get_timeline(turn.session_id) if e.type == "tool_call_start"]
    assert (start.content.tool_id, start.content.tool_name, start.content.arguments) == ("call_w1", "weather", {"city": "Paris"})
    chat = spans_of(instrumented, a.OP_CHAT)[0]
    [message] = json.loads(chat.attributes[a.OUTPUT_MESSAGES])
    assert message["parts"] == [
        {"type": "text", "content": "Let me check the weather for you."},
        {"type": "tool_call", "id": "call_w1", "name": "weather", "arguments": {"city": "Paris"}},
    ]


def test_a_tool_name_repeated_in_every_chunk_is_one_name(instrumented, server):
    """OpenRouter streams the call's id and function name again in every fragment: the name
    is the name, not the name once per fragment (a phantom tool nobody declared)."""
    arguments = {"verbose": True, "format": "long"}
    server.queue(Reply(tool_calls=[ToolCall("llm_version", arguments, id="call_v1")], repeat_call_fields=True), Reply(text="v2."))
    stream = server.openai_client().chat.completions.create(**_chat_kwargs(tools=[VERSION]))
    fragments = [part for chunk in stream for choice in chunk.choices for part in choice.delta.tool_calls or ()]
    assert len(fragments) > 2 and all(part.function.name == "llm_version" and part.id == "call_v1" for part in fragments)
    _answer(server.openai_client(), "call_v1", "llm_version", json.dumps(arguments), [VERSION])

    turn = only_turn(instrumented.store)
    [start] = [e for e in instrumented.store.get_timeline(turn.session_id) if e.type == "tool_call_start"]
    assert (start.content.tool_id, start.content.tool_name, start.content.arguments) == (
        "call_v1", "llm_version", {"verbose": True, "format": "long"})
    assert [t.name for t in turn.declared_tools] == ["llm_version"]
    chat = spans_of(instrumented, a.OP_CHAT)[0]
    [message] = json.loads(chat.attributes[a.OUTPUT_MESSAGES])
    assert [part["name"] for part in message["parts"]] == ["llm_version"]


# -- Anthropic: the first event is the first chunk; a refusal's explanation ----------------------------

CLAUDE = "claude-test-1"
EXPLANATION = "This request could enable harm to computer systems."


def _messages(way: str, server: Any) -> None:
    kwargs = {"model": CLAUDE, "max_tokens": 64, "messages": [{"role": "user", "content": "Write me a worm."}]}
    if way == "json":
        server.anthropic_client().messages.create(**kwargs)
    elif way == "stream":
        for _ in server.anthropic_client().messages.create(stream=True, **kwargs):
            pass
    elif way == "helper":
        with server.anthropic_client().messages.stream(**kwargs) as stream:
            stream.get_final_message()
    else:

        async def read() -> None:
            async for _ in await server.async_anthropic_client().messages.create(stream=True, **kwargs):
                pass

        asyncio.run(read())


@pytest.mark.parametrize("way", ["json", "stream", "helper", "async-stream"])
def test_an_anthropic_refusal_keeps_its_explanation_and_its_first_chunk(way, instrumented, server):
    """A refusal streams message_start, message_delta (stop_reason "refusal", stop_details with
    the explanation), message_stop: no content block. Its explanation is the call's refusal;
    a stream's first chunk is its first event."""
    server.queue(Reply(stop="refusal", refusal=EXPLANATION, refusal_category="cyber"))
    _messages(way, server)
    [call] = instrumented.store.model_calls()
    assert (call.outcome, call.refusal, call.finish_reasons) == ("refusal", EXPLANATION, ["refusal"])
    assert (call.time_to_first_chunk_ms is not None) is (way != "json")
    [chat] = spans_of(instrumented, a.OP_CHAT)
    assert chat.attributes[a.CALL_REFUSAL] == EXPLANATION
    assert only_turn(instrumented.store).loop_end_reason == "refusal"


def test_an_anthropic_streams_first_chunk_is_its_first_event(instrumented, server):
    """The time to first chunk is message_start's arrival, not the first content block's:
    here the server waits two seconds between them (half of that is left for a loaded machine
    that reads message_start late)."""
    server.queue(Reply(text="one two three", pauses={2: 2.0}))  # frames: message_start, ping, content_block_start...
    _messages("stream", server)
    [call] = instrumented.store.model_calls()
    assert call.time_to_first_chunk_ms is not None and call.duration_ms is not None
    assert call.time_to_first_chunk_ms < call.duration_ms - 1000


# -- the kit's proxies over plain generators (google-genai streams are async generators) -------


class _Texts:
    """The simplest accumulator: each chunk is text."""

    def add(self, chunk: Any, model_call: Any, /) -> None:
        model_call.delta(chunk)

    def finish(self, model_call: Any, /) -> None:
        from loopscope.recorder.adapter import ModelResponse

        model_call.finish(ModelResponse(finish_reason="STOP"))

    def partial(self) -> Any:
        from loopscope.recorder.adapter import ModelResponse

        return ModelResponse()


def _streamed_call() -> Any:
    from loopscope.recorder.adapter import ModelRequest, start_model_call

    return start_model_call(ModelRequest("gemini", "gemini-test", input_text="Count.", stream=True))


@pytest.mark.parametrize("how", ["aclose", "close"])
def test_an_async_generator_stream_closed_early_ends_its_call_once(how, recording):
    """The async proxy called close() on its source: an async generator has only aclose(), so
    aclose() on a proxied google-genai stream raised AttributeError in the user's code."""
    from loopscope.instrument._streams import AsyncStream

    closed = []

    async def source() -> Any:
        try:
            for word in ("one ", "two ", "three"):
                yield word
        finally:
            closed.append(True)

    async def read() -> str:
        stream = AsyncStream(source(), _streamed_call(), _Texts())
        got = ""
        async for chunk in stream:
            got += chunk
            break
        await (stream.close() if how == "close" else stream.aclose())
        return got

    assert asyncio.run(read()) == "one "
    assert closed == [True]  # the user's generator was closed, as without loopscope
    assert loopscope.flush()
    [call] = recording.store.model_calls()
    assert call.outcome == "cancelled" and call.streaming
    assert only_turn(recording.store).loop_end_reason == "cancelled"


@pytest.mark.parametrize("source_kind", ["sync", "async"])
def test_a_generator_stream_read_to_its_end_is_one_call(source_kind, recording):
    from loopscope.instrument._streams import AsyncStream, SyncStream, proxy_stream

    words = ["Three ", "two ", "one."]

    def sync_source() -> Any:
        yield from words

    async def async_source() -> Any:
        for word in words:
            yield word

    if source_kind == "sync":
        stream = proxy_stream(sync_source(), _streamed_call(), _Texts())
        assert isinstance(stream, SyncStream)
        assert "".join(stream) == "Three two one."
    else:
        stream = proxy_stream(async_source(), _streamed_call(), _Texts())
        assert isinstance(stream, AsyncStream)

        async def read(proxy: Any) -> str:
            return "".join([chunk async for chunk in proxy])

        assert asyncio.run(read(stream)) == "Three two one."
    del stream
    assert loopscope.flush()
    [call] = recording.store.model_calls()
    assert (call.outcome, call.finish_reasons, call.streaming) == ("completed", ["STOP"], True)
    assert call.time_to_first_chunk_ms is not None
    assert only_turn(recording.store).response_content == "Three two one."
