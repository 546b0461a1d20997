"""Terminal tables: aligned columns, one line per row, long cells cut with an ellipsis."""

from __future__ import annotations

from loopscope.dashboards.tables import Column, render, text_width, truncate


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
