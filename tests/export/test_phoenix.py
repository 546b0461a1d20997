"""What a real tracing backend sees of loopscope's spans: Arize Phoenix (``phoenix serve``
from PyPI, pinned in tests/stacks.toml, in its stack's venv) on
loopback, in a temporary working folder, with its telemetry and external resources off.

A loopscope-instrumented loop (the real openai SDK against the fake model server, a
two-round tool loop) and a hand-API turn with a tool call, exported over OTLP with content
on, must give exactly one LLM span per model call, one TOOL span per tool call and one
AGENT span per turn (start notices are log records, which Phoenix refuses and does not
count), each with its input and output in Phoenix's message view. The spans follow the
current GenAI conventions (the default): Phoenix still shows every message, and keeps the
current names (the agent's finish reason and turn count, no provider on the agent span); the
model calls it shows as LLM spans went as CLIENT spans (Phoenix keeps no OpenTelemetry span
kind of its own: the same spans, read in memory beside the exporter, say it).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import loopscope
import stacks
from fakes.model_server import Reply, ToolCall, Usage

ROOT = Path(__file__).resolve().parents[2]
STARTUP_SECONDS = 300  # Phoenix migrates its SQLite file and builds its app on start: ~15-60 s


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    command = str(stacks.require("phoenix") / "bin" / "phoenix")  # its stack (tests/stacks.toml)
    work = tmp_path_factory.mktemp("phoenix")
    http_port, grpc_port = _free_port(), _free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PHOENIX_", "LOOPSCOPE_"))},
        "PHOENIX_WORKING_DIR": str(work),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(http_port),
        "PHOENIX_GRPC_PORT": str(grpc_port),
        "PHOENIX_TELEMETRY_ENABLED": "false",  # no usage reports to the internet
        "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",  # no fonts or scripts fetched for the page
    }
    with open(work / "phoenix.log", "wb") as log:
        process = subprocess.Popen([command, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=work)
    base = f"http://127.0.0.1:{http_port}"
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            assert process.poll() is None, f"phoenix serve ended:\n{(work / 'phoenix.log').read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(base + "/healthz", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"phoenix serve did not answer in {STARTUP_SECONDS}s"
            time.sleep(0.5)
        yield {"http": base, "grpc": f"http://127.0.0.1:{grpc_port}"}
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def _spans(phoenix: dict[str, str], project: str) -> list[dict[str, Any]]:
    try:
        return list(_get(f"{phoenix['http']}/v1/projects/{project}/spans?limit=1000")["data"])
    except urllib.error.HTTPError as exc:
        if exc.code == 404:  # the project exists once its first span is in
            return []
        raise


def _messages(attributes: dict[str, Any], which: str) -> dict[int, dict[str, Any]]:
    """Phoenix's message view of a span: ``llm.<which>_messages.N.message.*`` by N."""
    prefix = f"llm.{which}_messages."
    out: dict[int, dict[str, Any]] = {}
    for key, value in attributes.items():
        if key.startswith(prefix):
            index, _, field = key[len(prefix):].partition(".message.")
            out.setdefault(int(index), {})[field] = value
    return out


@pytest.mark.parametrize("protocol", ["http/protobuf", "grpc"])
def test_phoenix_counts_one_span_per_call_tool_and_turn_and_shows_their_content(phoenix, tmp_path, model_server, protocol, caplog):
    project = f"loopscope-{protocol.replace('/', '-')}"
    provider = TracerProvider(resource=Resource.create({"service.name": "phoenix-test", "openinference.project.name": project}))
    sent = InMemorySpanExporter()  # what went to Phoenix, kinds included
    provider.add_span_processor(SimpleSpanProcessor(sent))
    pipeline = loopscope.configure(
        tmp_path / "local.duckdb", tracer_provider=provider, otlp_endpoint=phoenix["http" if protocol == "http/protobuf" else "grpc"],
        otlp_protocol=protocol, capture_content=True, flush_interval=0.05,
    )
    loopscope.instrument(anthropic=False)
    model_server.queue(
        Reply(tool_calls=[ToolCall("get_weather", {"city": "Lyon"})], usage=Usage(50, 10)),
        Reply(text="Sunny, 21 C.", usage=Usage(80, 6)),
    )
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }}]

    @loopscope.tool
    def get_weather(city: str) -> dict[str, str]:
        return {"city": city, "sky": "sunny"}

    @loopscope.tool
    def add(x: int, y: int) -> int:
        return x + y

    try:
        client = model_server.openai_client()
        history: list[Any] = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Weather in Lyon?"}]
        first = client.chat.completions.create(model="gpt-test", messages=history, tools=tools)
        call = first.choices[0].message.tool_calls[0]
        history.append(first.choices[0].message.model_dump(exclude_none=True))
        history.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(get_weather(**json.loads(call.function.arguments)))})
        client.chat.completions.create(model="gpt-test", messages=history, tools=tools)

        with loopscope.turn(session_id="hand", agent="calculator", input="What is 1 + 2?") as t:  # the hand API
            t.generation("", tool_calls=[{"id": "add-1", "name": "add", "arguments": {"x": 1, "y": 2}}])
            assert pipeline.exporter is not None
            pipeline.exporter.force_flush()  # a batch leaves while the turn runs: its start notice is sent (and refused)
            add(1, 2)
            t.generation("3")  # no finish reason given
        assert pipeline.exporter is not None
        notices = pipeline.exporter.notices
    finally:
        loopscope.uninstrument()
        loopscope.shutdown()
    assert pipeline.dropped() == {"store": 0, "otlp": 0}  # every span went

    deadline = time.monotonic() + 60
    spans = _spans(phoenix, project)
    while len(spans) < 8 and time.monotonic() < deadline:
        time.sleep(0.5)
        spans = _spans(phoenix, project)
    time.sleep(1.0)
    spans = _spans(phoenix, project)
    kinds = sorted((s["span_kind"], s["name"]) for s in spans)
    assert kinds == [
        ("AGENT", "invoke_agent"), ("AGENT", "invoke_agent calculator"),
        ("LLM", "chat"), ("LLM", "chat"), ("LLM", "chat gpt-test"), ("LLM", "chat gpt-test"),
        ("TOOL", "execute_tool add"), ("TOOL", "execute_tool get_weather"),
    ]  # 4 model calls, 2 tool calls, 2 turns: nothing else (no start notice became a span)

    # Phoenix has no logs receiver: the notices were refused once, quietly, and stopped
    assert notices is not None and not notices.enabled and notices.refused >= 1 and notices.sent == 0
    # and nothing else was said but, at most once, that Phoenix takes no metrics (HTTP 405)
    warnings = [r.getMessage() for r in caplog.records if r.name.startswith("loopscope") and r.levelno >= logging.WARNING]
    assert len(warnings) <= 1 and all("refused metrics" in w for w in warnings), warnings

    for span in spans:
        attributes = span["attributes"]
        inputs, outputs = _messages(attributes, "input"), _messages(attributes, "output")
        if span["span_kind"] == "TOOL":
            assert attributes.get("tool.parameters.city") == "Lyon" or attributes.get("tool.parameters.x") == 1, span["name"]
            assert attributes.get("output.value") in ('{"city": "Lyon", "sky": "sunny"}', "3"), span["name"]
            continue
        # every model call and every turn: what it was given and what it answered, with why it stopped
        assert inputs, f"{span['name']}: no input messages in Phoenix"
        assert outputs and all(m.get("finish_reason") for m in outputs.values()), f"{span['name']}: {outputs}"
    by_name = {(s["span_kind"], s["name"]): s["attributes"] for s in spans}
    agent = by_name[("AGENT", "invoke_agent")]
    assert [m.get("role") for m in _messages(agent, "input").values()] == ["system", "user"]
    assert _messages(agent, "output")[0]["content"] == "Sunny, 21 C."
    hand = by_name[("AGENT", "invoke_agent calculator")]
    assert _messages(hand, "input")[0] == {"role": "user", "content": "What is 1 + 2?"}
    assert _messages(hand, "output")[0] == {"role": "assistant", "content": "3", "finish_reason": "stop"}
    # the current conventions' names, as Phoenix keeps them beside its own
    for key, span in by_name.items():
        attributes = span
        if key[0] == "AGENT":
            assert attributes["gen_ai.agent.finish_reason"] == "completed", key
            assert attributes["gen_ai.agent.turn.count"] == 2, key
            assert "gen_ai.provider.name" not in attributes, key  # not on the agent span any more
        elif key[0] == "LLM" and key[1] == "chat gpt-test":
            assert attributes["gen_ai.provider.name"] == "openai", key
            assert [t["type"] for t in json.loads(attributes["gen_ai.tool.definitions"])] == ["function"], key
            # Phoenix read the tool definitions (as OpenInference's llm.tools.N.tool.json_schema)
            assert any(k.startswith("llm.tools.") for k in attributes), key
    assert by_name[("AGENT", "invoke_agent")]["loopscope.turn.provider"] == "openai"
    # every model call Phoenix shows as an LLM span went as a CLIENT span, the rest as INTERNAL
    kind_of = {f"{s.context.span_id:016x}": s.kind for s in sent.get_finished_spans()}
    for span in spans:
        expected = SpanKind.CLIENT if span["span_kind"] == "LLM" else SpanKind.INTERNAL
        assert kind_of[span["context"]["span_id"]] is expected, span["name"]
    asked, answered = sorted((s for s in spans if s["name"] == "chat"), key=lambda s: s["start_time"])
    assert _messages(asked["attributes"], "output")[0]["finish_reason"] == "tool_call"  # said by the round
    assert _messages(answered["attributes"], "output")[0]["finish_reason"] == "stop"
    # the hand round after the tool: the input, the call asked for, its result
    assert [m.get("role") for m in _messages(answered["attributes"], "input").values()] == ["user", "assistant", "tool"]
