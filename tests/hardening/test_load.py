"""Load: 1,000 concurrent asyncio turns and 8 threads of hand-written SDK loops in one
process. Nothing is attributed to the wrong session or turn, indices are gap-free per
session, every tool start has its end, and the counts are exact."""

from __future__ import annotations

import asyncio
import json
import random
import threading
from collections import defaultdict
from typing import Any

import openai
import pytest

import loopscope
from fakes.model_server import Reply, ToolCall, Usage
from loopscope import LoopEndReason

ASYNC_TURNS = 1_000
THREADS = 8
LOOPS_PER_THREAD = 12
LOOKUP_TOOL = [{"name": "lookup", "description": "Look a number up", "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}}]
CHAT_TOOLS = [{"type": "function", "function": {"name": "fetch", "description": "Fetch a record", "parameters": {"type": "object", "properties": {"key": {"type": "string"}}}}}]


@loopscope.tool
async def lookup(n: int) -> dict[str, int]:
    await asyncio.sleep(random.random() * 0.01)  # turns interleave at every await
    return {"n": n, "square": n * n}


async def _async_turn(i: int) -> loopscope.AIResponseEvent:
    async with loopscope.turn(session_id=f"async-{i}", agent="async-agent", tools=LOOKUP_TOOL, input=f"square of {i}?") as turn:
        with turn.round() as rnd:
            rnd.response(f"looking up {i}", tool_calls=[{"id": f"call-a{i}", "name": "lookup", "arguments": {"n": i}}],
                         usage={"input_tokens": i, "output_tokens": 1})
        await asyncio.sleep(0)
        await lookup(i)
        turn.generation(f"{i} squared is {i * i}", finish_reason="stop", usage={"input_tokens": 1, "output_tokens": i})
    assert turn.response is not None
    return turn.response


async def _all_async() -> list[loopscope.AIResponseEvent]:
    return await asyncio.gather(*(_async_turn(i) for i in range(ASYNC_TURNS)))


def _thread_loops(base_url: str, t: int, errors: list[BaseException]) -> None:
    try:
        client = openai.OpenAI(base_url=base_url, api_key="sk-load", max_retries=0)
        for j in range(LOOPS_PER_THREAD):
            conv = f"t{t}-{j}"
            with loopscope.session(f"thread-{conv}"):
                messages: list[Any] = [{"role": "user", "content": f"[conv-{conv}] fetch it"}]
                while True:
                    reply = client.chat.completions.create(model="gpt-load", messages=messages, tools=CHAT_TOOLS).choices[0].message
                    messages.append(reply)
                    if not reply.tool_calls:
                        break
                    for call in reply.tool_calls:
                        key = json.loads(call.function.arguments)["key"]
                        messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"key": key, "owner": conv})})
    except BaseException as exc:  # reported by the test
        errors.append(exc)


@pytest.fixture
def instrumented(recording):
    loopscope.instrument(anthropic=False)
    try:
        yield recording
    finally:
        loopscope.uninstrument()


def test_thousand_async_turns_and_eight_threads_of_sdk_loops(instrumented, model_server) -> None:
    for t in range(THREADS):
        for j in range(LOOPS_PER_THREAD):
            conv = f"t{t}-{j}"
            model_server.queue(
                Reply(tool_calls=[ToolCall("fetch", {"key": f"{conv}-a"}, id=f"call-{conv}-a"),
                                  ToolCall("fetch", {"key": f"{conv}-b"}, id=f"call-{conv}-b")], usage=Usage(10, 2)),
                Reply(text=f"fetched for {conv}", usage=Usage(20, 3)),
                match=f"[conv-{conv}]",
            )
    errors: list[BaseException] = []
    threads = [threading.Thread(target=_thread_loops, args=(model_server.openai_base_url, t, errors)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    responses = asyncio.run(_all_async())  # the event loop runs while the threads loop
    for thread in threads:
        thread.join(timeout=120)
    assert not errors
    assert loopscope.flush()
    store = instrumented.store

    # the asyncio turns: each session holds exactly its own turn's rows
    assert [r.session_id for r in responses] == [f"async-{i}" for i in range(ASYNC_TURNS)]
    for r in responses:
        assert (r.tool_calls_count, r.round_count, r.loop_end_reason) == (1, 1, LoopEndReason.COMPLETED)
    _, rows = store.sql(
        "SELECT session_id, list(idx ORDER BY idx), list(type ORDER BY idx), list(CAST(content AS VARCHAR) ORDER BY idx), "
        "count(DISTINCT correlation_id) FROM events WHERE session_id LIKE 'async-%' GROUP BY session_id"
    )
    assert len(rows) == ASYNC_TURNS
    for session, indices, types, contents, turns in rows:
        i = int(session.split("-")[1])
        assert indices == list(range(1, len(indices) + 1)), session  # gap-free from 1
        assert types == ["message", "message", "tool_call_start", "tool_call_end", "message"], session
        assert turns == 1
        start, end = json.loads(contents[2]), json.loads(contents[3])
        assert start["arguments"] == {"n": i} and start["tool_id"] == f"call-a{i}"
        assert end["result"] == {"n": i, "square": i * i} and end["outcome"] == "served"
        assert json.loads(contents[0]) == {"type": "text", "body": f"square of {i}?", "role": "user"}
        assert json.loads(contents[1])["body"] == f"looking up {i}"
        assert json.loads(contents[4])["body"] == f"{i} squared is {i * i}"
    _, turn_rows = store.sql(
        "SELECT session_id, tool_calls, rounds, input_tokens, output_tokens, loop_end_reason FROM turn_summaries "
        "WHERE session_id LIKE 'async-%'"
    )
    assert len(turn_rows) == ASYNC_TURNS
    for session, tool_calls, rounds, input_tokens, output_tokens, reason in turn_rows:
        i = int(session.split("-")[1])
        assert (tool_calls, rounds, input_tokens, output_tokens, reason) == (1, 1, i + 1, i + 1, "completed")

    # the threads' stitched SDK loops: every call ends, in its own conversation
    _, rows = store.sql(
        "SELECT session_id, list(idx ORDER BY idx), list(type ORDER BY idx), list(CAST(content AS VARCHAR) ORDER BY idx) "
        "FROM events WHERE session_id LIKE 'thread-%' GROUP BY session_id"
    )
    assert len(rows) == THREADS * LOOPS_PER_THREAD
    for session, indices, types, contents in rows:
        conv = session.removeprefix("thread-")
        assert indices == list(range(1, len(indices) + 1)), session
        starts = [json.loads(c) for c, t in zip(contents, types) if t == "tool_call_start"]
        ends = [json.loads(c) for c, t in zip(contents, types) if t == "tool_call_end"]
        assert sorted(s["tool_id"] for s in starts) == sorted(e["tool_id"] for e in ends) == [f"call-{conv}-a", f"call-{conv}-b"]
        assert all(e["result"]["owner"] == conv and e["outcome"] == "served" for e in ends)
        assert json.loads(contents[-1])["body"] == f"fetched for {conv}"
    _, turn_rows = store.sql(
        "SELECT session_id, count(*), sum(tool_calls), list(loop_end_reason) FROM turn_summaries "
        "WHERE session_id LIKE 'thread-%' GROUP BY session_id"
    )
    assert len(turn_rows) == THREADS * LOOPS_PER_THREAD
    assert all(count == 1 and calls == 2 and reasons == ["completed"] for _, count, calls, reasons in turn_rows)

    # nothing dropped, nothing pending, nothing left over
    assert instrumented.pipeline.dropped()["store"] == 0
    _, pending = store.sql("SELECT count(*) FROM tool_calls WHERE status = 'pending'")
    assert pending == [(0,)]
    by_type: dict[str, int] = defaultdict(int)
    for name, count in store.sql("SELECT type, count(*) FROM events GROUP BY type")[1]:
        by_type[name] = count
    loops = THREADS * LOOPS_PER_THREAD
    assert by_type == {
        "message": ASYNC_TURNS * 3 + loops * 2,
        "tool_call_start": ASYNC_TURNS + loops * 2,
        "tool_call_end": ASYNC_TURNS + loops * 2,
    }
