"""The standard exporter switches (OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER) and an endpoint
that takes spans but refuses metrics: real OTLP over loopback, from a real program that exits."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from fakes import otlp_receiver

METRICS = "/v1/metrics"


@pytest.fixture
def receiver() -> Iterator[otlp_receiver.OTLPReceiver]:
    rec, server = otlp_receiver.start()
    yield rec
    server.shutdown()


def run_agent(tmp_path: Path, receiver: otlp_receiver.OTLPReceiver, *, wait: float = 0.0, **env: str) -> str:
    """A program recording one turn, OTLP pointed at ``receiver``, run to its exit; its stderr."""
    script = tmp_path / "agent.py"
    script.write_text(textwrap.dedent(f"""
        import time
        import loopscope
        loopscope.configure({str(tmp_path / "a.duckdb")!r}, flush_interval=0.05)
        with loopscope.turn(session_id="sig", agent="a", model="m", provider="openai") as t:
            t.generation("hi", usage={{"input_tokens": 3, "output_tokens": 1}})
        loopscope.flush()
        time.sleep({wait})
    """))
    full = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    full.update({"LOOPSCOPE_STRICT": "1", "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, **env})
    done = subprocess.run([sys.executable, str(script)], env=full, check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    assert receiver.wait_for(lambda r: any(s.name == "invoke_agent a" for s in r.spans)), "spans are sent either way"
    return done.stderr


def test_metrics_exporter_none_sends_no_metrics(tmp_path, receiver):
    receiver.refuse[METRICS] = 405
    stderr = run_agent(tmp_path, receiver, OTEL_METRICS_EXPORTER="none")
    assert receiver.paths.count(METRICS) == 0
    assert "metrics" not in stderr.lower()


def test_metrics_are_sent_by_default(tmp_path, receiver):
    run_agent(tmp_path, receiver)
    assert receiver.paths.count(METRICS) >= 1 and receiver.metrics


def test_an_endpoint_refusing_metrics_is_said_once_and_left_alone(tmp_path, receiver):
    receiver.refuse[METRICS] = 405
    # exports every 50 ms for a second, then at exit: one refusal, then no more requests
    stderr = run_agent(tmp_path, receiver, wait=1.0, OTEL_METRIC_EXPORT_INTERVAL="50")
    assert receiver.paths.count(METRICS) == 1
    lines = [line for line in stderr.splitlines() if "metrics" in line.lower()]
    assert len(lines) == 1, stderr
    assert f"{receiver.endpoint}{METRICS} refused metrics (HTTP 405" in lines[0]
    assert "OTEL_METRICS_EXPORTER=none" in lines[0]
    assert "Failed to export" not in stderr


def test_a_404_is_a_refusal_too_and_said_at_exit(tmp_path, receiver):
    receiver.refuse[METRICS] = 404
    stderr = run_agent(tmp_path, receiver)  # the first (and only) export is at exit
    assert receiver.paths.count(METRICS) == 1
    assert "refused metrics (HTTP 404" in stderr and "Failed to export" not in stderr


def test_traces_exporter_none_sends_no_spans_but_metrics(tmp_path, receiver):
    script = tmp_path / "agent.py"
    script.write_text(textwrap.dedent(f"""
        import loopscope
        loopscope.configure({str(tmp_path / "t.duckdb")!r}, flush_interval=0.05)
        with loopscope.turn(session_id="sig", agent="a") as t:
            t.generation("hi", usage={{"input_tokens": 3, "output_tokens": 1}})
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_TRACES_EXPORTER": "none"})
    subprocess.run([sys.executable, str(script)], env=env, check=True, timeout=60)
    assert receiver.wait_for(lambda r: r.paths.count(METRICS) >= 1)
    assert "/v1/traces" not in receiver.paths


@pytest.mark.parametrize("value", ["console", "zipkin,console"])
def test_exporters_loopscope_does_not_provide_are_said_and_not_sent(tmp_path, receiver, value):
    script = tmp_path / "agent.py"
    script.write_text(textwrap.dedent(f"""
        import loopscope
        loopscope.configure({str(tmp_path / "c.duckdb")!r}, flush_interval=0.05)
        with loopscope.turn(session_id="sig", agent="a") as t:
            t.generation("hi")
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_TRACES_EXPORTER": value, "OTEL_METRICS_EXPORTER": "none"})
    done = subprocess.run([sys.executable, str(script)], env=env, check=True, timeout=60, capture_output=True, text=True)
    assert receiver.paths == []
    said = [line for line in done.stderr.splitlines() if "OTEL_TRACES_EXPORTER" in line]
    assert len(said) == 1 and "does not provide" in said[0] and "console" in said[0]


def test_otlp_in_a_list_still_sends(tmp_path, receiver):
    run_agent(tmp_path, receiver, OTEL_TRACES_EXPORTER="console, OTLP", OTEL_METRICS_EXPORTER="otlp")
    assert "/v1/traces" in receiver.paths and METRICS in receiver.paths
