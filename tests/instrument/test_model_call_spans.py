"""Every model call's ``chat`` span says what really happened (issue 17): normalized usage
with the provider's figures beside, every choice of ``n > 1``, what a stream closed early
had said, refusals, content filters and error bodies, the call's place in its turn, its
outcome, its input messages and request parameters; the turn's model-call count.

The real openai and anthropic SDKs against the fake model server, recorded into a real
DuckDB file; each API sync, async and streamed."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from pydantic import BaseModel

import loopscope
from fakes.model_server import Reply, ToolCall, Usage
from loopscope import LoopEndReason
from loopscope import semconv as a
from loopscope.instrument import _read
from recorded import only_turn, spans_of

MODEL = "model-under-test"
APIS = ["chat", "responses", "messages"]
MODES = ["sync", "async", "stream"]
LONG = " ".join(f"word{i}" for i in range(40))


# -- one call of any API, any mode, as a user writes it --------------------------------------------


def _create(api: str, client: Any, prompt: str, **extra: Any) -> Any:
    if api == "chat":
        return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}], **extra)
    if api == "responses":
        return client.responses.create(model=MODEL, input=prompt, **extra)
    return client.messages.create(model=MODEL, max_tokens=100, messages=[{"role": "user", "content": prompt}], **extra)


def _client(api: str, server: Any, is_async: bool) -> Any:
    if api == "messages":
        return server.async_anthropic_client() if is_async else server.anthropic_client()
    return server.async_openai_client() if is_async else server.openai_client()


def call(api: str, mode: str, server: Any, prompt: str = "hi", **extra: Any) -> None:
    """One model call, read to its end."""
    if mode == "async":

        async def main() -> None:
            await _create(api, _client(api, server, True), prompt, **extra)

        asyncio.run(main())
        return
    if mode == "stream":
        if api == "chat":
            extra.setdefault("stream_options", {"include_usage": True})
        for _ in _create(api, _client(api, server, False), prompt, stream=True, **extra):
            pass
        return
    _create(api, _client(api, server, False), prompt, **extra)


def chat_span(recording: Any) -> Any:
    [span] = spans_of(recording, a.OP_CHAT)
    return span


def agent_span(recording: Any) -> Any:
    [span] = spans_of(recording, a.OP_INVOKE_AGENT)
    return span


# -- 1. usage: input tokens include the cached ones on every provider ------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("api", APIS)
def test_input_tokens_include_cached_tokens_on_every_provider(api, mode, instrumented, server):
    # the call: Anthropic says input_tokens 3 for a prompt with 1,111 tokens read from
    # the cache and 418 written to it; OpenAI counts those in its prompt tokens already
    if api == "messages":
        usage = Usage(3, 20, cached_tokens=1111, cache_creation_tokens=418)
    else:
        usage = Usage(1532, 20, cached_tokens=1111, cache_creation_tokens=418)
    server.queue(Reply(text="Cached.", usage=usage))
    call(api, mode, server)
    turn = only_turn(instrumented.store)
    assert turn.usage["input_tokens"] == 1532
    assert (turn.usage["cache_read_input_tokens"], turn.usage["cache_creation_input_tokens"]) == (1111, 418)
    chat = chat_span(instrumented).attributes
    assert (chat[a.USAGE_INPUT], chat[a.USAGE_CACHE_READ], chat[a.USAGE_CACHE_WRITE]) == (1532, 1111, 418)
    assert agent_span(instrumented).attributes[a.USAGE_INPUT] == 1532  # what OTLP and the metrics read
    raw = json.loads(chat[a.USAGE_PROVIDER])
    if api == "messages":  # the provider's usage object, whole, as it reported it
        assert raw == {"input_tokens": 3, "output_tokens": 20, "cache_read_input_tokens": 1111, "cache_creation_input_tokens": 418,
                       "service_tier": "standard"}
    else:
        total, details = {"chat": ("prompt_tokens", "prompt_tokens_details"), "responses": ("input_tokens", "input_tokens_details")}[api]
        assert raw[total] == 1532 and raw[details]["cached_tokens"] == 1111 and raw["total_tokens"] == 1552
    # the views' totals agree with the calls
    for view in ("turn_summaries", "token_usage"):
        _, [(total,)] = instrumented.store.sql(f"SELECT sum(input_tokens) FROM {view}")
        assert total == 1532, view


def test_a_turn_of_anthropic_and_openai_calls_sums_normalized_usage(instrumented, server):
    server.queue(Reply(text="A.", usage=Usage(3, 5, cached_tokens=1111, cache_creation_tokens=418)))
    server.queue(Reply(text="B.", usage=Usage(100, 5, cached_tokens=60)))
    with loopscope.turn(session_id="mixed"):
        call("messages", "sync", server)
        call("chat", "sync", server)
    turn = only_turn(instrumented.store)
    assert turn.usage["input_tokens"] == 1532 + 100 and turn.usage["cache_read_input_tokens"] == 1111 + 60


# -- 2. n > 1: every choice ------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_every_choice_is_recorded(mode, instrumented, server):
    server.queue(Reply(text="First answer.", choices=[Reply(text="Second answer, cut", stop="length"), Reply(text="Third.")]))
    call("chat", mode, server, n=3)
    chat = chat_span(instrumented).attributes
    assert chat[a.RESPONSE_FINISH_REASONS] == ("stop", "length", "stop")
    messages = json.loads(chat[a.OUTPUT_MESSAGES])
    assert [(m["parts"][0]["content"], m["finish_reason"]) for m in messages] == [
        ("First answer.", "stop"), ("Second answer, cut", "length"), ("Third.", "stop"),
    ]
    assert chat["gen_ai.request.choice.count"] == 3
    turn = only_turn(instrumented.store)
    assert turn.segments == ["First answer."]  # the turn's text is choice 0's
    assert turn.loop_end_reason == LoopEndReason.COMPLETED


# -- 3. a stream closed early keeps what it had ----------------------------------------------------


@pytest.mark.parametrize("is_async", [False, True])
@pytest.mark.parametrize("api", APIS)
def test_stream_closed_early_keeps_id_model_and_usage(api, is_async, instrumented, server):
    usage = Usage(3, 20, cached_tokens=1111, cache_creation_tokens=418) if api == "messages" else None
    server.queue(Reply(text=LONG, usage=usage, model="served-model"))

    async def read_three_async() -> None:
        stream = await _create(api, _client(api, server, True), "hi", stream=True)
        seen = 0
        async for _ in stream:
            seen += 1
            if seen == 3:
                break
        await stream.close()

    if is_async:
        asyncio.run(read_three_async())
    else:
        stream = _create(api, _client(api, server, False), "hi", stream=True)
        for seen, _ in enumerate(stream, 1):
            if seen == 3:
                break
        stream.close()
    chat = chat_span(instrumented).attributes
    assert chat[a.RESPONSE_ID].startswith({"chat": "chatcmpl-fake", "responses": "resp_fake_", "messages": "msg_fake_"}[api])
    assert chat[a.RESPONSE_MODEL] == "served-model"
    assert chat[a.CALL_OUTCOME] == "cancelled"
    if api == "messages":  # message_start's usage, normalized
        assert chat[a.USAGE_INPUT] == 1532
    assert only_turn(instrumented.store).loop_end_reason == LoopEndReason.CANCELLED


# -- 4. refusals, content filters, error bodies ----------------------------------------------------


class Answer(BaseModel):
    value: int


@pytest.mark.parametrize("mode", ["sync", "async", "beta"])
def test_parse_refusal_is_a_refusal(mode, instrumented, server):
    server.queue(Reply(refusal="I can't help with that."))
    messages = [{"role": "user", "content": "something bad"}]
    if mode == "async":

        async def main() -> Any:
            return await server.async_openai_client().chat.completions.parse(model=MODEL, messages=messages, response_format=Answer)

        completion = asyncio.run(main())
    elif mode == "beta":
        completion = server.openai_client().beta.chat.completions.parse(model=MODEL, messages=messages, response_format=Answer)
    else:
        completion = server.openai_client().chat.completions.parse(model=MODEL, messages=messages, response_format=Answer)
    assert completion.choices[0].message.refusal == "I can't help with that."
    chat = chat_span(instrumented).attributes
    assert (chat[a.CALL_OUTCOME], chat[a.CALL_REFUSAL]) == ("refusal", "I can't help with that.")
    assert only_turn(instrumented.store).loop_end_reason == LoopEndReason.REFUSAL


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("api", APIS)
def test_refusal_is_visible_on_the_call_and_the_turn(api, mode, instrumented, server):
    if api == "messages":  # Anthropic: stop_reason "refusal", its text is the message's
        server.queue(Reply(text="I won't do that.", stop="refusal"))
    else:
        server.queue(Reply(refusal="I won't do that."))
    call(api, mode, server)
    chat = chat_span(instrumented).attributes
    assert (chat[a.CALL_OUTCOME], chat[a.CALL_REFUSAL]) == ("refusal", "I won't do that.")
    turn = only_turn(instrumented.store)
    assert turn.loop_end_reason == LoopEndReason.REFUSAL and turn.segments == ["I won't do that."]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("api", ["chat", "responses"])
def test_content_filter_is_not_an_empty_response(api, mode, instrumented, server):
    server.queue(Reply(text="", stop="content_filter"))
    call(api, mode, server)
    chat = chat_span(instrumented).attributes
    assert chat[a.CALL_OUTCOME] == "content_filter" and chat[a.RESPONSE_FINISH_REASONS] == ("content_filter",)
    assert only_turn(instrumented.store).loop_end_reason == LoopEndReason.CONTENT_FILTER


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("api", APIS)
def test_http_200_with_an_error_body_is_an_error(api, mode, instrumented, server):
    server.queue(Reply.error_200("upstream provider timed out", type="upstream_error"))
    call(api, mode, server)
    chat = chat_span(instrumented)
    assert chat.attributes[a.CALL_OUTCOME] == "error"
    assert chat.attributes[a.CALL_ERROR] == "upstream provider timed out"
    assert chat.attributes[a.ERROR_TYPE] == "upstream_error"
    assert chat.status.description == "upstream provider timed out"
    turn = only_turn(instrumented.store)
    assert turn.loop_end_reason == LoopEndReason.ERROR
    assert turn.error == "upstream_error: upstream provider timed out"


# -- 5. position, outcome, input messages, request parameters --------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("api", APIS)
def test_every_call_has_its_position_and_outcome(api, mode, instrumented, server):
    server.queue(
        Reply(text="Checking.", tool_calls=[ToolCall("weather", {"city": "Paris"}, id="call_p1")]),
        Reply(text="Cut", stop="length"),
    )
    tools = {
        "chat": [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}],
        "responses": [{"type": "function", "name": "weather", "parameters": {"type": "object"}}],
        "messages": [{"name": "weather", "input_schema": {"type": "object"}}],
    }[api]
    choice = {"chat": "required", "responses": "required", "messages": {"type": "any"}}[api]
    with loopscope.turn(session_id="positions") as turn:
        call(api, mode, server, tools=tools, tool_choice=choice)
        call(api, mode, server, tools=tools)
    chats = sorted(spans_of(instrumented, a.OP_CHAT), key=lambda s: s.start_time)
    assert [s.attributes[a.CALL_POSITION] for s in chats] == [1, 2]
    assert [s.attributes[a.CALL_OUTCOME] for s in chats] == ["completed", "truncated"]
    assert chats[0].attributes[a.REQUEST_TOOL_CHOICE] == ("any" if api == "messages" else "required")
    assert a.REQUEST_TOOL_CHOICE not in chats[1].attributes
    assert turn.response is not None and turn.response.model_call_count == 2


def test_a_conversation_past_the_memory_of_message_texts_is_recorded_in_full_on_every_call(instrumented, server, monkeypatch):
    # the JSON of the messages already sent is remembered (bounded): past its bound, and
    # with the same message objects again, every call still records its whole history
    monkeypatch.setattr(_read, "MESSAGE_CACHE_ENTRIES", 3)
    monkeypatch.setattr(_read, "MESSAGE_CACHE_CHARS", 2000)
    client = server.openai_client()
    history: list[Any] = [{"role": "system", "content": "Be brief. " * 20}]
    expected = [{"role": "system", "parts": [{"type": "text", "content": "Be brief. " * 20}]}]
    for i in range(6):
        history.append({"role": "user", "content": f"question {i} é"})
        expected.append({"role": "user", "parts": [{"type": "text", "content": f"question {i} é"}]})
        arguments = json.dumps({"n": i, "city": "Zürich"})
        history.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{i}", "type": "function", "function": {"name": "lookup", "arguments": arguments}}]})
        expected.append({"role": "assistant", "parts": [{"type": "tool_call", "id": f"call_{i}", "name": "lookup", "arguments": arguments}]})
        history.append({"role": "tool", "tool_call_id": f"call_{i}", "content": f"result {i}"})
        expected.append({"role": "tool", "parts": [{"type": "tool_call_response", "id": f"call_{i}", "response": f"result {i}"}]})
        client.chat.completions.create(model=MODEL, messages=history)
        chats = sorted(spans_of(instrumented, a.OP_CHAT), key=lambda s: s.start_time)
        assert json.loads(chats[-1].attributes[a.INPUT_MESSAGES]) == expected
        assert len(_read._made) <= 3
    assert _read._made_chars <= 2000


def test_a_message_the_loop_edits_between_calls_is_recorded_as_it_was_sent_each_time(instrumented, server):
    # the JSON of an assistant message's tool calls is remembered by its texts, not by the
    # message: a loop that rewrites a call's arguments (or its text) in place before the
    # next request has the next call record what that request sent
    client = server.openai_client()
    call = {"id": "call_e1", "type": "function", "function": {"name": "lookup", "arguments": '{"city": "Paris"}'}}
    assistant: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
    history: list[Any] = [{"role": "user", "content": "Weather?"}, assistant, {"role": "tool", "tool_call_id": "call_e1", "content": "21"}]
    client.chat.completions.create(model=MODEL, messages=history)
    call["function"]["arguments"] = '{"city": "Lyon"}'
    assistant["content"] = "Looking it up."
    client.chat.completions.create(model=MODEL, messages=history)
    chats = sorted(spans_of(instrumented, a.OP_CHAT), key=lambda s: s.start_time)
    sent = [json.loads(chat.attributes[a.INPUT_MESSAGES])[1] for chat in chats]
    assert sent == [
        {"role": "assistant", "parts": [{"type": "tool_call", "id": "call_e1", "name": "lookup", "arguments": '{"city": "Paris"}'}]},
        {"role": "assistant", "parts": [
            {"type": "text", "content": "Looking it up."},
            {"type": "tool_call", "id": "call_e1", "name": "lookup", "arguments": '{"city": "Lyon"}'},
        ]},
    ]


@pytest.mark.parametrize("api", APIS)
def test_input_messages_follow_the_genai_schema(api, instrumented, server):
    server.queue(Reply(text="Checking.", tool_calls=[ToolCall("weather", {"city": "Paris"}, id="call_m1")]), Reply(text="21 C."))
    client = _client(api, server, False)
    question = "Weather in Paris?"
    if api == "chat":
        history: list[Any] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}]
        first = client.chat.completions.create(model=MODEL, messages=history)
        call_ = first.choices[0].message.tool_calls[0]
        history += [
            {"role": "assistant", "content": "Checking.", "tool_calls": [{"id": call_.id, "type": "function", "function": {"name": "weather", "arguments": call_.function.arguments}}]},
            {"role": "tool", "tool_call_id": call_.id, "content": "21"},
        ]
        client.chat.completions.create(model=MODEL, messages=history)
    elif api == "responses":
        history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}]
        first = client.responses.create(model=MODEL, input=history)
        item = next(i for i in first.output if i.type == "function_call")
        history += [
            {"role": "assistant", "content": "Checking."},
            {"type": "function_call", "call_id": item.call_id, "name": "weather", "arguments": item.arguments},
            {"type": "function_call_output", "call_id": item.call_id, "output": "21"},
        ]
        client.responses.create(model=MODEL, input=history)
    else:
        history = [{"role": "user", "content": question}]
        first = client.messages.create(model=MODEL, max_tokens=100, system="Be brief.", messages=history)
        block = next(b for b in first.content if b.type == "tool_use")
        history += [
            {"role": "assistant", "content": [{"type": "text", "text": "Checking."}, {"type": "tool_use", "id": block.id, "name": "weather", "input": block.input}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block.id, "content": "21"}]},
        ]
        client.messages.create(model=MODEL, max_tokens=100, system="Be brief.", messages=history)
    chats = sorted(spans_of(instrumented, a.OP_CHAT), key=lambda s: s.start_time)
    messages = json.loads(chats[1].attributes[a.INPUT_MESSAGES])
    text = {"type": "text", "content": "Checking."}
    if api == "chat":
        assert messages == [
            {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]},
            {"role": "user", "parts": [{"type": "text", "content": question}]},
            {"role": "assistant", "parts": [text, {"type": "tool_call", "id": "call_m1", "name": "weather", "arguments": '{"city": "Paris"}'}]},
            {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_m1", "response": "21"}]},
        ]
    elif api == "responses":
        assert messages == [
            {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]},
            {"role": "user", "parts": [{"type": "text", "content": question}]},
            {"role": "assistant", "parts": [text]},
            {"role": "assistant", "parts": [{"type": "tool_call", "id": "call_m1", "name": "weather", "arguments": '{"city": "Paris"}'}]},
            {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_m1", "response": "21"}]},
        ]
    else:
        assert messages == [
            {"role": "user", "parts": [{"type": "text", "content": question}]},
            {"role": "assistant", "parts": [text, {"type": "tool_call", "id": "call_m1", "name": "weather", "arguments": {"city": "Paris"}}]},
            {"role": "user", "parts": [{"type": "tool_call_response", "id": "call_m1", "response": "21"}]},
        ]


# -- 6. round_count keeps RoomKit's meaning; model_call_count counts the calls ---------------------


@pytest.mark.parametrize("api", APIS)
def test_a_one_call_turn_has_no_tool_round_and_one_model_call(api, instrumented, server):
    server.queue(Reply(text="Hello."))
    call(api, "sync", server)
    turn = only_turn(instrumented.store)
    assert turn.round_count == 0
    agent = agent_span(instrumented).attributes
    assert (agent[a.ROUND_COUNT], agent[a.MODEL_CALL_COUNT]) == (0, 1)
    with loopscope.turn(session_id="by-hand") as hand:
        server.queue(Reply(text="Hello again."))
        call(api, "sync", server)
    assert hand.response is not None
    assert (hand.response.round_count, hand.response.model_call_count) == (0, 1)
