"""The sequence alignment behind ``loopscope diff`` (loopscope/dashboards/align.py), on plain
items: pairs a person would draw between two lists, an extra or a repeated item costing one gap
instead of shifting everything after it; and the comparison of two trajectories
(loopscope/dashboards/diff.py) on hand-made steps, no store (test_diff.py: recorded runs)."""

from __future__ import annotations

import pytest

from loopscope.dashboards.align import TooLongError, align
from loopscope.dashboards.diff import compare
from loopscope.storage.results import Trajectory, TrajectoryStep


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


# -- two trajectories compared (loopscope/dashboards/diff.py), on hand-made steps ------------------------


def trajectory(*steps: TrajectoryStep) -> Trajectory:
    return Trajectory(kind="turn", id="t", session_id="s", turn_ids=("t",), steps=steps)


def call(model: str, text: str, tokens: int = 10, cost: float | None = 0.001) -> TrajectoryStep:
    return TrajectoryStep("model_call", "t", name=model, result=text, status="completed", input_tokens=tokens,
                          output_tokens=1, cost_usd=cost, duration_ms=100.0)


def tool(name: str, arguments: dict, status: str = "served") -> TrajectoryStep:
    return TrajectoryStep("tool_call", "t", name=name, arguments=arguments, result="ok", status=status, duration_ms=5.0)


def test_another_model_changes_the_calls_instead_of_replacing_every_one():
    a = trajectory(call("gpt-4o", "hi"), tool("search", {"q": 1}), call("gpt-4o", "done"))
    b = trajectory(call("gpt-4o-mini", "hi"), tool("search", {"q": 1}), call("gpt-4o-mini", "done"))
    result = compare(a, b)
    assert [(r["op"], r["changes"]) for r in result["rows"]] == [
        ("changed", ["model"]), ("same", []), ("changed", ["model"])]


def test_tools_of_other_names_never_pair_and_totals_sum_calls_or_the_turns_own():
    a = trajectory(tool("search", {"q": 1}), TrajectoryStep("end", "t", status="completed", input_tokens=7,
                                                            output_tokens=3, cost_usd=0.5, duration_ms=40.0))
    b = trajectory(call("m", "x", tokens=20, cost=None), tool("fetch", {"q": 1}, status="failed"))
    result = compare(a, b)
    assert [r["op"] for r in result["rows"]] == ["dropped", "dropped", "added", "added"]
    assert result["a"]["totals"]["input_tokens"] == 7 and result["a"]["totals"]["cost_usd"] == 0.5  # no call rows: the turn's
    assert result["b"]["totals"]["cost_usd"] is None and result["b"]["totals"]["latency_ms"] is None  # no price, no end
    assert result["delta"]["input_tokens"] == 13 and result["delta"]["cost_usd"] is None
    assert result["b"]["totals"]["failed_tool_calls"] == 1


def test_a_model_call_is_moved_only_when_all_of_it_matches():
    a = trajectory(call("m", "plan"), tool("x", {}), call("m", "answer"))
    b = trajectory(tool("x", {}), call("m", "answer"), call("m", "plan"))
    ops = [(r["op"], r["a"] and r["a"]["result"], r["b"] and r["b"]["result"]) for r in compare(a, b)["rows"]]
    assert ops == [("reordered", "plan", None), ("same", "ok", "ok"), ("same", "answer", "answer"),
                   ("reordered", None, "plan")]
    # another text is another model call: dropped here, added there, not moved
    b = trajectory(tool("x", {}), call("m", "answer"), call("m", "another plan"))
    ops = [(r["op"], r["a"] and r["a"]["result"], r["b"] and r["b"]["result"]) for r in compare(a, b)["rows"]]
    assert ops == [("dropped", "plan", None), ("same", "ok", "ok"), ("same", "answer", "answer"),
                   ("added", None, "another plan")]
