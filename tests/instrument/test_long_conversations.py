"""A long conversation's earlier messages are not encoded again at every call
(loopscope/instrument/_history.py), and what each call records is still exactly what it
sent: the real openai and anthropic SDKs against the fake model server, a history grown
call by call, changed in place, and replayed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from anthropic.types import TextBlock, ToolUseBlock

from fakes.model_server import Reply, ToolCall
from loopscope import semconv as a
from loopscope.instrument import _history
from loopscope.instrument import _openai_responses as responses_adapter
from loopscope.instrument import anthropic as anthropic_adapter
from loopscope.instrument import openai as openai_adapter
from recorded import spans_of

MODEL = "model-under-test"


def _openai_history(turns: int) -> list[Any]:
    history: list[Any] = [{"role": "system", "content": "Be brief. é"}]
    for i in range(turns):
        history += [
            {"role": "user", "content": f"Weather in city {i}?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"old{i}", "type": "function", "function": {"name": "weather", "arguments": json.dumps({"city": i})}}]},
            {"role": "tool", "tool_call_id": f"old{i}", "content": "sunny"},
            {"role": "assistant", "content": [{"type": "text", "text": f"Sunny in {i}."}]},
        ]
    return history


def _anthropic_history(turns: int) -> list[Any]:
    history: list[Any] = []
    for i in range(turns):
        history += [
            {"role": "user", "content": f"Weather in city {i}?"},
            # what the SDK returned, appended as it is (the usual Anthropic loop)
            {"role": "assistant", "content": [TextBlock(type="text", text="Looking."),
                                              ToolUseBlock(type="tool_use", id=f"old{i}", name="weather", input={"city": i})]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"old{i}", "content": "sunny"}]},
            {"role": "assistant", "content": f"Sunny in {i}."},
        ]
    return history


def _responses_history(turns: int) -> list[Any]:
    history: list[Any] = []
    for i in range(turns):
        history += [
            {"role": "user", "content": f"Weather in city {i}?"},
            {"type": "function_call", "call_id": f"old{i}", "name": "weather", "arguments": json.dumps({"city": i})},
            {"type": "function_call_output", "call_id": f"old{i}", "output": "sunny"},
            {"role": "assistant", "content": [{"type": "output_text", "text": f"Sunny in {i}."}]},
        ]
    return history


HISTORIES = {"chat": _openai_history, "messages": _anthropic_history, "responses": _responses_history}


def _call(server: Any, api: str, history: list[Any]) -> None:
    server.queue(Reply(text="Fine."))
    if api == "chat":
        server.openai_client().chat.completions.create(model=MODEL, messages=history)
    elif api == "responses":
        server.openai_client().responses.create(model=MODEL, input=history)
    else:
        server.anthropic_client().messages.create(model=MODEL, max_tokens=50, messages=history)


def _inputs(recording: Any) -> list[Any]:
    chats = sorted(spans_of(recording, a.OP_CHAT), key=lambda s: s.start_time)
    return [json.loads(c.attributes[a.INPUT_MESSAGES]) for c in chats]


def _three_calls(server: Any, api: str) -> list[Any]:
    """A long conversation called three times, grown between calls and, before the third,
    changed in place (a tool result shortened to save tokens, a block edited)."""
    history = HISTORIES[api](20)
    _call(server, api, history)
    history.append({"role": "user", "content": "And tomorrow?"})
    _call(server, api, history)
    if api == "chat":
        history[3]["content"] = "rain"
    elif api == "responses":
        history[2]["output"] = "rain"
        history[3]["content"][0]["text"] = "Edited."
    else:
        history[1]["content"][0].text = "Edited."
        history[2]["content"][0]["content"] = "rain"
    history.append({"role": "user", "content": "And the day after?"})
    _call(server, api, history)
    return history


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
def test_each_call_of_a_long_conversation_records_what_it_sent_even_after_a_change_in_place(api, instrumented, server, monkeypatch):
    history = _three_calls(server, api)
    adapter = {"chat": openai_adapter, "messages": anthropic_adapter, "responses": responses_adapter}[api]
    assert len(history) - 2 >= adapter._conversations.min_messages
    assert adapter._conversations._kept  # the conversation was kept, and found again by the later calls
    # the same three calls with every request encoded whole (the plain path), to compare
    monkeypatch.setattr(_history, "KEEP", False)
    _three_calls(server, api)
    recorded = _inputs(instrumented)
    assert recorded[:3] == recorded[3:]
    assert [len(r) for r in recorded[:3]] == [len(history) - 2, len(history) - 1, len(history)]
    assert "rain" in json.dumps(recorded[2]) and "rain" not in json.dumps(recorded[1])
    assert api == "chat" or ("Edited." in json.dumps(recorded[2]) and "Edited." not in json.dumps(recorded[1]))


def test_a_tool_result_inside_a_reused_history_still_ends_its_call(instrumented, server):
    # two conversations with the same content and the same call ids (a replayed script):
    # the second one's history is found kept, and its tool result must still end its call
    for _ in range(2):
        history = _openai_history(20)
        server.queue(Reply(tool_calls=[ToolCall("weather", {"city": "Lyon"}, id="same")]))
        server.openai_client().chat.completions.create(model=MODEL, messages=history)
        history += [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "same", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Lyon"}'}}]},
            {"role": "tool", "tool_call_id": "same", "content": "sunny"},
        ]
        _call(server, "chat", history)
    tools = spans_of(instrumented, a.OP_EXECUTE_TOOL)
    assert [t.attributes.get(a.TOOL_OUTCOME) for t in tools] == ["served", "served"]


def test_the_kept_conversations_are_bounded_in_number_and_characters():
    history = _history.History()
    for n in range(3 * _history.MAX_CONVERSATIONS):
        messages = [{"role": "user", "content": f"conversation {n} message {i}"} for i in range(_history.MIN_MESSAGES)]
        history.keep(messages, [json.dumps(m) for m in messages], 0, None)
    assert len(history._kept) == _history.MAX_CONVERSATIONS
    big = "x" * (_history.MAX_CHARS // 8)
    for n in range(16):
        messages = [{"role": "user", "content": f"{n} {i}"} for i in range(_history.MIN_MESSAGES)]
        history.keep(messages, [big] * len(messages), 0, None)  # each too big alone: not kept
        messages = messages[:1] + [{"role": "user", "content": f"{n}"}] * (_history.MIN_MESSAGES - 1)
        history.keep(messages, [big[: len(big) // _history.MIN_MESSAGES]] * len(messages), 0, None)
    assert history._chars == sum(k.chars for k in history._kept.values()) <= _history.MAX_CHARS
