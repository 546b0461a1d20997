"""Which price a model call gets (loopscope/pricing.py), through the real SDKs against the fake
model server: the model that answered, the provider whose server answered, server-tool fees.
Never a guess: a call without a price has a NULL cost and is counted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import anthropic
import pytest
from genai_prices import Usage as PriceUsage
from genai_prices import calc_price
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import loopscope
from fakes.model_server import STANDS_FOR, FakeModelServer, Reply, Usage
from loopscope import pricing
from loopscope import semconv as a

OPENAI_MODEL = "gpt-4o-mini"
ANTHROPIC_MODEL = "claude-3-5-haiku-20241022"


class Recorded:
    def __init__(self, db: Path, exporter: InMemorySpanExporter) -> None:
        self.db, self.exporter = db, exporter

    def calls(self) -> list[Any]:
        loopscope.flush()
        return loopscope.Store(str(self.db)).model_calls()

    def unpriced(self) -> int:
        _, rows = loopscope.Store(str(self.db)).sql("SELECT unpriced_calls FROM cost_totals")
        return rows[0][0]

    def provider_names(self) -> list[Any]:
        return [s.attributes.get(a.PROVIDER) for s in self.exporter.get_finished_spans() if s.attributes.get(a.OPERATION) == a.OP_CHAT]


@pytest.fixture
def record(tmp_path: Path) -> Iterator[Any]:
    """``record(prices)``: a pipeline with those prices (and providers table), every adapter on."""
    exporter = InMemorySpanExporter()

    def start(prices: Any) -> Recorded:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        loopscope.configure(tmp_path / "store.duckdb", tracer_provider=provider, flush_interval=0.05, prices=prices)
        loopscope.instrument()
        return Recorded(tmp_path / "store.duckdb", exporter)

    try:
        yield start
    finally:
        loopscope.uninstrument()
        loopscope.shutdown()
        pricing.set_overrides(None)
        pricing.use_prices_file(None)


def _price(model: str, provider: str, usage: dict[str, int], **more: int) -> float:
    return float(calc_price(
        PriceUsage(input_tokens=usage.get("input_tokens", 0), output_tokens=usage.get("output_tokens", 0),
                   cache_read_tokens=usage.get("cache_read_input_tokens", 0),
                   cache_write_tokens=usage.get("cache_creation_input_tokens", 0), **more),
        model, provider_id=provider,
    ).total_price)


def _chat(server: FakeModelServer, model: str = OPENAI_MODEL) -> None:
    server.openai_client().chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi?"}])


def _responses(server: FakeModelServer, model: str = OPENAI_MODEL) -> None:
    server.openai_client().responses.create(model=model, input="Hi?")


def _messages(server: FakeModelServer, model: str = ANTHROPIC_MODEL) -> None:
    anthropic.Anthropic(base_url=server.anthropic_base_url, api_key="sk-test").messages.create(
        model=model, max_tokens=100, messages=[{"role": "user", "content": "Hi?"}])


SDKS = {"chat": (_chat, OPENAI_MODEL, "openai"), "responses": (_responses, OPENAI_MODEL, "openai"),
        "anthropic": (_messages, ANTHROPIC_MODEL, "anthropic")}


# -- the model that answered --------------------------------------------------------------------------


@pytest.mark.parametrize("sdk", sorted(SDKS))
def test_an_answer_from_another_model_is_not_priced_as_the_model_asked_for(record, model_server, sdk):
    call, model, _ = SDKS[sdk]
    recorded = record(STANDS_FOR)
    # a gateway asked for a known model answers with one genai-prices does not price
    model_server.queue(Reply(text="Hi.", model="moonshotai/kimi-k2-unpriced", usage=Usage(1000, 50)))
    model_server.queue(Reply(text="Hi.", usage=Usage(1000, 50)))
    call(model_server, model)
    call(model_server, model)
    other, same = recorded.calls()
    assert (other.request_model, other.response_model) == (model, "moonshotai/kimi-k2-unpriced")
    assert (other.cost_usd, other.price_source) == (None, None)
    assert same.cost_usd is not None and same.cost_usd > 0  # the same call answered by the model asked for
    assert recorded.unpriced() == 1


# -- the server that answered -------------------------------------------------------------------------


@pytest.mark.parametrize("sdk", sorted(SDKS))
def test_a_local_server_answering_as_a_known_model_is_not_priced(record, model_server, sdk):
    call, _, provider = SDKS[sdk]
    recorded = record(None)  # 127.0.0.1 named by no table: a local or self-hosted server
    model_server.queue(Reply(text="Hi.", usage=Usage(1000, 50)))
    call(model_server)
    (row,) = recorded.calls()
    assert row.parameters["server_address"] == "127.0.0.1"
    # the SDK's provider, as the GenAI conventions say for an unknown server; never its prices
    assert row.provider == provider and recorded.provider_names() == [provider]
    assert (row.cost_usd, row.price_source) == (None, None)
    assert row.usage["input_tokens"] == 1000 and recorded.unpriced() == 1


def test_a_server_the_user_names_is_recorded_and_priced_as_that_provider(record, model_server):
    recorded = record({"providers": {"127.0.0.1": "groq"}})
    model_server.queue(Reply(text="Hi.", usage=Usage(1000, 50)))
    _chat(model_server, "llama-3.3-70b-versatile")
    (row,) = recorded.calls()
    assert row.provider == "groq" and recorded.provider_names() == ["groq"]
    assert row.cost_usd == pytest.approx(_price("llama-3.3-70b-versatile", "groq", row.usage))
    assert row.price_source == "genai-prices"


def test_a_prices_file_names_servers_too(record, model_server, tmp_path, monkeypatch):
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"providers": {f"127.0.0.1:{model_server.port}": "sdk"}, "models": {}}))
    monkeypatch.setenv(pricing.PRICES_ENV, str(path))
    pricing.use_prices_file(None)  # read LOOPSCOPE_PRICES again
    recorded = record(None)
    model_server.queue(Reply(text="Hi.", usage=Usage(1000, 50)))
    _messages(model_server)
    (row,) = recorded.calls()
    assert row.provider == "anthropic"
    assert row.cost_usd == pytest.approx(_price(ANTHROPIC_MODEL, "anthropic", row.usage))


def test_a_prices_file_in_toml_prices_a_call_on_every_supported_python(record, model_server, tmp_path, monkeypatch):
    """TOML is read on 3.10 too (tomli there, tomllib from 3.11; the py310 stack runs this again)."""
    path = tmp_path / "prices.toml"
    path.write_text(f'[providers]\n"127.0.0.1:{model_server.port}" = "sdk"\n\n[models.{ANTHROPIC_MODEL}]\ninput = 2.0\noutput = 10.0\n')
    monkeypatch.setenv(pricing.PRICES_ENV, str(path))
    pricing.use_prices_file(None)
    recorded = record(None)
    model_server.queue(Reply(text="Hi.", usage=Usage(1000, 50)))
    _messages(model_server)
    (row,) = recorded.calls()
    assert row.cost_usd == pytest.approx((1000 * 2.0 + 50 * 10.0) / 1_000_000)


def test_a_bad_providers_table_is_refused_where_it_is_given():
    with pytest.raises(ValueError, match="providers"):
        pricing.set_overrides({"providers": {"127.0.0.1": 3}})  # type: ignore[dict-item]


@pytest.mark.parametrize(("host", "provider"), [
    ("api.openai.com", "openai"), ("my-resource.openai.azure.com", "azure.ai.openai"), ("api.groq.com", "groq"),
    ("generativelanguage.googleapis.com", "gcp.gemini"), ("us-east5-aiplatform.googleapis.com", "gcp.vertex_ai"),
    ("api.mistral.ai", "mistral_ai"), ("openrouter.ai", "openrouter"), ("api.deepseek.com", "deepseek"),
    ("api.together.xyz", "together"), ("api.fireworks.ai", "fireworks"), ("api.x.ai", "x_ai"),
    ("api.anthropic.com", "anthropic"), ("bedrock-runtime.us-east-1.amazonaws.com", "aws.bedrock"),
    ("bedrock-runtime-fips.us-west-2.amazonaws.com", "aws.bedrock"), ("bedrock-runtime.cn-north-1.amazonaws.com.cn", "aws.bedrock"),
    # unknown: the SDK's own name
    ("127.0.0.1", "openai"), ("localhost", "openai"), ("llm.internal.example", "openai"), ("notapi.openai.com", "openai"),
    ("s3.us-east-1.amazonaws.com", "openai"), ("bedrock-runtime.example.com", "openai"),
])
def test_the_provider_of_a_server_follows_its_host(host, provider):
    assert pricing.provider_of("openai", host, 443) == provider


def test_spans_from_elsewhere_are_priced_by_their_server():
    """What `loopscope collect` and the store's writer do with a chat span's server.address."""
    now = int(datetime.now(timezone.utc).timestamp() * 1e6)
    usage = {"input_tokens": 1000, "output_tokens": 100}
    cost = lambda provider, model, server=None: pricing.price(provider, model, 1000, 100, 0, 0, now, server, 443)[0]
    assert cost("openai", "gpt-4o", "api.openai.com") == pytest.approx(_price("gpt-4o", "openai", usage))
    assert cost("openai", "gpt-4o") == pytest.approx(_price("gpt-4o", "openai", usage))  # no server said: its provider
    # an OpenAI SDK span to Groq's endpoint: Groq's prices
    assert cost("openai", "llama-3.3-70b-versatile", "api.groq.com") == pytest.approx(
        _price("llama-3.3-70b-versatile", "groq", usage))
    # a Bedrock model id at Bedrock's regional endpoint: AWS's prices
    assert cost("aws.bedrock", "anthropic.claude-3-5-sonnet-20240620-v1:0", "bedrock-runtime.us-east-1.amazonaws.com") == pytest.approx(
        _price("anthropic.claude-3-5-sonnet-20240620-v1:0", "aws", usage))
    assert cost("openai", "gpt-4o", "localhost") is None
    assert cost("openai", "gpt-4o", "10.0.0.7") is None


# -- server-tool fees ---------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_web_searches_are_priced_with_the_tokens(record, model_server, stream):
    recorded = record(STANDS_FOR)
    model_server.queue(Reply(text="Found it.", usage=Usage(2000, 300),
                             usage_extra={"server_tool_use": {"web_search_requests": 2}}))
    client = anthropic.Anthropic(base_url=model_server.anthropic_base_url, api_key="sk-test")
    kwargs: dict[str, Any] = {"model": ANTHROPIC_MODEL, "max_tokens": 400, "messages": [{"role": "user", "content": "News?"}],
                              "tools": [{"type": "web_search_20250305", "name": "web_search", "max_uses": 3}]}
    if stream:
        with client.messages.stream(**kwargs) as events:
            for _ in events:
                pass
    else:
        client.messages.create(**kwargs)
    (row,) = recorded.calls()
    tokens_only = _price(ANTHROPIC_MODEL, "anthropic", row.usage)
    assert row.cost_usd == pytest.approx(_price(ANTHROPIC_MODEL, "anthropic", row.usage, web_searches=2))
    assert row.cost_usd > tokens_only  # $10 per thousand searches on top
    assert row.provider_usage["server_tool_use"] == {"web_search_requests": 2}
    # not a token count: not in the usage
    assert "web_search_requests" not in row.usage
