"""What the commands print stays put (issue 29, "Command line"): ``--json`` before or after
the command, the cost in ``turns --json`` and ``sessions --json`` as in their tables, query
tables that cut only when the terminal is too narrow (widest columns first, the first one
last) and floats to 6 significant digits, headers that never change with the data, and
server tools in ``tools --declared``."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import loopscope
from fakes.model_server import FakeModelServer, Reply, ToolCall
from loopscope.cli import build_parser, main


def run(capsys: pytest.CaptureFixture[str], *argv: Any) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def header(out: str) -> list[str]:
    """A table's column names: its first line split on the two-space gap."""
    return [h.strip() for h in out.splitlines()[0].split("  ") if h.strip()]


def cells(out: str) -> list[dict[str, str]]:
    """A printed table's rows by header, cut where the rule line's dashes say (cells may be empty)."""
    top, rule, *lines = out.splitlines()
    spans, start = [], 0
    for dashes in rule.split("  "):
        spans.append((start, start + len(dashes)))
        start += len(dashes) + 2
    names = [top[lo:hi].strip() for lo, hi in spans]
    rows = []
    for line in lines:
        if not line.strip() or line.startswith("("):
            break
        rows.append({name: line[lo:hi].strip() for name, (lo, hi) in zip(names, spans)})
    return rows


ROOT = Path(__file__).resolve().parents[2]
LONG_TOOL = "search_the_knowledge_base"


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Two sessions: ``priced`` (gpt-4o at OpenAI's list price, a tool called) and ``free``
    (a model without a price, a tool that failed), recorded with the hand API."""
    path = tmp_path_factory.mktemp("output") / "store.duckdb"
    loopscope.configure(path, flush_interval=0.05)
    try:
        with loopscope.turn(session_id="priced", agent="support", model="gpt-4o", provider="openai",
                            tools=[{"name": LONG_TOOL}]) as t:
            t.generation("Looking.", usage={"input_tokens": 1000, "output_tokens": 100}, model="gpt-4o",
                         provider="openai", tool_calls=[{"id": "k1", "name": LONG_TOOL, "arguments": {"q": "x"}}])
            with loopscope.tool(LONG_TOOL, arguments={"q": "x"}, call_id="k1") as call:
                call.set_result("found")
            t.generation("Found it.", usage={"input_tokens": 2000, "output_tokens": 50}, model="gpt-4o", provider="openai")
        with loopscope.turn(session_id="free", agent="house", model="house-model", provider="vllm") as t:
            t.generation("Trying.", usage={"input_tokens": 300, "output_tokens": 30}, model="house-model", provider="vllm",
                         tool_calls=[{"id": "b1", "name": "book", "arguments": {}}])
            with pytest.raises(RuntimeError), loopscope.tool("book", arguments={}, call_id="b1"):
                raise RuntimeError("fully booked")
            t.generation("Sorry.", usage={"input_tokens": 400, "output_tokens": 20}, model="house-model", provider="vllm")
        loopscope.flush()
    finally:
        loopscope.shutdown()
    return str(path)


def turn_costs(db: str) -> dict[str, float | None]:
    _, rows = loopscope.Store(db).sql("SELECT session_id, cost_usd FROM turn_summaries")
    return dict(rows)


# -- 1. --json before or after the command ---------------------------------------------------------


JSON_COMMANDS = [
    ["sessions"], ["turns"], ["turns", "priced"], ["timeline", "priced"], ["calls"], ["stats"], ["tools"],
    ["tools", "--declared"], ["sql", "SELECT 1 AS one"], ["status"], ["tail", "-n", "3"],
]


@pytest.mark.parametrize("command", JSON_COMMANDS, ids=lambda c: " ".join(c))
def test_json_goes_before_or_after_the_command(db, capsys, command):
    code, after, err = run(capsys, *command, "--db", db, "--json")
    assert code == 0, err
    code, before, err = run(capsys, "--json", *command, "--db", db)
    assert code == 0, err
    code, first, err = run(capsys, "--json", "--db", db, *command)  # with the other shared flags too
    assert code == 0, err
    assert before == after == first
    if command[0] == "tail":
        assert all(json.loads(line) for line in before.splitlines())  # JSON Lines
    else:
        json.loads(before)


def test_json_before_export_and_demo(tmp_path, capsys):
    code, out, err = run(capsys, "--json", "demo", "--db", tmp_path / "demo.duckdb", "--session", "d")
    assert code == 0, err
    assert json.loads(out)["session_id"] == "d"
    code, out, err = run(capsys, "--json", "export", "--parquet", tmp_path / "out", "--db", tmp_path / "demo.duckdb")
    assert code == 0, err
    assert set(json.loads(out)["tables"]) == {"events", "turns", "tool_calls"}


def test_every_command_that_prints_takes_json_and_the_others_say_they_do_not(capsys):
    parser = build_parser()
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    without = {name for name, sub in commands.choices.items() if not any("--json" in a.option_strings for a in sub._actions)}
    assert without == {"ui", "collect", "run"}  # they print no result: a server, a program's own output
    for name in sorted(without):
        code, out, err = run(capsys, "--json", name)
        assert (code, out) == (2, "")
        assert err.strip().splitlines() == [
            f"loopscope: error: `loopscope {name}` has no JSON output (--json goes with the commands that print)"
        ]


# -- 2. the cost in turns --json and sessions --json -------------------------------------------------


def test_turns_and_sessions_json_carry_the_cost_their_tables_show(db, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    costs = turn_costs(db)
    assert costs["priced"] == pytest.approx(0.0035 + 0.0055) and costs["free"] is None
    code, out, err = run(capsys, "turns", "--db", db, "--json")
    assert code == 0, err
    assert {t["session_id"]: t["cost_usd"] for t in json.loads(out)} == costs  # null: no price
    _, out, _ = run(capsys, "turns", "--db", db)
    assert {r["SESSION"]: r["COST"] for r in cells(out)} == {"priced": "$0.0090", "free": "-"}
    code, out, err = run(capsys, "sessions", "--db", db, "--json")
    assert code == 0, err
    assert {s["session_id"]: s["cost_usd"] for s in json.loads(out)} == costs
    _, out, _ = run(capsys, "sessions", "--db", db)
    assert {r["SESSION"]: r["COST"] for r in cells(out)} == {"priced": "$0.0090", "free": "-"}
    # a session's turns alone, and the demo's
    _, out, _ = run(capsys, "turns", "free", "--db", db, "--json")
    assert [t["cost_usd"] for t in json.loads(out)] == [None]


# -- 3. query tables: cut only when too narrow, widest first; floats rounded ------------------------


def test_sql_keeps_the_first_column_whole_and_rounds_floats(db, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    code, out, err = run(capsys, "sql", "SELECT * FROM tool_stats ORDER BY tool", "--db", db)
    assert code == 0, err
    assert all(len(line) <= 250 for line in out.splitlines())
    rows = cells(out)
    assert [r["tool"] for r in rows] == ["book", LONG_TOOL]  # the first column whole
    _, [(avg_ms,)] = loopscope.Store(db).sql(f"SELECT avg_ms FROM tool_stats WHERE tool = '{LONG_TOOL}'")
    shown = next(r["avg_ms"] for r in rows if r["tool"] == LONG_TOOL)
    assert shown == f"{avg_ms:.6g}" and float(shown) == pytest.approx(avg_ms, rel=1e-5)
    # a table that fits is not cut at all
    code, out, _ = run(capsys, "sql", "SELECT tool, calls, failure_share FROM tool_stats ORDER BY tool", "--db", db)
    assert [list(r.values()) for r in cells(out)] == [["book", "1", "1"], [LONG_TOOL, "1", "0"]]
    assert "…" not in out
    # too narrow: the widest columns give up width first, the first one last
    monkeypatch.setenv("COLUMNS", "80")
    _, out, _ = run(capsys, "sql", "SELECT tool, first_seen, last_seen, agents FROM tool_stats ORDER BY tool", "--db", db)
    rows = cells(out)
    assert [r["tool"] for r in rows] == ["book", LONG_TOOL]
    assert all(r["first_seen"].endswith("…") for r in rows) and all(len(line) <= 80 for line in out.splitlines())


def test_sql_floats_print_rounded_and_json_keeps_every_digit(db, capsys):
    query = ("SELECT 0.1::DOUBLE + 0.2::DOUBLE AS sum, 0.0000204::DOUBLE * 10 AS tiny, 1234567.891::DOUBLE AS big, "
             "2.0::DOUBLE AS two, 'x' AS t")
    code, out, err = run(capsys, "sql", query, "--db", db)
    assert code == 0, err
    assert [list(r.values()) for r in cells(out)] == [["0.3", "0.000204", "1234568", "2", "x"]]
    code, out, err = run(capsys, "sql", query, "--db", db, "--json")
    assert json.loads(out)[0]["sum"] == 0.30000000000000004 and json.loads(out)[0]["tiny"] == 0.00020400000000000003


# -- 4. headers that never change with the data -----------------------------------------------------


def test_turns_headers_are_the_same_whatever_the_turns_hold(db, capsys):
    headers = set()
    for width in ("60", "120", "250"):
        for session in ("priced", "free"):  # one priced, one not; one tool round each
            with pytest.MonkeyPatch.context() as patch:
                patch.setenv("COLUMNS", width)
                code, out, err = run(capsys, "turns", session, "--db", db)
            assert code == 0, err
            headers.add(tuple(header(out)))
    assert headers == {("ENDED", "AGENT", "MODEL", "MODEL CALLS", "TOOL ROUNDS", "TOOLS", "TOKENS IN/OUT", "COST", "MS",
                        "END", "FINAL SEGMENT")}


def test_sessions_and_calls_keep_their_cost_column_without_a_price(db, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    _, out, _ = run(capsys, "sessions", "--db", db, "--search", "free")
    assert header(out) == ["SESSION", "EVENTS", "TURNS", "COST", "FIRST", "LAST", "AGENTS"]
    assert [r["COST"] for r in cells(out)] == ["-"]
    _, out, _ = run(capsys, "calls", "--db", db, "--session", "free")
    assert "COST" in header(out) and [r["COST"] for r in cells(out)] == ["-", "-"]
    _, out, _ = run(capsys, "stats", "--db", db)
    models = out.split("Model calls")[1]
    assert next(r["COST"] for r in cells(models.strip()) if r["MODEL"] == "house-model") == "-"


def test_tools_columns_are_the_same_whatever_the_calls_did(tmp_path, capsys):
    """Only served calls, or a failed one and one still running: the same columns."""
    expected = ["TOOL", "CALLS", "SERVED", "FAILED", "REFUSED", "BLOCKED", "UNSERVED", "CANCELLED", "NOT SERVED", "P50",
                "P95", "P99", "LAST SEEN"]
    path = tmp_path / "tools.duckdb"
    loopscope.configure(path, flush_interval=0.05)
    try:
        with loopscope.turn(session_id="s", agent="a") as t:
            t.generation("x", tool_calls=[{"id": "c1", "name": "lookup", "arguments": {}}])
            with loopscope.tool("lookup", call_id="c1") as call:
                call.set_result("ok")
        loopscope.flush()
        code, out, err = run(capsys, "tools", "--db", path)
        assert code == 0, err
        assert header(out) == expected
        assert "running now" not in out
        with loopscope.turn(session_id="s", agent="a") as t:
            t.generation("y", tool_calls=[{"id": "c2", "name": "book", "arguments": {}}, {"id": "c3", "name": "wait"}])
            with pytest.raises(ValueError), loopscope.tool("book", call_id="c2"):
                raise ValueError("no")
            with loopscope.tool("wait", call_id="c3"):
                loopscope.flush()
                code, out, err = run(capsys, "tools", "--db", path)
    finally:
        loopscope.shutdown()
    assert code == 0, err
    assert header(out) == expected
    assert out.splitlines()[-1] == "(running now: wait 1)"
    assert {r["TOOL"]: r["FAILED"] for r in cells(out)} == {"lookup": "0", "book": "1", "wait": "0"}


# -- 5. server tools in tools --declared ------------------------------------------------------------

WEB_SEARCH = {"type": "web_search_20250305", "name": "web_search", "max_uses": 2}
LOOKUP = {"name": "lookup", "description": "Look an order up", "input_schema": {"type": "object", "properties": {}}}


def test_tools_declared_lists_server_tools(instrumented: Any, model_server: FakeModelServer, capsys, monkeypatch):
    """A turn whose only tool is Anthropic's web search, and one with a tool of the
    application's beside it, through the real anthropic SDK."""
    monkeypatch.setenv("COLUMNS", "200")
    client = model_server.anthropic_client()
    model_server.queue(Reply(text="It is sunny in Lisbon."))
    with loopscope.turn(session_id="search", agent="researcher"):
        client.messages.create(model="claude-sonnet-4-5", max_tokens=100, tools=[WEB_SEARCH],
                               messages=[{"role": "user", "content": "Weather in Lisbon?"}])
    loopscope.flush()
    code, out, err = run(capsys, "tools", "--declared", "--db", instrumented.db)
    assert code == 0, err
    assert [(r["AGENT"], r["TOOL"], r["KIND"], r["OFFERED"], r["CALLS"]) for r in cells(out)] == [
        ("researcher", "web_search", "server", "1", "0")]
    assert "offered but never called" not in out  # its uses run at Anthropic, not here
    [turn] = instrumented.store.list_turns("search")
    assert [(t.name, t.type) for t in turn.declared_tools] == [("web_search", "web_search_20250305")]

    model_server.queue(Reply(tool_calls=[ToolCall("lookup", {}, id="toolu_1")]), Reply(text="Found it."))
    with loopscope.turn(session_id="mixed", agent="support"):
        messages: list[Any] = [{"role": "user", "content": "Where is my order?"}]
        first = client.messages.create(model="claude-sonnet-4-5", max_tokens=100, tools=[LOOKUP, WEB_SEARCH],
                                       messages=messages)
        messages += [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "shipped"}]}]
        client.messages.create(model="claude-sonnet-4-5", max_tokens=100, tools=[LOOKUP, WEB_SEARCH], messages=messages)
    loopscope.flush()
    code, out, err = run(capsys, "tools", "--declared", "--agent", "support", "--db", instrumented.db, "--json")
    assert code == 0, err
    assert sorted((r["tool"], r["kind"], r["turns_offered"], r["calls"]) for r in json.loads(out)) == [
        ("lookup", "client", 1, 1), ("web_search", "server", 1, 0)]


def test_tools_declared_on_turns_without_tools_says_so(recording, capsys):
    with loopscope.turn(session_id="plain", agent="chat") as t:
        t.generation("Hello.")
    loopscope.flush()
    code, out, err = run(capsys, "tools", "--declared", "--db", recording.db)
    assert code == 0, err
    assert out.strip() == "no tools offered or called in 1 turn"
    code, out, _ = run(capsys, "tools", "--declared", "--agent", "nobody", "--db", recording.db)
    assert out.strip() == "no turns of agent 'nobody' yet"


# -- also found: an SQL error in a fresh process ---------------------------------------------------


def test_bad_sql_in_a_fresh_process_says_sql_failed(db):
    """The store's connections use DuckDB's engine module (``_duckdb``), not the package: its
    errors are DuckDB's all the same."""
    done = subprocess.run(
        [sys.executable, "-m", "loopscope", "sql", "SELEC * FROM events", "--db", db],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60, check=False,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.splitlines() == ['loopscope: error: SQL failed: Parser Error: syntax error at or near "SELEC"']
