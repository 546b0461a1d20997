"""Every fault of issue 17, end to end: the real openai and anthropic SDKs (chat completions,
responses, messages; sync, async, stream) against the fake model server, recorded by the
instrumentation into a real DuckDB file and read back as a user reads it: the rows of
``Store.model_calls``, ``Store.list_turns`` and the ``turn_summaries`` view.

tests/instrument/test_model_call_spans.py checks the ``chat`` spans for the same faults;
these tests check that what the spans say reaches the columns a user queries."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from genai_prices import Usage as PriceUsage
from genai_prices import calc_price
from pydantic import BaseModel

import loopscope
from fakes.model_server import Reply, ToolCall, Usage
from loopscope import LoopEndReason
from loopscope.models import ModelCall

APIS = ["chat", "responses", "messages"]
MODES = ["sync", "async", "stream"]
# models genai-prices knows, so that every row has a cost to check
MODELS = {"chat": "gpt-4o-mini", "responses": "gpt-4o-mini", "messages": "claude-3-5-haiku-20241022"}
PROVIDERS = {"chat": "openai", "responses": "openai", "messages": "anthropic"}
# the provider's own finish reasons, as the GenAI conventions keep them: (asked for a tool, answered)
FINISH = {"chat": ("tool_calls", "stop"), "responses": ("tool_calls", "stop"), "messages": ("tool_use", "end_turn")}
RESPONSE_IDS = {"chat": "chatcmpl-fake", "responses": "resp_fake_", "messages": "msg_fake_"}
LONG = " ".join(f"word{i}" for i in range(40))


# -- one call of any API in any mode, as a user writes it -------------------------------------------


def _client(api: str, server: Any, is_async: bool) -> Any:
    if api == "messages":
        return server.async_anthropic_client() if is_async else server.anthropic_client()
    return server.async_openai_client() if is_async else server.openai_client()


def _create(api: str, client: Any, messages: Any, **extra: Any) -> Any:
    model = MODELS[api]
    if api == "chat":
        return client.chat.completions.create(model=model, messages=messages, **extra)
    if api == "responses":
        return client.responses.create(model=model, input=messages, **extra)
    return client.messages.create(model=model, messages=messages, **{"max_tokens": 100, **extra})


def call(api: str, mode: str, server: Any, messages: Any = "hi", **extra: Any) -> None:
    """One model call, read to its end."""
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    if mode == "async":

        async def main() -> None:
            async with _client(api, server, True) as client:  # closed in its loop, not by the GC after it
                await _create(api, client, messages, **extra)

        asyncio.run(main())
        return
    if mode == "stream":
        if api == "chat":
            extra.setdefault("stream_options", {"include_usage": True})
        for _ in _create(api, _client(api, server, False), messages, stream=True, **extra):
            pass
        return
    _create(api, _client(api, server, False), messages, **extra)


def rows(recording: Any, session_id: str | None = None) -> list[ModelCall]:
    loopscope.flush()
    return recording.store.model_calls(session_id, with_messages=True)


def only_row(recording: Any) -> ModelCall:
    (row,) = rows(recording)
    return row


def only_turn(recording: Any) -> Any:
    (turn,) = recording.store.list_turns()
    return turn


def summary(recording: Any, *columns: str) -> tuple[Any, ...]:
    _, (row,) = recording.store.sql(f"SELECT {', '.join(columns)} FROM turn_summaries")
    return row


def genai_price(row: ModelCall) -> float:
    """What genai-prices says the row's normalized usage costs (its input includes the cache)."""
    u = row.usage
    usage = PriceUsage(input_tokens=u["input_tokens"], output_tokens=u["output_tokens"],
                       cache_read_tokens=u.get("cache_read_input_tokens", 0),
                       cache_write_tokens=u.get("cache_creation_input_tokens", 0))
    assert row.request_model is not None
    return float(calc_price(usage, row.request_model, provider_id=row.provider).total_price)


# -- every column, from a real tool loop ------------------------------------------------------------

TOOLS = {
    "chat": [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}],
    "responses": [{"type": "function", "name": "weather", "parameters": {"type": "object"}}],
    "messages": [{"name": "weather", "input_schema": {"type": "object"}}],
}
# the request parameters each API takes (this anthropic SDK has no temperature argument)
PARAMETERS = {
    "chat": ({"temperature": 0.5, "max_tokens": 300, "tool_choice": "required"},
             {"temperature": 0.5, "max_tokens": 300, "tool_choice": "required"}),
    "responses": ({"temperature": 0.5, "max_output_tokens": 300, "tool_choice": "required"},
                  {"temperature": 0.5, "max_tokens": 300, "tool_choice": "required"}),
    "messages": ({"max_tokens": 300, "stop_sequences": ["END"], "tool_choice": {"type": "any"}},
                 {"max_tokens": 300, "stop": ["END"], "tool_choice": "any"}),
}
QUESTION = "Weather in Paris?"


def _history(api: str, call_id: str) -> list[dict[str, Any]]:
    """The second request's messages: the question, the model's tool call, the tool's result."""
    user = {"role": "user", "content": QUESTION}
    if api == "chat":
        return [user, {"role": "assistant", "content": "Checking.", "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": call_id, "content": "21"}]
    if api == "responses":
        return [user, {"role": "assistant", "content": "Checking."},
                {"type": "function_call", "call_id": call_id, "name": "weather", "arguments": '{"city": "Paris"}'},
                {"type": "function_call_output", "call_id": call_id, "output": "21"}]
    return [user, {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
                                                    {"type": "tool_use", "id": call_id, "name": "weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": "21"}]}]


def _history_in_genai_schema(api: str, call_id: str) -> list[dict[str, Any]]:
    user = {"role": "user", "parts": [{"type": "text", "content": QUESTION}]}
    text = {"type": "text", "content": "Checking."}
    result = {"type": "tool_call_response", "id": call_id, "response": "21"}
    if api == "chat":
        return [user, {"role": "assistant", "parts": [text, {"type": "tool_call", "id": call_id, "name": "weather", "arguments": '{"city": "Paris"}'}]},
                {"role": "tool", "parts": [result]}]
    if api == "responses":
        return [user, {"role": "assistant", "parts": [text]},
                {"role": "assistant", "parts": [{"type": "tool_call", "id": call_id, "name": "weather", "arguments": '{"city": "Paris"}'}]},
                {"role": "tool", "parts": [result]}]
    return [user, {"role": "assistant", "parts": [text, {"type": "tool_call", "id": call_id, "name": "weather", "arguments": {"city": "Paris"}}]},
            {"role": "user", "parts": [result]}]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("api", APIS)
def test_a_tool_loop_fills_every_column_of_its_two_rows(api, mode, instrumented, server):
    call_id = "toolu_w1" if api == "messages" else "call_w1"
    # the figures: Anthropic reports input_tokens 3 beside 1,111 read from the cache and
    # 418 written to it; OpenAI's prompt tokens include both already
    if api == "messages":
        first_usage, second_usage = Usage(3, 20, cached_tokens=1111, cache_creation_tokens=418), Usage(5, 9, cached_tokens=1529)
    else:
        first_usage, second_usage = Usage(1532, 20, cached_tokens=1111, cache_creation_tokens=418), Usage(1534, 9, cached_tokens=1529)
    server.queue(Reply(text="Checking.", tool_calls=[ToolCall("weather", {"city": "Paris"}, id=call_id)], usage=first_usage),
                 Reply(text="21 °C in Paris.", usage=second_usage))
    sent, recorded = PARAMETERS[api]
    with loopscope.turn(session_id="loop"):
        call(api, mode, server, QUESTION, tools=TOOLS[api], **sent)
        call(api, mode, server, _history(api, call_id), tools=TOOLS[api])
    first, second = rows(instrumented, "loop")
    turn = only_turn(instrumented)

    for row in (first, second):
        assert (row.session_id, row.correlation_id) == ("loop", turn.correlation_id)
        assert (row.provider, row.request_model, row.response_model, row.model) == (PROVIDERS[api], *[MODELS[api]] * 3)
        assert row.response_id is not None and row.response_id.startswith(RESPONSE_IDS[api])
        assert row.outcome == "completed" and (row.error_type, row.error, row.refusal) == (None, None, None)
        assert row.streaming is (mode == "stream")
        assert row.started_at is not None and row.ended_at is not None and row.started_at <= row.ended_at
        if mode == "stream":
            assert row.time_to_first_chunk_ms is not None and 0 < row.time_to_first_chunk_ms <= (row.duration_ms or 0)
        else:
            assert row.time_to_first_chunk_ms is None
        assert row.parameters["server_address"] == "127.0.0.1"
        # the cost of the NORMALIZED usage, as genai-prices prices it (the cache at its own rates)
        assert row.cost_usd == pytest.approx(genai_price(row), rel=1e-9) and row.price_source == "genai-prices"
        assert row.cost_usd > 0
    assert first.response_id != second.response_id
    assert (first.position, second.position) == (1, 2)
    asked_for_tool, answered = FINISH[api]
    assert (first.finish_reasons, second.finish_reasons) == ([asked_for_tool], [answered])

    # usage: input normalized to include the cache; the provider's own figures beside
    reasoning = {} if api == "messages" else {"reasoning_tokens": 0}  # Anthropic reports no reasoning tokens
    assert first.usage == {"input_tokens": 1532, "output_tokens": 20, "cache_read_input_tokens": 1111,
                           "cache_creation_input_tokens": 418, **reasoning}
    assert second.usage["input_tokens"] == 1534
    # provider_usage is the usage object as the provider sent it, its own names and nesting
    if api == "messages":
        assert first.provider_usage == {"input_tokens": 3, "output_tokens": 20, "cache_read_input_tokens": 1111,
                                        "cache_creation_input_tokens": 418, "service_tier": "standard"}
    else:
        given, details = {"chat": ("prompt_tokens", "prompt_tokens_details"), "responses": ("input_tokens", "input_tokens_details")}[api]
        assert first.provider_usage[given] == 1532
        assert first.provider_usage[details]["cached_tokens"] == 1111

    # request parameters, tool_choice only where the request gave one
    assert {k: first.parameters.get(k) for k in recorded} == recorded
    assert "tool_choice" not in second.parameters

    # messages in the GenAI schema: what was sent, what came back (one message per choice)
    assert first.input_messages == [{"role": "user", "parts": [{"type": "text", "content": QUESTION}]}]
    assert second.input_messages == _history_in_genai_schema(api, call_id)
    (asked,) = first.output_messages
    assert asked["finish_reason"] == asked_for_tool
    assert [p["type"] for p in asked["parts"]] == ["text", "tool_call"]
    assert asked["parts"][1]["id"] == call_id and asked["parts"][1]["name"] == "weather"
    assert second.output_messages == [
        {"role": "assistant", "parts": [{"type": "text", "content": "21 °C in Paris."}], "finish_reason": answered}]

    # the turn, list_turns and turn_summaries agree with the rows
    assert turn.usage["input_tokens"] == 1532 + 1534
    assert turn.usage["cache_read_input_tokens"] == 1111 + 1529
    assert turn.model_call_count == 2
    assert summary(instrumented, "model_calls", "input_tokens", "cache_read_input_tokens", "cost_usd", "unpriced_calls") == (
        2, 1532 + 1534, 1111 + 1529, pytest.approx(first.cost_usd + second.cost_usd), 0)


# -- n > 1: every choice ----------------------------------------------------------------------------
# only Chat Completions takes n: the Responses and Messages APIs answer with one message


@pytest.mark.parametrize("mode", MODES)
def test_every_choice_of_n_is_in_the_row(mode, instrumented, server):
    server.queue(Reply(text="First.", choices=[Reply(text="Second, cut", stop="length"), Reply(text="Third.")]))
    call("chat", mode, server, n=3)
    row = only_row(instrumented)
    assert row.finish_reasons == ["stop", "length", "stop"]
    assert [(m["parts"][0]["content"], m["finish_reason"]) for m in row.output_messages] == [
        ("First.", "stop"), ("Second, cut", "length"), ("Third.", "stop")]
    assert row.parameters["choice_count"] == 3
    assert row.outcome == "completed"  # choice 0's; the turn's text is choice 0's too
    assert only_turn(instrumented).segments == ["First."]


# -- refusals ----------------------------------------------------------------------------------------


def _assert_refused(recording: Any, text: str) -> None:
    row = only_row(recording)
    assert (row.outcome, row.refusal) == ("refusal", text)
    assert (row.error_type, row.error) == (None, None)
    turn = only_turn(recording)
    assert turn.loop_end_reason == LoopEndReason.REFUSAL
    assert summary(recording, "loop_end_reason") == ("refusal",)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("api", APIS)
def test_a_refusal_is_the_rows_outcome_and_the_turns_end(api, mode, instrumented, server):
    if api == "messages":  # Anthropic: stop_reason "refusal", its text is the message's
        server.queue(Reply(text="I won't do that.", stop="refusal"))
    else:  # Chat: message.refusal; Responses: a refusal content part
        server.queue(Reply(refusal="I won't do that."))
    call(api, mode, server, "something bad")
    _assert_refused(instrumented, "I won't do that.")
    assert only_row(instrumented).finish_reasons  # the provider's reason is kept beside the outcome


class Answer(BaseModel):
    value: int


@pytest.mark.parametrize("mode", ["sync", "async", "stream"])
def test_a_parse_refusal_is_the_rows_outcome_and_the_turns_end(mode, instrumented, server):
    server.queue(Reply(refusal="I can't help with that."))
    messages: Any = [{"role": "user", "content": "something bad"}]
    if mode == "async":

        async def main() -> Any:
            async with server.async_openai_client() as client:
                completion = await client.chat.completions.parse(model=MODELS["chat"], messages=messages, response_format=Answer)
            return completion.choices[0].message.refusal

        refusal = asyncio.run(main())
    elif mode == "stream":
        with server.openai_client().chat.completions.stream(model=MODELS["chat"], messages=messages, response_format=Answer) as stream:
            for _ in stream:
                pass
            refusal = stream.get_final_completion().choices[0].message.refusal
    else:
        completion = server.openai_client().chat.completions.parse(model=MODELS["chat"], messages=messages, response_format=Answer)
        refusal = completion.choices[0].message.refusal
    assert refusal == "I can't help with that."
    _assert_refused(instrumented, "I can't help with that.")


# -- content filter ----------------------------------------------------------------------------------
# Anthropic has no content-filter stop reason: its classifiers stop with "refusal" (above)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("api", ["chat", "responses"])
def test_a_content_filter_is_the_rows_outcome_and_the_turns_end(api, mode, instrumented, server):
    server.queue(Reply(text="", stop="content_filter"))
    call(api, mode, server)
    row = only_row(instrumented)
    assert (row.outcome, row.finish_reasons) == ("content_filter", ["content_filter"])
    assert only_turn(instrumented).loop_end_reason == LoopEndReason.CONTENT_FILTER
    assert summary(instrumented, "loop_end_reason") == ("content_filter",)


# -- an HTTP 200 whose body is an error --------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("api", APIS)
def test_an_http_200_error_body_is_an_error_row_and_turn(api, mode, instrumented, server):
    server.queue(Reply.error_200("upstream provider timed out", type="upstream_error"))
    call(api, mode, server)
    row = only_row(instrumented)
    assert (row.outcome, row.error_type, row.error) == ("error", "upstream_error", "upstream provider timed out")
    assert instrumented.store.model_calls(failed=True) == [row.model_copy(update={"input_messages": None, "output_messages": None})]
    turn = only_turn(instrumented)
    assert turn.loop_end_reason == LoopEndReason.ERROR
    assert turn.error == "upstream_error: upstream provider timed out"
    assert summary(instrumented, "loop_end_reason", "error") == ("error", turn.error)


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("api", APIS)
def test_an_http_200_error_body_to_a_stream_is_an_error_row_and_turn(api, is_async, instrumented, server):
    server.queue(Reply.error_200("upstream provider timed out", type="upstream_error"))
    messages = [{"role": "user", "content": "hi"}]
    # the SDKs raise nothing and yield nothing: the JSON body has no SSE event to read.
    # The stream is still held while the rows are read: the call ends with its iteration, not when
    # the stream object is collected
    if is_async:

        async def read() -> tuple[list[Any], Any]:
            async with _client(api, server, True) as client:
                stream = await _create(api, client, messages, stream=True)
                return [event async for event in stream], stream

        events, stream = asyncio.run(read())
    else:
        stream = _create(api, _client(api, server, False), messages, stream=True)
        events = list(stream)
    assert events == []
    row = only_row(instrumented)
    assert (row.outcome, row.error_type, row.error) == ("error", "upstream_error", "upstream provider timed out")
    turn = only_turn(instrumented)
    assert turn.loop_end_reason == LoopEndReason.ERROR
    assert turn.error == "upstream_error: upstream provider timed out"
    del stream


@pytest.mark.parametrize("api", APIS)
def test_a_json_body_without_an_error_to_a_stream_is_an_error_row_that_says_so(api, instrumented, server):
    server.queue(Reply(raw_body={"status": "busy"}))  # HTTP 200, application/json, no error object
    call(api, "stream", server)
    row = only_row(instrumented)
    assert (row.outcome, row.error) == ("error", "HTTP 200 with a JSON body, not an event stream")
    assert only_turn(instrumented).loop_end_reason == LoopEndReason.ERROR


# -- a stream closed early after some chunks ---------------------------------------------------------
# only a stream can be closed early; a plain call's body arrives whole


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("api", APIS)
def test_a_stream_closed_early_is_a_cancelled_row_that_keeps_its_id_and_model(api, is_async, instrumented, server):
    usage = Usage(3, 20, cached_tokens=1111, cache_creation_tokens=418) if api == "messages" else None
    server.queue(Reply(text=LONG, usage=usage, model="served-model"))

    async def read_three_async() -> None:
        async with _client(api, server, True) as client:
            stream = await _create(api, client, [{"role": "user", "content": "hi"}], stream=True)
            seen = 0
            async for _ in stream:
                seen += 1
                if seen == 3:
                    break
            await stream.close()

    if is_async:
        asyncio.run(read_three_async())
    else:
        stream = _create(api, _client(api, server, False), [{"role": "user", "content": "hi"}], stream=True)
        for seen, _ in enumerate(stream, 1):
            if seen == 3:
                break
        stream.close()
    row = only_row(instrumented)
    assert row.outcome == "cancelled"
    assert row.response_id is not None and row.response_id.startswith(RESPONSE_IDS[api])
    assert (row.response_model, row.model, row.request_model) == ("served-model", "served-model", MODELS[api])
    assert row.streaming is True
    if api == "messages":  # message_start carried the usage: normalized, raw beside
        assert row.usage["input_tokens"] == 1532 and row.provider_usage["input_tokens"] == 3
    assert only_turn(instrumented).loop_end_reason == LoopEndReason.CANCELLED
    assert summary(instrumented, "loop_end_reason") == ("cancelled",)
