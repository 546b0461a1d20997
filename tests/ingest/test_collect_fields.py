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
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider

import loopscope
from loopscope.storage.connection import open_store

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "foreign"


def query(db: Path | str, sql: str) -> list[tuple[Any, ...]]:
    with open_store(str(Path(db).resolve()), read_only=True) as con:
        return con.execute(sql).fetchall()


@contextmanager
def collect_child(db: Path, *args: str) -> Iterator[dict[str, str]]:
    """``loopscope collect`` in a child process on free ports; its endpoints (``http``, and
    ``grpc`` unless ``--no-grpc`` is given). Stopped with SIGTERM (it writes what it holds)."""
    grpc = ["--grpc-port", "0"] if "--no-grpc" not in args else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "loopscope", "--db", str(db), "collect", "--http-port", "0", *grpc, *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("loopscope collect: OTLP/HTTP on http://127.0.0.1:"), line + proc.stderr.read()  # type: ignore[union-attr]
        endpoints = {"http": line.split("OTLP/HTTP on ")[1].split(",")[0].split()[0]}
        if "OTLP/gRPC on " in line:
            endpoints["grpc"] = line.split("OTLP/gRPC on ")[1].split(",")[0].split()[0]
        yield endpoints
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            _out, err = proc.communicate()
    assert proc.returncode == 0, err


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
    with collect_child(collected, "--no-grpc") as endpoints:
        loopscope.configure(local, tracer_provider=TracerProvider(), otlp_endpoint=endpoints["http"],
                            capture_content=True, flush_interval=0.05)
        record_failed_login()
        loopscope.shutdown()
    for db in (local, collected):
        (error,) = query(db, "SELECT content->>'error' FROM events WHERE type = 'tool_call_end'")
        assert error == ("RuntimeError: login failed for ann (password=[REDACTED])",), db.name
    (status,) = query(collected, "SELECT status_message FROM spans WHERE name = 'execute_tool login'")
    assert status[0].endswith("(password=[REDACTED])") and "hunter2" not in status[0]
