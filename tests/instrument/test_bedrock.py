"""Amazon Bedrock Runtime through boto3 from PyPI (the `bedrock` stack) at the fake model server:
converse, converse_stream, and invoke_model with its stream for Anthropic's and Meta Llama's bodies.
boto3 has no async client: the concurrent conversations run in threads."""

from __future__ import annotations

import gc
import json
import time
from functools import partial
from typing import Any

import pytest
from botocore.client import BaseClient
from botocore.exceptions import ClientError, EventStreamError
from opentelemetry.trace import StatusCode

import interleaved
import loopscope
import switching
from fakes.model_server import FakeModelServer, Reply, Usage
from fakes.weather_loop import queue_tool_round
from loopscope import LoopEndReason
from loopscope import semconv as a
from recorded import (
    assert_hand_turn,
    assert_never_recorded,
    assert_one_cancelled_call,
    assert_one_failed_call,
    only_turn,
)

MODEL = "anthropic.claude-3-5-sonnet-20240620-v1:0"
LLAMA = "meta.llama3-1-70b-instruct-v1:0"
KEY_ID = "AKIAFAKE7Q2W3E4R5T6Y"
SECRET = "fAkE/sEcReT+9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d"
TOKEN = "FwoGZXIvYXdzEFAKESESSIONTOKEN0123456789"
QUESTION = "What's the weather in Paris?"
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = {"tools": [{"toolSpec": {"name": "get_weather", "description": "Current weather for a city",
                                 "inputSchema": {"json": SCHEMA}}}]}
CLAUDE_TOOLS = [{"name": "get_weather", "description": "Current weather for a city", "input_schema": SCHEMA}]
MODES = ["converse", "converse_stream", "invoke", "invoke_stream"]

pytestmark = pytest.mark.stack("bedrock")  # one test runs in the litellm stack (at the end)


@pytest.fixture(autouse=True)
def fake_aws_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials from the environment, as an application has them: botocore signs with them."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", TOKEN)


def client(server: FakeModelServer) -> Any:
    """A bedrock-runtime client on the fake server, its keys from the environment."""
    return server.bedrock_client(aws_access_key_id=None, aws_secret_access_key=None)


tool_round_script = partial(queue_tool_round, call_id="tooluse_w1", usage=Usage(100, 20, cached_tokens=30, cache_creation_tokens=5))


# -- driving boto3 in each of its ways: the assistant's content and the stop reason, in Converse's blocks ----------


def converse_stream_read(events: Any) -> tuple[list[dict[str, Any]], str]:
    text, uses, stop = "", {}, ""
    for event in events:
        if "contentBlockStart" in event:
            start = event["contentBlockStart"]
            uses[start["contentBlockIndex"]] = {**start["start"]["toolUse"], "input": ""}
        elif "contentBlockDelta" in event:
            delta = event["contentBlockDelta"]
            if "text" in delta["delta"]:
                text += delta["delta"]["text"]
            else:
                uses[delta["contentBlockIndex"]]["input"] += delta["delta"]["toolUse"]["input"]
        elif "messageStop" in event:
            stop = event["messageStop"]["stopReason"]
    blocks = [{"text": text}] if text else []
    return blocks + [{"toolUse": {**u, "input": json.loads(u["input"])}} for _, u in sorted(uses.items())], stop


def invoke_stream_read(body: Any) -> tuple[list[dict[str, Any]], str]:
    """An Anthropic stream's events, as Converse blocks."""
    text, uses, stop = "", {}, ""
    for event in body:
        data = json.loads(event["chunk"]["bytes"])
        if data["type"] == "content_block_start" and data["content_block"]["type"] == "tool_use":
            uses[data["index"]] = {"toolUseId": data["content_block"]["id"], "name": data["content_block"]["name"],
                                   "input": ""}
        elif data["type"] == "content_block_delta":
            delta = data["delta"]
            if delta["type"] == "text_delta":
                text += delta["text"]
            else:
                uses[data["index"]]["input"] += delta["partial_json"]
        elif data["type"] == "message_delta":
            stop = data["delta"]["stop_reason"]
    blocks = [{"text": text}] if text else []
    return blocks + [{"toolUse": {**u, "input": json.loads(u["input"])}} for _, u in sorted(uses.items())], stop


def to_claude(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Converse messages in Anthropic's Messages body."""
    out = []
    for message in messages:
        blocks = []
        for block in message["content"]:
            if "text" in block:
                blocks.append({"type": "text", "text": block["text"]})
            elif "toolUse" in block:
                use = block["toolUse"]
                blocks.append({"type": "tool_use", "id": use["toolUseId"], "name": use["name"], "input": use["input"]})
            else:
                result = block["toolResult"]
                blocks.append({"type": "tool_result", "tool_use_id": result["toolUseId"],
                               "content": [{"type": "text", "text": c["text"]} for c in result["content"]],
                               **({"is_error": True} if result.get("status") == "error" else {})})
        out.append({"role": message["role"], "content": blocks})
    return out


def call(c: Any, mode: str, messages: list[dict[str, Any]], **kwargs: Any) -> tuple[list[dict[str, Any]], str]:
    if mode == "converse":
        response = c.converse(modelId=MODEL, messages=messages, toolConfig=TOOLS, **kwargs)
        return response["output"]["message"]["content"], response["stopReason"]
    if mode == "converse_stream":
        return converse_stream_read(c.converse_stream(modelId=MODEL, messages=messages, toolConfig=TOOLS, **kwargs)["stream"])
    body = json.dumps({"anthropic_version": "bedrock-2023-05-31", "max_tokens": 256, "tools": CLAUDE_TOOLS,
                       "messages": to_claude(messages)})
    if mode == "invoke_stream":
        return invoke_stream_read(c.invoke_model_with_response_stream(modelId=MODEL, body=body)["body"])
    message = json.loads(c.invoke_model(modelId=MODEL, body=body)["body"].read())  # the body is the user's to read
    [blocks] = to_claude_back([message])
    return blocks, message["stop_reason"]


def to_claude_back(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """Anthropic messages' content as Converse blocks."""
    return [[{"text": b["text"]} if b["type"] == "text" else
             {"toolUse": {"toolUseId": b["id"], "name": b["name"], "input": b["input"]}} for b in m["content"]]
            for m in messages]


def follow_up(messages: list[Any], content: list[dict[str, Any]], result: str, is_error: bool = False) -> list[Any]:
    [use] = [b["toolUse"] for b in content if "toolUse" in b]
    block = {"toolUseId": use["toolUseId"], "content": [{"text": result}], **({"status": "error"} if is_error else {})}
    return [*messages, {"role": "assistant", "content": content}, {"role": "user", "content": [{"toolResult": block}]}]


def tool_loop(c: Any, mode: str, result: str = "21 C and sunny", *, is_error: bool = False) -> list[str]:
    messages: list[Any] = [{"role": "user", "content": [{"text": QUESTION}]}]
    content, stop1 = call(c, mode, messages)
    _content, stop2 = call(c, mode, follow_up(messages, content, result, is_error))
    return [stop1, stop2]


# -- the two-round tool loop ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_tool_loop_becomes_one_turn(instrumented, server, mode):
    tool_round_script(server)
    with loopscope.session("conv-1"):
        stops = tool_loop(client(server), mode)
    assert stops == ["tool_use", "end_turn"]
    events = instrumented.store.get_timeline("conv-1")
    kinds = [(e.type, getattr(e.content, "tool_id", None) or getattr(e.content, "body", None)) for e in events]
    assert kinds == [
        ("message", QUESTION),
        ("message", "Let me check the weather."),
        ("tool_call_start", "tooluse_w1"),
        ("tool_call_end", "tooluse_w1"),
        ("message", "It is 21 °C and sunny in Paris."),
    ]
    end = events[3].content
    assert (end.tool_name, end.arguments, end.result, end.status, end.outcome) == (
        "get_weather", {"city": "Paris"}, "21 C and sunny", "completed", "served",
    )
    turn = only_turn(instrumented)
    assert {e.correlation_id for e in events} == {turn.correlation_id}
    assert turn.segments == ["Let me check the weather.", "It is 21 °C and sunny in Paris."]
    assert (turn.round_count, turn.tool_calls_count, turn.loop_end_reason) == (1, 1, LoopEndReason.COMPLETED)
    # Bedrock's inputTokens (and Anthropic's input_tokens) leave the cache out: the turn counts it in (100 + 30 + 5, + 150)
    assert turn.usage == {"input_tokens": 285, "output_tokens": 30, "cache_read_input_tokens": 30,
                          "cache_creation_input_tokens": 5}
    assert [(d.name, d.description, d.parameters) for d in turn.declared_tools] == [
        ("get_weather", "Current weather for a city", SCHEMA),
    ]
    assert (turn.model, turn.provider, turn.streaming) == (MODEL, "aws.bedrock", mode.endswith("stream"))
    chats = instrumented.spans(a.OP_CHAT)
    [agent] = instrumented.spans(a.OP_INVOKE_AGENT)
    assert len(chats) == 2 and all(c.parent.span_id == agent.context.span_id for c in chats)
    assert [c.attributes[a.RESPONSE_FINISH_REASONS] for c in chats] == [("tool_use",), ("end_turn",)]
    assert all((c.attributes[a.PROVIDER], c.attributes[a.REQUEST_MODEL]) == ("aws.bedrock", MODEL) for c in chats)
    assert all((c.attributes["server.address"], c.attributes["server.port"]) == ("127.0.0.1", server.port) for c in chats)
    ids = [c.attributes[a.RESPONSE_ID] for c in chats]
    assert all(i.startswith("msg_fake_" if mode.startswith("invoke") else "req_fake_") for i in ids)
    _, costs = instrumented.store.sql("SELECT cost_usd FROM model_calls")
    assert len(costs) == 2 and all(cost > 0 for (cost,) in costs)  # priced as the model at AWS (genai-prices' "aws")


@pytest.mark.parametrize("mode", ["converse_stream", "invoke"])
def test_a_hand_written_turn_holds_the_same_calls(instrumented, server, mode):
    """The same conversation in a loopscope.turn with a loopscope.tool: the same rounds, tool call and text."""
    tool_round_script(server)

    @loopscope.tool
    def get_weather(city: str) -> str:
        return "21 C and sunny"

    c = client(server)
    with loopscope.turn(session_id="hand", agent="weatherbot", input=QUESTION) as t:
        messages: list[Any] = [{"role": "user", "content": [{"text": QUESTION}]}]
        content, _ = call(c, mode, messages)
        [use] = [b["toolUse"] for b in content if "toolUse" in b]
        result = get_weather(**use["input"])
        call(c, mode, follow_up(messages, content, result))
    events = assert_hand_turn(instrumented, t.response, tool_spans=1)
    assert (events[3].content.tool_id, events[3].content.result, events[3].content.outcome) == ("tooluse_w1", "21 C and sunny", "served")


@pytest.mark.parametrize("mode", ["converse", "invoke_stream"])
def test_a_tool_result_with_status_error_is_a_failed_tool_call(instrumented, server, mode):
    tool_round_script(server)
    with loopscope.session("conv-err"):
        tool_loop(client(server), mode, result="weather service down", is_error=True)
    [end] = [e.content for e in instrumented.store.get_timeline("conv-err") if e.type == "tool_call_end"]
    assert (end.status, end.outcome, end.result, end.error) == ("failed", "failed", "weather service down", "weather service down")


# -- the request ---------------------------------------------------------------------------------------------------


def test_request_parameters_system_and_the_last_user_text(instrumented, server):
    messages = [
        {"role": "user", "content": [{"text": "An old question"}]},
        {"role": "assistant", "content": [{"text": "An old answer"}]},
        {"role": "user", "content": [{"text": "The new "}, {"text": "question"}, {"cachePoint": {"type": "default"}}]},
    ]
    client(server).converse(
        modelId=MODEL, messages=messages, system=[{"text": "You are terse."}],
        inferenceConfig={"maxTokens": 300, "temperature": 0.2, "topP": 0.9, "stopSequences": ["END"]},
        toolConfig={**TOOLS, "toolChoice": {"tool": {"name": "get_weather"}}},
        additionalModelRequestFields={"top_k": 40}, performanceConfig={"latency": "optimized"},
    )
    turn = only_turn(instrumented)
    first = instrumented.store.get_timeline(turn.session_id)[0]
    assert (first.content.role, first.content.body) == ("user", "The new question")
    [chat] = instrumented.spans(a.OP_CHAT)
    attrs = chat.attributes
    assert (attrs["gen_ai.request.temperature"], attrs["gen_ai.request.top_p"], attrs["gen_ai.request.top_k"]) == (0.2, 0.9, 40)
    assert (attrs["gen_ai.request.max_tokens"], attrs["gen_ai.request.stop_sequences"]) == (300, ("END",))
    assert json.loads(attrs[a.TOOL_DEFINITIONS])[0]["name"] == "get_weather"
    _, [(parameters,)] = instrumented.store.sql("SELECT parameters FROM model_calls")
    stored = json.loads(parameters)
    assert stored["tool_choice"] == "get_weather"
    assert json.loads(attrs[a.SYSTEM_INSTRUCTIONS]) == [{"type": "text", "content": "You are terse."}]
    assert stored["other"] == {"performance_latency": "optimized"}
    messages_json = json.loads(attrs["gen_ai.input.messages"])
    assert [m["role"] for m in messages_json] == ["user", "assistant", "user"]
    assert messages_json[-1]["parts"] == [{"type": "text", "content": "The new "}, {"type": "text", "content": "question"}]


@pytest.mark.parametrize("mode", ["converse", "invoke_stream"])
def test_a_chat_continued_is_one_session(instrumented, server, mode):
    """A second request that sends the first one's history and answer continues its conversation."""
    server.queue(Reply(text="Hello!"), Reply(text="Sunny."))
    c = client(server)
    first = [{"role": "user", "content": [{"text": "Hi"}]}]
    content, _ = call(c, mode, first)
    call(c, mode, [*first, {"role": "assistant", "content": content}, {"role": "user", "content": [{"text": "Weather?"}]}])
    loopscope.flush()
    turns = instrumented.store.list_turns(limit=None)
    assert len(turns) == 2 and len({t.session_id for t in turns}) == 1


def test_meta_llama_bodies(instrumented, server):
    server.queue(Reply(text="Paris is sunny today.", usage=Usage(12, 5)),
                 Reply(text="Paris is sunny and warm, with a light breeze from", usage=Usage(12, 9), stop="length"))
    c = client(server)
    body = json.dumps({"prompt": "Weather in Paris?", "max_gen_len": 64, "temperature": 0.2})
    answer = json.loads(c.invoke_model(modelId=LLAMA, body=body)["body"].read())
    assert answer["generation"] == "Paris is sunny today."
    streamed = "".join(json.loads(e["chunk"]["bytes"])["generation"]
                       for e in c.invoke_model_with_response_stream(modelId=LLAMA, body=body)["body"])
    loopscope.flush()
    turns = sorted(instrumented.store.list_turns(limit=None), key=lambda t: t.streaming)  # the JSON call, then the stream
    assert [t.loop_end_reason for t in turns] == [LoopEndReason.COMPLETED, LoopEndReason.TRUNCATED]
    assert [t.segments for t in turns] == [["Paris is sunny today."], [streamed]]
    assert [t.usage for t in turns] == [{"input_tokens": 12, "output_tokens": 5}, {"input_tokens": 12, "output_tokens": 9}]
    assert all(t.model == LLAMA for t in turns)
    chats = instrumented.spans(a.OP_CHAT)
    assert [c.attributes[a.RESPONSE_FINISH_REASONS] for c in chats] == [("stop",), ("length",)]
    assert [c.attributes["gen_ai.request.max_tokens"] for c in chats] == [64, 64]


# -- the answer ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stop, reason, outcome", [
    ("max_tokens", LoopEndReason.TRUNCATED, "truncated"),
    ("guardrail_intervened", LoopEndReason.CONTENT_FILTER, "content_filter"),
    ("content_filtered", LoopEndReason.CONTENT_FILTER, "content_filter"),
])
@pytest.mark.parametrize("mode", ["converse", "converse_stream"])
def test_stop_reasons_give_the_outcome(instrumented, server, mode, stop, reason, outcome):
    server.queue(Reply(text="This answer is cut", stop=stop))
    _content, said = call(client(server), mode, [{"role": "user", "content": [{"text": "Tell me everything"}]}])
    assert said == stop
    assert only_turn(instrumented).loop_end_reason == reason
    _, [(stored,)] = instrumented.store.sql("SELECT outcome FROM model_calls")
    assert stored == outcome
    [chat] = instrumented.spans(a.OP_CHAT)
    assert chat.attributes[a.RESPONSE_FINISH_REASONS] == (stop,)


@pytest.mark.parametrize("status, code", [(429, "ThrottlingException"), (400, "ValidationException")])
@pytest.mark.parametrize("mode", MODES)
def test_http_errors_are_failed_calls(instrumented, server, mode, status, code):
    server.queue(Reply.error(status, "no such luck"))
    with pytest.raises(ClientError) as caught:
        call(client(server), mode, [{"role": "user", "content": [{"text": "Hi"}]}])
    assert caught.value.response["Error"]["Code"] == code  # the user's exception, as boto3 raised it
    assert_one_failed_call(instrumented, code)


@pytest.mark.parametrize("mode", ["converse_stream", "invoke_stream"])
def test_an_exception_event_mid_stream_fails_the_call(instrumented, server, mode):
    server.queue(Reply.stream_failure(after=3, message="model fell over"))
    with pytest.raises(EventStreamError):
        call(client(server), mode, [{"role": "user", "content": [{"text": "Count to ten"}]}])
    assert_one_failed_call(instrumented, "EventStreamError")


def test_an_invoke_model_body_cut_short_fails_the_call_and_the_users_read(instrumented, server):
    """The answer's body is read to be recorded: a connection that breaks while it is read fails the
    call, and the user's own read raises what the read raised (as it would have without loopscope)."""
    server.queue(Reply(text="Hello there, this answer never arrives whole.", cut_body=20))
    body = json.dumps({"anthropic_version": "bedrock-2023-05-31", "max_tokens": 50, "messages": [{"role": "user", "content": "Hi"}]})
    response = client(server).invoke_model(modelId=MODEL, body=body)
    with pytest.raises(Exception) as caught:
        response["body"].read()
    assert type(caught.value).__module__.startswith("botocore")
    [chat] = instrumented.spans(a.OP_CHAT)
    assert chat.status.status_code is StatusCode.ERROR and chat.attributes[a.ERROR_TYPE] == type(caught.value).__name__
    assert only_turn(instrumented).loop_end_reason == LoopEndReason.ERROR


# -- streams let go early -------------------------------------------------------------------------------------------


def long_reply(server: FakeModelServer) -> None:
    server.queue(Reply(text="one two three four five six seven eight nine ten eleven twelve"))


@pytest.mark.parametrize("mode", ["converse_stream", "invoke_stream"])
def test_a_stream_closed_early_ends_its_call_once(instrumented, server, mode):
    long_reply(server)
    c = client(server)
    hi = [{"role": "user", "content": [{"text": "Count"}]}]
    if mode == "converse_stream":
        stream = c.converse_stream(modelId=MODEL, messages=hi)["stream"]
    else:
        stream = c.invoke_model_with_response_stream(modelId=MODEL, body=json.dumps(
            {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 50, "messages": to_claude(hi)}))["body"]
    for _, _event in zip(range(3), stream):
        pass
    stream.close()
    del stream
    gc.collect()
    assert_one_cancelled_call(instrumented)
    assert instrumented.spans(a.OP_CHAT)[0].attributes[a.ROUND_TEXT].startswith("one")


def test_a_converse_stream_read_up_to_its_metadata_is_complete(instrumented, server):
    """The metadata event is the stream's last: a reader that stops there (and lets the stream go)
    has the whole answer; the call ends completed, with its usage, not cancelled."""
    server.queue(Reply(text="Hello there.", usage=Usage(10, 4)))
    stream = client(server).converse_stream(modelId=MODEL, messages=[{"role": "user", "content": [{"text": "Hi"}]}])["stream"]
    for event in stream:
        if "metadata" in event:
            break
    stream.close()
    turn = only_turn(instrumented)
    assert (turn.loop_end_reason, turn.segments, turn.usage) == (
        LoopEndReason.COMPLETED, ["Hello there."], {"input_tokens": 10, "output_tokens": 4})
    [chat] = instrumented.spans(a.OP_CHAT)
    assert chat.status.status_code is not StatusCode.ERROR


def test_a_stream_dropped_unread_is_collected(instrumented, server):
    long_reply(server)
    response = client(server).converse_stream(modelId=MODEL, messages=[{"role": "user", "content": [{"text": "Count"}]}])
    del response
    gc.collect()
    assert_one_cancelled_call(instrumented)


# -- concurrency ---------------------------------------------------------------------------------------------------


def test_twenty_interleaved_conversations_stay_apart(instrumented, server):
    """boto3 is synchronous: twenty conversations in threads, their rounds interleaved by a barrier."""
    c = client(server)  # one client, shared by the threads, as boto3 allows
    interleaved.run_threads(instrumented, server, seed=7, queue=partial(tool_round_script, server), call_id="tooluse_c{i:02d}",
                            client=lambda i: c, modes=MODES, follow_up=follow_up,
                            call=lambda c, mode, messages: call(c, mode, messages)[0],
                            question=lambda text: {"role": "user", "content": [{"text": text}]})


# -- clients, instrument and uninstrument -------------------------------------------------------------------------


def test_instrument_twice_is_once_and_uninstrument_restores(recording, server):
    """Clients made before and after ``instrument()`` are recorded once; ``uninstrument()``
    puts back botocore's method, and a new client's call is recorded no more."""
    before = client(server)

    def calls() -> None:
        after = client(server)
        server.queue(Reply(text="Hello."), Reply(text="Hello again."))
        before.converse(modelId=MODEL, messages=[{"role": "user", "content": [{"text": "Hi"}]}])
        after.converse(modelId=MODEL, messages=[{"role": "user", "content": [{"text": "Hi again"}]}])
        loopscope.flush()
        assert sorted(c.attributes[a.ROUND_TEXT] for c in recording.spans(a.OP_CHAT)) == ["Hello again.", "Hello."]

    def after() -> None:
        server.queue(Reply(text="Hello."))
        client(server).converse(modelId=MODEL, messages=[{"role": "user", "content": [{"text": "Hi"}]}])

    switching.assert_instrument_twice_is_once(recording, chats=2, calls=calls, after=after,
                                              originals=lambda: BaseClient.__dict__["_make_api_call"])


# -- secrets --------------------------------------------------------------------------------------------------------


def test_credentials_and_signatures_are_never_recorded(instrumented, server):
    tool_round_script(server)
    tool_round_script(server)
    tool_loop(client(server), "converse_stream")
    tool_loop(client(server), "invoke")
    loopscope.flush()
    headers = server.requests[0].headers
    assert headers["authorization"].startswith(f"AWS4-HMAC-SHA256 Credential={KEY_ID}/")  # sent, signed...
    assert headers["x-amz-security-token"] == TOKEN
    signature = headers["authorization"].rsplit("Signature=", 1)[1]
    assert_never_recorded(instrumented, KEY_ID, SECRET, TOKEN, signature, "AWS4-HMAC-SHA256", "authorization", "x-amz-",
                          present=("get_weather", "sunny"))  # ...and nowhere in what was recorded


# -- one call, one record ------------------------------------------------------------------------------------------


@pytest.mark.stack("litellm")
@pytest.mark.parametrize("stream", [False, True])
def test_litellm_over_bedrock_is_one_call(instrumented, server, stream):
    """LiteLLM's Bedrock route signs with botocore but sends with its own HTTP client: the LiteLLM
    adapter records the call, the bedrock adapter (on too) adds none."""
    import litellm

    server.queue(Reply(text="Hello from Bedrock.", usage=Usage(10, 4)))
    answer = litellm.completion(model=f"bedrock/converse/{MODEL}", messages=[{"role": "user", "content": "Hi"}],
                                aws_bedrock_runtime_endpoint=server.url, aws_region_name="us-east-1", num_retries=0,
                                stream=stream)
    text = "".join(c.choices[0].delta.content or "" for c in answer) if stream else answer.choices[0].message.content
    assert text == "Hello from Bedrock."
    assert [r.api for r in server.requests] == ["converse_stream" if stream else "converse"]
    deadline = time.monotonic() + 30  # LiteLLM records after it returned (its callbacks' thread)
    while not instrumented.spans(a.OP_CHAT) and time.monotonic() < deadline:
        time.sleep(0.01)
    loopscope.flush()
    [chat] = instrumented.spans(a.OP_CHAT)
    assert chat.attributes[a.PROVIDER] == "bedrock"  # as LiteLLM names it
    _, [(count,)] = instrumented.store.sql("SELECT count(*) FROM model_calls")
    assert count == 1
