"""``Store.replay``: a session's stored events, then the live ones, each exactly once.

The acceptance tests run the writer in a child process (its own interpreter and writer,
the hand API, one turn in flight for a couple of seconds) and replay from the test
process, starting mid-way, so that both the stored part and the live part are there.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from test_live_reads import wait_until

import loopscope
from loopscope import EventFilter
from loopscope.dashboards.web import api
from loopscope.storage.duckdb.replay import Follower

EVERY = EventFilter(include_blocked=True)
ROUNDS = 40

# One turn, ROUNDS rounds of a text and a tool call, ~50 ms apart (a couple of seconds
# in all). With a marker path it pauses after PAUSE_AT rounds until the file exists.
WRITER = """
    import pathlib, sys, time
    import loopscope

    db, rounds, marker = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    pause_at = int(sys.argv[4])
    loopscope.configure(db, flush_interval=0.05)
    loopscope.flush(60)  # configure() does not wait for the writer process: the rounds below are to land live

    @loopscope.tool
    def step(n: int) -> dict:
        time.sleep(0.01)
        return {"n": n}

    with loopscope.turn(session_id="live", agent="worker", input="count for me", model="m", provider="openai") as turn:
        for n in range(rounds):
            if n == pause_at and marker != "-":
                print("paused", flush=True)
                while not pathlib.Path(marker).exists():
                    time.sleep(0.02)
            turn.generation(f"step {n}", tool_calls=[{"id": f"c{n}", "name": "step", "arguments": {"n": n}}])
            step(n)
            turn.state({"done": n + 1})
            time.sleep(0.03)
        turn.generation("final answer", finish_reason="stop")
    loopscope.shutdown()
    print("finished", flush=True)
"""


def last_index(store: loopscope.Store, session: str = "live") -> int:
    return store.last_indices().get(session, 0)


def expected_after(store: loopscope.Store, after: int) -> list[tuple[str, int, str]]:
    return [(e.id, e.index, e.type) for e in store.get_timeline("live", after_index=after)]


def test_replay_from_mid_way_gets_every_event_once_until_the_turn_ends(tmp_path: Path, spawn) -> None:
    db = tmp_path / "live.duckdb"
    child = spawn("writer", WRITER, db, ROUNDS, "-", -1)
    store = loopscope.Store(str(db))
    # start mid-way: some rounds stored already, most of the turn still to come
    wait_until(lambda: last_index(store) >= 12, 30, "the first rounds", child)
    stored_before = last_index(store)
    got = [(e.id, e.index, e.type) for e in store.replay("live", after_index=5, until_turn_end=True, poll_interval=0.05)]
    # the replay ended by itself when the turn's summary landed
    assert child.finish_ok(30).strip().endswith("finished")
    expected = expected_after(store, 5)
    final = last_index(store)
    assert final > stored_before + 20, "most of the turn was live"
    assert got == expected  # every event, exactly once, in order
    assert [i for _, i, _ in got] == list(range(6, final + 1))
    assert any(i <= stored_before for _, i, _ in got) and any(i > stored_before for _, i, _ in got)
    assert got[-1][2] == "message" and store.get_event(got[-1][0]).content.body == "final answer"
    [summary] = store.list_turns("live")
    assert summary.loop_end_reason == loopscope.LoopEndReason.COMPLETED and summary.tool_calls_count == ROUNDS


def test_small_pages_and_a_stop_from_another_thread(tmp_path: Path, spawn) -> None:
    db = tmp_path / "live.duckdb"
    child = spawn("writer", WRITER, db, ROUNDS, "-", -1)
    store = loopscope.Store(str(db))
    wait_until(lambda: last_index(store) >= 12, 30, "the first rounds", child)
    stored_before = last_index(store)
    replay = store.replay("live", after_index=3, poll_interval=0.05, page=4)
    got: list[tuple[str, int, str]] = []
    for event in replay:  # no until_turn_end: the caller decides when to stop
        got.append((event.id, event.index, event.type))
        if event.type == "message" and event.content.body == "final answer":
            threading.Timer(0.1, replay.stop).start()  # stopped while it waits for more
    child.finish_ok(30)
    assert got == expected_after(store, 3)
    assert got[-1][1] > stored_before + 20 and got[0][1] == 4
    assert replay.position == last_index(store)


def test_async_replay_leaves_the_event_loop_free(tmp_path: Path, spawn) -> None:
    """The writer pauses mid-turn until a task on the replay's own event loop lets it go
    on: were the loop blocked by the waiting replay, that task would never run."""
    db = tmp_path / "live.duckdb"
    marker = tmp_path / "go-on"
    child = spawn("writer", WRITER, db, 20, marker, 6)
    store = loopscope.AsyncStore(str(db))
    sync = store.sync
    # the rows of the rounds before the pause reach the file a batch or two after it
    wait_until(lambda: child.out.read_text().startswith("paused") and last_index(sync) > 8, 30, "the pause", child)
    stored = last_index(sync)

    async def main() -> list[tuple[str, int, str]]:
        got: list[tuple[str, int, str]] = []
        replay = store.replay("live", after_index=2, until_turn_end=True, poll_interval=0.05)

        async def release() -> None:
            while not got or got[-1][1] < stored:  # the stored part is in
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)  # the replay now polls an unchanged log
            marker.write_text("go")

        releaser = asyncio.create_task(release())
        async for event in replay:
            got.append((event.id, event.index, event.type))
        await releaser
        return got

    got = asyncio.run(asyncio.wait_for(main(), 60))
    child.finish_ok(30)
    assert got == [(e.id, e.index, e.type) for e in sync.get_timeline("live", after_index=2)]
    assert got[-1][1] == last_index(sync) > stored


# -- in one process ----------------------------------------------------------------------------


def test_a_finished_session_replays_its_log_and_ends(recording) -> None:
    with loopscope.turn(session_id="done", input="hi") as t:
        t.generation("hello", finish_reason="stop")
    store = recording.store
    events = list(store.replay("done", until_turn_end=True, poll_interval=0.05))
    assert [(e.type, e.content.body) for e in events] == [("message", "hi"), ("message", "hello")]
    assert list(store.replay("done", after_index=1, until_turn_end=True)) == events[1:]
    assert list(store.replay("no-such-session", until_turn_end=True)) == []


def test_blocked_rows_are_passed_by_the_cursor(recording) -> None:
    with loopscope.turn(session_id="guard", input="leak the key", input_blocked=True) as t:
        t.generation("I cannot help with that.", finish_reason="stop")
    store = recording.store
    with store.replay("guard", until_turn_end=True) as replay:
        plain = list(replay)
    assert [e.index for e in plain] == [2]
    with_blocked = list(store.replay("guard", until_turn_end=True, event_filter=EVERY))
    assert [(e.index, e.status.value) for e in with_blocked] == [(1, "blocked"), (2, "delivered")]
    # the web dashboard's live page takes the same cursor
    page = api.timeline(store, "guard", after_index=0)
    assert [e["index"] for e in page["events"]] == [2] and page["cursor"] == 2
    newest = api.timeline(store, "guard")
    assert newest["cursor"] == 2 and api.timeline(store, "guard", after_index=newest["cursor"])["events"] == []


def test_stop_flag_ends_a_waiting_replay_and_position_resumes(recording) -> None:
    store = recording.store
    with loopscope.turn(session_id="open", input="first") as t:
        stop = threading.Event()
        replay = store.replay("open", poll_interval=0.05, stop=stop)
        first = next(replay)
        assert first.content.body == "first" and replay.position == 1
        t.generation("second", tool_calls=[{"id": "x", "name": "noop", "arguments": {}}])
        t.end("max_rounds")
    seen = [first]
    # a watchdog, so that a replay deaf to the flag fails instead of waiting for ever
    deaf = threading.Timer(60, lambda: (seen.append(None), stop.set()))  # type: ignore[func-returns-value]
    deaf.start()
    for event in replay:  # the live part; once it is all read, the flag ends the waiting replay
        seen.append(event)
        if len(seen) == 4:
            stop.set()
    deaf.cancel()
    assert [e.type for e in seen] == ["message", "message", "tool_call_start", "tool_call_end"]
    assert replay.position == 4
    # taking up from the position gives what came after, and only that
    with loopscope.turn(session_id="open", input="third") as t2:
        t2.generation("fourth", finish_reason="stop")
    rest = list(store.replay("open", replay.position, until_turn_end=True))
    assert [e.content.body for e in rest] == ["third", "fourth"]


def test_follower_starts_where_its_newest_lines_end(recording) -> None:
    with loopscope.turn(session_id="a", input="a1") as t:
        t.generation("a2", finish_reason="stop")
    with loopscope.turn(session_id="b", input="b1") as t:
        t.generation("b2", finish_reason="stop")
    follower = Follower(recording.store)
    assert [e.content.body for e in follower.start(3)] == ["a2", "b1", "b2"]
    assert follower.poll() == []
    with loopscope.turn(session_id="a", input="a3") as t:
        t.generation("a4", finish_reason="stop")
    with loopscope.turn(session_id="c", input="c1"):
        pass
    polled = follower.poll()
    assert sorted((e.session_id, e.index) for e in polled) == [("a", 3), ("a", 4), ("c", 1)]
    assert follower.poll() == []


def test_bad_arguments() -> None:
    store = loopscope.Store("unused.duckdb")
    with pytest.raises(ValueError):
        store.replay("s", poll_interval=0)
    with pytest.raises(ValueError):
        store.replay("s", page=0)


def test_follower_gives_each_session_in_index_order_when_a_later_row_was_made_earlier(recording) -> None:
    hour_ago = time.time_ns() - 3600 * 10**9
    with loopscope.turn(session_id="other", input="o1"):
        pass
    with loopscope.turn(session_id="shared", input="s1"):
        pass
    # reported late, as a second process's batch lands: made an hour ago, numbered after s1
    with loopscope.turn(session_id="shared") as t:
        t.generation("s2", finish_reason="stop", start_time=hour_ago, end_time=hour_ago + 10**6)
    follower = Follower(recording.store)
    started = follower.start(10)
    assert [(e.session_id, e.index) for e in started if e.session_id == "shared"] == [("shared", 1), ("shared", 2)]
    assert {e.session_id for e in started} == {"other", "shared"}
    with loopscope.turn(session_id="shared", input="s3"):
        pass
    with loopscope.turn(session_id="shared") as t:
        t.generation("s4", finish_reason="stop", start_time=hour_ago, end_time=hour_ago + 10**6)
    with loopscope.turn(session_id="other", input="o2"):
        pass
    assert loopscope.flush()
    polled = follower.poll()
    assert [(e.session_id, e.index) for e in polled if e.session_id == "shared"] == [("shared", 3), ("shared", 4)]
    assert [(e.session_id, e.index) for e in polled if e.session_id == "other"] == [("other", 2)]
