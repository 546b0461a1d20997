"""The openai adapter end to end: the real SDK (Chat Completions and Responses) against the
fake model server on 127.0.0.1, recorded into a real DuckDB file."""

from __future__ import annotations

import asyncio
import gc
import json
import random
import time
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.lib.streaming.chat import _completions as chat_helpers
from openai.lib.streaming.responses import _responses as response_helpers
from openai.resources.chat.completions import completions as chat_resource
from openai.resources.responses import responses as responses_resource

import loopscope
from fakes.model_server import Reply, ToolCall, Usage
from loopscope import LoopEndReason
from loopscope import semconv as a
from loopscope.models import ToolCall as ModelToolCall
from loopscope.recorder import stitch
from recorded import only_turn, rows, spans_of

API_KEY = "sk-test-NEVER-RECORD-THIS-0123456789"
MODEL = "gpt-test-1"
PROMPT = "What is the weather in Paris?"
FIRST_TEXT = "Let me check the weather."
FINAL_TEXT = "21 °C and dry in Paris."
WEATHER_RESULT = {"city": "Paris", "temp_c": 21}
FIRST_USAGE = Usage(100, 20, cached_tokens=30, reasoning_tokens=5)
SECOND_USAGE = Usage(150, 10, cached_tokens=60)
TURN_USAGE = {"input_tokens": 250, "output_tokens": 30, "cache_read_input_tokens": 90, "cache_creation_input_tokens": 0, "reasoning_tokens": 5}

WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False}
CHAT_TOOLS = [{"type": "function", "function": {"name": "weather", "description": "Weather for a city", "parameters": WEATHER_PARAMS, "strict": True}}]
RESPONSES_TOOLS = [{"type": "function", "name": "weather", "description": "Weather for a city", "parameters": WEATHER_PARAMS, "strict": True}]
TOOLS = {"chat": CHAT_TOOLS, "responses": RESPONSES_TOOLS}

APIS = ["chat", "responses"]
MODES = ["create", "stream", "helper", "parse", "raw"]

PATCHED = [
    (chat_resource.Completions, "create"),
    (chat_resource.Completions, "parse"),
    (chat_resource.AsyncCompletions, "create"),
    (chat_resource.AsyncCompletions, "parse"),
    (responses_resource.Responses, "create"),
    (responses_resource.Responses, "parse"),
    (responses_resource.AsyncResponses, "create"),
    (responses_resource.AsyncResponses, "parse"),
    (chat_helpers.ChatCompletionStream, "close"),
    (chat_helpers.AsyncChatCompletionStream, "close"),
    (response_helpers.ResponseStream, "close"),
    (response_helpers.AsyncResponseStream, "close"),
]


@pytest.fixture
def instrumented(recording):
    loopscope.instrument(anthropic=False)
    try:
        yield recording
    finally:
        loopscope.uninstrument()



def two_rounds(server: Any, match: str | None = None, call_id: str = "call_w1", city: str = "Paris", **reply: Any) -> None:
    server.queue(
        Reply(text=FIRST_TEXT, tool_calls=[ToolCall("weather", {"city": city}, id=call_id)], usage=FIRST_USAGE, **reply),
        Reply(text=FINAL_TEXT, usage=SECOND_USAGE, **reply),
        match=match,
    )


# -- driving the SDK: one call per mode, then a tool loop ---------------------------------------


def _kwargs(api: str, mode: str, extra: dict[str, Any]) -> dict[str, Any]:
    kwargs = {"model": MODEL, "tools": TOOLS[api], **extra}
    if api == "chat" and mode in ("stream", "helper"):
        kwargs["stream_options"] = {"include_usage": True}
    return kwargs


def _from_completion(completion: Any) -> tuple[str, list[tuple[str, str, str]]]:
    message = completion.choices[0].message
    return message.content or "", [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or ()]


def _from_response(response: Any) -> tuple[str, list[tuple[str, str, str]]]:
    calls = [(i.call_id, i.name, i.arguments) for i in response.output if i.type == "function_call"]
    return response.output_text, calls


class _ChunkText:
    def __init__(self) -> None:
        self.text = ""
        self.calls: dict[int, list[str]] = {}
        self.final: Any = None

    def chat(self, chunk: Any) -> None:
        for choice in chunk.choices:
            self.text += choice.delta.content or ""
            for part in choice.delta.tool_calls or ():
                slot = self.calls.setdefault(part.index, ["", "", ""])
                slot[0] = part.id or slot[0]
                slot[1] += part.function.name or "" if part.function else ""
                slot[2] += part.function.arguments or "" if part.function else ""

    def responses(self, event: Any) -> None:
        if event.type in ("response.completed", "response.incomplete"):
            self.final = event.response

    def result(self) -> tuple[str, list[tuple[str, str, str]]]:
        if self.final is not None:
            return _from_response(self.final)
        return self.text, [tuple(v) for _, v in sorted(self.calls.items())]  # type: ignore[misc]


def call_sync(api: str, mode: str, client: Any, history: list[Any], **extra: Any) -> tuple[str, list[tuple[str, str, str]]]:
    kwargs = _kwargs(api, mode, extra)
    if api == "chat":
        resource, key, read = client.chat.completions, "messages", _from_completion
    else:
        resource, key, read = client.responses, "input", _from_response
    kwargs[key] = list(history)
    if mode == "create":
        return read(resource.create(**kwargs))
    if mode == "parse":
        return read(resource.parse(**kwargs))
    if mode == "raw":
        raw = resource.with_raw_response.create(**kwargs)
        assert raw.headers.get("x-request-id", "").startswith("req_fake_")
        return read(raw.parse())
    if mode == "stream":
        acc = _ChunkText()
        for item in resource.create(stream=True, **kwargs):
            getattr(acc, api)(item)
        return acc.result()
    if mode == "helper":
        with resource.stream(**kwargs) as stream:
            for _ in stream:
                pass
            return read(stream.get_final_completion() if api == "chat" else stream.get_final_response())
    raise AssertionError(mode)


async def call_async(api: str, mode: str, client: Any, history: list[Any], **extra: Any) -> tuple[str, list[tuple[str, str, str]]]:
    kwargs = _kwargs(api, mode, extra)
    if api == "chat":
        resource, key, read = client.chat.completions, "messages", _from_completion
    else:
        resource, key, read = client.responses, "input", _from_response
    kwargs[key] = list(history)
    if mode == "create":
        return read(await resource.create(**kwargs))
    if mode == "parse":
        return read(await resource.parse(**kwargs))
    if mode == "raw":
        raw = await resource.with_raw_response.create(**kwargs)
        assert raw.headers.get("x-request-id", "").startswith("req_fake_")
        return read(raw.parse())  # a legacy raw response parses synchronously, async client or not
    if mode == "stream":
        acc = _ChunkText()
        async for item in await resource.create(stream=True, **kwargs):
            getattr(acc, api)(item)
        return acc.result()
    if mode == "helper":
        async with resource.stream(**kwargs) as stream:
            async for _ in stream:
                pass
            return read(await (stream.get_final_completion() if api == "chat" else stream.get_final_response()))
    raise AssertionError(mode)


def _extend(api: str, history: list[Any], text: str, calls: list[tuple[str, str, str]], results: list[Any]) -> None:
    if api == "chat":
        history.append({"role": "assistant", "content": text or None,
                        "tool_calls": [{"id": i, "type": "function", "function": {"name": n, "arguments": args}} for i, n, args in calls]})
        history += [{"role": "tool", "tool_call_id": i, "content": json.dumps(res)} for (i, _, _), res in zip(calls, results)]
    else:
        if text:
            history.append({"role": "assistant", "content": text})
        history += [{"type": "function_call", "call_id": i, "name": n, "arguments": args} for i, n, args in calls]
        history += [{"type": "function_call_output", "call_id": i, "output": json.dumps(res)} for (i, _, _), res in zip(calls, results)]


def weather_tool(city: str) -> dict[str, Any]:
    time.sleep(0.03)
    return {"city": city, "temp_c": 21}


def loop_sync(api: str, mode: str, client: Any, prompt: str = PROMPT, tool: Any = weather_tool, **extra: Any) -> str:
    history: list[Any] = [{"role": "user", "content": prompt}]
    for _ in range(5):
        text, calls = call_sync(api, mode, client, history, **extra)
        if not calls:
            return text
        _extend(api, history, text, calls, [tool(**json.loads(args)) for _, _, args in calls])
    raise AssertionError("the loop did not end")


async def loop_async(api: str, mode: str, client: Any, prompt: str = PROMPT, tool: Any = None, pause: float = 0.03, **extra: Any) -> str:
    history: list[Any] = [{"role": "user", "content": prompt}]
    for _ in range(5):
        text, calls = await call_async(api, mode, client, history, **extra)
        if not calls:
            return text
        await asyncio.sleep(pause)
        _extend(api, history, text, calls, [(tool or _weather)(**json.loads(args)) for _, _, args in calls])
    raise AssertionError("the loop did not end")


def _weather(city: str) -> dict[str, Any]:
    return {"city": city, "temp_c": 21}


# -- reading what was recorded ------------------------------------------------------------------


SUMMARY_FIELDS = {
    "response_content", "segments", "tool_calls_count", "round_count", "usage", "thinking", "loop_end_reason",
    "streaming", "declared_tools", "model", "provider", "error", "channel_id", "parent_correlation_id",
}


def summary(turn: Any) -> dict[str, Any]:
    return turn.model_dump(include=SUMMARY_FIELDS)


def hand_recording(api: str, session_id: str, *, streaming: bool, call_id: str = "call_w1") -> loopscope.Turn:
    """The same two-round script through the hand API, as the adapter should record it."""

    @loopscope.tool("weather")
    def weather(city: str) -> dict[str, Any]:
        return {"city": city, "temp_c": 21}

    first = {"input_tokens": 100, "output_tokens": 20, "cache_read_input_tokens": 30, "cache_creation_input_tokens": 0, "reasoning_tokens": 5}
    second = {"input_tokens": 150, "output_tokens": 10, "cache_read_input_tokens": 60, "cache_creation_input_tokens": 0, "reasoning_tokens": 0}
    with loopscope.turn(session_id=session_id, tools=TOOLS[api], input=PROMPT, model=MODEL, provider="openai") as t:
        with t.round(MODEL, provider="openai", stream=streaming) as rnd:
            rnd.response(FIRST_TEXT, [ModelToolCall(id=call_id, name="weather", arguments={"city": "Paris"})], first, "tool_calls", model=MODEL)
        weather("Paris")
        with t.round(MODEL, provider="openai", stream=streaming) as rnd:
            rnd.response(FINAL_TEXT, None, second, "stop", model=MODEL)
    return t


def check_two_round_turn(recording: Any, api: str, mode: str, server: Any) -> Any:
    store = recording.store
    turn = only_turn(store)
    assert turn.loop_end_reason == LoopEndReason.COMPLETED
    assert (turn.round_count, turn.tool_calls_count) == (1, 1)
    assert turn.segments == [FIRST_TEXT, FINAL_TEXT]
    assert turn.usage == TURN_USAGE
    assert [t.name for t in turn.declared_tools] == ["weather"]
    assert turn.declared_tools[0].parameters == WEATHER_PARAMS and turn.declared_tools[0].description == "Weather for a city"
    assert (turn.model, turn.provider, turn.streaming) == (MODEL, "openai", mode in ("stream", "helper"))
    events = store.get_timeline(turn.session_id)
    assert [e.type for e in events] == ["message", "message", "tool_call_start", "tool_call_end", "message"]
    assert {e.correlation_id for e in events} == {turn.correlation_id}
    start, end = events[2].content, events[3].content
    assert (start.status, start.result, start.arguments) == ("pending", None, {"city": "Paris"})
    assert (end.status, end.outcome, end.result) == ("completed", "served", WEATHER_RESULT)
    assert end.duration_ms >= 25  # from the response that asked to the request that answered

    hand = hand_recording(api, "hand", streaming=mode in ("stream", "helper"))
    assert rows(store, turn.session_id) == rows(store, "hand")
    assert summary(turn) == summary(hand.response) == summary(only_hand(store))

    chats = spans_of(recording, a.OP_CHAT)
    adapter_chats = [s for s in chats if s.attributes.get(a.CONVERSATION_ID) == turn.session_id]
    assert len(adapter_chats) == 2 and all(s.end_time for s in adapter_chats)
    first = adapter_chats[0].attributes
    assert first["server.address"] == "127.0.0.1" and first["server.port"] == server.port
    assert first[a.REQUEST_MODEL] == MODEL and first[a.RESPONSE_MODEL] == MODEL
    assert first[a.RESPONSE_FINISH_REASONS] == ("tool_calls",)
    assert first[a.REQUEST_STREAM] is (mode in ("stream", "helper"))
    tools = [s for s in spans_of(recording, a.OP_EXECUTE_TOOL) if s.attributes.get(a.CONVERSATION_ID) == turn.session_id]
    assert len(tools) == 1
    return turn


def only_hand(store: Any) -> Any:
    [turn] = store.list_turns("hand")
    return turn


# -- the two-round tool loop, every way of calling ----------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("api", APIS)
def test_sync_tool_loop_is_one_turn(api, mode, instrumented, server):
    two_rounds(server)
    client = server.openai_client(api_key=API_KEY)
    assert loop_sync(api, mode, client) == FINAL_TEXT
    check_two_round_turn(instrumented, api, mode, server)
    assert len(server.requests) == 2 and server.requests[1].tool_results[0]["id"] == "call_w1"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("api", APIS)
def test_async_tool_loop_is_one_turn(api, mode, instrumented, server):
    two_rounds(server)
    client = server.async_openai_client(api_key=API_KEY)
    assert asyncio.run(loop_async(api, mode, client)) == FINAL_TEXT
    check_two_round_turn(instrumented, api, mode, server)


@pytest.mark.parametrize("api", APIS)
def test_start_row_is_written_when_the_response_completes(api, instrumented, server):
    two_rounds(server)
    client = server.openai_client(api_key=API_KEY)
    seen = []

    def tool(city: str) -> dict[str, Any]:
        _, found = instrumented.store.sql("SELECT type, content->>'$.status' FROM events WHERE type LIKE 'tool_call%' ORDER BY idx")
        seen.extend(found)
        return _weather(city)

    loop_sync(api, "stream", client, tool=tool)
    assert seen == [("tool_call_start", "pending")]


# -- request and response details ---------------------------------------------------------------


def test_responses_request_parameters_and_input_forms(instrumented, server):
    server.queue(Reply(text="ok"), Reply(text="ok"))
    client = server.openai_client(api_key=API_KEY)
    client.responses.create(
        model=MODEL, input="Just a string", instructions="Be brief.", temperature=0.2, top_p=0.9,
        max_output_tokens=64, reasoning={"effort": "low"}, service_tier="default",
        tools=[*RESPONSES_TOOLS, {"type": "web_search"}],
    )
    client.responses.create(
        model=MODEL,
        input=[{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Parts "}, {"type": "input_text", "text": "of text"}]}],
    )
    first, second = instrumented.store.list_turns()
    assert next(e.content.body for e in instrumented.store.get_timeline(first.session_id)) == "Just a string"
    assert next(e.content.body for e in instrumented.store.get_timeline(second.session_id)) == "Parts of text"
    assert [t.name for t in first.declared_tools] == ["weather", "web_search"]
    chat = spans_of(instrumented, a.OP_CHAT)[0].attributes
    assert chat["gen_ai.request.temperature"] == 0.2 and chat["gen_ai.request.top_p"] == 0.9
    assert chat["gen_ai.request.max_tokens"] == 64 and chat["gen_ai.request.reasoning.level"] == "low"
    assert chat[a.RESPONSE_ID].startswith("resp_fake_")


def test_responses_reasoning_summary_is_thinking(instrumented, server):
    body = _response_body("resp_r1", [
        {"id": "rs_1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "Think first."}]},
        _message("Answer.", "msg_1"),
    ])
    body["usage"]["output_tokens_details"]["reasoning_tokens"] = 4
    server.queue(Reply(raw_body=body))
    client = server.openai_client(api_key=API_KEY)
    assert client.responses.create(model=MODEL, input="hi").output_text == "Answer."
    turn = only_turn(instrumented.store)
    assert (turn.thinking, turn.segments, turn.loop_end_reason) == ("Think first.", ["Answer."], LoopEndReason.COMPLETED)
    assert turn.usage == {"input_tokens": 5, "output_tokens": 9, "cache_read_input_tokens": 0, "reasoning_tokens": 4}


@pytest.mark.parametrize("api", APIS)
def test_one_shot_iterables_are_sent_in_full_and_recorded(api, instrumented, server):
    server.queue(Reply(text="ok"))
    client = server.openai_client(api_key=API_KEY)
    history = iter([{"role": "user", "content": "From a generator"}])
    if api == "chat":
        client.chat.completions.create(model=MODEL, messages=history, tools=iter(CHAT_TOOLS))
    else:
        client.responses.create(model=MODEL, input=history, tools=iter(RESPONSES_TOOLS))
    body = server.requests[0].body
    assert body["messages" if api == "chat" else "input"] == [{"role": "user", "content": "From a generator"}]
    assert [t.get("name") or t["function"]["name"] for t in body["tools"]] == ["weather"]
    turn = only_turn(instrumented.store)
    assert [t.name for t in turn.declared_tools] == ["weather"]
    assert instrumented.store.get_timeline(turn.session_id)[0].content.body == "From a generator"


def _response_body(response_id: str, output: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": response_id, "object": "response", "created_at": 1, "status": "completed", "model": MODEL, "error": None,
        "incomplete_details": None, "instructions": None, "metadata": {}, "parallel_tool_calls": True,
        "temperature": 1.0, "tool_choice": "auto", "tools": [], "top_p": 1.0, "output": output,
        "usage": {"input_tokens": 5, "output_tokens": 9, "total_tokens": 14,
                  "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}},
    }


def _message(text: str, item_id: str) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def test_responses_custom_tools_and_several_messages(instrumented, server):
    custom = {"type": "custom", "name": "run_sql", "description": "Run a SQL query"}
    server.queue(
        Reply(raw_body=_response_body("resp_c1", [
            _message("First.", "msg_1"), _message("Second.", "msg_2"),
            {"id": "ctc_1", "type": "custom_tool_call", "call_id": "call_sql", "name": "run_sql", "input": "SELECT 1"},
        ])),
        Reply(raw_body=_response_body("resp_c2", [_message("One row.", "msg_3")])),
    )
    client = server.openai_client(api_key=API_KEY)
    first = client.responses.create(model=MODEL, input="Count it", tools=[custom])
    assert first.output_text == "First.Second."
    client.responses.create(model=MODEL, input=[
        {"role": "user", "content": "Count it"},
        {"type": "custom_tool_call", "call_id": "call_sql", "name": "run_sql", "input": "SELECT 1"},
        {"type": "custom_tool_call_output", "call_id": "call_sql", "output": "1"},
    ], tools=[custom])
    turn = only_turn(instrumented.store)
    assert (turn.loop_end_reason, turn.tool_calls_count) == (LoopEndReason.COMPLETED, 1)
    assert turn.segments == ["First.\n\nSecond.", "One row."]
    assert [(t.name, t.description) for t in turn.declared_tools] == [("run_sql", "Run a SQL query")]
    [start, end] = [e.content for e in instrumented.store.get_timeline(turn.session_id) if e.type != "message"]
    assert (start.tool_name, start.arguments, end.result, end.outcome) == ("run_sql", "SELECT 1", "1", "served")


def _sse(*events: dict[str, Any]) -> Reply:
    frames = [{"sequence_number": n, **e} for n, e in enumerate(events)]
    body = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in frames)
    return Reply(raw_body=body, headers={"content-type": "text/event-stream"})


@pytest.mark.parametrize("stream", [False, True])
def test_responses_stream_and_json_read_alike(stream, instrumented, server):
    reasoning = {"id": "rs_1", "type": "reasoning", "summary": [{"type": "summary_text", "text": "Think first."}]}
    output = [reasoning, _message("First.", "msg_1"), _message("Second.", "msg_2")]
    final = _response_body("resp_s1", output)
    if stream:
        events: list[dict[str, Any]] = [{"type": "response.created", "response": {**final, "status": "in_progress", "output": [], "usage": None}}]
        for index, item in enumerate(output):
            events.append({"type": "response.output_item.added", "output_index": index, "item": {**item, "content": []} if index else item})
            if index:
                part = {"type": "output_text", "text": "", "annotations": []}
                events.append({"type": "response.content_part.added", "item_id": item["id"], "output_index": index, "content_index": 0, "part": part})
                for piece in (item["content"][0]["text"][:3], item["content"][0]["text"][3:]):
                    events.append({"type": "response.output_text.delta", "item_id": item["id"], "output_index": index,
                                   "content_index": 0, "delta": piece, "logprobs": []})
            events.append({"type": "response.output_item.done", "output_index": index, "item": item})
        events.append({"type": "response.completed", "response": final})
        server.queue(_sse(*events))
    else:
        server.queue(Reply(raw_body=final))
    client = server.openai_client(api_key=API_KEY)
    text, _ = call_sync("responses", "stream" if stream else "create", client, [{"role": "user", "content": "hi"}], tools=[])
    assert text == "First.Second."  # the SDK's output_text glues them
    turn = only_turn(instrumented.store)
    assert (turn.segments, turn.thinking, turn.streaming) == (["First.\n\nSecond."], "Think first.", stream)
    assert turn.usage == {"input_tokens": 5, "output_tokens": 9, "cache_read_input_tokens": 0, "reasoning_tokens": 0}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", APIS)
def test_length_limit_is_truncated(api, stream, instrumented, server):
    server.queue(Reply(text="The answer is cut", stop="length"))
    client = server.openai_client(api_key=API_KEY)
    mode = "stream" if stream else "create"
    text, _ = call_sync(api, mode, client, [{"role": "user", "content": "Tell me everything"}], tools=[])
    assert text == "The answer is cut"
    turn = only_turn(instrumented.store)
    assert turn.loop_end_reason == LoopEndReason.TRUNCATED and turn.segments == ["The answer is cut"]
    chat = spans_of(instrumented, a.OP_CHAT)[0].attributes
    assert chat[a.RESPONSE_FINISH_REASONS] == (("length",) if api == "chat" else ("max_output_tokens",))


@pytest.mark.parametrize("mode", ["create", "stream"])
@pytest.mark.parametrize("api", APIS)
def test_no_text_and_no_tool_calls_is_empty_response(api, mode, instrumented, server):
    server.queue(Reply(text=""))
    client = server.openai_client(api_key=API_KEY)
    assert call_sync(api, mode, client, [{"role": "user", "content": "Say nothing"}]) == ("", [])
    assert only_turn(instrumented.store).loop_end_reason == LoopEndReason.EMPTY_RESPONSE


# -- errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "error"), [(429, openai.RateLimitError), (500, openai.InternalServerError)])
@pytest.mark.parametrize("mode", ["create", "stream", "helper", "parse", "raw"])
@pytest.mark.parametrize("api", APIS)
def test_sdk_errors_reach_the_user_and_end_the_turn(api, mode, status, error, instrumented, server):
    server.queue(Reply.error(status))
    client = server.openai_client(api_key=API_KEY)
    with pytest.raises(error) as raised:
        call_sync(api, mode, client, [{"role": "user", "content": "hi"}])
    assert raised.value.status_code == status
    turn = only_turn(instrumented.store)
    assert turn.loop_end_reason == LoopEndReason.ERROR and turn.error.startswith(type(raised.value).__qualname__)
    [chat] = spans_of(instrumented, a.OP_CHAT)
    assert chat.attributes[a.ERROR_TYPE] == type(raised.value).__qualname__


@pytest.mark.parametrize("is_async", [False, True])
@pytest.mark.parametrize("api", APIS)
def test_user_exceptions_are_the_same_objects(api, is_async, instrumented, server):
    boom = LookupError("the transport broke")
    client = server.async_openai_client(api_key=API_KEY) if is_async else server.openai_client(api_key=API_KEY)
    resource = client.chat.completions if api == "chat" else client.responses

    def post(*args: Any, **kwargs: Any) -> Any:
        raise boom

    async def apost(*args: Any, **kwargs: Any) -> Any:
        raise boom

    resource._post = apost if is_async else post  # the resource's bound client.post, replaced for this client only
    history = [{"role": "user", "content": "hi"}]
    with pytest.raises(LookupError) as raised:
        if is_async:
            asyncio.run(call_async(api, "create", client, history))
        else:
            call_sync(api, "create", client, history)
    assert raised.value is boom
    assert only_turn(instrumented.store).error == "LookupError: the transport broke"


@pytest.mark.parametrize("mode", ["create", "stream"])
@pytest.mark.parametrize("api", APIS)
def test_task_cancellation_is_cancelled(api, mode, instrumented, server):
    server.queue(Reply(text="too slow", delay=10) if mode == "create" else Reply(text=LONG, chunk_delay=0.1))

    async def consume(client: Any, seen: asyncio.Event) -> None:
        async for item in await _astream(api, client):
            if _text_seen(api, item):
                seen.set()

    async def main() -> None:
        client = server.async_openai_client(api_key=API_KEY)
        seen = asyncio.Event()
        if mode == "create":
            task = asyncio.create_task(call_async(api, mode, client, [{"role": "user", "content": "hi"}]))
            await asyncio.to_thread(server.wait_for_requests, 1)
            await asyncio.sleep(0.05)
        else:
            task = asyncio.create_task(consume(client, seen))
            await seen.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    turn = check_cut_off(instrumented)
    assert turn.error is None
    if mode == "stream":
        assert turn.segments and LONG.startswith(turn.segments[0])


# -- unanswered calls ----------------------------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
def test_unanswered_calls_are_unserved_at_shutdown(api, instrumented, server):
    server.queue(Reply(tool_calls=[ToolCall("weather", {"city": "Oslo"}, id="call_u1")]))
    client = server.openai_client(api_key=API_KEY)
    _, calls = call_sync(api, "create", client, [{"role": "user", "content": "Weather in Oslo?"}])
    assert calls and instrumented.store.list_turns() == []  # still waiting for the result
    loopscope.shutdown()
    store = loopscope.Store(str(instrumented.db))
    turn = only_turn(store)
    assert turn.loop_end_reason == LoopEndReason.UNFINISHED and turn.tool_calls_count == 0
    end = [e.content for e in store.get_timeline(turn.session_id) if e.type == "tool_call_end"]
    assert [(c.tool_id, c.outcome) for c in end] == [("call_u1", "unserved")]


@pytest.mark.parametrize("api", APIS)
def test_unanswered_calls_end_after_the_idle_timeout(api, instrumented, server):
    server.queue(Reply(tool_calls=[ToolCall("weather", {"city": "Rome"}, id="call_i1")]))
    client = server.openai_client(api_key=API_KEY)
    stitch.set_idle_timeout(0.2)
    try:
        call_sync(api, "stream", client, [{"role": "user", "content": "Weather in Rome?"}])
        deadline = time.monotonic() + 5
        while not instrumented.store.list_turns() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stitch.set_idle_timeout(stitch.DEFAULT_IDLE_TIMEOUT)
    turn = only_turn(instrumented.store)
    assert turn.loop_end_reason == LoopEndReason.UNFINISHED
    outcomes = [e.content.outcome for e in instrumented.store.get_timeline(turn.session_id) if e.type == "tool_call_end"]
    assert outcomes == ["unserved"]


# -- streams that end early ---------------------------------------------------------------------


def _stream(api: str, client: Any, **kwargs: Any) -> Any:
    if api == "chat":
        return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True, **kwargs)
    return client.responses.create(model=MODEL, input="hi", stream=True, **kwargs)


def _astream(api: str, client: Any, **kwargs: Any) -> Any:
    if api == "chat":
        return client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True, **kwargs)
    return client.responses.create(model=MODEL, input="hi", stream=True, **kwargs)


def _helper(api: str, client: Any) -> Any:
    if api == "chat":
        return client.chat.completions.stream(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    return client.responses.stream(model=MODEL, input="hi")


def _text_seen(api: str, item: Any) -> bool:
    if api == "chat":
        return bool(getattr(item, "choices", None) and item.choices[0].delta.content) or getattr(item, "type", "") == "content.delta"
    return item.type == "response.output_text.delta"


LONG = "one two three four five six seven eight nine ten"


def check_cut_off(recording: Any, reason: LoopEndReason = LoopEndReason.CANCELLED) -> Any:
    turn = only_turn(recording.store)
    assert turn.loop_end_reason == reason
    spans = recording.spans()
    assert [s.attributes[a.OPERATION] for s in spans].count(a.OP_CHAT) == 1
    assert [s.attributes[a.OPERATION] for s in spans].count(a.OP_INVOKE_AGENT) == 1
    return turn


@pytest.mark.parametrize("api", APIS)
def test_early_close_is_cancelled(api, instrumented, server):
    server.queue(Reply(text=LONG))
    stream = _stream(api, server.openai_client(api_key=API_KEY))
    for item in stream:
        if _text_seen(api, item):
            break
    stream.close()
    turn = check_cut_off(instrumented)
    assert turn.segments == ["one "]


@pytest.mark.parametrize("helper", [False, True])
@pytest.mark.parametrize("api", APIS)
def test_break_in_with_is_cancelled(api, helper, instrumented, server):
    server.queue(Reply(text=LONG))
    client = server.openai_client(api_key=API_KEY)
    with (_helper(api, client) if helper else _stream(api, client)) as stream:
        for item in stream:
            if _text_seen(api, item):
                break
    assert stream is not None  # still referenced: the block's end, not garbage collection, ended it
    check_cut_off(instrumented)


@pytest.mark.parametrize("helper", [False, True])
@pytest.mark.parametrize("api", APIS)
def test_async_break_in_with_is_cancelled(api, helper, instrumented, server):
    server.queue(Reply(text=LONG))

    async def main() -> Any:
        client = server.async_openai_client(api_key=API_KEY)
        if helper:
            manager = (client.chat.completions.stream(model=MODEL, messages=[{"role": "user", "content": "hi"}]) if api == "chat"
                       else client.responses.stream(model=MODEL, input="hi"))
        else:
            manager = await (client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=True)
                             if api == "chat" else client.responses.create(model=MODEL, input="hi", stream=True))
        async with manager as stream:
            async for item in stream:
                if _text_seen(api, item):
                    break
        return stream

    kept = asyncio.run(main())
    assert kept is not None
    check_cut_off(instrumented)


@pytest.mark.parametrize("api", APIS)
def test_garbage_collected_stream_is_cancelled(api, instrumented, server):
    server.queue(Reply(text=LONG))
    stream = _stream(api, server.openai_client(api_key=API_KEY))
    next(iter(stream))
    del stream
    gc.collect()
    check_cut_off(instrumented)


@pytest.mark.parametrize("api", APIS)
def test_unread_stream_collected_is_cancelled(api, instrumented, server):
    server.queue(Reply(text=LONG))
    _stream(api, server.openai_client(api_key=API_KEY))
    gc.collect()
    assert check_cut_off(instrumented).segments == []


@pytest.mark.parametrize("api", APIS)
def test_stream_read_to_the_end_then_closed_is_completed(api, instrumented, server):
    server.queue(Reply(text=LONG))
    with _stream(api, server.openai_client(api_key=API_KEY)) as stream:
        for _ in stream:
            pass
    assert check_cut_off(instrumented, LoopEndReason.COMPLETED).segments == [LONG]


@pytest.mark.parametrize("api", APIS)
def test_mid_stream_error_event_is_an_error(api, instrumented, server):
    server.queue(Reply.stream_failure(after=4, message="overloaded mid-way"))
    client = server.openai_client(api_key=API_KEY)
    if api == "chat":
        with pytest.raises(openai.APIError, match="overloaded mid-way"):
            for _ in _stream(api, client):
                pass
    else:  # the Responses API reports it as an event; the SDK does not raise
        events = [e.type for e in _stream(api, client)]
        assert events[-1] == "error"
    turn = check_cut_off(instrumented, LoopEndReason.ERROR)
    assert "overloaded mid-way" in turn.error
    [chat] = spans_of(instrumented, a.OP_CHAT)
    assert chat.attributes[a.ERROR_TYPE] == ("APIError" if api == "chat" else "ResponseError")


@pytest.mark.parametrize("api", APIS)
def test_dropped_connection_mid_stream_is_an_error(api, instrumented, server):
    server.queue(Reply.stream_failure(after=4, mode="abort"))
    with pytest.raises(openai.APIError) as raised:
        for _ in _stream(api, server.openai_client(api_key=API_KEY)):
            pass
    turn = check_cut_off(instrumented, LoopEndReason.ERROR)
    assert turn.error.startswith(type(raised.value).__qualname__)


def test_responses_failed_event_is_an_error(instrumented, server):
    failed = {"type": "response.failed", "response": {
        "id": "resp_f", "object": "response", "created_at": 1, "status": "failed", "model": MODEL, "output": [],
        "error": {"code": "server_error", "message": "the model fell over"}, "incomplete_details": None,
        "instructions": None, "metadata": {}, "parallel_tool_calls": True, "temperature": 1.0, "tool_choice": "auto",
        "tools": [], "top_p": 1.0}}
    created = {"type": "response.created", "response": {**failed["response"], "status": "in_progress", "error": None}}
    server.queue(_sse(created, failed))
    client = server.openai_client(api_key=API_KEY)
    stream = client.responses.create(model=MODEL, input="hi", stream=True)
    assert [e.type for e in stream] == ["response.created", "response.failed"]
    turn = only_turn(instrumented.store)
    assert turn.loop_end_reason == LoopEndReason.ERROR and turn.error == "ResponseError: server_error: the model fell over"


# -- raw responses -------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("api", APIS)
def test_with_raw_response_is_recorded(api, stream, instrumented, server):
    server.queue(Reply(text="raw answer"))
    client = server.openai_client(api_key=API_KEY)
    if api == "chat":
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], stream=stream)
    else:
        raw = client.responses.with_raw_response.create(model=MODEL, input="hi", stream=stream)
    assert raw.http_response.status_code == 200 and raw.headers["x-request-id"].startswith("req_fake_")
    parsed = raw.parse()
    assert raw.parse() is parsed
    if stream:
        for _ in parsed:
            pass
    turn = only_turn(instrumented.store)
    assert (turn.segments, turn.loop_end_reason, turn.streaming) == (["raw answer"], LoopEndReason.COMPLETED, stream)


@pytest.mark.parametrize("is_async", [False, True])
@pytest.mark.parametrize("api", APIS)
def test_raw_stream_parsed_in_one_expression_is_read_to_its_end(api, is_async, instrumented, server):
    """The raw response is dropped as soon as it is parsed: the stream it became owns the round."""
    server.queue(Reply(text=LONG))
    kwargs = {"model": MODEL, "stream": True, **({"messages": [{"role": "user", "content": "hi"}]} if api == "chat" else {"input": "hi"})}
    if is_async:

        async def main() -> None:
            client = server.async_openai_client(api_key=API_KEY)
            resource = client.chat.completions if api == "chat" else client.responses
            stream = (await resource.with_raw_response.create(**kwargs)).parse()
            gc.collect()
            async for _ in stream:
                pass

        asyncio.run(main())
    else:
        client = server.openai_client(api_key=API_KEY)
        resource = client.chat.completions if api == "chat" else client.responses
        stream = resource.with_raw_response.create(**kwargs).parse()
        gc.collect()
        for _ in stream:
            pass
    assert check_cut_off(instrumented, LoopEndReason.COMPLETED).segments == [LONG]


@pytest.mark.parametrize("api", APIS)
def test_with_streaming_response_is_recorded_when_parsed(api, instrumented, server):
    server.queue(Reply(text="streamed body"))
    client = server.openai_client(api_key=API_KEY)
    if api == "chat":
        manager = client.chat.completions.with_streaming_response.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    else:
        manager = client.responses.with_streaming_response.create(model=MODEL, input="hi")
    with manager as response:
        assert response.headers["x-request-id"].startswith("req_fake_")
        response.parse()
    assert check_cut_off(instrumented, LoopEndReason.COMPLETED).segments == ["streamed body"]


def test_responses_previous_response_id_and_sdk_items_in_input(instrumented, server):
    """Tool results sent with ``previous_response_id`` (no history), or next to the SDK's own
    output items, still end the calls of their turn."""
    two_rounds(server, call_id="call_p1")  # the global queue: a request with no user message matches no script
    two_rounds(server, match="Lyon", call_id="call_p2", city="Lyon")
    client = server.openai_client(api_key=API_KEY)
    first = client.responses.create(model=MODEL, input="Weather in Paris?", tools=RESPONSES_TOOLS)
    [call] = [i for i in first.output if i.type == "function_call"]
    client.responses.create(
        model=MODEL, previous_response_id=first.id, tools=RESPONSES_TOOLS,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": json.dumps(WEATHER_RESULT)}],
    )
    history: list[Any] = [{"role": "user", "content": "Weather in Lyon?"}]
    second = client.responses.create(model=MODEL, input=history, tools=RESPONSES_TOOLS)
    history += second.output  # the SDK's own items, as the docs show
    history += [{"type": "function_call_output", "call_id": i.call_id, "output": [{"type": "input_text", "text": '{"temp_c": 18}'}]}
                for i in second.output if i.type == "function_call"]
    client.responses.create(model=MODEL, input=history, tools=RESPONSES_TOOLS)
    turns = instrumented.store.list_turns()
    assert [(t.loop_end_reason, t.tool_calls_count, t.segments) for t in turns] == [(LoopEndReason.COMPLETED, 1, [FIRST_TEXT, FINAL_TEXT])] * 2
    results = [e.content.result for t in turns for e in instrumented.store.get_timeline(t.session_id) if e.type == "tool_call_end"]
    assert results == [WEATHER_RESULT, {"temp_c": 18}]


# -- many conversations at once -------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["create", "stream"])
@pytest.mark.parametrize("api", APIS)
def test_fifty_concurrent_conversations_stay_apart(api, mode, instrumented, server):
    n = 50
    server.chunk_delay = 0.001
    for i in range(n):
        two_rounds(server, match=f"[conv-{i}]", call_id=f"call_c{i}", city=f"City{i}")

    async def conversation(client: Any, i: int) -> str:
        await asyncio.sleep(random.random() * 0.05)
        with loopscope.session(f"conv-{i}"):
            return await loop_async(api, mode, client, prompt=f"[conv-{i}] weather?", pause=random.random() * 0.05)

    async def main() -> list[str]:
        client = server.async_openai_client(api_key=API_KEY)
        return await asyncio.gather(*(conversation(client, i) for i in range(n)))

    assert asyncio.run(main()) == [FINAL_TEXT] * n
    server.assert_all_served()
    store = instrumented.store
    turns = store.list_turns(limit=None)
    assert sorted(t.session_id for t in turns) == sorted(f"conv-{i}" for i in range(n))
    _, found = store.sql(
        "SELECT session_id, correlation_id, type, content->>'$.tool_id', content->>'$.status', content->'$.arguments'->>'city',"
        " content->'$.result'->>'city' FROM events WHERE type LIKE 'tool_call%' ORDER BY session_id, idx"
    )
    tool_rows: dict[str, list[tuple[Any, ...]]] = {}
    for session_id, *row in found:
        tool_rows.setdefault(session_id, []).append(tuple(row))
    for turn in turns:
        i = int(turn.session_id.split("-")[1])
        assert (turn.loop_end_reason, turn.round_count, turn.tool_calls_count) == (LoopEndReason.COMPLETED, 1, 1)
        assert turn.segments == [FIRST_TEXT, FINAL_TEXT] and turn.usage == TURN_USAGE
        assert tool_rows[turn.session_id] == [
            (turn.correlation_id, "tool_call_start", f"call_c{i}", "pending", f"City{i}", None),
            (turn.correlation_id, "tool_call_end", f"call_c{i}", "completed", f"City{i}", f"City{i}"),
        ]
    assert len(spans_of(instrumented, a.OP_EXECUTE_TOOL)) == n and len(spans_of(instrumented, a.OP_CHAT)) == 2 * n


# -- instrument / uninstrument ----------------------------------------------------------------------


def test_instrument_twice_is_once_and_uninstrument_restores(recording, server):
    originals = {(cls, name): cls.__dict__[name] for cls, name in PATCHED}
    loopscope.instrument(anthropic=False)
    loopscope.instrument(anthropic=False)
    try:
        assert all(cls.__dict__[name] is not originals[cls, name] for cls, name in PATCHED)
        client = server.openai_client(api_key=API_KEY)
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        client.responses.create(model=MODEL, input="hi")
        assert len(spans_of(recording, a.OP_CHAT)) == 2 and len(spans_of(recording, a.OP_INVOKE_AGENT)) == 2
    finally:
        loopscope.uninstrument()
    assert all(cls.__dict__[name] is originals[cls, name] for cls, name in PATCHED)
    client.responses.create(model=MODEL, input="hi")
    assert len(spans_of(recording, a.OP_CHAT)) == 2


# -- secrets, sessions, decorated tools -----------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
def test_api_keys_are_never_recorded(api, instrumented, server):
    two_rounds(server)
    client = server.openai_client(api_key=API_KEY, default_headers={"X-Custom-Auth": f"Bearer {API_KEY}"})
    loop_sync(api, "stream", client)
    assert server.requests[0].headers["authorization"] == f"Bearer {API_KEY}"  # it was sent
    for span in instrumented.spans():
        for key, value in span.attributes.items():
            assert "authorization" not in key.lower()
            assert API_KEY not in str(value) and "Bearer" not in str(value)
    for table in ("events", "turns", "sessions"):
        _, found = instrumented.store.sql(f"SELECT * FROM {table}")
        assert found and API_KEY not in repr(found) and "Bearer" not in repr(found)


@pytest.mark.parametrize("mode", ["create", "helper"])
@pytest.mark.parametrize("api", APIS)
def test_session_names_the_stitched_turn(api, mode, instrumented, server):
    two_rounds(server)
    with loopscope.session("conv-1"):
        loop_sync(api, mode, server.openai_client(api_key=API_KEY))
    turn = only_turn(instrumented.store)
    assert turn.session_id == "conv-1" and turn.tool_calls_count == 1
    assert len(instrumented.store.get_timeline("conv-1")) == 5


@pytest.mark.parametrize("mode", ["create", "stream", "helper"])
@pytest.mark.parametrize("api", APIS)
def test_decorated_tool_reports_the_call_once(api, mode, instrumented, server):
    @loopscope.tool
    def weather(city: str) -> dict[str, Any]:
        return {"city": city, "temp_c": 21}

    two_rounds(server)
    assert loop_sync(api, mode, server.openai_client(api_key=API_KEY), tool=weather) == FINAL_TEXT
    turn = only_turn(instrumented.store)
    assert (turn.tool_calls_count, turn.round_count, turn.loop_end_reason) == (1, 1, LoopEndReason.COMPLETED)
    tool_rows = [(e.type, e.content.tool_id, e.content.result) for e in instrumented.store.get_timeline(turn.session_id) if e.type != "message"]
    assert tool_rows == [("tool_call_start", "call_w1", None), ("tool_call_end", "call_w1", WEATHER_RESULT)]
    assert len(spans_of(instrumented, a.OP_EXECUTE_TOOL)) == 1


@pytest.mark.parametrize("api", APIS)
def test_decorated_async_tool_reports_the_call_once(api, instrumented, server):
    @loopscope.tool("weather")
    async def weather(city: str) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"city": city, "temp_c": 21}

    two_rounds(server)

    async def main() -> str:
        client = server.async_openai_client(api_key=API_KEY)
        history: list[Any] = [{"role": "user", "content": PROMPT}]
        text, calls = await call_async(api, "stream", client, history)
        results = [await weather(**json.loads(args)) for _, _, args in calls]
        _extend(api, history, text, calls, results)
        return (await call_async(api, "stream", client, history))[0]

    assert asyncio.run(main()) == FINAL_TEXT
    turn = only_turn(instrumented.store)
    assert (turn.tool_calls_count, turn.round_count) == (1, 1)
    assert [e.type for e in instrumented.store.get_timeline(turn.session_id)].count("tool_call_end") == 1


def test_pydantic_function_tools_are_declared(instrumented, server):
    from pydantic import BaseModel

    class Forecast(BaseModel):
        """Forecast for a city."""

        city: str

    server.queue(Reply(text="ok"), Reply(text="ok"))
    client = server.openai_client(api_key=API_KEY)
    client.chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": "hi"}], tools=[openai.pydantic_function_tool(Forecast)])
    client.responses.parse(model=MODEL, input="hi", tools=[openai.pydantic_function_tool(Forecast)])
    for turn in instrumented.store.list_turns():
        [tool] = turn.declared_tools
        assert tool.name == "Forecast" and tool.parameters["properties"]["city"]["type"] == "string"



@pytest.mark.parametrize("api", APIS)
def test_time_to_first_chunk_is_the_first_texts_arrival(api, instrumented, server):
    """The proxy reads chunks in batches; the time to first chunk is still when the first
    text reached the user, not when its batch was read (here at the stream's end)."""
    server.queue(Reply(text=LONG, chunk_delay=0.03))
    texts_seen: list[int] = []  # when the user's loop got each text, on the spans' clock
    for item in _stream(api, server.openai_client(api_key=API_KEY)):
        if _text_seen(api, item):
            texts_seen.append(time.time_ns())
    (chat,) = [s for s in instrumented.spans() if s.attributes[a.OPERATION] == a.OP_CHAT]
    first = chat.attributes["gen_ai.response.time_to_first_chunk"]
    assert len(texts_seen) == 10  # ten words, one frame each, 30 ms apart
    # the proxy saw the first text before the user did, and well before the last one (a time
    # taken when the batch was read would come at the stream's end): an order, not a timing
    assert 0 < first <= (texts_seen[0] - chat.start_time) / 1e9
    assert (chat.start_time + first * 1e9) < texts_seen[-1]

HELD_AT_EXIT = """
    import sys
    sys.path.insert(0, sys.argv[2])
    import loopscope
    from fakes.model_server import FakeModelServer, Reply

    loopscope.configure(sys.argv[1])
    loopscope.instrument()
    server = FakeModelServer().start()
    server.queue(Reply(text="one two three four " * 40))
    client = server.openai_client()
    HELD = client.chat.completions.create(
        model="gpt-4.1-mini", messages=[{"role": "user", "content": "hi"}], stream=True)
    for chunk in HELD:  # read to the first text, then leave the stream in a global until exit
        if chunk.choices and chunk.choices[0].delta.content:
            break
    print("exiting")
"""


def test_stream_held_until_exit_is_stored_cancelled(spawn, tmp_path):
    """A stream nobody closes or collects before exit still ends its round, and the turn
    with it, before the store's last flush: a cancelled turn with its round, not an
    unfinished turn without one."""
    db = tmp_path / "held.duckdb"
    child = spawn("held", HELD_AT_EXIT, db, Path(__file__).resolve().parents[1])
    assert child.finish_ok().strip() == "exiting"
    store = loopscope.Store(str(db))
    turn = only_turn(store)
    assert turn.loop_end_reason == LoopEndReason.CANCELLED
    assert turn.segments == ["one "]  # the round's text so far: the round ended, then the turn
