"""The content switch in both spellings: ``true``/``false`` and opentelemetry-util-genai's modes.

The official GenAI instrumentation (opentelemetry-instrumentation-genai-openai, on
opentelemetry-util-genai 1.3) reads ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` as a
mode and ``true`` as no content; loopscope reads both, so ``SPAN_ONLY`` (what ``loopscope run
--capture-content`` sets) turns content on for the two in one process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider

import loopscope
import stacks
from fakes import otlp_receiver
from fakes.model_server import FakeModelServer, Reply
from loopscope.cli.run import child_environment

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
VARIABLE = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
PROMPT = "What's the weather in Paris?"  # official_genai_child.PROMPT
ANSWER = "It is 21 degrees and dry in Paris."


@pytest.fixture
def receiver() -> Iterator[otlp_receiver.OTLPReceiver]:
    rec, server = otlp_receiver.start()
    yield rec
    server.shutdown()


def exported_turn(tmp_path: Path, receiver: otlp_receiver.OTLPReceiver) -> dict[str, object]:
    """One hand-API turn exported over OTLP; the invoke_agent span's attributes as received."""
    loopscope.configure(tmp_path / "s.duckdb", tracer_provider=TracerProvider(), otlp_endpoint=receiver.endpoint,
                        flush_interval=0.05)
    with loopscope.turn(session_id="sw", agent="ops", input="the question", model="m", provider="openai") as t:
        t.generation("the answer", finish_reason="stop")
    loopscope.shutdown()
    assert receiver.wait_for(lambda r: any(s.name == "invoke_agent ops" for s in r.spans))
    return next(s for s in receiver.spans if s.name == "invoke_agent ops").attributes


@pytest.mark.parametrize("value", ["true", "TRUE", "1", "SPAN_ONLY", "span_only", "SPAN_AND_EVENT", " Span_And_Event "])
def test_values_that_put_content_on_spans_export_loopscopes_content(tmp_path, receiver, monkeypatch, value):
    monkeypatch.setenv(VARIABLE, value)
    attributes = exported_turn(tmp_path, receiver)
    assert attributes["loopscope.turn.input"] == "the question"
    assert "the answer" in attributes["gen_ai.output.messages"]


@pytest.mark.parametrize("value", ["false", "NO_CONTENT", "no_content", "EVENT_ONLY", ""])
def test_values_that_keep_content_off_spans_export_none(tmp_path, receiver, monkeypatch, value):
    # EVENT_ONLY: content in events only; loopscope sends no content events, so none leaves
    monkeypatch.setenv(VARIABLE, value)
    attributes = exported_turn(tmp_path, receiver)
    assert "loopscope.turn.input" not in attributes and "gen_ai.output.messages" not in attributes
    assert attributes["loopscope.turn.loop_end_reason"] == "completed"  # the span itself is there


def test_an_unknown_value_exports_no_content_and_says_so_once(tmp_path, receiver, monkeypatch, caplog):
    monkeypatch.setenv(VARIABLE, "SPANS_PLEASE")
    attributes = exported_turn(tmp_path, receiver)
    assert "loopscope.turn.input" not in attributes
    said = [r.getMessage() for r in caplog.records if VARIABLE in r.getMessage()]
    assert len(said) == 1 and "'SPANS_PLEASE'" in said[0] and "SPAN_ONLY" in said[0]


def run_args(**kwargs: object) -> argparse.Namespace:
    defaults: dict[str, object] = {"db": None, "disable": "", "otlp_endpoint": None, "session": None, "capture_content": True}
    return argparse.Namespace(**{**defaults, **kwargs})


def test_loopscope_run_capture_content_sets_the_value_both_readers_take():
    assert child_environment(run_args(), base={})[VARIABLE] == "SPAN_ONLY"
    # "true" would turn the official instrumentation's content off: replaced
    assert child_environment(run_args(), base={VARIABLE: "true"})[VARIABLE] == "SPAN_ONLY"
    # a value that already puts content on spans for both is the user's
    assert child_environment(run_args(), base={VARIABLE: "SPAN_AND_EVENT"})[VARIABLE] == "SPAN_AND_EVENT"
    assert VARIABLE not in child_environment(run_args(capture_content=False), base={})


# -- with the real official instrumentation ------------------------------------------------------

def record_with_official(tmp_path: Path, receiver: otlp_receiver.OTLPReceiver, value: str) -> tuple[dict, dict]:
    """(loopscope's chat span, the official instrumentation's chat span), as exported."""
    # the peers stack (tests/stacks.toml) has the official instrumentation beside loopscope
    python = stacks.require("peers") / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env[VARIABLE] = value
    with FakeModelServer() as server:
        server.queue(Reply(text=ANSWER))
        done = subprocess.run(
            [str(python), str(HERE / "official_genai_child.py"), server.openai_base_url, receiver.endpoint,
             str(tmp_path / "s.duckdb")],
            check=False, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    assert receiver.wait_for(lambda r: sum(s.name.startswith("chat") for s in r.spans) >= 2)
    chats = [s for s in receiver.spans if s.name.startswith("chat")]
    ours = [s.attributes for s in chats if "loopscope.turn.id" in s.attributes]
    theirs = [s.attributes for s in chats if "loopscope.turn.id" not in s.attributes]
    assert len(ours) == 1 and len(theirs) == 1, [s.name for s in chats]
    return ours[0], theirs[0]


def said(attributes: dict, key: str) -> str:
    """An attribute's text (content attributes are JSON text, or structured on some senders)."""
    value = attributes.get(key, "")
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def test_span_only_turns_content_on_for_loopscope_and_the_official_instrumentation(tmp_path, receiver):
    ours, theirs = record_with_official(tmp_path, receiver, "SPAN_ONLY")
    for attributes in (ours, theirs):
        assert PROMPT in said(attributes, "gen_ai.input.messages")
        assert ANSWER in said(attributes, "gen_ai.output.messages")


def test_true_turns_the_official_instrumentations_content_off(tmp_path, receiver):
    # why the documented value is SPAN_ONLY: util-genai reads "true" as NO_CONTENT
    ours, theirs = record_with_official(tmp_path, receiver, "true")
    assert ANSWER in said(ours, "gen_ai.output.messages")
    assert "gen_ai.output.messages" not in theirs and "gen_ai.input.messages" not in theirs
