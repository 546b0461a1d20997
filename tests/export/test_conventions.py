"""Which GenAI conventions loopscope emits (the current ones by default: semantic-conventions-genai
v0.1.0's names; the older v1.37 ones under LOOPSCOPE_SEMCONV=v1.37 or configure(semconv="v1.37")), and
that the collector reads every version: loopscope's own spans in either, and other instrumentations'
spans in the newer shape (invoke_workflow around invoke_agent of either kind,
gen_ai.usage.cache_write.input_tokens). tests/export/test_semconv_models.py checks the same spans
and metrics against the conventions' own YAML models and JSON schemas."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import loopscope
from fakes.model_server import Reply, ToolCall, Usage
from loopscope import semconv as a
from loopscope.ingest.otlp.collector import Collector
from loopscope.storage.duckdb.connection import open_store

OPT_IN = "OTEL_SEMCONV_STABILITY_OPT_IN"
SWITCH = "LOOPSCOPE_SEMCONV"
CACHE_CREATION, CACHE_WRITE = "gen_ai.usage.cache_creation.input_tokens", "gen_ai.usage.cache_write.input_tokens"
CACHE_READ, PROVIDER = "gen_ai.usage.cache_read.input_tokens", "gen_ai.provider.name"
LATEST_TOKEN_COUNTERS = {
    "gen_ai.client.inference.usage.input_tokens", "gen_ai.client.inference.usage.output_tokens",
    "gen_ai.client.inference.usage.cache_read.input_tokens", "gen_ai.client.inference.usage.cache_write.input_tokens",
    "gen_ai.client.inference.usage.reasoning.output_tokens",
}
OLDER_METRICS = {"gen_ai.client.token.usage", "gen_ai.client.operation.duration"}
CURRENT_METRICS = {
    "gen_ai.client.inference.duration", "gen_ai.client.inference.time_to_first_chunk",
    "gen_ai.invoke_agent.duration", "gen_ai.invoke_agent.inference_calls", "gen_ai.invoke_agent.tool_calls",
    "gen_ai.client.inference.operation.input_tokens", "gen_ai.client.inference.operation.output_tokens",
} | LATEST_TOKEN_COUNTERS


TOOLS: Any = [{"type": "function", "function": {
    "name": "weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def rows(db: Path | str, sql: str) -> list[tuple[Any, ...]]:
    with open_store(str(Path(db).resolve()), read_only=True) as con:
        return con.execute(sql).fetchall()


@pytest.fixture
def collector(tmp_path: Path) -> Iterator[Collector]:
    with Collector(str(tmp_path / "collected.duckdb"), http_port=0, grpc_port=None, flush_interval=0.05) as c:
        yield c


class Recorded:
    def __init__(self, spans: InMemorySpanExporter, reader: InMemoryMetricReader, db: Path) -> None:
        self.spans, self.reader, self.db = spans, reader, db

    def span(self, name: str) -> Any:
        (span,) = [s for s in self.spans.get_finished_spans() if s.name == name]
        return span

    def metrics(self) -> dict[str, Any]:
        data = self.reader.get_metrics_data()
        return {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


def record_loop(tmp_path: Path, model_server: Any, endpoint: str | None = None, **options: Any) -> Recorded:
    """A tool loop through the real openai SDK against the fake server (the first call streamed,
    with cached and cache-written tokens), recorded with spans in memory and metrics read in memory."""
    spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    db = tmp_path / "local.duckdb"
    loopscope.configure(db, tracer_provider=provider, meter_provider=MeterProvider(metric_readers=[reader]),
                        otlp_endpoint=endpoint, capture_content=True, flush_interval=0.05, **options)
    loopscope.instrument(anthropic=False)
    try:
        model_server.queue(
            Reply(tool_calls=[ToolCall("weather", {"city": "Lyon"}, id="call_c1")],
                  usage=Usage(40, 8, cached_tokens=10, cache_creation_tokens=5)),
            Reply(text="Lyon: 21 °C.", usage=Usage(60, 6, cached_tokens=30)),
        )
        client = model_server.openai_client()
        history: list[Any] = [{"role": "user", "content": "Weather in Lyon?"}]
        stream = client.chat.completions.create(model="gpt-test", messages=history, stream=True, tools=TOOLS,
                                                stream_options={"include_usage": True})
        calls: dict[int, dict[str, str]] = {}
        for chunk in stream:
            for choice in chunk.choices:
                for tc in choice.delta.tool_calls or []:
                    entry = calls.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                    entry["id"] = tc.id or entry["id"]
                    entry["name"] = (tc.function.name or entry["name"]) if tc.function else entry["name"]
                    entry["arguments"] += (tc.function.arguments or "") if tc.function else ""
        call = calls[0]
        history.append({"role": "assistant", "tool_calls": [
            {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}]})
        history.append({"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"temp_c": 21})})
        client.chat.completions.create(model="gpt-test", messages=history, tools=TOOLS)
        loopscope.flush()
    finally:
        loopscope.uninstrument()
        loopscope.shutdown()
    return Recorded(spans, reader, db)


def chat_spans(recorded: Recorded) -> list[Any]:
    return sorted((s for s in recorded.spans.get_finished_spans() if s.attributes.get(a.OPERATION) == "chat"),
                  key=lambda s: s.start_time)


def turn_span(recorded: Recorded) -> Any:
    (turn,) = [s for s in recorded.spans.get_finished_spans() if s.attributes.get(a.OPERATION) == "invoke_agent"]
    return turn


@pytest.mark.parametrize("opt_in", ["", "gen_ai_latest_experimental", "http/dup, GEN_AI_LATEST_EXPERIMENTAL ,database"])
def test_by_default_the_current_conventions_are_emitted(tmp_path, model_server, monkeypatch, opt_in):
    """semantic-conventions-genai v0.1.0's names, whether or not the old opt-in asks for them (it
    was how one asked for them before they were the default, as in opentelemetry-util-genai 1.0)."""
    monkeypatch.delenv(SWITCH, raising=False)
    monkeypatch.setenv(OPT_IN, opt_in)
    recorded = record_loop(tmp_path, model_server)
    first, second = chat_spans(recorded)
    # a model call over HTTP is a CLIENT span (every chat span was INTERNAL)
    assert first.kind is SpanKind.CLIENT and second.kind is SpanKind.CLIENT
    assert first.attributes[CACHE_WRITE] == 5 and CACHE_CREATION not in first.attributes
    assert first.attributes[CACHE_READ] == 10 and first.attributes[PROVIDER] == "openai"
    # every tool definition says its type (the schema requires it)
    assert [t["type"] for t in json.loads(first.attributes[a.TOOL_DEFINITIONS])] == ["function"]
    turn = turn_span(recorded)
    assert turn.kind is SpanKind.INTERNAL  # an in-process agent run, in either version
    # no provider and no cache usage on the agent span (removed upstream): loopscope's own names
    assert PROVIDER not in turn.attributes and CACHE_READ not in turn.attributes
    assert CACHE_WRITE not in turn.attributes and CACHE_CREATION not in turn.attributes
    assert turn.attributes[a.TURN_PROVIDER] == "openai"
    assert (turn.attributes[a.TURN_CACHE_READ], turn.attributes[a.TURN_CACHE_WRITE]) == (40, 5)
    # the proposed agent attributes, beside loopscope's
    assert turn.attributes["gen_ai.agent.finish_reason"] == "completed" == turn.attributes[a.LOOP_END_REASON]
    assert turn.attributes["gen_ai.agent.turn.count"] == 2 == turn.attributes[a.MODEL_CALL_COUNT]
    metrics = recorded.metrics()
    assert CURRENT_METRICS | {"gen_ai.execute_tool.duration"} <= set(metrics)
    assert not OLDER_METRICS & set(metrics)
    assert not [m for m in metrics if m.startswith("gen_ai.client.operation.")]

    def total(name: str) -> int:
        points = metrics[name].data.data_points
        assert all(p.attributes["gen_ai.token.modality"] == "unknown" for p in points)
        assert metrics[name].data.is_monotonic  # a counter
        return sum(p.value for p in points)

    assert total("gen_ai.client.inference.usage.input_tokens") == 100
    assert total("gen_ai.client.inference.usage.output_tokens") == 14
    assert total("gen_ai.client.inference.usage.cache_read.input_tokens") == 40
    assert total("gen_ai.client.inference.usage.cache_write.input_tokens") == 5
    per_call = metrics["gen_ai.client.inference.operation.input_tokens"].data.data_points
    assert sum(p.count for p in per_call) == 2 and sum(p.sum for p in per_call) == 100
    (duration,) = metrics["gen_ai.client.inference.duration"].data.data_points
    assert duration.count == 2 and duration.attributes["gen_ai.operation.name"] == "chat"
    # the streamed call, not the other one
    (first_chunk,) = metrics["gen_ai.client.inference.time_to_first_chunk"].data.data_points
    assert first_chunk.count == 1 and first_chunk.attributes["gen_ai.request.model"] == "gpt-test"
    (agent,) = metrics["gen_ai.invoke_agent.duration"].data.data_points
    assert agent.count == 1 and PROVIDER not in agent.attributes and "gen_ai.operation.name" not in agent.attributes
    (inference_calls,) = metrics["gen_ai.invoke_agent.inference_calls"].data.data_points
    (tool_calls,) = metrics["gen_ai.invoke_agent.tool_calls"].data.data_points
    assert (inference_calls.count, inference_calls.sum) == (1, 2) and (tool_calls.count, tool_calls.sum) == (1, 1)
    assert metrics["gen_ai.invoke_agent.inference_calls"].unit == "{inference_call}"
    assert metrics["gen_ai.invoke_agent.tool_calls"].unit == "{tool_call}"


@pytest.mark.parametrize("how", ["env", "configure"])
def test_the_switch_emits_the_older_names(tmp_path, model_server, monkeypatch, how):
    """LOOPSCOPE_SEMCONV=v1.37 (or configure(semconv="v1.37")), for backends that still read the older
    names; the old opt-in does not change it."""
    monkeypatch.setenv(OPT_IN, "gen_ai_latest_experimental")
    if how == "env":
        monkeypatch.setenv(SWITCH, " V1.37 ")
        recorded = record_loop(tmp_path, model_server)
    else:
        monkeypatch.setenv(SWITCH, "current")
        recorded = record_loop(tmp_path, model_server, semconv="v1.37")
    first, _second = chat_spans(recorded)
    assert first.kind is SpanKind.CLIENT  # the kind the older conventions asked for too
    assert first.attributes[CACHE_CREATION] == 5 and CACHE_WRITE not in first.attributes
    assert [t["type"] for t in json.loads(first.attributes[a.TOOL_DEFINITIONS])] == ["function"]
    turn = turn_span(recorded)
    assert turn.kind is SpanKind.INTERNAL
    assert turn.attributes[PROVIDER] == "openai" and a.TURN_PROVIDER not in turn.attributes
    assert (turn.attributes[CACHE_READ], turn.attributes[CACHE_CREATION]) == (40, 5)
    assert turn.attributes["gen_ai.agent.finish_reason"] == "completed"
    # each output message keeps its finish_reason (Arize Phoenix drops a message without one)
    assert all(m["finish_reason"] for m in json.loads(turn.attributes[a.OUTPUT_MESSAGES]))
    metrics = recorded.metrics()
    assert OLDER_METRICS | {"gen_ai.execute_tool.duration"} <= set(metrics)
    assert not CURRENT_METRICS & set(metrics)
    tokens = {(p.attributes["gen_ai.token.type"], p.sum) for p in metrics["gen_ai.client.token.usage"].data.data_points}
    assert tokens == {("input", 100), ("output", 14)}


@pytest.mark.parametrize("env, expected", [
    ({}, "current"), ({SWITCH: ""}, "current"), ({SWITCH: "current"}, "current"), ({SWITCH: "v1.37"}, "v1.37"),
    ({SWITCH: "Legacy"}, "v1.37"), ({OPT_IN: "gen_ai_latest_experimental"}, "current"),
    ({SWITCH: "v1.37", OPT_IN: "gen_ai_latest_experimental"}, "v1.37"),
])
def test_the_switch_is_read_from_the_environment(env, expected):
    assert a.conventions(environ=env) == expected


def test_an_unknown_switch_value_is_said_and_gives_the_current_conventions(caplog):
    with caplog.at_level("WARNING", logger="loopscope"):
        assert a.conventions(environ={SWITCH: "v9"}) == "current"
    assert "LOOPSCOPE_SEMCONV='v9'" in caplog.text
    with pytest.raises(ValueError, match="semconv="):
        loopscope.configure(False, semconv="v9")


@pytest.mark.parametrize("reason, value", [
    ("completed", "completed"), ("max_rounds", "max_iterations"), ("timeout", "time_budget"),
    ("budget_exceeded", "max_tokens"), ("cancelled", "cancelled"), ("force_stopped", "cancelled"),
    ("error", "error"), ("refusal", "guardrail"), ("content_filter", "guardrail"),
    ("cut_off", "cut_off"), ("truncated", "truncated"), ("unfinished", "unfinished"), ("empty_response", "empty_response"),
])
def test_every_loop_end_reason_has_an_agent_finish_reason(reason, value):
    assert a.agent_finish_reason(reason) == value
    assert {r.value for r in loopscope.LoopEndReason} <= set(a.AGENT_FINISH_REASONS) | {
        "cut_off", "truncated", "unfinished", "empty_response"}


@pytest.mark.parametrize("value, latest", [
    ("", False), ("gen_ai", False), ("http", False), ("gen_ai_latest_experimental", True),
    (" gen_ai_latest_experimental ", True), ("database/dup,gen_ai_latest_experimental", True),
    ("Gen_AI_Latest_Experimental", True), ("gen_ai_latest_experimental_v2", False),
])
def test_the_opt_in_is_a_comma_separated_list(value, latest):
    assert a.latest_experimental({OPT_IN: value}) is latest


@pytest.mark.parametrize("version", ["", "v1.37"])
def test_the_collector_stores_loopscopes_spans_in_either_version_as_the_local_store_does(
        tmp_path, model_server, collector, monkeypatch, version):
    monkeypatch.setenv(SWITCH, version)
    recorded = record_loop(tmp_path, model_server, endpoint=collector.http_endpoint)
    collector.stop()
    sql = ("SELECT input_tokens, output_tokens, cache_read_input_tokens, cache_creation_input_tokens "
           "FROM model_calls ORDER BY started_at")
    assert rows(recorded.db, sql)[0] == (40, 8, 10, 5)
    assert rows(collector.db, sql) == rows(recorded.db, sql)
    turn_sql = ("SELECT input_tokens, cache_read_input_tokens, cache_creation_input_tokens, tool_calls, provider "
                "FROM turn_summaries")
    assert rows(collector.db, turn_sql) == rows(recorded.db, turn_sql) == [(100, 40, 5, 1, "openai")]


# -- other instrumentations' spans in the newer shape --------------------------------------------

QUESTION, ANSWER = "What's the weather in Paris?", "It is 21 °C and dry in Paris."


def send_newer_shape(endpoint: str, agent_kind: SpanKind) -> None:
    """A workflow around one agent run (two chat calls and a tool call) as the latest experimental
    conventions shape it, from the real SDK over OTLP/HTTP."""
    provider = TracerProvider(resource=Resource.create({"service.name": "newer-shape"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces")))
    tracer = provider.get_tracer("opentelemetry.util.genai")
    user = {"role": "user", "parts": [{"type": "text", "content": QUESTION}]}
    asked = {"role": "assistant", "parts": [{"type": "tool_call", "id": "call_w1", "name": "get_weather",
                                             "arguments": {"city": "Paris"}}], "finish_reason": "tool_calls"}
    with tracer.start_as_current_span("invoke_workflow travel", kind=SpanKind.INTERNAL,
                                      attributes={a.OPERATION: "invoke_workflow", "gen_ai.workflow.name": "travel"}), \
            tracer.start_as_current_span("invoke_agent weather-agent", kind=agent_kind, attributes={
                a.OPERATION: "invoke_agent", a.AGENT_NAME: "weather-agent", a.PROVIDER: "openai",
                a.REQUEST_MODEL: "gpt-4o-mini", a.INPUT_MESSAGES: json.dumps([user])}) as agent:
        with tracer.start_as_current_span("chat gpt-4o-mini", kind=SpanKind.CLIENT, attributes={
                a.OPERATION: "chat", a.PROVIDER: "openai", a.REQUEST_MODEL: "gpt-4o-mini", a.RESPONSE_MODEL: "gpt-4o-mini",
                a.RESPONSE_FINISH_REASONS: ("tool_calls",), a.USAGE_INPUT: 60, a.USAGE_OUTPUT: 12,
                "gen_ai.usage.cache_read.input_tokens": 20, CACHE_WRITE: 7,
                a.INPUT_MESSAGES: json.dumps([user]), a.OUTPUT_MESSAGES: json.dumps([asked])}):
            pass
        with tracer.start_as_current_span("execute_tool get_weather", kind=SpanKind.INTERNAL, attributes={
                a.OPERATION: "execute_tool", a.TOOL_NAME: "get_weather", a.TOOL_CALL_ID: "call_w1",
                a.TOOL_CALL_ARGUMENTS: '{"city": "Paris"}', a.TOOL_CALL_RESULT: '{"temp_c": 21}'}):
            pass
        result = {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_w1", "response": {"temp_c": 21}}]}
        answer = {"role": "assistant", "parts": [{"type": "text", "content": ANSWER}], "finish_reason": "stop"}
        with tracer.start_as_current_span("chat gpt-4o-mini", kind=SpanKind.CLIENT, attributes={
                a.OPERATION: "chat", a.PROVIDER: "openai", a.REQUEST_MODEL: "gpt-4o-mini", a.RESPONSE_MODEL: "gpt-4o-mini",
                a.RESPONSE_FINISH_REASONS: ("stop",), a.USAGE_INPUT: 95, a.USAGE_OUTPUT: 11, CACHE_WRITE: 0,
                a.INPUT_MESSAGES: json.dumps([user, asked, result]), a.OUTPUT_MESSAGES: json.dumps([answer])}):
            pass
        agent.set_attribute(a.OUTPUT_MESSAGES, json.dumps([answer]))
    provider.shutdown()


@pytest.mark.parametrize("agent_kind", [SpanKind.INTERNAL, SpanKind.CLIENT], ids=["internal", "client"])
def test_the_collector_reads_the_newer_shape(collector, agent_kind):
    send_newer_shape(collector.http_endpoint, agent_kind)
    collector.stop()
    # one turn: the agent run (the workflow is a container, not a second turn)
    (turn,) = rows(collector.db, "SELECT agent, response_content, tool_calls, input_tokens, output_tokens, "
                                 "cache_read_input_tokens, cache_creation_input_tokens FROM turn_summaries")
    assert turn[0] == "weather-agent" and ANSWER in turn[1] and turn[2] == 1
    assert turn[3:] == (155, 23, 20, 7)
    calls = rows(collector.db, "SELECT input_tokens, output_tokens, cache_read_input_tokens, cache_creation_input_tokens "
                               "FROM model_calls ORDER BY started_at")
    assert [c[3] for c in calls] == [7, None] and [c[0] for c in calls] == [60, 95]
    tools = rows(collector.db, "SELECT type FROM events WHERE type LIKE 'tool_call%' ORDER BY idx")
    assert tools == [("tool_call_start",), ("tool_call_end",)]
