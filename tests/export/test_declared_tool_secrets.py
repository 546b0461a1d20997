"""Secrets in declared tools (a tool's description, a parameter's default) and secrets
one after another in JSON text: masked in the store, over OTLP and through ``loopscope
collect``, while the tools keep their names and their schema.

The tools are declared through the real openai and anthropic SDKs, talking to the fake
model server; the OTLP payload is what the receiver on loopback decoded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider

import loopscope
import recorded
from exporting import batch_leaves
from fakes import otlp_receiver
from fakes.model_server import FakeModelServer, Reply, ToolCall
from loopscope import semconv as a
from loopscope.content.policy import ContentPolicy
from loopscope.ingest.otlp.collector import Collector
from loopscope.storage.duckdb.connection import open_store
from loopscope.storage.scrub import prefilter

KEY = "sk-proj-DescriptionKey0123456789abcd"
SIG = "c2lnbmVkU0lHc2VjcmV0MTIz"
DEFAULT_PASSWORD = "Tr0ub4dour-default-pw"
DOC_KEY = "sk-ant-DocstringKey0123456789abcdef"
SECRETS = (KEY, SIG, DEFAULT_PASSWORD, DOC_KEY)

SCHEMA = {
    "type": "object",
    "properties": {
        "url": {"type": "string", "description": "the file", "default": f"https://acct.blob.core.windows.net/c/b.txt?sv=2022-11-02&sig={SIG}"},
        # a parameter named like a secret: its schema stays, the value it gives goes
        "password": {"type": "string", "description": "the share's password", "default": DEFAULT_PASSWORD},
    },
    "required": ["url"],
}
DESCRIPTION = f"Downloads a shared file (authenticates with {KEY})."
MASKED_SCHEMA = {
    "type": "object",
    "properties": {
        "url": {"type": "string", "description": "the file", "default": "https://acct.blob.core.windows.net/c/b.txt?sv=2022-11-02&sig=[REDACTED]"},
        "password": {"type": "string", "description": "the share's password", "default": "[REDACTED]"},
    },
    "required": ["url"],
}
MASKED_DESCRIPTION = "Downloads a shared file (authenticates with [REDACTED])."

TOOLS = {
    "openai": [{"type": "function", "function": {"name": "download", "description": DESCRIPTION, "parameters": SCHEMA}}],
    "anthropic": [{"name": "download", "description": DESCRIPTION, "input_schema": SCHEMA}],
}


def run_agent(server: FakeModelServer, sdk: str) -> None:
    """One tool loop through the SDK: the model calls ``download``, the tool (whose
    docstring holds a key) runs, the model answers."""

    @loopscope.tool
    def download(url: str) -> str:
        """Downloads with sk-ant-DocstringKey0123456789abcdef."""  # the model's call: no description recorded
        return "3 bytes"

    server.queue(Reply(tool_calls=[ToolCall("download", {"url": "https://x.test/f"}, id="call_dl")]), Reply(text="Got it."))
    messages: list[dict[str, Any]] = [{"role": "user", "content": "download the file"}]
    if sdk == "openai":
        client = server.openai_client()
        first = client.chat.completions.create(model="gpt-4o", messages=messages, tools=TOOLS["openai"])
        call = first.choices[0].message.tool_calls[0]
        result = download(**json.loads(call.function.arguments))
        messages += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": result}]
        client.chat.completions.create(model="gpt-4o", messages=messages, tools=TOOLS["openai"])
    else:
        client = server.anthropic_client()
        first = client.messages.create(model="claude-sonnet-4-5", max_tokens=100, messages=messages, tools=TOOLS["anthropic"])
        use = next(b for b in first.content if b.type == "tool_use")
        result = download(**use.input)
        messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": result}]}]
        client.messages.create(model="claude-sonnet-4-5", max_tokens=100, messages=messages, tools=TOOLS["anthropic"])


def store_bytes(db: Path) -> bytes:
    return recorded.store_bytes(db)


def declared_rows(db: Path) -> list[tuple[list[dict[str, Any]], list[str]]]:
    """Per turn: the stored declared tools, and the names the turn_summaries view gives."""
    with open_store(str(db.resolve()), read_only=True) as con:
        rows = con.execute("SELECT t.declared_tools::VARCHAR, s.declared_tools FROM turns t "
                           "JOIN turn_summaries s ON s.turn_id = t.correlation_id").fetchall()
    return [(json.loads(tools), names) for tools, names in rows]


def check_tools(tools: list[dict[str, Any]]) -> None:
    assert [t["name"] for t in tools] == ["download"]
    assert tools[0]["description"] == MASKED_DESCRIPTION
    assert tools[0]["parameters"] == MASKED_SCHEMA


@pytest.fixture
def receiver():
    rec, server = otlp_receiver.start()
    yield rec
    server.shutdown()


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_declared_tools_lose_their_secrets_in_the_store_and_over_otlp(tmp_path, receiver, model_server, sdk):
    db = tmp_path / "s.duckdb"
    # content capture off (the default): the tool definitions are still sent, masked
    loopscope.configure(db, tracer_provider=TracerProvider(), otlp_endpoint=receiver.endpoint, flush_interval=0.05)
    loopscope.instrument()
    try:
        run_agent(model_server, sdk)
    finally:
        loopscope.uninstrument()
        loopscope.shutdown()

    data = store_bytes(db)
    assert not [s for s in SECRETS if s.encode() in data]
    [(tools, names)] = declared_rows(db)
    check_tools(tools)
    assert names == ["download"]

    assert receiver.wait_for(lambda r: any(s.name.startswith("invoke_agent") for s in r.spans))
    payload = json.dumps([s.attributes for s in receiver.spans + receiver.pending + receiver.notices])
    assert not [s for s in SECRETS if s in payload]
    definitions = [s.attributes[a.TOOL_DEFINITIONS] for s in receiver.spans if a.TOOL_DEFINITIONS in s.attributes]
    assert len(definitions) >= 3  # both chat spans and the turn's
    for text in definitions:
        [tool] = json.loads(text)
        assert tool["description"] == MASKED_DESCRIPTION and tool["parameters"] == MASKED_SCHEMA
    [turn] = [s for s in receiver.spans if s.name.startswith("invoke_agent")]
    check_tools(json.loads(turn.attributes[a.DECLARED_TOOLS]))


def test_a_tools_description_loses_its_secret_over_otlp(tmp_path, receiver):
    """``gen_ai.tool.description`` (a decorated tool's docstring) on an ``execute_tool``
    span of a tool run no model asked for."""
    loopscope.configure(tmp_path / "s.duckdb", tracer_provider=TracerProvider(), otlp_endpoint=receiver.endpoint,
                        flush_interval=0.05)

    @loopscope.tool
    def notify(channel: str) -> str:
        """Posts with xoxb-17653672481-19874698323-pdFZKVeTuE8sk7oOcBrzbqgy to a channel."""
        batch_leaves()  # while it runs: its start notice carries the description too
        return "sent"

    with loopscope.turn(session_id="d", agent="ops", input="notify ops") as t:
        notify("ops")
        t.generation("Sent.", finish_reason="stop")
    loopscope.shutdown()
    assert receiver.wait_for(lambda r: any(s.name == "execute_tool notify" for s in r.spans)
                             and any(s.name == "execute_tool notify" for s in r.notices))
    descriptions = [s.attributes.get(a.TOOL_DESCRIPTION) for s in receiver.spans + receiver.notices if s.name == "execute_tool notify"]
    assert descriptions == ["Posts with [REDACTED] to a channel."] * 2  # the span and its start notice


def test_a_foreign_spans_tool_definitions_lose_their_secrets_in_a_collector(tmp_path):
    """Another instrumentation (the OpenTelemetry SDK's own exporter, no content policy)
    sends an agent run whose model call offered tools: the collector's turn row and its
    raw ``spans`` table keep the tools, not their secrets."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    definitions = json.dumps([{"type": "function", "name": "download", "description": DESCRIPTION, "parameters": SCHEMA}])
    with Collector(str(tmp_path / "collected.duckdb"), http_port=0, grpc_port=None, flush_interval=0.05) as collector:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=collector.http_endpoint + "/v1/traces")))
        tracer = provider.get_tracer("opentelemetry.instrumentation.genai.openai")
        agent = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "fetcher"}
        chat = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "gpt-4o",
                "gen_ai.response.finish_reasons": ["stop"], "gen_ai.tool.definitions": definitions}
        with tracer.start_as_current_span("invoke_agent fetcher", attributes=agent), \
                tracer.start_as_current_span("chat gpt-4o", attributes=chat):
            pass
        provider.shutdown()
    collected = Path(collector.db)
    assert not [s for s in SECRETS if s.encode() in store_bytes(collected)]
    [(tools, names)] = declared_rows(collected)
    assert [t["name"] for t in tools] == ["download"] and names == ["download"]
    assert tools[0]["description"] == MASKED_DESCRIPTION and tools[0]["parameters"] == MASKED_SCHEMA
    with open_store(str(collected), read_only=True) as con:
        raw = [json.loads(r[0]) for r in con.execute("SELECT attributes::VARCHAR FROM spans WHERE name = 'chat gpt-4o'").fetchall()]
    [tool] = json.loads(raw[0]["gen_ai.tool.definitions"])  # the raw copy: still the tools, as JSON
    assert tool["description"] == MASKED_DESCRIPTION and tool["parameters"] == MASKED_SCHEMA


# -- secrets one after another in JSON text ------------------------------------------------------

CONFIG = "api_key: AAAA1111\npassword: HUNTER2SECRET"
HEADERS = "X-Api-Key: K1SECRET\nX-Amz-Security-Token: FwoGZXIvYXdzTOK2SECRET"
MASKED = {CONFIG: "api_key: [REDACTED]\npassword: [REDACTED]",
          HEADERS: "X-Api-Key: [REDACTED]\nX-Amz-Security-Token: [REDACTED]"}


@pytest.mark.parametrize("text", [CONFIG, HEADERS], ids=["config", "headers"])
def test_each_secret_of_a_multi_line_value_is_masked_in_json_as_in_plain_text(text):
    policy = ContentPolicy()
    assert policy.mask(text) == MASKED[text]  # plain text
    assert json.loads(policy.scrub_json(json.dumps({"r": text}))) == {"r": MASKED[text]}  # in JSON
    twice = json.loads(json.loads(policy.scrub_json(json.dumps(json.dumps({"r": text})))))  # JSON in a JSON string
    assert twice == {"r": MASKED[text]}


def test_multi_line_secrets_in_a_tool_result_are_all_masked_in_the_store_and_over_otlp(tmp_path, receiver, model_server):
    db = tmp_path / "s.duckdb"
    loopscope.configure(db, tracer_provider=TracerProvider(), otlp_endpoint=receiver.endpoint, capture_content=True,
                        flush_interval=0.05)

    @loopscope.tool
    def read_config(name: str) -> dict[str, str]:
        return {"config": CONFIG, "headers": HEADERS}

    loopscope.instrument()
    try:
        model_server.queue(Reply(tool_calls=[ToolCall("read_config", {"name": "prod"}, id="call_cfg")]), Reply(text="Read."))
        client = model_server.openai_client()
        messages: list[dict[str, Any]] = [{"role": "user", "content": "read the config"}]
        first = client.chat.completions.create(model="gpt-4o", messages=messages)
        call = first.choices[0].message.tool_calls[0]
        result = read_config(**json.loads(call.function.arguments))
        messages += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)}]
        client.chat.completions.create(model="gpt-4o", messages=messages)
    finally:
        loopscope.uninstrument()
        loopscope.shutdown()
    leaked = ("AAAA1111", "HUNTER2SECRET", "K1SECRET", "FwoGZXIvYXdzTOK2SECRET")
    assert not [s for s in leaked if s.encode() in store_bytes(db)]
    with open_store(str(db.resolve()), read_only=True) as con:
        [content] = con.execute("SELECT content::VARCHAR FROM events WHERE type = 'tool_call_end'").fetchone()
    assert json.loads(content)["result"] == {"config": MASKED[CONFIG], "headers": MASKED[HEADERS]}
    assert receiver.wait_for(lambda r: any(s.name == "execute_tool read_config" for s in r.spans))
    payload = json.dumps([s.attributes for s in receiver.spans + receiver.notices])
    assert not [s for s in leaked if s in payload]
    [span] = [s for s in receiver.spans if s.name == "execute_tool read_config"]
    assert json.loads(span.attributes[a.TOOL_CALL_RESULT]) == {"config": MASKED[CONFIG], "headers": MASKED[HEADERS]}


_FRAGMENTS = ("password", "api_key", "token", "secret", "key", "sig", "=", ":", " ", "\n", '"', "\\", "?", "&", "{", "}",
              "sk-proj-", "0123456789abcdefgh", "AKIA", "IOSFODNN7EXAMPLE", "Bearer ", "://u:p@", "default", "[REDACTED]")
_texts = st.lists(st.sampled_from(_FRAGMENTS), max_size=10).map("".join)


@settings(max_examples=300, deadline=None)
@given(_texts, _texts, _texts)
def test_the_stores_prefilter_picks_every_declared_tool_list_the_policy_would_change(description, name, default):
    """The store looks at a turn's declared tools only where the RE2 prefilter picks them:
    whatever :meth:`ContentPolicy.mask_tools` changes, it picks."""
    policy = ContentPolicy()
    tools = json.dumps([{"name": "t", "description": description, "parameters": {
        "type": "object", "properties": {name: {"type": "string", "default": default}}}}])
    if policy.mask_tools(tools) != tools:
        assert pc.match_substring_regex(pa.array([tools]), pattern=prefilter(policy))[0].as_py(), tools
