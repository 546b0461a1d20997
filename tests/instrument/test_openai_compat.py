"""The kit's OpenAI-format reader (loopscope/instrument/_openai_compat.py): shared by the openai
adapter and every adapter of a provider that answers in that format, importable without side
effects, and reading that format's requests and answers whoever's SDK carries them."""

from __future__ import annotations

import json
import subprocess
import sys

import loopscope
from fakes.model_server import Reply, ToolCall
from loopscope.instrument._openai_compat import ChatChunks, chat_request, completion_response, finish_completion
from loopscope.recorder.adapter import server_of, start_model_call
from recorded import only_turn


def _run(code: str) -> None:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]


def test_importing_the_reader_imports_no_sdk_and_leaves_the_openai_adapter_alone():
    """A groq adapter that imported the openai adapter's functions fired the openai import hook
    while that module was half made: the openai adapter was off for the whole process."""
    _run(
        "import sys, loopscope\n"
        "adapters = sys.modules['loopscope.instrument']\n"
        "loopscope.configure(False)\n"
        "loopscope.instrument()\n"
        "import loopscope.instrument._openai_compat\n"
        "import loopscope.instrument.openai  # the adapter's own module: no SDK either\n"
        "assert 'openai' not in sys.modules, 'the reader imported the SDK'\n"
        "assert 'openai' not in adapters.active()\n"
        "import openai\n"
        "assert 'openai' in adapters.active()\n"
        "from openai.resources.chat.completions import completions\n"
        "assert hasattr(completions.Completions.create, '__wrapped__'), 'the openai adapter is off'\n"
    )


def test_the_reader_names_the_provider_by_its_server_and_reads_dicts(recording):
    """What a groq or mistral adapter hands it: the SDK's keyword arguments, its client's base
    URL; answers as dicts (or any SDK's models)."""
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    kwargs = {"model": "llama-test", "messages": [{"role": "user", "content": "Paris?"}], "tools": tools,
              "temperature": 0.1, "max_completion_tokens": 64}
    request = chat_request(kwargs, provider="groq", server=server_of("https://api.groq.com/openai/v1"))
    assert (request.provider, request.model, request.input_text) == ("groq", "llama-test", "Paris?")
    assert request.parameters == {"temperature": 0.1, "max_tokens": 64, "server_address": "api.groq.com", "server_port": None}
    call = start_model_call(request)
    finish_completion({
        "id": "chatcmpl-1", "model": "llama-test",
        "choices": [{"index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": "It is"}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 64, "prompt_tokens_details": {"cached_tokens": 8}},
    }, call)
    assert loopscope.flush()
    [row] = recording.store.model_calls()
    assert (row.provider, row.outcome, row.finish_reasons) == ("groq", "truncated", ["length"])
    assert row.usage == {"input_tokens": 12, "output_tokens": 64, "cache_read_input_tokens": 8}
    assert only_turn(recording.store).loop_end_reason == "truncated"


def test_an_adapter_finishes_the_call_with_its_own_figures_beside_the_readers(recording):
    """completion_response is what finish_completion records: an adapter whose library adds
    figures of its own (LiteLLM's cost) sets them on it and finishes the call with it."""
    request = chat_request({"model": "m", "messages": [{"role": "user", "content": "Paris?"}]}, provider="litellm")
    call = start_model_call(request)
    response = completion_response({
        "id": "chatcmpl-2", "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Sunny."}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 0}},
    })
    assert response.provider_usage is not None and response.provider_usage.endswith("}")
    response.provider_usage = response.provider_usage[:-1] + ',"litellm_response_cost":0.25}'
    call.finish(response)
    assert loopscope.flush()
    [row] = recording.store.model_calls()
    assert (row.outcome, row.usage) == ("completed", {"input_tokens": 12, "output_tokens": 3, "cache_read_input_tokens": 0})
    _, [(figures,)] = recording.store.sql("SELECT provider_usage FROM model_calls")
    assert json.loads(figures) == {"prompt_tokens": 12, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 0},
                                   "litellm_response_cost": 0.25}


def test_the_reader_accumulates_chunks_of_any_sdk_as_dicts(recording):
    chunks = [
        {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"content": "Che"}}]},
        {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "call_1", "function": {"name": "weather", "arguments": '{"ci'}}]}}]},
        {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": 'ty": "Paris"}'}}]}, "finish_reason": "tool_calls"}]},
        {"id": "c1", "model": "m", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 7}},
    ]
    request = chat_request({"model": "m", "messages": [{"role": "user", "content": "Paris?"}], "stream": True},
                           provider="mistral", server=server_of("https://api.mistral.ai/v1"))
    call = start_model_call(request)
    accumulator = ChatChunks()
    for chunk in chunks:
        accumulator.add(accumulator.capture(chunk), call)
    accumulator.finish(call)
    assert loopscope.flush()
    [row] = recording.store.model_calls()
    assert (row.provider, row.outcome, row.usage) == ("mistral_ai", "completed", {"input_tokens": 5, "output_tokens": 7})
    # the turn waits for the call's result (no summary yet); the call was asked for whole
    [start] = [e.content for e in recording.store.get_timeline(row.session_id) if e.type == "tool_call_start"]
    assert (start.tool_name, start.tool_id, start.arguments) == ("weather", "call_1", {"city": "Paris"})


def test_the_openai_adapter_reads_through_the_shared_reader(instrumented, server):
    """The real openai SDK against the fake server: a two-round tool loop is one turn, its
    results paired by id, its usage and finish reasons through the kit."""
    server.queue(Reply(text="Looking.", tool_calls=[ToolCall("weather", {"city": "Paris"}, id="call_p")]), Reply(text="21 °C."))
    client = server.openai_client(api_key="sk-test")
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    first = client.chat.completions.create(model="gpt-test-1", messages=messages, tools=tools)
    call = first.choices[0].message.tool_calls[0]
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "21 °C"}]
    client.chat.completions.create(model="gpt-test-1", messages=messages, tools=tools)
    assert loopscope.flush()
    turn = only_turn(instrumented.store)
    assert (turn.loop_end_reason, turn.tool_calls_count, turn.response_content) == ("completed", 1, "Looking.\n\n21 °C.")
    assert [c.outcome for c in instrumented.store.model_calls(turn.session_id)] == ["completed", "completed"]
