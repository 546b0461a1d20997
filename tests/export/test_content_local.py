"""The content policy on the local store: secrets masked, the redaction hook and a size cap
applied in the writer before anything reaches the file, the same as over OTLP."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider

import loopscope
import recorded
from loopscope.content.policy import DEFAULT_PATTERNS, ContentPolicy
from loopscope.ingest.otlp.collector import Collector
from loopscope.storage.duckdb.connection import open_store

KEY = "sk-proj-ABCDEFGHIJKLMNOPQRSTUVWX1234"
BEARER = "Bearer eyZ0b2tlbi1mb3ItdGhlLWFwaQ.abcdef123456"
PASSWORD = "hunter2-correct-horse"
SECRETS = (KEY, BEARER.split()[1], PASSWORD)


def record(session: str = "sec") -> None:
    """One turn whose input, round text, thinking, tool arguments, result and error, and
    a state snapshot all carry secrets."""

    @loopscope.tool
    def login(user: str, password: str) -> dict[str, Any]:
        return {"token": KEY, "header": f"Authorization: {BEARER}", "user": user}

    @loopscope.tool
    def fetch(url: str) -> str:
        raise RuntimeError(f"fetch {url} failed with password={PASSWORD}")

    with loopscope.turn(session_id=session, agent="ops", input=f"log me in, my key is {KEY} and password={PASSWORD}",
                        model="m", provider="openai") as t:
        t.generation(f"Logging in with {BEARER} now.", thinking=f"the user gave {KEY}", tool_calls=[
            {"id": "c1", "name": "login", "arguments": {"user": "ann", "password": PASSWORD}},
            {"id": "c2", "name": "fetch", "arguments": {"url": f"https://x.test/?q=password={PASSWORD}"}},
        ])
        login("ann", PASSWORD)
        with pytest.raises(RuntimeError):
            fetch(f"https://x.test/?q=password={PASSWORD}")
        loopscope.state_snapshot({"auth": {"api_key": KEY, "note": f"send {BEARER}"}, "step": 2})
        t.generation("Done, ann.", finish_reason="stop")


def raw_bytes(db: Path) -> bytes:
    """Every byte of the store's files (the WAL too, if one is left)."""
    return recorded.store_bytes(db)


def timeline(db: Path, session: str = "sec") -> list[tuple[str, dict[str, Any]]]:
    with open_store(str(db.resolve()), read_only=True) as con:
        rows = con.execute("SELECT type, content::VARCHAR FROM events WHERE session_id = ? ORDER BY idx", [session]).fetchall()
    return [(kind, json.loads(content)) for kind, content in rows]


def turn_row(db: Path, session: str = "sec") -> dict[str, Any]:
    with open_store(str(db.resolve()), read_only=True) as con:
        names = ["response_content", "segments", "thinking"]
        row = con.execute("SELECT response_content, segments::VARCHAR, thinking FROM turns WHERE session_id = ?", [session]).fetchone()
    return dict(zip(names, row))


def assert_no_secret(db: Path) -> None:
    data = raw_bytes(db)
    for secret in SECRETS:
        assert secret.encode() not in data, f"{secret!r} reached {db.name}"


def test_secrets_never_reach_the_store_file(tmp_path):
    db = tmp_path / "s.duckdb"
    loopscope.configure(db, tracer_provider=TracerProvider(), flush_interval=0.05)
    record()
    loopscope.shutdown()
    assert_no_secret(db)
    events = timeline(db)
    assert [k for k, _ in events] == [
        "message", "message", "tool_call_start", "tool_call_end", "tool_call_start", "tool_call_end", "state_snapshot", "message",
    ]
    user, said = events[0][1], events[1][1]
    assert user["body"] == "log me in, my key is [REDACTED] and password=[REDACTED]"
    assert said["body"] == "Logging in with Bearer [REDACTED] now."  # the scheme stays
    login = next(c for k, c in events if k == "tool_call_end" and c["tool_name"] == "login")
    assert login["arguments"] == {"user": "ann", "password": "[REDACTED]"}  # still JSON, not a string
    assert login["result"] == {"token": "[REDACTED]", "header": "Authorization: Bearer [REDACTED]", "user": "ann"}
    fetch = next(c for k, c in events if k == "tool_call_end" and c["tool_name"] == "fetch")
    assert fetch["arguments"] == {"url": "https://x.test/?q=password=[REDACTED]"}
    assert fetch["error"] == "RuntimeError: fetch https://x.test/?q=password=[REDACTED] failed with password=[REDACTED]"
    assert events[6][1] == {"snapshot": {"auth": {"api_key": "[REDACTED]", "note": "send Bearer [REDACTED]"}, "step": 2}}
    turn = turn_row(db)
    assert turn["thinking"] == "the user gave [REDACTED]"
    assert turn["response_content"].startswith("Logging in with Bearer [REDACTED] now.")
    assert "[REDACTED]" in turn["segments"] and json.loads(turn["segments"])


def test_secrets_reach_neither_store_when_exporting_to_a_collector_with_capture_on(tmp_path):
    local = tmp_path / "local.duckdb"
    with Collector(str(tmp_path / "collected.duckdb"), http_port=0, grpc_port=None, flush_interval=0.05) as collector:
        loopscope.configure(local, tracer_provider=TracerProvider(), otlp_endpoint=collector.http_endpoint,
                            capture_content=True, flush_interval=0.05)
        record()
        loopscope.shutdown()
    collected = Path(collector.db)
    assert_no_secret(local)
    assert_no_secret(collected)  # its events and turns, and the raw spans table
    with open_store(str(collected), read_only=True) as con:
        raw = con.execute("SELECT count(*) FROM spans WHERE attributes::VARCHAR LIKE '%[REDACTED]%'").fetchone()[0]
    assert raw >= 3  # the content did arrive, masked
    assert timeline(collected) == timeline(local)


def test_a_custom_pattern_and_the_hook_apply_in_both_destinations(tmp_path):
    policy = ContentPolicy(
        capture=True,
        patterns=[*DEFAULT_PATTERNS, r"ACME-\d{6}"],  # \d: every value is looked at in Python
        redact=lambda where, text: text.replace("ann", "<user>"),
    )
    local = tmp_path / "local.duckdb"
    with Collector(str(tmp_path / "collected.duckdb"), http_port=0, grpc_port=None, flush_interval=0.05) as collector:
        loopscope.configure(local, tracer_provider=TracerProvider(), otlp_endpoint=collector.http_endpoint,
                            content_policy=policy, flush_interval=0.05)

        @loopscope.tool
        def lookup(account: str) -> str:
            return f"account {account} belongs to ann"

        with loopscope.turn(session_id="custom", agent="ops", input="who owns ACME-123456?") as t:
            t.generation("Looking up ACME-123456 for ann.", tool_calls=[{"id": "k", "name": "lookup", "arguments": {"account": "ACME-123456"}}])
            lookup("ACME-123456")
            t.generation("It is ann's.", finish_reason="stop")
        loopscope.shutdown()
    for db in (local, Path(collector.db)):
        data = raw_bytes(db)
        assert b"ACME-123456" not in data and b"belongs to ann" not in data
        events = timeline(db, "custom")
        assert events[0][1]["body"] == "who owns [REDACTED]?"
        assert events[1][1]["body"] == "Looking up [REDACTED] for <user>."
        end = next(c for k, c in events if k == "tool_call_end")
        assert end["arguments"] == {"account": "[REDACTED]"} and end["result"] == "account [REDACTED] belongs to <user>"


def test_a_pattern_the_prefilter_can_stand_in_for(tmp_path):
    # no \d or \w: RE2 picks the values, Python's expression masks them
    db = tmp_path / "s.duckdb"
    loopscope.configure(db, tracer_provider=TracerProvider(), flush_interval=0.05,
                        content_policy=ContentPolicy(patterns=[r"TICKET-[0-9]{4}"], key_values=False))
    with loopscope.turn(session_id="t", input="close TICKET-1234 and ticket-9999, password=open") as t:
        t.generation("ok", finish_reason="stop")
    loopscope.shutdown()
    assert timeline(db, "t")[0][1]["body"] == "close [REDACTED] and ticket-9999, password=open"


def test_the_size_cap_marks_what_it_cut_and_keeps_json_valid(tmp_path):
    db = tmp_path / "s.duckdb"
    loopscope.configure(db, tracer_provider=TracerProvider(), flush_interval=0.05,
                        content_policy=ContentPolicy(store_max_chars=100))

    @loopscope.tool
    def dump(n: int) -> dict[str, Any]:
        return {"rows": ["r" * 10] * n}

    @loopscope.tool
    def page(url: str) -> str:
        return "p" * 1000

    with loopscope.turn(session_id="cap", input="x" * 250) as t:
        t.generation("y" * 300, tool_calls=[{"id": "d", "name": "dump", "arguments": {"n": 40}},
                                            {"id": "p", "name": "page", "arguments": {"url": "u"}}])
        dump(40)
        page("u")
        loopscope.state_snapshot({"big": "z" * 500, "small": 1})
        t.generation("done", finish_reason="stop")
    loopscope.shutdown()
    events = timeline(db, "cap")
    assert events[0][1]["body"] == "x" * 100 + "…[truncated: 250 chars]"
    assert events[1][1]["body"] == "y" * 100 + "…[truncated: 300 chars]"
    end = next(c for k, c in events if k == "tool_call_end" and c["tool_name"] == "dump")
    # many short strings: the text is cut, and kept as a JSON string
    result = json.dumps({"rows": ["r" * 10] * 40})
    assert end["result"] == result[:100] + f"…[truncated: {len(result)} chars]"
    assert end["arguments"] == {"n": 40}  # under the cap: as it was
    # one long string: the string is cut (its JSON quotes not counted)
    end = next(c for k, c in events if k == "tool_call_end" and c["tool_name"] == "page")
    assert end["result"] == "p" * 100 + "…[truncated: 1000 chars]"
    state = next(c for k, c in events if k == "state_snapshot")
    # the snapshot's JSON stays an object; its long value is cut
    assert state == {"snapshot": {"big": "z" * 100 + "…[truncated: 500 chars]", "small": 1}}
    turn = turn_row(db, "cap")
    assert json.loads(turn["segments"])[0] == "y" * 100 + "…[truncated: 300 chars]"


def _rows(db: Path) -> list[tuple[Any, ...]]:
    with open_store(str(db.resolve()), read_only=True) as con:
        # the duration of a tool call differs between two runs: left out
        events = con.execute("SELECT id, type, regexp_replace(content::VARCHAR, '\"duration_ms\":[0-9.]+', '') "
                             "FROM events ORDER BY session_id, idx").fetchall()
        turns = con.execute("SELECT correlation_id, response_content, segments::VARCHAR, thinking, error FROM turns ORDER BY 1").fetchall()
    return events + turns


def test_values_without_secrets_are_stored_byte_for_byte(tmp_path):
    """What no pattern changes is stored exactly as with the policy off, even text the
    prefilter picks (words like "secret", "sk-" without a key, JSON with odd spacing)."""

    def run(db: Path, policy: ContentPolicy) -> list[tuple[Any, ...]]:
        loopscope.configure(db, tracer_provider=TracerProvider(), flush_interval=0.05, content_policy=policy)

        @loopscope.tool
        def note(text: str) -> str:
            return '{"kept":   "as is",  "secret_word": "secret", "n": 1.50}'

        with loopscope.turn(session_id="plain", agent="a", input="the secret is out; sk-short; a bearer, é ü 😀") as t:
            t.generation("an Authorization header, the pwd", thinking="api key rotation is due",
                         tool_calls=[{"id": "n", "name": "note", "arguments": {"text": "no password here"}}])
            note("no password here")
            loopscope.state_snapshot({"secret":  None, "list": [1, 2]})
            t.generation("done", finish_reason="stop")
        loopscope.shutdown()
        return _rows(db)

    masked = run(tmp_path / "masked.duckdb", ContentPolicy())
    plain = run(tmp_path / "plain.duckdb", ContentPolicy(patterns=(), key_values=False, store_max_chars=0))
    assert len(masked) == len(plain) == 7
    # the first value of each row is an id made of trace and span ids, which differ between runs
    assert [r[1:] for r in masked] == [r[1:] for r in plain]
    assert "[REDACTED]" not in repr(masked)


def test_a_hook_that_breaks_json_still_leaves_json(tmp_path):
    db = tmp_path / "s.duckdb"
    policy = ContentPolicy(redact=lambda where, text: text.replace("}", ")"))
    loopscope.configure(db, tracer_provider=TracerProvider(), flush_interval=0.05, content_policy=policy)

    @loopscope.tool
    def echo(q: str) -> dict[str, str]:
        return {"q": q}

    with loopscope.turn(session_id="j") as t:
        t.generation("go", tool_calls=[{"id": "e", "name": "echo", "arguments": {"q": "a}b"}}])
        echo("a}b")
        t.generation("done", finish_reason="stop")
    assert loopscope.flush(60)  # written before the close's bound (5 s) could cut a loaded machine's writer off
    loopscope.shutdown()
    end = next(c for k, c in timeline(db, "j") if k == "tool_call_end")
    # masked value by value: the strings changed, the objects stayed objects
    assert end["arguments"] == {"q": "a)b"} and end["result"] == {"q": "a)b"}


def test_a_failing_hook_keeps_nothing_of_the_value(tmp_path, caplog):
    def hook(where: str, text: str) -> str:
        if "private" in text:
            raise ValueError("the hook broke")
        return text

    db = tmp_path / "s.duckdb"
    loopscope.configure(db, tracer_provider=TracerProvider(), flush_interval=0.05, content_policy=ContentPolicy(redact=hook))
    with loopscope.turn(session_id="h", input="private notes") as t:
        t.generation("public answer", finish_reason="stop")
    assert loopscope.flush(60)  # written before the close's bound (5 s) could cut a loaded machine's writer off
    loopscope.shutdown()
    assert [c["body"] for _, c in timeline(db, "h")] == ["[REDACTED]", "public answer"]
    assert b"private notes" not in raw_bytes(db)
    assert "the content policy failed" in caplog.text
