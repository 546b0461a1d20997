"""Where a stitched turn ends (zero-code): a loop cut off by its own round cap, and a
model call that failed, seen through the real openai and anthropic SDKs against the fake
model server, then through the store and the command line as a user reads them."""

from __future__ import annotations

from typing import Any

import pytest

import loopscope
from fakes.model_server import FakeModelServer, Reply, ToolCall
from loopscope import LoopEndReason
from loopscope.cli import main

WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER_SCHEMA}}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "description": "Current weather", "input_schema": WEATHER_SCHEMA}]
FIRST, SECOND = "Weather in Paris?", "And in Rome?"


@pytest.fixture(autouse=True)
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "220")  # whole cells: the tests read them


def cli(capsys: pytest.CaptureFixture[str], *argv: Any) -> str:
    assert main([str(x) for x in argv]) == 0
    return capsys.readouterr().out


def script(server: FakeModelServer, call_id: str) -> None:
    server.queue(
        Reply(text="Let me look.", tool_calls=[ToolCall("get_weather", {"city": "Paris"}, id=call_id)]),
        Reply(text="Rome is sunny."),
    )


def capped_chat_loop(server: FakeModelServer, max_rounds: int = 1) -> None:
    """``for _ in range(max_rounds)``: the tool results are appended and never sent; then
    the user asks again, on the same list."""
    client = server.openai_client(api_key="sk-test")
    messages: list[Any] = [{"role": "user", "content": FIRST}]
    for _ in range(max_rounds):
        message = client.chat.completions.create(model="gpt-4o", messages=messages, tools=CHAT_TOOLS).choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "21 C"})
    messages.append({"role": "user", "content": SECOND})
    client.chat.completions.create(model="gpt-4o", messages=messages, tools=CHAT_TOOLS)


def capped_anthropic_loop(server: FakeModelServer, max_rounds: int = 1) -> None:
    client = server.anthropic_client(api_key="sk-ant-test")
    messages: list[Any] = [{"role": "user", "content": FIRST}]
    for _ in range(max_rounds):
        message = client.messages.create(
            model="claude-test-1", max_tokens=100, messages=messages, tools=ANTHROPIC_TOOLS
        )
        content = [b.model_dump(exclude_none=True) for b in message.content]
        messages.append({"role": "assistant", "content": content})
        uses = [b for b in content if b["type"] == "tool_use"]
        if not uses:
            break
        messages.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": u["id"], "content": "21 C"} for u in uses],
            }
        )
    messages.append({"role": "user", "content": SECOND})
    client.messages.create(model="claude-test-1", max_tokens=100, messages=messages, tools=ANTHROPIC_TOOLS)


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_a_loop_cut_off_by_its_round_cap_ends_there_and_the_next_question_is_a_turn_of_its_own(
    sdk, instrumented, server, capsys
):
    script(server, "call_w1" if sdk == "openai" else "toolu_w1")
    (capped_chat_loop if sdk == "openai" else capped_anthropic_loop)(server)
    assert loopscope.flush()
    store = instrumented.store
    turns = sorted(store.list_turns(limit=None), key=lambda t: t.timestamp)
    assert [t.loop_end_reason for t in turns] == [LoopEndReason.CUT_OFF, LoopEndReason.COMPLETED]
    first, second = turns
    assert first.session_id == second.session_id  # one conversation
    assert (first.tool_calls_count, first.model_call_count, second.model_call_count) == (1, 1, 1)
    assert second.response_content == "Rome is sunny."

    events = store.get_timeline(first.session_id)
    said = [
        (e.type, e.correlation_id, getattr(e.content, "body", None) or getattr(e.content, "outcome", None))
        for e in events
    ]
    assert said == [
        ("message", first.correlation_id, FIRST),
        ("message", first.correlation_id, "Let me look."),
        ("tool_call_start", first.correlation_id, None),
        ("tool_call_end", first.correlation_id, "served"),
        ("message", second.correlation_id, SECOND),  # the second question is on the timeline
        ("message", second.correlation_id, "Rome is sunny."),
    ]
    out = cli(capsys, "timeline", first.session_id, "--db", instrumented.db)
    assert SECOND in out and "Rome is sunny." in out
    out = cli(capsys, "turns", "--db", instrumented.db)
    assert "cut_off" in out and "completed" in out


def test_results_sent_on_their_own_keep_the_turn_going(instrumented, server):
    """The usual loop (the results, then the model's answer, then the next question) is
    not cut off: the first turn completes before the user speaks again."""
    script(server, "call_w2")
    server.queue(Reply(text="Is there more?"))  # the answer to the second question
    capped_chat_loop(server, max_rounds=3)
    assert loopscope.flush()
    reasons = [t.loop_end_reason for t in sorted(instrumented.store.list_turns(limit=None), key=lambda t: t.timestamp)]
    assert LoopEndReason.CUT_OFF not in reasons


def test_anthropic_results_with_a_text_block_beside_them_continue_the_loop(instrumented, server):
    """A user message that carries the results and a text of the application's beside
    them (a reminder, a nudge) is the loop going on, not a new question."""
    script(server, "toolu_w3")
    client = server.anthropic_client(api_key="sk-ant-test")
    messages: list[Any] = [{"role": "user", "content": FIRST}]
    message = client.messages.create(model="claude-test-1", max_tokens=100, messages=messages, tools=ANTHROPIC_TOOLS)
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_w3", "content": "21 C"},
                {"type": "text", "text": "Answer in one line."},
            ],
        },
    ]
    client.messages.create(model="claude-test-1", max_tokens=100, messages=messages, tools=ANTHROPIC_TOOLS)
    assert loopscope.flush()
    [turn] = instrumented.store.list_turns(limit=None)
    assert (turn.loop_end_reason, turn.model_call_count, turn.tool_calls_count) == (LoopEndReason.COMPLETED, 2, 1)


# -- tool failures the loop catches ------------------------------------------------------


def test_anthropic_results_marked_as_errors_end_their_calls_failed(instrumented, server):
    """Two calls answered in one message: the one marked ``is_error`` (its content a plain
    string) is ``failed`` with that content as its error, the other ``served``."""
    server.queue(
        Reply(
            tool_calls=[
                ToolCall("get_weather", {"city": "Paris"}, id="toolu_a"),
                ToolCall("get_weather", {"city": "Oslo"}, id="toolu_b"),
            ]
        ),
        Reply(text="Paris is 21 C; Oslo I could not find."),
    )
    client = server.anthropic_client(api_key="sk-ant-test")
    messages: list[Any] = [{"role": "user", "content": FIRST}]
    message = client.messages.create(model="claude-test-1", max_tokens=100, messages=messages, tools=ANTHROPIC_TOOLS)
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in message.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_a", "content": "21 C"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_b",
                    "content": "LookupError: no station in Oslo",
                    "is_error": True,
                },
            ],
        },
    ]
    client.messages.create(model="claude-test-1", max_tokens=100, messages=messages, tools=ANTHROPIC_TOOLS)
    assert loopscope.flush()
    [turn] = instrumented.store.list_turns(limit=None)
    ends = [e.content for e in instrumented.store.get_timeline(turn.session_id) if e.type == "tool_call_end"]
    assert [(c.tool_id, c.status, c.outcome, c.error) for c in ends] == [
        ("toolu_a", "completed", "served", None),
        ("toolu_b", "failed", "failed", "LookupError: no station in Oslo"),
    ]
    assert turn.loop_end_reason is LoopEndReason.COMPLETED


def test_openai_failures_are_recorded_by_the_decorated_tool_the_loop_calls(instrumented, server):
    """OpenAI's tool messages carry no error flag: a loop that catches the tool's exception
    and sends its text back records the call ``failed`` when the function is decorated."""
    server.queue(
        Reply(tool_calls=[ToolCall("get_weather", {"city": "Oslo"}, id="call_x")]),
        Reply(text="I could not find Oslo."),
    )

    @loopscope.tool
    def get_weather(city: str) -> str:
        raise LookupError(f"no station in {city}")

    client = server.openai_client(api_key="sk-test")
    messages: list[Any] = [{"role": "user", "content": FIRST}]
    message = client.chat.completions.create(model="gpt-4o", messages=messages, tools=CHAT_TOOLS).choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    for call in message.tool_calls or []:
        try:
            content = get_weather(city="Oslo")
        except LookupError as exc:  # the loop catches it and tells the model
            content = f"error: {exc}"
        messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
    client.chat.completions.create(model="gpt-4o", messages=messages, tools=CHAT_TOOLS)
    assert loopscope.flush()
    [turn] = instrumented.store.list_turns(limit=None)
    [end] = [e.content for e in instrumented.store.get_timeline(turn.session_id) if e.type == "tool_call_end"]
    assert (end.tool_id, end.outcome, end.error) == ("call_x", "failed", "LookupError: no station in Oslo")
    assert (turn.tool_calls_count, turn.loop_end_reason) == (1, LoopEndReason.COMPLETED)


# -- a failed model call on the timeline -------------------------------------------------


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_a_model_call_that_failed_is_on_the_timeline_and_in_tail(sdk, instrumented, server, capsys):
    server.queue(Reply.error(500, "the model server fell over"))
    if sdk == "openai":
        client: Any = server.openai_client(api_key="sk-test", max_retries=0)
        with pytest.raises(Exception, match="500"):
            client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": FIRST}])
    else:
        client = server.anthropic_client(api_key="sk-ant-test", max_retries=0)
        with pytest.raises(Exception, match="500"):
            client.messages.create(model="gpt-4o", max_tokens=50, messages=[{"role": "user", "content": FIRST}])
    assert loopscope.flush()
    store = instrumented.store
    [turn] = store.list_turns(limit=None)
    assert turn.loop_end_reason is LoopEndReason.ERROR
    events = store.get_timeline(turn.session_id)
    assert [e.type for e in events] == ["message", "model_error"]
    failed = events[1]
    assert failed.correlation_id == turn.correlation_id
    assert failed.content["model"] == "gpt-4o" and failed.content["error_type"] == "InternalServerError"
    assert "the model server fell over" in failed.content["error"] and failed.content["duration_ms"] >= 0

    for out in (
        cli(capsys, "timeline", turn.session_id, "--db", instrumented.db),
        cli(capsys, "tail", "--db", instrumented.db),
    ):
        [line] = [line for line in out.splitlines() if "model_error" in line]
        assert "gpt-4o" in line and "error" in line and "InternalServerError" in line and "fell over" in line, out
        assert FIRST in out


def test_a_stream_broken_off_keeps_its_text_and_says_it_failed_after_it(instrumented, server):
    server.queue(Reply.stream_failure(after=4, text="The weather in Paris is"))
    client = server.openai_client(api_key="sk-test", max_retries=0)
    with pytest.raises(Exception):  # noqa: B017 - whatever the SDK raises for the stream's error event
        for _ in client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": FIRST}], stream=True
        ):
            pass
    assert loopscope.flush()
    [turn] = instrumented.store.list_turns(limit=None)
    events = instrumented.store.get_timeline(turn.session_id)
    assert [(e.type, getattr(e.content, "role", None)) for e in events] == [
        ("message", "user"),
        ("message", "assistant"),
        ("model_error", None),
    ]
    assert events[1].content.body.startswith("The weather")
