"""The toolnexus adapter end to end: toolnexus's own clients (HTTP against the fake model
server on 127.0.0.1, and its in-process model client), recorded into a real DuckDB file."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import pytest
import toolnexus
from toolnexus import client as tn_client

import loopscope
from fakes.model_server import Reply, ToolCall, Usage
from loopscope import LoopEndReason
from loopscope import semconv as a
from loopscope.instrument import active
from recorded import spans_of

MODEL = "tn-model-1"
PROMPT = "Dinner outside in Paris tonight?"
FIRST_TEXT = "Let me check the weather and book."
FINAL_TEXT = "21 °C and dry, but the booking failed."
WEATHER = {"city": "Paris", "temp_c": 21}
BOOKING_ERROR = "booking service timed out"


@toolnexus.tool
def get_weather(city: str) -> str:
    """Current weather for a city."""
    return json.dumps({**WEATHER, "city": city})


@toolnexus.tool
def book_table(place: str) -> str:
    """Book a table."""
    raise RuntimeError(BOOKING_ERROR)


WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "additionalProperties": False, "required": ["city"]}
BOOK_SCHEMA = {"type": "object", "properties": {"place": {"type": "string"}}, "additionalProperties": False, "required": ["place"]}




def toolkit() -> toolnexus.Toolkit:
    return asyncio.run(toolnexus.create_toolkit(builtins=False, extra_tools=[get_weather, book_table]))


def http_client(server: Any, style: str, **options: Any) -> toolnexus.Client:
    base = server.openai_base_url if style == "openai" else server.anthropic_base_url
    return toolnexus.create_client(base_url=base, style=style, model=MODEL, api_key="test-key", retries=0, **options)


def queue_two_tools(server: Any) -> None:
    server.queue(
        Reply(
            text=FIRST_TEXT,
            tool_calls=[ToolCall("get_weather", {"city": "Paris"}, id="call_w"), ToolCall("book_table", {"place": "Chez Nous"}, id="call_b")],
            usage=Usage(100, 20, cached_tokens=30),
        ),
        Reply(text=FINAL_TEXT, usage=Usage(150, 10)),
    )


def ask(client: toolnexus.Client, prompt: str, tk: Any, conversation: str | None, stream: bool = False) -> Any:
    deltas: list[str] = []
    kwargs: dict[str, Any] = {"id": conversation}
    if stream:
        kwargs["on_text"] = deltas.append
    result = asyncio.run(client.ask(prompt, tk, **kwargs))
    if stream:
        assert "".join(deltas) == FIRST_TEXT + FINAL_TEXT
    return result


def timeline(recording: Any, session: str) -> list[tuple[Any, ...]]:
    rows = []
    for e in recording.store.get_timeline(session):
        c = e.content
        if e.type == "message":
            rows.append((e.index, e.type, c.role, c.body))
        else:
            rows.append((e.index, e.type, c.tool_name, c.tool_id, c.arguments, c.result, c.status, c.outcome, c.error))
    return rows


def expected_two_tool_rows(first_text: str | None) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = [("message", "user", PROMPT)]
    if first_text:
        rows.append(("message", "assistant", first_text))
    rows += [
        ("tool_call_start", "get_weather", "call_w", {"city": "Paris"}, None, "pending", None, None),
        ("tool_call_start", "book_table", "call_b", {"place": "Chez Nous"}, None, "pending", None, None),
        ("tool_call_end", "get_weather", "call_w", {"city": "Paris"}, WEATHER, "completed", "served", None),
        ("tool_call_end", "book_table", "call_b", {"place": "Chez Nous"}, BOOKING_ERROR, "failed", "failed", BOOKING_ERROR),
        ("message", "assistant", FINAL_TEXT),
    ]
    return [(i, *row) for i, row in enumerate(rows, start=1)]


# -- a real two-tool turn, field by field ------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("style", ["openai", "anthropic"])
def test_two_tool_turn_is_one_turn_field_by_field(style, stream, instrumented, server):
    queue_two_tools(server)
    result = ask(http_client(server, style), PROMPT, toolkit(), "conv-1", stream)
    assert result.text == FINAL_TEXT and result.status == "done"

    assert timeline(instrumented, "conv-1") == expected_two_tool_rows(FIRST_TEXT)
    ends = [e for e in instrumented.store.get_timeline("conv-1") if e.type == "tool_call_end"]
    assert all(e.content.duration_ms is not None and e.content.duration_ms >= 0 for e in ends)
    assert {e.source.framework for e in instrumented.store.get_timeline("conv-1")} == {"toolnexus"}

    [turn] = instrumented.store.list_turns("conv-1")
    assert turn.session_id == "conv-1"
    assert turn.loop_end_reason is LoopEndReason.COMPLETED
    assert turn.segments == [FIRST_TEXT, FINAL_TEXT]
    assert turn.response_content == f"{FIRST_TEXT}\n\n{FINAL_TEXT}"
    assert turn.tool_calls_count == 2 and turn.round_count == 1
    assert turn.model == MODEL and turn.provider == style and turn.streaming is stream
    assert turn.error is None
    assert [(t.name, t.description, t.parameters) for t in turn.declared_tools] == [
        ("get_weather", "Current weather for a city.", WEATHER_SCHEMA),
        ("book_table", "Book a table.", BOOK_SCHEMA),
    ]
    if stream:  # a stream reports the run's running totals: the turn's sum is toolnexus's own
        assert turn.usage == {"input_tokens": result.usage["prompt_tokens"], "output_tokens": result.usage["completion_tokens"]}
    elif style == "openai":
        assert turn.usage == {"input_tokens": 250, "output_tokens": 30, "cache_read_input_tokens": 30, "reasoning_tokens": 0}
    else:
        # normalized: Anthropic's input tokens leave the 30 read from the cache out; recorded, they are in
        assert turn.usage == {"input_tokens": 280, "output_tokens": 30, "cache_read_input_tokens": 30, "cache_creation_input_tokens": 0}

    # one trace: invoke_agent -> 2 chat + 2 execute_tool
    [agent] = spans_of(instrumented, a.OP_INVOKE_AGENT)
    chats, tools = spans_of(instrumented, a.OP_CHAT), spans_of(instrumented, a.OP_EXECUTE_TOOL)
    assert len(chats) == 2 and len(tools) == 2
    for span in chats + tools:
        assert span.context.trace_id == agent.context.trace_id and span.parent.span_id == agent.context.span_id
    assert chats[0].attributes[a.ROUND_TEXT] == FIRST_TEXT
    assert chats[0].attributes[a.PROVIDER] == style and chats[0].attributes[a.FRAMEWORK] == "toolnexus"


def test_in_process_client_turn(instrumented):
    seen: list[int] = []

    def generate(request: dict[str, Any]) -> dict[str, Any]:
        seen.append(len(request["messages"]))
        if request["messages"][-1]["role"] == "user":
            return {
                "tool_calls": [
                    {"id": "call_w", "name": "get_weather", "arguments": {"city": "Paris"}},
                    {"id": "call_b", "name": "book_table", "arguments": {"place": "Chez Nous"}},
                ],
                "usage": {"prompt_tokens": 40, "completion_tokens": 8},
            }
        return {"content": FINAL_TEXT, "usage": {"prompt_tokens": 90, "completion_tokens": 12}}

    client = toolnexus.create_in_process_client(model="in-proc-1", generate=generate)
    result = ask(client, PROMPT, toolkit(), "conv-ip")
    assert result.text == FINAL_TEXT and seen == [1, 4]

    assert timeline(instrumented, "conv-ip") == expected_two_tool_rows(None)
    [turn] = instrumented.store.list_turns("conv-ip")
    assert (turn.model, turn.provider, turn.loop_end_reason) == ("in-proc-1", "in_process", LoopEndReason.COMPLETED)
    assert turn.usage == {"input_tokens": 130, "output_tokens": 20}
    assert turn.segments == [FINAL_TEXT] and turn.tool_calls_count == 2 and turn.round_count == 1


def test_each_ask_is_a_turn_of_the_conversation(instrumented):
    client = toolnexus.create_in_process_client(model="m", generate=lambda req: {"content": str(len(req["messages"]))})
    assert ask(client, "first", None, "conv-2").text == "1"
    assert ask(client, "second", None, "conv-2").text == "3"
    turns = instrumented.store.list_turns("conv-2")
    assert [(t.segments, t.loop_end_reason) for t in turns] == [(["1"], LoopEndReason.COMPLETED), (["3"], LoopEndReason.COMPLETED)]
    assert [(e.content.role, e.content.body) for e in instrumented.store.get_timeline("conv-2")] == [
        ("user", "first"), ("assistant", "1"), ("user", "second"), ("assistant", "3"),
    ]


def test_a_conversation_object_keeps_one_session(instrumented):
    client = toolnexus.create_in_process_client(model="m", generate=lambda req: {"content": str(len(req["messages"]))})
    conversation = client.conversation()

    async def two() -> None:
        await conversation.send("one")
        await conversation.send("two")

    asyncio.run(two())
    turns = instrumented.store.list_turns(limit=None)
    assert len(turns) == 2 and turns[0].session_id == turns[1].session_id
    assert [t.segments for t in turns] == [["1"], ["3"]]


# -- the application's own hooks ---------------------------------------------------------------------


def test_application_hooks_run_and_what_they_change_is_recorded(instrumented):
    calls: list[str] = []

    class Hooks:
        def before_llm(self, event: dict[str, Any]) -> None:
            calls.append(f"before_llm {event['turn']}")

        async def after_llm(self, event: dict[str, Any]) -> None:
            calls.append(f"after_llm {event['turn']}")

        def before_tool(self, event: dict[str, Any]) -> dict[str, Any] | None:
            calls.append(f"before_tool {event['name']}")
            if event["name"] == "book_table":  # answered by the hook: the tool never runs
                return {"result": toolnexus.ToolResult(output="booked by the hook", is_error=False)}
            return {"args": {"city": "Lyon"}}

        def after_tool(self, event: dict[str, Any]) -> dict[str, Any]:
            calls.append(f"after_tool {event['name']}")
            return {"result": toolnexus.ToolResult(output=event["result"].output.replace("21", "22"), is_error=False)}

    hooks = Hooks()

    def generate(request: dict[str, Any]) -> dict[str, Any]:
        if request["messages"][-1]["role"] == "user":
            return {"tool_calls": [{"id": "call_w", "name": "get_weather", "arguments": {"city": "Paris"}},
                                   {"id": "call_b", "name": "book_table", "arguments": {"place": "Chez Nous"}}]}
        return {"content": "ok"}

    client = toolnexus.create_in_process_client(model="m", generate=generate, hooks=hooks)
    assert client.hooks is hooks
    result = ask(client, PROMPT, toolkit(), "conv-hooks")
    assert result.text == "ok"
    assert calls == ["before_llm 0", "after_llm 0", "before_tool get_weather", "before_tool book_table",
                     "after_tool get_weather", "before_llm 1", "after_llm 1"]
    ends = {e.content.tool_id: e.content for e in instrumented.store.get_timeline("conv-hooks") if e.type == "tool_call_end"}
    assert (ends["call_w"].arguments, ends["call_w"].result, ends["call_w"].outcome) == ({"city": "Lyon"}, {"city": "Lyon", "temp_c": 22}, "served")
    assert (ends["call_b"].arguments, ends["call_b"].result, ends["call_b"].outcome) == ({"place": "Chez Nous"}, "booked by the hook", "served")


def test_an_exception_of_an_application_hook_passes_through(instrumented):
    failure = ValueError("the hook refuses")

    def after_tool(event: dict[str, Any]) -> None:
        raise failure

    def generate(request: dict[str, Any]) -> dict[str, Any]:
        return {"tool_calls": [{"id": "call_w", "name": "get_weather", "arguments": {"city": "Paris"}}]}

    client = toolnexus.create_in_process_client(model="m", generate=generate, hooks={"after_tool": after_tool})
    with pytest.raises(ValueError) as caught:
        ask(client, PROMPT, toolkit(), "conv-raise")
    assert caught.value is failure
    [turn] = instrumented.store.list_turns("conv-raise")
    assert turn.loop_end_reason is LoopEndReason.ERROR and turn.error == "ValueError: the hook refuses"
    [end] = [e.content for e in instrumented.store.get_timeline("conv-raise") if e.type == "tool_call_end"]
    assert (end.tool_id, end.outcome, end.error) == ("call_w", "failed", "ValueError: the hook refuses")


# -- how a loop ends ---------------------------------------------------------------------------------


def test_a_model_error_reaches_the_user_and_ends_the_turn(instrumented, server):
    server.queue(Reply.error(status=400, message="bad request"))
    client = http_client(server, "openai")
    with pytest.raises(tn_client.ProviderError) as caught:
        ask(client, PROMPT, toolkit(), "conv-err")
    assert caught.value.status == 400
    [turn] = instrumented.store.list_turns("conv-err")
    assert turn.loop_end_reason is LoopEndReason.ERROR and turn.error.startswith("ProviderError: LLM 400")
    [chat] = spans_of(instrumented, a.OP_CHAT)
    assert chat.attributes[a.ERROR_TYPE] == "ProviderError"


def test_max_turns_is_max_rounds(instrumented):
    def generate(request: dict[str, Any]) -> dict[str, Any]:
        n = len(request["messages"])
        return {"tool_calls": [{"id": f"call_{n}", "name": "get_weather", "arguments": {"city": "Paris"}}]}

    client = toolnexus.create_in_process_client(model="m", generate=generate, max_turns=2)
    result = ask(client, PROMPT, toolkit(), "conv-max")
    assert (result.status, result.limit) == ("incomplete", "maxTurns")
    [turn] = instrumented.store.list_turns("conv-max")
    assert turn.loop_end_reason is LoopEndReason.MAX_ROUNDS and turn.tool_calls_count == 2


def test_a_stream_closed_early_is_cancelled(instrumented, server):
    queue_two_tools(server)
    client, tk = http_client(server, "openai"), toolkit()

    async def first_text_only() -> None:
        events = client.stream(PROMPT, tk, id="conv-closed")
        async for event in events:
            if event["type"] == "text":
                break
        await events.aclose()

    asyncio.run(first_text_only())
    [turn] = instrumented.store.list_turns("conv-closed")
    assert turn.loop_end_reason is LoopEndReason.CANCELLED


# -- a model under toolnexus that goes through an SDK: one tree ------------------------------------


def test_an_sdk_call_under_a_round_fills_it(instrumented, server):
    queue_two_tools(server)
    sdk = server.openai_client()

    def generate(request: dict[str, Any]) -> dict[str, Any]:
        completion = sdk.chat.completions.create(model=MODEL, messages=request["messages"], tools=request["tools"])
        message = completion.choices[0].message
        if message.tool_calls:
            return {"tool_calls": [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in message.tool_calls]}
        return {"content": message.content}

    client = toolnexus.create_in_process_client(model=MODEL, generate=generate)
    result = ask(client, PROMPT, toolkit(), "conv-sdk")
    assert result.text == FINAL_TEXT
    # the SDK saw the first round's text, which toolnexus's in-process envelope drops
    assert timeline(instrumented, "conv-sdk") == expected_two_tool_rows(FIRST_TEXT)
    assert len(spans_of(instrumented, a.OP_INVOKE_AGENT)) == 1
    assert len(spans_of(instrumented, a.OP_CHAT)) == 2 and len(spans_of(instrumented, a.OP_EXECUTE_TOOL)) == 2
    [turn] = instrumented.store.list_turns(limit=None)
    assert turn.session_id == "conv-sdk" and turn.tool_calls_count == 2
    assert turn.usage["input_tokens"] == 250 and turn.usage["output_tokens"] == 30  # once, not twice


# -- instrument / uninstrument -----------------------------------------------------------------------


PATCHED = [(tn_client, "_get_hook"), (tn_client.Client, "run"), (tn_client.Client, "stream"), (tn_client.Client, "ask"), (tn_client.Conversation, "send")]


def test_instrument_uninstrument_and_again(recording):
    originals = {(owner, name): owner.__dict__[name] for owner, name in PATCHED}
    client = toolnexus.create_in_process_client(model="m", generate=lambda req: {"content": "hi"})
    loopscope.instrument()
    loopscope.instrument()
    try:
        assert "toolnexus" in active()
        assert all(owner.__dict__[name] is not originals[owner, name] for owner, name in PATCHED)
        ask(client, "one", None, "s1")
        assert len(spans_of(recording, a.OP_INVOKE_AGENT)) == 1
    finally:
        loopscope.uninstrument()
    assert all(owner.__dict__[name] is originals[owner, name] for owner, name in PATCHED)
    assert ask(client, "two", None, "s1").text == "hi"
    assert len(spans_of(recording, a.OP_INVOKE_AGENT)) == 1
    loopscope.instrument()
    try:
        ask(client, "three", None, "s1")
    finally:
        loopscope.uninstrument()
    assert [t.response_content for t in recording.store.list_turns("s1")] == ["hi", "hi"]
    assert [e.content.body for e in recording.store.get_timeline("s1") if e.content.role == "user"] == ["one", "three"]


def test_dormant_until_toolnexus_is_imported(tmp_path):
    code = f"""
import sys, loopscope
from loopscope.instrument import active
loopscope.configure({str(tmp_path / 's.duckdb')!r})
loopscope.instrument()
assert "toolnexus" not in sys.modules, "imported by loopscope"
assert "toolnexus" not in active()
import toolnexus
assert "toolnexus" in active()
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


# -- nesting and concurrency -------------------------------------------------------------------------


def test_a_run_inside_a_tool_is_a_child_turn(instrumented):
    inner = toolnexus.create_in_process_client(model="inner-m", generate=lambda req: {"content": "inner answer"})

    @toolnexus.tool
    async def ask_expert(question: str) -> str:
        """Ask another agent."""
        return (await inner.run(question)).text

    def generate(request: dict[str, Any]) -> dict[str, Any]:
        if request["messages"][-1]["role"] == "user":
            return {"tool_calls": [{"id": "call_x", "name": "ask_expert", "arguments": {"question": "why?"}}]}
        return {"content": "outer answer"}

    outer = toolnexus.create_in_process_client(model="outer-m", generate=generate)
    tk = asyncio.run(toolnexus.create_toolkit(builtins=False, extra_tools=[ask_expert]))
    assert ask(outer, PROMPT, tk, "conv-nest").text == "outer answer"
    turns = {t.model: t for t in instrumented.store.list_turns("conv-nest")}
    assert set(turns) == {"outer-m", "inner-m"}
    assert turns["inner-m"].parent_correlation_id == turns["outer-m"].correlation_id
    assert turns["inner-m"].segments == ["inner answer"] and turns["outer-m"].tool_calls_count == 1
    [end] = [e.content for e in instrumented.store.get_timeline("conv-nest") if e.type == "tool_call_end"]
    assert (end.tool_name, end.result, end.outcome) == ("ask_expert", "inner answer", "served")


def test_concurrent_conversations_stay_apart(instrumented):
    def generate(request: dict[str, Any]) -> dict[str, Any]:
        first = request["messages"][0]["content"]
        if request["messages"][-1]["role"] == "user":
            return {"tool_calls": [{"id": f"call_{first}", "name": "get_weather", "arguments": {"city": first}}]}
        return {"content": f"answer for {first}"}

    client = toolnexus.create_in_process_client(model="m", generate=generate)
    tk = toolkit()
    cities = [f"city{i}" for i in range(8)]

    async def all_at_once() -> list[Any]:
        return await asyncio.gather(*(client.ask(c, tk, id=f"conv-{c}") for c in cities))

    asyncio.run(all_at_once())
    for city in cities:
        assert timeline(instrumented, f"conv-{city}") == [
            (1, "message", "user", city),
            (2, "tool_call_start", "get_weather", f"call_{city}", {"city": city}, None, "pending", None, None),
            (3, "tool_call_end", "get_weather", f"call_{city}", {"city": city}, {**WEATHER, "city": city}, "completed", "served", None),
            (4, "message", "assistant", f"answer for {city}"),
        ]
        [turn] = instrumented.store.list_turns(f"conv-{city}")
        assert turn.loop_end_reason is LoopEndReason.COMPLETED and turn.tool_calls_count == 1


# -- suspensions (a tool that waits for a human) -----------------------------------------------------


@toolnexus.tool
def transfer(amount: int, ctx: toolnexus.ToolContext | None = None) -> Any:
    """Move money, once a human approved it."""
    if ctx is None or ctx.answer is None:
        return toolnexus.pending(kind="approval", prompt=f"Approve a transfer of {amount}?")
    return f"transferred {amount}"


def transfer_model(request: dict[str, Any]) -> dict[str, Any]:
    if request["messages"][-1]["role"] == "user":
        return {"tool_calls": [{"id": "call_t", "name": "transfer", "arguments": {"amount": 5}}]}
    return {"content": "done: " + request["messages"][-1]["content"]}


@pytest.mark.parametrize("decision", ["approved", "declined", "nobody"])
def test_a_suspended_tool_ends_with_its_resolution(decision, instrumented):
    waits: dict[str, Any] = {
        "approved": lambda request: toolnexus.Answer(id=request.id, ok=True),
        "declined": lambda request: toolnexus.answer_declined(request.id),
        "nobody": None,
    }
    client = toolnexus.create_in_process_client(model="m", generate=transfer_model, wait_for=waits[decision])
    tk = asyncio.run(toolnexus.create_toolkit(builtins=False, extra_tools=[transfer]))
    result = ask(client, "send 5", tk, f"conv-{decision}")
    [end] = [e.content for e in instrumented.store.get_timeline(f"conv-{decision}") if e.type == "tool_call_end"]
    [turn] = instrumented.store.list_turns(f"conv-{decision}")
    if decision == "approved":
        assert result.text == "done: transferred 5"
        assert (end.result, end.outcome, end.error) == ("transferred 5", "served", None)
        assert turn.loop_end_reason is LoopEndReason.COMPLETED
    elif decision == "declined":
        assert result.text == "done: declined/expired: Approve a transfer of 5?"
        assert (end.outcome, end.error) == ("refused", "declined/expired: Approve a transfer of 5?")
        assert turn.loop_end_reason is LoopEndReason.COMPLETED
    else:
        assert result.status == "pending"
        assert (end.outcome, end.status) == ("unserved", "failed")
        assert turn.loop_end_reason is LoopEndReason.UNFINISHED


def test_a_cancel_token_is_cancelled(instrumented):
    client = toolnexus.create_in_process_client(model="m", generate=lambda req: {"content": "never"})
    cancel = asyncio.Event()
    cancel.set()

    async def cancelled() -> None:
        await client.ask("hi", None, id="conv-cancel", cancel=cancel)

    with pytest.raises(tn_client.RunCancelled):
        asyncio.run(cancelled())
    [turn] = instrumented.store.list_turns("conv-cancel")
    assert turn.loop_end_reason is LoopEndReason.CANCELLED


def test_a_stream_never_read_is_no_turn(instrumented, server):
    client = http_client(server, "openai")
    client.stream(PROMPT, None, id="conv-unread")
    loopscope.flush()
    assert instrumented.store.list_turns(limit=None) == [] and server.requests == []
