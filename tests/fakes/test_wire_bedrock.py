"""The fake model server's Bedrock Runtime wire (wires/bedrock.py) and its AWS event-stream framing
(wires/eventstream.py), driven by the real boto3 client (the `bedrock` stack): what boto3 hands the user (content
blocks, tool uses, usage, stop reason, its exceptions) and what the server recorded of each request. boto3 has no
async client: the async side (aiobotocore) is not covered here."""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

import pytest
from botocore.eventstream import ChecksumMismatch, EventStreamBuffer
from botocore.exceptions import ClientError, EventStreamError

from .model_server import FakeModelServer, Reply, ToolCall, Usage
from .wires.eventstream import EVENTSTREAM, encode_message

MODEL = "anthropic.claude-3-5-sonnet-20240620-v1:0"
TOOLS = {"tools": [{"toolSpec": {
    "name": "get_weather", "description": "The weather in a city.",
    "inputSchema": {"json": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
}}]}
QUESTION = {"role": "user", "content": [{"text": "Weather in Paris?"}]}


def test_botocore_decodes_the_framing() -> None:
    """Messages made from the specification decode with botocore's own parser: prelude, headers, payload, both
    CRCs; one flipped payload byte fails its checksum there."""
    frames = [("messageStart", {"role": "assistant"}),
              ("contentBlockDelta", {"delta": {"text": "é" * 300}, "contentBlockIndex": 0}),
              ("exception:throttlingException", {"message": "slow down"})]
    data = b"".join(EVENTSTREAM.encode(f) for f in frames)
    buffer = EventStreamBuffer()
    for i in range(0, len(data), 7):  # fed in small pieces, as a socket may hand them
        buffer.add_data(data[i:i + 7])
    messages = list(buffer)
    assert [m.headers for m in messages] == [
        {":message-type": "event", ":event-type": "messageStart", ":content-type": "application/json"},
        {":message-type": "event", ":event-type": "contentBlockDelta", ":content-type": "application/json"},
        {":message-type": "exception", ":exception-type": "throttlingException", ":content-type": "application/json"},
    ]
    assert [json.loads(m.payload) for m in messages] == [f[1] for f in frames]
    assert messages[2].to_response_dict()["status_code"] == 400  # what botocore raises as an error

    one = bytearray(encode_message({":event-type": "x"}, b'{"a":1}'))
    total, headers_length = struct.unpack(">II", one[:8])
    assert total == len(one) and struct.unpack(">I", one[8:12])[0] == zlib.crc32(one[:8])
    one[12 + headers_length] ^= 1
    broken = EventStreamBuffer()
    broken.add_data(bytes(one))
    with pytest.raises(ChecksumMismatch):
        list(broken)


def script(server: FakeModelServer) -> None:
    server.queue(
        Reply(text="Let me look.", tool_calls=[ToolCall("get_weather", {"city": "Paris"})],
              usage=Usage(100, 20, cached_tokens=30, cache_creation_tokens=4)),
        Reply(text="21 °C and dry in Paris.", usage=Usage(140, 9)),
    )


def second_messages(content: list[Any]) -> list[Any]:
    uses = [b["toolUse"] for b in content if "toolUse" in b]
    return [QUESTION, {"role": "assistant", "content": content},
            {"role": "user", "content": [{"toolResult": {"toolUseId": u["toolUseId"], "content": [{"json": {
                "temp_c": 21}}], "status": "success"}} for u in uses]}]


def check_rounds(server: FakeModelServer, content: list[Any], stop: str, usage: dict[str, int], text: str,
                 stop2: str, *, stream: bool) -> None:
    uses = [b["toolUse"] for b in content if "toolUse" in b]
    assert [b["text"] for b in content if "text" in b] == ["Let me look."]
    assert [(u["name"], u["input"]) for u in uses] == [("get_weather", {"city": "Paris"})] and uses[0]["toolUseId"]
    assert stop == "tool_use" and stop2 == "end_turn" and text == "21 °C and dry in Paris."
    assert usage == {"inputTokens": 100, "outputTokens": 20, "totalTokens": 120, "cacheReadInputTokens": 30,
                     "cacheWriteInputTokens": 4}
    one, two = server.requests
    suffix = "converse-stream" if stream else "converse"
    assert one.path == f"/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/{suffix}" and one.wire == "bedrock"
    assert one.model == MODEL and one.stream is stream
    # SigV4 with the dummy key id; the secret is never sent
    assert one.headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=testing/")
    assert "testing-secret" not in str(one.headers) and b"testing-secret" not in one.raw_body
    assert one.first_user_text == "Weather in Paris?"
    assert one.body["inferenceConfig"] == {"maxTokens": 256}
    assert [t["toolSpec"]["name"] for t in one.body["toolConfig"]["tools"]] == ["get_weather"]
    assert two.tool_results == [{"id": uses[0]["toolUseId"], "content": [{"json": {"temp_c": 21}}],
                                 "is_error": False}]


def test_tool_loop_converse(model_server: FakeModelServer) -> None:
    script(model_server)
    client = model_server.bedrock_client()
    first = client.converse(modelId=MODEL, messages=[QUESTION], toolConfig=TOOLS, inferenceConfig={"maxTokens": 256})
    content = first["output"]["message"]["content"]
    second = client.converse(modelId=MODEL, messages=second_messages(content), toolConfig=TOOLS,
                             inferenceConfig={"maxTokens": 256})
    check_rounds(model_server, content, first["stopReason"], first["usage"],
                 second["output"]["message"]["content"][0]["text"], second["stopReason"], stream=False)


def gather(events: list[dict[str, Any]]) -> tuple[list[Any], str, dict[str, int]]:
    """A user's loop over converse_stream: content blocks rebuilt (tool input JSON joined), stop reason, usage."""
    blocks: dict[int, dict[str, Any]] = {}
    stop, usage = "", {}
    for ev in events:
        if "contentBlockStart" in ev:
            start = ev["contentBlockStart"]
            blocks[start["contentBlockIndex"]] = {"toolUse": {**start["start"]["toolUse"], "input": ""}}
        elif "contentBlockDelta" in ev:
            d = ev["contentBlockDelta"]
            block = blocks.setdefault(d["contentBlockIndex"], {"text": ""})
            if "text" in d["delta"]:
                block["text"] += d["delta"]["text"]
            else:
                block["toolUse"]["input"] += d["delta"]["toolUse"]["input"]
        elif "messageStop" in ev:
            stop = ev["messageStop"]["stopReason"]
        elif "metadata" in ev:
            usage = ev["metadata"]["usage"]
    for block in blocks.values():
        if "toolUse" in block:
            block["toolUse"]["input"] = json.loads(block["toolUse"]["input"])
    assert list(events[0]) == ["messageStart"] and list(events[-1]) == ["metadata"]
    return [blocks[i] for i in sorted(blocks)], stop, usage


def test_tool_loop_converse_stream(model_server: FakeModelServer) -> None:
    script(model_server)
    client = model_server.bedrock_client()
    response = client.converse_stream(modelId=MODEL, messages=[QUESTION], toolConfig=TOOLS,
                                      inferenceConfig={"maxTokens": 256})
    assert response["ResponseMetadata"]["HTTPHeaders"]["content-type"] == "application/vnd.amazon.eventstream"
    content, stop, usage = gather(list(response["stream"]))
    again = client.converse_stream(modelId=MODEL, messages=second_messages(content), toolConfig=TOOLS,
                                   inferenceConfig={"maxTokens": 256})
    content2, stop2, _ = gather(list(again["stream"]))
    check_rounds(model_server, content, stop, usage, content2[0]["text"], stop2, stream=True)


@pytest.mark.parametrize(("stop", "expected"), [("max_tokens", "max_tokens"), ("length", "max_tokens"),
                                                ("guardrail_intervened", "guardrail_intervened"),
                                                ("content_filter", "content_filtered")])
def test_stop_reasons(model_server: FakeModelServer, stop: str, expected: str) -> None:
    model_server.queue(Reply(text="Cut", stop=stop), Reply(text="Cut", stop=stop))
    client = model_server.bedrock_client()
    assert client.converse(modelId=MODEL, messages=[QUESTION])["stopReason"] == expected
    events = list(client.converse_stream(modelId=MODEL, messages=[QUESTION])["stream"])
    assert [e["messageStop"]["stopReason"] for e in events if "messageStop" in e] == [expected]


@pytest.mark.parametrize(("status", "code"), [(400, "ValidationException"), (429, "ThrottlingException"),
                                              (503, "ServiceUnavailableException")])
def test_http_errors(model_server: FakeModelServer, status: int, code: str) -> None:
    model_server.queue(Reply.error(status, "no such luck"), Reply.error(status, "no such luck"))
    client = model_server.bedrock_client()
    kind = getattr(client.exceptions, code)
    with pytest.raises(kind) as caught:
        client.converse(modelId=MODEL, messages=[QUESTION])
    error = caught.value.response
    assert (error["Error"]["Code"], error["Error"]["Message"], error["ResponseMetadata"]["HTTPStatusCode"]) == \
        (code, "no such luck", status)
    with pytest.raises(kind):
        client.converse_stream(modelId=MODEL, messages=[QUESTION])
    assert len(model_server.requests) == 2  # one attempt each


def test_mid_stream_error(model_server: FakeModelServer) -> None:
    """Two events, then an exception message: botocore raises EventStreamError with its type as the code."""
    model_server.queue(Reply.stream_failure(after=2, message="model fell over"))
    got: list[Any] = []
    with pytest.raises(EventStreamError) as caught:
        for ev in model_server.bedrock_client().converse_stream(modelId=MODEL, messages=[QUESTION])["stream"]:
            got.append(list(ev))  # the event's kind
    assert got == [["messageStart"], ["contentBlockDelta"]]
    assert isinstance(caught.value, ClientError)
    assert caught.value.response["Error"] == {"Code": "modelStreamErrorException", "Message": "model fell over"}


# -- InvokeModel: the model's own body -----------------------------------------------------------------------------

CLAUDE = {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 256,
          "tools": [{"name": "get_weather", "description": "The weather in a city.",
                     "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
          "messages": [{"role": "user", "content": "Weather in Paris?"}]}
LLAMA = "meta.llama3-1-70b-instruct-v1:0"


def invoke_events(response: dict[str, Any]) -> list[dict[str, Any]]:
    """The model's events of an invoke_model_with_response_stream: each chunk's bytes, as JSON."""
    return [json.loads(ev["chunk"]["bytes"]) for ev in response["body"]]


def test_invoke_model_with_anthropics_body(model_server: FakeModelServer) -> None:
    script(model_server)
    client = model_server.bedrock_client()
    first = json.loads(client.invoke_model(modelId=MODEL, body=json.dumps(CLAUDE))["body"].read())
    assert (first["type"], first["stop_reason"], first["model"]) == ("message", "tool_use", MODEL)
    [use] = [b for b in first["content"] if b["type"] == "tool_use"]
    assert (use["name"], use["input"]) == ("get_weather", {"city": "Paris"})
    assert first["usage"]["cache_read_input_tokens"] == 30
    follow = {**CLAUDE, "messages": [*CLAUDE["messages"], {"role": "assistant", "content": first["content"]},
                                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"],
                                                                   "content": "21 C"}]}]}
    events = invoke_events(client.invoke_model_with_response_stream(modelId=MODEL, body=json.dumps(follow)))
    assert [e["type"] for e in events][:2] == ["message_start", "content_block_start"]
    assert "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta") == "21 °C and dry in Paris."
    assert events[-1]["type"] == "message_stop"
    assert events[-1]["amazon-bedrock-invocationMetrics"]["outputTokenCount"] == 9
    one, two = model_server.requests
    assert (one.api, two.api, one.stream, two.stream) == ("invoke_model", "invoke_model_stream", False, True)
    assert one.first_user_text == "Weather in Paris?" and one.model == MODEL
    assert two.tool_results == [{"id": use["id"], "content": "21 C", "is_error": False}]


def test_invoke_model_with_metas_body(model_server: FakeModelServer) -> None:
    model_server.queue(Reply(text="Paris is sunny today.", usage=Usage(12, 5)),
                       Reply(text="Paris is sunny today.", usage=Usage(12, 5), stop="length"))
    client = model_server.bedrock_client()
    body = json.dumps({"prompt": "Weather in Paris?", "max_gen_len": 64, "temperature": 0.2})
    answer = json.loads(client.invoke_model(modelId=LLAMA, body=body)["body"].read())
    assert answer == {"generation": "Paris is sunny today.", "prompt_token_count": 12, "generation_token_count": 5,
                      "stop_reason": "stop"}
    events = invoke_events(client.invoke_model_with_response_stream(modelId=LLAMA, body=body))
    assert "".join(e["generation"] for e in events) == "Paris is sunny today."
    assert events[0]["prompt_token_count"] == 12 and events[-1]["stop_reason"] == "length"
    assert events[-1]["amazon-bedrock-invocationMetrics"]["inputTokenCount"] == 12
    assert model_server.requests[0].first_user_text == "Weather in Paris?"
