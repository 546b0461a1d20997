"""Scores on ClickHouse (chDB) answer as on DuckDB: one recording (test_engines_agree's sessions, a
scored turn, another instrumentation's evaluation results) goes into a DuckDB store (its writer)
and, as the Collector's ``clickhouseexporter`` writes the same spans, into chDB's ``otel_traces``,
whose materialized views fill ``loopscope_scores``. Then ``loopscope score`` and ``loopscope
collect`` write scores into a chDB store in child processes and a reader finds them."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from agent_loop import record_sessions
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import set_span_in_context

import loopscope
from children import collect_child
from loopscope.storage.clickhouse.runner import connect
from loopscope.storage.clickhouse.spans import json_each_row, row_of
from loopscope.storage.errors import StoreError
from loopscope.storage.queries import Reader, open_reader, prepare

pytestmark = pytest.mark.stack("clickhouse")


def record_scored_turn(tracer: Any) -> Any:
    """A turn scored every way ``loopscope.score`` takes a target, and another instrumentation's
    results: an evaluator's span with evaluation events under the tool call, an evaluator's span
    (the event's attributes on it) under the turn."""
    @loopscope.tool
    def get_weather(city: str) -> dict[str, Any]:
        loopscope.score(None, "tool_ok", value=1, source="code")  # the tool call running here
        # an evaluator's span under the tool call, its events (a GenAI attribute: the in-process
        # store's processor passes over spans without one)
        with tracer.start_as_current_span("judge", attributes={"gen_ai.operation.name": "evaluate"}) as judge:
            judge.add_event("gen_ai.evaluation.result", {"gen_ai.evaluation.name": "relevance",
                                                         "gen_ai.evaluation.score.value": 0.25, "gen_ai.evaluation.score.label": "not_relevant"})
            judge.add_event("something.else")
            judge.add_event("gen_ai.evaluation.result", {"gen_ai.evaluation.name": "toxicity", "gen_ai.evaluation.score.value": 0.0})
        return {"city": city, "temp_c": 21}

    with loopscope.turn(session_id="s1", agent="concierge", input="Dinner outside?", model="gpt-4o", provider="openai") as t:
        with t.round() as rnd:
            rnd.response("Checking.", tool_calls=[{"id": "call_1", "name": "get_weather", "arguments": {"city": "Paris"}}],
                         response_id="resp_1")
            loopscope.score(name="grounded", label="yes", source="model")  # the model call running here
        get_weather("Paris")
        t.generation("21 °C: a terrace works.", finish_reason="stop", response_id="resp_2")
        evaluator = tracer.start_span("evaluate", attributes={"gen_ai.evaluation.name": "tone", "gen_ai.evaluation.score.value": 0.5})
        evaluator.end()  # an evaluator's span under the turn: scores the turn
    loopscope.score(t, "helpful", value=0.9, label="up", explanation="answered the question")  # after it ended
    loopscope.score(t, "helpful", value=0.1, label="down")
    loopscope.score("resp_2", "accurate", value=1)  # a response id
    loopscope.score("turn-1", "thumbs", label="up")  # a turn's correlation id, as text
    loopscope.score("c2b", "tool_choice", label="pass", source="code")  # a tool call id, as text
    loopscope.score("nobody-has-this", "orphan", value=0)  # names nothing (yet)
    return t


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The recording's spans in a DuckDB store and, as the exporter's rows, in chDB."""
    folder = tmp_path_factory.mktemp("chscores")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    duck = folder / "store.duckdb"
    loopscope.configure(duck, tracer_provider=provider, flush_interval=0.05, capture_content=True)
    try:
        record_sessions()
        turn = record_scored_turn(provider.get_tracer("some.evaluator"))
        assert loopscope.flush()
    finally:
        loopscope.shutdown()
    body = json_each_row(row_of(span) for span in exporter.get_finished_spans())
    url = prepare(f"chdb://{folder}/chdb")
    runner = connect(url)
    try:
        runner.insert_json("otel_traces", body)
        runner.insert_json("otel_traces", body)  # the Collector's retry: the same scores, not twice
    finally:
        runner.close()
    yield {"duckdb": str(duck), "chdb": url, "folder": folder, "turn": turn, "body": body}


@pytest.fixture
def pair(recorded: dict[str, Any]) -> Iterator[tuple[Reader, Reader]]:
    ch = open_reader(recorded["chdb"])
    try:
        yield open_reader(recorded["duckdb"]), ch
    finally:
        ch.close()  # type: ignore[attr-defined]


def _close(value: Any) -> Any:
    """An answer less the time it was made, floats compared to 1e-9."""
    if isinstance(value, dict):
        return {k: _close(v) for k, v in value.items() if k != "generated_at"}
    if isinstance(value, list):
        return [_close(v) for v in value]
    if isinstance(value, float):
        return pytest.approx(value, abs=1e-9)
    return value


def test_score_targets_session_scores_and_the_scores_page_answer_as_on_duckdb(pair: tuple[Reader, Reader],
                                                                                  recorded: dict[str, Any]) -> None:
    duck, ch = pair
    turn = recorded["turn"]
    refs = [turn.correlation_id, turn.correlation_id[:8], "turn-1", "resp_1", "c2b", "call_1", turn.response.span_id,
            "nothing"]
    for ref in refs:
        assert ch.score_target(ref) == duck.score_target(ref), ref
    target = ch.score_target(turn.correlation_id)
    assert target is not None and (target.kind, target.session_id, target.agent) == ("turn", "s1", "concierge")
    assert ch.score_target("call_1").kind == "tool"  # type: ignore[union-attr]
    for reader in pair:  # a prefix six turns have (turn-0 ... turn-5)
        with pytest.raises(StoreError, match="names 6 things"):
            reader.score_target("turn")

    turn_ids = {s: [t.correlation_id for t in duck.turn_rows(s, None)] for s in ("s1", "beta", "gamma")}
    for session, ids in turn_ids.items():
        found, expected = ch.page_session_scores(session, ids), duck.page_session_scores(session, ids)
        assert _close(found) == _close(expected), session
    s1 = ch.page_session_scores("s1", turn_ids["s1"])["scores"]
    assert sorted(s["name"] for s in s1) == sorted(["grounded", "tool_ok", "relevance", "toxicity", "tone", "helpful", "helpful", "accurate"])
    assert {s["target"] for s in s1} == {"call", "tool", "turn"}
    assert [s["name"] for s in ch.page_session_scores("beta", turn_ids["beta"])["scores"]] == ["thumbs"]  # turn-1
    assert ch.page_session_scores("s1", []) == {**ch.page_session_scores("s1", []), "scores": []}
    # a timeline page holds its turns' scores too
    assert _close(ch.page_timeline("s1")["scores"]) == _close(duck.page_timeline("s1")["scores"]) == _close(s1)

    for range_ in ("all", "24h"):
        found, expected = ch.page_scores(range_), duck.page_scores(range_)
        assert _close(found) == _close(expected), range_
    page = ch.page_scores()
    names = {r["name"]: r for r in page["names"]}
    assert names["helpful"]["scores"] == 2 and names["helpful"]["mean_value"] == pytest.approx(0.5)
    assert names["helpful"]["labels"] == {"up": 1, "down": 1}
    assert {r["name"] for r in page["recent"]} >= {"relevance", "toxicity", "orphan", "thumbs", "tool_choice"}
    orphan = next(r for r in page["recent"] if r["name"] == "orphan")
    assert orphan["found"] is False and orphan["target"] is None
    assert len(page["recent"]) == 11  # the resent batch counted once
    # the views by the DuckDB store's names, for SQL: the same rows
    from test_clickhouse_views import _rows

    for view in ("score_targets", "scores_over_time"):
        duck_names, expected = _rows(duck, view)
        names, found = _rows(ch, view)
        assert names == duck_names and len(found) == len(expected) > 0 and found == expected, view
    _, rows = ch.sql("SELECT name, scores, labels FROM scores_over_time WHERE name = 'helpful'")
    assert rows == [("helpful", 2, '{"down":1,"up":1}')]
    assert ch.sql("SELECT count() FROM score_targets WHERE found")[1] == [(10,)]


def test_loopscope_score_and_collect_write_scores_into_a_chdb_store(recorded: dict[str, Any]) -> None:
    """``loopscope score TARGET NAME --db chdb://...`` looks the target up and writes the score,
    and ``loopscope collect --db chdb://...`` keeps another instrumentation's evaluation event:
    each in a child process (chDB lets one process at a time open a directory)."""
    url = prepare(f"chdb://{recorded['folder']}/cli")
    runner = connect(url)
    try:
        runner.insert_json("otel_traces", recorded["body"])
    finally:
        runner.close()
    done = subprocess.run([sys.executable, "-m", "loopscope", "score", "turn-1", "cli_thumbs", "--value", "1", "--db", url,
                           "--json"], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    written = json.loads(done.stdout)
    assert (written["target"], written["session_id"], written["turn_id"]) == ("turn", "beta", "turn-1")

    with collect_child(url, "--no-grpc") as child:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{child.http}/v1/traces")))
        tracer = provider.get_tracer("some.evaluator")
        tool = tracer.start_span("execute_tool search", attributes={"gen_ai.operation.name": "execute_tool",
                                                                      "gen_ai.tool.name": "search"})
        tool.add_event("gen_ai.evaluation.result", {"gen_ai.evaluation.name": "collected", "gen_ai.evaluation.score.label": "ok"})
        tool.end()
        evaluator = tracer.start_span("evaluate", context=set_span_in_context(tool),
                                      attributes={"gen_ai.evaluation.name": "collected_span", "gen_ai.evaluation.score.value": 2})
        evaluator.end()
        provider.shutdown()
        child.stop_ok()

    # what the dashboard asks (its /api/scores: the Scores page, a session page's poll) of a reader
    ch = open_reader(url)
    try:
        page = ch.page_scores()["recent"]
        recent = {r["name"]: r for r in page}
        assert (recent["cli_thumbs"]["value"], recent["cli_thumbs"]["source"], recent["cli_thumbs"]["target"],
                recent["cli_thumbs"]["found"]) == (1.0, "human", "turn", True)
        beta = ch.page_session_scores("beta", ["turn-1"])["scores"]
        assert sorted(s["name"] for s in beta) == ["cli_thumbs", "thumbs"]
        collected, own_span = recent["collected"], recent["collected_span"]
        assert (collected["label"], collected["target"], collected["tool"], collected["found"]) == ("ok", "tool", "search", True)
        assert (own_span["value"], own_span["target"], own_span["tool"]) == (2.0, "tool", "search")
        assert len([r for r in page if r["name"].startswith("collected")]) == 2  # collect's score and the view's: one row
    finally:
        ch.close()  # type: ignore[attr-defined]
