"""The anthropic adapter, driving the real SDK against the fake model server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import gc
import json
from functools import partial
from typing import Any

import anthropic
import pytest
from opentelemetry import trace
from opentelemetry.trace import StatusCode
from pydantic import BaseModel

import interleaved
import loopscope
from fakes.model_server import FakeModelServer, Reply, ToolCall, Usage
from fakes.weather_loop import queue_tool_round
from loopscope import LoopEndReason
from loopscope import semconv as a
from recorded import assert_hand_turn, assert_never_recorded, only_turn
from tool_totals_check import assert_totals_exact

API_KEY = "sk-ant-test-4f7c1d9e2b8a6350-secret"
MODEL = "claude-test-1"
WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
QUESTION = "What's the weather in Paris?"
MODES = ["json", "stream", "helper"]


# -- fixtures ---------------------------------------------------------------------------




def client(server: FakeModelServer, **kwargs: Any) -> anthropic.Anthropic:
    return server.anthropic_client(api_key=API_KEY, **kwargs)


def async_client(server: FakeModelServer, **kwargs: Any) -> anthropic.AsyncAnthropic:
    return server.async_anthropic_client(api_key=API_KEY, **kwargs)


tool_round_script = partial(queue_tool_round, call_id="toolu_w1", usage=Usage(100, 20, cached_tokens=30, cache_creation_tokens=5))


# -- driving the SDK in each of its ways -------------------------------------------------


def read_events(events: Any) -> tuple[list[dict[str, Any]], str | None]:
    """The assistant content and stop reason a stream of raw events makes (the test's own reading)."""
    blocks: dict[int, dict[str, Any]] = {}
    stop = None
    for event in events:
        if event.type == "content_block_start":
            blocks[event.index] = {**event.content_block.model_dump(exclude_none=True), "_json": ""}
        elif event.type == "content_block_delta" and event.delta.type == "text_delta":
            blocks[event.index]["text"] += event.delta.text
        elif event.type == "content_block_delta" and event.delta.type == "input_json_delta":
            blocks[event.index]["_json"] += event.delta.partial_json
        elif event.type == "message_delta":
            stop = event.delta.stop_reason
    content = []
    for _, block in sorted(blocks.items()):
        raw = block.pop("_json")
        if block["type"] == "tool_use":
            block["input"] = json.loads(raw or "{}")
        content.append(block)
    return content, stop


def dump(message: Any) -> tuple[list[dict[str, Any]], str | None]:
    return [b.model_dump(exclude_none=True, exclude={"parsed_output"}) for b in message.content], message.stop_reason


def messages_of(c: Any, api: str) -> Any:
    return c.messages if api == "stable" else c.beta.messages


def call(c: anthropic.Anthropic, mode: str, api: str = "stable", **kwargs: Any) -> tuple[list[dict[str, Any]], str | None]:
    resource = messages_of(c, api)
    kwargs = {"model": MODEL, "max_tokens": 256, **kwargs}
    if mode == "json":
        return dump(resource.create(**kwargs))
    if mode == "stream":
        return read_events(resource.create(stream=True, **kwargs))
    with resource.stream(**kwargs) as stream:
        return dump(stream.get_final_message())


async def acall(c: anthropic.AsyncAnthropic, mode: str, api: str = "stable", **kwargs: Any) -> tuple[list[dict[str, Any]], str | None]:
    resource = messages_of(c, api)
    kwargs = {"model": MODEL, "max_tokens": 256, **kwargs}
    if mode == "json":
        return dump(await resource.create(**kwargs))
    if mode == "stream":
        events = [event async for event in await resource.create(stream=True, **kwargs)]
        return read_events(events)
    async with resource.stream(**kwargs) as stream:
        return dump(await stream.get_final_message())


def follow_up(messages: list[Any], content: list[dict[str, Any]], result: str, is_error: bool = False) -> list[Any]:
    [use] = [b for b in content if b["type"] == "tool_use"]
    block = {"type": "tool_result", "tool_use_id": use["id"], "content": [{"type": "text", "text": result}]}
    if is_error:
        block["is_error"] = True
    return [*messages, {"role": "assistant", "content": content}, {"role": "user", "content": [block]}]


def tool_loop(c: Any, mode: str, api: str = "stable", *, is_error: bool = False, between: Any = None) -> list[str | None]:
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    content, stop1 = call(c, mode, api, messages=messages, tools=[WEATHER])
    if between is not None:
        between(content)
    result = "weather service down" if is_error else "21 C and sunny"
    _content2, stop2 = call(c, mode, api, messages=follow_up(messages, content, result, is_error), tools=[WEATHER])
    return [stop1, stop2]


async def atool_loop(c: Any, mode: str, api: str = "stable", *, is_error: bool = False, between: Any = None) -> list[str | None]:
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    content, stop1 = await acall(c, mode, api, messages=messages, tools=[WEATHER])
    if between is not None:
        between(content)
    result = "weather service down" if is_error else "21 C and sunny"
    _content2, stop2 = await acall(c, mode, api, messages=follow_up(messages, content, result, is_error), tools=[WEATHER])
    return [stop1, stop2]


def run_loop(server: FakeModelServer, flavour: str, mode: str, api: str = "stable", **kwargs: Any) -> list[str | None]:
    if flavour == "sync":
        return tool_loop(client(server), mode, api, **kwargs)
    return asyncio.run(atool_loop(async_client(server), mode, api, **kwargs))


# -- the two-round tool loop ---------------------------------------------------------------


@pytest.mark.parametrize("api", ["stable", "beta"])
@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("mode", MODES)
def test_tool_loop_becomes_one_turn(instrumented, server, mode, flavour, api):
    recording = instrumented
    tool_round_script(server)
    seen_at_response: dict[str, Any] = {}

    def between(content: list[dict[str, Any]]) -> None:
        turn_id = recording.spans(a.OP_CHAT)[0].attributes[a.TURN_ID]
        assert not recording.spans(a.OP_INVOKE_AGENT)  # the turn is still open
        seen_at_response["events"] = recording.store.get_timeline("conv-1")
        seen_at_response["tools_ended"] = len(recording.spans(a.OP_EXECUTE_TOOL))
        seen_at_response["turn_id"] = turn_id

    with loopscope.session("conv-1"):
        stops = run_loop(server, flavour, mode, api, between=between)
    assert stops == ["tool_use", "end_turn"]

    # at response time the call is pending: its start row exists, its span is still open
    early = seen_at_response["events"]
    assert [(e.type, getattr(e.content, "status", None)) for e in early] == [
        ("message", None), ("message", None), ("tool_call_start", "pending"),
    ]
    assert seen_at_response["tools_ended"] == 0

    events = recording.store.get_timeline("conv-1")
    kinds = [(e.type, getattr(e.content, "tool_id", None) or getattr(e.content, "body", None)) for e in events]
    assert kinds == [
        ("message", QUESTION),
        ("message", "Let me check the weather."),
        ("tool_call_start", "toolu_w1"),
        ("tool_call_end", "toolu_w1"),
        ("message", "It is 21 °C and sunny in Paris."),
    ]
    assert events[0].content.role == "user" and events[1].content.role == "assistant"
    end = events[3].content
    assert (end.tool_name, end.arguments, end.result, end.status, end.outcome) == (
        "get_weather", {"city": "Paris"}, "21 C and sunny", "completed", "served",
    )
    turn = only_turn(recording)
    assert {e.correlation_id for e in events} == {turn.correlation_id} == {seen_at_response["turn_id"]}
    assert turn.segments == ["Let me check the weather.", "It is 21 °C and sunny in Paris."]
    assert (turn.round_count, turn.tool_calls_count, turn.loop_end_reason) == (1, 1, LoopEndReason.COMPLETED)
    # normalized: Anthropic leaves the cached tokens out of input_tokens; the turn counts them in (100 + 30 + 5, + 150)
    assert turn.usage == {"input_tokens": 285, "output_tokens": 30, "cache_read_input_tokens": 30, "cache_creation_input_tokens": 5}
    assert [(d.name, d.description, d.parameters) for d in turn.declared_tools] == [
        ("get_weather", WEATHER["description"], WEATHER["input_schema"]),
    ]
    assert (turn.model, turn.provider, turn.streaming) == (MODEL, "anthropic", mode != "json")

    chats = recording.spans(a.OP_CHAT)
    [agent] = recording.spans(a.OP_INVOKE_AGENT)
    [tool] = recording.spans(a.OP_EXECUTE_TOOL)
    assert len(chats) == 2
    assert [c.attributes[a.RESPONSE_FINISH_REASONS] for c in chats] == [("tool_use",), ("end_turn",)]
    assert all(c.parent.span_id == agent.context.span_id for c in chats + [tool])
    assert all(c.attributes[a.RESPONSE_ID].startswith("msg_fake_") for c in chats)
    assert all(c.attributes[a.REQUEST_STREAM] is (mode != "json") for c in chats)


@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("mode", MODES)
def test_tool_result_marked_as_error_ends_the_call_failed(instrumented, server, mode, flavour):
    tool_round_script(server)
    with loopscope.session("conv-err"):
        run_loop(server, flavour, mode, is_error=True)
    [end] = [e.content for e in instrumented.store.get_timeline("conv-err") if e.type == "tool_call_end"]
    assert (end.status, end.outcome, end.result, end.error) == ("failed", "failed", "weather service down", "weather service down")
    turn = only_turn(instrumented)
    assert (turn.round_count, turn.tool_calls_count, turn.loop_end_reason) == (1, 1, LoopEndReason.COMPLETED)


# -- the request --------------------------------------------------------------------------


def test_request_parameters_and_the_last_user_text(instrumented, server):
    c = client(server)
    messages = [
        {"role": "user", "content": "An old question"},
        {"role": "assistant", "content": "An old answer"},
        {"role": "user", "content": [{"type": "text", "text": "The new "}, {"type": "text", "text": "question"}]},
        # results of calls nobody knows: they are not the user speaking, and not this turn's calls
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_old", "name": "get_weather", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_old", "content": "stale"}]},
    ]
    c.messages.create(
        model=MODEL, max_tokens=300, messages=messages, tools=[WEATHER],
        stop_sequences=["END", "STOP"], extra_body={"temperature": 0.2, "top_p": 0.9, "top_k": 40},
    )
    assert server.requests[0].body["temperature"] == 0.2
    turn = only_turn(instrumented)
    [first] = [e for e in instrumented.store.get_timeline(turn.session_id)][:1]
    assert (first.content.role, first.content.body) == ("user", "The new question")
    [chat] = instrumented.spans(a.OP_CHAT)
    attrs = chat.attributes
    assert attrs["gen_ai.request.temperature"] == 0.2 and attrs["gen_ai.request.top_p"] == 0.9
    assert attrs["gen_ai.request.top_k"] == 40 and attrs["gen_ai.request.max_tokens"] == 300
    assert attrs["gen_ai.request.stop_sequences"] == ("END", "STOP")
    assert (attrs["server.address"], attrs["server.port"]) == ("127.0.0.1", server.port)
    assert (attrs[a.REQUEST_MODEL], attrs[a.PROVIDER], attrs[a.RESPONSE_MODEL]) == (MODEL, "anthropic", MODEL)
    assert json.loads(attrs[a.TOOL_DEFINITIONS])[0]["name"] == "get_weather"


def test_a_one_shot_iterable_of_messages_is_left_to_the_sdk(instrumented, server):
    c = client(server)
    message = c.messages.create(model=MODEL, max_tokens=50, messages=iter([{"role": "user", "content": "Hi there"}]))
    assert server.requests[0].first_user_text == "Hi there"
    assert message.content[0].text
    assert only_turn(instrumented).loop_end_reason == LoopEndReason.COMPLETED


# -- the response -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_max_tokens_ends_the_turn_truncated(instrumented, server, mode):
    server.queue(Reply(text="This answer is cut off in the mid", stop="max_tokens"))
    _content, stop = call(client(server), mode, messages=[{"role": "user", "content": "Tell me everything"}])
    assert stop == "max_tokens"
    turn = only_turn(instrumented)
    assert turn.loop_end_reason == LoopEndReason.TRUNCATED
    assert turn.segments == ["This answer is cut off in the mid"]
    [chat] = instrumented.spans(a.OP_CHAT)
    assert chat.attributes[a.RESPONSE_FINISH_REASONS] == ("max_tokens",)


def _thinking_message(stop: str = "end_turn") -> dict[str, Any]:
    return {
        "id": "msg_think_1", "type": "message", "role": "assistant", "model": MODEL,
        "content": [
            {"type": "thinking", "thinking": "The user wants a greeting.", "signature": "sig"},
            {"type": "text", "text": "Hello!"},
        ],
        "stop_reason": stop, "stop_sequence": None,
        "usage": {"input_tokens": 10, "output_tokens": 8, "output_tokens_details": {"thinking_tokens": 5}},
    }


def _sse(*events: dict[str, Any]) -> str:
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)


def test_thinking_blocks_are_the_turns_thinking(instrumented, server):
    server.queue(Reply(raw_body=_thinking_message()))
    message = client(server).messages.create(model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "Hi"}])
    assert [b.type for b in message.content] == ["thinking", "text"]
    turn = only_turn(instrumented)
    assert (turn.thinking, turn.segments, turn.loop_end_reason) == ("The user wants a greeting.", ["Hello!"], LoopEndReason.COMPLETED)
    assert turn.usage == {"input_tokens": 10, "output_tokens": 8, "reasoning_tokens": 5}


def test_streamed_thinking_is_the_turns_thinking(instrumented, server):
    start = {**_thinking_message(), "content": [], "stop_reason": None, "usage": {"input_tokens": 10, "output_tokens": 1}}
    body = _sse(
        {"type": "message_start", "message": start},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "The user wants "}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "a greeting."}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "sig"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Hello!"}},
        {"type": "content_block_stop", "index": 1},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": {"output_tokens": 8}},
        {"type": "message_stop"},
    )
    server.queue(Reply(raw_body=body))
    with client(server).messages.stream(model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "Hi"}]) as stream:
        assert "".join(stream.text_stream) == "Hello!"
    turn = only_turn(instrumented)
    assert (turn.thinking, turn.segments, turn.loop_end_reason) == ("The user wants a greeting.", ["Hello!"], LoopEndReason.COMPLETED)
    assert turn.usage == {"input_tokens": 10, "output_tokens": 8}


class Weather(BaseModel):
    city: str
    temp_c: int


def test_parse_is_recorded_sync_and_async(instrumented, server):
    answer = '{"city": "Paris", "temp_c": 21}'
    server.queue(Reply(text=answer), Reply(text=answer))
    ask = {"model": MODEL, "max_tokens": 50, "messages": [{"role": "user", "content": "Paris weather as JSON"}], "output_format": Weather}
    parsed = client(server).messages.parse(**ask)
    assert parsed.parsed_output == Weather(city="Paris", temp_c=21)
    aparsed = asyncio.run(async_client(server).messages.parse(**ask))
    assert aparsed.parsed_output == Weather(city="Paris", temp_c=21)
    turns = instrumented.store.list_turns(limit=None)
    assert [(t.segments, t.loop_end_reason) for t in turns] == [([answer], LoopEndReason.COMPLETED)] * 2


def test_raw_response_is_recorded_when_parsed(instrumented, server):
    server.queue(Reply(text="Raw hello."))
    raw = client(server).messages.with_raw_response.create(model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "Hi"}])
    assert raw.headers.get("request-id")
    assert raw.parse().content[0].text == "Raw hello."
    assert only_turn(instrumented).segments == ["Raw hello."]


def test_stream_read_up_to_message_stop_is_complete(instrumented, server):
    server.queue(Reply(text="All of it."))
    stream = client(server).messages.create(model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "Hi"}], stream=True)
    with stream:
        for event in stream:
            if event.type == "message_stop":
                break
    turn = only_turn(instrumented)
    assert (turn.loop_end_reason, turn.segments) == (LoopEndReason.COMPLETED, ["All of it."])
    [chat] = instrumented.spans(a.OP_CHAT)
    assert chat.status.status_code is not StatusCode.ERROR



def test_round_ends_at_message_stop_while_the_stream_is_still_open(instrumented, server):
    """The proxy hands chunks to the accumulator in batches, but the event that ends the
    round goes over at once: the turn is complete before the stream is closed."""
    server.queue(Reply(text="All of it."))
    stream = client(server).messages.create(model=MODEL, max_tokens=50, messages=[{"role": "user", "content": "Hi"}], stream=True)
    for event in stream:
        if event.type == "message_stop":
            break
    turn = only_turn(instrumented)  # the stream is neither read to its end nor closed yet
    assert (turn.loop_end_reason, turn.segments) == (LoopEndReason.COMPLETED, ["All of it."])
    stream.close()
    assert only_turn(instrumented).loop_end_reason == LoopEndReason.COMPLETED

# -- errors -------------------------------------------------------------------------------


def capture_errors(c: Any, monkeypatch: pytest.MonkeyPatch) -> list[BaseException]:
    """The exception objects the SDK makes from error responses, to compare with what the user sees."""
    made: list[BaseException] = []
    original = c._make_status_error

    def make(*args: Any, **kwargs: Any) -> BaseException:
        exc = original(*args, **kwargs)
        made.append(exc)
        return exc

    monkeypatch.setattr(c, "_make_status_error", make)
    return made


@pytest.mark.parametrize("status, error", [(429, anthropic.RateLimitError), (500, anthropic.InternalServerError)])
@pytest.mark.parametrize("mode", MODES)
def test_sdk_errors_pass_through_unchanged(instrumented, server, monkeypatch, mode, status, error):
    server.queue(Reply.error(status, "scripted failure"))
    c = client(server)
    made = capture_errors(c, monkeypatch)
    with pytest.raises(error) as caught:
        call(c, mode, messages=[{"role": "user", "content": "Hi"}])
    assert made == [caught.value] and caught.value is made[0]
    turn = only_turn(instrumented)
    assert turn.loop_end_reason == LoopEndReason.ERROR
    assert turn.error == f"{error.__name__}: {caught.value}"
    [chat] = instrumented.spans(a.OP_CHAT)
    assert chat.status.status_code is StatusCode.ERROR and chat.attributes[a.ERROR_TYPE] == error.__name__


def test_async_sdk_error_passes_through_unchanged(instrumented, server, monkeypatch):
    server.queue(Reply.error(429, "slow down"), Reply.error(500, "boom"))
    c = async_client(server)
    made = capture_errors(c, monkeypatch)
    seen: list[BaseException] = []

    async def main() -> None:
        for mode in ("json", "helper"):
            try:
                await acall(c, mode, messages=[{"role": "user", "content": "Hi"}])
            except anthropic.APIStatusError as exc:
                seen.append(exc)

    asyncio.run(main())
    assert [type(e) for e in seen] == [anthropic.RateLimitError, anthropic.InternalServerError]
    assert made == seen and all(m is e for m, e in zip(made, seen))
    turns = instrumented.store.list_turns(limit=None)
    assert [t.loop_end_reason for t in turns] == [LoopEndReason.ERROR] * 2


def test_error_in_a_later_round_ends_the_stitched_turn_with_error(instrumented, server):
    server.queue(Reply(tool_calls=[ToolCall("get_weather", {"city": "Oslo"}, id="toolu_e")]), Reply.error(500))
    c = client(server)
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    content, _ = call(c, "json", messages=messages, tools=[WEATHER])
    with pytest.raises(anthropic.InternalServerError):
        call(c, "json", messages=follow_up(messages, content, "cold"), tools=[WEATHER])
    turn = only_turn(instrumented)
    assert (turn.loop_end_reason, turn.round_count, turn.tool_calls_count) == (LoopEndReason.ERROR, 1, 1)
    assert len(instrumented.spans(a.OP_INVOKE_AGENT)) == 1


# -- streams that end early ----------------------------------------------------------------


def assert_one_cut_turn(recording, reason: LoopEndReason) -> Any:
    """One finished round and one turn, ended once, with ``reason``."""
    [chat] = recording.spans(a.OP_CHAT)
    [agent] = recording.spans(a.OP_INVOKE_AGENT)
    assert chat.end_time is not None and chat.parent.span_id == agent.context.span_id
    [turn] = recording.store.list_turns(limit=None)
    assert turn.loop_end_reason == reason
    assert agent.attributes[a.LOOP_END_REASON] == reason.value
    return chat


def long_reply(server: FakeModelServer, **kwargs: Any) -> None:
    server.queue(Reply(text="one two three four five six seven eight nine ten eleven twelve", **kwargs))


HI = [{"role": "user", "content": "Count to twelve"}]


def test_stream_closed_early(instrumented, server):
    long_reply(server)
    stream = client(server).messages.create(model=MODEL, max_tokens=50, messages=HI, stream=True)
    for _, event in zip(range(4), stream):
        pass
    stream.close()
    chat = assert_one_cut_turn(instrumented, LoopEndReason.CANCELLED)
    assert chat.status.status_code is StatusCode.ERROR and chat.attributes[a.ERROR_TYPE] == "StreamClosed"
    assert chat.attributes[a.ROUND_TEXT].startswith("one")


def test_break_inside_with(instrumented, server):
    long_reply(server)
    with client(server).messages.create(model=MODEL, max_tokens=50, messages=HI, stream=True) as stream:
        for event in stream:
            if event.type == "content_block_delta":
                break
    assert_one_cut_turn(instrumented, LoopEndReason.CANCELLED)


def test_break_inside_the_stream_helper(instrumented, server):
    long_reply(server)
    with client(server).messages.stream(model=MODEL, max_tokens=50, messages=HI) as stream:
        for text in stream.text_stream:
            break
    assert text.strip() == "one"
    assert_one_cut_turn(instrumented, LoopEndReason.CANCELLED)


@pytest.mark.parametrize("fail_mode, error", [("error", anthropic.APIStatusError), ("abort", Exception)])
@pytest.mark.parametrize("mode", ["stream", "helper"])
def test_mid_stream_error(instrumented, server, mode, fail_mode, error):
    server.queue(Reply.stream_failure(after=5, mode=fail_mode))
    with pytest.raises(error) as caught:
        call(client(server), mode, messages=HI)
    chat = assert_one_cut_turn(instrumented, LoopEndReason.ERROR)
    assert chat.status.status_code is StatusCode.ERROR
    assert chat.attributes[a.ERROR_TYPE] == type(caught.value).__qualname__
    assert only_turn(instrumented).error.startswith(type(caught.value).__qualname__)


def test_stream_dropped_unread_is_collected(instrumented, server):
    long_reply(server)
    stream = client(server).messages.create(model=MODEL, max_tokens=50, messages=HI, stream=True)
    del stream
    gc.collect()
    assert_one_cut_turn(instrumented, LoopEndReason.CANCELLED)


def test_helper_stream_dropped_unread_is_collected(instrumented, server):
    long_reply(server)
    manager = client(server).messages.stream(model=MODEL, max_tokens=50, messages=HI)
    stream = manager.__enter__()
    del stream, manager
    gc.collect()
    assert_one_cut_turn(instrumented, LoopEndReason.CANCELLED)


def test_helper_never_entered_makes_no_call(instrumented, server):
    client(server).messages.stream(model=MODEL, max_tokens=50, messages=HI)
    gc.collect()
    assert server.requests == [] and recording_is_empty(instrumented)


def recording_is_empty(recording) -> bool:
    return not recording.spans() and not recording.store.list_turns(limit=None)


def test_async_stream_closed_early_and_break_in_async_with(instrumented, server):
    long_reply(server)
    long_reply(server)
    c = async_client(server)

    async def main() -> None:
        stream = await c.messages.create(model=MODEL, max_tokens=50, messages=HI, stream=True)
        async for event in stream:
            if event.type == "content_block_delta":
                break
        await stream.close()
        async with c.messages.stream(model=MODEL, max_tokens=50, messages=HI) as helper:
            async for event in helper:
                if event.type == "text":
                    break

    asyncio.run(main())
    chats = instrumented.spans(a.OP_CHAT)
    agents = instrumented.spans(a.OP_INVOKE_AGENT)
    assert len(chats) == 2 and len(agents) == 2
    assert all(c.attributes[a.ERROR_TYPE] == "StreamClosed" for c in chats)
    turns = instrumented.store.list_turns(limit=None)
    assert [t.loop_end_reason for t in turns] == [LoopEndReason.CANCELLED] * 2


# -- concurrency --------------------------------------------------------------------------


def test_fifty_interleaved_async_conversations(instrumented, server):
    c = async_client(server)

    async def first_content(c: Any, mode: str, messages: list[Any]) -> Any:
        content, _ = await acall(c, mode, messages=messages, tools=[WEATHER])
        return content

    interleaved.run_async(instrumented, server, n=50, seed=7, queue=partial(tool_round_script, server), call_id="toolu_c{i:02d}",
                          client=lambda i: c, modes=MODES, call=first_content, follow_up=follow_up)


# -- a decorated tool between the rounds ------------------------------------------------------


@loopscope.tool
def get_weather(city: str) -> dict[str, Any]:
    return {"city": city, "temp_c": 21}


@loopscope.tool("get_weather")
async def aget_weather(city: str) -> dict[str, Any]:
    await asyncio.sleep(0)
    return {"city": city, "temp_c": 21}


def _decorated_follow_up(messages: list[Any], content: list[dict[str, Any]], result: Any) -> list[Any]:
    return follow_up(messages, content, json.dumps(result))


@pytest.mark.parametrize("mode", MODES)
def test_decorated_tool_serves_the_call_once(instrumented, server, mode):
    tool_round_script(server)
    c = client(server)
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    content, _ = call(c, mode, messages=messages, tools=[WEATHER])
    [use] = [b for b in content if b["type"] == "tool_use"]
    result = get_weather(**use["input"])
    call(c, mode, messages=_decorated_follow_up(messages, content, result), tools=[WEATHER])
    _assert_served_once(instrumented)


def test_async_decorated_tool_serves_the_call_once(instrumented, server):
    tool_round_script(server)
    c = async_client(server)

    async def main() -> None:
        messages: list[Any] = [{"role": "user", "content": QUESTION}]
        content, _ = await acall(c, "stream", messages=messages, tools=[WEATHER])
        [use] = [b for b in content if b["type"] == "tool_use"]
        result = await aget_weather(**use["input"])
        await acall(c, "stream", messages=_decorated_follow_up(messages, content, result), tools=[WEATHER])

    asyncio.run(main())
    _assert_served_once(instrumented)


def _assert_served_once(recording) -> None:
    [tool] = recording.spans(a.OP_EXECUTE_TOOL)
    assert tool.attributes[a.TOOL_CALL_ID] == "toolu_w1"
    turn = only_turn(recording)
    events = recording.store.get_timeline(turn.session_id)
    assert [e.type for e in events] == ["message", "message", "tool_call_start", "tool_call_end", "message"]
    end = events[3].content
    assert (end.tool_id, end.result, end.outcome) == ("toolu_w1", {"city": "Paris", "temp_c": 21}, "served")
    assert (turn.round_count, turn.tool_calls_count, turn.loop_end_reason) == (1, 1, LoopEndReason.COMPLETED)


@loopscope.tool("get_weather")
def station_weather(city: str) -> dict[str, Any]:
    """Returns what the station says: for Atlantis, no reading (the agent finds that out)."""
    return {"city": city, "temp_c": None if city == "Atlantis" else 21}


@loopscope.tool("get_weather")
def broken_weather(city: str) -> dict[str, Any]:
    raise ConnectionError(f"no station near {city}")


def _two_tool_rounds(server: FakeModelServer) -> None:
    server.queue(
        Reply(text="Checking Atlantis.", tool_calls=[ToolCall("get_weather", {"city": "Atlantis"}, id="toolu_a1")],
              usage=Usage(10, 5)),
        Reply(text="Then Paris.", tool_calls=[ToolCall("get_weather", {"city": "Paris"}, id="toolu_p1")], usage=Usage(20, 5)),
        Reply(text="Paris is at 21 °C; Atlantis has no station.", usage=Usage(30, 5)),
    )


def _run_checked(server: FakeModelServer, tool: Any) -> None:
    """An agent that runs its decorated tool, checks what it got, and sends a failure back as
    ``is_error: true``: a reading it cannot use, or the tool's exception, caught."""
    c = client(server)
    messages: list[Any] = [{"role": "user", "content": "Weather in Atlantis and Paris?"}]
    for _ in range(3):
        content, stop = call(c, "json", messages=messages, tools=[WEATHER])
        if stop != "tool_use":
            return
        [use] = [b for b in content if b["type"] == "tool_use"]
        try:
            reading = tool(**use["input"])
            if reading["temp_c"] is None:
                raise ValueError(f"the station in {reading['city']} sent no temperature")
            block = {"type": "tool_result", "tool_use_id": use["id"], "content": json.dumps(reading)}
        except (ValueError, ConnectionError) as exc:
            block = {"type": "tool_result", "tool_use_id": use["id"], "content": str(exc), "is_error": True}
        messages = [*messages, {"role": "assistant", "content": content}, {"role": "user", "content": [block]}]


@pytest.mark.parametrize("writer", ["process", pytest.param("thread", marks=pytest.mark.thread_writer)])
def test_a_served_call_whose_result_is_sent_back_as_an_error_is_failed(instrumented, server, writer):
    _two_tool_rounds(server)
    with loopscope.session("checked"):
        _run_checked(server, station_weather)
    error = "the station in Atlantis sent no temperature"
    store = instrumented.store
    _, found = store.sql("SELECT call_id, tool, status, outcome, error, result FROM tool_calls ORDER BY start_index")
    calls = [(*row[:5], json.loads(row[5])) for row in found]
    assert calls == [
        ("toolu_a1", "get_weather", "failed", "failed", error, {"city": "Atlantis", "temp_c": None}),
        ("toolu_p1", "get_weather", "completed", "served", None, {"city": "Paris", "temp_c": 21}),
    ]
    ends = [e.content for e in store.get_timeline("checked") if e.type == "tool_call_end"]
    assert [(e.tool_id, e.status, e.outcome, e.error) for e in ends] == [
        ("toolu_a1", "failed", "failed", error), ("toolu_p1", "completed", "served", None),
    ]
    # counted once, as failed, where `loopscope tools` reads its figures
    _, stats = store.sql("SELECT tool, calls, finished, served, failed FROM tool_stats")
    assert stats == [("get_weather", 2, 2, 1, 1)]
    assert_totals_exact(instrumented.db)  # the totals it reads are what the rows say
    # OTLP: each call's span as it ended (served), and one correction span under the turn
    # (the third request sends the error again: no second one)
    tools = instrumented.spans(a.OP_EXECUTE_TOOL)
    assert sorted((t.attributes[a.TOOL_CALL_ID], t.attributes[a.TOOL_OUTCOME]) for t in tools) == [
        ("toolu_a1", "served"), ("toolu_p1", "served"),
    ]
    [fix] = [s for s in instrumented.spans() if a.TOOL_CORRECTION in s.attributes]
    [agent] = instrumented.spans(a.OP_INVOKE_AGENT)
    assert fix.name == "tool_outcome_correction get_weather" and fix.parent.span_id == agent.context.span_id
    assert (fix.attributes[a.TOOL_CALL_ID], fix.attributes[a.TOOL_CORRECTION], fix.attributes[a.TOOL_ERROR]) == (
        "toolu_a1", "failed", error,
    )
    assert fix.status.status_code is StatusCode.ERROR
    [served] = [t for t in tools if t.attributes[a.TOOL_CALL_ID] == "toolu_a1"]
    assert fix.start_time == served.end_time < fix.end_time  # from the call's end to the request that said it failed
    turn = only_turn(instrumented)
    assert (turn.tool_calls_count, turn.loop_end_reason) == (2, LoopEndReason.COMPLETED)


def test_a_collector_sets_the_served_call_failed_too(tmp_path, server):
    from opentelemetry.sdk.trace import TracerProvider

    from loopscope.ingest.otlp.collector import Collector

    _two_tool_rounds(server)
    with Collector(str(tmp_path / "c.duckdb"), http_port=0, grpc_port=None, flush_interval=0.05) as collector:
        loopscope.configure(tmp_path / "local.duckdb", tracer_provider=TracerProvider(), otlp_endpoint=collector.http_endpoint,
                            capture_content=True, flush_interval=0.05)
        loopscope.instrument()
        try:
            with loopscope.session("checked"):
                _run_checked(server, station_weather)
        finally:
            loopscope.uninstrument()
            loopscope.shutdown()
    query = "SELECT call_id, status, outcome, error FROM tool_calls ORDER BY start_index"
    expected = [("toolu_a1", "failed", "failed", "the station in Atlantis sent no temperature"),
                ("toolu_p1", "completed", "served", None)]
    assert loopscope.Store(collector.db).sql(query)[1] == expected
    assert loopscope.Store(str(tmp_path / "local.duckdb")).sql(query)[1] == expected


def test_a_call_the_tool_failed_keeps_its_exception_when_sent_back_as_an_error(instrumented, server):
    _two_tool_rounds(server)
    with loopscope.session("broken"):
        _run_checked(server, broken_weather)
    _, calls = instrumented.store.sql("SELECT call_id, status, outcome, error FROM tool_calls ORDER BY start_index")
    assert calls == [
        ("toolu_a1", "failed", "failed", "ConnectionError: no station near Atlantis"),
        ("toolu_p1", "failed", "failed", "ConnectionError: no station near Paris"),
    ]
    assert not [s for s in instrumented.spans() if a.TOOL_CORRECTION in s.attributes]  # nothing to correct


# -- the SDK's own spans ----------------------------------------------------------------------


@pytest.fixture
def global_provider(recording, monkeypatch):
    """The recording's SDK TracerProvider as the global one, which the anthropic SDK traces to by default."""
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", recording.pipeline.tracer_provider)
    monkeypatch.delenv("ANTHROPIC_OPEN_TELEMETRY", raising=False)
    return recording.pipeline.tracer_provider


SDK_SETTINGS = {
    "default": {},
    "enabled": {"open_telemetry": {"traces": True}},
    "content": {"open_telemetry": {"traces": {"enabled": True, "content_mode": "content"}}},
    "provider": "provider",  # open_telemetry={"tracer_provider": <the global one>}
    "off": {"open_telemetry": False},
}


def sdk_options(setting: str, provider: Any) -> dict[str, Any]:
    value = SDK_SETTINGS[setting]
    return {"open_telemetry": {"tracer_provider": provider}} if value == "provider" else dict(value)


def test_without_loopscope_the_sdk_emits_its_own_chat_span(recording, global_provider, server):
    loopscope.uninstrument()
    server.queue(Reply(text="Hello."))
    client(server).messages.create(model=MODEL, max_tokens=20, messages=HI)
    [sdk] = recording.spans(a.OP_CHAT)
    assert sdk.instrumentation_scope.name == "com.anthropic.sdk.python"
    assert "traceparent" in server.requests[0].headers


@pytest.mark.parametrize("setting", list(SDK_SETTINGS))
@pytest.mark.parametrize("mode", MODES)
def test_one_chat_span_per_model_call_whatever_the_sdk_setting(global_provider, instrumented, server, mode, setting):
    tool_round_script(server)
    c = client(server, **sdk_options(setting, global_provider))
    tool_loop(c, mode)
    chats = instrumented.spans(a.OP_CHAT)
    assert len(chats) == len(server.requests) == 2
    assert {s.instrumentation_scope.name for s in instrumented.spans()} == {"loopscope"}
    turn = only_turn(instrumented)
    assert (turn.round_count, turn.loop_end_reason) == (1, LoopEndReason.COMPLETED)
    # the SDK's call span is our round: the trace context it sends is our chat span's
    for request, chat in zip(server.requests, chats):
        parent = request.headers.get("traceparent")
        if setting == "off":
            assert parent is None
        else:
            assert parent == f"00-{chat.context.trace_id:032x}-{chat.context.span_id:016x}-{chat.context.trace_flags:02x}"


def test_one_chat_span_per_async_call_with_sdk_tracing_on(global_provider, instrumented, server):
    tool_round_script(server)
    asyncio.run(atool_loop(async_client(server, open_telemetry={"traces": True}), "helper"))
    assert len(instrumented.spans(a.OP_CHAT)) == 2
    assert {s.instrumentation_scope.name for s in instrumented.spans()} == {"loopscope"}


def test_calls_loopscope_does_not_record_keep_the_sdks_span(global_provider, instrumented, server):
    client(server).messages.count_tokens(model=MODEL, messages=HI)
    [sdk] = instrumented.spans()
    assert sdk.name == "anthropic.messages.count_tokens"


def test_uninstrument_restores_every_original(recording, server):
    from anthropic import _base_client
    from anthropic.resources.messages import messages as stable

    before = (stable.Messages.__dict__["create"], stable.AsyncMessages.__dict__["stream"], _base_client.start_api_call_span)
    loopscope.instrument()
    assert stable.Messages.__dict__["create"] is not before[0]
    loopscope.instrument()  # idempotent
    loopscope.uninstrument()
    after = (stable.Messages.__dict__["create"], stable.AsyncMessages.__dict__["stream"], _base_client.start_api_call_span)
    assert after == before
    server.queue(Reply(text="Hello."))
    client(server).messages.create(model=MODEL, max_tokens=20, messages=HI)
    assert recording_is_empty(recording)


# -- secrets ----------------------------------------------------------------------------------


def test_api_keys_and_authorization_headers_are_never_recorded(global_provider, instrumented, server):
    bearer = "sk-ant-test-bearer-91c2e7d0aa"
    tool_round_script(server)
    tool_round_script(server)
    tool_loop(client(server, open_telemetry={"traces": {"enabled": True, "content_mode": "content"}}), "stream")
    asyncio.run(atool_loop(server.async_anthropic_client(api_key=None, auth_token=bearer), "json"))
    # the secrets were sent...
    assert any(API_KEY in value for value in server.requests[0].headers.values())
    assert server.requests[-1].headers["authorization"] == f"Bearer {bearer}"
    assert_never_recorded(instrumented, API_KEY, bearer, "x-api-key", "authorization", "Bearer",  # ...and nowhere in what was recorded
                          present=("get_weather", "sunny"))


# -- the beta tool runner -----------------------------------------------------------------------


@anthropic.beta_tool
def runner_weather(city: str) -> str:
    """Current weather for a city."""
    with trace.get_tracer("app").start_as_current_span("weather lookup"):
        if city == "Atlantis":
            raise LookupError("no such city")
        return f"21 C in {city}"


@anthropic.beta_async_tool
async def arunner_weather(city: str) -> str:
    """Current weather for a city."""
    await asyncio.sleep(0)
    return f"21 C in {city}"


def runner_script(server: FakeModelServer, city: str = "Paris", name: str = "runner_weather") -> None:
    server.queue(
        Reply(text="Let me check.", tool_calls=[ToolCall(name, {"city": city}, id="toolu_r1")], usage=Usage(10, 5)),
        Reply(text="Done.", usage=Usage(20, 3)),
    )


@pytest.mark.parametrize("city, outcome", [("Paris", "served"), ("Atlantis", "failed")])
def test_tool_runner_is_one_turn_without_the_sdks_spans(global_provider, instrumented, server, city, outcome):
    runner_script(server, city)
    with loopscope.session("runner"):
        runner = client(server).beta.messages.tool_runner(model=MODEL, max_tokens=100, messages=HI, tools=[runner_weather])
        assert [m.stop_reason for m in runner] == ["tool_use", "end_turn"]
    assert {s.instrumentation_scope.name for s in instrumented.spans()} == {"loopscope", "app"}
    [_agent] = instrumented.spans(a.OP_INVOKE_AGENT)
    [tool] = instrumented.spans(a.OP_EXECUTE_TOOL)
    [lookup] = [s for s in instrumented.spans() if s.name == "weather lookup"]
    assert lookup.parent.span_id == tool.context.span_id  # what the tool does nests under its call
    assert len(instrumented.spans(a.OP_CHAT)) == 2
    turn = only_turn(instrumented)
    assert (turn.round_count, turn.tool_calls_count, turn.loop_end_reason) == (1, 1, LoopEndReason.COMPLETED)
    assert turn.segments == ["Let me check.", "Done."] and turn.usage["input_tokens"] == 30 and turn.usage["output_tokens"] == 8
    assert [d.name for d in turn.declared_tools] == ["runner_weather"]
    [end] = [e.content for e in instrumented.store.get_timeline("runner") if e.type == "tool_call_end"]
    assert (end.tool_id, end.outcome) == ("toolu_r1", outcome)
    if outcome == "served":
        assert end.result == "21 C in Paris"


def test_async_tool_runner_is_one_turn(global_provider, instrumented, server):
    runner_script(server, name="arunner_weather")

    async def main() -> list[str | None]:
        runner = async_client(server).beta.messages.tool_runner(model=MODEL, max_tokens=100, messages=HI, tools=[arunner_weather])
        return [m.stop_reason async for m in runner]

    assert asyncio.run(main()) == ["tool_use", "end_turn"]
    assert {s.instrumentation_scope.name for s in instrumented.spans()} == {"loopscope"}
    turn = only_turn(instrumented)
    assert (turn.round_count, turn.tool_calls_count, turn.loop_end_reason) == (1, 1, LoopEndReason.COMPLETED)


def test_hand_written_turn_holds_the_sdk_calls(instrumented, server):
    tool_round_script(server)
    c = client(server)
    with loopscope.turn(session_id="hand", agent="weatherbot", tools=[WEATHER], input=QUESTION) as t:
        messages: list[Any] = [{"role": "user", "content": QUESTION}]
        content, _ = call(c, "stream", messages=messages, tools=[WEATHER])
        [use] = [b for b in content if b["type"] == "tool_use"]
        result = get_weather(**use["input"])
        call(c, "json", messages=_decorated_follow_up(messages, content, result), tools=[WEATHER])
    assert_hand_turn(instrumented, t.response, tool_spans=1)


def test_async_helper_never_entered_adds_no_warning_of_ours(instrumented, server):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        manager = async_client(server).messages.stream(model=MODEL, max_tokens=50, messages=HI)
        del manager
        gc.collect()
    ours = [w for w in caught if "async_call" in str(w.message) or "loopscope" in str(w.message)]
    assert not ours, [str(w.message) for w in caught]
    assert server.requests == [] and recording_is_empty(instrumented)


def test_context_window_exceeded_ends_the_turn_truncated(instrumented, server):
    server.queue(Reply(text="This answer ran out of", stop="model_context_window_exceeded"))
    _, stop = call(client(server), "stream", messages=HI)
    assert stop == "model_context_window_exceeded"
    assert only_turn(instrumented).loop_end_reason == LoopEndReason.TRUNCATED
