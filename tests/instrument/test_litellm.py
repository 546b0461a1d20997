"""LiteLLM through its callbacks: the real library from PyPI at the fake model server, on its openai and anthropic routes."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import threading
import time
from functools import partial
from typing import Any

import litellm
import pytest
from litellm.integrations.custom_logger import CustomLogger
from opentelemetry.trace import StatusCode

import interleaved
import loopscope
import switching
from fakes.model_server import FakeModelServer, Reply, Usage
from fakes.weather_loop import WEATHER, queue_tool_round
from loopscope import LoopEndReason
from loopscope import semconv as a
from loopscope._guard import clear_warning
from loopscope.instrument import litellm as loopscope_litellm
from recorded import (
    assert_hand_turn,
    assert_never_recorded,
    assert_one_cancelled_call,
    assert_one_failed_call,
)

API_KEY = "sk-litellm-test-5d1c9e07b3a2f684-secret"
MODELS = {"openai": "gpt-4.1-mini", "anthropic": "claude-haiku-4-5"}
QUESTION = "What's the weather in Paris?"
MODES = ["sync", "async", "stream", "astream"]
USAGE = {"include_usage": True}  # an OpenAI stream's usage (else LiteLLM counts tokens itself)


@pytest.fixture(autouse=True)
def own_callbacks():
    """Each test starts with LiteLLM's callback lists empty, and leaves them so."""
    names = ("callbacks", "input_callback", "success_callback", "failure_callback", "_async_success_callback",
             "_async_failure_callback")
    saved = {name: list(getattr(litellm, name)) for name in names}
    for name in names:
        getattr(litellm, name).clear()
    yield
    for name in names:
        setattr(litellm, name, saved[name])


def route(server: FakeModelServer, provider: str) -> dict[str, Any]:
    base = server.openai_base_url if provider == "openai" else server.anthropic_base_url
    return {"model": f"{provider}/{MODELS[provider]}", "api_base": base, "api_key": API_KEY, "num_retries": 0}


tool_round_script = partial(queue_tool_round, call_id="call_w1", usage=Usage(100, 20))


def settle(recording, chats: int, collect: bool = False) -> None:
    """Wait until ``chats`` model calls have ended, then for their rows: LiteLLM runs its success
    callbacks after it returned the response (a thread pool; its logging worker task). With
    ``collect``, collecting garbage meanwhile: a stream let go ends when LiteLLM's objects of it
    are collected, which LiteLLM's logging threads may hold a while yet."""
    wait_for(lambda: (not collect or gc.collect() >= 0) and len(recording.spans(a.OP_CHAT)) >= chats)
    loopscope.flush()


def wait_for(condition: Any) -> None:
    deadline = time.monotonic() + 30
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert condition()


# -- driving LiteLLM in each of its ways -------------------------------------------------------


def assembled(chunks: list[Any]) -> dict[str, Any]:
    """The assistant message a stream's chunks make (the test's own reading)."""
    text, calls = "", {}
    for chunk in chunks:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        text += delta.content or ""
        for part in delta.tool_calls or ():
            slot = calls.setdefault(part.index, {"id": None, "name": "", "arguments": ""})
            slot["id"] = slot["id"] or part.id
            slot["name"] = slot["name"] or (part.function.name or "")
            slot["arguments"] += part.function.arguments or ""
    return {"content": text or None, "tool_calls": [
        {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}} for _, c in sorted(calls.items())
    ]}


def message_of(response: Any) -> dict[str, Any]:
    message = response.choices[0].message
    return {"content": message.content, "tool_calls": [
        {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
        for c in message.tool_calls or ()
    ]}


def call(mode: str, kw: dict[str, Any], messages: list[Any]) -> dict[str, Any]:
    if mode == "sync":
        return message_of(litellm.completion(messages=messages, tools=[WEATHER], **kw))
    return assembled(list(litellm.completion(messages=messages, tools=[WEATHER], stream=True, stream_options=USAGE, **kw)))


async def acall(mode: str, kw: dict[str, Any], messages: list[Any]) -> dict[str, Any]:
    if mode == "async":
        return message_of(await litellm.acompletion(messages=messages, tools=[WEATHER], **kw))
    stream = await litellm.acompletion(messages=messages, tools=[WEATHER], stream=True, stream_options=USAGE, **kw)
    return assembled([chunk async for chunk in stream])


def follow_up(messages: list[Any], message: dict[str, Any], result: str) -> list[Any]:
    [use] = message["tool_calls"]
    return [*messages, {"role": "assistant", **message}, {"role": "tool", "tool_call_id": use["id"], "content": result}]


def run_loop(mode: str, kw: dict[str, Any], first_text: str = QUESTION) -> None:
    messages: list[Any] = [{"role": "user", "content": first_text}]
    if mode in ("sync", "stream"):
        message = call(mode, kw, messages)
        call(mode, kw, follow_up(messages, message, "21 C and sunny"))
        return

    async def main() -> None:
        message = await acall(mode, kw, messages)
        await acall(mode, kw, follow_up(messages, message, "21 C and sunny"))

    asyncio.run(main())


# -- the two-round tool loop -----------------------------------------------------------------------


def assert_tool_loop(recording, session: str, provider: str) -> Any:
    events = recording.store.get_timeline(session)
    kinds = [(e.type, getattr(e.content, "tool_id", None) or getattr(e.content, "body", None)) for e in events]
    assert kinds == [
        ("message", QUESTION),
        ("message", "Let me check the weather."),
        ("tool_call_start", "call_w1"),
        ("tool_call_end", "call_w1"),
        ("message", "It is 21 °C and sunny in Paris."),
    ]
    end = events[3].content
    assert (end.tool_name, end.arguments, end.result, end.status, end.outcome) == (
        "get_weather", {"city": "Paris"}, "21 C and sunny", "completed", "served",
    )
    [turn] = recording.store.list_turns(limit=None)
    assert {e.correlation_id for e in events} == {turn.correlation_id}
    assert turn.segments == ["Let me check the weather.", "It is 21 °C and sunny in Paris."]
    assert (turn.round_count, turn.tool_calls_count, turn.loop_end_reason) == (1, 1, LoopEndReason.COMPLETED)
    assert (turn.usage["input_tokens"], turn.usage["output_tokens"]) == (250, 30)
    assert [d.name for d in turn.declared_tools] == ["get_weather"]
    assert (turn.model, turn.provider) == (MODELS[provider], provider)  # as LiteLLM resolved them
    return turn


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize("mode", MODES)
def test_tool_loop_becomes_one_turn(instrumented, server, mode, provider):
    tool_round_script(server)
    with loopscope.session("conv-1"):
        run_loop(mode, route(server, provider))
    settle(instrumented, 2)
    turn = assert_tool_loop(instrumented, "conv-1", provider)
    assert turn.streaming is (mode in ("stream", "astream"))
    chats = instrumented.spans(a.OP_CHAT)
    [agent] = instrumented.spans(a.OP_INVOKE_AGENT)
    assert len(chats) == 2 and all(c.parent.span_id == agent.context.span_id for c in chats)
    assert [c.attributes[a.PROVIDER] for c in chats] == [provider, provider]
    assert [c.attributes[a.RESPONSE_FINISH_REASONS] for c in chats] == [("tool_calls",), ("stop",)]
    assert all(c.attributes[a.SERVER_ADDRESS] == "127.0.0.1" for c in chats)
    # LiteLLM's own cost beside ours: on the span and in the call's row
    figures = [json.loads(c.attributes[a.USAGE_PROVIDER]) for c in chats]
    assert all(f["litellm_response_cost"] > 0 for f in figures)
    _, rows = instrumented.store.sql("SELECT provider_usage, cost_usd FROM model_calls ORDER BY started_at")
    assert len(rows) == 2
    for (usage, cost), f in zip(rows, figures):
        assert json.loads(usage)["litellm_response_cost"] == pytest.approx(f["litellm_response_cost"])
        assert cost is not None and cost > 0  # ours, from the same usage


@pytest.mark.parametrize("mode", ["sync", "astream"])
def test_hand_written_turn_holds_the_litellm_calls(instrumented, server, mode):
    tool_round_script(server)
    with loopscope.turn(session_id="hand", agent="weatherbot", tools=[WEATHER], input=QUESTION) as t:
        run_loop(mode, route(server, "openai"))
        settle(instrumented, 2)
    assert_hand_turn(instrumented, t.response, tool_spans=1)


# -- usage: LiteLLM's through the kit's reader ------------------------------------------------------

CACHE = ("cache_read_input_tokens", "cache_creation_input_tokens")


def sdk_call(server: FakeModelServer, provider: str) -> None:
    """The same question through the provider's own SDK (the openai or anthropic adapter records it)."""
    messages = [{"role": "user", "content": QUESTION}]
    if provider == "openai":
        server.openai_client().chat.completions.create(model=MODELS[provider], messages=messages)
    else:
        server.anthropic_client().messages.create(model=MODELS[provider], max_tokens=64, messages=messages)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize("mode", ["sync", "stream"])
def test_reported_zero_cache_counts_are_stored_as_through_the_providers_sdk(instrumented, server, provider, mode):
    """A provider that says it read and wrote no cache: its zeros are figures, stored through
    LiteLLM as the openai and anthropic adapters store them for the very same answer (LiteLLM's
    own reader of the usage dropped them: "not reported")."""
    server.queue(Reply(text="Sunny.", usage=Usage(100, 20)), Reply(text="Sunny.", usage=Usage(100, 20)))
    with loopscope.session("via-litellm"):
        if mode == "sync":
            litellm.completion(messages=[{"role": "user", "content": QUESTION}], **route(server, provider))
        else:
            list(litellm.completion(messages=[{"role": "user", "content": QUESTION}], stream=True, stream_options=USAGE,
                                    **route(server, provider)))
        settle(instrumented, 1)
    with loopscope.session("via-sdk"):
        sdk_call(server, provider)
    assert loopscope.flush()
    usage = {row.session_id: row.usage for row in instrumented.store.model_calls()}
    assert {k: usage["via-litellm"].get(k) for k in CACHE} == {k: usage["via-sdk"].get(k) for k in CACHE} == dict.fromkeys(CACHE, 0)
    assert (usage["via-litellm"]["input_tokens"], usage["via-litellm"]["output_tokens"]) == (100, 20)


@pytest.mark.parametrize("mode", ["sync", "stream"])
def test_anthropic_cache_reads_and_writes_through_litellm(instrumented, server, mode):
    """Anthropic's cache figures as LiteLLM maps them (its prompt tokens count them in), beside
    LiteLLM's cost: the call's row holds the reads and the writes."""
    server.queue(Reply(text="Sunny.", usage=Usage(100, 20, cached_tokens=30, cache_creation_tokens=10)))
    kw = route(server, "anthropic")
    if mode == "sync":
        litellm.completion(messages=[{"role": "user", "content": QUESTION}], **kw)
    else:
        list(litellm.completion(messages=[{"role": "user", "content": QUESTION}], stream=True, **kw))
    settle(instrumented, 1)
    loopscope.flush()
    [row] = instrumented.store.model_calls()
    assert {k: row.usage.get(k) for k in CACHE} == {"cache_read_input_tokens": 30, "cache_creation_input_tokens": 10}
    _, [(figures,)] = instrumented.store.sql("SELECT provider_usage FROM model_calls")
    assert json.loads(figures)["litellm_response_cost"] > 0


# -- errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("status, error", [(500, "InternalServerError"), (429, "RateLimitError")])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_failing_call_is_an_error_of_litellms_type(instrumented, server, mode, status, error):
    server.queue(Reply.error(status, "the fake says no"))
    kw = route(server, "openai")
    messages = [{"role": "user", "content": QUESTION}]
    with pytest.raises(Exception) as caught:
        if mode == "sync":
            litellm.completion(messages=messages, **kw)
        else:
            asyncio.run(litellm.acompletion(messages=messages, **kw))
    assert type(caught.value).__name__ == error and type(caught.value).__module__.startswith("litellm")
    settle(instrumented, 1)
    assert_one_failed_call(instrumented, error)


# -- concurrency ---------------------------------------------------------------------------------------


def test_twenty_interleaved_async_conversations(instrumented, server):
    """Half through LiteLLM's OpenAI route, half its Anthropic one."""
    interleaved.run_async(instrumented, server, seed=11, queue=partial(tool_round_script, server), call_id="call_c{i:02d}",
                          client=lambda i: route(server, ["openai", "anthropic"][(i // 2) % 2]), modes=["async", "astream"],
                          call=lambda kw, mode, messages: acall(mode, kw, messages), follow_up=follow_up,
                          settle=lambda: settle(instrumented, 40))


# -- streams let go early ------------------------------------------------------------------------------


def test_a_stream_closed_early_ends_its_call_once(instrumented, server):
    server.queue(Reply(text="one two three four five six seven eight nine ten eleven twelve"))
    stream = litellm.completion(messages=[{"role": "user", "content": "Count"}], stream=True, **route(server, "openai"))
    for _, _chunk in zip(range(3), stream):
        pass
    stream.close()
    del stream, _chunk
    settle(instrumented, 1, collect=True)

    def hello() -> None:
        server.queue(Reply(text="Hello."))
        litellm.completion(messages=[{"role": "user", "content": "Hi"}], **route(server, "openai"))
        settle(instrumented, 2)

    assert_one_cancelled_call(instrumented, then=hello)


def test_an_async_stream_closed_early_ends_its_call_once(instrumented, server):
    server.queue(Reply(text="one two three four five six seven eight nine ten eleven twelve"))

    async def main() -> None:
        stream = await litellm.acompletion(messages=[{"role": "user", "content": "Count"}], stream=True, **route(server, "anthropic"))
        async for _chunk in stream:
            break
        await stream.aclose()

    asyncio.run(main())
    settle(instrumented, 1, collect=True)
    assert_one_cancelled_call(instrumented)


@pytest.mark.parametrize("mode", ["stream", "astream"])
def test_a_stream_broken_midway_is_an_error(instrumented, server, mode):
    server.queue(Reply.stream_failure(after=4))
    with pytest.raises(Exception) as caught:
        if mode == "stream":
            list(litellm.completion(messages=[{"role": "user", "content": "Count"}], stream=True, **route(server, "openai")))
        else:
            asyncio.run(acall("astream", route(server, "openai"), [{"role": "user", "content": "Count"}]))
    settle(instrumented, 1)
    [chat] = instrumented.spans(a.OP_CHAT)
    # the error LiteLLM reports to its callbacks: the provider's (APIError), which the one it
    # raises to the application (MidStreamFallbackError) wraps
    assert type(caught.value).__module__.startswith("litellm")
    assert chat.status.status_code is StatusCode.ERROR and hasattr(litellm.exceptions, chat.attributes[a.ERROR_TYPE])
    [turn] = instrumented.store.list_turns(limit=None)
    assert turn.loop_end_reason == LoopEndReason.ERROR


# -- secrets ------------------------------------------------------------------------------------------


def test_api_keys_and_authorization_headers_are_never_recorded(instrumented, server):
    tool_round_script(server)
    tool_round_script(server)
    run_loop("stream", route(server, "openai"))
    run_loop("async", route(server, "anthropic"))
    settle(instrumented, 4)
    assert server.requests[0].headers["authorization"] == f"Bearer {API_KEY}"
    assert server.requests[-1].headers["x-api-key"] == API_KEY
    assert_never_recorded(instrumented, API_KEY, "x-api-key", "authorization", "Bearer", present=("get_weather", "sunny"))


# -- LiteLLM's callback lists ------------------------------------------------------------------------------


class Theirs(CustomLogger):
    """The application's own logger."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        self.seen.append(kwargs["litellm_call_id"])


def ours(listed: list[Any]) -> list[Any]:
    return [c for c in listed if type(c).__name__ == "LoopscopeLogger"]


def test_instrument_twice_is_once_and_uninstrument_restores(recording, server):
    """Loopscope's callbacks are put in once and taken out again; the application's stay, first."""
    theirs = Theirs()
    litellm.callbacks.append(theirs)
    names = ("input_callback", "success_callback", "failure_callback", "_async_success_callback", "_async_failure_callback")

    def calls() -> None:
        assert litellm.callbacks[0] is theirs and len(ours(litellm.callbacks)) == 1
        assert all(len(ours(getattr(litellm, name))) == 1 for name in ("input_callback", "success_callback", "_async_success_callback"))
        server.queue(Reply(text="Hello."))
        litellm.completion(messages=[{"role": "user", "content": "Hi"}], **route(server, "openai"))
        settle(recording, 1)

    def after() -> None:
        assert litellm.callbacks == [theirs]
        server.queue(Reply(text="Hello again."))
        litellm.completion(messages=[{"role": "user", "content": "Hi"}], **route(server, "openai"))
        wait_for(lambda: len(theirs.seen) == 2)  # theirs kept hearing every call

    switching.assert_instrument_twice_is_once(
        recording, chats=1, calls=calls, after=after,
        originals=lambda: (list(litellm.callbacks), [ours(getattr(litellm, name)) for name in names],
                           litellm.completion, litellm.acompletion))


def test_callbacks_the_application_sets_after_instrument_keep_ours(instrumented, server):
    theirs = Theirs()
    litellm.callbacks = [theirs]  # replaced, after instrument()
    tool_round_script(server)
    with loopscope.session("conv-set"):
        run_loop("async", route(server, "openai"))
    settle(instrumented, 2)
    assert_tool_loop(instrumented, "conv-set", "openai")
    assert litellm.callbacks[0] is theirs and len(ours(litellm.callbacks)) == 1  # theirs left as set, ours appended
    wait_for(lambda: len(theirs.seen) == 2)


# -- one call, one record -----------------------------------------------------------------------------------


def test_a_route_through_the_wrapped_openai_sdk_is_recorded_once(instrumented, server):
    """LiteLLM's Azure route calls the openai SDK's ``chat.completions.create``, which loopscope wraps too."""
    tool_round_script(server)
    kw = {"model": "azure/my-deployment", "api_base": server.url, "api_key": API_KEY, "api_version": "2024-10-21", "num_retries": 0}
    with loopscope.session("conv-azure"):
        run_loop("sync", kw)
    settle(instrumented, 2)
    assert [r.path for r in server.requests] == ["/openai/deployments/my-deployment/chat/completions"] * 2
    chats = instrumented.spans(a.OP_CHAT)
    assert len(chats) == 2 and {c.attributes[a.PROVIDER] for c in chats} == {"azure"}
    _, [(count,)] = instrumented.store.sql("SELECT count(*) FROM model_calls")
    assert count == 2 and len(instrumented.store.list_turns(limit=None)) == 1


def test_the_openai_sdk_called_inside_a_litellm_callback_is_a_call_of_its_own(instrumented, server):
    client = server.openai_client()
    asked: list[str] = []

    class Asks(CustomLogger):
        def log_pre_api_call(self, model: Any, messages: Any, kwargs: Any) -> None:
            reply = client.chat.completions.create(model="gpt-4.1-mini", messages=[{"role": "user", "content": "Is this polite?"}])
            asked.append(reply.choices[0].message.content)

    litellm.callbacks.append(Asks())
    server.queue(Reply(text="Yes."), match="Is this polite?")
    server.queue(Reply(text="Hello."), match="Hi")
    litellm.completion(messages=[{"role": "user", "content": "Hi"}], **route(server, "openai"))
    settle(instrumented, 2)
    assert asked == ["Yes."]
    chats = instrumented.spans(a.OP_CHAT)
    assert sorted(c.attributes[a.ROUND_TEXT] for c in chats) == ["Hello.", "Yes."]
    _, [(count,)] = instrumented.store.sql("SELECT count(*) FROM model_calls")
    assert count == 2


# -- LiteLLM's late success callbacks ----------------------------------------------------------------


class Slow(CustomLogger):
    """An application's logger whose success callback takes its time: LiteLLM runs it before
    ours (it was registered first), so each answer is recorded well after LiteLLM returned it."""

    def log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        time.sleep(0.3)

    async def async_log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        await asyncio.sleep(0.3)


@pytest.mark.parametrize("mode", MODES)
def test_the_next_request_waits_for_the_answer_litellm_records_late(recording, server, mode):
    litellm.callbacks.append(Slow())
    loopscope.instrument()
    try:
        tool_round_script(server)
        with loopscope.session("conv-late"):
            run_loop(mode, route(server, "openai"))
        settle(recording, 2)
        assert_tool_loop(recording, "conv-late", "openai")
    finally:
        loopscope.uninstrument()


class Held(CustomLogger):
    """An application's logger whose success callback holds LiteLLM's report of each call
    (ours comes after it) until the test lets go."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()

    def log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        self.go.wait(30)

    async def async_log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        while not self.go.is_set():
            await asyncio.sleep(0.005)


@pytest.mark.parametrize("mode", MODES)
def test_the_next_round_goes_on_with_the_answer_completion_returned(recording, server, monkeypatch, caplog, mode):
    """A round's answer is recorded from what ``completion()`` / ``acompletion()`` returned
    (a stream's: as LiteLLM assembled it at its end) when the next round goes on from it:
    that request does not wait for LiteLLM's success callbacks (its whole success handling,
    on its thread pool or logging task), held here until both rounds were sent. The first
    round is recorded by then (ended by the second request, not by LiteLLM's report of it),
    and the turn is the one LiteLLM's callbacks make."""
    held = Held()
    # in the lists LiteLLM reports from, before ours (instrument() appends ours)
    litellm.success_callback.append(held)
    litellm._async_success_callback.append(held)
    monkeypatch.setattr(loopscope_litellm, "WAIT_S", 0.5)  # a wait that happened would end soon, and be said
    clear_warning("litellm late")
    loopscope.instrument()
    try:
        tool_round_script(server)
        with loopscope.session("conv-held"), caplog.at_level(logging.WARNING, logger="loopscope"):
            if mode in ("sync", "stream"):
                run_loop(mode, route(server, "openai"))
                assert len(recording.spans(a.OP_CHAT)) == 1  # the first, ended by the second request
            else:

                async def main() -> None:
                    messages: list[Any] = [{"role": "user", "content": QUESTION}]
                    message = await acall(mode, route(server, "openai"), messages)
                    await acall(mode, route(server, "openai"), follow_up(messages, message, "21 C and sunny"))
                    assert "had not reported a call" not in caplog.text
                    assert len(recording.spans(a.OP_CHAT)) == 1  # the first, ended by the second request
                    held.go.set()  # in the loop: LiteLLM's logging task reports the last call now
                    while len(recording.spans(a.OP_CHAT)) < 2:
                        await asyncio.sleep(0.005)

                asyncio.run(main())
        assert "had not reported a call" not in caplog.text  # it did not wait
        held.go.set()
        settle(recording, 2)
        turn = assert_tool_loop(recording, "conv-held", "openai")
        assert turn.streaming is (mode in ("stream", "astream"))
        chats = recording.spans(a.OP_CHAT)
        # LiteLLM's cost of each call: of the first from its response, of the last from its callback
        figures = [json.loads(c.attributes[a.USAGE_PROVIDER]) for c in chats]
        assert len(figures) == 2 and all(f["litellm_response_cost"] > 0 for f in figures)
        if mode in ("stream", "astream"):  # the first chunk's time, from LiteLLM's stamp of it
            assert all(0 < c.attributes[a.TIME_TO_FIRST_CHUNK] <= (c.end_time - c.start_time) / 1e9 for c in chats)
    finally:
        held.go.set()
        loopscope.uninstrument()


def test_a_new_conversation_does_not_wait_for_the_last_answer_to_be_recorded(recording, server, monkeypatch, caplog):
    """Only a request that goes on from the last call (its answer, its tool results) waits for
    that call to be recorded: one that starts a conversation afresh is sent at once (the wait
    would add LiteLLM's whole success handling to it), and each is its own turn once reported."""
    go = threading.Event()
    success = loopscope_litellm._success

    def held(kwargs: Any, response: Any) -> None:  # LiteLLM's report of a call, held until let go
        go.wait(30)
        success(kwargs, response)

    monkeypatch.setattr(loopscope_litellm, "_success", held)
    monkeypatch.setattr(loopscope_litellm, "WAIT_S", 0.5)  # a wait that happened would end soon, and be said
    clear_warning("litellm late")
    loopscope.instrument()
    try:
        server.queue(Reply(text="Bonjour."), match="in French")
        server.queue(Reply(text="Hallo."), match="in German")
        litellm.completion(messages=[{"role": "user", "content": "Hello in French?"}], **route(server, "openai"))
        with caplog.at_level(logging.WARNING, logger="loopscope"):
            litellm.completion(messages=[{"role": "user", "content": "Hello in German?"}], **route(server, "openai"))
        assert "had not reported a call" not in caplog.text  # it did not wait
        go.set()
        settle(recording, 2)
        turns = recording.store.list_turns(limit=None)
        assert sorted(t.segments[0] for t in turns) == ["Bonjour.", "Hallo."]
        assert len({t.correlation_id for t in turns}) == 2
    finally:
        go.set()
        loopscope.uninstrument()
