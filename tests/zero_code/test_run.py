"""Zero-code start: an unmodified app under ``loopscope run`` and ``opentelemetry-instrument``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import loopscope
from fakes.model_server import FakeModelServer, Reply, ToolCall, Usage

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "examples" / "openai_tool_loop.py"
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.skipif(not (BIN / "loopscope").exists(), reason="the loopscope console script is not installed")


def _script(server: FakeModelServer) -> None:
    server.queue(
        Reply(
            text="Let me look.",
            tool_calls=[ToolCall("get_weather", {"city": "Paris"}), ToolCall("get_time", {"city": "Paris"})],
            usage=Usage(120, 30),
        ),
        Reply(text="21 °C and clear; it is 19:30 in Paris.", usage=Usage(200, 15)),
    )


def _env(server: FakeModelServer, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "LOOPSCOPE_"))}
    env.update(
        OPENAI_BASE_URL=server.openai_base_url,
        OPENAI_API_KEY="sk-test-zero-code-secret",
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH="",
        **extra,
    )
    return env


def _run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, check=False, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


def _check_turn(db: Path) -> None:
    store = loopscope.Store(str(db))
    sessions = store.list_sessions()
    assert len(sessions) == 1
    session = sessions[0].session_id
    (turn,) = store.list_turns(session)
    assert turn.loop_end_reason is loopscope.LoopEndReason.COMPLETED
    assert turn.segments == ["Let me look.", "21 °C and clear; it is 19:30 in Paris."]
    assert (turn.tool_calls_count, turn.round_count) == (2, 1)
    assert turn.usage["input_tokens"] == 320 and turn.usage["output_tokens"] == 45
    assert [t.name for t in turn.declared_tools] == ["get_weather", "get_time"]
    assert turn.model == "gpt-4o-mini" and turn.provider == "openai"
    events = store.get_timeline(session)
    kinds = [(e.type, getattr(e.content, "tool_name", None)) for e in events]
    assert kinds == [
        ("message", None),  # the user's question
        ("message", None),
        ("tool_call_start", "get_weather"),
        ("tool_call_start", "get_time"),
        ("tool_call_end", "get_weather"),
        ("tool_call_end", "get_time"),
        ("message", None),
    ]
    ends = [e.content for e in events if e.type == "tool_call_end"]
    assert ends[0].result == {"city": "Paris", "temp_c": 21, "sky": "clear"}
    assert ends[1].result == {"city": "Paris", "time": "19:30"}
    assert all(c.outcome == "served" and c.status == "completed" for c in ends)
    _names, rows = store.sql("SELECT count(*) FROM events WHERE CAST(content AS VARCHAR) LIKE '%sk-test-zero-code%'")
    assert rows == [(0,)]  # the API key is nowhere in the store


def test_loopscope_run_records_an_unmodified_app(tmp_path: Path, model_server: FakeModelServer) -> None:
    _script(model_server)
    db = tmp_path / "agent.duckdb"
    proc = _run(
        [str(BIN / "loopscope"), "--db", str(db), "run", "--", sys.executable, str(APP), "Weather in Paris?"],
        _env(model_server),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "21 °C and clear; it is 19:30 in Paris."
    _check_turn(db)


def test_run_passes_the_exit_status_and_streams_through(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOPSCOPE_")}
    code = "import sys; print('out'); print('err', file=sys.stderr); sys.exit(7)"
    proc = _run([str(BIN / "loopscope"), "--db", str(tmp_path / "s.duckdb"), "run", sys.executable, "-c", code], env, tmp_path)
    assert (proc.returncode, proc.stdout, proc.stderr) == (7, "out\n", "err\n")


def test_run_keeps_the_apps_own_sitecustomize(tmp_path: Path, model_server: FakeModelServer) -> None:
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nos.environ['APP_SITECUSTOMIZE_RAN'] = 'yes'\n")
    code = (
        "import os, sys; i = sys.modules['loopscope.instrument']; "
        "print(os.environ.get('APP_SITECUSTOMIZE_RAN'), 'openai' in i._wanted)"
    )
    env = _env(model_server)
    env["PYTHONPATH"] = str(own)
    proc = _run([str(BIN / "loopscope"), "--db", str(tmp_path / "s.duckdb"), "run", "--", sys.executable, "-c", code], env, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["yes", "True"]


def test_run_disable_leaves_a_library_alone(tmp_path: Path, model_server: FakeModelServer) -> None:
    _script(model_server)
    db = tmp_path / "agent.duckdb"
    proc = _run(
        [str(BIN / "loopscope"), "--db", str(db), "run", "--disable", "openai", "--", sys.executable, str(APP)],
        _env(model_server),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert loopscope.Store(str(db)).list_sessions() == []


def test_run_errors_are_one_line(tmp_path: Path) -> None:
    for argv, message in (
        (["run"], "nothing to run"),
        (["run", "--", "no-such-program-xyz"], "command not found: no-such-program-xyz"),
        (["run", "--disable", "nosuch", "--", "true"], "unknown adapters nosuch"),
    ):
        proc = _run([str(BIN / "loopscope"), "--db", str(tmp_path / "s.duckdb"), *argv], dict(os.environ), tmp_path)
        assert proc.returncode == 2
        assert message in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.skipif(not (BIN / "opentelemetry-instrument").exists(), reason="opentelemetry-distro is not installed")
def test_opentelemetry_instrument_finds_loopscope(tmp_path: Path, model_server: FakeModelServer) -> None:
    _script(model_server)
    db = tmp_path / "agent.duckdb"
    env = _env(
        model_server,
        LOOPSCOPE_DB=str(db),
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        OTEL_SERVICE_NAME="weather-agent",
    )
    proc = _run([str(BIN / "opentelemetry-instrument"), sys.executable, str(APP)], env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    _check_turn(db)
