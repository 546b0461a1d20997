"""The fake model server, driven by the real openai and anthropic SDKs."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import anthropic
import httpx2
import openai
import pydantic
import pytest

from .model_server import FakeModelServer, Reply, ToolCall, Usage

OPENAI_MODEL = "gpt-4o"
CLAUDE_MODEL = "claude-sonnet-4-6"  # not in the SDK's deprecated list (that one warns)

_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather.", "parameters": _SCHEMA}},
    {"type": "function", "function": {"name": "get_time", "description": "Time.", "parameters": _SCHEMA}},
]
RESPONSES_TOOLS = [
    {"type": "function", "name": "get_weather", "description": "Weather.", "parameters": _SCHEMA, "strict": False},
    {"type": "function", "name": "get_time", "description": "Time.", "parameters": _SCHEMA, "strict": False},
]
ANTHROPIC_TOOLS = [
    {"name": "get_weather", "description": "Weather.", "input_schema": _SCHEMA},
    {"name": "get_time", "description": "Time.", "input_schema": _SCHEMA},
]

APIS = ("chat", "responses", "messages")
MODES = ("json", "stream", "helper")


# --------------------------------------------------------------------------------------------------------------------
# A tool loop, one round at a time, for every API x mode, sync and async; rounds are normalised for comparison
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class Round:
    text: str
    calls: list[tuple[str, str, dict[str, Any]]]  # (id, name, arguments)
    finish: str | None
    usage: dict[str, int | None]
    extra: dict[str, Any] = field(default_factory=dict)


def script_for(city: str = "Paris", *, delay: float = 0.0) -> list[Reply]:
    return [
        Reply(
            text="Let me look that up.",
            tool_calls=[ToolCall("get_weather", {"city": city}, id="call_given_1"),
                        ToolCall("get_time", {"city": city})],
            usage=Usage(input_tokens=100, output_tokens=20, cached_tokens=64, cache_creation_tokens=8,
                        reasoning_tokens=5),
            delay=delay,
        ),
        Reply(text=f"It is 21 °C in {city} at 14:00.", usage=Usage(input_tokens=150, output_tokens=12)),
    ]


def first_input(api: str, marker: str) -> list[dict[str, Any]]:  # the same shape for all three APIs
    return [{"role": "user", "content": f"{marker} What is the weather like?"}]


def extend_history(api: str, history: list[dict[str, Any]], rnd: Round) -> None:
    results = [(cid, f"{name} -> ok") for cid, name, _ in rnd.calls]
    if api == "chat":
        history.append({
            "role": "assistant", "content": rnd.text or None,
            "tool_calls": [{"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                           for cid, name, args in rnd.calls],
        })
        history += [{"role": "tool", "tool_call_id": cid, "content": out} for cid, out in results]
    elif api == "responses":
        if rnd.text:
            history.append({"role": "assistant", "content": rnd.text})
        history += [{"type": "function_call", "call_id": cid, "name": name, "arguments": json.dumps(args)}
                    for cid, name, args in rnd.calls]
        history += [{"type": "function_call_output", "call_id": cid, "output": out} for cid, out in results]
    else:
        blocks: list[dict[str, Any]] = [{"type": "text", "text": rnd.text}] if rnd.text else []
        blocks += [{"type": "tool_use", "id": cid, "name": name, "input": args} for cid, name, args in rnd.calls]
        history.append({"role": "assistant", "content": blocks})
        history.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": cid, "content": out}
                                                    for cid, out in results]})


def chat_usage(u: Any) -> dict[str, int | None]:
    return {"input": u.prompt_tokens, "output": u.completion_tokens, "total": u.total_tokens,
            "cached": u.prompt_tokens_details.cached_tokens,
            "reasoning": u.completion_tokens_details.reasoning_tokens}


def responses_usage(u: Any) -> dict[str, int | None]:
    return {"input": u.input_tokens, "output": u.output_tokens, "total": u.total_tokens,
            "cached": u.input_tokens_details.cached_tokens,
            "reasoning": u.output_tokens_details.reasoning_tokens}


def anthropic_usage(u: Any) -> dict[str, int | None]:
    return {"input": u.input_tokens, "output": u.output_tokens, "cache_read": u.cache_read_input_tokens,
            "cache_creation": u.cache_creation_input_tokens}


def chat_round_from_completion(c: Any) -> Round:
    choice = c.choices[0]
    calls = [(tc.id, tc.function.name, json.loads(tc.function.arguments)) for tc in choice.message.tool_calls or []]
    return Round(choice.message.content or "", calls, choice.finish_reason, chat_usage(c.usage))


def responses_round_from_response(r: Any) -> Round:
    calls = [(it.call_id, it.name, json.loads(it.arguments)) for it in r.output if it.type == "function_call"]
    return Round(r.output_text, calls, r.status, responses_usage(r.usage))


def anthropic_round_from_message(m: Any) -> Round:
    text = "".join(b.text for b in m.content if b.type == "text")
    calls = [(b.id, b.name, dict(b.input)) for b in m.content if b.type == "tool_use"]
    return Round(text, calls, m.stop_reason, anthropic_usage(m.usage))


class _ChatChunks:
    """Accumulates raw ChatCompletionChunk objects the way a hand-written consumer would."""

    def __init__(self) -> None:
        self.text = ""
        self.calls: dict[int, dict[str, str]] = {}
        self.finish: str | None = None
        self.usage: Any = None
        self.roles: list[str] = []

    def add(self, chunk: Any) -> None:
        assert chunk.object == "chat.completion.chunk"
        if chunk.usage is not None:
            self.usage = chunk.usage
        for ch in chunk.choices:
            d = ch.delta
            if d.role:
                self.roles.append(d.role)
            self.text += d.content or ""
            for tc in d.tool_calls or []:
                acc = self.calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                if tc.id:
                    assert not acc["id"], "the id comes once, in the first delta of a tool call"
                    acc["id"] = tc.id
                if tc.function and tc.function.name:
                    acc["name"] += tc.function.name
                if tc.function and tc.function.arguments:
                    acc["arguments"] += tc.function.arguments
            if ch.finish_reason:
                self.finish = ch.finish_reason

    def round(self) -> Round:
        assert self.roles == ["assistant"]
        calls = [(c["id"], c["name"], json.loads(c["arguments"])) for _, c in sorted(self.calls.items())]
        return Round(self.text, calls, self.finish, chat_usage(self.usage))


class _ResponsesEvents:
    def __init__(self) -> None:
        self.types: list[str] = []
        self.args: dict[str, str] = {}
        self.text = ""
        self.final: Any = None

    def add(self, ev: Any) -> None:
        self.types.append(ev.type)
        if ev.type == "response.output_text.delta":
            self.text += ev.delta
        elif ev.type == "response.function_call_arguments.delta":
            self.args[ev.item_id] = self.args.get(ev.item_id, "") + ev.delta
        elif ev.type == "response.function_call_arguments.done":
            assert self.args[ev.item_id] == ev.arguments
        elif ev.type == "response.completed":
            self.final = ev.response

    def round(self) -> Round:
        assert self.types[0] == "response.created" and self.types[-1] == "response.completed"
        rnd = responses_round_from_response(self.final)
        assert self.text == rnd.text
        return rnd


class _AnthropicEvents:
    def __init__(self) -> None:
        self.types: list[str] = []
        self.blocks: dict[int, dict[str, Any]] = {}
        self.stop: str | None = None
        self.usage: dict[str, Any] = {}

    def add(self, ev: Any) -> None:
        self.types.append(ev.type)
        if ev.type == "message_start":
            self.usage = ev.message.usage.to_dict()
        elif ev.type == "content_block_start":
            self.blocks[ev.index] = {**ev.content_block.to_dict(), "json": ""}
        elif ev.type == "content_block_delta":
            b = self.blocks[ev.index]
            if ev.delta.type == "text_delta":
                b["text"] += ev.delta.text
            elif ev.delta.type == "input_json_delta":
                b["json"] += ev.delta.partial_json
        elif ev.type == "message_delta":
            self.stop = ev.delta.stop_reason
            self.usage.update({k: v for k, v in ev.usage.to_dict().items() if v is not None})

    def round(self) -> Round:
        assert self.types[0] == "message_start" and self.types[-1] == "message_stop"
        text = "".join(b["text"] for _, b in sorted(self.blocks.items()) if b["type"] == "text")
        calls = [(b["id"], b["name"], json.loads(b["json"])) for _, b in sorted(self.blocks.items())
                 if b["type"] == "tool_use"]
        u = anthropic.types.Usage(**self.usage)
        return Round(text, calls, self.stop, anthropic_usage(u))


def round_sync(client: Any, api: str, mode: str, history: list[dict[str, Any]]) -> Round:
    if api == "chat":
        kw = {"model": OPENAI_MODEL, "messages": history, "tools": CHAT_TOOLS}
        if mode == "json":
            return chat_round_from_completion(client.chat.completions.create(**kw))
        if mode == "stream":
            acc = _ChatChunks()
            for chunk in client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}):
                acc.add(chunk)
            return acc.round()
        with client.chat.completions.stream(**kw, stream_options={"include_usage": True}) as stream:
            kinds = {ev.type for ev in stream}
            rnd = chat_round_from_completion(stream.get_final_completion())
        assert "chunk" in kinds and ("content.done" in kinds or not rnd.text)
        assert ("tool_calls.function.arguments.done" in kinds) == bool(rnd.calls)
        return rnd
    if api == "responses":
        kw = {"model": OPENAI_MODEL, "input": history, "tools": RESPONSES_TOOLS}
        if mode == "json":
            return responses_round_from_response(client.responses.create(**kw))
        if mode == "stream":
            acc = _ResponsesEvents()
            for ev in client.responses.create(**kw, stream=True):
                acc.add(ev)
            return acc.round()
        with client.responses.stream(**kw) as stream:
            kinds = {ev.type for ev in stream}
            rnd = responses_round_from_response(stream.get_final_response())
        assert "response.completed" in kinds
        return rnd
    kw = {"model": CLAUDE_MODEL, "max_tokens": 1024, "messages": history, "tools": ANTHROPIC_TOOLS}
    if mode == "json":
        return anthropic_round_from_message(client.messages.create(**kw))
    if mode == "stream":
        acc = _AnthropicEvents()
        for ev in client.messages.create(**kw, stream=True):
            acc.add(ev)
        return acc.round()
    with client.messages.stream(**kw) as stream:
        text = "".join(stream.text_stream)
        rnd = anthropic_round_from_message(stream.get_final_message())
    assert text == rnd.text
    return rnd


async def round_async(client: Any, api: str, mode: str, history: list[dict[str, Any]]) -> Round:
    if api == "chat":
        kw = {"model": OPENAI_MODEL, "messages": history, "tools": CHAT_TOOLS}
        if mode == "json":
            return chat_round_from_completion(await client.chat.completions.create(**kw))
        if mode == "stream":
            acc = _ChatChunks()
            async for chunk in await client.chat.completions.create(
                **kw, stream=True, stream_options={"include_usage": True}
            ):
                acc.add(chunk)
            return acc.round()
        async with client.chat.completions.stream(**kw, stream_options={"include_usage": True}) as stream:
            kinds = {ev.type async for ev in stream}
            rnd = chat_round_from_completion(await stream.get_final_completion())
        assert "chunk" in kinds
        return rnd
    if api == "responses":
        kw = {"model": OPENAI_MODEL, "input": history, "tools": RESPONSES_TOOLS}
        if mode == "json":
            return responses_round_from_response(await client.responses.create(**kw))
        if mode == "stream":
            acc = _ResponsesEvents()
            async for ev in await client.responses.create(**kw, stream=True):
                acc.add(ev)
            return acc.round()
        async with client.responses.stream(**kw) as stream:
            kinds = {ev.type async for ev in stream}
            rnd = responses_round_from_response(await stream.get_final_response())
        assert "response.completed" in kinds
        return rnd
    kw = {"model": CLAUDE_MODEL, "max_tokens": 1024, "messages": history, "tools": ANTHROPIC_TOOLS}
    if mode == "json":
        return anthropic_round_from_message(await client.messages.create(**kw))
    if mode == "stream":
        acc = _AnthropicEvents()
        async for ev in await client.messages.create(**kw, stream=True):
            acc.add(ev)
        return acc.round()
    async with client.messages.stream(**kw) as stream:
        text = "".join([t async for t in stream.text_stream])
        rnd = anthropic_round_from_message(await stream.get_final_message())
    assert text == rnd.text
    return rnd


def loop_sync(client: Any, api: str, mode: str, marker: str) -> list[Round]:
    history = first_input(api, marker)
    rounds: list[Round] = []
    for _ in range(4):
        rnd = round_sync(client, api, mode, history)
        rounds.append(rnd)
        if not rnd.calls:
            break
        extend_history(api, history, rnd)
    return rounds


async def loop_async(client: Any, api: str, mode: str, marker: str) -> list[Round]:
    history = first_input(api, marker)
    rounds: list[Round] = []
    for _ in range(4):
        rnd = await round_async(client, api, mode, history)
        rounds.append(rnd)
        if not rnd.calls:
            break
        extend_history(api, history, rnd)
    return rounds


def client_for(server: FakeModelServer, api: str, *, is_async: bool) -> Any:
    if api == "messages":
        return server.async_anthropic_client() if is_async else server.anthropic_client()
    return server.async_openai_client() if is_async else server.openai_client()


def check_loop(server: FakeModelServer, api: str, mode: str, marker: str, rounds: list[Round], city: str) -> None:
    assert len(rounds) == 2
    first, second = rounds
    assert first.text == "Let me look that up."
    assert second.text == f"It is 21 °C in {city} at 14:00."
    assert [(name, args) for _, name, args in first.calls] == [("get_weather", {"city": city}),
                                                               ("get_time", {"city": city})]
    assert first.calls[0][0] == "call_given_1"
    generated = first.calls[1][0]
    assert generated.startswith("toolu_" if api == "messages" else "call_") and generated != "call_given_1"
    assert second.calls == []
    if api == "chat":
        assert (first.finish, second.finish) == ("tool_calls", "stop")
        assert first.usage == {"input": 100, "output": 20, "total": 120, "cached": 64, "reasoning": 5}
        assert second.usage == {"input": 150, "output": 12, "total": 162, "cached": 0, "reasoning": 0}
    elif api == "responses":
        assert (first.finish, second.finish) == ("completed", "completed")
        assert first.usage == {"input": 100, "output": 20, "total": 120, "cached": 64, "reasoning": 5}
        assert second.usage == {"input": 150, "output": 12, "total": 162, "cached": 0, "reasoning": 0}
    else:
        assert (first.finish, second.finish) == ("tool_use", "end_turn")
        assert first.usage == {"input": 100, "output": 20, "cache_read": 64, "cache_creation": 8}
        assert second.usage == {"input": 150, "output": 12, "cache_read": 0, "cache_creation": 0}

    reqs = server.requests_for(marker)
    assert [r.api for r in reqs] == [api, api]
    assert [r.stream for r in reqs] == [mode != "json"] * 2
    assert [r.script for r in reqs] == [marker, marker]
    assert reqs[0].tool_results == []
    assert [t["id"] for t in reqs[1].tool_results] == [cid for cid, _, _ in first.calls]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("api", APIS)
def test_tool_loop_sync(model_server: FakeModelServer, api: str, mode: str) -> None:
    marker = f"[{api}-{mode}-sync]"
    model_server.queue(*script_for(), match=marker)
    with client_for(model_server, api, is_async=False) as client:
        rounds = loop_sync(client, api, mode, marker)
    check_loop(model_server, api, mode, marker, rounds, "Paris")
    model_server.assert_all_served()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("api", APIS)
def test_tool_loop_async(model_server: FakeModelServer, api: str, mode: str) -> None:
    marker = f"[{api}-{mode}-async]"
    model_server.queue(*script_for("Oslo"), match=marker)

    async def main() -> list[Round]:
        async with client_for(model_server, api, is_async=True) as client:
            return await loop_async(client, api, mode, marker)

    check_loop(model_server, api, mode, marker, asyncio.run(main()), "Oslo")


def test_fifty_concurrent_async_conversations(model_server: FakeModelServer) -> None:
    """Each conversation is keyed by a marker in its first user message and gets its own script; every first
    round is held until all fifty first rounds have arrived, which a server serving them one at a time never
    sees (it would hang, then drop them)."""
    n = 50
    combos = [(api, mode) for api in APIS for mode in MODES]
    gate = threading.Event()
    for i in range(n):
        first, second = script_for(f"City{i:02d}")
        first.hold = gate
        model_server.queue(first, second, match=f"[conv-{i:02d}]")
    arrived: list[int] = []

    def open_gate() -> None:
        arrived.append(len(model_server.wait_for_requests(n, timeout=60)))
        gate.set()

    threading.Thread(target=open_gate, daemon=True).start()

    async def main() -> list[list[Round]]:
        # fifty connections at once: a loaded machine's server accepts them in more than the SDKs'
        # 5 s connect timeout (CI's core run, 4 workers on 2 cores, did not); a number sets every timeout
        patient = 120.0
        async with model_server.async_openai_client(timeout=patient) as oc, \
                model_server.async_anthropic_client(timeout=patient) as ac:
            return await asyncio.gather(*[
                loop_async(ac if combos[i % 9][0] == "messages" else oc, *combos[i % 9], f"[conv-{i:02d}]")
                for i in range(n)
            ])

    results = asyncio.run(main())
    assert arrived == [n], "the first rounds were not all in flight at once"
    for i, rounds in enumerate(results):
        api, mode = combos[i % 9]
        check_loop(model_server, api, mode, f"[conv-{i:02d}]", rounds, f"City{i:02d}")
    assert len(model_server.requests) == 2 * n
    model_server.assert_all_served()


# --------------------------------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------------------------------

EXPECTED_ERRORS = {
    ("chat", 429): openai.RateLimitError,
    ("chat", 500): openai.InternalServerError,
    ("responses", 429): openai.RateLimitError,
    ("responses", 500): openai.InternalServerError,
    ("messages", 429): anthropic.RateLimitError,
    ("messages", 500): anthropic.InternalServerError,
    ("messages", 529): anthropic.OverloadedError,
}


def call_once_sync(client: Any, api: str, stream: bool) -> Any:
    history = first_input(api, "[err]")
    if api == "chat":
        out = client.chat.completions.create(model=OPENAI_MODEL, messages=history, stream=stream)
    elif api == "responses":
        out = client.responses.create(model=OPENAI_MODEL, input=history, stream=stream)
    else:
        out = client.messages.create(model=CLAUDE_MODEL, max_tokens=1024, messages=history, stream=stream)
    return list(out) if stream else out


async def call_once_async(client: Any, api: str, stream: bool) -> Any:
    history = first_input(api, "[err]")
    if api == "chat":
        out = await client.chat.completions.create(model=OPENAI_MODEL, messages=history, stream=stream)
    elif api == "responses":
        out = await client.responses.create(model=OPENAI_MODEL, input=history, stream=stream)
    else:
        out = await client.messages.create(model=CLAUDE_MODEL, max_tokens=1024, messages=history, stream=stream)
    return [x async for x in out] if stream else out


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(("api", "status"), list(EXPECTED_ERRORS))
def test_http_errors_raise_the_sdk_error(model_server: FakeModelServer, api: str, status: int, stream: bool) -> None:
    model_server.queue(Reply.error(status, retry_after=7), Reply.error(status))
    with client_for(model_server, api, is_async=False) as client, pytest.raises(EXPECTED_ERRORS[api, status]) as err:
        call_once_sync(client, api, stream)
    e = err.value
    assert e.status_code == status
    assert e.response.headers["retry-after"] == "7"
    if api == "messages":
        assert e.body["type"] == "error"
        assert e.body["error"]["type"] == {429: "rate_limit_error", 500: "api_error", 529: "overloaded_error"}[status]
        assert e.request_id and e.request_id.startswith("req_")
    else:
        assert e.body["type"] == {429: "requests", 500: "server_error"}[status]
        assert e.code == ("rate_limit_exceeded" if status == 429 else None)

    async def again() -> None:
        async with client_for(model_server, api, is_async=True) as aclient:
            with pytest.raises(EXPECTED_ERRORS[api, status]):
                await call_once_async(aclient, api, stream)

    asyncio.run(again())
    model_server.assert_all_served()


def test_custom_error_message_and_raw_body(model_server: FakeModelServer) -> None:
    model_server.queue(Reply.error(429, "slow down", type="tokens"), Reply(status=400, raw_body="not json at all"))
    with model_server.openai_client() as client:
        with pytest.raises(openai.RateLimitError, match="slow down") as err:
            call_once_sync(client, "chat", False)
        assert err.value.type == "tokens"
        with pytest.raises(openai.BadRequestError) as bad:
            call_once_sync(client, "chat", False)
        assert bad.value.body == "not json at all"


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("api", APIS)
def test_mid_stream_error_event(model_server: FakeModelServer, api: str, is_async: bool) -> None:
    """The provider's in-stream error event after a few frames: the OpenAI chat and Anthropic SDKs raise; the
    Responses SDK yields an ``error`` event (it does not raise) and its helper then has no final response."""
    model_server.queue(Reply.stream_failure(after=4, message="boom in the middle"))
    model_server.queue(Reply.stream_failure(after=4, message="boom in the middle"))
    seen: list[Any] = []

    async def consume_async(client: Any) -> None:
        if api == "chat":
            async for c in await client.chat.completions.create(model=OPENAI_MODEL, messages=first_input(api, ""),
                                                                 stream=True):
                seen.append(c)
        elif api == "responses":
            async for ev in await client.responses.create(model=OPENAI_MODEL, input="hi", stream=True):
                seen.append(ev)
        else:
            async with client.messages.stream(model=CLAUDE_MODEL, max_tokens=1024,
                                              messages=first_input(api, "")) as stream:
                async for ev in stream:
                    seen.append(ev)

    def consume_sync(client: Any) -> None:
        if api == "chat":
            seen.extend(client.chat.completions.create(model=OPENAI_MODEL, messages=first_input(api, ""), stream=True))
        elif api == "responses":
            seen.extend(client.responses.create(model=OPENAI_MODEL, input="hi", stream=True))
        else:
            with client.messages.stream(model=CLAUDE_MODEL, max_tokens=1024, messages=first_input(api, "")) as stream:
                seen.extend(stream)

    def consume() -> None:
        if is_async:
            async def main() -> None:
                async with client_for(model_server, api, is_async=True) as client:
                    await consume_async(client)
            asyncio.run(main())
        else:
            with client_for(model_server, api, is_async=False) as client:
                consume_sync(client)

    if api == "chat":
        with pytest.raises(openai.APIError, match="boom in the middle"):
            consume()
        assert len(seen) == 4
    elif api == "responses":
        consume()
        assert [e.type for e in seen][-2:] == ["response.content_part.added", "error"]
        assert seen[-1].message == "boom in the middle" and seen[-1].sequence_number == 4
        with (
            model_server.openai_client() as client,
            client.responses.stream(model=OPENAI_MODEL, input="hi") as s,
            pytest.raises(RuntimeError, match="response.completed"),
        ):
            s.get_final_response()
    else:
        with pytest.raises(anthropic.APIStatusError) as err:
            consume()
        assert err.value.status_code == 200  # the HTTP status of the stream; the error came inside it
        assert err.value.body["error"] == {"type": "overloaded_error", "message": "boom in the middle"}
        assert seen and seen[0].type == "message_start"


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("api", APIS)
def test_mid_stream_abort(model_server: FakeModelServer, api: str, is_async: bool) -> None:
    """The connection drops mid-body: openai raises APIConnectionError; anthropic's newer releases
    (2.17 here) raise their own APIConnectionError too, older ones let the transport's
    httpx2.RemoteProtocolError through unwrapped (an SDK quirk: either is the client seeing the abort)."""
    model_server.queue(Reply.stream_failure(after=5, mode="abort"))
    expected: Any = (httpx2.RemoteProtocolError, anthropic.APIConnectionError) if api == "messages" else openai.APIConnectionError
    got: list[Any] = []

    if is_async:
        async def main() -> None:
            async with client_for(model_server, api, is_async=True) as client:
                got.extend(await call_once_async(client, api, True))
        with pytest.raises(expected):
            asyncio.run(main())
    else:
        with client_for(model_server, api, is_async=False) as client, pytest.raises(expected):
            call_once_sync(client, api, True)
    assert model_server.requests[0].status == 200


@pytest.mark.parametrize("api", APIS)
def test_failure_on_a_non_streaming_request(model_server: FakeModelServer, api: str) -> None:
    model_server.queue(Reply.stream_failure(mode="error"), Reply.stream_failure(mode="abort"))
    openai_side = api != "messages"
    with client_for(model_server, api, is_async=False) as client:
        with pytest.raises(openai.InternalServerError if openai_side else anthropic.InternalServerError):
            call_once_sync(client, api, False)
        with pytest.raises(openai.APIConnectionError if openai_side else anthropic.APIConnectionError):
            call_once_sync(client, api, False)


def test_delay_trips_the_client_timeout(model_server: FakeModelServer) -> None:
    model_server.queue(Reply(text="late", delay=1.0), Reply(text="on time"))
    with model_server.openai_client(timeout=0.2) as client:
        with pytest.raises(openai.APITimeoutError):
            call_once_sync(client, "chat", False)
        assert call_once_sync(client, "chat", False).choices[0].message.content == "on time"


# --------------------------------------------------------------------------------------------------------------------
# Scripting details
# --------------------------------------------------------------------------------------------------------------------


def test_default_reply_and_global_queue(model_server: FakeModelServer) -> None:
    model_server.queue(Reply(text="from the global queue"))
    model_server.queue(Reply(text="only for [k1]"), match="[k1]")
    with model_server.openai_client() as oc, model_server.anthropic_client() as ac:
        def chat(marker: str) -> str:
            return oc.chat.completions.create(model=OPENAI_MODEL,
                                              messages=first_input("chat", marker)).choices[0].message.content

        assert chat("[k1]") == "only for [k1]"
        assert chat("[k1]") == "This is a fake reply."  # [k1]'s script is used up: default, not the global queue
        assert chat("[other]") == "from the global queue"
        assert chat("[other]") == "This is a fake reply."
        model_server.default_reply = Reply(text="new default", usage=Usage(3, 4))
        m = ac.messages.create(model=CLAUDE_MODEL, max_tokens=10, messages=first_input("messages", "x"))
        assert (m.content[0].text, m.stop_reason, m.usage.input_tokens, m.usage.output_tokens) == (
            "new default", "end_turn", 3, 4)
    assert [r.script for r in model_server.requests] == ["[k1]", "default", "global", "default", "default"]
    assert model_server.pending() == {}


def test_predicate_match_and_request_record(model_server: FakeModelServer) -> None:
    model_server.queue(Reply(text="for Ada"), match=lambda r: r.body.get("user") == "ada")
    with model_server.openai_client() as oc:
        c = oc.chat.completions.create(model="gpt-x", messages=[{"role": "system", "content": "sys"},
                                                               {"role": "user", "content": [
                                                                   {"type": "text", "text": "part one "},
                                                                   {"type": "text", "text": "part two"}]}],
                                       user="ada", extra_headers={"x-trace": "t-1"})
    assert c.choices[0].message.content == "for Ada" and c.model == "gpt-x"
    (req,) = model_server.requests
    assert req.path == "/v1/chat/completions" and req.method == "POST" and req.api == "chat"
    assert req.headers["authorization"] == "Bearer test-key" and req.headers["x-trace"] == "t-1"
    assert req.first_user_text == "part one part two"
    assert req.model == "gpt-x" and req.status == 200 and req.reply is not None


def test_stop_reason_translation(model_server: FakeModelServer) -> None:
    model_server.queue(*[Reply(text="cut", stop="length") for _ in range(4)])
    model_server.queue(Reply(text="no", stop="refusal"), Reply(text="no", stop="refusal"))
    with model_server.openai_client() as oc, model_server.anthropic_client() as ac:
        c = oc.chat.completions.create(model=OPENAI_MODEL, messages=first_input("chat", ""))
        r = oc.responses.create(model=OPENAI_MODEL, input="hi")
        m = ac.messages.create(model=CLAUDE_MODEL, max_tokens=10, messages=first_input("messages", ""))
        with oc.responses.stream(model=OPENAI_MODEL, input="hi") as s:
            kinds = [ev.type for ev in s]
        c2 = oc.chat.completions.create(model=OPENAI_MODEL, messages=first_input("chat", ""))
        m2 = ac.messages.create(model=CLAUDE_MODEL, max_tokens=10, messages=first_input("messages", ""))
    assert c.choices[0].finish_reason == "length"
    assert (r.status, r.incomplete_details.reason) == ("incomplete", "max_output_tokens")
    assert m.stop_reason == "max_tokens"
    assert kinds[-1] == "response.incomplete"
    assert (c2.choices[0].finish_reason, m2.stop_reason) == ("content_filter", "refusal")


def test_chat_stream_without_include_usage_has_no_usage_chunk(model_server: FakeModelServer) -> None:
    model_server.queue(Reply(text="a b c", chunk_size=1))
    with model_server.openai_client() as oc:
        chunks = list(oc.chat.completions.create(model=OPENAI_MODEL, messages=first_input("chat", ""), stream=True))
    assert all(c.usage is None and len(c.choices) == 1 for c in chunks)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "a b c"
    assert len(chunks) == 1 + 5 + 1  # role chunk, one per character, the finish chunk


def test_chunk_delay_spreads_the_stream(model_server: FakeModelServer) -> None:
    model_server.queue(Reply(text="one two three four", chunk_delay=0.03))
    with model_server.anthropic_client() as ac:
        t0 = time.monotonic()
        with ac.messages.stream(model=CLAUDE_MODEL, max_tokens=10, messages=first_input("messages", "")) as s:
            stamps = [time.monotonic() - t0 for _ in s.text_stream]
    assert len(stamps) == 4 and stamps[-1] - stamps[0] >= 0.07


def test_count_tokens_and_unknown_path(model_server: FakeModelServer) -> None:
    with model_server.anthropic_client() as ac, model_server.openai_client() as oc:
        n = ac.messages.count_tokens(model=CLAUDE_MODEL, messages=first_input("messages", "count me"))
        assert n.input_tokens > 0
        with pytest.raises(openai.NotFoundError):
            oc.embeddings.create(model="text-embedding-3-small", input="x")
    assert model_server.pending() == {}
    assert [r.api for r in model_server.requests] == ["count_tokens", "unknown"]


def test_many_connections_are_accepted_at_once() -> None:
    """The listen backlog: 200 raw connects before any is served, then a request on each."""
    import socket

    with FakeModelServer() as server:
        socks = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(200)]
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
        for s in socks:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                      b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        for s in socks:
            data = b""
            while chunk := s.recv(65536):
                data += chunk
            s.close()
            assert data.startswith(b"HTTP/1.1 200") and b"This is a fake reply." in data
        assert len(server.requests) == 200


# --------------------------------------------------------------------------------------------------------------------
# Structured-output helpers
# --------------------------------------------------------------------------------------------------------------------


class Weather(pydantic.BaseModel):
    city: str
    temp_c: int


WEATHER_JSON = '{"city": "Paris", "temp_c": 21}'


def test_openai_parse_helpers(model_server: FakeModelServer) -> None:
    model_server.queue(Reply(text=WEATHER_JSON), Reply(text=WEATHER_JSON), Reply(text=WEATHER_JSON))
    strict_tool = openai.pydantic_function_tool(Weather, name="report")
    model_server.queue(Reply(tool_calls=[ToolCall("report", {"city": "Rome", "temp_c": 25})]))
    with model_server.openai_client() as oc:
        c = oc.chat.completions.parse(model=OPENAI_MODEL, messages=first_input("chat", ""), response_format=Weather)
        assert c.choices[0].message.parsed == Weather(city="Paris", temp_c=21)
        with oc.chat.completions.stream(model=OPENAI_MODEL, messages=first_input("chat", ""),
                                        response_format=Weather) as s:
            assert s.get_final_completion().choices[0].message.parsed == Weather(city="Paris", temp_c=21)
        r = oc.responses.parse(model=OPENAI_MODEL, input="hi", text_format=Weather)
        assert r.output_parsed == Weather(city="Paris", temp_c=21)
        t = oc.chat.completions.parse(model=OPENAI_MODEL, messages=first_input("chat", ""), tools=[strict_tool])
        assert t.choices[0].message.tool_calls[0].function.parsed_arguments == Weather(city="Rome", temp_c=25)
    sent = model_server.requests[0].body["response_format"]
    assert sent["type"] == "json_schema" and sent["json_schema"]["name"] == "Weather"


def test_anthropic_parse_helpers(model_server: FakeModelServer) -> None:
    model_server.queue(*[Reply(text=WEATHER_JSON) for _ in range(3)])
    with model_server.anthropic_client() as ac:
        m = ac.messages.parse(model=CLAUDE_MODEL, max_tokens=100, messages=first_input("messages", ""),
                              output_format=Weather)
        assert m.parsed_output == Weather(city="Paris", temp_c=21)
        b = ac.beta.messages.parse(model=CLAUDE_MODEL, max_tokens=100, messages=first_input("messages", ""),
                                   output_format=Weather)
        assert b.parsed_output == Weather(city="Paris", temp_c=21)
        with ac.messages.stream(model=CLAUDE_MODEL, max_tokens=100, messages=first_input("messages", ""),
                                output_format=Weather) as s:
            assert s.get_final_message().parsed_output == Weather(city="Paris", temp_c=21)
    reqs = model_server.requests
    assert reqs[0].body["output_config"]["format"]["type"] == "json_schema"
    assert reqs[1].path == "/v1/messages"  # this SDK sends no ?beta=true for beta.messages


def test_keep_alive_connection_reuse(model_server: FakeModelServer) -> None:
    """Streams end with the zero-length chunk, so clients that read a stream to its end reuse the connection.
    The sync openai Stream stops reading at ``data: [DONE]`` and closes the response, which drops the connection
    (an SDK quirk; the async one drains the rest of the body first)."""
    chat = {"model": OPENAI_MODEL, "messages": first_input("chat", "")}
    claude = {"model": CLAUDE_MODEL, "max_tokens": 10, "messages": first_input("messages", "")}

    def new_connections(call: Any) -> int:
        before = model_server.connections_accepted
        for _ in range(3):
            call()
        return model_server.connections_accepted - before

    with model_server.openai_client() as oc, model_server.anthropic_client() as ac:
        assert new_connections(lambda: oc.chat.completions.create(**chat)) == 1
        assert new_connections(lambda: list(oc.responses.create(model=OPENAI_MODEL, input="hi", stream=True))) == 0
        assert new_connections(lambda: list(ac.messages.create(**claude, stream=True))) == 1
        assert new_connections(lambda: ac.messages.stream(**claude).__enter__().get_final_message()) == 0
        # the quirk: the first call takes the pooled connection and drops it, the next two each open a new one
        assert new_connections(lambda: list(oc.chat.completions.create(**chat, stream=True))) == 2

    async def main() -> int:
        async with model_server.async_openai_client() as aoc:
            before = model_server.connections_accepted
            for _ in range(3):
                [c async for c in await aoc.chat.completions.create(**chat, stream=True)]
            return model_server.connections_accepted - before

    assert asyncio.run(main()) == 1


def test_bad_scripts_fail_loudly(model_server: FakeModelServer) -> None:
    with pytest.raises(ValueError, match="unknown stop reason"):
        Reply(text="x", stop="finished")
    with pytest.raises(TypeError):
        model_server.queue("just text")  # type: ignore[arg-type]

    def broken(request: object) -> bool:
        raise KeyError("oops")

    model_server.queue(Reply(text="never"), match=broken)
    with model_server.openai_client() as oc, pytest.raises(openai.InternalServerError, match="fake model server"):
        oc.chat.completions.create(model=OPENAI_MODEL, messages=first_input("chat", ""))
    assert [type(e) for e in model_server.errors] == [KeyError]
    model_server.errors.clear()  # otherwise the fixture fails the test at teardown
