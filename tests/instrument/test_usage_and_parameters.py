"""What the SDK adapters keep of a call beside its tokens: the provider's usage object whole
(``provider_usage``) and the request's parameters (``parameters``, and the span attributes the
GenAI conventions name), through the real SDKs against the fake model server."""

from __future__ import annotations

from typing import Any

import anthropic
import pydantic
import pytest

import loopscope
from fakes.model_server import Reply, Usage
from loopscope import semconv as a

MODEL = "gpt-4o-mini"
CLAUDE = "claude-3-5-haiku-20241022"
DEEPSEEK = {"prompt_cache_hit_tokens": 300, "prompt_cache_miss_tokens": 900}
OPENROUTER = {"cost": 0.00042, "is_byok": False, "cost_details": {"upstream_inference_cost": None}}


def _row(recording: Any) -> Any:
    loopscope.flush()
    (row,) = recording.store.model_calls()
    return row


def _chat_span(recording: Any) -> Any:
    (span,) = [s for s in recording.spans() if s.attributes.get(a.OPERATION) == a.OP_CHAT]
    return span


# -- provider_usage: the usage object as the provider sent it ---------------------------------------


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("extra", [DEEPSEEK, OPENROUTER], ids=["deepseek", "openrouter"])
def test_chat_keeps_the_providers_usage_whole(instrumented, server, extra, stream):
    server.queue(Reply(text="Hi.", usage=Usage(1200, 80, cached_tokens=300), usage_extra=extra))
    client = server.openai_client()
    kwargs: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "Hi?"}]}
    if stream:
        for _ in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs):
            pass
    else:
        client.chat.completions.create(**kwargs)
    reported = _row(instrumented).provider_usage
    # the provider's own fields, zeros and the total included, exactly as sent
    assert reported == {
        "prompt_tokens": 1200, "completion_tokens": 80, "total_tokens": 1280,
        "prompt_tokens_details": {"cached_tokens": 300, "cache_write_tokens": 0, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0,
                                      "rejected_prediction_tokens": 0},
        **extra,
    }
    assert _row(instrumented).usage["input_tokens"] == 1200  # the normalized figures stay as they were


def test_responses_keeps_the_providers_usage_whole(instrumented, server):
    server.queue(Reply(text="Hi.", usage=Usage(500, 40), usage_extra={"cost": 0.001}))
    server.openai_client().responses.create(model=MODEL, input="Hi?")
    assert _row(instrumented).provider_usage == {
        "input_tokens": 500, "output_tokens": 40, "total_tokens": 540,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0}, "cost": 0.001,
    }


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_keeps_the_providers_usage_whole(instrumented, server, stream):
    server.queue(Reply(text="Hi.", usage=Usage(30, 12, cached_tokens=1111),
                       usage_extra={"server_tool_use": {"web_search_requests": 1}}))
    client = anthropic.Anthropic(base_url=server.anthropic_base_url, api_key="sk-test")
    kwargs: dict[str, Any] = {"model": CLAUDE, "max_tokens": 100, "messages": [{"role": "user", "content": "Hi?"}]}
    if stream:
        with client.messages.stream(**kwargs) as events:
            for _ in events:
                pass
    else:
        client.messages.create(**kwargs)
    row = _row(instrumented)
    assert row.provider_usage == {
        "input_tokens": 30, "output_tokens": 12, "cache_read_input_tokens": 1111, "cache_creation_input_tokens": 0,
        "service_tier": "standard", "server_tool_use": {"web_search_requests": 1},
    }
    assert row.usage["input_tokens"] == 30 + 1111  # normalized: the cached ones included


# -- parameters -------------------------------------------------------------------------------------


def test_chat_parameters_are_kept(instrumented, server):
    server.queue(Reply(text='{"city": "Paris"}'))
    server.openai_client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Where?"}], parallel_tool_calls=False, logprobs=True,
        top_logprobs=2, store=True,
        response_format={"type": "json_schema", "json_schema": {"name": "Place", "strict": True, "schema": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False}}},
    )
    parameters = _row(instrumented).parameters
    assert {k: parameters.get(k) for k in ("parallel_tool_calls", "logprobs", "top_logprobs", "store", "response_format",
                                           "output_type")} == {
        "parallel_tool_calls": False, "logprobs": True, "top_logprobs": 2, "store": True,
        "response_format": {"type": "json_schema", "name": "Place", "strict": True}, "output_type": "json",
    }
    assert _chat_span(instrumented).attributes[a.OUTPUT_TYPE] == "json"


class Place(pydantic.BaseModel):
    city: str


def test_chat_parse_keeps_its_response_format(instrumented, server):
    server.queue(Reply(text='{"city": "Paris"}'))
    server.openai_client().chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": "Where?"}],
                                                  response_format=Place)
    parameters = _row(instrumented).parameters
    assert (parameters["response_format"], parameters["output_type"]) == ({"type": "json_schema", "name": "Place"}, "json")
    assert _chat_span(instrumented).attributes[a.OUTPUT_TYPE] == "json"


def test_a_plain_json_object_format_is_json_output(instrumented, server):
    server.queue(Reply(text='{"ok": true}'))
    server.openai_client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "JSON please"}],
                                                   response_format={"type": "json_object"})
    parameters = _row(instrumented).parameters
    assert (parameters["response_format"], parameters["output_type"]) == ({"type": "json_object"}, "json")


def test_responses_parameters_are_kept(instrumented, server):
    server.queue(Reply(text='{"city": "Paris"}'))
    server.openai_client().responses.create(
        model=MODEL, input="Where?", reasoning={"effort": "low", "summary": "auto"},
        include=["reasoning.encrypted_content"], store=False, parallel_tool_calls=True,
        text={"format": {"type": "json_schema", "name": "Place", "strict": True,
                         "schema": {"type": "object", "properties": {"city": {"type": "string"}}}}},
    )
    parameters = _row(instrumented).parameters
    assert {k: parameters.get(k) for k in ("reasoning", "reasoning_effort", "include", "store", "parallel_tool_calls",
                                           "response_format", "output_type")} == {
        "reasoning": {"effort": "low", "summary": "auto"}, "reasoning_effort": "low",
        "include": ["reasoning.encrypted_content"], "store": False, "parallel_tool_calls": True,
        "response_format": {"type": "json_schema", "name": "Place", "strict": True}, "output_type": "json",
    }
    attributes = _chat_span(instrumented).attributes
    assert attributes[a.OUTPUT_TYPE] == "json" and attributes["gen_ai.request.reasoning.level"] == "low"


def test_responses_parse_keeps_its_text_format(instrumented, server):
    server.queue(Reply(text='{"city": "Paris"}'))
    server.openai_client().responses.parse(model=MODEL, input="Where?", text_format=Place)
    parameters = _row(instrumented).parameters
    assert (parameters["response_format"], parameters["output_type"]) == ({"type": "json_schema", "name": "Place"}, "json")


def test_anthropic_thinking_is_kept(instrumented, server):
    server.queue(Reply(text="Hi."))
    anthropic.Anthropic(base_url=server.anthropic_base_url, api_key="sk-test").messages.create(
        model=CLAUDE, max_tokens=2000, messages=[{"role": "user", "content": "Think."}],
        thinking={"type": "enabled", "budget_tokens": 1024})
    assert _row(instrumented).parameters["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert _chat_span(instrumented).attributes["loopscope.request.thinking"] == '{"type": "enabled", "budget_tokens": 1024}'
