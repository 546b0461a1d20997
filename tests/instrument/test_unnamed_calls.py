"""Tool calls without an id are stitched by position (Gemini's OpenAI-compatible endpoint
answers ``tool_calls[0].id == ""``, and the loop sends ``tool_call_id: ""`` back; other
servers send no ``id`` at all).

The real openai SDK against the fake server, which sends the ids as they are (empty, or
none): the results must end the calls of the response before, in order, in one turn of one
session, and what is recorded carries no id loopscope made up.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

import loopscope
from fakes.model_server import Reply, ToolCall
from loopscope import LoopEndReason
from loopscope import semconv as a
from recorded import only_turn, spans_of

TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
    for name in ("weather", "time")
]
RESULTS = {"weather": {"temp_c": 21}, "time": {"time": "19:30"}}


@pytest.fixture
def instrumented(recording):
    loopscope.instrument(anthropic=False)
    try:
        yield recording
    finally:
        loopscope.uninstrument()


def _ask(client: openai.OpenAI, messages: list[Any], stream: bool) -> tuple[str, list[tuple[str, str, str]]]:
    """One model call: its text and its calls as (id, name, arguments)."""
    if not stream:
        message = client.chat.completions.create(model="gemini-2.0-flash", messages=messages, tools=TOOLS).choices[0].message
        calls = [(getattr(c, "id", None) or "", c.function.name, c.function.arguments) for c in message.tool_calls or []]
        return message.content or "", calls
    text, slots = "", {}
    for chunk in client.chat.completions.create(model="gemini-2.0-flash", messages=messages, tools=TOOLS, stream=True):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for part in choice.delta.tool_calls or []:
                slot = slots.setdefault(part.index, ["", "", ""])
                slot[0] = slot[0] or part.id or ""
                slot[1] += (part.function.name or "") if part.function else ""
                slot[2] += (part.function.arguments or "") if part.function else ""
    return text, [tuple(s) for _, s in sorted(slots.items())]  # type: ignore[misc]


def _loop(client: openai.OpenAI, question: str, stream: bool, send_ids: bool = True) -> str:
    """A plain tool loop that sends the ids back as the model gave them: empty (or, with
    ``send_ids=False``, no ``tool_call_id`` at all)."""
    messages: list[Any] = [{"role": "user", "content": question}]
    while True:
        text, calls = _ask(client, messages, stream)
        if not calls:
            return text
        assert all(call_id == "" for call_id, _, _ in calls)  # the server sent them empty, as Gemini does
        messages.append({
            "role": "assistant", "content": text or None,
            "tool_calls": [{"id": i, "type": "function", "function": {"name": n, "arguments": a}} for i, n, a in calls],
        })
        for call_id, name, _ in calls:
            result = {"role": "tool", "tool_call_id": call_id, "content": json.dumps(RESULTS[name])}
            if not send_ids:
                del result["tool_call_id"]
            messages.append(result)


@pytest.mark.parametrize("ids", ["empty", "none"])
@pytest.mark.parametrize("stream", [False, True], ids=["create", "stream"])
def test_calls_without_ids_are_ended_by_the_results_in_order_and_recorded_without_one(stream, ids, instrumented, server):
    call = {"id": ""} if ids == "empty" else {"omit_id": True}
    server.queue(
        Reply(text="Looking.", tool_calls=[ToolCall("weather", {"city": "Paris"}, **call), ToolCall("time", {"city": "Paris"}, **call)]),
        Reply(text="21 °C at 19:30."),
    )
    client = server.openai_client(api_key="sk-test")
    assert _loop(client, "Weather and time in Paris?", stream, send_ids=ids == "empty") == "21 °C at 19:30."
    sent = [m for m in server.requests[1].body["messages"] if m["role"] == "tool"]
    assert [m.get("tool_call_id") for m in sent] == ([""] * 2 if ids == "empty" else [None] * 2)
    assert loopscope.flush()
    store = instrumented.store
    turn = only_turn(store)  # one turn, one session: the second call joined the first
    assert turn.loop_end_reason is LoopEndReason.COMPLETED
    assert (turn.tool_calls_count, turn.round_count) == (2, 1)
    rows = [e.content for e in store.get_timeline(turn.session_id) if e.type.startswith("tool_call")]
    ends = rows[2:]
    assert [(c.tool_name, c.outcome, c.result) for c in ends] == [
        ("weather", "served", RESULTS["weather"]),
        ("time", "served", RESULTS["time"]),
    ]
    assert [c.tool_id for c in rows] == ["", "", "", ""]  # no id made up, start rows and end rows alike
    # the tool_calls view pairs each start with its end all the same
    _, view = store.sql("SELECT tool, status, outcome FROM tool_calls ORDER BY start_index")
    assert view == [("weather", "completed", "served"), ("time", "completed", "served")]
    # the answer's output message, stored and exported, carries the calls as sent
    [asked, _] = store.model_calls(turn.session_id, with_messages=True)
    parts = [p for m in asked.output_messages for p in m["parts"] if p["type"] == "tool_call"]
    assert [(p["id"], p["name"]) for p in parts] == [("", "weather"), ("", "time")]
    exported = json.loads(spans_of(instrumented, a.OP_CHAT)[0].attributes[a.OUTPUT_MESSAGES])
    assert [p["id"] for m in exported for p in m["parts"] if p["type"] == "tool_call"] == ["", ""]
    assert all(a.TOOL_CALL_ID not in s.attributes for s in spans_of(instrumented, a.OP_EXECUTE_TOOL))


def test_an_earlier_rounds_unnamed_results_do_not_answer_the_next_round(instrumented, server):
    server.queue(
        Reply(tool_calls=[ToolCall("weather", {"city": "Oslo"}, id="")]),
        Reply(tool_calls=[ToolCall("time", {"city": "Oslo"}, id="")]),
        Reply(text="Cold, and late."),
    )
    client = server.openai_client(api_key="sk-test")
    assert _loop(client, "Oslo?", stream=False) == "Cold, and late."
    assert loopscope.flush()
    turn = only_turn(instrumented.store)
    assert (turn.loop_end_reason, turn.tool_calls_count, turn.round_count) == (LoopEndReason.COMPLETED, 2, 2)
    ends = [e.content for e in instrumented.store.get_timeline(turn.session_id) if e.type == "tool_call_end"]
    # the second request carries both results without an id: only the one after the last
    # assistant message answers the second round's call
    assert [(c.tool_name, c.outcome, c.result) for c in ends] == [
        ("weather", "served", RESULTS["weather"]),
        ("time", "served", RESULTS["time"]),
    ]


def test_responses_calls_without_a_call_id_are_ended_by_position(instrumented, server):
    server.queue(
        Reply(tool_calls=[ToolCall("weather", {"city": "Rome"}, id=""), ToolCall("time", {"city": "Rome"}, id="")]),
        Reply(text="Warm, and early."),
    )
    client = server.openai_client(api_key="sk-test")
    tools = [{"type": "function", "name": t["function"]["name"], "parameters": t["function"]["parameters"]} for t in TOOLS]
    items: list[Any] = [{"role": "user", "content": "Rome?"}]
    response = client.responses.create(model="m", input=items, tools=tools)
    calls = [item for item in response.output if item.type == "function_call"]
    assert [c.call_id for c in calls] == ["", ""]
    items += [c.model_dump(exclude_none=True) for c in calls]
    items += [{"type": "function_call_output", "call_id": c.call_id, "output": json.dumps(RESULTS[c.name])} for c in calls]
    assert client.responses.create(model="m", input=items, tools=tools).output_text == "Warm, and early."
    assert loopscope.flush()
    turn = only_turn(instrumented.store)
    assert (turn.loop_end_reason, turn.tool_calls_count) == (LoopEndReason.COMPLETED, 2)
    ends = [e.content for e in instrumented.store.get_timeline(turn.session_id) if e.type == "tool_call_end"]
    assert [(c.tool_name, c.outcome, c.result) for c in ends] == [
        ("weather", "served", RESULTS["weather"]),
        ("time", "served", RESULTS["time"]),
    ]
