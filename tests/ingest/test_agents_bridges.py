"""The OpenAI Agents SDK through its two OpenTelemetry bridges, into ``loopscope collect``,
compared with the same run recorded by loopscope in process.

One real ``agents.Runner`` run (``tests/fixtures/foreign/record_agents.py``: two tool
rounds, then the answer; the real openai SDK against the fake model server) runs three
times: under loopscope's own adapter (the project venv), and under each bridge installed
from PyPI in a pinned version in its own venv (a stack of tests/stacks.toml, which ``./scripts/test.sh`` builds),
its spans sent over real OTLP/HTTP on loopback to a running collector. The collected rows
must be loopscope's rows, but for what the bridge's spans do not carry (``MISSING``).
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

import stacks
from loopscope import semconv as a
from loopscope.ingest.agents_bridges import OI_BRIDGE, OTEL_BRIDGE, REDACTED, repair
from loopscope.ingest.foreign import AGENT, CONTAINER, classify, read_tool
from loopscope.ingest.otlp.collector import Collector
from loopscope.ingest.spans import Ctx, Scope, SpanRecord
from loopscope.storage.duckdb.connection import open_store

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "tests" / "fixtures" / "foreign" / "record_agents.py"
FRAMEWORKS = {"agents-otel": "opentelemetry-genai", "agents-oi": "openinference"}
SPAN_ID = re.compile(r"^[0-9a-f]{16}$")


def query(db: str, sql: str) -> list[tuple[Any, ...]]:
    with open_store(str(Path(db).resolve()), read_only=True) as con:
        return con.execute(sql).fetchall()


def record(lib: str, *args: str) -> None:
    # each bridge in its stack's venv (tests/stacks.toml); loopscope's own adapter in the openai-agents stack's
    python = str(stacks.require("openai-agents" if lib == "loopscope" else lib) / "bin" / "python")
    done = subprocess.run([python, "-W", "ignore", str(RECORD), "--lib", lib, *args], check=False, capture_output=True,
                          text=True, timeout=180, cwd=ROOT, env=_env())
    assert done.returncode == 0, done.stderr[-3000:]


def _env() -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "LOOPSCOPE_", "OPENINFERENCE_"))}
    env["PYTHONPATH"] = str(ROOT)
    return env


def stored(db: str) -> dict[str, Any]:
    """What a store holds of the one run, without ids and times that differ by nature."""
    events = []
    for kind, content in query(db, "SELECT type, content::VARCHAR FROM events ORDER BY session_id, idx"):
        c = json.loads(content)
        if kind == "message":
            events.append((kind, c["role"], c.get("body")))
        else:
            events.append((kind, c["tool_name"], c["tool_id"], c["arguments"], c["result"], c["status"], c["outcome"]))
    turns = query(db, "SELECT channel_id, response_content, segments::VARCHAR, tool_calls_count, round_count, input_tokens, "
                      "output_tokens, usage::VARCHAR, loop_end_reason, declared_tools::VARCHAR, model, provider, model_call_count "
                      "FROM turns")
    assert len(turns) == 1, turns  # one turn per run: no empty turn for the SDK's workflow
    (agent, response, segments, tools, rounds, tokens_in, tokens_out, usage, reason, declared, model, provider, calls) = turns[0]
    turn = {
        "agent": agent, "response": response, "segments": json.loads(segments), "tool_calls": tools, "rounds": rounds,
        "tokens": (tokens_in, tokens_out), "cache_read": json.loads(usage).get("cache_read_input_tokens") or None,
        "reason": reason, "declared": [t["name"] for t in json.loads(declared)], "model": model, "provider": provider,
        "model_calls": calls,
    }
    rows = query(db, "SELECT position, provider, agent, request_model, response_id, finish_reasons::VARCHAR, outcome, "
                     "input_tokens, output_tokens, cache_read_input_tokens, cost_usd > 0, output_messages::VARCHAR "
                     "FROM model_call_summaries ORDER BY started_at")
    model_calls = [
        {"position": r[0], "provider": r[1], "agent": r[2], "model": r[3], "response_id": r[4],
         "finish_reasons": json.loads(r[5]) if r[5] else None, "outcome": r[6], "tokens": (r[7], r[8]),
         "cache_read": r[9] or None, "priced": r[10], "output_messages": json.loads(r[11]) if r[11] else None}
        for r in rows
    ]
    frameworks = {f for (f,) in query(db, "SELECT DISTINCT source_framework FROM events")}
    user = [e for e in events if e[:2] == ("message", "user")]
    return {"events": events, "turn": turn, "model_calls": model_calls, "frameworks": frameworks, "user": user}


@pytest.fixture(scope="module")
def in_process(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    db = str(tmp_path_factory.mktemp("agents") / "in-process.duckdb")
    record("loopscope", "--store", db)
    return stored(db)


def collected(tmp_path: Path, lib: str, content: str, api: str = "responses") -> dict[str, Any]:
    db = str(tmp_path / f"{lib}-{content}.duckdb")
    with Collector(db, http_port=0, grpc_port=None, flush_interval=0.05) as collector:
        record(lib, "--content", content, "--api", api, "--endpoint", collector.http_endpoint)
    return stored(db)


# -- what each bridge's spans do not carry, so that no collector can store it ------------------


def expected(lib: str, content: str, ours: dict[str, Any]) -> dict[str, Any]:
    """loopscope's in-process rows, less what the bridge does not send."""
    want = copy.deepcopy(ours)
    events, turn, calls = want["events"], want["turn"], want["model_calls"]
    for call in calls:
        call.pop("output_messages")
    if content == "off":
        # no text, no arguments or results, so no call ids either (they travel with the content)
        events[:] = [(e[0], e[1], None, None, None, e[5], e[6]) for e in events if e[0] != "message"]
        turn.update(response="", segments=[])
        if lib == "agents-oi":
            turn["declared"] = []  # OpenInference hides the tool definitions with the inputs
            for call in calls:
                call["response_id"] = None  # and sends the response id inside the hidden output
    if lib == "agents-otel":
        # no cached tokens, no tool definitions; finish reasons only where the model asked for tools
        # (the Responses API has none: loopscope's adapter says "stop" for a completed response)
        turn.update(cache_read=None, declared=[])
        for call in calls:
            call["cache_read"] = None
            if call["finish_reasons"] == ["stop"]:
                call.update(finish_reasons=None, outcome=None)
        if content == "on":
            # a response with text keeps only its text: the call it made (and its id) is not sent
            events[:] = [(*e[:2], None, *e[3:]) if e[1] == "get_weather" and e[0] != "message" else e for e in events]
    return want


def check(lib: str, content: str, got: dict[str, Any], ours: dict[str, Any]) -> None:
    want = expected(lib, content, ours)
    assert got["frameworks"] == {FRAMEWORKS[lib]}
    # the message rows: with content off, none carries text (kept without it, or left out)
    messages = [e for e in got["events"] if e[0] == "message"]
    tools = [e for e in got["events"] if e[0] != "message"]
    if content == "off":
        assert all(not e[2] for e in messages), messages
    else:
        assert messages == [e for e in want["events"] if e[0] == "message"]
        assert got["user"] == ours["user"] != []  # the user's input
    # tool calls: ids the model gave where the spans carry them, else the span's id
    assert [(*e[:2], None if e[2] and SPAN_ID.match(e[2]) else e[2], *e[3:]) for e in tools] == [
        e for e in want["events"] if e[0] != "message"
    ]
    assert got["turn"] == want["turn"]
    outputs = [call.pop("output_messages") for call in got["model_calls"]]
    assert got["model_calls"] == want["model_calls"]
    # what each model call answered, in the GenAI schema, as loopscope's adapter stores it
    if content == "off":
        assert outputs == [None] * 3
    elif lib == "agents-oi":
        assert outputs == [c["output_messages"] for c in ours["model_calls"]]
    else:
        assert "ResponseFunctionToolCall(" not in json.dumps(outputs)  # reprs were parsed, not stored
        assert [[p["type"] for m in out for p in m["parts"]] for out in outputs] == [["text"], ["tool_call"], ["text"]]


@pytest.mark.parametrize("content", ["on", "off"])
def test_official_bridge_stores_what_loopscope_stores(tmp_path, in_process, content):
    """opentelemetry-instrumentation-openai-agents-v2: one turn (no extra empty turn for the
    SDK's workflow), the user's input, the tool calls with their arguments and results
    (the id the model gave where the spans carry it), two rounds, three model-call rows
    with tokens and response ids, the final answer (no ``ResponseFunctionToolCall(...)``
    repr as a segment)."""
    check("agents-otel", content, collected(tmp_path, "agents-otel", content), in_process)


def test_official_bridge_with_the_chat_completions_model_keeps_every_call_id(tmp_path, in_process):
    """With the SDK's Chat Completions model the official bridge loses the calls from the
    response too (it keeps a message's text), but the next request's input repeats them,
    with their ids: every tool call has the id the model gave."""
    got = collected(tmp_path, "agents-otel", "on", api="chat")
    assert got["events"] == in_process["events"]
    assert got["user"] == in_process["user"]
    turn = got["turn"]
    assert (turn["tool_calls"], turn["rounds"], turn["model_calls"], turn["segments"]) == (2, 2, 3, in_process["turn"]["segments"])
    assert [c["finish_reasons"] for c in got["model_calls"]] == [["tool_calls"], ["tool_calls"], None]


@pytest.mark.parametrize("content", ["on", "off"])
def test_openinference_bridge_stores_what_loopscope_stores(tmp_path, in_process, content):
    """openinference-instrumentation-openai-agents: one turn (no empty "Agent workflow" turn),
    the user's input, the tool calls with the model's call ids, arguments and results, two
    rounds, three model-call rows with tokens (cached ones too) and response ids, the final
    answer; with content hidden nothing is stored as ``__REDACTED__``."""
    check("agents-oi", content, collected(tmp_path, "agents-oi", content), in_process)


# -- the repairs, one span at a time -----------------------------------------------------------


def bridge_span(scope: str, attributes: dict[str, Any], parent: int | None = None) -> SpanRecord:
    return SpanRecord("s", Ctx(5, 9), Ctx(5, parent) if parent else None, 1, 2, attributes, instrumentation_scope=Scope(scope))


def output_parts(record: SpanRecord) -> list[dict[str, Any]]:
    return [p for m in json.loads(record.attributes[a.OUTPUT_MESSAGES]) for p in m["parts"]]


def text_part(text: str) -> dict[str, Any]:
    return {a.OPERATION: "chat", a.OUTPUT_MESSAGES: json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": text}]}])}


def test_the_official_bridges_reprs_are_parsed_never_evaluated(tmp_path):
    call = ("ResponseFunctionToolCall(arguments='{\"city\": \"Paris\"}', call_id='call_1', name='get_weather', "
            "type='function_call', id='fc_1', status='completed')")
    assert output_parts(repair(bridge_span(OTEL_BRIDGE, text_part(call)))) == [
        {"type": "tool_call", "id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}]
    message = ("ResponseOutputMessage(id='m', content=[ResponseOutputText(annotations=[], text='Hi.', type='output_text')], "
               "role='assistant', status='completed', type='message')")
    assert output_parts(repair(bridge_span(OTEL_BRIDGE, text_part(message)))) == [{"type": "text", "content": "Hi."}]
    reasoning = "ResponseReasoningItem(id='rs_1', summary=[], type='reasoning')"
    assert output_parts(repair(bridge_span(OTEL_BRIDGE, text_part(reasoning)))) == []
    chat = ("{'content': None, 'refusal': None, 'role': 'assistant', 'tool_calls': [{'id': 'call_2', "
            "'function': {'arguments': '{}', 'name': 'local_time'}, 'type': 'function'}]}")
    assert output_parts(repair(bridge_span(OTEL_BRIDGE, text_part(chat)))) == [
        {"type": "tool_call", "id": "call_2", "name": "local_time", "arguments": "{}"}]
    # text that only looks like a repr or a dict is the model's text, kept as it is
    for text in ("Response times are fine (mostly).", "{'city': 'Paris', 'temp_c': 21}", "ResponseFunctionToolCall(", "plain"):
        record = bridge_span(OTEL_BRIDGE, text_part(text))
        assert repair(record) is record
    # nothing in a repr runs: a call where a literal should be is no tool call
    marker = tmp_path / "ran"
    evil = f"ResponseFunctionToolCall(name=open({str(marker)!r}, 'w').write('x'), call_id='c')"
    assert output_parts(repair(bridge_span(OTEL_BRIDGE, text_part(evil)))) == []
    assert not marker.exists()
    # another instrumentation's span with the same text is left alone
    other = bridge_span("opentelemetry.instrumentation.genai.openai", text_part(call))
    assert repair(other) is other


def test_the_sdks_workflow_root_is_no_agent_run():
    workflow = repair(bridge_span(OTEL_BRIDGE, {a.OPERATION: "invoke_agent", a.PROVIDER: "openai"}))
    assert classify(workflow)[0] == CONTAINER
    run = bridge_span(OTEL_BRIDGE, {a.OPERATION: "invoke_agent", a.AGENT_NAME: "concierge"}, parent=3)
    assert repair(run) is run and classify(run)[0] == AGENT
    root = repair(bridge_span(OI_BRIDGE, {"openinference.span.kind": "AGENT"}))
    assert classify(root)[0] == CONTAINER
    agent = bridge_span(OI_BRIDGE, {"openinference.span.kind": "AGENT", "agent.name": "concierge"}, parent=3)
    assert repair(agent) is agent and classify(agent)[0] == AGENT


def test_openinference_hidden_values_are_missing_not_stored_as_the_marker():
    tool = repair(bridge_span(OI_BRIDGE, {"openinference.span.kind": "TOOL", "tool.name": "get_weather",
                                         "input.value": REDACTED, "output.value": REDACTED}))
    assert tool.attributes == {"openinference.span.kind": "TOOL", "tool.name": "get_weather"}
    assert (read_tool(tool).arguments, read_tool(tool).result) == (None, None)
