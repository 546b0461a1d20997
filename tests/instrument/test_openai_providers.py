"""Providers reached through the openai SDK at their OpenAI-compatible endpoints: each call is
recorded with the provider whose host the client's ``base_url`` names, and priced only where
genai-prices knows that provider's price for the model (never OpenAI's for another server).

No network: the client keeps the provider's ``base_url`` (what loopscope reads, as in a real
program), and its ``http_client`` has a transport that sends every request to the fake model
server on 127.0.0.1 instead (the same path as OpenAI's ``/v1/chat/completions``, the Host
header left as the provider's). The host is never resolved. This was chosen over a test-only
switch in loopscope that would map an address: the code under test is the one that runs.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit

import httpx2
import openai
import pytest

from fakes.model_server import FakeModelServer, Reply, Usage
from loopscope import semconv as a


def _to_fake(request: httpx2.Request, port: int) -> None:
    path = "/v1/chat/completions" if request.url.path.endswith("/chat/completions") else request.url.path
    request.url = request.url.copy_with(scheme="http", host="127.0.0.1", port=port, path=path)


class ToFakeServer(httpx2.BaseTransport):
    """Every request to the fake model server, whatever host its URL names."""

    def __init__(self, port: int) -> None:
        self.port, self.inner = port, httpx2.HTTPTransport()

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        _to_fake(request, self.port)
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


class AsyncToFakeServer(httpx2.AsyncBaseTransport):
    def __init__(self, port: int) -> None:
        self.port, self.inner = port, httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        _to_fake(request, self.port)
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def client_at(server: FakeModelServer, base_url: str) -> openai.OpenAI:
    port = urlsplit(server.url).port
    assert port is not None
    return openai.OpenAI(base_url=base_url, api_key="test-key", max_retries=0,
                         http_client=openai.DefaultHttpxClient(transport=ToFakeServer(port)))


def async_client_at(server: FakeModelServer, base_url: str) -> openai.AsyncOpenAI:
    port = urlsplit(server.url).port
    assert port is not None
    return openai.AsyncOpenAI(base_url=base_url, api_key="test-key", max_retries=0,
                              http_client=openai.DefaultAsyncHttpxClient(transport=AsyncToFakeServer(port)))


# base URL as each provider documents it, the provider recorded, a model of theirs, whether it is priced
PROVIDERS = [
    ("https://generativelanguage.googleapis.com/v1beta/openai/", "gcp.gemini", "gemini-2.5-flash", True),
    ("https://api.groq.com/openai/v1", "groq", "llama-3.3-70b-versatile", True),
    ("https://api.mistral.ai/v1", "mistral_ai", "mistral-large-latest", True),
    ("https://api.deepseek.com", "deepseek", "deepseek-chat", True),
    ("https://openrouter.ai/api/v1", "openrouter", "openai/gpt-4o-mini", True),
    ("https://api.together.xyz/v1", "together", "meta-llama/Llama-3.3-70B-Instruct-Turbo", True),
    ("https://api.cohere.ai/compatibility/v1", "cohere", "command-a-03-2025", True),
    ("https://api.z.ai/api/paas/v4/", "zai", "glm-4.5", True),
    ("https://api.openai.com/v1", "openai", "gpt-4o-mini", True),
    # Ollama on its own port: named, but no price (genai-prices has none for a local model)
    ("http://localhost:11434/v1", "ollama", "llama3.2", False),
    # a server no table names: the SDK's provider, and no price, not even for an OpenAI model name
    ("https://llm.example.internal/v1", "openai", "gpt-4o-mini", False),
    ("http://localhost:8000/v1", "openai", "gpt-4o-mini", False),
]


def rows(recording) -> list[tuple[Any, ...]]:
    _, found = recording.store.sql("SELECT provider, response_model, cost_usd, price_source, parameters FROM model_calls ORDER BY started_at")
    return found


@pytest.mark.parametrize(("base_url", "provider", "model", "priced"), PROVIDERS, ids=[p[1] + ":" + p[0].split("/")[2] for p in PROVIDERS])
def test_the_provider_is_the_servers_and_so_is_the_price(instrumented, server, base_url, provider, model, priced):
    server.queue(Reply(text="Hello.", usage=Usage(1000, 100)))
    answer = client_at(server, base_url).chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content == "Hello."
    assert server.requests[0].path == "/v1/chat/completions"  # it reached the fake server, not the provider
    [chat] = instrumented.spans(a.OP_CHAT)
    host = urlsplit(base_url).hostname
    assert (chat.attributes[a.PROVIDER], chat.attributes[a.SERVER_ADDRESS]) == (provider, host)
    [(stored, response_model, cost, source, parameters)] = rows(instrumented)
    assert (stored, response_model, json.loads(parameters)["server_address"]) == (provider, model, host)
    if priced:
        assert cost is not None and cost > 0 and source == "genai-prices"
    else:
        assert (cost, source) == (None, None)


@pytest.mark.parametrize(("base_url", "model"), [
    ("https://api.groq.com/openai/v1", "gpt-4o-mini"),  # an OpenAI model name at Groq's: Groq has no price for it
    ("https://api.deepseek.com", "gpt-4o"),
    ("http://localhost:11434/v1", "gpt-4o-mini"),
])
def test_a_model_the_provider_does_not_price_is_not_priced_as_another_providers(instrumented, server, base_url, model):
    server.queue(Reply(text="Hello.", usage=Usage(1000, 100)))
    client_at(server, base_url).chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    [(provider, _, cost, source, _)] = rows(instrumented)
    assert provider != "openai" and (cost, source) == (None, None)


def test_streamed_and_async_calls_name_the_provider_too(instrumented, server):
    server.queue(Reply(text="Hello there.", usage=Usage(1000, 100)), Reply(text="Hello again.", usage=Usage(1000, 100)))
    base_url = "https://api.groq.com/openai/v1"
    chunks = list(client_at(server, base_url).chat.completions.create(
        model="llama-3.3-70b-versatile", messages=[{"role": "user", "content": "hi"}], stream=True,
        stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello there."

    async def main() -> None:
        c = async_client_at(server, "https://generativelanguage.googleapis.com/v1beta/openai/")
        await c.chat.completions.create(model="gemini-2.5-flash", messages=[{"role": "user", "content": "hi"}])

    asyncio.run(main())
    found = rows(instrumented)
    assert [(r[0], r[1]) for r in found] == [("groq", "llama-3.3-70b-versatile"), ("gcp.gemini", "gemini-2.5-flash")]
    assert all(r[2] is not None and r[2] > 0 for r in found)


def test_the_users_providers_table_wins_over_the_hosts(recording, server):
    import loopscope

    loopscope.configure(recording.db, tracer_provider=recording.pipeline.tracer_provider,
                        prices={"providers": {"api.groq.com": "sdk"}})
    loopscope.instrument()
    try:
        server.queue(Reply(text="Hello.", usage=Usage(1000, 100)))
        client_at(server, "https://api.groq.com/openai/v1").chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
    finally:
        loopscope.uninstrument()
    [(provider, _, cost, source, _)] = rows(recording)
    assert provider == "openai" and cost is not None and source == "genai-prices"  # a gateway: the SDK's provider
