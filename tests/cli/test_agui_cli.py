"""``loopscope import --agui FILE`` and ``loopscope export --agui SESSION`` as a user runs them."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from ag_ui.core import (
    CustomEvent,
    RunFinishedEvent,
    RunStartedEvent,
    TextMessageChunkEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)
from ag_ui.encoder import EventEncoder

from loopscope import Store
from loopscope.cli import main

T0 = 1_767_000_000_000


def stream(thread: str = "th-cli") -> str:
    encoder = EventEncoder()
    return "".join(encoder.encode(e) for e in [
        RunStartedEvent(thread_id=thread, run_id="r1", timestamp=T0),
        TextMessageChunkEvent(message_id="m1", delta="Checking.", timestamp=T0 + 1),
        ToolCallStartEvent(tool_call_id="c1", tool_call_name="lookup", timestamp=T0 + 2),
        ToolCallEndEvent(tool_call_id="c1", timestamp=T0 + 3),
        ToolCallResultEvent(message_id="t1", tool_call_id="c1", content="found", timestamp=T0 + 10),
        CustomEvent(name="progress", value={"pct": 100}, timestamp=T0 + 11),
        TextMessageChunkEvent(message_id="m2", delta="Found it.", timestamp=T0 + 12),
        RunFinishedEvent(thread_id=thread, run_id="r1", timestamp=T0 + 20),
    ])


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, out: str, err: str, *needles: str) -> None:
    assert (code, out) == (2, "")
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("loopscope: error: "), err
    for needle in needles:
        assert needle in lines[0]


@pytest.fixture
def sse_file(tmp_path: Path) -> Path:
    path = tmp_path / "run.sse"
    path.write_text(stream(), encoding="utf-8")
    return path


def test_import_prints_what_it_stored_and_the_timeline_shows_it(capsys, tmp_path, sse_file):
    db = tmp_path / "s.duckdb"
    code, out, err = run(capsys, "import", "--agui", sse_file, "--db", db)
    assert (code, err) == (0, "")
    assert out == f"imported 8 of 8 AG-UI events into {db}: 1 runs, 4 timeline rows, 1 turns (session th-cli)\n"
    events = Store(str(db)).get_timeline("th-cli")
    assert [(e.type, getattr(e.content, "body", None) or e.content.tool_name) for e in events] == [
        ("message", "Checking."), ("tool_call_start", "lookup"), ("tool_call_end", "lookup"), ("message", "Found it."),
    ]
    code, out, _ = run(capsys, "turns", "th-cli", "--db", db, "--json")
    [turn] = json.loads(out)
    assert (turn["correlation_id"], turn["tool_calls_count"], turn["loop_end_reason"]) == ("r1", 1, "completed")


def test_import_twice_skips_the_stored_runs(capsys, tmp_path, sse_file):
    db = tmp_path / "s.duckdb"
    assert run(capsys, "import", "--agui", sse_file, "--db", db)[0] == 0
    code, out, _ = run(capsys, "import", "--agui", sse_file, "--db", db, "--json")
    assert code == 0
    data = json.loads(out)
    assert (data["received"], data["stored_events"], data["rows"], data["turns"], data["skipped_runs"]) == (8, 0, 0, 0, ["r1"])
    assert Store(str(db)).get_event_count("th-cli") == 4


def test_import_under_another_session_and_from_stdin(capsys, tmp_path, monkeypatch):
    db = tmp_path / "s.duckdb"
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stream().encode())))
    code, out, _ = run(capsys, "import", "--agui", "-", "--session", "mine", "--db", db)
    assert code == 0 and "(session mine)" in out
    assert Store(str(db)).get_event_count("mine") == 4 and Store(str(db)).get_event_count("th-cli") == 0


def test_export_gives_the_imported_stream_back(capsys, tmp_path, sse_file):
    db = tmp_path / "s.duckdb"
    run(capsys, "import", "--agui", sse_file, "--db", db)
    code, out, err = run(capsys, "export", "--agui", "th-cli", "--db", db)
    assert (code, err) == (0, "")
    assert out == sse_file.read_text(encoding="utf-8")
    target = tmp_path / "out.sse"
    code, out, err = run(capsys, "export", "--agui", "th-c", "--db", db, "-o", target)  # a unique prefix works
    assert (code, out) == (0, "")
    assert err == f"wrote 8 AG-UI events of session th-cli to {target}\n"
    assert target.read_text(encoding="utf-8") == sse_file.read_text(encoding="utf-8")


def test_export_of_one_run(capsys, tmp_path, sse_file):
    db = tmp_path / "s.duckdb"
    run(capsys, "import", "--agui", sse_file, "--db", db)
    code, out, _ = run(capsys, "export", "--agui", "th-cli", "--run", "r1", "--db", db)
    assert (code, out) == (0, sse_file.read_text(encoding="utf-8"))
    code, out, err = run(capsys, "export", "--agui", "th-cli", "--run", "r9", "--db", db)
    assert_one_line_error(code, out, err, "no run 'r9' in session 'th-cli'")


def test_a_malformed_stream_is_one_error_line_naming_the_line(capsys, tmp_path, sse_file):
    db = tmp_path / "s.duckdb"
    broken = tmp_path / "broken.sse"
    broken.write_text(stream().replace('"toolCallName":"lookup"', '"toolCallName":'), encoding="utf-8")
    code, out, err = run(capsys, "import", "--agui", broken, "--db", db)
    assert_one_line_error(code, out, err, "line 5: not JSON")
    assert not db.exists()
    code, out, err = run(capsys, "import", "--agui", tmp_path / "missing.sse", "--db", db)
    assert_one_line_error(code, out, err, "no file", "missing.sse")


def test_export_of_an_unknown_session_and_without_a_mode(capsys, tmp_path, sse_file):
    db = tmp_path / "s.duckdb"
    run(capsys, "import", "--agui", sse_file, "--db", db)
    code, out, err = run(capsys, "export", "--agui", "nope", "--db", db)
    assert_one_line_error(code, out, err, "no session 'nope'")
    code, out, err = run(capsys, "export", "--db", db)
    assert code == 2 and "one of the arguments --parquet --agui is required" in err
    code, out, err = run(capsys, "export", "--parquet", tmp_path / "pq", "--run", "r1", "--db", db)
    assert_one_line_error(code, out, err, "--run goes with --agui, not --parquet")
    assert not (tmp_path / "pq").exists()
