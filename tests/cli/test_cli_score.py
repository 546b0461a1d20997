"""``loopscope score TARGET NAME``: a thumbs-up from a script, written to the store it names, on
what a turn's id (or a prefix of it), a tool call's span id or a response id names there."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from loopscope.cli import main
from recorded import connect_when_free


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def query(db: str, sql: str) -> list[tuple[Any, ...]]:
    con = connect_when_free(Path(db))
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    db = tmp_path_factory.mktemp("demo") / "demo.duckdb"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["demo", "--db", str(db), "--json"]) == 0
    return str(db)


def test_scores_given_on_the_command_line_land_in_the_store_on_what_their_ids_name(demo_db, capsys):
    (turn_id, session_id), *_ = query(demo_db, "SELECT correlation_id, session_id FROM turns ORDER BY timestamp")
    code, out, err = run(capsys, "--db", demo_db, "score", turn_id[:10], "helpful", "--label", "up", "--json")
    assert code == 0, err
    written = json.loads(out)
    assert (written["target"], written["turn_id"], written["session_id"], written["label"], written["source"]) == (
        "turn", turn_id, session_id, "up", "human")
    (tool_span, tool_turn), *_ = query(demo_db, "SELECT span_id, correlation_id FROM events WHERE type = 'tool_call_end' "
                                                "AND tool_outcome = 'failed'")
    code, out, err = run(capsys, "--db", demo_db, "score", tool_span, "retry_needed", "--value", "0",
                         "--explanation", "the service timed out", "--source", "code")
    assert code == 0, err
    assert out.startswith(f"scored tool call {tool_span} of session {session_id}: retry_needed 0.0")
    rows = query(demo_db, "SELECT name, value, label, explanation, source, target, turn_id, tool, found FROM score_targets ORDER BY name")
    assert rows == [
        ("helpful", None, "up", None, "human", "turn", turn_id, None, True),
        ("retry_needed", 0.0, None, "the service timed out", "code", "tool", tool_turn, "book_table", True),
    ]
    # the conventions' event on a span under the scored one (the raw span is not kept: no collector wrote it)
    assert query(demo_db, "SELECT count(*) FROM scores WHERE span_id IS NOT NULL AND trace_id IS NOT NULL") == [(2,)]


@pytest.mark.parametrize(("argv", "says"), [
    (["no-such-id", "helpful", "--value", "1"], "no turn, model call or tool call has the id 'no-such-id'"),
    (["TURN", "helpful"], "a score needs --value, --label or --explanation"),
    (["TURN", " ", "--label", "up"], "a score needs a name"),
])
def test_a_score_the_command_cannot_write_is_one_line_saying_why(demo_db, capsys, argv, says):
    (turn_id,), *_ = query(demo_db, "SELECT correlation_id FROM turns")
    code, out, err = run(capsys, "--db", demo_db, "score", *[turn_id if a == "TURN" else a for a in argv])
    assert (code, out) == (2, "")
    assert err.strip().splitlines() == [f"loopscope: error: {says}" + (f" in {Path(demo_db).resolve()}" if "no-such" in argv[0] else "")]


def test_a_value_that_is_not_a_finite_number_is_refused_by_the_parser(demo_db, capsys):
    code, out, err = run(capsys, "--db", demo_db, "score", "x", "helpful", "--value", "inf")
    assert (code, out) == (2, "") and "not a finite number: 'inf'" in err
