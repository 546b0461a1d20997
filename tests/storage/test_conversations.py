"""Conversation stores: the in-memory default, and the DuckDB store that keeps histories in
loopscope's event log (rebuilt from it by ``get``), against real store files."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import loopscope
from loopscope import ConversationStore, DuckDBConversationStore, InMemoryConversationStore
from loopscope.storage.duckdb.conversations import CONVERSATION_EVENT

REPO = Path(__file__).resolve().parents[2]

OPENAI_HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a concierge."},
    {"role": "user", "content": "Dinner outside in Paris tonight?"},
    {"role": "assistant", "content": "Let me check.", "tool_calls": [
        {"id": "call_w", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
        {"id": "call_b", "type": "function", "function": {"name": "book_table", "arguments": "{\"place\": \"Chez Nous\"}"}},
    ]},
    {"role": "tool", "tool_call_id": "call_w", "content": "{\"temp_c\": 21}"},
    {"role": "tool", "tool_call_id": "call_b", "content": "no table left"},
    {"role": "assistant", "content": "21 °C and dry, but no table."},
]

ANTHROPIC_HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "Dinner outside in Paris tonight?"},
    {"role": "assistant", "content": [
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "toolu_w", "name": "get_weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "toolu_b", "name": "book_table", "input": {"place": "Chez Nous"}},
    ]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_w", "content": "{\"temp_c\": 21}", "is_error": False},
        {"type": "tool_result", "tool_use_id": "toolu_b", "content": [{"type": "text", "text": "booking service timed out"}], "is_error": True},
    ]},
    {"role": "assistant", "content": [{"type": "text", "text": "21 °C and dry, but no table."}]},
]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "conversations.duckdb"


def rows(db: Path, session: str) -> list[tuple[Any, ...]]:
    """The session's timeline as (index, type, what it says)."""
    out = []
    for e in loopscope.Store(str(db)).get_timeline(session):
        c = e.content
        if e.type == "message":
            out.append((e.index, e.type, c.role, c.body))
        elif e.type in ("tool_call_start", "tool_call_end"):
            out.append((e.index, e.type, c.tool_name, c.tool_id, c.arguments, c.result, c.status, c.outcome, c.error))
        else:
            out.append((e.index, e.type, c))
    return out


# -- the in-memory default --------------------------------------------------------------------------


def test_in_memory_store_methods():
    store = InMemoryConversationStore()
    assert isinstance(store, ConversationStore)

    async def run() -> None:
        assert await store.get("u1") is None and await store.list() == []
        history = [{"role": "user", "content": "hi"}]
        await store.save("u1", history)
        history.append({"role": "assistant", "content": "changed after saving"})
        got = await store.get("u1")
        assert got == [{"role": "user", "content": "hi"}]
        got[0]["content"] = "changed after reading"
        assert await store.get("u1") == [{"role": "user", "content": "hi"}]
        await store.save("u2", [])
        assert await store.get("u2") == [] and await store.list() == ["u1", "u2"]
        await store.delete("u1")
        await store.delete("missing")
        assert await store.get("u1") is None and await store.list() == ["u2"]

    asyncio.run(run())
    assert store.get_sync("u2") == [] and store.list_sync() == ["u2"]


# -- DuckDB: each method -----------------------------------------------------------------------------


def test_duckdb_store_methods(db):
    store = DuckDBConversationStore(db)
    assert isinstance(store, ConversationStore)
    assert store.get_sync("c1") is None and store.list_sync() == []  # no file yet
    store.delete_sync("c1")  # nothing to delete: no error, no file
    assert not db.exists()

    async def run() -> None:
        await store.save("c1", [{"role": "user", "content": "hi"}])
        await store.save("c2", [])
        assert await store.get("c1") == [{"role": "user", "content": "hi"}]
        assert await store.get("c2") == []  # an empty history is stored, not missing
        assert await store.get("c3") is None
        assert await store.list() == ["c1", "c2"]
        await store.delete("c1")
        await store.delete("c3")
        assert await store.get("c1") is None and await store.list() == ["c2"]
        await store.save("c1", [{"role": "user", "content": "again"}])
        assert await store.get("c1") == [{"role": "user", "content": "again"}]
        assert await store.list() == ["c1", "c2"]

    asyncio.run(run())
    assert rows(db, "c1") == [
        (1, "message", "user", "hi"),
        (2, CONVERSATION_EVENT, {"type": CONVERSATION_EVENT, "action": "delete"}),
        (3, "message", "user", "again"),
    ]


def test_repeated_saves_of_a_growing_history_append_only_what_is_new(db):
    store = DuckDBConversationStore(db)
    for end in (2, 2, 3, 5, 6, 6):
        store.save_sync("conv", OPENAI_HISTORY[:end])
        assert store.get_sync("conv") == OPENAI_HISTORY[:end]
    timeline = rows(db, "conv")
    assert [r[0] for r in timeline] == list(range(1, len(timeline) + 1))  # gap-free, each once
    assert timeline == [
        (1, "message", "system", "You are a concierge."),
        (2, "message", "user", "Dinner outside in Paris tonight?"),
        (3, "message", "assistant", "Let me check."),
        (4, "tool_call_start", "get_weather", "call_w", {"city": "Paris"}, None, "pending", None, None),
        (5, "tool_call_start", "book_table", "call_b", {"place": "Chez Nous"}, None, "pending", None, None),
        (6, "tool_call_end", "get_weather", "call_w", {"city": "Paris"}, {"temp_c": 21}, "completed", "served", None),
        (7, "tool_call_end", "book_table", "call_b", {"place": "Chez Nous"}, "no table left", "completed", "served", None),
        (8, "message", "assistant", "21 °C and dry, but no table."),
    ]
    # one exchange (the user's message and what answered it) is one correlation id
    events = loopscope.Store(str(db)).get_timeline("conv")
    assert len({e.correlation_id for e in events[1:]}) == 1 and events[0].correlation_id != events[1].correlation_id
    assert {(e.source.framework, e.source.channel_id) for e in events} == {("conversation_store", None)}


def test_a_rewritten_history_keeps_the_common_prefix_and_the_log(db):
    store = DuckDBConversationStore(db, agent="concierge")
    store.save_sync("conv", OPENAI_HISTORY)
    before = len(rows(db, "conv"))
    compacted = [OPENAI_HISTORY[0], OPENAI_HISTORY[1], {"role": "assistant", "content": "(summary) 21 °C, no table."}]
    store.save_sync("conv", compacted)
    assert store.get_sync("conv") == compacted
    store.save_sync("conv", compacted)  # the same again: nothing new
    timeline = rows(db, "conv")
    assert len(timeline) == before + 2  # nothing rewritten in place: a marker and the new message
    assert timeline[before:] == [
        (before + 1, CONVERSATION_EVENT, {"type": CONVERSATION_EVENT, "action": "rewrite", "kept": 2}),
        (before + 2, "message", "assistant", "(summary) 21 °C, no table."),
    ]
    # a shorter history is a rewrite too; a longer one after it extends the rewritten one
    store.save_sync("conv", OPENAI_HISTORY[:1])
    store.save_sync("conv", [OPENAI_HISTORY[0], {"role": "user", "content": "new question"}])
    assert store.get_sync("conv") == [OPENAI_HISTORY[0], {"role": "user", "content": "new question"}]
    conversation = store.get_conversation_sync("conv")
    assert [(e.content.role, e.content.body) for e in conversation] == [("system", "You are a concierge."), ("user", "new question")]
    assert {e.source.channel_id for e in conversation} == {"concierge"}


def test_get_conversation_pages_like_roomkit(db):
    store = DuckDBConversationStore(db)
    store.save_sync("conv", OPENAI_HISTORY)
    messages = store.get_conversation_sync("conv")
    assert [(e.index, e.content.role) for e in messages] == [(1, "system"), (2, "user"), (3, "assistant"), (8, "assistant")]
    assert [e.index for e in store.get_conversation_sync("conv", limit=2)] == [3, 8]  # the most recent, ascending
    assert [e.index for e in store.get_conversation_sync("conv", limit=2, after_index=1)] == [2, 3]
    assert store.get_conversation_sync("conv", limit=0) == []
    assert [e.index for e in asyncio.run(store.get_conversation("conv", limit=1))] == [8]


# -- tool-call histories round trip, in the format they were saved in ---------------------------------


def test_openai_tool_call_history_round_trip(db):
    store = DuckDBConversationStore(db)
    asyncio.run(store.save("oa", OPENAI_HISTORY))
    assert asyncio.run(DuckDBConversationStore(db).get("oa")) == OPENAI_HISTORY  # a fresh reader
    names, view = loopscope.Store(str(db)).sql(
        "SELECT tool, call_id, arguments, result, status, outcome FROM tool_calls WHERE session_id = 'oa' ORDER BY start_index"
    )
    assert [dict(zip(names, r)) for r in view] == [
        {"tool": "get_weather", "call_id": "call_w", "arguments": '{"city":"Paris"}', "result": '{"temp_c":21}', "status": "completed", "outcome": "served"},
        {"tool": "book_table", "call_id": "call_b", "arguments": '{"place":"Chez Nous"}', "result": '"no table left"', "status": "completed", "outcome": "served"},
    ]


def test_anthropic_tool_call_history_round_trip(db):
    store = DuckDBConversationStore(db)
    store.save_sync("an", ANTHROPIC_HISTORY)
    assert store.get_sync("an") == ANTHROPIC_HISTORY
    assert rows(db, "an") == [
        (1, "message", "user", "Dinner outside in Paris tonight?"),
        (2, "message", "assistant", "Let me check."),
        (3, "tool_call_start", "get_weather", "toolu_w", {"city": "Paris"}, None, "pending", None, None),
        (4, "tool_call_start", "book_table", "toolu_b", {"place": "Chez Nous"}, None, "pending", None, None),
        (5, "tool_call_end", "get_weather", "toolu_w", {"city": "Paris"}, {"temp_c": 21}, "completed", "served", None),
        (6, "tool_call_end", "book_table", "toolu_b", {"place": "Chez Nous"}, "booking service timed out", "failed", "failed",
         "booking service timed out"),
        (7, "message", "assistant", "21 °C and dry, but no table."),
    ]


def test_sdk_objects_are_stored_as_their_json(db):
    from openai.types.chat import ChatCompletionMessage

    store = DuckDBConversationStore(db)
    message = ChatCompletionMessage(role="assistant", content="hello")
    store.save_sync("sdk", [{"role": "user", "content": "hi"}, message])
    assert store.get_sync("sdk") == [{"role": "user", "content": "hi"}, message.model_dump(mode="json")]
    store.save_sync("sdk", [{"role": "user", "content": "hi"}, message])  # equal once stored: no new rows
    assert len(rows(db, "sdk")) == 2
    with pytest.raises(TypeError):
        store.save_sync("sdk", "not a list")


# -- the same file the agent's recording goes to --------------------------------------------------------


def test_saves_interleave_with_the_recording_in_one_log(recording):
    store = DuckDBConversationStore()  # the configured store file
    assert store.path == str(recording.db)
    with loopscope.turn(session_id="shared", input="recorded question") as t:
        t.generation("recorded answer")
    store.save_sync("shared", [{"role": "user", "content": "saved question"}])
    with loopscope.turn(session_id="shared", input="later") as t:
        t.generation("later answer")
    assert [(i, kind, role, body) for i, kind, role, body in rows(recording.db, "shared")] == [
        (1, "message", "user", "recorded question"),
        (2, "message", "assistant", "recorded answer"),
        (3, "message", "user", "saved question"),
        (4, "message", "user", "later"),
        (5, "message", "assistant", "later answer"),
    ]
    assert store.get_sync("shared") == [{"role": "user", "content": "saved question"}]  # only what was saved
    [info] = recording.store.list_sessions()
    assert (info.session_id, info.event_count) == ("shared", 5)
