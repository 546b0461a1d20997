"""With content on, every span carries its content in the GenAI conventions' message schema
(issue 18): ``gen_ai.input.messages`` on ``chat`` and ``invoke_agent`` spans, output
messages each with a ``finish_reason`` (required there; backends such as Phoenix drop a
message without one), ``gen_ai.system_instructions`` for a system prompt given apart from
the messages, ``gen_ai.tool.definitions``. The real SDKs against the fake model server,
and the hand API."""

from __future__ import annotations

import json
from typing import Any

import pytest

import loopscope
from fakes.model_server import Reply, ToolCall
from loopscope import semconv as a
from recorded import spans_of

MODEL = "model-under-test"


def _by_start(recording: Any, operation: str) -> list[Any]:
    return sorted(spans_of(recording, operation), key=lambda s: s.start_time)


def _json(span: Any, attribute: str) -> Any:
    value = span.attributes.get(attribute)
    return None if value is None else json.loads(value)


@pytest.mark.parametrize("api", ["responses", "messages"])
def test_a_system_prompt_given_apart_is_the_system_instructions(api, instrumented, server):
    server.queue(Reply(text="Hi."))
    if api == "responses":
        server.openai_client().responses.create(model=MODEL, instructions="Be brief.", input="hello")
    else:
        server.anthropic_client().messages.create(model=MODEL, max_tokens=50, system="Be brief.",
                                                  messages=[{"role": "user", "content": "hello"}])
    [chat] = spans_of(instrumented, a.OP_CHAT)
    assert _json(chat, a.SYSTEM_INSTRUCTIONS) == [{"type": "text", "content": "Be brief."}]
    assert _json(chat, a.INPUT_MESSAGES) == [{"role": "user", "parts": [{"type": "text", "content": "hello"}]}]
    assert a.SYSTEM_INSTRUCTIONS not in json.loads(loopscope.Store(str(instrumented.db)).model_calls(with_messages=True)[0].model_dump_json())


def test_a_system_message_in_the_history_stays_among_the_input_messages(instrumented, server):
    server.queue(Reply(text="Hi."))
    server.openai_client().chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}])
    [chat] = spans_of(instrumented, a.OP_CHAT)
    assert a.SYSTEM_INSTRUCTIONS not in chat.attributes  # part of the chat history, as the conventions say
    assert [m["role"] for m in _json(chat, a.INPUT_MESSAGES)] == ["system", "user"]


def test_an_sdk_loops_agent_span_carries_its_input_and_its_answer(instrumented, server):
    server.queue(Reply(tool_calls=[ToolCall("weather", {"city": "Lyon"}, id="w1")]), Reply(text="Sunny."))
    client = server.openai_client()
    tools = [{"type": "function", "function": {"name": "weather", "description": "Weather", "parameters": {"type": "object"}}}]
    history: list[Any] = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Lyon?"}]
    first = client.chat.completions.create(model=MODEL, messages=history, tools=tools)
    history.append(first.choices[0].message.model_dump(exclude_none=True))
    history.append({"role": "tool", "tool_call_id": "w1", "content": "sunny"})
    client.chat.completions.create(model=MODEL, messages=history, tools=tools)
    chats = _by_start(instrumented, a.OP_CHAT)
    [agent] = spans_of(instrumented, a.OP_INVOKE_AGENT)
    # the agent was given what its first call was given: the history it started from
    assert _json(agent, a.INPUT_MESSAGES) == _json(chats[0], a.INPUT_MESSAGES)
    assert _json(agent, a.OUTPUT_MESSAGES) == [{"role": "assistant", "parts": [{"type": "text", "content": "Sunny."}], "finish_reason": "stop"}]
    assert [m["finish_reason"] for c in chats for m in _json(c, a.OUTPUT_MESSAGES)] == ["tool_calls", "stop"]
    assert all(_json(c, a.TOOL_DEFINITIONS)[0]["name"] == "weather" for c in chats)


def test_hand_rounds_carry_what_they_were_given_and_why_they_stopped(recording):
    @loopscope.tool
    def add(x: int, y: int) -> int:
        return x + y

    with loopscope.turn(session_id="hand", agent="calc", input="What is 1 + 2?") as t:
        t.generation("", tool_calls=[{"id": "a1", "name": "add", "arguments": {"x": 1, "y": 2}}])  # no finish reason
        add(1, 2)
        t.generation("3")
    first, second = _by_start(recording, a.OP_CHAT)
    user = {"role": "user", "parts": [{"type": "text", "content": "What is 1 + 2?"}]}
    asked = {"role": "assistant", "parts": [{"type": "tool_call", "id": "a1", "name": "add", "arguments": {"x": 1, "y": 2}}]}
    assert _json(first, a.INPUT_MESSAGES) == [user]
    assert _json(first, a.OUTPUT_MESSAGES) == [{**asked, "finish_reason": "tool_call"}]
    assert _json(second, a.INPUT_MESSAGES) == [user, asked, {"role": "tool", "parts": [{"type": "tool_call_response", "id": "a1", "response": 3}]}]
    assert _json(second, a.OUTPUT_MESSAGES) == [{"role": "assistant", "parts": [{"type": "text", "content": "3"}], "finish_reason": "stop"}]
    [agent] = spans_of(recording, a.OP_INVOKE_AGENT)
    assert _json(agent, a.INPUT_MESSAGES) == [user]
    assert _json(agent, a.OUTPUT_MESSAGES) == [{"role": "assistant", "parts": [{"type": "text", "content": "3"}], "finish_reason": "stop"}]


@pytest.mark.parametrize(("how", "reason"), [("max_rounds", "max_rounds"), ("length", "length"), ("error", "error")])
def test_a_turns_answer_says_why_the_loop_ended(recording, how, reason):
    try:
        with loopscope.turn(session_id="why", agent="a", input="go") as t:
            t.generation("partial", finish_reason="length" if how == "length" else "stop")
            if how == "max_rounds":
                t.end("max_rounds")
            elif how == "error":
                raise RuntimeError("boom")
    except RuntimeError:
        pass
    [agent] = spans_of(recording, a.OP_INVOKE_AGENT)
    assert [m["finish_reason"] for m in _json(agent, a.OUTPUT_MESSAGES)] == [reason]
