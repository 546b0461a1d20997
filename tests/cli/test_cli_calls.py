"""``loopscope calls`` and the costs in ``stats``, ``turns`` and ``sessions``; ``collect --prices``."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Status, StatusCode

import loopscope
from loopscope import semconv as a
from loopscope.cli import main
from loopscope.ingest.spans import OWN_SCOPE

ROOT = Path(__file__).resolve().parents[2]


def _call(tracer: Any, session: str, turn: str, model: str, provider: str, pause: float, *, usage: tuple[int, int] | None,
          error: str | None = None, ttfc: float | None = None) -> None:
    attributes: dict[str, Any] = {a.OPERATION: a.OP_CHAT, a.CONVERSATION_ID: session, a.TURN_ID: turn, a.REQUEST_MODEL: model,
                                  a.PROVIDER: provider, a.RESPONSE_FINISH_REASONS: ("stop",)}
    if usage is not None:
        attributes |= {a.USAGE_INPUT: usage[0], a.USAGE_OUTPUT: usage[1]}
    if ttfc is not None:
        attributes |= {a.TIME_TO_FIRST_CHUNK: ttfc, a.REQUEST_STREAM: True}
    if error is not None:
        attributes |= {a.ERROR_TYPE: "RateLimitError", a.CALL_OUTCOME: "error"}
    span = tracer.start_span("chat", attributes=attributes)
    time.sleep(pause)
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, error))
    span.end()


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("calls") / "store.duckdb"
    provider = TracerProvider()
    loopscope.configure(path, tracer_provider=provider, flush_interval=0.05)
    tracer = provider.get_tracer(OWN_SCOPE)
    try:
        with loopscope.turn(session_id="alpha", agent="a", model="gpt-4o", provider="openai") as t:
            t.generation("one", usage={"input_tokens": 1000, "output_tokens": 100}, model="gpt-4o", provider="openai")
            t.generation("two", usage={"input_tokens": 2000, "output_tokens": 50}, model="gpt-4o", provider="openai")
        _call(tracer, "beta", "b1", "gpt-4o-mini", "openai", 0.04, usage=(500, 20), ttfc=0.012)
        _call(tracer, "beta", "b1", "house-model", "vllm", 0.001, usage=(300, 30))
        _call(tracer, "beta", "b1", "gpt-4o-mini", "openai", 0.002, usage=None, error="rate limited: slow down")
        loopscope.flush()
    finally:
        loopscope.shutdown()
    return str(path)


@pytest.fixture(autouse=True)
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "220")  # whole cells: the tests read them


def run(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    code = main([str(x) for x in argv])
    out, err = capsys.readouterr()
    return code, out, err


def rows_of(out: str) -> list[str]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("---")) + 1
    return [line for line in lines[start:] if line.strip() and not line.startswith("(")]


def test_calls_lists_every_model_call_with_position_model_timing_tokens_cost_and_outcome(db, capsys):
    code, out, err = run(capsys, "calls", "--db", db)
    assert code == 0, err
    header = out.splitlines()[0].split()
    assert header[:6] == ["STARTED", "SESSION", "POS", "MODEL", "MS", "TTFC"] and "COST" in header and "OUTCOME" in header
    lines = rows_of(out)
    assert len(lines) == 5
    assert [line.split()[1:4] for line in lines[:2]] == [["alpha", "1", "gpt-4o"], ["alpha", "2", "gpt-4o"]]
    assert "1,000/100" in lines[0] and "$0.0035" in lines[0]  # 1,000 in at $2.50/M + 100 out at $10/M
    assert "12.0" in lines[2]  # the stream's time to its first chunk
    house = next(line for line in lines if "house-model" in line)
    assert "$" not in house  # no price known: no cost, never a guess
    failed = next(line for line in lines if "rate limited" in line)
    assert "error" in failed and "RateLimitError: rate limited: slow down" in failed
    assert out.splitlines()[-1].startswith("(5 calls, $") and "1 without a price" in out.splitlines()[-1]


def test_calls_filters_slowest_and_json(db, capsys):
    code, out, _ = run(capsys, "calls", "--db", db, "--session", "beta", "--json")
    assert code == 0
    calls = json.loads(out)
    assert [(c["position"], c["model"], c["outcome"]) for c in calls] == [
        (1, "gpt-4o-mini", "completed"), (2, "house-model", "completed"), (3, "gpt-4o-mini", "error")]
    assert calls[0]["usage"] == {"input_tokens": 500, "output_tokens": 20} and calls[0]["cost_usd"] > 0
    assert calls[1]["cost_usd"] is None and "input_messages" not in calls[0]
    _, out, _ = run(capsys, "calls", "--db", db, "--slowest", "--limit", "1", "--json")
    assert [c["model"] for c in json.loads(out)] == ["gpt-4o-mini"] and json.loads(out)[0]["duration_ms"] >= 40
    _, out, _ = run(capsys, "calls", "--db", db, "--failed", "--json")
    assert [c["error"] for c in json.loads(out)] == ["rate limited: slow down"]
    _, out, _ = run(capsys, "calls", "--db", db, "--provider", "vllm", "--json")
    assert [c["model"] for c in json.loads(out)] == ["house-model"]
    _, out, _ = run(capsys, "calls", "--db", db, "--model", "gpt-4o", "--json")
    assert [c["session_id"] for c in json.loads(out)] == ["alpha", "alpha"]
    _, out, _ = run(capsys, "calls", "--db", db, "--session", "al", "--json")  # a session's unique prefix
    assert [c["position"] for c in json.loads(out)] == [1, 2]
    code, out, _ = run(capsys, "calls", "--db", db, "--model", "nothing")
    assert (code, out.strip()) == (0, "no model calls match")


def test_stats_shows_the_cost_and_the_calls_without_a_price(db, capsys):
    code, out, _ = run(capsys, "stats", "--db", db, "--json")
    assert code == 0
    costs = json.loads(out)["costs"]
    assert costs["model_calls"] == 5 and costs["unpriced_calls"] == 1
    _, calls_out, _ = run(capsys, "calls", "--db", db, "--json")
    assert costs["cost_usd"] == pytest.approx(sum(c["cost_usd"] or 0 for c in json.loads(calls_out)))
    _, out, _ = run(capsys, "stats", "--db", db)
    cost_line = next(line for line in out.splitlines() if line.startswith("cost"))
    assert "$" in cost_line and "1 call without a price" in cost_line
    assert "Model calls" in out and "house-model" in out


def test_turns_and_sessions_show_their_cost(db, capsys):
    _, out, _ = run(capsys, "turns", "--db", db, "alpha")
    assert "COST" in out.splitlines()[0] and "$0.0090" in out  # 0.0035 + 0.0055
    _, out, _ = run(capsys, "sessions", "--db", db)
    assert "COST" in out.splitlines()[0]
    alpha = next(line for line in out.splitlines() if line.startswith("alpha"))
    assert "$0.0090" in alpha


def test_collect_refuses_a_bad_prices_file_in_one_line(tmp_path):
    bad = tmp_path / "prices.json"
    bad.write_text(json.dumps({"my-model": {"input": 1.0}}), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "loopscope", "--db", str(tmp_path / "c.duckdb"), "collect", "--prices", str(bad),
         "--http-port", "0", "--no-grpc"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"loopscope: error: --prices {bad}: prices for 'my-model': input and output are required (USD per million tokens)"]
