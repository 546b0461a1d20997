"""Conversations found on their own (on in zero-code mode): a stitched turn whose request
continues an ended stitched turn's conversation joins its session. The real SDKs against
the fake server; ``tests/zero_code/test_run_conversations.py`` runs it under ``loopscope run``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

import loopscope
from fakes.model_server import Reply, ToolCall
from loopscope.recorder import settings
from loopscope.recorder.conversations import Conversations, boundary, conversations


@pytest.fixture
def finding(recording) -> Iterator[Any]:
    """Recording with every adapter on and conversations looked for, as ``loopscope run`` does."""
    loopscope.instrument()
    settings.find_conversations = True
    conversations.clear()
    try:
        yield recording
    finally:
        settings.find_conversations = False
        conversations.clear()
        loopscope.uninstrument()


def _sessions(store: Any) -> list[list[str]]:
    """Each session's turn answers, in order; sessions in the order of their first turn."""
    assert loopscope.flush()
    out = []
    for session in store.list_sessions():
        turns = sorted(store.list_turns(session.session_id), key=lambda t: t.timestamp)
        out.append((turns[0].timestamp, [t.response_content for t in turns]))
    return [answers for _, answers in sorted(out)]


def test_anthropic_turns_of_one_conversation_share_a_session(finding, server):
    server.queue(
        Reply(text="Let me look.", tool_calls=[ToolCall("weather", {"city": "Oslo"})]),
        Reply(text="Cold."),
        Reply(text="Colder."),
    )
    client = server.anthropic_client()
    tools = [{"name": "weather", "input_schema": {"type": "object"}}]
    messages: list[Any] = [{"role": "user", "content": "Oslo?"}]
    for follow_up in ("And tomorrow?", None):
        while True:
            answer = client.messages.create(model="claude-test", max_tokens=100, messages=messages, tools=tools)
            messages.append({"role": "assistant", "content": answer.content})  # the SDK's own blocks
            uses = [b for b in answer.content if b.type == "tool_use"]
            if not uses:
                break
            messages.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": b.id, "content": json.dumps({"temp_c": -3})} for b in uses
            ]})
        if follow_up:
            messages.append({"role": "user", "content": follow_up})
    (session,) = _sessions(finding.store)
    assert [answer.split("\n")[-1] for answer in session] == ["Cold.", "Colder."]


def test_openai_responses_turns_of_one_conversation_share_a_session(finding, server):
    server.queue(Reply(text="Hello."), Reply(text="Fine."), Reply(text="Bye."))
    client = server.openai_client()
    items: list[Any] = []
    for question in ("Hi", "How are you?", "Bye"):
        items.append({"role": "user", "content": question})
        response = client.responses.create(model="m", input=items)
        items += [item.model_dump(exclude_none=True) for item in response.output]
    assert _sessions(finding.store) == [["Hello.", "Fine.", "Bye."]]


def test_openai_responses_continued_by_previous_response_id_share_a_session(finding, server):
    server.queue(Reply(text="Hello."), Reply(text="Fine."), Reply(text="Bye."))
    client = server.openai_client()
    previous = None
    for question in ("Hi", "How are you?", "Bye"):  # the server keeps the history: only the new question is sent
        response = client.responses.create(model="m", input=question, previous_response_id=previous)
        previous = response.id
    assert _sessions(finding.store) == [["Hello.", "Fine.", "Bye."]]


def test_a_new_conversation_and_a_named_session_are_not_joined(finding, server):
    server.queue(Reply(text="One."), Reply(text="Two."), Reply(text="Three."), Reply(text="Four."))
    client = server.openai_client()
    first = [{"role": "user", "content": "Count"}]
    answer = client.chat.completions.create(model="m", messages=first).choices[0].message
    # the same question again, as a conversation of its own: nothing to continue
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Count"}])
    follow = [*first, {"role": "assistant", "content": answer.content}, {"role": "user", "content": "more"}]
    with loopscope.session("mine"):  # a session the application names wins
        client.chat.completions.create(model="m", messages=follow)
    client.chat.completions.create(model="m", messages=follow)  # continues "One." (its session)
    assert loopscope.flush()
    store = finding.store
    by_answer = {t.response_content: t.session_id for s in store.list_sessions() for t in store.list_turns(s.session_id)}
    assert by_answer["Three."] == "mine"
    assert by_answer["Four."] == by_answer["One."] != by_answer["Two."]


def test_without_zero_code_each_stitched_turn_keeps_its_own_session(recording, server):
    loopscope.instrument()
    try:
        server.queue(Reply(text="One."), Reply(text="Two."))
        client = server.openai_client()
        messages: list[Any] = [{"role": "user", "content": "Count"}]
        answer = client.chat.completions.create(model="m", messages=messages).choices[0].message
        messages += [answer, {"role": "user", "content": "more"}]
        client.chat.completions.create(model="m", messages=messages)
    finally:
        loopscope.uninstrument()
    assert len(_sessions(recording.store)) == 2


def test_what_is_remembered_is_bounded_in_count_and_idle_time():
    remembered = Conversations(max_remembered=3)
    histories = [[{"role": "user", "content": f"question {i}"}] for i in range(5)]
    for i, history in enumerate(histories):
        remembered.remember(boundary(history), f"answer {i}", f"s{i}")  # type: ignore[arg-type]
    assert len(remembered) == 3
    follow = [*histories[4], {"role": "assistant", "content": "answer 4"}, {"role": "user", "content": "more"}]
    assert remembered.find(follow) == "s4"
    oldest = [*histories[0], {"role": "assistant", "content": "answer 0"}, {"role": "user", "content": "more"}]
    assert remembered.find(oldest) is None  # forgotten: the count bound
    stale = Conversations(idle_expiry=0.0)
    stale.remember(boundary(histories[4]), "answer 4", "s4")  # type: ignore[arg-type]
    assert stale.find(follow) is None and len(stale) == 0  # forgotten: idle too long
