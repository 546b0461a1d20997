"""The sequence alignment behind ``loopscope diff`` (loopscope/dashboards/align.py), on plain
items: pairs a person would draw between two lists, an extra or a repeated item costing one gap
instead of shifting everything after it."""

from __future__ import annotations

import pytest

from loopscope.dashboards.align import TooLongError, align


def letters(x: str, y: str) -> int | None:
    """Equal letters score 4; one letter in two cases (a "changed" item) 2; else never paired."""
    if x == y:
        return 4
    return 2 if x.lower() == y.lower() else None


def shown(a: str, b: str, **kw: object) -> list[str]:
    """The alignment as ``x=y`` (paired), ``x-`` (only in a), ``+y`` (only in b)."""
    out = []
    for i, j in align(list(a), list(b), letters, **kw):  # type: ignore[arg-type]
        out.append(f"{a[i]}={b[j]}" if i is not None and j is not None else f"{a[i]}-" if i is not None else f"+{b[j]}")  # type: ignore[index]
    return out


def test_one_extra_item_costs_one_gap_and_the_rest_stays_paired():
    assert shown("abcd", "abxcd") == ["a=a", "b=b", "+x", "c=c", "d=d"]
    assert shown("abxcd", "abcd") == ["a=a", "b=b", "x-", "c=c", "d=d"]


def test_a_changed_item_pairs_with_its_counterpart_rather_than_two_gaps():
    assert shown("abcd", "aBcd") == ["a=a", "b=B", "c=c", "d=d"]


def test_an_identical_pair_further_on_beats_a_changed_pair_here():
    # "B" then "b": the b of the first list pairs with its equal, the B is extra
    assert shown("abc", "aBbc") == ["a=a", "+B", "b=b", "c=c"]


def test_ties_take_the_earliest_pair_and_a_first_list_gap_before_a_second_list_gap():
    assert shown("aa", "a") == ["a=a", "a-"]
    assert shown("ab", "ba") == ["a-", "b=b", "+a"]
    assert shown("", "ab") == ["+a", "+b"]
    assert shown("ab", "") == ["a-", "b-"]


def test_items_that_never_pair_are_gaps_on_both_sides():
    assert shown("xy", "pq") == ["x-", "y-", "+p", "+q"]


def test_common_ends_are_paired_first_and_give_the_same_alignment():
    def same(x: str, y: str) -> bool:
        return x == y

    for a, b in (("abcxd", "abcd"), ("abXd", "abxd"), ("aab", "ab"), ("abc", "abc")):
        assert shown(a, b, identical=same) == shown(a, b), (a, b)


def test_too_long_a_middle_says_so_but_long_equal_ends_cost_nothing():
    a, b = "a" * 3000 + "x", "a" * 3000 + "y"
    with pytest.raises(TooLongError, match="too many to align"):
        align(list(a), list(b), letters, max_cells=100)
    pairs = align(list(a), list(b), letters, identical=lambda x, y: x == y, max_cells=100)
    assert pairs[:3000] == [(i, i) for i in range(3000)] and pairs[3000:] == [(3000, None), (None, 3000)]
