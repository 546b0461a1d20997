"""The cohere SDK's v2 client (``ClientV2`` / ``AsyncClientV2``: ``chat``, ``chat_stream``), from PyPI in the
`cohere` stack, at the fake model server's Cohere wire: what a user's tool loop leaves in the store and spans."""

from __future__ import annotations

import asyncio
import gc
import json
from functools import partial
from typing import Any

import cohere
import pytest
from opentelemetry.trace import StatusCode

import interleaved
import loopscope
import switching
from fakes.model_server import FakeModelServer, Reply
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

API_KEY = "co-test-7f3a91d2c4b86e05-secret"
MODEL = "command-a-03-2025"
QUESTION = "What's the weather in Paris?"
PLAN = "I will look up the weather."
ANSWER = "It is 21 °C and sunny in Paris."
MODES = ["sync", "async", "stream", "astream"]
FIRST_USAGE = {"input_tokens": 100, "output_tokens": 20, "cache_read_input_tokens": 30}
SECOND_USAGE = {"input_tokens": 150, "output_tokens": 10}


tool_round_script = partial(queue_tool_round, call_id="get_weather_w1", text=PLAN)


def sync_client(server: FakeModelServer) -> cohere.ClientV2:
    return server.cohere_client(api_key=API_KEY)


def async_client(server: FakeModelServer) -> cohere.AsyncClientV2:
    return server.async_cohere_client(api_key=API_KEY)


# -- a user's loop, each way of calling ----------------------------------------------------------------


def gathered(events: list[Any]) -> dict[str, Any]:
    """The assistant message a stream's events make (the test's own reading)."""
    text = "".join(e.delta.message.content.text or "" for e in events if e.type == "content-delta")
    plan = "".join(e.delta.message.tool_plan for e in events if e.type == "tool-plan-delta")
    calls: list[dict[str, Any]] = []
    for e in events:
        if e.type == "tool-call-start":
            c = e.delta.message.tool_calls
            calls.append({"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": ""}})
        elif e.type == "tool-call-delta":
            calls[e.index]["function"]["arguments"] += e.delta.message.tool_calls.function.arguments
    return {"text": text, "plan": plan, "calls": calls}


def answered(response: Any) -> dict[str, Any]:
    message = response.message
    return {"text": "".join(c.text for c in message.content or () if c.type == "text"), "plan": message.tool_plan or "",
            "calls": [{"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
                      for c in message.tool_calls or ()]}


def call(mode: str, client: Any, messages: list[Any], **kw: Any) -> dict[str, Any]:
    if mode == "sync":
        return answered(client.chat(model=MODEL, messages=messages, tools=[WEATHER], **kw))
    return gathered(list(client.chat_stream(model=MODEL, messages=messages, tools=[WEATHER], **kw)))


async def acall(mode: str, client: Any, messages: list[Any], **kw: Any) -> dict[str, Any]:
    if mode == "async":
        return answered(await client.chat(model=MODEL, messages=messages, tools=[WEATHER], **kw))
    return gathered([e async for e in client.chat_stream(model=MODEL, messages=messages, tools=[WEATHER], **kw)])


def follow_up(messages: list[Any], answer: dict[str, Any], result: str) -> list[Any]:
    [use] = answer["calls"]
    return [*messages, {"role": "assistant", "tool_plan": answer["plan"], "tool_calls": answer["calls"]},
            {"role": "tool", "tool_call_id": use["id"], "content": [{"type": "document", "document": {"data": result}}]}]


def run_loop(mode: str, server: FakeModelServer, question: str = QUESTION, result: str = '{"temp_c": 21}', **kw: Any) -> str:
    messages: list[Any] = [{"role": "user", "content": question}]
    if mode in ("sync", "stream"):
        client = sync_client(server)
        first = call(mode, client, messages, **kw)
        return call(mode, client, follow_up(messages, first, result), **kw)["text"]

    async def main() -> str:
        client = async_client(server)
        first = await acall(mode, client, messages, **kw)
        return (await acall(mode, client, follow_up(messages, first, result), **kw))["text"]

    return asyncio.run(main())


def hand_recording(session_id: str, *, streaming: bool) -> loopscope.Turn:
    """The same conversation through the hand API, as the adapter should record it."""
    return hand_tool_loop(session_id, model=MODEL, provider="cohere", streaming=streaming, tools=[WEATHER],
                          question=QUESTION, texts=(PLAN, ANSWER), usages=(FIRST_USAGE, SECOND_USAGE),
                          stops=("TOOL_CALL", "COMPLETE"), result={"temp_c": 21}, call_id="get_weather_w1")


# -- the two-round tool loop ---------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_tool_loop_is_the_turn_the_hand_api_records(instrumented, server, mode):
    tool_round_script(server)
    with loopscope.session("conv-1"):
        assert run_loop(mode, server, temperature=0.3, max_tokens=256, p=0.9, k=40, seed=7,
                        stop_sequences=["END"], safety_mode="CONTEXTUAL") == ANSWER
    streaming = mode in ("stream", "astream")
    hand = hand_recording("hand", streaming=streaming)
    store = instrumented.store
    [turn] = store.list_turns("conv-1")
    assert rows(store, "conv-1") == rows(store, "hand")
    assert turn.model_dump(include=SUMMARY_FIELDS) == hand.response.model_dump(include=SUMMARY_FIELDS)
    assert turn.segments == [PLAN, ANSWER]  # the tool plan is the text before the call
    assert (turn.round_count, turn.tool_calls_count, turn.loop_end_reason) == (1, 1, LoopEndReason.COMPLETED)
    assert turn.usage == {"input_tokens": 250, "output_tokens": 30, "cache_read_input_tokens": 30}
    assert (turn.provider, turn.streaming, [d.name for d in turn.declared_tools]) == ("cohere", streaming, ["get_weather"])
    end = next(e.content for e in store.get_timeline("conv-1") if e.type == "tool_call_end")
    assert (end.tool_id, end.arguments, end.result, end.outcome) == ("get_weather_w1", {"city": "Paris"}, {"temp_c": 21}, "served")

    chats = [c for c in instrumented.spans(a.OP_CHAT) if c.attributes.get(a.CONVERSATION_ID) == "conv-1"]
    assert len(chats) == 2
    first = chats[0].attributes
    assert (first[a.PROVIDER], first[a.REQUEST_MODEL], first[a.SERVER_ADDRESS]) == ("cohere", MODEL, "127.0.0.1")
    assert [c.attributes[a.RESPONSE_FINISH_REASONS] for c in chats] == [("TOOL_CALL",), ("COMPLETE",)]
    assert first[a.RESPONSE_ID].startswith("fake-")
    assert first[a.REQUEST_STREAM] is streaming
    assert (first["gen_ai.request.temperature"], first["gen_ai.request.max_tokens"], first["gen_ai.request.top_p"],
            first["gen_ai.request.top_k"], first["gen_ai.request.seed"], first["gen_ai.request.stop_sequences"]) == \
        (0.3, 256, 0.9, 40, 7, ("END",))
    assert json.loads(first["loopscope.request.other"]) == {"safety_mode": "CONTEXTUAL"}
    # Cohere's own figures beside ours: billed units and tokens as it sent them
    reported = json.loads(first[a.USAGE_PROVIDER])
    assert reported["billed_units"] == {"input_tokens": 100, "output_tokens": 20} and reported["cached_tokens"] == 30
    messages = json.loads(chats[1].attributes["gen_ai.input.messages"])
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert messages[1]["parts"] == [{"type": "text", "content": PLAN}, {
        "type": "tool_call", "id": "get_weather_w1", "name": "get_weather", "arguments": {"city": "Paris"}}]
    assert messages[2]["parts"] == [{"type": "tool_call_response", "id": "get_weather_w1", "response": '{"temp_c": 21}'}]
    _, costs = store.sql("SELECT cost_usd FROM model_calls WHERE session_id = 'conv-1'")
    assert len(costs) == 2 and all(cost > 0 for (cost,) in costs)  # Cohere's prices, from the recorded tokens


def test_the_v2_client_of_a_v1_client_is_recorded_too(instrumented, server):
    """``cohere.Client(...).v2.chat`` is the same v2 API."""
    server.queue(Reply(text="Hello."))
    client = cohere.Client(base_url=server.url, api_key=API_KEY)
    assert client.v2.chat(model=MODEL, messages=[{"role": "user", "content": "Hi"}]).message.content[0].text == "Hello."
    loopscope.flush()
    assert only_turn(instrumented.store).response_content == "Hello."


def test_thinking_and_the_request_options_cohere_names_its_own_way(instrumented, server):
    """A reasoning model's ``thinking`` content items are the turn's thinking; ``tool_choice`` and
    ``response_format`` in Cohere's words."""
    server.queue(Reply(raw_body=json.dumps({
        "id": "fake-think", "finish_reason": "COMPLETE",
        "message": {"role": "assistant", "content": [{"type": "thinking", "thinking": "The user greets."},
                                                     {"type": "text", "text": "Hello!"}]},
        "usage": {"billed_units": {"input_tokens": 5, "output_tokens": 3}, "tokens": {"input_tokens": 12, "output_tokens": 30}},
    })))
    sync_client(server).chat(model=MODEL, messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                             tools=[WEATHER], tool_choice="NONE", response_format={"type": "json_object"},
                             thinking={"type": "enabled", "token_budget": 500})
    loopscope.flush()
    turn = only_turn(instrumented.store)
    assert (turn.thinking, turn.response_content, turn.usage) == ("The user greets.", "Hello!", {"input_tokens": 12, "output_tokens": 30})
    [chat] = instrumented.spans(a.OP_CHAT)
    assert (chat.attributes[a.REQUEST_TOOL_CHOICE], chat.attributes[a.OUTPUT_TYPE]) == ("none", "json")
    assert json.loads(chat.attributes["loopscope.request.thinking"]) == {"type": "enabled", "token_budget": 500}
    assert [m["role"] for m in json.loads(chat.attributes[a.INPUT_MESSAGES])] == ["system", "user"]


# -- finish reasons and outcomes ---------------------------------------------------------------------


@pytest.mark.parametrize(("stop", "outcome", "end"), [
    ("MAX_TOKENS", "truncated", LoopEndReason.TRUNCATED),
    ("STOP_SEQUENCE", "completed", LoopEndReason.COMPLETED),
    ("ERROR", "error", LoopEndReason.ERROR),
    ("TIMEOUT", "error", LoopEndReason.ERROR),
])
@pytest.mark.parametrize("mode", ["sync", "stream"])
def test_finish_reasons_give_the_outcome(instrumented, server, mode, stop, outcome, end):
    server.queue(Reply(text="Cut here", stop=stop))
    client = sync_client(server)
    messages = [{"role": "user", "content": "Count"}]
    if mode == "sync":
        client.chat(model=MODEL, messages=messages)
    else:
        list(client.chat_stream(model=MODEL, messages=messages))
    loopscope.flush()
    [chat] = instrumented.spans(a.OP_CHAT)
    assert chat.attributes[a.RESPONSE_FINISH_REASONS] == (stop,)
    _, [(found,)] = instrumented.store.sql("SELECT outcome FROM model_calls")
    assert found == outcome and only_turn(instrumented.store).loop_end_reason == end


# -- errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "error"), [(429, cohere.TooManyRequestsError), (500, cohere.InternalServerError)])
@pytest.mark.parametrize("mode", MODES)
def test_an_http_error_is_a_failed_call(instrumented, server, mode, status, error):
    server.queue(Reply.error(status, "no such luck"))
    with pytest.raises(error):
        run_loop(mode, server)
    assert_one_failed_call(instrumented, error.__name__)


@pytest.mark.parametrize("mode", ["stream", "astream"])
def test_a_failure_mid_stream_is_an_error(instrumented, server, mode):
    """Cohere ends a failing stream with message-end, finish_reason ERROR and the message; the SDK raises nothing."""
    server.queue(Reply.stream_failure(after=3, message="model overloaded"))
    messages = [{"role": "user", "content": "Count"}]
    if mode == "stream":
        call("stream", sync_client(server), messages)
    else:
        asyncio.run(acall("astream", async_client(server), messages))
    loopscope.flush()
    [chat] = instrumented.spans(a.OP_CHAT)
    assert chat.status.status_code is StatusCode.ERROR and "model overloaded" in chat.status.description
    _, [(outcome, error, reasons, output)] = instrumented.store.sql(
        "SELECT outcome, error, finish_reasons, output_messages FROM model_calls")
    assert (outcome, error, json.loads(reasons)) == ("error", "model overloaded", ["ERROR"])
    assert "This " in output  # the text streamed before the failure is kept
    assert only_turn(instrumented.store).loop_end_reason == LoopEndReason.ERROR


# -- concurrency ---------------------------------------------------------------------------------------


def test_twenty_interleaved_async_conversations(instrumented, server):
    """A client each; the replies come at once (no delay), the rounds apart."""
    interleaved.run_async(instrumented, server, seed=5, call_id="get_weather_c{i:02d}",
                          queue=lambda tag, *, call_id, city, delay: tool_round_script(server, tag, call_id=call_id, city=city),
                          client=lambda i: async_client(server), modes=["async", "astream"], follow_up=follow_up,
                          call=lambda client, mode, messages: acall(mode, client, messages))


# -- streams let go early ------------------------------------------------------------------------------

LONG = "one two three four five six seven eight nine ten eleven twelve"


def hello(server: FakeModelServer) -> None:
    server.queue(Reply(text="Hello."))
    sync_client(server).chat(model=MODEL, messages=[{"role": "user", "content": "Hi"}])


@pytest.mark.parametrize("how", ["close", "break", "collect"])
def test_a_stream_let_go_early_ends_its_call_once(instrumented, server, how):
    server.queue(Reply(text=LONG))
    stream = sync_client(server).chat_stream(model=MODEL, messages=[{"role": "user", "content": "Count"}])
    for i, _event in enumerate(stream):
        if i == 3:
            break
    if how == "close":
        stream.close()
    del stream, _event
    gc.collect()
    assert_one_cancelled_call(instrumented, then=partial(hello, server))


def test_an_async_stream_closed_early_ends_its_call_once(instrumented, server):
    server.queue(Reply(text=LONG))

    async def main() -> None:
        stream = async_client(server).chat_stream(model=MODEL, messages=[{"role": "user", "content": "Count"}])
        async for _event in stream:
            break
        await stream.aclose()

    asyncio.run(main())
    assert_one_cancelled_call(instrumented, then=partial(hello, server))


def test_a_stream_never_read_ends_with_nothing_sent(instrumented, server):
    """``chat_stream`` is a generator: nothing is sent, and no call made, until it is read."""
    stream = sync_client(server).chat_stream(model=MODEL, messages=[{"role": "user", "content": "Count"}])
    del stream
    gc.collect()
    loopscope.flush()
    assert server.requests == [] and instrumented.spans(a.OP_CHAT) == []


# -- secrets ------------------------------------------------------------------------------------------


def test_api_keys_and_authorization_headers_are_never_recorded(instrumented, server):
    for mode in MODES:
        tool_round_script(server)
        run_loop(mode, server)
    loopscope.flush()
    assert server.requests[0].headers["authorization"] == f"Bearer {API_KEY}"
    assert_never_recorded(instrumented, API_KEY, "authorization", "Bearer", present=("get_weather", "sunny"))


# -- instrument and uninstrument ---------------------------------------------------------------------


def test_instrument_twice_is_once_and_uninstrument_restores(recording, server):
    from cohere.v2 import raw_client

    made = {"before": sync_client(server)}  # a client made before instrument() is recorded too

    def calls() -> None:
        made["after"] = sync_client(server)
        for client in made.values():
            server.queue(Reply(text="Hello."), Reply(text="Hello."))
            client.chat(model=MODEL, messages=[{"role": "user", "content": "Hi"}])
            list(client.chat_stream(model=MODEL, messages=[{"role": "user", "content": "Hi"}]))

    def after() -> None:  # made while instrumented: no longer recorded
        server.queue(Reply(text="Hello again."))
        made["after"].chat(model=MODEL, messages=[{"role": "user", "content": "Hi"}])

    switching.assert_instrument_twice_is_once(
        recording, chats=4, calls=calls, after=after,
        originals=lambda: {(cls, name): cls.__dict__[name] for cls in (raw_client.RawV2Client, raw_client.AsyncRawV2Client)
                           for name in ("chat", "chat_stream")})


# -- one call, one record ------------------------------------------------------------------------------


def test_a_pydantic_ai_agent_over_the_sdk_is_recorded_once(instrumented, server):
    """pydantic-ai's CohereModel calls ``AsyncClientV2.chat``: its own model-call spans record each call, the SDK
    adapter leaves them alone."""
    from pydantic_ai import Agent
    from pydantic_ai.models.cohere import CohereModel
    from pydantic_ai.providers.cohere import CohereProvider

    tool_round_script(server)
    agent = Agent(CohereModel(MODEL, provider=CohereProvider(cohere_client=async_client(server))))

    @agent.tool_plain
    def get_weather(city: str) -> str:
        return f"sunny in {city}"

    assert agent.run_sync(QUESTION).output == ANSWER
    loopscope.flush()
    assert len(server.requests) == 2
    chats = instrumented.spans(a.OP_CHAT)
    assert len(chats) == 2 and {c.instrumentation_scope.name for c in chats} != {"loopscope"}
    _, [(count,)] = instrumented.store.sql("SELECT count(*) FROM model_calls")
    assert count == 2
    turn = only_turn(instrumented.store)
    assert (turn.round_count, turn.tool_calls_count, turn.loop_end_reason) == (1, 1, LoopEndReason.COMPLETED)
