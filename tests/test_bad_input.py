"""Values that are not JSON, and store paths that cannot work."""

from __future__ import annotations

import datetime as dt
import decimal
import os
from pathlib import Path

import pytest

import loopscope


class Opaque:
    def __repr__(self) -> str:
        return "<Opaque thing>"


class Hostile:
    def __repr__(self) -> str:
        raise RuntimeError("repr refuses")


def test_unserializable_arguments_and_results_are_stored_readably(recording):
    cyclic: dict = {"name": "loop"}
    cyclic["self"] = cyclic

    @loopscope.tool
    def odd(payload):
        return payload

    payload = {
        "bytes": b"\xff\xferaw",
        "text_bytes": b"plain",
        "when": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc),
        "day": dt.date(2026, 1, 2),
        "tags": {"b", "a"},
        "money": decimal.Decimal("1.10"),
        "obj": Opaque(),
        "hostile": Hostile(),
        "cycle": cyclic,
        "surrogate": "bad \udc80 text",
        "nul": "a\x00b",
    }
    with loopscope.turn(session_id="odd") as t:
        t.generation(tool_calls=[{"id": "o1", "name": "odd", "arguments": None}])
        assert odd(payload) is payload  # the user's value comes back untouched
        t.generation("ok")
    end = next(e for e in recording.store.get_timeline("odd") if e.type == "tool_call_end").content
    for stored in (end.arguments["payload"], end.result):
        assert stored["bytes"] == {"$bytes_base64": "//5yYXc="}
        assert stored["text_bytes"] == "plain"
        assert stored["when"] == "2026-01-02T03:04:05+00:00" and stored["day"] == "2026-01-02"
        assert stored["tags"] == ["a", "b"]
        assert stored["money"] == "1.10"
        assert stored["obj"] == "<Opaque thing>"
        assert stored["hostile"].startswith("<unrepresentable Hostile")
        assert stored["cycle"] == {"name": "loop", "self": "<cycle>"}
        assert stored["surrogate"] == "bad \\udc80 text"
        assert stored["nul"] == "a\x00b"


def test_unserializable_input_and_text(recording):
    with loopscope.turn(session_id="t", input="hi \ud800 there") as t:
        t.generation("answer \udfff")
    bodies = [e.content.body for e in recording.store.get_timeline("t")]
    assert bodies == ["hi \\ud800 there", "answer \\udfff"]


def test_directory_path_is_refused_at_configuration(tmp_path):
    with pytest.raises(loopscope.StoreError, match="is a directory"):
        loopscope.configure(tmp_path)


def test_missing_folder_is_refused_at_configuration(tmp_path):
    with pytest.raises(loopscope.StoreError, match="does not exist"):
        loopscope.configure(tmp_path / "nope" / "x.duckdb")


def test_path_under_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(loopscope.StoreError):
        loopscope.configure(tmp_path / "file" / "x.duckdb")


def test_foreign_file_is_refused_not_overwritten(tmp_path):
    target = tmp_path / "notes.duckdb"
    target.write_text("these are my notes, not a database\n" * 100)
    with pytest.raises(loopscope.StoreError, match="cannot open"):
        loopscope.configure(target)
    assert target.read_text().startswith("these are my notes")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_unwritable_folder_is_refused(tmp_path):
    locked = tmp_path / "ro"
    locked.mkdir(mode=0o500)
    with pytest.raises(loopscope.StoreError, match="permission denied"):
        loopscope.configure(locked / "x.duckdb")


def test_read_only_filesystem_is_refused(tmp_path):
    # root ignores permission bits, but not a read-only mount: /proc is one everywhere
    with pytest.raises(loopscope.StoreError):
        loopscope.configure(Path("/proc/loopscope.duckdb"))


def test_reading_a_missing_store_says_so(tmp_path):
    with pytest.raises(loopscope.StoreError, match="no loopscope store"):
        loopscope.Store(str(tmp_path / "absent.duckdb")).list_sessions()
