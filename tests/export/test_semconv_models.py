"""loopscope's exported spans and metrics checked against the GenAI conventions' own definitions:
the YAML models (attribute names, span kinds, requirement levels, metric names, instruments and
units) and the JSON schemas of gen_ai.input.messages / gen_ai.output.messages /
gen_ai.system_instructions / gen_ai.tool.definitions, as open-telemetry/semantic-conventions-genai
has them at pinned commits (:data:`MODELS`), not copied by hand into the test.

The files are not in this repository (no third-party files are committed here): they are read from
``LOOPSCOPE_SEMCONV_MODELS``, else from ``shared/semconv_genai`` beside the checkout, each checked
against its git blob id upstream before use (``git ls-tree <commit> <path>`` in the repository
shows the same id). Without them the tests here are skipped, saying where to put which files.

A tool loop through the real openai SDK against the fake model server (tests/export/test_conventions.py's
record_loop), recorded with the current conventions (the default) and with LOOPSCOPE_SEMCONV=v1.37.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from opentelemetry.sdk.metrics.export import Histogram, Sum
from opentelemetry.trace import SpanKind

from export.test_conventions import Recorded, record_loop
from loopscope import semconv as a

UPSTREAM = "https://github.com/open-telemetry/semantic-conventions-genai"
PIN = "fe5608e249d64bc5961329a82f8915fe95ced51a"
"""main on 2026-08-03 ("reference: add missing create_agent coverage (#424)"): the spans, the
attribute registry, the JSON schemas and the older metrics."""
NEWER_PIN = "066d4a7f356f8600de6f10c42874626ab88692fb"
"""main after #536: the metric models after #374 (the token counters) and #521
(``gen_ai.client.inference.*``), the metrics loopscope emits by default."""
MODELS = {
    f"fe5608e/model/gen-ai/{name}": (PIN, blob) for name, blob in (
        ("registry.yaml", "b482592e90fdf93aab4237dc5dc5ebd5d49e40d0"),
        ("spans.yaml", "b9f968ce6a120bc72e4c99343f8b5f09d20db9f5"),
        ("metrics.yaml", "c8a1aa8211a216e825c8670df3f1dc095a01a11e"),
        ("gen-ai-input-messages.json", "d3e6dcad70457e105a185a2ac89ff75d6a3b5122"),
        ("gen-ai-output-messages.json", "98ca775d0aeaec9302ef6e6d953eeef96798c82c"),
        ("gen-ai-system-instructions.json", "0a75ac9ca9643c6b85968341ca38e875ef324bcf"),
        ("gen-ai-tool-definitions.json", "0cb5bcf8eeba0c5d84b1885bbb4a033375076844"),
    )
} | {
    f"066d4a7/model/gen-ai/{name}": (NEWER_PIN, blob) for name, blob in (
        ("metrics.yaml", "0a34618c0d2cb3eaa40ef45b791806fc10583cb8"),
        ("token-metrics.yaml", "915688d2d387121a8c275e2e52b4a616ba8210bd"),
    )
}
"""Each file (under the models' folder: the commit's first 7 digits, then its path upstream) -> the
commit and its git blob id there."""


def models_folder() -> Path:
    configured = os.environ.get("LOOPSCOPE_SEMCONV_MODELS")
    if configured:
        return Path(configured)
    return Path(__file__).resolve().parents[3] / "shared" / "semconv_genai"


def blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()  # what git hash-object computes


@cache
def models() -> Path:
    folder = models_folder()
    missing = [path for path in MODELS if not (folder / path).is_file()]
    if missing:
        pytest.skip(f"the GenAI conventions' models are not at {folder} (LOOPSCOPE_SEMCONV_MODELS): "
                    f"{', '.join(missing)}, from {UPSTREAM} at the commits MODELS names")
    for path, (commit, blob) in MODELS.items():
        assert blob_id((folder / path).read_bytes()) == blob, f"{path} is not {UPSTREAM}'s at {commit}"
    return folder


def pinned(name: str) -> Path:
    return models() / "fe5608e" / "model" / "gen-ai" / name


def newer(name: str) -> Path:
    return models() / "066d4a7" / "model" / "gen-ai" / name


RENAMED = {"gen_ai.usage.cache_write.input_tokens": "gen_ai.usage.cache_creation.input_tokens"}
"""Attributes renamed after the pinned commit (semantic-conventions-genai #440, "Rename
gen_ai.usage.cache_creation.input_tokens to gen_ai.usage.cache_write.input_tokens"): checked as the
pinned models define their older name."""
REMOVED_FROM_AGENT = {"gen_ai.provider.name", "gen_ai.usage.cache_read.input_tokens",
                      "gen_ai.usage.cache_creation.input_tokens", "gen_ai.usage.cache_write.input_tokens"}
"""Not on gen_ai.invoke_agent.internal in the current conventions (removed upstream after the pinned
commit: model/gen-ai/spans.yaml at 0990749a gives that span ``attributes.gen_ai.usage``, input and
output tokens only; the cache usage moved to ``attributes.gen_ai.usage.breakdown``, on the inference
span alone; the provider was already gone at the pin)."""
ELSEWHERE = {("execute_tool", "gen_ai.conversation.id")}
"""Registry attributes loopscope puts on a span whose definition does not list them: the session
every stored row belongs to, on each of its spans (the store and the collector read it there)."""
PROPOSED = {"gen_ai.agent.finish_reason", "gen_ai.agent.turn.count"}
"""Proposed upstream for invoke_agent, not merged (#238, #451): on invoke_agent spans only."""
SPAN_TYPES = {"chat": "gen_ai.inference.client", "invoke_agent": "gen_ai.invoke_agent.internal",
              "execute_tool": "gen_ai.execute_tool.internal"}
KINDS = {"client": SpanKind.CLIENT, "internal": SpanKind.INTERNAL}
SCHEMAS = {
    a.INPUT_MESSAGES: "gen-ai-input-messages.json", a.OUTPUT_MESSAGES: "gen-ai-output-messages.json",
    a.SYSTEM_INSTRUCTIONS: "gen-ai-system-instructions.json", a.TOOL_DEFINITIONS: "gen-ai-tool-definitions.json",
}


@cache
def model(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


@cache
def groups() -> dict[str, list[dict[str, Any]]]:
    """Every attribute group of the models, by id (the newer metric files' and the pinned spans')."""
    out: dict[str, list[dict[str, Any]]] = {}
    for path in (pinned("spans.yaml"), pinned("metrics.yaml"), newer("metrics.yaml"), newer("token-metrics.yaml")):
        for group in model(path).get("attribute_groups", []):
            out[group["id"]] = group["attributes"]
    return out


def resolve(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """An attribute list with its ``ref_group``s expanded: name -> requirement level (a later
    entry refines an earlier one, as weaver resolves them)."""
    out: dict[str, Any] = {}
    for entry in entries:
        if "ref_group" in entry:
            out.update(resolve(groups()[entry["ref_group"]]))
        elif "ref" in entry:
            level = entry.get("requirement_level", out.get(entry["ref"], "recommended"))
            out[entry["ref"]] = level
    return out


def span_definition(span_type: str) -> tuple[str, dict[str, Any]]:
    (span,) = [s for s in model(pinned("spans.yaml"))["spans"] if s["type"] == span_type]
    return span["kind"], resolve(span["attributes"])


@cache
def registry() -> frozenset[str]:
    return frozenset(entry["key"] for entry in model(pinned("registry.yaml"))["attributes"])


def metric_definitions(*paths: Path) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for path in paths for m in model(path)["metrics"]}


@cache
def schema(name: str) -> Any:
    document = json.loads(pinned(name).read_text(encoding="utf-8"))
    jsonschema.validators.validator_for(document).check_schema(document)
    return document


def is_required(level: Any) -> bool:
    return level == "required"


@pytest.fixture(params=["current", "v1.37"])
def recorded(request, tmp_path, model_server, monkeypatch) -> tuple[str, Recorded]:
    monkeypatch.setenv(a.SEMCONV, request.param)
    return request.param, record_loop(tmp_path, model_server)


def gen_ai_spans(recorded: Recorded) -> list[Any]:
    return [s for s in recorded.spans.get_finished_spans() if s.attributes.get(a.OPERATION) in SPAN_TYPES]


def test_each_span_has_its_kind_and_only_attributes_its_definition_has(recorded):
    version, spans = recorded[0], gen_ai_spans(recorded[1])
    assert {s.attributes[a.OPERATION] for s in spans} == set(SPAN_TYPES)
    problems = []
    for span in spans:
        operation = span.attributes[a.OPERATION]
        kind, allowed = span_definition(SPAN_TYPES[operation])
        if span.kind is not KINDS[kind]:
            problems.append(f"{span.name}: kind {span.kind.name}, the model says {kind}")
        for name in span.attributes:
            if not name.startswith("gen_ai."):
                continue  # loopscope.*, server.*, error.type: not the GenAI models' to define
            if name in PROPOSED:
                if operation != "invoke_agent":
                    problems.append(f"{span.name}: {name}, proposed for invoke_agent only")
                continue
            defined = RENAMED.get(name, name) if version == "current" else name
            if defined not in registry():
                problems.append(f"{span.name}: {name} is no attribute of the registry")
            elif version == "current" and operation == "invoke_agent" and name in REMOVED_FROM_AGENT:
                problems.append(f"{span.name}: {name} was removed from {SPAN_TYPES[operation]}")
            elif defined not in allowed and (operation, name) not in ELSEWHERE:
                problems.append(f"{span.name}: {name} is not an attribute of {SPAN_TYPES[operation]}")
        for name, level in allowed.items():
            if is_required(level) and name not in span.attributes:
                problems.append(f"{span.name}: the required {name} is missing")
    if version == "current":
        assert problems == []
    else:
        # the older names put the provider, the reasoning tokens and the response model on the
        # agent span, which the pinned models do not have there: exactly those (and the cache usage,
        # which they still had)
        expected = {"gen_ai.provider.name", "gen_ai.usage.reasoning.output_tokens", "gen_ai.response.model"}
        assert {p.split(": ")[1].split(" ")[0] for p in problems} == expected
        assert all(p.startswith("invoke_agent") for p in problems)


def test_the_current_names_only_by_default(recorded):
    version, spans = recorded[0], gen_ai_spans(recorded[1])
    names = {name for s in spans for name in s.attributes}
    if version == "current":
        assert "gen_ai.usage.cache_write.input_tokens" in names
        assert "gen_ai.usage.cache_creation.input_tokens" not in names
    else:
        assert "gen_ai.usage.cache_creation.input_tokens" in names
        assert "gen_ai.usage.cache_write.input_tokens" not in names


def test_the_content_attributes_follow_their_json_schemas(recorded):
    checked = set()
    for span in gen_ai_spans(recorded[1]):
        for name, file in SCHEMAS.items():
            if name in span.attributes:
                jsonschema.validate(json.loads(span.attributes[name]), schema(file))
                checked.add(name)
    assert checked == {a.INPUT_MESSAGES, a.OUTPUT_MESSAGES, a.TOOL_DEFINITIONS}
    # every output message keeps its finish_reason (the schema requires it; Phoenix drops one without)
    for span in gen_ai_spans(recorded[1]):
        if a.OUTPUT_MESSAGES in span.attributes:
            assert all("finish_reason" in m for m in json.loads(span.attributes[a.OUTPUT_MESSAGES]))


def test_the_schemas_catch_what_loopscope_used_to_send():
    """The check is not blind: a tool definition without its type (what every entry was) fails."""
    tools = schema("gen-ai-tool-definitions.json")
    with pytest.raises(jsonschema.ValidationError, match="is not valid under any of the given schemas"):
        jsonschema.validate([{"name": "weather", "parameters": {"type": "object"}}], tools)
    jsonschema.validate([{"type": "function", "name": "weather", "parameters": {"type": "object"}}], tools)
    with pytest.raises(jsonschema.ValidationError, match="'finish_reason' is a required property"):
        jsonschema.validate([{"role": "assistant", "parts": [{"type": "text", "content": "hi"}]}],
                            schema("gen-ai-output-messages.json"))


def test_each_metric_has_its_models_name_instrument_unit_and_required_attributes(recorded):
    version, metrics = recorded[0], recorded[1].metrics()
    definitions = (metric_definitions(newer("metrics.yaml"), newer("token-metrics.yaml")) if version == "current"
                   else metric_definitions(pinned("metrics.yaml")))
    emitted = {name: m for name, m in metrics.items() if name.startswith("gen_ai.")}
    expected = ({a.METRIC_INFERENCE_DURATION, a.METRIC_INFERENCE_TIME_TO_FIRST_CHUNK,
                 a.METRIC_INFERENCE_TIME_PER_OUTPUT_CHUNK, a.METRIC_EXECUTE_TOOL_DURATION,
                 a.METRIC_INVOKE_AGENT_DURATION, a.METRIC_INVOKE_AGENT_INFERENCE_CALLS, a.METRIC_INVOKE_AGENT_TOOL_CALLS,
                 a.METRIC_INPUT_TOKENS, a.METRIC_OUTPUT_TOKENS, a.METRIC_CACHE_READ_TOKENS, a.METRIC_CACHE_WRITE_TOKENS,
                 a.METRIC_REASONING_TOKENS, a.METRIC_OPERATION_INPUT_TOKENS, a.METRIC_OPERATION_OUTPUT_TOKENS}
                if version == "current" else {a.METRIC_TOKEN_USAGE, a.METRIC_OPERATION_DURATION, a.METRIC_EXECUTE_TOOL_DURATION})
    assert set(emitted) == expected
    for name, metric in emitted.items():
        definition = definitions[name]
        assert metric.unit == definition["unit"], name
        if definition["instrument"] == "histogram":
            assert isinstance(metric.data, Histogram), name
        else:
            assert definition["instrument"] == "counter" and isinstance(metric.data, Sum) and metric.data.is_monotonic, name
        attributes = resolve(definition["attributes"])
        for point in metric.data.data_points:
            for key in point.attributes:
                if key.startswith("gen_ai."):
                    assert key in attributes, f"{name}: {key} is not one of its attributes"
            for key, level in attributes.items():
                if is_required(level):
                    assert key in point.attributes, f"{name}: the required {key} is missing"
