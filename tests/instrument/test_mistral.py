"""The mistralai adapter, driving the real mistralai SDK (the `mistral` stack) against the fake model server's Mistral wire."""

from __future__ import annotations

import asyncio
import gc
import json
from functools import partial
from typing import Any

import pytest
from mistralai.client import errors
from opentelemetry import trace

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

API_KEY = "mistral-test-3b7f10c2e9d84a56-secret"
MODEL = "mistral-large-latest"
QUESTION = "What's the weather in Paris?"
MODES = ["sync", "async", "stream", "astream"]


# -- driving the SDK in each of its ways ---------------------------------------------------------


def assembled(events: list[Any]) -> dict[str, Any]:
    """The assistant message a stream's events make (the test's own reading: Mistral sends each call whole)."""
    text, calls = "", []
    for event in events:
        delta = event.data.choices[0].delta
        text += delta.content if isinstance(delta.content, str) else ""
        calls += [{"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
                  for c in delta.tool_calls or ()]
    return {"role": "assistant", "content": text, "tool_calls": calls}


def call(c: Any, mode: str, messages: list[Any], **kw: Any) -> Any:
    """The answer as the user would send it back: the SDK's own message object, or the stream's assembled dict."""
    if mode == "sync":
        return c.chat.complete(model=MODEL, messages=messages, **kw).choices[0].message
    return assembled(list(c.chat.stream(model=MODEL, messages=messages, **kw)))


async def acall(c: Any, mode: str, messages: list[Any], **kw: Any) -> Any:
    if mode in ("sync", "async"):
        return (await c.chat.complete_async(model=MODEL, messages=messages, **kw)).choices[0].message
    stream = await c.chat.stream_async(model=MODEL, messages=messages, **kw)
    return assembled([event async for event in stream])


def follow_up(messages: list[Any], answer: Any, result: str) -> list[Any]:
    calls = answer["tool_calls"] if isinstance(answer, dict) else answer.tool_calls
    ids = [c["id"] if isinstance(c, dict) else c.id for c in calls]
    return [*messages, answer, *({"role": "tool", "tool_call_id": i, "name": "get_weather", "content": result} for i in ids)]


def run_loop(server: FakeModelServer, mode: str, **kw: Any) -> None:
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    kw = {"tools": [WEATHER], "max_tokens": 256, "temperature": 0.2, **kw}
    c = server.mistral_client(api_key=API_KEY)
    if mode in ("sync", "stream"):
        answer = call(c, mode, messages, **kw)
        call(c, mode, follow_up(messages, answer, "21 C and sunny"), **kw)
        return

    async def main() -> None:
        answer = await acall(c, mode, messages, **kw)
        await acall(c, mode, follow_up(messages, answer, "21 C and sunny"), **kw)

    asyncio.run(main())


def ask(server: FakeModelServer, mode: str) -> Any:
    messages = [{"role": "user", "content": QUESTION}]
    if mode in ("sync", "stream"):
        return call(server.mistral_client(), mode, messages)
    return asyncio.run(acall(server.mistral_client(), mode, messages))


# -- the two-round tool loop ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_tool_loop_becomes_one_turn(instrumented, server, mode):
    queue_tool_round(server, call_id="wcall0001")
    with loopscope.session("conv-1"):
        run_loop(server, mode, random_seed=7, safe_prompt=True)
    events = instrumented.store.get_timeline("conv-1")
    assert [(e.type, getattr(e.content, "tool_id", None) or getattr(e.content, "body", None)) for e in events] == [
        ("message", QUESTION), ("message", "Let me check the weather."), ("tool_call_start", "wcall0001"),
        ("tool_call_end", "wcall0001"), ("message", "It is 21 °C and sunny in Paris."),
    ]
    end = events[3].content
    assert (end.tool_name, end.arguments, end.result, end.status) == ("get_weather", {"city": "Paris"}, "21 C and sunny", "completed")
    turn = only_turn(instrumented)
    assert (turn.round_count, turn.tool_calls_count, turn.loop_end_reason) == (1, 1, LoopEndReason.COMPLETED)
    assert (turn.model, turn.provider, turn.streaming) == (MODEL, "mistral_ai", "stream" in mode)
    assert {k: v for k, v in turn.usage.items() if v} == {"input_tokens": 250, "output_tokens": 30}
    assert [(d.name, d.parameters) for d in turn.declared_tools] == [("get_weather", WEATHER["function"]["parameters"])]

    _, rows = instrumented.store.sql(
        "SELECT provider, request_model, finish_reasons, outcome, input_tokens, output_tokens, provider_usage, parameters,"
        " input_messages, cost_usd FROM model_calls ORDER BY started_at")
    assert [(r[0], r[1], json.loads(r[2]), r[3], r[4], r[5]) for r in rows] == [
        ("mistral_ai", MODEL, ["tool_calls"], "completed", 100, 20), ("mistral_ai", MODEL, ["stop"], "completed", 150, 10),
    ]
    for row in rows:
        assert json.loads(row[6])["total_tokens"] in (120, 160)
        parameters = json.loads(row[7])
        assert (parameters["max_tokens"], parameters["temperature"], parameters["seed"]) == (256, 0.2, 7)
        assert parameters["other"] == {"safe_prompt": True}
        assert parameters["server_address"] == "127.0.0.1"
        assert row[9] is not None and row[9] > 0  # Mistral's price of the model (the fake server stands for Mistral here)
    # the second request's messages: the SDK's own answer object sent back, read as its fields
    sent = json.loads(rows[1][8])
    assert [m["role"] for m in sent] == ["user", "assistant", "tool"]
    assert [p["type"] for p in sent[1]["parts"]] == ["text", "tool_call"]
    assert sent[1]["parts"][1]["arguments"] in ({"city": "Paris"}, '{"city": "Paris"}')


@pytest.mark.parametrize("mode", ["sync", "astream"])
def test_hand_written_turn_holds_the_mistral_calls(instrumented, server, mode):
    queue_tool_round(server, call_id="wcall0001")
    with loopscope.turn(session_id="hand", agent="weatherbot", tools=[WEATHER], input=QUESTION) as t:
        run_loop(server, mode)
    assert_hand_turn(instrumented, t.response)


def test_a_one_shot_iterable_of_messages_is_sent_whole_and_recorded(instrumented, server):
    server.queue(Reply(text="Hello."))
    answer = server.mistral_client().chat.complete(model=MODEL, messages=iter([{"role": "user", "content": QUESTION}]))
    assert answer.choices[0].message.content == "Hello."
    assert server.requests[0].first_user_text == QUESTION  # the SDK sent what loopscope read
    [(sent,)] = instrumented.store.sql("SELECT input_messages FROM model_calls")[1]
    assert json.loads(sent) == [{"role": "user", "parts": [{"type": "text", "content": QUESTION}]}]


THOUGHT = {"type": "thinking", "thinking": [{"type": "text", "text": "The user wants a greeting."}]}


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "r1", "object": "chat.completion.chunk", "created": 1, "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


@pytest.mark.parametrize("mode", MODES)
def test_thinking_chunks_are_the_turns_thinking(instrumented, server, mode):
    """A reasoning model's answer: content as chunks, a thinking chunk before the text."""
    if mode in ("sync", "async"):
        server.queue(Reply(raw_body={
            "id": "r1", "object": "chat.completion", "created": 1, "model": MODEL,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": [THOUGHT, {"type": "text", "text": "Hello!"}]}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 8, "total_tokens": 18}}))
    else:
        frames = [_chunk({"role": "assistant", "content": [THOUGHT]}), _chunk({"content": "Hello!"}), _chunk({"content": ""}, "stop")]
        server.queue(Reply(raw_body="".join(f"data: {json.dumps(f)}\n\n" for f in frames) + "data: [DONE]\n\n",
                           headers={"content-type": "text/event-stream"}))
    ask(server, mode)
    turn = only_turn(instrumented)
    assert (turn.thinking, turn.segments, turn.loop_end_reason) == ("The user wants a greeting.", ["Hello!"], LoopEndReason.COMPLETED)


@pytest.mark.parametrize(("mode", "stop"), [("sync", "length"), *((mode, "model_length") for mode in MODES)])
def test_length_ends_the_turn_truncated(instrumented, server, mode, stop):
    server.queue(Reply(text="It is", stop=stop, usage=Usage(10, 2)))
    ask(server, mode)
    assert only_turn(instrumented).loop_end_reason == LoopEndReason.TRUNCATED
    _, [(outcome, reasons)] = instrumented.store.sql("SELECT outcome, finish_reasons FROM model_calls")
    assert (outcome, json.loads(reasons)) == ("truncated", [stop])


# -- errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("status, error", [(429, errors.SDKError), (422, errors.HTTPValidationError)])
@pytest.mark.parametrize("mode", MODES)
def test_http_errors_are_failed_calls(instrumented, server, mode, status, error):
    server.queue(Reply.error(status, "the fake says no"))
    with pytest.raises(error):
        ask(server, mode)
    assert_one_failed_call(instrumented, error.__name__)


@pytest.mark.parametrize("mode", ["stream", "astream"])
def test_mid_stream_error(instrumented, server, mode):
    server.queue(Reply.stream_failure(after=2, message="model overloaded"))
    with pytest.raises(errors.ResponseValidationError):
        ask(server, mode)
    chat = assert_one_failed_call(instrumented, "ResponseValidationError")
    assert chat.attributes[a.ROUND_TEXT] == "This "  # what came before the error


# -- streams let go -------------------------------------------------------------------------------------


HI = [{"role": "user", "content": "Count"}]


def test_stream_closed_early(instrumented, server):
    queue_long_reply(server)
    stream = server.mistral_client().chat.stream(model=MODEL, messages=HI)
    for _, _event in zip(range(2), stream):
        pass
    stream.close()
    stream.close()
    assert_one_cancelled_call(instrumented)


def test_break_inside_with(instrumented, server):
    queue_long_reply(server)
    with server.mistral_client().chat.stream(model=MODEL, messages=HI) as stream:
        for _event in stream:
            break
    assert_one_cancelled_call(instrumented)


def test_async_stream_closed_early(instrumented, server):
    queue_long_reply(server)

    async def main() -> None:
        stream = await server.mistral_client().chat.stream_async(model=MODEL, messages=HI)
        async for _event in stream:
            break
        await stream.close()

    asyncio.run(main())
    assert_one_cancelled_call(instrumented)


def test_stream_dropped_unread_is_collected(instrumented, server):
    queue_long_reply(server)
    stream = server.mistral_client().chat.stream(model=MODEL, messages=HI)
    del stream
    gc.collect()
    assert_one_cancelled_call(instrumented)


# -- concurrency ---------------------------------------------------------------------------------------


def test_twenty_interleaved_async_conversations(instrumented, server):
    c = server.mistral_client()
    interleaved.run_async(instrumented, server, seed=3, queue=partial(queue_tool_round, server), call_id="callc{i:04d}",
                          client=lambda i: c, modes=MODES, follow_up=follow_up,
                          call=lambda c, mode, messages: acall(c, mode, messages, tools=[WEATHER]))


# -- the SDK's own spans --------------------------------------------------------------------------------


@pytest.fixture
def sdk_telemetry(recording, monkeypatch):
    """The mistralai SDK's telemetry on, to the global provider (the recording's): it starts a span per request."""
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", recording.pipeline.tracer_provider)
    monkeypatch.setenv("MISTRAL_SDK_TELEMETRY", "global")
    return recording


def test_without_loopscope_the_sdk_traces_its_calls(sdk_telemetry, server):
    server.queue(Reply(text="Hello."))
    server.mistral_client().chat.complete(model=MODEL, messages=HI)
    [own] = sdk_telemetry.spans(a.OP_CHAT)  # the SDK's own GenAI span, which loopscope's round stands in for below
    assert own.instrumentation_scope.name != "loopscope"


@pytest.mark.parametrize("mode", MODES)
def test_one_call_is_recorded_once_with_the_sdks_telemetry_on(sdk_telemetry, server, mode):
    loopscope.instrument()
    try:
        queue_tool_round(server, call_id="wcall0001")
        run_loop(server, mode)
    finally:
        loopscope.uninstrument()
    spans = sdk_telemetry.spans()
    assert len([s for s in spans if s.attributes.get(a.OPERATION) == a.OP_CHAT]) == 2
    assert {s.instrumentation_scope.name for s in spans} == {"loopscope"}
    _, [(count,)] = sdk_telemetry.store.sql("SELECT count(*) FROM model_calls")
    assert count == 2 and only_turn(sdk_telemetry).round_count == 1


# -- switching on and off ---------------------------------------------------------------------------------


def test_instrument_twice_is_once_and_uninstrument_restores(recording, server):
    from mistralai.client import chat
    from mistralai.client._hooks import tracing

    names = ("complete", "stream", "complete_async", "stream_async")

    def tool_loop() -> None:
        queue_tool_round(server, call_id="wcall0001")
        run_loop(server, "sync")

    switching.assert_instrument_twice_is_once(
        recording, chats=2, calls=tool_loop,
        originals=lambda: [chat.Chat.__dict__[n] for n in names] + [tracing.get_traced_request_and_span])


# -- secrets ------------------------------------------------------------------------------------------------


def test_api_keys_and_authorization_headers_are_never_recorded(instrumented, server):
    queue_tool_round(server, call_id="wcall0001")
    queue_tool_round(server, call_id="wcall0001")
    run_loop(server, "stream")
    run_loop(server, "async")
    assert server.requests[0].headers["authorization"] == f"Bearer {API_KEY}"  # sent...
    assert_never_recorded(instrumented, API_KEY, "authorization", "Bearer")  # ...and nowhere in what was recorded
