"""PersistencePolicy: which event types reach the store. Spans are recorded regardless."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import loopscope
from loopscope import EventFilter, EventType, PersistencePolicy

EVERY = EventFilter(include_blocked=True)


class Configured:
    def __init__(self, db, exporter: InMemorySpanExporter, pipeline: loopscope.Pipeline) -> None:
        self.db = db
        self.exporter = exporter
        self.pipeline = pipeline
        self.store = loopscope.Store(str(db))

    def spans(self):
        return self.exporter.get_finished_spans()

    def tool_spans(self) -> list[str]:
        return [s.attributes["gen_ai.tool.name"] for s in self.spans() if s.attributes.get("gen_ai.operation.name") == "execute_tool"]

    def chat_spans(self) -> list[str]:
        return [s.attributes.get("loopscope.round.text") for s in self.spans() if s.attributes.get("gen_ai.operation.name") == "chat"]


@pytest.fixture
def with_policy(tmp_path) -> Iterator:
    """Configure a fresh store with the given policy (as the conftest fixture does otherwise)."""

    def configure(policy: PersistencePolicy | None) -> Configured:
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        db = tmp_path / "policy.duckdb"
        pipeline = loopscope.configure(db, tracer_provider=provider, policy=policy, flush_interval=0.05, capture_content=True)
        return Configured(db, exporter, pipeline)

    try:
        yield configure
    finally:
        loopscope.shutdown()


def record_turn(session: str = "s") -> loopscope.Turn:
    """Five rows when everything is stored: input, "looking up", tool start, tool end, answer."""

    @loopscope.tool
    def lookup(q: str) -> str:
        return q.upper()

    with loopscope.turn(session_id=session, agent="agent", input="question", tools=[lookup]) as t:
        t.generation("looking up", tool_calls=[{"id": "c1", "name": "lookup", "arguments": {"q": "x"}}])
        lookup("x")
        t.generation("answer")
    return t


def stored_types(c: Configured, session: str = "s") -> list[str]:
    return [e.type for e in c.store.list_events(session, limit=None, event_filter=EVERY)]


def test_default_policy_stores_every_type(with_policy):
    c = with_policy(None)
    record_turn()
    assert stored_types(c) == ["message", "message", "tool_call_start", "tool_call_end", "message"]
    assert c.pipeline.stats().excluded == 0


def test_excluded_type_is_not_stored_but_its_span_is_recorded(with_policy):
    c = with_policy(PersistencePolicy(exclude_types={"tool_call_start"}))
    record_turn()
    assert stored_types(c) == ["message", "message", "tool_call_end", "message"]
    assert c.tool_spans() == ["lookup"]
    assert c.pipeline.stats().excluded == 1


def test_excluding_every_tool_row_keeps_the_spans(with_policy):
    c = with_policy(PersistencePolicy(exclude_types=[EventType.TOOL_CALL_START, EventType.TOOL_CALL_END]))
    record_turn()
    assert stored_types(c) == ["message", "message", "message"]
    assert c.tool_spans() == ["lookup"]
    end = next(s for s in c.spans() if s.attributes.get("gen_ai.operation.name") == "execute_tool")
    assert end.attributes["gen_ai.tool.call.result"] == '"X"'


def test_excluded_messages_leave_chat_spans_and_turn_summaries(with_policy):
    c = with_policy(PersistencePolicy(exclude_types=[EventType.MESSAGE]))
    t = record_turn()
    assert stored_types(c) == ["tool_call_start", "tool_call_end"]
    assert c.store.get_conversation("s") == []
    assert c.chat_spans() == ["looking up", "answer"]
    # the turn summary is not an event: it is still stored
    turns = c.store.list_turns("s")
    assert [x.correlation_id for x in turns] == [t.correlation_id]
    assert turns[0].response_content == t.response.response_content


def test_persist_types_stores_only_those(with_policy):
    c = with_policy(PersistencePolicy(persist_types={"tool_call_end"}))
    record_turn()
    assert stored_types(c) == ["tool_call_end"]
    assert c.tool_spans() == ["lookup"]
    assert c.chat_spans() == ["looking up", "answer"]
    assert c.pipeline.stats().excluded == 4


def test_empty_persist_types_stores_no_event(with_policy):
    c = with_policy(PersistencePolicy(persist_types=set()))
    record_turn()
    assert stored_types(c) == []
    assert c.store.get_event_count("s") == 0
    assert len(c.store.list_turns("s")) == 1
    assert c.tool_spans() == ["lookup"]


def test_exclude_wins_over_persist(with_policy):
    c = with_policy(PersistencePolicy(persist_types={"message", "tool_call_end"}, exclude_types={"message"}))
    record_turn()
    assert stored_types(c) == ["tool_call_end"]
    assert c.chat_spans() == ["looking up", "answer"]


def test_enum_and_string_names_are_the_same_policy():
    by_enum = PersistencePolicy(persist_types=[EventType.MESSAGE], exclude_types=[EventType.TOOL_CALL_END])
    by_name = PersistencePolicy(persist_types=["message"], exclude_types=["tool_call_end"])
    assert by_enum == by_name
    assert by_enum.allows("message")
    assert not by_enum.allows("tool_call_end")
    assert not by_enum.allows("tool_call_start")
    assert PersistencePolicy().allows("anything_new")
    assert not PersistencePolicy(exclude_types=["x"]).allows("x")
    assert not PersistencePolicy(persist_types=["x"], exclude_types=["x"]).allows("x")


def test_excluded_rows_take_no_index(with_policy):
    c = with_policy(PersistencePolicy(exclude_types={"tool_call_start"}))
    record_turn()
    record_turn()
    events = c.store.list_events("s", limit=None, event_filter=EVERY)
    assert [e.index for e in events] == list(range(1, 9))
    assert c.store.get_event_count("s") == 8
    assert c.store.list_sessions()[0].event_count == 8
