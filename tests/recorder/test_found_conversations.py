"""Conversations found on their own, in every mode: a stitched turn whose request continues
an ended stitched turn's conversation joins its session, unless the session is named or the
switch is off (``find_conversations=False``, ``LOOPSCOPE_FIND_CONVERSATIONS=0``). The real
SDKs against the fake server; ``tests/zero_code/test_run_conversations.py`` runs it under
``loopscope run``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

import loopscope
from fakes.model_server import Reply, ToolCall
from loopscope.recorder.conversations import Conversations, boundary


@pytest.fixture
def finding(instrumented) -> Iterator[Any]:
    """Plain ``loopscope.instrument()``: conversations are looked for, as nothing turned it off."""
    yield instrumented


@pytest.fixture
def switch_back() -> Iterator[None]:
    """A test that turns the switch off has it on again afterwards (it is the process's)."""
    try:
        yield
    finally:
        loopscope.pipeline.set_find_conversations(True)


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


def _openai_chat(server: Any, questions: list[str], tag: str = "") -> None:
    """A chat loop on one list: user message, model call, the answer appended, the next one."""
    client = server.openai_client()
    messages: list[Any] = [{"role": "system", "content": "You are terse."}]
    for question in questions:
        messages.append({"role": "user", "content": question + tag})
        answer = client.chat.completions.create(model="gpt-4o-mini", messages=messages).choices[0].message
        messages.append({"role": "assistant", "content": answer.content})


def _anthropic_chat(server: Any, questions: list[str]) -> None:
    client = server.anthropic_client()
    messages: list[Any] = []
    for question in questions:
        messages.append({"role": "user", "content": question})
        answer = client.messages.create(model="claude-test", max_tokens=100, system="You are terse.", messages=messages)
        messages.append({"role": "assistant", "content": answer.content})  # the SDK's own blocks


FIVE = ["Hi", "What is 2+2?", "And 3+3?", "Thanks", "Bye"]
ANSWERS = ["Hello.", "4.", "6.", "You are welcome.", "Goodbye."]


def _timeline(store: Any, session_id: str) -> list[tuple[str, str]]:
    return [(e.content.role, e.content.body) for e in store.get_timeline(session_id) if e.type == "message"]


@pytest.mark.parametrize("chat", [_openai_chat, _anthropic_chat], ids=["openai", "anthropic"])
def test_a_five_turn_chat_under_instrument_is_one_session_of_five_turns_in_order(finding, server, chat):
    server.queue(*[Reply(text=answer) for answer in ANSWERS])
    chat(server, FIVE)
    (session,) = finding.store.list_sessions()
    assert session.turn_count == 5
    assert _sessions(finding.store) == [ANSWERS]
    assert _timeline(finding.store, session.session_id) == [
        pair for question, answer in zip(FIVE, ANSWERS) for pair in (("user", question), ("assistant", answer))
    ]


def test_two_conversations_interleaved_are_two_sessions(finding, server):
    server.queue(*[Reply(text=f"{answer} [a]") for answer in ANSWERS[:3]], match="[a]")
    server.queue(*[Reply(text=f"{answer} [b]") for answer in ANSWERS[:3]], match="[b]")
    client = server.openai_client()
    histories: dict[str, list[Any]] = {"[a]": [], "[b]": []}
    for question in FIVE[:3]:
        for tag, messages in histories.items():  # one turn of each, in turn
            messages.append({"role": "user", "content": f"{question} {tag}"})
            answer = client.chat.completions.create(model="m", messages=messages).choices[0].message
            messages.append(answer)  # the SDK's own message object
    assert sorted(_sessions(finding.store)) == [
        [f"{answer} [a]" for answer in ANSWERS[:3]], [f"{answer} [b]" for answer in ANSWERS[:3]]
    ]


@pytest.mark.parametrize("where", ["instrument", "configure"])
def test_with_the_switch_off_each_stitched_turn_keeps_its_own_session(recording, server, switch_back, where):
    if where == "configure":
        loopscope.configure(recording.db, find_conversations=False, tracer_provider=recording.pipeline.tracer_provider,
                            flush_interval=0.05, capture_content=True)
        loopscope.instrument()
    else:
        loopscope.instrument(find_conversations=False)
    try:
        server.queue(*[Reply(text=answer) for answer in ANSWERS])
        _openai_chat(server, FIVE)
    finally:
        loopscope.uninstrument()
    assert sorted(_sessions(recording.store)) == sorted([answer] for answer in ANSWERS)


def test_the_switch_off_in_the_environment(spawn, model_server):
    """``LOOPSCOPE_FIND_CONVERSATIONS=0`` in a program that calls ``loopscope.instrument()``
    (and nothing else of loopscope's): each turn a session of its own, as before."""
    model_server.queue(*[Reply(text=answer) for answer in ANSWERS] * 2)
    code = """
        import os, sys
        os.environ.update(LOOPSCOPE_DB=sys.argv[2], **({"LOOPSCOPE_FIND_CONVERSATIONS": "0"} if sys.argv[2] == "off.duckdb" else {}))
        import loopscope
        loopscope.instrument()
        import openai
        client = openai.OpenAI(base_url=sys.argv[1], api_key="k", max_retries=0)
        messages = []
        for question in ["Hi", "What is 2+2?", "And 3+3?", "Thanks", "Bye"]:
            messages.append({"role": "user", "content": question})
            messages.append(client.chat.completions.create(model="m", messages=messages).choices[0].message)
        assert loopscope.flush()
        print(sorted(s.turn_count for s in loopscope.Store().list_sessions()))
    """
    assert spawn("on", code, model_server.openai_base_url, "on.duckdb").finish_ok(60).strip() == "[5]"
    assert spawn("off", code, model_server.openai_base_url, "off.duckdb").finish_ok(60).strip() == "[1, 1, 1, 1, 1]"


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
