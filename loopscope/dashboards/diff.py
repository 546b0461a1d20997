"""Two runs compared step by step (``loopscope diff``, the dashboard's diff page): their
trajectories aligned (:mod:`.align`) by what each step is, and what differs told as a person
would: steps added, dropped, reordered or changed, and the deltas of tokens, cost and latency.

Pure: it takes the trajectories the query API read (:class:`~loopscope.storage.results.Trajectory`)
and returns a JSON-ready dict (docs/diff.md has its shape).

How steps pair up. A step's key is its kind, its name (a tool's name; a model call's model)
and its arguments (a tool call's). Two steps of different kinds, or tool calls of different
tools, never pair. The score of a pair:

- 4, the same: the same key, and the same status, result, error (and for a model call, the
  same tools asked for);
- 3, changed: the same key, another outcome (a retried call's failed first try against the
  try that was served, another end reason, another answer);
- 2, changed: the same kind and tool, other arguments (a model call: another model);

and each step left unpaired costs 1, so one changed pair is better than two unpaired steps,
and an identical pair further on is better than a changed one here. A step dropped from the
first run and a step added in the second with the same key were moved: both are reported
``reordered``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from .align import align

if TYPE_CHECKING:
    from ..storage.results import Trajectory, TrajectoryStep

VERSION = 1
"""The version of the diff's JSON shape (docs/diff.md); a change that breaks a reader raises it."""
SAME, CHANGED_OUTCOME, CHANGED_ARGUMENTS = 4, 3, 2
"""The scores of a pair (see the module's docstring)."""
OPS = ("same", "changed", "added", "dropped", "reordered")
"""What a row of the diff says of its step(s), in the order the summary counts them."""
DELTA_FIELDS = ("duration_ms", "input_tokens", "output_tokens", "cost_usd")
"""The figures a pair's ``delta`` holds (B less A)."""
TOTAL_FIELDS = ("turns", "steps", "model_calls", "tool_calls", "failed_tool_calls", "input_tokens", "output_tokens",
                "total_tokens", "cost_usd", "latency_ms")
"""A run's totals, in this order (``totals``; ``delta``: B less A)."""


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str, separators=(",", ":"))


class _Keyed:
    """A step with what the score compares, made once."""

    __slots__ = ("details", "key", "kind", "name", "step")

    def __init__(self, step: TrajectoryStep) -> None:
        self.step = step
        self.kind = step.kind
        self.name = step.name if step.kind != "end" else None
        arguments = _canonical(step.arguments) if step.kind == "tool_call" else ""
        self.key = (step.kind, self.name, arguments)
        self.details = (step.status, _canonical(step.result), step.error, step.requested)


def score(x: _Keyed, y: _Keyed) -> int | None:
    """How alike two steps are (None: never paired)."""
    if x.kind != y.kind:
        return None
    if x.key != y.key:
        if x.kind == "tool_call" and x.name != y.name:
            return None
        return CHANGED_ARGUMENTS
    return SAME if x.details == y.details else CHANGED_OUTCOME


def changes(a: TrajectoryStep, b: TrajectoryStep) -> list[str]:
    """What differs between two paired steps, in this order: ``model`` (a model call's),
    ``arguments``, ``status`` (``end_reason`` for a turn's end), ``error``, ``result``,
    ``requested`` (the tools a model call asked for)."""
    found: list[str] = []
    if a.kind == "model_call" and a.name != b.name:
        found.append("model")
    if a.kind == "tool_call" and _canonical(a.arguments) != _canonical(b.arguments):
        found.append("arguments")
    if a.status != b.status:
        found.append("end_reason" if a.kind == "end" else "status")
    if a.error != b.error:
        found.append("error")
    if _canonical(a.result) != _canonical(b.result):
        found.append("result")
    if a.requested != b.requested:
        found.append("requested")
    return found


def compare(a: Trajectory, b: Trajectory) -> dict[str, Any]:
    """The diff of run ``a`` to run ``b`` (docs/diff.md): each side, the aligned rows, the
    count of each op, and the totals' deltas."""
    ka, kb = [_Keyed(s) for s in a.steps], [_Keyed(s) for s in b.steps]
    pairs = align(ka, kb, score, identical=lambda x, y: x.key == y.key and x.details == y.details)
    rows: list[dict[str, Any]] = []
    for i, j in pairs:
        sa = a.steps[i] if i is not None else None
        sb = b.steps[j] if j is not None else None
        if sa is not None and sb is not None:
            found = changes(sa, sb)
            op = "changed" if found else "same"
        else:
            found, op = [], "dropped" if sa is not None else "added"
        step = sa or sb
        assert step is not None
        rows.append({
            "op": op, "kind": step.kind, "name": step.name if step.kind != "end" else None,
            "a": _step(sa, i), "b": _step(sb, j), "changes": found, "partner": None,
            "delta": _delta(sa, sb) if sa is not None and sb is not None else None,
        })
    _reorders(rows, ka, kb)
    summary = {op: 0 for op in OPS}
    for row in rows:
        summary[row["op"]] += 1
    summary["reordered"] //= 2  # a moved step shows on both sides: counted once
    ta, tb = totals(a.steps), totals(b.steps)
    return {
        "version": VERSION, "a": _side(a, ta), "b": _side(b, tb), "rows": rows, "summary": summary,
        "delta": {k: _minus(tb[k], ta[k]) for k in TOTAL_FIELDS},
    }


def _reorders(rows: list[dict[str, Any]], ka: Sequence[_Keyed], kb: Sequence[_Keyed]) -> None:
    """A dropped and an added step with the same key: one step moved. Both rows become
    ``reordered``, each naming the other's row (``partner``), the pair's changes and delta set."""
    waiting: dict[tuple[Any, ...], list[int]] = {}
    for n, row in enumerate(rows):
        if row["op"] == "added":
            waiting.setdefault(kb[row["b"]["index"]].key, []).append(n)
    for n, row in enumerate(rows):
        if row["op"] != "dropped":
            continue
        mine = ka[row["a"]["index"]]
        # a tool call moved when its tool and arguments match; a model call (keyed by its model
        # alone) or an end only when all of it does: another answer is another step
        found = [m for m in waiting.get(mine.key, ()) if mine.kind == "tool_call" or kb[rows[m]["b"]["index"]].details == mine.details]
        if not found:
            continue
        m = found[0]
        waiting[mine.key].remove(m)
        other = rows[m]
        sa, sb = ka[row["a"]["index"]].step, kb[other["b"]["index"]].step
        for mine, theirs in ((row, m), (other, n)):
            mine.update(op="reordered", partner=theirs, changes=changes(sa, sb), delta=_delta(sa, sb))


def _step(step: TrajectoryStep | None, index: int | None) -> dict[str, Any] | None:
    if step is None:
        return None
    started = step.started_at.isoformat() if isinstance(step.started_at, datetime) else None
    return {
        "index": index, "kind": step.kind, "turn_id": step.turn_id, "name": step.name, "call_id": step.call_id,
        "arguments": step.arguments, "result": step.result, "status": step.status, "error": step.error,
        "requested": list(step.requested), "started_at": started, "duration_ms": step.duration_ms,
        "input_tokens": step.input_tokens, "output_tokens": step.output_tokens, "cost_usd": step.cost_usd,
    }


def _minus(b: float | None, a: float | None) -> float | None:
    if a is None or b is None:
        return None
    value = b - a
    return round(value, 12) if isinstance(value, float) else value


def _delta(a: TrajectoryStep, b: TrajectoryStep) -> dict[str, Any]:
    return {k: _minus(getattr(b, k), getattr(a, k)) for k in DELTA_FIELDS}


def totals(steps: Sequence[TrajectoryStep]) -> dict[str, Any]:
    """A run's totals (:data:`TOTAL_FIELDS`): tokens and cost summed over its model calls (a
    turn without model call rows: its own), latency over its ended turns."""
    calls = [s for s in steps if s.kind == "model_call"]
    tools = [s for s in steps if s.kind == "tool_call"]
    ends = [s for s in steps if s.kind == "end"]
    with_calls = {s.turn_id for s in calls}
    counted = calls + [s for s in ends if s.turn_id not in with_calls]

    def total(name: str) -> float | None:
        values = [getattr(s, name) for s in counted if getattr(s, name) is not None]
        return sum(values) if values else None

    tokens_in, tokens_out = total("input_tokens"), total("output_tokens")
    latency = [s.duration_ms for s in ends if s.duration_ms is not None]
    return {
        "turns": len({s.turn_id for s in steps}), "steps": len(steps), "model_calls": len(calls),
        "tool_calls": len(tools), "failed_tool_calls": sum(1 for s in tools if s.status not in ("served", "pending", None)),
        "input_tokens": tokens_in, "output_tokens": tokens_out,
        "total_tokens": None if tokens_in is None and tokens_out is None else (tokens_in or 0) + (tokens_out or 0),
        "cost_usd": total("cost_usd"), "latency_ms": sum(latency) if latency else None,
    }


def _side(t: Trajectory, figures: dict[str, Any]) -> dict[str, Any]:
    return {"kind": t.kind, "id": t.id, "session_id": t.session_id, "turn_ids": list(t.turn_ids), "totals": figures}


__all__ = ["DELTA_FIELDS", "OPS", "TOTAL_FIELDS", "VERSION", "changes", "compare", "score", "totals"]
