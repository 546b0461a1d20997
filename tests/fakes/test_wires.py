"""The wire registry of the fake model server (tests/fakes/wires/), in the core venv without the providers' SDKs:
each path goes to exactly one wire, and every wire renders every kind of Reply (the SDK-driven tests in
test_wire_NAME.py check what the formats mean; this checks that no Reply breaks a renderer)."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from .model_server import FakeModelServer, Reply, ToolCall, Usage
from .wires import WIRES, route

PATHS = {
    "/v1/chat/completions": ("openai", "chat"),
    "/v1/responses": ("openai", "responses"),
    "/v1/messages": ("anthropic", "messages"),
    "/v1/messages/count_tokens": ("anthropic", "count_tokens"),
    "/v1beta/models/gemini-2.5-flash:generateContent": ("gemini", "generate_content"),
    "/v1/models/gemini-2.5-flash:streamGenerateContent": ("gemini", "generate_content"),
    "/v1beta1/projects/p/locations/l/publishers/google/models/m:generateContent": ("gemini", "generate_content"),
    "/api/chat": ("ollama", "ollama_chat"),
    "/v2/chat": ("cohere", "cohere_chat"),
    "/mistral/v1/chat/completions": ("mistral", "mistral_chat"),
    "/openai/v1/chat/completions": ("groq", "groq_chat"),
    "/model/amazon.nova-pro-v1%3A0/converse": ("bedrock", "converse"),
    "/model/amazon.nova-pro-v1%3A0/converse-stream": ("bedrock", "converse_stream"),
}


@pytest.mark.parametrize("path", sorted(PATHS))
def test_each_path_has_one_wire(path: str) -> None:
    found = route(path)
    assert found is not None and (found[0].name, found[1]) == PATHS[path]
    others = [w.name for w in WIRES for r in w.routes if r.match(path) is not None]
    assert others == [found[0].name]


def test_every_wire_is_named_once() -> None:
    names = [w.name for w in WIRES]
    assert len(set(names)) == len(names) and {n for n, _ in PATHS.values()} == set(names)


REPLIES = [
    Reply(),
    Reply(text=""),
    Reply(text="Hello there.", usage=Usage(10, 5, cached_tokens=3, cache_creation_tokens=2, reasoning_tokens=4)),
    Reply(tool_calls=[ToolCall("a", {"x": 1}), ToolCall("b", '{"y": [1, 2]}', id="given")]),
    Reply(text="Plan.", tool_calls=[ToolCall("a", {})]),
    Reply(text="Cut", stop="length"),
    Reply(text="No.", stop="content_filter", refusal="No."),
    Reply(text="x", usage_extra={"extra_count": 1}),
    Reply(text="x", chunk_size=1),
]


@pytest.mark.parametrize("path", [p for p in sorted(PATHS) if not p.endswith("count_tokens")])
def test_every_reply_renders(model_server: FakeModelServer, path: str) -> None:
    wire, api, params = route(path) or pytest.fail(path)
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    for reply in REPLIES:
        r = wire.render(model_server, api, body, reply, params)
        json.dumps(r.json_body())
        frames = r.frames()
        assert frames and all(wire.framing.encode(f) for f in frames)
        for status in (400, 429, 500, 503):
            json.dumps(r.error_body(status))
        assert wire.framing.encode(r.stream_error_frame(len(frames)))


def test_the_server_routes_by_wire(model_server: FakeModelServer) -> None:
    """The recorded request names its wire and path parameters; an unknown path is a 404, recorded as such."""
    model_server.queue(Reply(text="Bonjour."))
    request = urllib.request.Request(f"{model_server.url}/api/chat", method="POST",
                                     data=json.dumps({"model": "m", "messages": [{"role": "user", "content": "[x] hi"}],
                                                      "stream": False}).encode())
    with urllib.request.urlopen(request, timeout=30) as response:
        assert json.loads(response.read())["message"]["content"] == "Bonjour."
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(urllib.request.Request(f"{model_server.url}/v9/nothing", method="POST", data=b"{}"),
                               timeout=30)
    assert caught.value.code == 404
    one, two = model_server.requests
    assert (one.wire, one.api, one.stream, one.first_user_text, one.status) == ("ollama", "ollama_chat", False,
                                                                               "[x] hi", 200)
    assert (two.wire, two.api, two.status) == ("", "unknown", 404)
