"""``n`` conversations run at once through one SDK, and what they must leave in the store,
whatever SDK ran them: one turn each, its own events only, in order, with its own tool call.

Conversation ``i`` asks ``[conv-i] weather?``; its two replies, queued on the fake model
server for the requests that carry ``[conv-i]``, call ``get_weather`` once with
``{"city": "city-i"}`` and answer ``It is 21 °C and sunny in city-i.`` once the application
sent back ``sunny in city-i``. The first replies come after a random delay and the
conversations pause between their rounds (async) or wait for each other's first rounds
(threads), so that their calls interleave.

A test names its SDK's ways: ``queue`` (its script helper), ``client`` (conversation ``i``'s
client: one shared, or one each), ``modes`` (conversation ``i`` calls in ``modes[i % len]``)
and either ``call`` and ``follow_up`` (one round; the next round's messages) or ``loop`` (the
whole two-round conversation, for an SDK that keeps the messages itself, a chat)."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import loopscope
from loopscope import LoopEndReason


class Queue(Protocol):
    """A test file's script helper: the two replies of conversation ``tag``."""

    def __call__(self, tag: str, *, call_id: str, city: str, delay: float) -> None: ...


def user_text(text: str) -> dict[str, Any]:
    """The question as most SDKs take it."""
    return {"role": "user", "content": text}


def run_async(recording: Any, server: Any, *, seed: int, queue: Queue, call_id: str, client: Callable[[int], Any],
              modes: Sequence[str], call: Callable[[Any, str, list[Any]], Awaitable[Any]] | None = None,
              follow_up: Callable[[list[Any], Any, str], list[Any]] | None = None,
              loop: Callable[[Any, str, int], Awaitable[Any]] | None = None,
              question: Callable[[str], Any] = user_text, settle: Callable[[], None] = loopscope.flush,
              n: int = 20) -> None:
    """``n`` conversations as asyncio tasks of one loop, then the store checked.

    ``call_id``: the tool call id of conversation ``i``, as a format (``"call_c{i:02d}"``);
    ``settle``: waits until every call is recorded (the default flushes)."""
    rng = _queue_all(queue, n, call_id, seed)

    async def conversation(i: int) -> None:
        c, mode = client(i), modes[i % len(modes)]
        if loop is not None:
            await loop(c, mode, i)
            return
        assert call is not None and follow_up is not None
        messages: list[Any] = [question(f"[conv-{i}] weather?")]
        answer = await call(c, mode, messages)
        await asyncio.sleep(rng.random() * 0.02)
        await call(c, mode, follow_up(messages, answer, f"sunny in city-{i}"))

    async def main() -> None:
        await asyncio.gather(*(conversation(i) for i in range(n)))

    asyncio.run(main())
    _check(recording, server, n, call_id, settle)


def run_threads(recording: Any, server: Any, *, seed: int, queue: Queue, call_id: str, client: Callable[[int], Any],
                modes: Sequence[str], call: Callable[[Any, str, list[Any]], Any],
                follow_up: Callable[[list[Any], Any, str], list[Any]], question: Callable[[str], Any] = user_text,
                settle: Callable[[], None] = loopscope.flush, n: int = 20) -> None:
    """:func:`run_async` for a synchronous SDK: ``n`` conversations in threads, every first
    round done before any second one starts (a barrier)."""
    _queue_all(queue, n, call_id, seed)
    barrier = threading.Barrier(n)

    def conversation(i: int) -> None:
        c, mode = client(i), modes[i % len(modes)]
        messages: list[Any] = [question(f"[conv-{i}] weather?")]
        answer = call(c, mode, messages)
        barrier.wait()
        call(c, mode, follow_up(messages, answer, f"sunny in city-{i}"))

    with ThreadPoolExecutor(n) as pool:
        list(pool.map(conversation, range(n)))
    _check(recording, server, n, call_id, settle)


def _queue_all(queue: Queue, n: int, call_id: str, seed: int) -> random.Random:
    rng = random.Random(seed)
    for i in range(n):
        queue(f"[conv-{i}]", call_id=call_id.format(i=i), city=f"city-{i}", delay=rng.random() * 0.02)
    return rng


def _check(recording: Any, server: Any, n: int, call_id: str, settle: Callable[[], None]) -> None:
    settle()
    assert len(server.requests) == 2 * n
    assert_conversations_apart(recording.store, n, call_id)


def assert_conversations_apart(store: Any, n: int, call_id: str) -> None:
    """``call_id``: the tool call id of conversation ``i``, as a format (``"call_c{i:02d}"``;
    empty for an SDK whose calls have no id)."""
    turns = store.list_turns(limit=None)
    assert len(turns) == n
    seen = set()
    for turn in turns:
        events = store.get_timeline(turn.session_id)
        assert {e.correlation_id for e in events} == {turn.correlation_id}
        i = int(events[0].content.body.split("]")[0].removeprefix("[conv-"))
        seen.add(i)
        assert [e.type for e in events] == ["message", "message", "tool_call_start", "tool_call_end", "message"]
        assert events[2].content.tool_id == events[3].content.tool_id == call_id.format(i=i)
        assert (events[3].content.arguments, events[3].content.result) == ({"city": f"city-{i}"}, f"sunny in city-{i}")
        assert events[4].content.body == f"It is 21 °C and sunny in city-{i}."
        assert (turn.round_count, turn.tool_calls_count, turn.loop_end_reason) == (1, 1, LoopEndReason.COMPLETED)
    assert seen == set(range(n))
