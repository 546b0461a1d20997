"""Every model call a row: ``model_calls`` filled from each ``chat`` span's end, through the
real SDKs against the fake model server (openai chat and responses, anthropic; sync, async,
stream) and through spans carrying the issue's attributes explicitly; its cost from
genai-prices or the user's overrides; ``Store.model_calls``; resent spans; the content policy."""

from __future__ import annotations

import asyncio
import importlib
import json
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from genai_prices import Usage as PriceUsage
from genai_prices import calc_price
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.trace import Status, StatusCode

import loopscope
from fakes.model_server import STANDS_FOR, Reply, ToolCall, Usage
from loopscope import pricing
from loopscope import semconv as a
from loopscope.content.policy import ContentPolicy
from loopscope.ingest.spans import OWN_SCOPE
from loopscope.ingest.writer import SPANS
from loopscope.storage.duckdb.connection import open_store
from loopscope.storage.queries import open_sink
from loopscope.storage.rows import END

OPENAI_MODEL = "gpt-4o-mini"
ANTHROPIC_MODEL = "claude-3-5-haiku-20241022"
USAGE = Usage(1200, 80, cached_tokens=200)


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[TracerProvider]:
    """A pipeline writing ``store.duckdb``; spans made on the provider's loopscope tracer are
    loopscope's own (the hand-made ones carry the issue's attributes explicitly)."""
    tracer_provider = TracerProvider()
    loopscope.configure(tmp_path / "store.duckdb", tracer_provider=tracer_provider, flush_interval=0.05, capture_content=True,
                        prices=STANDS_FOR)
    loopscope.instrument()
    try:
        yield tracer_provider
    finally:
        loopscope.uninstrument()
        loopscope.shutdown()
        pricing.set_overrides(None)
        pricing.use_prices_file(None)


def store(tmp_path: Path) -> loopscope.Store:
    return loopscope.Store(str(tmp_path / "store.duckdb"))


def genai_price(model: str, provider: str, usage: dict[str, int]) -> float:
    return float(calc_price(
        PriceUsage(input_tokens=usage.get("input_tokens", 0), output_tokens=usage.get("output_tokens", 0),
                   cache_read_tokens=usage.get("cache_read_input_tokens", 0),
                   cache_write_tokens=usage.get("cache_creation_input_tokens", 0)),
        model, provider_id=provider,
    ).total_price)


# -- the real SDKs ------------------------------------------------------------------------------------


def _openai_chat(server: Any, mode: str) -> None:
    kwargs: dict[str, Any] = {"model": OPENAI_MODEL, "messages": [{"role": "user", "content": "Hello?"}],
                              "temperature": 0.25, "max_tokens": 300, "seed": 7}
    if mode == "sync":
        server.openai_client().chat.completions.create(**kwargs)
    elif mode == "stream":
        for _ in server.openai_client().chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs):
            pass
    else:
        async def run() -> None:
            client = openai.AsyncOpenAI(base_url=server.openai_base_url, api_key="sk-test")
            await client.chat.completions.create(**kwargs)
            await client.close()
        asyncio.run(run())


def _openai_responses(server: Any, mode: str) -> None:
    kwargs: dict[str, Any] = {"model": OPENAI_MODEL, "input": "Hello?", "temperature": 0.25, "max_output_tokens": 300}
    if mode == "sync":
        server.openai_client().responses.create(**kwargs)
    elif mode == "stream":
        for _ in server.openai_client().responses.create(stream=True, **kwargs):
            pass
    else:
        async def run() -> None:
            client = openai.AsyncOpenAI(base_url=server.openai_base_url, api_key="sk-test")
            await client.responses.create(**kwargs)
            await client.close()
        asyncio.run(run())


def _anthropic(server: Any, mode: str) -> None:
    kwargs: dict[str, Any] = {"model": ANTHROPIC_MODEL, "messages": [{"role": "user", "content": "Hello?"}], "max_tokens": 300}
    if mode == "sync":
        anthropic.Anthropic(base_url=server.anthropic_base_url, api_key="sk-test").messages.create(**kwargs)
    elif mode == "stream":
        with anthropic.Anthropic(base_url=server.anthropic_base_url, api_key="sk-test").messages.stream(**kwargs) as s:
            for _ in s:
                pass
    else:
        async def run() -> None:
            client = anthropic.AsyncAnthropic(base_url=server.anthropic_base_url, api_key="sk-test")
            await client.messages.create(**kwargs)
            await client.close()
        asyncio.run(run())


SDKS = {"openai-chat": (_openai_chat, "openai", OPENAI_MODEL), "openai-responses": (_openai_responses, "openai", OPENAI_MODEL),
        "anthropic": (_anthropic, "anthropic", ANTHROPIC_MODEL)}


@pytest.mark.parametrize("mode", ["sync", "async", "stream"])
@pytest.mark.parametrize("sdk", sorted(SDKS))
def test_a_real_sdk_call_is_one_row_with_its_details_and_cost(tmp_path, provider, model_server, sdk, mode):
    call, provider_name, model = SDKS[sdk]
    model_server.queue(Reply(text="Hi there.", usage=USAGE))
    before = datetime.now(timezone.utc)
    with loopscope.session("calls"):
        call(model_server, mode)
    loopscope.flush()
    (row,) = store(tmp_path).model_calls(with_messages=True)
    (turn,) = store(tmp_path).list_turns()
    assert (row.session_id, row.correlation_id, row.position) == ("calls", turn.correlation_id, 1)
    assert (row.provider, row.request_model, row.response_model, row.model) == (provider_name, model, model, model)
    assert row.response_id
    assert row.finish_reasons and row.outcome == "completed"
    assert row.streaming is (mode == "stream")
    assert before <= row.started_at <= row.ended_at
    assert row.duration_ms == pytest.approx((row.ended_at - row.started_at).total_seconds() * 1000, abs=0.01)
    if mode == "stream":
        assert 0 < row.time_to_first_chunk_ms <= row.duration_ms
    assert row.usage["input_tokens"] >= 1000 and row.usage["output_tokens"] == 80
    assert row.parameters["server_address"] == "127.0.0.1"
    assert row.parameters["max_tokens" if sdk == "anthropic" else "temperature"] == (300 if sdk == "anthropic" else 0.25)
    assert row.cost_usd == pytest.approx(genai_price(model, provider_name, row.usage))
    assert row.cost_usd > 0 and row.price_source == "genai-prices"
    assert (row.error_type, row.error, row.refusal) == (None, None, None)
    assert "Hi there." in json.dumps(row.output_messages)
    assert row.span_id and row.trace_id


@pytest.mark.parametrize("sdk", sorted(SDKS))
def test_the_first_chunk_never_comes_after_the_whole_call_when_starting_the_span_is_slow(tmp_path, provider, model_server,
                                                                                         monkeypatch, sdk):
    """The time to first chunk counts from the span's start: a start delayed by a busy machine (here
    50 ms inside starting the span, as a GIL held by another thread would) moves both or neither."""
    turn_module = importlib.import_module("loopscope.recorder.turn")
    original = turn_module.start_span

    def slow_start(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.05)
        return original(*args, **kwargs)

    monkeypatch.setattr(turn_module, "start_span", slow_start)
    call, _, _ = SDKS[sdk]
    model_server.queue(Reply(text="Hi there.", usage=USAGE))
    with loopscope.session("slow-start"):
        call(model_server, "stream")
    loopscope.flush()
    (row,) = store(tmp_path).model_calls()
    assert 0 < row.time_to_first_chunk_ms <= row.duration_ms


def test_a_tool_loop_numbers_its_calls_and_its_turn_costs_their_sum(tmp_path, provider, model_server):
    model_server.queue(
        Reply(text="Let me look.", tool_calls=[ToolCall("weather", {"city": "Lyon"}, id="call_1")], usage=Usage(400, 20)),
        Reply(text="Lyon: 21 °C.", usage=Usage(500, 10, cached_tokens=400)),
    )
    client = model_server.openai_client()
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {}}}}]
    with loopscope.session("loop"):
        history: list[Any] = [{"role": "user", "content": "Weather in Lyon?"}]
        first = client.chat.completions.create(model=OPENAI_MODEL, messages=history, tools=tools, tool_choice="auto")
        history.append(first.choices[0].message.model_dump(exclude_none=True))
        history.append({"role": "tool", "tool_call_id": "call_1", "content": "21 °C"})
        client.chat.completions.create(model=OPENAI_MODEL, messages=history, tools=tools)
    loopscope.flush()
    calls = store(tmp_path).model_calls("loop")
    assert [(c.position, c.finish_reasons) for c in calls] == [(1, ["tool_calls"]), (2, ["stop"])]
    assert len({c.correlation_id for c in calls}) == 1
    _, rows = store(tmp_path).sql(
        "SELECT model_calls, cost_usd, unpriced_calls FROM turn_summaries WHERE session_id = 'loop'")
    assert rows == [(2, pytest.approx(sum(c.cost_usd for c in calls)), 0)]
    _, costs = store(tmp_path).sql("SELECT cost_usd, model_calls, unpriced_calls FROM session_costs WHERE session_id = 'loop'")
    assert costs == [(pytest.approx(sum(c.cost_usd for c in calls)), 2, 0)]


def test_a_failed_call_is_a_row_with_its_error(tmp_path, provider, model_server):
    model_server.queue(Reply.error(400, "the prompt is too long"))
    with loopscope.session("fail"), pytest.raises(openai.BadRequestError):
        model_server.openai_client().chat.completions.create(model=OPENAI_MODEL, messages=[{"role": "user", "content": "x"}])
    loopscope.flush()
    (row,) = store(tmp_path).model_calls(failed=True)
    assert row.outcome == "error" and row.error_type and "too long" in (row.error or "")
    assert row.cost_usd is None  # no usage: nothing to price, and no "call without a price" either
    _, rows = store(tmp_path).sql("SELECT unpriced FROM model_call_summaries")
    assert rows == [(False,)]


# -- spans with the attributes (what the recorder is to emit) -----------------------------------


def _chat_span(tracer_provider: TracerProvider, attributes: dict[str, Any], *, error: str | None = None,
               duration: float = 0.01) -> None:
    tracer = tracer_provider.get_tracer(OWN_SCOPE)
    start = time.time_ns()
    span = tracer.start_span("chat m", attributes={a.OPERATION: a.OP_CHAT, **attributes}, start_time=start)
    time.sleep(duration)  # the spans follow each other in time, as calls do
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, error))
    # lasting exactly ``duration``: a loaded machine's late wake-up must not reorder the slowest calls
    span.end(end_time=start + round(duration * 1e9))


EXPLICIT = {
    a.CONVERSATION_ID: "explicit", a.TURN_ID: "turn-x", a.AGENT_NAME: "agent-x", a.FRAMEWORK: "hand",
    a.PROVIDER: "anthropic", a.REQUEST_MODEL: ANTHROPIC_MODEL, a.RESPONSE_MODEL: ANTHROPIC_MODEL + "-v2",
    a.RESPONSE_ID: "msg_1", a.RESPONSE_FINISH_REASONS: ("refusal", "stop"), a.REQUEST_STREAM: True,
    a.CALL_POSITION: 3, a.CALL_OUTCOME: "refusal", a.CALL_REFUSAL: "I can't help with that.",
    a.TIME_TO_FIRST_CHUNK: 0.125, a.USAGE_INPUT: 1529, a.USAGE_OUTPUT: 40, a.USAGE_CACHE_READ: 1111,
    a.USAGE_CACHE_CREATION: 418, a.USAGE_REASONING: 12,
    a.USAGE_PROVIDER: json.dumps({"input_tokens": 0, "cache_read_input_tokens": 1111, "cache_creation_input_tokens": 418}),
    "gen_ai.request.temperature": 0.5, "gen_ai.request.top_p": 0.9, "gen_ai.request.max_tokens": 64,
    "gen_ai.request.choice.count": 2, "gen_ai.request.stop_sequences": ("END",), a.REQUEST_TOOL_CHOICE: "required",
    "gen_ai.request.frequency_penalty": 0.1, "server.address": "api.anthropic.com", "server.port": 443,
    a.INPUT_MESSAGES: json.dumps([{"role": "user", "parts": [{"type": "text", "content": "do the thing"}]}]),
    a.OUTPUT_MESSAGES: json.dumps([{"role": "assistant", "parts": [], "finish_reason": "refusal"},
                                   {"role": "assistant", "parts": [{"type": "text", "content": "ok"}], "finish_reason": "stop"}]),
}


def test_every_column_from_a_span_with_the_new_attributes(tmp_path, provider):
    _chat_span(provider, EXPLICIT)
    _chat_span(provider, {**EXPLICIT, a.CALL_POSITION: 4, a.CALL_OUTCOME: "error", a.ERROR_TYPE: "APIError",
                          a.CALL_ERROR: "overloaded: try later", a.RESPONSE_ID: "msg_2"}, error="HTTP 200 with an error body")
    loopscope.flush()
    first, second = store(tmp_path).model_calls("explicit", with_messages=True)
    assert first.model_dump() == {
        "session_id": "explicit", "correlation_id": "turn-x", "position": 3, "agent": "agent-x", "provider": "anthropic",
        "framework": "hand", "model": ANTHROPIC_MODEL + "-v2", "request_model": ANTHROPIC_MODEL,
        "response_model": ANTHROPIC_MODEL + "-v2", "response_id": "msg_1", "finish_reasons": ["refusal", "stop"],
        "outcome": "refusal", "streaming": True, "started_at": first.started_at, "ended_at": first.ended_at,
        "duration_ms": first.duration_ms, "time_to_first_chunk_ms": 125.0,
        "usage": {"input_tokens": 1529, "output_tokens": 40, "cache_read_input_tokens": 1111,
                  "cache_creation_input_tokens": 418, "reasoning_tokens": 12},
        "provider_usage": {"input_tokens": 0, "cache_read_input_tokens": 1111, "cache_creation_input_tokens": 418},
        "parameters": {"temperature": 0.5, "top_p": 0.9, "max_tokens": 64, "choice_count": 2, "stop": ["END"],
                       "tool_choice": "required", "frequency_penalty": 0.1, "server_address": "api.anthropic.com",
                       "server_port": 443},
        # priced as the model that answered (genai-prices matches its name)
        "cost_usd": pytest.approx(genai_price(ANTHROPIC_MODEL + "-v2", "anthropic", {
            "input_tokens": 1529, "output_tokens": 40, "cache_read_input_tokens": 1111, "cache_creation_input_tokens": 418})),
        "price_source": "genai-prices", "error_type": None, "error": None, "refusal": "I can't help with that.",
        "input_messages": json.loads(EXPLICIT[a.INPUT_MESSAGES]), "output_messages": json.loads(EXPLICIT[a.OUTPUT_MESSAGES]),
        "trace_id": first.trace_id, "span_id": first.span_id,
    }
    assert first.duration_ms >= 10 and first.started_at < first.ended_at
    # loopscope.call.error says what the status could not; error.type beside it
    assert (second.position, second.outcome, second.error_type, second.error) == (4, "error", "APIError", "overloaded: try later")
    assert [c.span_id for c in store(tmp_path).model_calls(failed=True)] == [second.span_id]


def test_without_a_position_the_view_numbers_calls_by_start_time(tmp_path, provider):
    for response_id in ("r1", "r2", "r3"):
        _chat_span(provider, {a.CONVERSATION_ID: "s", a.TURN_ID: "t", a.REQUEST_MODEL: "m", a.RESPONSE_ID: response_id},
                   duration=0.002)
    _chat_span(provider, {a.CONVERSATION_ID: "s", a.TURN_ID: "other", a.RESPONSE_ID: "r4"})
    loopscope.flush()
    calls = store(tmp_path).model_calls("s")
    assert [(c.response_id, c.position) for c in calls] == [("r1", 1), ("r2", 2), ("r3", 3), ("r4", 1)]


# -- cost -------------------------------------------------------------------------------------------


def test_an_unknown_model_costs_null_and_is_counted_never_guessed(tmp_path, provider):
    usage = {a.USAGE_INPUT: 100, a.USAGE_OUTPUT: 10}
    _chat_span(provider, {a.CONVERSATION_ID: "u", a.TURN_ID: "t", a.PROVIDER: "openai", a.REQUEST_MODEL: "gpt-4o", **usage})
    # a self-hosted server whose model has a known model's name: not priced as that model
    _chat_span(provider, {a.CONVERSATION_ID: "u", a.TURN_ID: "t", a.PROVIDER: "vllm", a.REQUEST_MODEL: "gpt-4o", **usage})
    _chat_span(provider, {a.CONVERSATION_ID: "u", a.TURN_ID: "t", a.PROVIDER: "openai", a.REQUEST_MODEL: "no-such-model-9", **usage})
    loopscope.flush()
    calls = store(tmp_path).model_calls("u")
    assert [(c.cost_usd is not None, c.price_source) for c in calls] == [(True, "genai-prices"), (False, None), (False, None)]
    _, rows = store(tmp_path).sql("SELECT count(*) FILTER (WHERE unpriced), sum(cost_usd) FROM model_call_summaries")
    assert rows == [(2, calls[0].cost_usd)]
    _, usage_rows = store(tmp_path).sql("SELECT provider, model, unpriced_calls FROM model_usage ORDER BY provider, model")
    assert usage_rows == [("openai", "gpt-4o", 0), ("openai", "no-such-model-9", 1), ("vllm", "gpt-4o", 1)]


def test_overrides_win_over_genai_prices_from_configure_and_from_a_file(tmp_path, provider, monkeypatch):
    usage = {a.USAGE_INPUT: 2_000_000, a.USAGE_OUTPUT: 1_000_000, a.USAGE_CACHE_READ: 1_000_000}
    prices_file = tmp_path / "prices.toml"
    prices_file.write_text('[models."my-llama"]\ninput = 0.5\noutput = 2.0\ncache_read = 0.1\n', encoding="utf-8")
    monkeypatch.setenv(pricing.PRICES_ENV, str(prices_file))
    pricing.use_prices_file(None)  # read LOOPSCOPE_PRICES again
    loopscope.configure(tmp_path / "store.duckdb", tracer_provider=provider, flush_interval=0.05,
                        prices={"gpt-4o": {"input": 1.0, "output": 3.0}})
    _chat_span(provider, {a.CONVERSATION_ID: "o", a.PROVIDER: "vllm", a.REQUEST_MODEL: "my-llama", **usage})
    _chat_span(provider, {a.CONVERSATION_ID: "o", a.PROVIDER: "openai", a.REQUEST_MODEL: "gpt-4o", **usage})
    loopscope.flush()
    llama, gpt = store(tmp_path).model_calls("o")
    # 1 M uncached input at 0.5 + 1 M cached at 0.1 + 1 M output at 2.0
    assert (llama.cost_usd, llama.price_source) == (pytest.approx(2.6), "override")
    # the cache read costs the input price where the override names none
    assert (gpt.cost_usd, gpt.price_source) == (pytest.approx(5.0), "override")


def test_bad_price_overrides_are_refused_where_they_are_given(tmp_path):
    with pytest.raises(ValueError, match="input and output are required"):
        loopscope.configure(tmp_path / "s.duckdb", tracer_provider=TracerProvider(), prices={"m": {"input": 1.0}})
    with pytest.raises(ValueError, match="unknown key"):
        pricing.set_overrides({"m": {"input": 1.0, "output": 1.0, "inptu": 2.0}})
    loopscope.shutdown()


def test_pricing_follows_genai_prices_exactly_and_is_cached_per_model_and_day():
    now = int(time.time() * 1e6)
    for provider_name, model in [("openai", "gpt-4o"), ("anthropic", "claude-sonnet-4-20250514"), ("gcp.gemini", "gemini-2.5-pro")]:
        for usage in [(1000, 100, 0, 0), (300_000, 2000, 1000, 500), (5, 5, 5, 0)]:
            cost, source = pricing.price(provider_name, model, *usage, now)
            reference = genai_price(model, pricing._PROVIDER_IDS.get(provider_name, provider_name), dict(zip(
                ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"), usage)))
            assert (cost, source) == (pytest.approx(reference, rel=1e-12), "genai-prices")
    assert ("openai", "gpt-4o", now // 86_400_000_000) in pricing._cache


# -- the store's ways ---------------------------------------------------------------------------------


def test_a_resent_span_adds_no_second_row(tmp_path, provider):
    captured: list[Any] = []

    class Keep(SpanProcessor):
        def on_end(self, span: Any) -> None:
            captured.append(span)

    provider.add_span_processor(Keep())
    _chat_span(provider, {a.CONVERSATION_ID: "again", a.REQUEST_MODEL: "gpt-4o", a.USAGE_INPUT: 5})
    loopscope.flush()
    writer = open_sink(str(tmp_path / "store.duckdb"), mapping=SPANS, skip_stored=True, flush_interval=0.05)
    try:
        for _ in range(2):
            writer.submit(END, captured[0])
            assert writer.flush()
    finally:
        writer.close()
    assert len(store(tmp_path).model_calls("again")) == 1
    assert writer.already_stored == 2


def test_messages_go_through_the_content_policy(tmp_path):
    """Secrets masked in the messages (JSON stays JSON), a refusal cut to the store's cap."""
    tracer_provider = TracerProvider()
    loopscope.configure(tmp_path / "store.duckdb", tracer_provider=tracer_provider, flush_interval=0.05,
                        content_policy=ContentPolicy(store_max_chars=200))
    try:
        secret = "sk-proj-" + "a1B2c3D4e5" * 4
        _chat_span(tracer_provider, {
            a.CONVERSATION_ID: "p", a.INPUT_MESSAGES: json.dumps([{"role": "user", "parts": [{"type": "text", "content": f"key {secret}"}]}]),
            a.OUTPUT_MESSAGES: json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": "fine"}]}]),
            a.CALL_REFUSAL: "x" * 300,
        })
        loopscope.flush()
        (row,) = store(tmp_path).model_calls("p", with_messages=True)
    finally:
        loopscope.shutdown()
    (message,) = row.input_messages
    text = message["parts"][0]["content"]
    assert secret not in text and text.startswith("key ") and "REDACTED" in text
    assert row.output_messages == [{"role": "assistant", "parts": [{"type": "text", "content": "fine"}]}]
    assert row.refusal is not None and len(row.refusal) < 300 and row.refusal.startswith("x" * 150)


def test_filters_and_the_slowest_calls(tmp_path, provider):
    for i, (provider_name, model, pause) in enumerate([("openai", "gpt-4o", 0.03), ("anthropic", "claude-3-5-haiku-20241022", 0.001),
                                                       ("openai", "gpt-4o-mini", 0.015)]):
        _chat_span(provider, {a.CONVERSATION_ID: f"f{i % 2}", a.PROVIDER: provider_name, a.REQUEST_MODEL: model}, duration=pause)
    loopscope.flush()
    s = store(tmp_path)
    assert [c.model for c in s.model_calls(slowest=True)] == ["gpt-4o", "gpt-4o-mini", "claude-3-5-haiku-20241022"]
    assert [c.model for c in s.model_calls(slowest=True, limit=1)] == ["gpt-4o"]
    assert [c.model for c in s.model_calls(provider="openai")] == ["gpt-4o", "gpt-4o-mini"]
    assert [c.model for c in s.model_calls(model="gpt-4o-mini")] == ["gpt-4o-mini"]
    assert [c.model for c in s.model_calls("f0")] == ["gpt-4o", "gpt-4o-mini"]
    assert [c.model for c in s.model_calls(limit=2)] == ["claude-3-5-haiku-20241022", "gpt-4o-mini"]  # the most recent, oldest first
    assert asyncio.run(loopscope.AsyncStore(s.path).model_calls("f1")) == s.model_calls("f1")


def test_a_turn_without_call_rows_is_priced_from_its_own_usage(tmp_path):
    """A turn whose calls left no rows (a foreign turn, a writer from before model calls):
    its cost comes from its usage and model."""
    db = tmp_path / "store.duckdb"
    loopscope.configure(db, tracer_provider=TracerProvider(), flush_interval=0.05)
    try:
        with loopscope.turn(session_id="own", model="gpt-4o", provider="openai") as t:
            t.set_summary(usage={"input_tokens": 1000, "output_tokens": 100})
        loopscope.flush()
    finally:
        loopscope.shutdown()
    _, rows = loopscope.Store(str(db)).sql("SELECT model_calls, cost_usd, unpriced_calls FROM turn_summaries")
    assert rows == [(0, pytest.approx(genai_price("gpt-4o", "openai", {"input_tokens": 1000, "output_tokens": 100})), 0)]
    with open_store(str(db.resolve()), read_only=True) as con:
        assert con.execute("SELECT price_source FROM turns").fetchall() == [("genai-prices",)]


def test_the_turns_model_call_count_comes_from_its_span_else_from_its_call_rows(tmp_path, provider):
    tracer = provider.get_tracer(OWN_SCOPE)
    for turn_id, count in (("said", 3), ("counted", None)):
        attributes = {a.OPERATION: a.OP_INVOKE_AGENT, a.CONVERSATION_ID: "n", a.TURN_ID: turn_id}
        if count is not None:
            attributes[a.MODEL_CALL_COUNT] = count
        with tracer.start_as_current_span("invoke_agent", attributes=attributes):
            for _ in range(2):
                _chat_span(provider, {a.CONVERSATION_ID: "n", a.TURN_ID: turn_id}, duration=0)
    loopscope.flush()
    _, rows = store(tmp_path).sql("SELECT turn_id, model_calls FROM turn_summaries ORDER BY turn_id")
    assert rows == [("counted", 2), ("said", 3)]
    with open_store(str((tmp_path / "store.duckdb").resolve()), read_only=True) as con:
        assert con.execute("SELECT correlation_id, model_call_count FROM turns ORDER BY 1").fetchall() == [
            ("counted", None), ("said", 3)]
