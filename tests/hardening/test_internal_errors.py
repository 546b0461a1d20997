"""An internal error injected into each part of loopscope: the user's call returns exactly
what it returns uninstrumented, and the user's own exceptions pass through unchanged.

Tests normally run in strict mode (internal errors raise); here strict mode is off, as in
production, and each test checks that the failure was reported (``_guard.error_count``).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import time
from typing import Any

import anthropic
import openai
import pytest

import loopscope
from loopscope import _guard, _json, semconv
from loopscope.instrument import _calls
from loopscope.recorder import stitch

turn_module = importlib.import_module("loopscope.recorder.turn")
spans_module = importlib.import_module("loopscope._otel_sdk")
pipeline_module = importlib.import_module("loopscope.pipeline")
openai_adapter = importlib.import_module("loopscope.instrument.openai")
anthropic_adapter = importlib.import_module("loopscope.instrument.anthropic")
from fakes.model_server import Reply, ToolCall, Usage
from loopscope.storage.duckdb import writer

CHAT_TOOLS = [{"type": "function", "function": {"name": "weather", "description": "Weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
ANTHROPIC_TOOLS = [{"name": "weather", "description": "Weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]

# the faults are injected into the thread writer, in this process and its children (see conftest)
pytestmark = pytest.mark.usefixtures("thread_writer_everywhere")


class Injected(RuntimeError):
    """The fault: raised inside loopscope's code, never seen by the user."""


def _boom(*args: Any, **kwargs: Any) -> Any:
    raise Injected("injected internal error")


def _replies(server: Any) -> None:
    server.queue(
        Reply(text="Checking.", tool_calls=[ToolCall("weather", {"city": "Paris"}, id="call_1")], usage=Usage(10, 5)),
        Reply(text="Sunny, 21 °C.", usage=Usage(20, 6)),
    )


def _openai_loop(server: Any, stream: bool) -> list[Any]:
    """A two-round tool loop; what the user saw of each response (ids left out: the fake numbers them)."""
    client = openai.OpenAI(base_url=server.openai_base_url, api_key="sk-x", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "Weather?"}]
    seen: list[Any] = []
    for _ in range(2):
        if stream:
            chunks = list(client.chat.completions.create(model="m", messages=messages, tools=CHAT_TOOLS, stream=True))
            seen.append([(type(c).__name__, [ch.delta.model_dump() for ch in c.choices], c.usage and c.usage.model_dump()) for c in chunks])
            text = "".join(ch.delta.content or "" for c in chunks for ch in c.choices)
            calls = [tc for c in chunks for ch in c.choices for tc in (ch.delta.tool_calls or [])]
            messages.append({"role": "assistant", "content": text})
            if calls:
                messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": json.dumps({"temp": 21})})
        else:
            reply = client.chat.completions.create(model="m", messages=messages, tools=CHAT_TOOLS)
            seen.append((type(reply).__name__, reply.model_dump(exclude={"id", "created"})))
            messages.append(reply.choices[0].message)
            for call in reply.choices[0].message.tool_calls or []:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp": 21})})
    return seen


def _anthropic_loop(server: Any, stream: bool) -> list[Any]:
    client = anthropic.Anthropic(base_url=server.anthropic_base_url, api_key="sk-x", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "Weather?"}]
    seen: list[Any] = []
    for _ in range(2):
        if stream:
            with client.messages.stream(model="claude-x", max_tokens=100, messages=messages, tools=ANTHROPIC_TOOLS) as s:
                events = [type(e).__name__ for e in s]
                message = s.get_final_message()
            seen.append((events, message.model_dump(exclude={"id"})))
        else:
            message = client.messages.create(model="claude-x", max_tokens=100, messages=messages, tools=ANTHROPIC_TOOLS)
            seen.append(message.model_dump(exclude={"id"}))
        messages.append({"role": "assistant", "content": message.content})
        uses = [b for b in message.content if b.type == "tool_use"]
        if uses:
            messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "21"}]})
    return seen


def _normalise(seen: Any) -> Any:
    """Tool call ids differ from run to run of the fake server: blank them."""
    text = json.dumps(seen, default=str)
    import re

    return re.sub(r'"(call|toolu)_[A-Za-z0-9_]+"', '"<id>"', text)


TRACER = object()  # span start: the SDK tracer's start_span and loopscope's own fast path
SPAN_END = object()  # span end with its attributes: loopscope's fast path and the SDK path
DISPATCH = object()  # the span processor loopscope installs on the provider (an instance)
# every place an internal error can happen on the user's call path: (where, object, attribute, SDKs)
FAULTS: list[tuple[str, Any, str, tuple[str, ...]]] = [
    ("request reading", _calls, "start_model_call", ("openai", "anthropic")),
    ("response reading", stitch.ModelCall, "finish", ("openai", "anthropic")),
    ("span start", TRACER, "start_span", ("openai", "anthropic")),
    ("round end", turn_module, "_output_json", ("openai", "anthropic")),
    ("turn summary", semconv, "turn_attributes", ("openai", "anthropic")),
    ("span end", SPAN_END, "", ("openai", "anthropic")),
    ("json", _json, "dumps", ("openai", "anthropic")),
    ("chunk reading", openai_adapter._ChatChunks, "add", ("openai",)),
    ("event reading", anthropic_adapter._Events, "add", ("anthropic",)),
    ("span processor", DISPATCH, "", ("openai", "anthropic")),
    ("writer mapping", writer.StoreWriter, "_map", ("openai", "anthropic")),
    ("writer batch", writer, "write_batch", ("openai", "anthropic")),
]
STREAM_ONLY = {"chunk reading", "event reading"}
LOOPS = {"openai": _openai_loop, "anthropic": _anthropic_loop}
CASES = [
    (where, owner, name, sdk, stream)
    for where, owner, name, sdks in FAULTS
    for sdk in sdks
    for stream in ((True,) if where in STREAM_ONLY else (False, True))
]


def _reached(before: int, timeout: float = 60.0) -> bool:
    """Whether an internal error was reported since ``error_count`` was ``before``, asking the
    writer to write what it holds until one was, or ``timeout`` passed (for a loaded machine).
    A flush alone is no such wait: a fault in the writer's mapping drops the flush request taken
    with the batch, so ``flush(timeout=60)`` waited its whole minute, five tests of each run."""
    deadline = time.monotonic() + timeout
    while _guard.error_count <= before and time.monotonic() < deadline:
        loopscope.flush(timeout=0.5)
    return _guard.error_count > before


def _inject(monkeypatch: Any, recording: Any, owner: Any, name: str) -> None:
    if owner is TRACER:  # whichever way a span starts
        monkeypatch.setattr(recording.pipeline.tracer, "start_span", _boom)
        monkeypatch.setattr(spans_module, "_fast_start", _boom)
    elif owner is SPAN_END:
        monkeypatch.setattr(spans_module, "_fast_end", _boom)
        monkeypatch.setattr(spans_module, "set_attributes", _boom)
    elif owner is DISPATCH:
        dispatch = pipeline_module._dispatchers[id(recording.pipeline.tracer_provider)]
        monkeypatch.setattr(dispatch, "on_start", _boom)
        monkeypatch.setattr(dispatch, "on_end", _boom)
    else:
        monkeypatch.setattr(owner, name, _boom)


@pytest.mark.parametrize(
    ("where", "owner", "name", "sdk", "stream"), CASES, ids=[f"{c[3]}-{c[0]}-{'stream' if c[4] else 'json'}" for c in CASES]
)
def test_an_internal_error_never_changes_what_the_user_gets(
    recording, model_server, quiet, monkeypatch, where: str, owner: Any, name: str, sdk: str, stream: bool
) -> None:
    loop = LOOPS[sdk]
    _replies(model_server)
    expected = _normalise(loop(model_server, stream))  # uninstrumented
    _inject(monkeypatch, recording, owner, name)
    before = _guard.error_count
    loopscope.instrument()
    try:
        _replies(model_server)
        got = _normalise(loop(model_server, stream))
    finally:
        loopscope.uninstrument()
    assert got == expected
    assert _reached(before), f"the fault in {where} was not reached"


SDK_ERROR_FAULTS = [f[:3] for f in FAULTS if f[0] in ("request reading", "span start", "span end", "json")]


@pytest.mark.parametrize(("where", "owner", "name"), SDK_ERROR_FAULTS, ids=[f[0] for f in SDK_ERROR_FAULTS])
def test_the_users_sdk_exception_passes_through_a_failing_recorder(recording, model_server, quiet, monkeypatch, where, owner, name):
    model_server.queue(Reply.error(429))
    client = openai.OpenAI(base_url=model_server.openai_base_url, api_key="sk-x", max_retries=0)
    with pytest.raises(openai.RateLimitError) as plain:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    _inject(monkeypatch, recording, owner, name)
    loopscope.instrument()
    try:
        model_server.queue(Reply.error(429))
        with pytest.raises(openai.RateLimitError) as instrumented:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    finally:
        loopscope.uninstrument()
    assert instrumented.value.status_code == plain.value.status_code
    assert str(instrumented.value) == str(plain.value)


HAND_FAULTS = [
    ("span start", TRACER, "start_span"),
    ("round end", turn_module, "_output_message"),
    ("turn summary", semconv, "turn_attributes"),
    ("span end", SPAN_END, ""),
    ("json", _json, "dumps"),
    ("tool list", turn_module, "tool_set"),
    ("span processor", DISPATCH, ""),
    ("writer mapping", writer.StoreWriter, "_map"),
    ("writer batch", writer, "write_batch"),
]


@pytest.mark.parametrize(("where", "owner", "name"), HAND_FAULTS, ids=[f[0] for f in HAND_FAULTS])
def test_hand_api_with_a_failing_recorder_returns_and_raises_as_without(recording, quiet, monkeypatch, where, owner, name):
    @loopscope.tool
    def add(a: int, b: int) -> int:
        return a + b

    @loopscope.tool
    async def fail(reason: str) -> None:
        raise KeyError(reason)

    _inject(monkeypatch, recording, owner, name)
    before = _guard.error_count
    with loopscope.turn(session_id="s", agent="a", tools=[add]) as t:
        with t.round() as rnd:
            rnd.response("adding", tool_calls=[{"id": "c1", "name": "add", "arguments": {"a": 1, "b": 2}}])
        assert add(1, 2) == 3
        error = KeyError("why")
        with pytest.raises(KeyError) as caught:
            asyncio.run(fail("why"))
        assert caught.value.args == error.args and type(caught.value) is KeyError
        t.generation("3", finish_reason="stop")
    with pytest.raises(ValueError, match="mine") as mine, loopscope.turn(session_id="s2"):
        raise ValueError("mine")
    assert type(mine.value) is ValueError
    assert _reached(before), f"the fault in {where} was not reached"


def test_the_writer_recovers_after_a_failing_batch(recording, quiet, monkeypatch):
    """A batch the writer could not write because of a bug of ours is reported, and the
    writer goes on with the next ones."""
    monkeypatch.setattr(writer, "write_batch", _boom)
    before = _guard.error_count
    with loopscope.turn(session_id="lost", input="first"):
        pass
    assert _reached(before)  # reported
    monkeypatch.undo()
    with loopscope.turn(session_id="kept", input="second") as t:
        t.generation("ok", finish_reason="stop")
    assert loopscope.flush(timeout=10)
    assert [e.content.body for e in recording.store.get_timeline("kept")] == ["second", "ok"]


def test_a_flush_is_answered_when_the_writer_fails_to_map_its_spans(recording, quiet, monkeypatch):
    """A failure of ours while the writer maps the spans a flush waits for: the flush is
    answered (not written), at once, not after its whole timeout; the writer goes on."""
    import threading

    monkeypatch.setattr(writer.StoreWriter, "_map", _boom)
    with loopscope.turn(session_id="lost", input="first"):
        pass
    answered: list[bool] = []
    done = threading.Event()
    recording.pipeline.writer.flush_then(lambda ok: (answered.append(ok), done.set()))
    assert done.wait(30), "the flush was never answered"
    assert answered == [False]
    monkeypatch.undo()
    with loopscope.turn(session_id="kept", input="second") as t:
        t.generation("ok", finish_reason="stop")
    assert loopscope.flush(timeout=30)
    assert [e.content.body for e in recording.store.get_timeline("kept")] == ["second", "ok"]
