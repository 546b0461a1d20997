"""Content search and filters in the terminal (issue 35): ``loopscope search``, ``--search`` on
``sessions``, ``timeline``, ``turns`` and ``calls``; the filters ``turns --reason --model
--agent --since --min-cost``, ``calls --tool --failed --since`` and ``timeline --type
--failed --tool``, each narrowing to what it names.

One store for the module: the offline demo (session ``demo``: a booking that times out and
is retried), a researcher's session (``research``: priced gpt-4o turns, a failing
``fetch_page``, a turn that hits ``max_rounds`` on gpt-4o-mini) and ``big`` (a tool result
kept in parts).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

import loopscope
from loopscope import demo
from loopscope.cli import _args, main
from loopscope.models import EventType, LoopEndReason


def _research(session: str) -> None:
    with loopscope.turn(session_id=session, agent="researcher", model="gpt-4o", provider="openai",
                        input="Cite sources on the write-ahead log changes.") as turn:
        with turn.round() as rnd:
            rnd.response("Searching first.", tool_calls=[{"id": "r1", "name": "summarize", "arguments": {"text": "wal"}}],
                         usage={"input_tokens": 800, "output_tokens": 40})
        with loopscope.tool("summarize", call_id="r1") as call:
            call.set_result("Checkpoints no longer block readers.")
        turn.generation("Done: checkpoints are non-blocking now.", usage={"input_tokens": 900, "output_tokens": 30},
                        model="gpt-4o", provider="openai")
    with loopscope.turn(session_id=session, agent="researcher", model="gpt-4o-mini", provider="openai",
                        input="Keep digging until you find the commit.") as turn:
        with turn.round() as rnd:
            rnd.response("Fetching the log.", tool_calls=[{"id": "m1", "name": "fetch_page", "arguments": {"url": "u"}}],
                         usage={"input_tokens": 500, "output_tokens": 20})
        try:
            with loopscope.tool("fetch_page", call_id="m1"):
                raise TimeoutError("fetch timed out after 10 s")
        except TimeoutError:
            pass
        turn.end("max_rounds")


def _big(session: str) -> None:
    """A tool result over 64 KiB (kept in parts) with a word far into it."""
    with loopscope.turn(session_id=session, agent="dumper", input="go") as turn:
        with turn.round() as rnd:
            rnd.response("", tool_calls=[{"id": "b1", "name": "dump", "arguments": {}}])
        with loopscope.tool("dump", call_id="b1") as call:
            call.set_result("x" * 100_000 + " needle-in-the-haystack " + "y" * 1000)
        turn.generation("ok")


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("search") / "store.duckdb"
    demo.run(path, session_id="demo")
    loopscope.configure(path, flush_interval=0.05)
    try:
        _research("research")
        _big("big")
    finally:
        loopscope.shutdown()
    return str(path)


def run(capsys: pytest.CaptureFixture[str], db: str, *argv: str) -> Any:
    """``loopscope --db DB ARGV... --json``'s JSON (the command must succeed)."""
    capsys.readouterr()
    code = main(["--db", db, *argv, "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_search_finds_a_tool_a_user_word_a_result_word_and_an_error(db, capsys):
    expected = {
        "summarize": ("research", "tool_call_start", "tool"),
        "write-ahead": ("research", "message", "text"),
        "no longer block": ("research", "tool_call_end", "result"),
        "after 10 s": ("research", "tool_call_end", "error"),
        "timed out after 50": ("demo", "tool_call_end", "error"),
        "LISBON TOMORROW": ("demo", "message", "text"),  # any case
    }
    for text, (session, kind, field) in expected.items():
        hits = run(capsys, db, "search", text)
        assert [(h["session_id"], h["kind"], h["field"]) for h in hits] == [(session, kind, field)], text
        assert text.lower() in hits[0]["snippet"].lower() and hits[0]["turn_id"] and hits[0]["index"] >= 1
        assert [s["session_id"] for s in run(capsys, db, "sessions", "--search", text)] == [session]
        events = run(capsys, db, "timeline", session, "--search", text)  # a tool's name: its start and end
        assert hits[0]["index"] in [e["index"] for e in events] and len(events) <= 2
        assert {e["correlation_id"] for e in events} == {hits[0]["turn_id"]}
        turns = run(capsys, db, "turns", "--search", text)
        assert [t["correlation_id"] for t in turns] == [hits[0]["turn_id"]]
    # a text with a quote or beyond ASCII (which JSON may escape) is looked for in the fields alone
    quoted = run(capsys, db, "search", '"Páteo"')
    assert {(h["session_id"], h["kind"], h["field"]) for h in quoted} == {
        ("demo", "tool_call_start", "arguments"), ("demo", "tool_call_end", "result")
    }
    assert run(capsys, db, "search", "no such words anywhere") == []
    assert run(capsys, db, "sessions", "--search", "no such words anywhere") == []
    # what a model call generated, found among model calls
    calls = run(capsys, db, "calls", "--search", "non-blocking now")
    assert [(c["session_id"], c["position"]) for c in calls] == [("research", 2)]
    # the table names where it matched
    capsys.readouterr()
    assert main(["--db", db, "search", "after 10 s"]) == 0
    out = capsys.readouterr().out
    assert "fetch_page" in out and "error" in out and "(1 place, newest first)" in out
    assert main(["--db", db, "search", "  "]) == 2
    assert "the search text is empty" in capsys.readouterr().err


def test_turn_filters_each_narrow_to_what_they_name(db, capsys):
    every = [t for t in run(capsys, db, "turns") if t["session_id"] != "big"]
    assert len(every) == 4
    by = {t["correlation_id"]: t for t in every}

    def ids(*flags: str) -> set[str]:
        return {t["correlation_id"] for t in run(capsys, db, "turns", *flags)}

    assert ids("--reason", "max_rounds") == {k for k, t in by.items() if t["loop_end_reason"] == "max_rounds"} != set()
    assert ids("--model", "gpt-4o-mini") == {k for k, t in by.items() if t["model"] == "gpt-4o-mini"} != set()
    assert ids("--agent", "concierge") == {k for k, t in by.items() if t["channel_id"] == "concierge"}
    assert len(ids("--agent", "concierge")) == 2
    priced = {k for k, t in by.items() if t["cost_usd"]}
    assert priced and ids("--min-cost", "0.000001") == priced  # the demo's turns have no price
    cheapest = min(by[k]["cost_usd"] for k in priced)
    assert ids("--min-cost", str(cheapest * 1.01)) == priced - {k for k in priced if by[k]["cost_usd"] == cheapest}
    assert ids("--since", "1h") - ids("--agent", "dumper") == set(by)
    tomorrow = (datetime.now(timezone.utc) + timedelta(days=1)).date().isoformat()
    assert ids("--since", tomorrow) == set()
    assert ids("--agent", "researcher", "--reason", "completed") == {
        k for k, t in by.items() if t["channel_id"] == "researcher" and t["loop_end_reason"] == "completed"
    }
    capsys.readouterr()
    assert main(["--db", db, "turns", "--reason", "max_rounds"]) == 0
    assert "max_rounds" in capsys.readouterr().out
    assert main(["--db", db, "turns", "--since", tomorrow]) == 0
    assert "no turns match" in capsys.readouterr().out


def test_calls_filters_and_a_tools_failed_calls(db, capsys):
    failed = run(capsys, db, "calls", "--tool", "fetch_page", "--failed")
    assert [(c["tool"], c["outcome"], c["session_id"]) for c in failed] == [("fetch_page", "failed", "research")]
    assert "after 10 s" in failed[0]["error"] and failed[0]["turn_id"]
    booked = run(capsys, db, "calls", "--tool", "book_table")
    assert {c["tool"] for c in booked} == {"book_table"} and len(booked) == 3
    assert [c["outcome"] for c in run(capsys, db, "calls", "--tool", "book_table", "--failed")] == ["failed"]
    slowest = [c["duration_ms"] for c in run(capsys, db, "calls", "--tool", "book_table", "--slowest")]
    assert slowest == sorted(slowest, reverse=True)
    assert run(capsys, db, "calls", "--tool", "get_weather", "--failed") == []
    models = run(capsys, db, "calls", "--model", "gpt-4o-mini")
    assert {c["request_model"] for c in models} == {"gpt-4o-mini"} and models
    assert len(run(capsys, db, "calls", "--since", "1d")) == len(run(capsys, db, "calls", "--limit", "0"))
    assert run(capsys, db, "calls", "--since", "2099-01-01") == []
    assert run(capsys, db, "calls", "--tool", "book_table", "--since", "2099-01-01T00:00Z") == []
    capsys.readouterr()
    assert main(["--db", db, "calls", "--tool", "fetch_page", "--model", "gpt-4o"]) == 2
    assert "--tool lists tool calls" in capsys.readouterr().err


def test_timeline_filters_by_type_failed_and_tool(db, capsys):
    every = run(capsys, db, "timeline", "demo", "--limit", "0")
    messages = run(capsys, db, "timeline", "demo", "--type", "message")
    assert [e["index"] for e in messages] == [e["index"] for e in every if e["type"] == "message"] != []
    two = run(capsys, db, "timeline", "demo", "--type", "tool_call_start", "--type", "tool_call_end")
    assert {e["type"] for e in two} == {"tool_call_start", "tool_call_end"} and len(two) == len(every) - len(messages)
    failed = run(capsys, db, "timeline", "demo", "--failed")
    assert [(e["type"], e["content"]["tool_name"], e["content"]["outcome"]) for e in failed] == [
        ("tool_call_end", "book_table", "failed")
    ]
    weather = run(capsys, db, "timeline", "demo", "--tool", "get_weather")
    assert {e["content"]["tool_name"] for e in weather} == {"get_weather"} and len(weather) == 4
    assert run(capsys, db, "timeline", "demo", "--tool", "get_weather", "--failed") == []
    capsys.readouterr()
    assert main(["--db", db, "timeline", "demo", "--failed"]) == 0
    assert "(1 of 1 matching)" in capsys.readouterr().out
    assert main(["--db", db, "timeline", "demo", "--type", "nonsense"]) == 2


def test_since_takes_durations_and_iso_dates_and_says_what_it_wants():
    now = datetime(2026, 12, 7, 12, 0, tzinfo=timezone.utc)
    assert _args.since("2h", now=now) == now - timedelta(hours=2)
    assert _args.since("3d", now=now) == now - timedelta(days=3)
    assert _args.since("90s", now=now) == now - timedelta(seconds=90)
    assert _args.since("1w", now=now) == now - timedelta(weeks=1)
    assert _args.since("2026-12-01") == datetime(2026, 12, 1, tzinfo=timezone.utc)
    assert _args.since("2026-12-01T09:30Z") == datetime(2026, 12, 1, 9, 30, tzinfo=timezone.utc)
    assert _args.since("2026-12-01T09:30+02:00") == datetime(2026, 12, 1, 7, 30, tzinfo=timezone.utc)
    for bad in ("yesterday", "2 hours", "-3d", ""):
        with pytest.raises(Exception, match="expected a duration"):
            _args.since(bad)
    # the choices the parser offers are the models' own
    assert set(_args.LOOP_END_REASONS) == {r.value for r in LoopEndReason}
    assert set(_args.EVENT_TYPES) == {t.value for t in EventType}


def test_a_large_value_stored_in_parts_is_found(db, capsys):
    """A tool result over 64 KiB is kept in parts beside its row (storage/duckdb/values.py):
    the search reads them too."""
    hits = run(capsys, db, "search", "needle-in-the-haystack")
    assert [(h["session_id"], h["kind"], h["field"]) for h in hits] == [("big", "tool_call_end", "content")]
    assert [s["session_id"] for s in run(capsys, db, "sessions", "--search", "needle-in-the-haystack")] == ["big"]
