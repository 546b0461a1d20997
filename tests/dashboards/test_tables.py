"""Terminal tables: aligned columns, one line per row, long cells cut with an ellipsis."""

from __future__ import annotations

import json

from loopscope.dashboards.tables import Column, json_visible, render, text_width, truncate, visible


def test_truncate_marks_the_cut():
    assert truncate("short", 10) == "short"
    assert truncate("a long sentence here", 10) == "a long se…"
    assert truncate("a long sentence here", 10, "...") == "a long..."
    assert text_width(truncate("漢字漢字漢字", 7)) <= 7


def test_columns_align_and_numbers_go_right():
    text = render([Column("NAME"), Column("N", "right")], [["a", 1], ["bbbb", 100]], width=80)
    assert text.splitlines() == [
        "NAME    N",
        "----  ---",
        "a       1",
        "bbbb  100",
    ]


def test_wide_table_shrinks_the_text_column_first():
    rows = [["id-1", "x" * 200], ["id-2", "multi\nline\ttext"]]
    text = render([Column("ID"), Column("TEXT", shrink=2, min_width=10)], rows, width=40)
    lines = text.splitlines()
    assert all(len(line) <= 40 for line in lines)
    assert lines[2].endswith("…") and lines[2].startswith("id-1")
    assert lines[3] == "id-2  multi line text"


def test_max_width_cuts_even_when_there_is_room():
    text = render([Column("K", max_width=5), Column("V")], [["abcdefgh", "v"]], width=200)
    assert text.splitlines()[2] == "abcd…  v"


HOSTILE = "a\x1b]52;c;aGk=\x07b\rc\x08\x7f\x9b2J\u202ed\u2028e\tf\ng"


def test_visible_shows_every_control_but_line_feeds_and_tabs():
    shown = visible(HOSTILE)
    assert shown == "a\\x1b]52;c;aGk=\\x07b\\rc\\x08\\x7f\\x9b2J\\u202ed\\u2028e\tf\ng"
    assert visible(shown) == shown  # twice is once: a line printed again is not escaped again
    assert visible("naïve 漢字 café ✓") == "naïve 漢字 café ✓"


def test_json_visible_is_the_same_json():
    text = json.dumps({"k": HOSTILE}, ensure_ascii=False)
    shown = json_visible(text)
    assert json.loads(shown) == {"k": HOSTILE}
    assert not [ch for ch in shown if ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F or ch in "\u202e\u2028"]


def test_escaped_cells_and_headers_stay_aligned():
    """A cell is escaped before it is measured: the columns after it stay in line."""
    text = render([Column("A\x1b[2J"), Column("B")], [["x\x1b[8my", "1"], ["z", "2"]], width=80)
    assert text.splitlines() == [
        "A\\x1b[2J   B",
        "---------  -",
        "x\\x1b[8my  1",
        "z          2",
    ]
