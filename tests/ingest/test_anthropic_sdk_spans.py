"""The anthropic SDK's own tracing (2.x: an ``anthropic.messages.create`` CLIENT span per call
whenever a tracer provider exists) sent to ``loopscope collect``: a bare tool loop is stitched
like any other instrumentation's, one turn per user question, with its model calls' stop
reasons, outcomes and, with the SDK's content mode on, the tool results as text.

The real anthropic SDK (the core venv's) talks to the fake model server and exports real
OTLP/HTTP, through the OpenTelemetry SDK's exporter, to a ``loopscope collect`` child."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from children import Collect, collect_child
from fakes.model_server import Reply, ToolCall, Usage
from loopscope.ingest.foreign import ANTHROPIC_SDK_SPAN
from loopscope.storage.duckdb.connection import open_store

ROOT = Path(__file__).resolve().parents[2]
TOOLS = [{"name": "weather", "description": "The weather in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]


def query(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with open_store(str(db), read_only=True) as con:
        return con.execute(sql).fetchall()


@pytest.fixture
def collect(tmp_path) -> Iterator[tuple[Path, Collect]]:
    """A ``loopscope collect`` child (HTTP only, on a free port): (its store, the child)."""
    db = tmp_path / "anthropic.duckdb"
    with collect_child(db, "--no-grpc", "--idle", "3600") as child:
        yield db, child


def two_turn_loop(client: Any, server: Any) -> None:
    """Two user questions, each a tool call and its answer: four model calls."""
    for turn in range(2):
        server.queue(Reply(text="Let me look.", tool_calls=[ToolCall("weather", {"city": "Lyon"})], usage=Usage(40, 8)),
                     Reply(text=f"Lyon: 21 °C ({turn}).", usage=Usage(60, 6)))
        messages: list[Any] = [{"role": "user", "content": f"Weather in Lyon? ({turn})"}]
        first = client.messages.create(model="claude-test", max_tokens=100, messages=messages, tools=TOOLS)
        call = next(block for block in first.content if block.type == "tool_use")
        messages += [
            {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": json.dumps({"temp_c": 21})}]},
        ]
        client.messages.create(model="claude-test", max_tokens=100, messages=messages, tools=TOOLS)


@pytest.mark.parametrize("content", [False, True], ids=["metadata", "content"])
def test_the_sdks_own_spans_alone_are_stitched_into_one_turn_per_question(collect, model_server, content):
    db, child = collect
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=child.http + "/v1/traces")))
    traces: dict[str, Any] = {"content_mode": "content"} if content else {}
    client = model_server.anthropic_client(open_telemetry={"tracer_provider": provider, "traces": traces})
    two_turn_loop(client, model_server)
    provider.shutdown()
    child.stop_ok()

    assert query(db, "SELECT count(*) FROM spans WHERE name = 'anthropic.messages.create'") == [(4,)]
    # two turns of two model calls, the tokens counted once
    assert query(db, "SELECT count(*), sum(model_call_count), sum(input_tokens), sum(output_tokens) FROM turns") == [(2, 4, 200, 28)]
    calls = query(db, "SELECT finish_reasons::VARCHAR, outcome, input_tokens, response_id FROM model_calls ORDER BY started_at")
    assert [(reasons, outcome, tokens) for reasons, outcome, tokens, _ in calls] == [
        ('["tool_use"]', "completed", 40), ('["end_turn"]', "completed", 60),
    ] * 2
    assert all(response_id and response_id.startswith("msg_") for *_, response_id in calls)
    if content:
        # the user's question opens each turn; the tool's result is its text, not a list of content blocks
        asked = query(db, "SELECT content->>'body' FROM events WHERE type = 'message' AND content->>'role' = 'user' ORDER BY created_at")
        assert asked == [("Weather in Lyon? (0)",), ("Weather in Lyon? (1)",)]
        results = query(db, "SELECT content->>'result' FROM events WHERE type = 'tool_call_end' ORDER BY created_at")
        assert [json.loads(r) for (r,) in results] == [{"temp_c": 21}] * 2


# -- beside another instrumentation ----------------------------------------------------------------

FAMILIES = ("otel-genai", "openllmetry", "openinference")


@pytest.mark.parametrize("agent", [False, True], ids=["bare", "agent"])
@pytest.mark.parametrize("lib", FAMILIES)
def test_beside_another_instrumentation_each_call_is_counted_once(collect, lib, agent):
    """The SDK's span and the instrumentation's describe one call (its child under the
    official GenAI and OpenInference instrumentations, a root beside OpenLLMetry's): one
    model-call row per call, the richer span's (the instrumentation's), the tokens once."""
    import stacks

    python = stacks.require("peers-anthropic") / "bin" / "python"
    db, child = collect
    done = subprocess.run(
        [str(python), "-W", "ignore", str(ROOT / "tests" / "fixtures" / "foreign" / "record_anthropic.py"), "--lib", lib,
         *(["--agent"] if agent else []), "--endpoint", child.http],
        check=False, capture_output=True, text=True, timeout=180, cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    child.stop_ok()
    # both spans of each call arrived, and are kept as they came
    assert query(db, "SELECT count(*) FROM spans WHERE name = 'anthropic.messages.create'") == [(4,)]
    assert query(db, "SELECT count(*) FROM spans WHERE role = 'chat' AND name <> 'anthropic.messages.create'") == [(4,)]
    assert query(db, "SELECT count(*), sum(model_call_count), sum(input_tokens), sum(output_tokens) FROM turns") == [(2, 4, 200, 28)]
    assert query(db, "SELECT count(*), sum(input_tokens) FROM model_calls") == [(4, 200)]
    # each row the instrumentation's span's, not the SDK's
    kept = query(db, "SELECT s.name FROM model_calls m JOIN spans s ON s.trace_id = m.trace_id AND s.span_id = m.span_id")
    assert len(kept) == 4 and ANTHROPIC_SDK_SPAN not in {name for (name,) in kept}, kept
