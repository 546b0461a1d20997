"""Scores over OTLP: ``loopscope.score`` recorded in-process and exported by loopscope's own
exporter (a secret in an explanation masked alike) into a real ``loopscope collect`` child land in both stores alike; another
instrumentation's ``gen_ai.evaluation.result`` (a span event on the evaluated span, or a span of
the evaluator's own carrying the event's attributes) becomes a score in the collector's store.
One recording for the module (docs/testing.md: tests are cheap)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import set_span_in_context

import loopscope
from children import collect_child
from recorded import connect_when_free

COLUMNS = ("name", "value", "label", "explanation", "source", "target", "session_id", "turn_id", "agent", "model", "tool",
           "tool_call_id", "response_id", "call_position", "found", "trace_id", "span_id", "id")


def query(db: Path, sql: str) -> list[tuple[Any, ...]]:
    con = connect_when_free(db)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def record_scored_turn() -> Any:
    @loopscope.tool
    def get_weather(city: str) -> dict[str, Any]:
        loopscope.score(None, "tool_ok", value=1, source="code")  # the tool call running here
        return {"city": city, "temp_c": 21}

    with loopscope.turn(session_id="s1", agent="concierge", input="Dinner outside?", model="gpt-4o", provider="openai") as t:
        with t.round() as rnd:
            rnd.response("Checking.", tool_calls=[{"id": "call_1", "name": "get_weather", "arguments": {"city": "Paris"}}],
                         response_id="resp_1")
            loopscope.score(name="grounded", label="yes", source="model")  # the model call running here
        get_weather("Paris")
        t.generation("21 °C: a terrace works.", finish_reason="stop", response_id="resp_2")
    loopscope.score(t, "helpful", value=0.9, label="up", explanation="answered the question (password=hunter2)")  # after it ended
    loopscope.score("resp_2", "accurate", value=1)  # a response id, as a web front end keeps it
    return t


def send_foreign_evaluations(endpoint: str) -> None:
    """Another instrumentation: a ``chat`` span with an evaluation event on it, and an evaluator's
    span of its own (the event's attributes on the span) under an ``execute_tool`` span."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces")))
    tracer = provider.get_tracer("some.evaluator")
    with tracer.start_as_current_span("chat gpt-4o-mini", attributes={
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "gpt-4o-mini",
        "gen_ai.response.id": "chatcmpl-foreign-1",
    }) as chat:
        chat.add_event("gen_ai.evaluation.result", {
            "gen_ai.evaluation.name": "relevance", "gen_ai.evaluation.score.value": 0.25,
            "gen_ai.evaluation.score.label": "not_relevant", "gen_ai.evaluation.explanation": "off topic",
        })
        chat.add_event("gen_ai.evaluation.result", {"gen_ai.evaluation.name": "toxicity", "gen_ai.evaluation.score.value": 0.0})
    tool = tracer.start_span("execute_tool search", attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search"})
    tool.end()
    evaluator = tracer.start_span("evaluate", context=set_span_in_context(tool), attributes={
        "gen_ai.evaluation.name": "tool_choice", "gen_ai.evaluation.score.label": "pass",
    })
    evaluator.end()
    provider.shutdown()


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("scores")
    local, collected = folder / "local.duckdb", folder / "collected.duckdb"
    with collect_child(collected, "--no-grpc") as child:
        provider = TracerProvider()
        loopscope.configure(local, tracer_provider=provider, otlp_endpoint=child.http, capture_content=True,
                            flush_interval=0.05)
        try:
            turn = record_scored_turn()
            # another instrumentation in the same process: its evaluation event is a score in both stores
            with provider.get_tracer("some.instrumentation").start_as_current_span("chat m", attributes={
                "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "m",
            }) as chat:
                chat.add_event("gen_ai.evaluation.result", {"gen_ai.evaluation.name": "in_process", "gen_ai.evaluation.score.label": "ok"})
        finally:
            loopscope.shutdown()
        send_foreign_evaluations(child.http)
        child.stop_ok()
    yield {"local": local, "collected": collected, "turn": turn}


def scores(db: Path, where: str = "true") -> list[tuple[Any, ...]]:
    return query(db, f"SELECT {', '.join(COLUMNS)} FROM score_targets WHERE {where} ORDER BY name")


def test_scores_recorded_in_process_and_received_by_collect_are_equal_and_find_what_they_score(stores):
    local = scores(stores["local"], "source IS NOT NULL")
    assert local == scores(stores["collected"], "source IS NOT NULL")  # the foreign ones have no source
    turn = stores["turn"]
    found = {row[0]: dict(zip(COLUMNS, row)) for row in local}
    assert sorted(found) == ["accurate", "grounded", "helpful", "tool_ok"]
    assert all(s["found"] and s["session_id"] == "s1" and s["turn_id"] == turn.correlation_id for s in found.values())
    assert all(s["agent"] == "concierge" and s["model"] == "gpt-4o" for s in found.values())
    helpful = found["helpful"]
    assert (helpful["target"], helpful["value"], helpful["label"], helpful["explanation"], helpful["source"]) == (
        "turn", 0.9, "up", "answered the question (password=[REDACTED])", "human")  # masked in both stores, as an error is
    assert helpful["span_id"] == turn.response.span_id and helpful["trace_id"] == turn.response.trace_id
    assert (found["tool_ok"]["target"], found["tool_ok"]["tool"], found["tool_ok"]["tool_call_id"]) == ("tool", "get_weather", "call_1")
    assert (found["grounded"]["target"], found["grounded"]["call_position"], found["grounded"]["response_id"]) == ("call", 1, "resp_1")
    assert (found["accurate"]["target"], found["accurate"]["call_position"], found["accurate"]["response_id"]) == ("call", 2, "resp_2")
    # the evaluated span's child, as the conventions' event: its parent is the turn's span
    (parent,) = query(stores["collected"], "SELECT parent_span_id FROM spans WHERE name = 'gen_ai.evaluation.result' "
                                           "AND attributes->>'gen_ai.evaluation.name' = 'helpful'")
    assert parent == (turn.response.span_id,)
    (events,) = query(stores["collected"], "SELECT events::VARCHAR FROM spans WHERE attributes->>'gen_ai.evaluation.name' = 'helpful'")
    assert '"gen_ai.evaluation.result"' in events[0] and '"gen_ai.evaluation.score.label"' in events[0]
    assert "hunter2" not in events[0]  # the event's explanation is masked on export too


def test_another_instrumentations_evaluation_results_become_scores_of_what_they_evaluate(stores):
    # in the recording process (its store's processor) and through collect alike
    (in_process,) = scores(stores["local"], "source IS NULL")
    assert in_process == scores(stores["collected"], "name = 'in_process'")[0]
    assert (in_process[0], in_process[2], in_process[5]) == ("in_process", "ok", "call")
    foreign = {row[0]: dict(zip(COLUMNS, row)) for row in scores(stores["collected"], "source IS NULL AND name <> 'in_process'")}
    assert sorted(foreign) == ["relevance", "tool_choice", "toxicity"]
    relevance = foreign["relevance"]
    assert (relevance["value"], relevance["label"], relevance["explanation"], relevance["target"], relevance["response_id"]) == (
        0.25, "not_relevant", "off topic", "call", "chatcmpl-foreign-1")
    assert foreign["toxicity"]["value"] == 0.0 and foreign["toxicity"]["id"] != relevance["id"]
    (chat_span,) = query(stores["collected"], "SELECT span_id FROM spans WHERE name = 'chat gpt-4o-mini'")
    assert relevance["span_id"] == chat_span[0] == foreign["toxicity"]["span_id"]
    (tool_span,) = query(stores["collected"], "SELECT span_id FROM spans WHERE name = 'execute_tool search'")
    assert (foreign["tool_choice"]["label"], foreign["tool_choice"]["span_id"]) == ("pass", tool_span[0])
