"""The groq adapter, driving the real groq SDK (the `groq` stack) against the fake model server's Groq wire."""

from __future__ import annotations

import asyncio
import gc
import json
from functools import partial
from typing import Any

import groq
import pytest

import interleaved
import loopscope
import switching
from fakes.model_server import FakeModelServer, Reply, Usage
from fakes.weather_loop import WEATHER, queue_long_reply, queue_tool_round
from loopscope import LoopEndReason
from loopscope import semconv as a
from recorded import (
    assert_hand_turn,
    assert_never_recorded,
    assert_one_cancelled_call,
    assert_one_failed_call,
    only_turn,
)

API_KEY = "gsk_test_7a1e93c0d4b25f68_secret"
MODEL = "llama-3.3-70b-versatile"
QUESTION = "What's the weather in Paris?"
MODES = ["sync", "async", "stream", "astream"]


# -- driving the SDK in each of its ways ---------------------------------------------------------


def assembled(chunks: list[Any]) -> dict[str, Any]:
    """The assistant message a stream's chunks make (the test's own reading)."""
    text, calls = "", {}
    for chunk in chunks:
        delta = chunk.choices[0].delta
        text += delta.content or ""
        for part in delta.tool_calls or ():
            slot = calls.setdefault(part.index, {"id": None, "name": "", "arguments": ""})
            slot["id"] = slot["id"] or part.id
            slot["name"] += part.function.name or ""
            slot["arguments"] += part.function.arguments or ""
    return {"role": "assistant", "content": text, "tool_calls": [
        {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
        for _, c in sorted(calls.items())]}


def message_of(response: Any) -> dict[str, Any]:
    m = response.choices[0].message
    return {"role": "assistant", "content": m.content, "tool_calls": [
        {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
        for c in m.tool_calls or ()]}


def call(c: groq.Groq, mode: str, messages: list[Any], **kw: Any) -> dict[str, Any]:
    if mode == "sync":
        return message_of(c.chat.completions.create(model=MODEL, messages=messages, **kw))
    return assembled(list(c.chat.completions.create(model=MODEL, messages=messages, stream=True, **kw)))


async def acall(c: groq.AsyncGroq, mode: str, messages: list[Any], **kw: Any) -> dict[str, Any]:
    if mode in ("sync", "async"):
        return message_of(await c.chat.completions.create(model=MODEL, messages=messages, **kw))
    stream = await c.chat.completions.create(model=MODEL, messages=messages, stream=True, **kw)
    return assembled([chunk async for chunk in stream])


def follow_up(messages: list[Any], answer: dict[str, Any], result: str) -> list[Any]:
    return [*messages, answer, *({"role": "tool", "tool_call_id": c["id"], "content": result} for c in answer["tool_calls"])]


def run_loop(server: FakeModelServer, mode: str, **kw: Any) -> None:
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    kw = {"tools": [WEATHER], "max_completion_tokens": 256, "temperature": 0.2, **kw}
    if mode in ("sync", "stream"):
        c = server.groq_client(api_key=API_KEY)
        answer = call(c, mode, messages, **kw)
        call(c, mode, follow_up(messages, answer, "21 C and sunny"), **kw)
        return

    async def main() -> None:
        c = server.async_groq_client(api_key=API_KEY)
        answer = await acall(c, mode, messages, **kw)
        await acall(c, mode, follow_up(messages, answer, "21 C and sunny"), **kw)

    asyncio.run(main())


# -- the two-round tool loop ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_tool_loop_becomes_one_turn(instrumented, server, mode):
    queue_tool_round(server, call_id="call_w1")
    with loopscope.session("conv-1"):
        run_loop(server, mode, reasoning_format="hidden")
    events = instrumented.store.get_timeline("conv-1")
    assert [(e.type, getattr(e.content, "tool_id", None) or getattr(e.content, "body", None)) for e in events] == [
        ("message", QUESTION), ("message", "Let me check the weather."), ("tool_call_start", "call_w1"),
        ("tool_call_end", "call_w1"), ("message", "It is 21 °C and sunny in Paris."),
    ]
    end = events[3].content
    assert (end.tool_name, end.arguments, end.result, end.status) == ("get_weather", {"city": "Paris"}, "21 C and sunny", "completed")
    turn = only_turn(instrumented)
    assert (turn.round_count, turn.tool_calls_count, turn.loop_end_reason) == (1, 1, LoopEndReason.COMPLETED)
    assert (turn.model, turn.provider, turn.streaming) == (MODEL, "groq", "stream" in mode)
    assert {k: v for k, v in turn.usage.items() if v} == {"input_tokens": 250, "output_tokens": 30, "cache_read_input_tokens": 30}
    assert [(d.name, d.parameters) for d in turn.declared_tools] == [("get_weather", WEATHER["function"]["parameters"])]

    _, rows = instrumented.store.sql(
        "SELECT provider, request_model, finish_reasons, outcome, input_tokens, output_tokens, cache_read_input_tokens,"
        " provider_usage, parameters, cost_usd FROM model_calls ORDER BY started_at")
    assert [(r[0], r[1], json.loads(r[2]), r[3], r[4], r[5], r[6]) for r in rows] == [
        ("groq", MODEL, ["tool_calls"], "completed", 100, 20, 30), ("groq", MODEL, ["stop"], "completed", 150, 10, 0),
    ]
    for row in rows:
        figures, parameters = json.loads(row[7]), json.loads(row[8])
        # Groq's timings and its request id are kept beside the counts
        assert figures["queue_time"] == 0.012 and figures["total_time"] == 0.035
        assert figures["x_groq_id"].startswith("req_fake")
        assert (parameters["max_tokens"], parameters["temperature"], parameters["other"]) == (256, 0.2, {"reasoning_format": "hidden"})
        assert parameters["server_address"] == "127.0.0.1"
        assert row[9] is not None and row[9] > 0  # Groq's price of the model (the fake server stands for Groq here)
    chats = instrumented.spans(a.OP_CHAT)
    assert len(chats) == 2 and all(c.attributes[a.PROVIDER] == "groq" for c in chats)


@pytest.mark.parametrize("mode", ["sync", "astream"])
def test_hand_written_turn_holds_the_groq_calls(instrumented, server, mode):
    queue_tool_round(server, call_id="call_w1")
    with loopscope.turn(session_id="hand", agent="weatherbot", tools=[WEATHER], input=QUESTION) as t:
        run_loop(server, mode)
    assert_hand_turn(instrumented, t.response)


def test_raw_response_is_recorded_when_parsed(instrumented, server):
    queue_tool_round(server, call_id="call_w1")
    raw = server.groq_client().chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": QUESTION}], tools=[WEATHER])
    assert raw.http_response.status_code == 200
    assert not instrumented.spans(a.OP_CHAT)  # not read yet
    answer = raw.parse()
    assert answer.choices[0].message.tool_calls[0].id == "call_w1"
    [chat] = instrumented.spans(a.OP_CHAT)
    assert chat.attributes[a.RESPONSE_FINISH_REASONS] == ("tool_calls",)
    _, [(usage,)] = instrumented.store.sql("SELECT provider_usage FROM model_calls")
    assert json.loads(usage)["x_groq_id"].startswith("req_fake")


def _sse(*chunks: dict[str, Any]) -> str:
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-r1", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


@pytest.mark.parametrize("mode", ["sync", "stream"])
def test_parsed_reasoning_is_the_turns_thinking(instrumented, server, mode):
    if mode == "sync":
        server.queue(Reply(raw_body={
            "id": "chatcmpl-r1", "object": "chat.completion", "created": 1, "model": MODEL,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "Hello!", "reasoning": "The user wants a greeting."}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 8, "total_tokens": 18}, "x_groq": {"id": "req_r1"}}))
    else:
        server.queue(Reply(raw_body=_sse(
            _chunk({"role": "assistant", "reasoning": "The user wants "}), _chunk({"reasoning": "a greeting."}),
            _chunk({"content": "Hello!"}), _chunk({}, "stop"),
        ), headers={"content-type": "text/event-stream"}))
    answer = call(server.groq_client(), mode, [{"role": "user", "content": "Hi"}], reasoning_format="parsed")
    assert answer["content"] == "Hello!"
    turn = only_turn(instrumented)
    assert (turn.thinking, turn.segments, turn.loop_end_reason) == ("The user wants a greeting.", ["Hello!"], LoopEndReason.COMPLETED)


@pytest.mark.parametrize("mode", MODES)
def test_max_tokens_ends_the_turn_truncated(instrumented, server, mode):
    server.queue(Reply(text="It is", stop="length", usage=Usage(10, 2)))
    if mode in ("sync", "stream"):
        call(server.groq_client(), mode, [{"role": "user", "content": QUESTION}])
    else:
        asyncio.run(acall(server.async_groq_client(), mode, [{"role": "user", "content": QUESTION}]))
    assert only_turn(instrumented).loop_end_reason == LoopEndReason.TRUNCATED
    _, [(outcome,)] = instrumented.store.sql("SELECT outcome FROM model_calls")
    assert outcome == "truncated"


# -- errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("status, error", [(429, groq.RateLimitError), (503, groq.InternalServerError)])
@pytest.mark.parametrize("mode", MODES)
def test_http_errors_are_failed_calls(instrumented, server, mode, status, error):
    server.queue(Reply.error(status, "the fake says no"))
    with pytest.raises(error):
        if mode in ("sync", "stream"):
            call(server.groq_client(), mode, [{"role": "user", "content": QUESTION}])
        else:
            asyncio.run(acall(server.async_groq_client(), mode, [{"role": "user", "content": QUESTION}]))
    assert_one_failed_call(instrumented, error.__name__)


@pytest.mark.parametrize("mode", ["stream", "astream"])
def test_mid_stream_error(instrumented, server, mode):
    server.queue(Reply.stream_failure(after=2, message="model overloaded"))
    with pytest.raises(groq.APIError, match="model overloaded"):
        if mode == "stream":
            call(server.groq_client(), mode, [{"role": "user", "content": QUESTION}])
        else:
            asyncio.run(acall(server.async_groq_client(), mode, [{"role": "user", "content": QUESTION}]))
    assert_one_failed_call(instrumented, "APIError")


# -- streams let go -------------------------------------------------------------------------------------


def test_stream_closed_early(instrumented, server):
    queue_long_reply(server)
    stream = server.groq_client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Count"}], stream=True)
    for _, _chunk in zip(range(2), stream):
        pass
    stream.close()
    stream.close()
    assert_one_cancelled_call(instrumented)


def test_async_stream_closed_early(instrumented, server):
    queue_long_reply(server)

    async def main() -> None:
        stream = await server.async_groq_client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Count"}], stream=True)
        async for _chunk in stream:
            break
        await stream.close()

    asyncio.run(main())
    assert_one_cancelled_call(instrumented)


def test_stream_dropped_unread_is_collected(instrumented, server):
    queue_long_reply(server)
    stream = server.groq_client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Count"}], stream=True)
    del stream
    gc.collect()
    assert_one_cancelled_call(instrumented)


# -- concurrency ---------------------------------------------------------------------------------------


def test_twenty_interleaved_async_conversations(instrumented, server):
    c = server.async_groq_client()
    interleaved.run_async(instrumented, server, seed=5, queue=partial(queue_tool_round, server), call_id="call_c{i:02d}",
                          client=lambda i: c, modes=MODES, follow_up=follow_up,
                          call=lambda c, mode, messages: acall(c, mode, messages, tools=[WEATHER]))


# -- switching on and off ---------------------------------------------------------------------------------


def test_instrument_twice_is_once_and_uninstrument_restores(recording, server):
    from groq.resources.chat import completions

    def tool_loop() -> None:
        queue_tool_round(server, call_id="call_w1")
        run_loop(server, "sync")

    switching.assert_instrument_twice_is_once(
        recording, chats=2, calls=tool_loop,
        originals=lambda: (completions.Completions.__dict__["create"], completions.AsyncCompletions.__dict__["create"]))


def test_the_openai_adapter_stays_on_beside_groq(instrumented, server):
    """Session 19's groq adapter took the openai adapter's private functions: importing it
    fired the openai import hook half made, and openai calls went unrecorded for the process."""
    import openai  # noqa: F401 - imported after groq, as an application might

    assert {"groq", "openai"} <= set(loopscope.instrument())
    server.queue(Reply(text="Hello from Groq."), Reply(text="Hello from OpenAI."))
    server.groq_client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    server.openai_client().chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
    _, rows = instrumented.store.sql("SELECT provider FROM model_calls ORDER BY started_at")
    assert rows == [("groq",), ("openai",)]


# -- secrets ------------------------------------------------------------------------------------------------


def test_api_keys_and_authorization_headers_are_never_recorded(instrumented, server):
    queue_tool_round(server, call_id="call_w1")
    queue_tool_round(server, call_id="call_w1")
    run_loop(server, "stream")
    run_loop(server, "async")
    assert server.requests[0].headers["authorization"] == f"Bearer {API_KEY}"  # sent...
    assert_never_recorded(instrumented, API_KEY, "authorization", "Bearer")  # ...and nowhere in what was recorded
