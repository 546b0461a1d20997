"""The ollama SDK (``Client.chat``, ``AsyncClient.chat``, ``stream=True``, the module's ``ollama.chat``), from PyPI in
the `ollama` stack, at the fake model server's Ollama wire: what a user's tool loop leaves in the store and spans.
Ollama's tool calls have no ids: the results sent back answer them by position."""

from __future__ import annotations

import asyncio
import gc
import json
from functools import partial
from typing import Any

import ollama
import pytest

import interleaved
import loopscope
import switching
from fakes.model_server import FakeModelServer, Reply, ToolCall, Usage
from fakes.weather_loop import WEATHER, queue_tool_round
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

MODEL = "llama3.2"
QUESTION = "What's the weather in Paris?"
FIRST_TEXT = "Let me check the weather."
ANSWER = "It is 21 °C and sunny in Paris."
MODES = ["sync", "async", "stream", "astream"]
FIRST_USAGE = {"input_tokens": 100, "output_tokens": 20}
SECOND_USAGE = {"input_tokens": 150, "output_tokens": 10}


tool_round_script = partial(queue_tool_round, text=FIRST_TEXT, usage=Usage(100, 20))  # no ids: Ollama's calls have none


# -- a user's loop, each way of calling ----------------------------------------------------------------


def joined(parts: list[Any]) -> dict[str, Any]:
    """The assistant message a stream's parts make (the test's own reading)."""
    return {"role": "assistant", "content": "".join(p.message.content or "" for p in parts),
            "tool_calls": [c for p in parts for c in p.message.tool_calls or ()]}


def answered(response: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": response.message.content or "", "tool_calls": list(response.message.tool_calls or ())}


def call(mode: str, client: Any, messages: list[Any], **kw: Any) -> dict[str, Any]:
    if mode == "sync":
        return answered(client.chat(MODEL, messages, tools=[WEATHER], **kw))
    return joined(list(client.chat(MODEL, messages, tools=[WEATHER], stream=True, **kw)))


async def acall(mode: str, client: Any, messages: list[Any], **kw: Any) -> dict[str, Any]:
    if mode == "async":
        return answered(await client.chat(model=MODEL, messages=messages, tools=[WEATHER], **kw))
    stream = await client.chat(model=MODEL, messages=messages, tools=[WEATHER], stream=True, **kw)
    return joined([p async for p in stream])


def follow_up(messages: list[Any], answer: dict[str, Any], result: str) -> list[Any]:
    return [*messages, answer, {"role": "tool", "content": result, "tool_name": "get_weather"}]


def run_loop(mode: str, server: FakeModelServer, question: str = QUESTION, result: str = '{"temp_c": 21}', **kw: Any) -> str:
    messages: list[Any] = [{"role": "user", "content": question}]
    if mode in ("sync", "stream"):
        client = server.ollama_client()
        first = call(mode, client, messages, **kw)
        return call(mode, client, follow_up(messages, first, result), **kw)["content"]

    async def main() -> str:
        client = server.async_ollama_client()
        first = await acall(mode, client, messages, **kw)
        return (await acall(mode, client, follow_up(messages, first, result), **kw))["content"]

    return asyncio.run(main())


def hand_recording(session_id: str, *, streaming: bool) -> loopscope.Turn:
    """The same conversation through the hand API, as the adapter should record it."""
    return hand_tool_loop(session_id, model=MODEL, provider="ollama", streaming=streaming, tools=[WEATHER],
                          question=QUESTION, texts=(FIRST_TEXT, ANSWER), usages=(FIRST_USAGE, SECOND_USAGE),
                          stops=("stop", "stop"), result={"temp_c": 21}, response_model=MODEL)


# -- the two-round tool loop ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_tool_loop_is_the_turn_the_hand_api_records(instrumented, server, mode):
    tool_round_script(server)
    options = {"temperature": 0.3, "num_predict": 256, "top_k": 40, "seed": 7, "num_ctx": 8192}
    with loopscope.session("conv-1"):
        assert run_loop(mode, server, options=options, keep_alive="5m") == ANSWER
    streaming = mode in ("stream", "astream")
    hand = hand_recording("hand", streaming=streaming)
    store = instrumented.store
    [turn] = store.list_turns("conv-1")
    assert rows(store, "conv-1") == rows(store, "hand")
    assert turn.model_dump(include=SUMMARY_FIELDS) == hand.response.model_dump(include=SUMMARY_FIELDS)
    assert turn.segments == [FIRST_TEXT, ANSWER]
    assert (turn.round_count, turn.tool_calls_count, turn.loop_end_reason) == (1, 1, LoopEndReason.COMPLETED)
    assert turn.usage == {"input_tokens": 250, "output_tokens": 30}
    assert (turn.provider, turn.streaming, [d.name for d in turn.declared_tools]) == ("ollama", streaming, ["get_weather"])
    end = next(e.content for e in store.get_timeline("conv-1") if e.type == "tool_call_end")
    assert (end.tool_id, end.arguments, end.result, end.outcome) == ("", {"city": "Paris"}, {"temp_c": 21}, "served")

    chats = [c for c in instrumented.spans(a.OP_CHAT) if c.attributes.get(a.CONVERSATION_ID) == "conv-1"]
    assert len(chats) == 2
    first = chats[0].attributes
    assert (first[a.PROVIDER], first[a.REQUEST_MODEL], first[a.RESPONSE_MODEL]) == ("ollama", MODEL, MODEL)
    assert (first[a.SERVER_ADDRESS], first["server.port"]) == ("127.0.0.1", server.port)
    assert [c.attributes[a.RESPONSE_FINISH_REASONS] for c in chats] == [("stop",), ("stop",)]
    assert first[a.REQUEST_STREAM] is streaming
    assert (first["gen_ai.request.temperature"], first["gen_ai.request.max_tokens"], first["gen_ai.request.top_k"],
            first["gen_ai.request.seed"]) == (0.3, 256, 40, 7)
    assert json.loads(first["loopscope.request.other"]) == {"keep_alive": "5m", "num_ctx": 8192}
    # Ollama's own figures: the counts and the durations (ns)
    reported = json.loads(first[a.USAGE_PROVIDER])
    assert (reported["prompt_eval_count"], reported["eval_count"], reported["total_duration"]) == (100, 20, 412_000_000)
    messages = json.loads(chats[1].attributes["gen_ai.input.messages"])
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["parts"] == [{"type": "text", "content": FIRST_TEXT}, {
        "type": "tool_call", "id": None, "name": "get_weather", "arguments": {"city": "Paris"}}]
    assert messages[2]["parts"] == [{"type": "tool_call_response", "id": None, "response": '{"temp_c": 21}'}]
    _, costs = store.sql("SELECT cost_usd FROM model_calls WHERE session_id = 'conv-1'")
    assert costs == [(None,), (None,)]  # a local model: no price


def test_two_calls_in_one_response_are_answered_by_position(instrumented, server):
    server.queue(
        Reply(text="", tool_calls=[ToolCall("get_weather", {"city": "Paris"}), ToolCall("get_weather", {"city": "Rome"})]),
        Reply(text="Paris 21 °C, Rome 25 °C."),
    )
    client = server.ollama_client()
    messages: list[Any] = [{"role": "user", "content": "Paris and Rome?"}]
    first = client.chat(MODEL, messages, tools=[WEATHER])
    client.chat(MODEL, [*messages, first.message, {"role": "tool", "content": "21 °C", "tool_name": "get_weather"},
                        {"role": "tool", "content": "25 °C", "tool_name": "get_weather"}], tools=[WEATHER])
    loopscope.flush()
    turn = only_turn(instrumented.store)
    ends = [e.content for e in instrumented.store.get_timeline(turn.session_id) if e.type == "tool_call_end"]
    assert [(c.arguments, c.result, c.outcome) for c in ends] == [({"city": "Paris"}, "21 °C", "served"),
                                                                  ({"city": "Rome"}, "25 °C", "served")]
    assert turn.loop_end_reason == LoopEndReason.COMPLETED


def test_python_function_tools_and_an_options_object(instrumented, server):
    """The SDK takes a Python function as a tool (its docstring describes it) and ``ollama.Options``."""

    def get_weather(city: str) -> str:
        """The weather in a city.

        Args:
          city: The city's name
        """
        return "sunny"

    server.queue(Reply(text="Hello."))
    server.ollama_client().chat(MODEL, [{"role": "user", "content": "Hi"}], tools=[get_weather],
                                options=ollama.Options(temperature=0.2, num_predict=64, mirostat=2))
    loopscope.flush()
    turn = only_turn(instrumented.store)
    [declared] = turn.declared_tools
    assert declared.name == "get_weather" and declared.description.startswith("The weather in a city.")
    [chat] = instrumented.spans(a.OP_CHAT)
    assert (chat.attributes["gen_ai.request.temperature"], chat.attributes["gen_ai.request.max_tokens"]) == (0.2, 64)
    assert json.loads(chat.attributes["loopscope.request.other"]) == {"mirostat": 2}


def test_the_module_level_chat_is_recorded(instrumented, server, monkeypatch):
    """``ollama.chat`` is the default client's bound ``chat``, taken at ``import ollama``."""
    monkeypatch.setattr(ollama._client._client, "base_url", server.url)  # the default client at the fake server
    server.queue(Reply(text="Hello."))
    assert ollama.chat(model=MODEL, messages=[{"role": "user", "content": "Hi"}]).message.content == "Hello."
    loopscope.flush()
    assert only_turn(instrumented.store).response_content == "Hello."


def test_thinking_is_the_turns_thinking(instrumented, server):
    server.queue(Reply(text="Hello."))
    client = server.ollama_client()
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hi!", "thinking": "Greet back."},
               {"role": "user", "content": "Again"}]
    client.chat(MODEL, history, think=True)
    loopscope.flush()
    [chat] = instrumented.spans(a.OP_CHAT)
    messages = json.loads(chat.attributes["gen_ai.input.messages"])
    assert messages[1]["parts"] == [{"type": "reasoning", "content": "Greet back."}, {"type": "text", "content": "Hi!"}]
    assert json.loads(chat.attributes["loopscope.request.thinking"]) == {"type": "enabled"}


def _line(content: str, thinking: str = "", *, done: bool = False) -> dict[str, Any]:
    line: dict[str, Any] = {"model": MODEL, "created_at": "2026-01-01T00:00:00Z", "done": done,
                            "message": {"role": "assistant", "content": content, "thinking": thinking}}
    if done:
        line.update(done_reason="stop", prompt_eval_count=12, eval_count=30, total_duration=5_000_000)
    return line


@pytest.mark.parametrize("streaming", [False, True])
def test_the_answers_thinking_is_the_turns_thinking(instrumented, server, streaming):
    """``think=True``: the model's thinking comes in ``message.thinking`` (a stream's parts: in pieces before the text)."""
    if streaming:
        lines = [_line("", "The user "), _line("", "greets."), _line("Hello"), _line("!"), _line("", done=True)]
        server.queue(Reply(raw_body="".join(json.dumps(line) + "\n" for line in lines),
                           headers={"content-type": "application/x-ndjson"}))
        parts = list(server.ollama_client().chat(MODEL, [{"role": "user", "content": "Hi"}], think=True, stream=True))
        assert "".join(p.message.thinking or "" for p in parts) == "The user greets."
    else:
        server.queue(Reply(raw_body=json.dumps(_line("Hello!", "The user greets.", done=True))))
        assert server.ollama_client().chat(MODEL, [{"role": "user", "content": "Hi"}], think=True).message.thinking
    loopscope.flush()
    turn = only_turn(instrumented.store)
    assert (turn.thinking, turn.response_content, turn.usage) == (
        "The user greets.", "Hello!", {"input_tokens": 12, "output_tokens": 30})


# -- finish reasons ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "stream"])
def test_length_ends_the_turn_truncated(instrumented, server, mode):
    server.queue(Reply(text="Cut here", stop="length"))
    client = server.ollama_client()
    if mode == "sync":
        client.chat(MODEL, [{"role": "user", "content": "Count"}])
    else:
        list(client.chat(MODEL, [{"role": "user", "content": "Count"}], stream=True))
    loopscope.flush()
    [chat] = instrumented.spans(a.OP_CHAT)
    assert chat.attributes[a.RESPONSE_FINISH_REASONS] == ("length",)
    _, [(outcome,)] = instrumented.store.sql("SELECT outcome FROM model_calls")
    assert outcome == "truncated" and only_turn(instrumented.store).loop_end_reason == LoopEndReason.TRUNCATED


# -- errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [404, 500])
@pytest.mark.parametrize("mode", MODES)
def test_an_http_error_is_a_failed_call(instrumented, server, mode, status):
    server.queue(Reply.error(status, "model 'nope' not found"))
    with pytest.raises(ollama.ResponseError):
        run_loop(mode, server)
    assert_one_failed_call(instrumented, "ResponseError")


@pytest.mark.parametrize("mode", ["stream", "astream"])
def test_a_failure_mid_stream_is_an_error(instrumented, server, mode):
    server.queue(Reply.stream_failure(after=2, message="llama runner crashed"))
    with pytest.raises(ollama.ResponseError):
        run_loop(mode, server)
    assert_one_failed_call(instrumented, "ResponseError")
    _, [(outcome, output)] = instrumented.store.sql("SELECT outcome, output_messages FROM model_calls")
    assert outcome == "error" and "This reply " in output  # what was streamed before the failure is kept


# -- concurrency ---------------------------------------------------------------------------------------


def test_twenty_interleaved_async_conversations(instrumented, server):
    """Without ids, each conversation's result must still end its own call (found by the conversation, not an id)."""
    interleaved.run_async(instrumented, server, seed=7, call_id="",  # no ids: each result found its call by its conversation
                          queue=lambda tag, *, call_id, city, delay: tool_round_script(server, tag, city=city),
                          client=lambda i: server.async_ollama_client(), modes=["async", "astream"], follow_up=follow_up,
                          call=lambda client, mode, messages: acall(mode, client, messages))


# -- streams let go early ------------------------------------------------------------------------------

LONG = "one two three four five six seven eight nine ten eleven twelve"


def hello(server: FakeModelServer) -> None:
    server.queue(Reply(text="Hello."))
    server.ollama_client().chat(MODEL, [{"role": "user", "content": "Hi"}])


@pytest.mark.parametrize("how", ["close", "collect"])
def test_a_stream_let_go_early_ends_its_call_once(instrumented, server, how):
    server.queue(Reply(text=LONG))
    stream = server.ollama_client().chat(MODEL, [{"role": "user", "content": "Count"}], stream=True)
    for i, _part in enumerate(stream):
        if i == 2:
            break
    if how == "close":
        stream.close()
    del stream, _part
    gc.collect()
    assert_one_cancelled_call(instrumented, then=partial(hello, server))


def test_an_async_stream_closed_early_ends_its_call_once(instrumented, server):
    server.queue(Reply(text=LONG))

    async def main() -> None:
        stream = await server.async_ollama_client().chat(MODEL, [{"role": "user", "content": "Count"}], stream=True)
        async for _part in stream:
            break
        await stream.aclose()

    asyncio.run(main())
    assert_one_cancelled_call(instrumented, then=partial(hello, server))


# -- secrets ------------------------------------------------------------------------------------------


def test_authorization_headers_are_never_recorded(instrumented, server):
    """Ollama behind a proxy that wants a token: the client's headers never reach the store or spans."""
    secret = "Bearer ol-9c2e4f6a8b0d1357-secret"
    tool_round_script(server)
    client = server.ollama_client(headers={"Authorization": secret})
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    first = call("stream", client, messages)
    call("sync", client, follow_up(messages, first, "sunny"))
    loopscope.flush()
    assert server.requests[0].headers["authorization"] == secret
    assert_never_recorded(instrumented, "ol-9c2e4f6a8b0d1357", "authorization", present=("get_weather", "sunny"))


# -- instrument and uninstrument ---------------------------------------------------------------------


def test_instrument_twice_is_once_and_uninstrument_restores(recording, server, monkeypatch):
    monkeypatch.setattr(ollama._client._client, "base_url", server.url)
    made_before = server.ollama_client()

    def calls() -> None:
        server.queue(*(Reply(text="Hello.") for _ in range(3)))
        made_before.chat(MODEL, [{"role": "user", "content": "Hi"}])
        list(server.ollama_client().chat(MODEL, [{"role": "user", "content": "Hi"}], stream=True))
        ollama.chat(MODEL, [{"role": "user", "content": "Hi"}])

    switching.assert_instrument_twice_is_once(
        recording, chats=3, calls=calls,
        originals=lambda: ({cls: cls.__dict__["chat"] for cls in (ollama.Client, ollama.AsyncClient)}, ollama.chat))


# -- one call, one record ------------------------------------------------------------------------------


@pytest.mark.parametrize("streaming", [False, True])
def test_a_langchain_chat_model_over_the_sdk_is_recorded_once(instrumented, server, streaming):
    """langchain-ollama's ChatOllama calls ``Client.chat``: the LangChain adapter's round and the SDK's call are one."""
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_ollama import ChatOllama

    tool_round_script(server)
    model = ChatOllama(model=MODEL, base_url=server.url, streaming=streaming).bind_tools([WEATHER])
    messages: list[Any] = [HumanMessage(QUESTION)]
    first = model.invoke(messages)
    [use] = first.tool_calls
    second = model.invoke([*messages, first, ToolMessage('{"temp_c": 21}', tool_call_id=use["id"])])
    assert second.content == ANSWER
    loopscope.flush()
    assert len(server.requests) == 2
    _, [(count,)] = instrumented.store.sql("SELECT count(*) FROM model_calls")
    assert count == 2 and len(instrumented.spans(a.OP_CHAT)) == 2
