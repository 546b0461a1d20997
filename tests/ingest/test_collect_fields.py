"""What ``loopscope collect`` keeps of each field a sender gives it: the same as in-process.

Every test here sends real OTLP (loopscope's own exporter, or a peer instrumentation from
PyPI run in its stack's venv, tests/stacks.toml) to a real ``loopscope collect`` child
process, then reads its store: the order of a turn's rows without start notices, a failed
tool's masked message, the fields of model-call rows under foreign agent runs, finish
reasons and streaming as each peer writes them, the hint a gRPC endpoint without a
metrics service gets.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

import loopscope
import stacks
from children import Collect, collect_child
from loopscope.storage.duckdb.connection import open_store

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "foreign"


def query(db: Path | str, sql: str) -> list[tuple[Any, ...]]:
    with open_store(str(Path(db).resolve()), read_only=True) as con:
        return con.execute(sql).fetchall()


@contextmanager
def collecting(db: Path, *args: str) -> Iterator[Collect]:
    """A ``loopscope collect`` child (:func:`children.collect_child`) for the block, then stopped
    with SIGTERM (it writes what it holds), which must end it cleanly."""
    with collect_child(db, *args) as child:
        yield child
        child.stop_ok()


# -- a failed tool's message, masked whole and nothing more -------------------------------------


def record_failed_login() -> None:
    @loopscope.tool
    def login(user: str) -> str:
        raise RuntimeError(f"login failed for {user} (password=hunter2)")

    with loopscope.turn(session_id="s", agent="a", input="log in", model="m", provider="openai") as t:
        t.generation("", tool_calls=[{"id": "c1", "name": "login", "arguments": {"user": "ann"}}])
        try:
            login("ann")
        except RuntimeError:
            pass
        t.generation("no", finish_reason="stop")


def test_a_failed_tools_masked_message_keeps_its_closing_parenthesis_in_process_and_in_collect(tmp_path):
    local = tmp_path / "local.duckdb"
    collected = tmp_path / "collected.duckdb"
    with collecting(collected, "--no-grpc") as child:
        loopscope.configure(local, tracer_provider=TracerProvider(), otlp_endpoint=child.http,
                            capture_content=True, flush_interval=0.05)
        record_failed_login()
        loopscope.shutdown()
    for db in (local, collected):
        (error,) = query(db, "SELECT content->>'error' FROM events WHERE type = 'tool_call_end'")
        assert error == ("RuntimeError: login failed for ann (password=[REDACTED])",), db.name
    (status,) = query(collected, "SELECT status_message FROM spans WHERE name = 'execute_tool login'")
    assert status[0].endswith("(password=[REDACTED])") and "hunter2" not in status[0]


# -- model-call rows of foreign agent runs: every field the spans carry ---------------------------


def run_peer(stack: str, lib: str, endpoint: str, *args: str) -> None:
    """tests/fixtures/foreign/record.py's tool loop under ``lib``, in ``stack``'s venv, sent to ``endpoint``."""
    python = stacks.require(stack) / "bin" / "python"
    done = subprocess.run([str(python), "-W", "ignore", str(FIXTURES / "record.py"), "--lib", lib, *args, "--endpoint", endpoint],
                          check=False, capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("lib", ["otel-genai", "openllmetry", "openinference", "openinference-bare"])
def test_model_calls_of_a_streamed_agent_run_keep_their_ids_streaming_and_messages(tmp_path, lib):
    """Under an ``invoke_agent``, a traceloop-shaped or an OpenInference AGENT span, as a bare
    loop keeps them: position, response id, streamed (OpenInference says it only in
    ``llm.invocation_parameters``), and both messages (OpenInference's flattened ones in the
    GenAI conventions' JSON)."""
    db = tmp_path / "c.duckdb"
    with collecting(db, "--no-grpc") as child:
        run_peer("peers", lib, child.http, "--stream")
    calls = query(db, "SELECT position, response_id, streaming, outcome, input_messages::VARCHAR, output_messages::VARCHAR "
                      "FROM model_calls ORDER BY started_at")
    assert [c[:4] for c in calls] == [(1, "chatcmpl-fake00001", True, "completed"), (2, "chatcmpl-fake00002", True, "completed")]
    first_in, first_out = json.loads(calls[0][4]), json.loads(calls[0][5])
    assert [m["role"] for m in first_in] == ["user"]
    assert [p["content"] for p in first_in[0]["parts"]] == ["What's the weather in Paris?"]
    assert [(p["id"], p["name"]) for p in first_out[0]["parts"] if p["type"] == "tool_call"] == [("call_weather_1", "get_weather")]
    second_in, second_out = json.loads(calls[1][4]), json.loads(calls[1][5])
    assert [m["role"] for m in second_in] == ["user", "assistant", "tool"]
    assert [p["content"] for p in second_out[0]["parts"] if p["type"] == "text"] == ["It is 21 °C and dry in Paris."]


# -- the order of a turn's rows when its start notice never arrives -----------------------------


def record_weather_turn() -> None:
    @loopscope.tool
    def get_weather(city: str) -> dict[str, Any]:
        return {"city": city, "sky": "dry"}

    @loopscope.tool
    def get_time(city: str) -> str:
        return "noon"

    for i in range(2):
        with loopscope.turn(session_id="s", agent="a", input=f"Weather in Paris? ({i})", model="m", provider="openai") as t:
            t.generation("Looking.", tool_calls=[{"id": f"w{i}", "name": "get_weather", "arguments": {"city": "Paris"}},
                                                 {"id": f"t{i}", "name": "get_time", "arguments": {"city": "Paris"}}])
            get_weather("Paris")
            get_time("Paris")
            t.generation("Dry, at noon.", finish_reason="stop")


def ordered_rows(db: Path) -> list[tuple[Any, ...]]:
    return query(db, "SELECT idx, type, coalesce(content->>'body', content->>'tool_name'), content->>'status' "
                     "FROM events ORDER BY idx")


@pytest.mark.parametrize("switch", [{"LOOPSCOPE_OTLP_PENDING": "0"}, {"OTEL_LOGS_EXPORTER": "none"}],
                         ids=["no-pending", "no-logs"])
def test_without_start_notices_the_users_message_comes_first_in_its_turn(tmp_path, monkeypatch, switch):
    """docs/collector.md: the same order as in-process. Without notices every agent run's
    span arrives after its calls (children end first): its input message still gets the
    first index of its turn, before the tool calls and the answer."""
    for name, value in switch.items():
        monkeypatch.setenv(name, value)
    collected = tmp_path / "collected.duckdb"
    with collecting(collected, "--no-grpc") as child:
        loopscope.configure(False, tracer_provider=TracerProvider(), otlp_endpoint=child.http, capture_content=True)
        record_weather_turn()
        loopscope.shutdown()
    # the order a local store has of the same turns (loopscope.configure(path), the same calls)
    turn = [("message", "Weather in Paris? ({})", None), ("message", "Looking.", None),
            ("tool_call_start", "get_weather", "pending"), ("tool_call_end", "get_weather", "completed"),
            ("tool_call_start", "get_time", "pending"), ("tool_call_end", "get_time", "completed"),
            ("message", "Dry, at noon.", None)]
    expected = [(kind, text.format(i), status) for i in range(2) for kind, text, status in turn]
    assert ordered_rows(collected) == [(i, *row) for i, row in enumerate(expected, 1)]
    assert query(collected, "SELECT count(*) FROM turns") == [(2,)]


# -- finish reasons as logfire sends them ---------------------------------------------------------


def test_logfires_finish_reasons_sent_as_one_json_string_are_read_as_the_list(tmp_path):
    """Pydantic Logfire's openai instrumentation (peers-logfire stack) sends
    ``gen_ai.response.finish_reasons`` as the JSON text of the list: stored as the list it
    is, and the call's outcome read from it."""
    db = tmp_path / "c.duckdb"
    python = stacks.require("peers-logfire") / "bin" / "python"
    with collecting(db, "--no-grpc") as child:
        done = subprocess.run([str(python), "-W", "ignore", str(FIXTURES / "record_logfire.py"), "--endpoint", child.http],
                              check=False, capture_output=True, text=True, timeout=180, cwd=ROOT)
        assert done.returncode == 0, done.stderr[-2000:]
    (raw,) = query(db, "SELECT attributes->>'gen_ai.response.finish_reasons' FROM spans ORDER BY start_time LIMIT 1")
    assert raw == ('["tool_calls"]',)  # what logfire sent: a string
    calls = query(db, "SELECT finish_reasons::VARCHAR, outcome FROM model_calls ORDER BY started_at")
    assert [(json.loads(reasons), outcome) for reasons, outcome in calls] == [(["tool_calls"], "completed"), (["stop"], "completed")]


# -- openai-agents through OpenInference's bridge, the user's input as parts ---------------------


def test_the_users_message_given_as_input_text_parts_is_kept_through_the_openinference_bridge(tmp_path):
    """openai-agents with its default Responses model, its input a user message of
    ``input_text`` parts (as a chat front end sends it), OpenInference's bridge (agents-oi
    stack): OpenInference flattens the parts (``message.contents.N.message_content.text``);
    the turn keeps the user's message first, and each call's request holds it."""
    db = tmp_path / "c.duckdb"
    python = stacks.require("agents-oi") / "bin" / "python"
    with collecting(db, "--no-grpc") as child:
        done = subprocess.run([str(python), "-W", "ignore", str(FIXTURES / "record_agents.py"), "--lib", "agents-oi", "--input", "parts",
                               "--endpoint", child.http], check=False, capture_output=True, text=True, timeout=180, cwd=ROOT)
        assert done.returncode == 0, done.stderr[-2000:]
    (first,) = query(db, "SELECT content::VARCHAR FROM events ORDER BY idx LIMIT 1")
    assert json.loads(first[0]) == {"type": "text", "body": "Dinner outside in Paris tonight?", "role": "user"}
    assert query(db, "SELECT count(*) FROM events WHERE type = 'message' AND content->>'role' = 'user'") == [(1,)]
    requests = [json.loads(m) for (m,) in query(db, "SELECT input_messages::VARCHAR FROM model_calls ORDER BY started_at")]
    assert len(requests) == 3
    assert all(m[0]["role"] == "user" and m[0]["parts"][0]["content"] == "Dinner outside in Paris tonight?" for m in requests)
