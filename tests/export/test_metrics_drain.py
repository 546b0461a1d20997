"""The metrics thread's counters when many spans are measured in one drain (issue 31: the
counters' adds of a drain are summed per counter and attribute set, one SDK measurement each):
what a metrics backend reads is the same totals, every counter's point there, zero ones too."""

from __future__ import annotations

import json
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

import loopscope
from fakes.model_server import Reply, ToolCall, Usage

TOOLS: Any = [{"type": "function", "function": {
    "name": "weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
TURNS = 6


def _points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    data = reader.get_metrics_data()
    assert data is not None
    return {m.name: list(m.data.data_points) for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


def test_counters_of_many_calls_measured_at_once_keep_their_totals(tmp_path, model_server):
    reader = InMemoryMetricReader()
    loopscope.configure(tmp_path / "m.duckdb", tracer_provider=TracerProvider(),
                        meter_provider=MeterProvider(metric_readers=[reader]), flush_interval=0.05)
    loopscope.instrument(anthropic=False)
    try:
        client = model_server.openai_client()
        for turn in range(TURNS):
            model_server.queue(
                Reply(tool_calls=[ToolCall("weather", {"city": "Lyon"}, id=f"call_{turn}")],
                      usage=Usage(40, 8, cached_tokens=10)),
                Reply(text="Lyon: 21 °C.", usage=Usage(60, 6)),
            )
            history: list[Any] = [{"role": "user", "content": f"[{turn}] Weather in Lyon?"}]
            first = client.chat.completions.create(model="gpt-test", messages=history, tools=TOOLS)
            (call,) = first.choices[0].message.tool_calls
            history.append({"role": "assistant", "tool_calls": [
                {"id": call.id, "type": "function", "function": {"name": "weather", "arguments": call.function.arguments}}]})
            history.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp_c": 21})})
            client.chat.completions.create(model="gpt-test", messages=history, tools=TOOLS)
        loopscope.flush()  # every span measured (most of them in one drain: the thread drains every half second)
    finally:
        loopscope.uninstrument()
        loopscope.shutdown()
    points = _points(reader)

    def total(name: str) -> int:
        return sum(p.value for p in points[name])

    assert total("gen_ai.client.inference.usage.input_tokens") == TURNS * (40 + 60)
    assert total("gen_ai.client.inference.usage.output_tokens") == TURNS * (8 + 6)
    assert total("gen_ai.client.inference.usage.cache_read.input_tokens") == TURNS * 10
    # counters no call added to are there with 0, as each call's add of 0 made them
    for name in ("gen_ai.client.inference.usage.cache_write.input_tokens", "gen_ai.client.inference.usage.reasoning.output_tokens"):
        assert [p.value for p in points[name]] == [0], name
    by_reason = {p.attributes["loopscope.turn.loop_end_reason"]: p.value for p in points["loopscope.turns"]}
    assert by_reason == {"completed": TURNS}
    (tool_calls,) = points["loopscope.tool.calls"]
    assert (tool_calls.value, dict(tool_calls.attributes)) == (TURNS, {"gen_ai.tool.name": "weather", "loopscope.tool.outcome": "served"})
    # the histograms: one value per call, per tool and per turn, as before
    assert sum(p.count for p in points["gen_ai.client.inference.duration"]) == 2 * TURNS
    assert sum(p.count for p in points["gen_ai.execute_tool.duration"]) == TURNS
    (calls_per_turn,) = points["gen_ai.invoke_agent.inference_calls"]
    assert (calls_per_turn.count, calls_per_turn.sum) == (TURNS, 2 * TURNS)
