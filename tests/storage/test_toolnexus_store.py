"""Conversation stores under toolnexus (its stack, tests/stacks.toml): a toolnexus conversation on
loopscope's DuckDB store, continued by another process, and one recorded and stored at once."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from test_conversations import rows  # the timeline as (index, type, what it says)

import loopscope
from loopscope import DuckDBConversationStore
from loopscope.storage.duckdb.conversations import CONVERSATION_EVENT

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "conversations.duckdb"


# -- toolnexus on the DuckDB store, continued by another process ----------------------------------------


CONTINUE = textwrap.dedent(
    """
    import asyncio, sys
    import toolnexus
    from loopscope import DuckDBConversationStore

    store = DuckDBConversationStore(sys.argv[1])
    client = toolnexus.create_in_process_client(
        model="m", generate=lambda request: {"content": str(len(request["messages"]))}, store=store
    )
    print(asyncio.run(client.ask("third", None, id="c1")).text)
    """
)


def test_toolnexus_conversation_survives_a_new_process(db):
    import toolnexus

    store = DuckDBConversationStore(db)
    # the in-process model answers with the number of messages it received
    client = toolnexus.create_in_process_client(
        model="m", generate=lambda request: {"content": str(len(request["messages"]))}, store=store
    )
    assert client.conversation_store is store

    async def two_turns() -> list[str]:
        return [(await client.ask("first", None, id="c1")).text, (await client.ask("second", None, id="c1")).text]

    assert asyncio.run(two_turns()) == ["1", "3"]

    done = subprocess.run([sys.executable, "-c", CONTINUE, str(db)], check=False, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "5"  # user, 1, user, 3 from the store, then "third"

    expected = [
        {"role": "user", "content": "first"}, {"role": "assistant", "content": "1"},
        {"role": "user", "content": "second"}, {"role": "assistant", "content": "3"},
        {"role": "user", "content": "third"}, {"role": "assistant", "content": "5"},
    ]
    assert store.get_sync("c1") == expected
    assert store.list_sync() == ["c1"]
    # every loopscope view shows it: the store's timeline, the command line, the dashboard's API
    assert [(r[2], r[3]) for r in rows(db, "c1")] == [(m["role"], m["content"]) for m in expected]
    cli = subprocess.run(
        [sys.executable, "-m", "loopscope", "--db", str(db), "timeline", "c1", "--json"],
        check=False, capture_output=True, text=True, timeout=120, cwd=REPO,
    )
    assert cli.returncode == 0, cli.stderr
    shown = json.loads(cli.stdout)
    events = shown["events"] if isinstance(shown, dict) else shown
    assert [e["content"]["body"] for e in events] == ["first", "1", "second", "3", "third", "5"]
    from loopscope.dashboards.web import api

    page = api.timeline(loopscope.Store(str(db)), "c1")
    assert page["found"] and [e["index"] for e in page["events"]] == [1, 2, 3, 4, 5, 6]


# -- recorded and stored at once: the toolnexus adapter on, the store on the same file -----------------


def test_a_recorded_conversation_is_pointed_at_not_written_twice(recording):
    import toolnexus

    @toolnexus.tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        return json.dumps({"city": city, "temp_c": 21})

    def generate(request: dict[str, Any]) -> dict[str, Any]:
        if request["messages"][-1]["role"] == "user":
            return {"tool_calls": [{"id": f"call_{len(request['messages'])}", "name": "get_weather", "arguments": {"city": "Paris"}}]}
        return {"content": f"seen {len(request['messages'])}"}

    store = DuckDBConversationStore()
    loopscope.instrument()
    try:
        client = toolnexus.create_in_process_client(model="m", generate=generate, store=store)

        async def two_turns() -> list[str]:
            tk = await toolnexus.create_toolkit(builtins=False, extra_tools=[get_weather])
            return [(await client.ask(q, tk, id="both")).text for q in ("first", "second")]

        assert asyncio.run(two_turns()) == ["seen 3", "seen 7"]
    finally:
        loopscope.uninstrument()

    history = store.get_sync("both")
    assert [(m["role"], m.get("content")) for m in history] == [
        ("user", "first"), ("assistant", None), ("tool", '{"city": "Paris", "temp_c": 21}'), ("assistant", "seen 3"),
        ("user", "second"), ("assistant", None), ("tool", '{"city": "Paris", "temp_c": 21}'), ("assistant", "seen 7"),
    ]
    timeline = rows(recording.db, "both")
    shown = [r[1:4] for r in timeline if r[1] != CONVERSATION_EVENT]
    assert shown == [  # each message once: the adapter's rows
        ("message", "user", "first"), ("tool_call_start", "get_weather", "call_1"), ("tool_call_end", "get_weather", "call_1"),
        ("message", "assistant", "seen 3"),
        ("message", "user", "second"), ("tool_call_start", "get_weather", "call_5"), ("tool_call_end", "get_weather", "call_5"),
        ("message", "assistant", "seen 7"),
    ]
    events = recording.store.get_timeline("both")
    assert {e.source.framework for e in events if e.type != CONVERSATION_EVENT} == {"toolnexus"}
    markers = [e.content for e in events if e.type == CONVERSATION_EVENT]
    assert [m["action"] for m in markers] == ["message"] * 8
    assert [m["message"] for m in markers] == history
    names, view = recording.store.sql("SELECT tool, calls, served FROM tool_stats")
    assert [dict(zip(names, r)) for r in view] == [{"tool": "get_weather", "calls": 2, "served": 2}]
    assert [(e.content.role, e.content.body) for e in store.get_conversation_sync("both")] == [
        ("user", "first"), ("assistant", "seen 3"), ("user", "second"), ("assistant", "seen 7"),
    ]
    # turns and their store rows share the turn's id
    turn_ids = [t.correlation_id for t in recording.store.list_turns("both")]
    assert len(turn_ids) == 2 and [e.correlation_id for e in events if e.type == CONVERSATION_EVENT] == [turn_ids[0]] * 4 + [turn_ids[1]] * 4
