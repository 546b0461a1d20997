"""``loopscope diff A B``: two runs (sessions or turns) aligned step by step, what was added,
dropped, reordered or changed, and the deltas of tokens, cost and latency (docs/diff.md)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from ..dashboards import tables
from . import _args, commands
from .commands import CommandError, emit, emit_json, open_store

if TYPE_CHECKING:
    from ..storage.queries import Reader
    from ..storage.results import Trajectory

MARKS = {"same": " ", "changed": "~", "added": "+", "dropped": "-", "reordered": ">"}
"""Each row's mark (a unified diff's, and ``>`` for a step that moved)."""
_COLOURS = {"changed": "33", "added": "32", "dropped": "31", "reordered": "36"}  # SGR: yellow, green, red, cyan
_KIND = {"model_call": "model", "tool_call": "tool", "end": "end"}
_TOTALS = (
    ("turns", "turns"), ("steps", "steps"), ("model calls", "model_calls"), ("tool calls", "tool_calls"),
    ("failed tool calls", "failed_tool_calls"), ("tokens in", "input_tokens"), ("tokens out", "output_tokens"),
    ("cost", "cost_usd"), ("latency", "latency_ms"),
)


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    diff = sub.add_parser(
        "diff",
        parents=[common],
        help="two runs (sessions or turns) aligned step by step: added, dropped, reordered, changed; token, cost and latency deltas",
        description="Compare two runs: each a session id or a turn's correlation id (or a unique prefix of one). "
        "Their steps (model calls, tool calls with their arguments, results and outcomes, each turn's end "
        "reason) are aligned as sequences, so a retried call or one extra step does not misalign what "
        "follows. Marks: ' ' the same, '~' changed (what changed, A -> B), '-' only in A, '+' only in B, "
        "'>' moved (in both, in another order). DELTA is B less A. See docs/diff.md.",
    )
    diff.add_argument("a", metavar="A", help="the first run: a session id or a turn's correlation id, or a unique prefix")
    diff.add_argument("b", metavar="B", help="the second run, compared with A")
    _args.add_json(diff, "the diff (docs/diff.md has its shape)")
    diff.set_defaults(handler=diff_command)


def diff_command(args: argparse.Namespace) -> int:
    from ..dashboards.align import TooLongError
    from ..dashboards.diff import compare
    from ..storage.pages import json_safe

    store = open_store(args)
    a, b = _trajectory(store, args.a), _trajectory(store, args.b)
    try:
        result = compare(a, b)
    except TooLongError as exc:
        raise CommandError(f"{exc}: compare single turns instead") from None
    if args.json:
        emit_json(json_safe(result))
        return 0
    for line, tone in render(result, width=tables.terminal_width(), ellipsis=commands.ellipsis()):
        _line(line, tone if _colour() else None)
    return 0


def _trajectory(store: Reader, ref: str) -> Trajectory:
    found = store.trajectory(ref)
    if found.trajectory is not None:
        return found.trajectory
    if not found.candidates:
        raise CommandError(
            f"no session or turn {ref!r} in {store.path} (list them with `loopscope sessions`, `loopscope turns`)"
        )
    shown = ", ".join(found.candidates[:5]) + (", ..." if len(found.candidates) > 5 else "")
    raise CommandError(f"{ref!r} matches several sessions or turns ({shown}); give more of the id")


def _colour() -> bool:
    """Colour on a terminal, unless ``NO_COLOR`` is set (https://no-color.org); never in a pipe."""
    stream = sys.stdout
    return bool(getattr(stream, "isatty", lambda: False)()) and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def _line(text: str, tone: str | None) -> None:
    if tone is None:
        emit(text)
        return
    # the text shown as emit shows it (control characters as escapes), then our colour around it
    shown = tables.visible(text)
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    try:
        shown.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        shown = shown.encode(encoding, "replace").decode(encoding)
    print(f"\x1b[{_COLOURS[tone]}m{shown}\x1b[0m")


# -- the text -----------------------------------------------------------------------------------


def render(result: dict[str, Any], *, width: int = 120, ellipsis: str = tables.ELLIPSIS) -> list[tuple[str, str | None]]:
    """The diff as lines for a terminal, each with its row's op where it is coloured."""
    lines: list[tuple[str, str | None]] = []
    for side in ("a", "b"):
        s = result[side]
        t = s["totals"]
        what = f"session {s['id']}" if s["kind"] == "session" else f"turn {s['id']} of session {s['session_id']}"
        lines.append((tables.one_line(f"{side.upper()}: {what}  ({_count(t['turns'], 'turn')}, {_count(t['steps'], 'step')})"), None))
    lines.append(("", None))
    lines.append(("     A    B  STEP", None))
    rows = result["rows"]
    for row in rows:
        a, b = row["a"], row["b"]
        head = f"{MARKS[row['op']]} {_position(a):>4} {_position(b):>4}  "
        body = _describe(row, rows)
        delta = _row_delta(row["delta"]) if row["op"] in ("same", "changed", "reordered") else ""
        room = max(20, width - tables.text_width(head) - (tables.text_width(delta) + 2 if delta else 0))
        text = head + tables.truncate(tables.one_line(body), room, ellipsis)
        if delta:
            text = f"{text}  {delta}"
        lines.append((text, row["op"] if row["op"] in _COLOURS else None))
    lines.append(("", None))
    lines.append((f"{'':<18}{'A':>14}{'B':>14}{'DELTA':>14}", None))
    ta, tb, dt = result["a"]["totals"], result["b"]["totals"], result["delta"]
    for label, key in _TOTALS:
        fmt = _usd if key == "cost_usd" else _ms if key == "latency_ms" else _int
        lines.append((f"{label:<18}{fmt(ta[key]):>14}{fmt(tb[key]):>14}{fmt(dt[key], sign=True):>14}", None))
    lines.append(("", None))
    counts = result["summary"]
    lines.append((", ".join(f"{counts[op]} {op}" for op in ("same", "changed", "added", "dropped", "reordered"))
                  + "  (DELTA: B less A; durations in ms)", None))
    return lines


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _position(step: dict[str, Any] | None) -> str:
    return "" if step is None else str(step["index"] + 1)


def _value(value: Any) -> str:
    text = tables.compact_json(value)
    return f'"{text}"' if isinstance(value, str) else text or "-"


def _describe(row: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    a, b = row["a"], row["b"]
    step = b or a
    kind = _KIND.get(step["kind"], step["kind"])
    if row["op"] == "changed":
        names = {"end_reason": "status"}
        parts = [f"{field.replace('_', ' ')} {_value(a[names.get(field, field)])} -> {_value(b[names.get(field, field)])}"
                 for field in row["changes"]]
        label = kind if step["kind"] == "end" else f"{kind} {step['name'] or ''}"
        return f"{label}  " + "; ".join(parts)
    text = _step_text(step)
    if row["op"] == "reordered":
        partner = rows[row["partner"]]
        other = partner["b"] if row["a"] is not None else partner["a"]
        where = "B" if row["a"] is not None else "A"
        text += f"  (moved: {where} step {other['index'] + 1})"
        if row["changes"]:
            text += "; changed: " + ", ".join(row["changes"])
    return text


def _step_text(step: dict[str, Any]) -> str:
    kind = step["kind"]
    if kind == "model_call":
        text = f"model {step['name'] or '?'}  {step['status'] or ''}"
        if step["result"]:
            text += f"  {_value(step['result'])}"
        if step["requested"]:
            text += f"  -> {', '.join(step['requested'])}"
    elif kind == "tool_call":
        text = f"tool {step['name'] or '?'} {tables.compact_json(step['arguments'])}  {step['status'] or ''}"
        if step["error"]:
            text += f": {step['error']}"
        elif step["result"] is not None:
            text += f"  = {_value(step['result'])}"
    else:
        text = f"end {step['status'] or '(no reason)'}"
        if step["result"]:
            text += f"  {_value(step['result'])}"
    return text


def _row_delta(delta: dict[str, Any] | None) -> str:
    if not delta:
        return ""
    parts = []
    if delta.get("duration_ms") is not None:
        parts.append(f"{_ms(delta['duration_ms'], sign=True)} ms".replace("0.00 ms", "0 ms"))
    tokens = [delta.get(k) for k in ("input_tokens", "output_tokens")]
    if any(t for t in tokens if t is not None):
        parts.append(f"{sum(t or 0 for t in tokens):+,} tok")
    if delta.get("cost_usd"):
        parts.append(_usd(delta["cost_usd"], sign=True))
    return ", ".join(parts)


def _signed(value: float, text: str, sign: bool) -> str:
    """``text`` (the figure's size) with its sign: a delta's always (``+2``, ``-$0.01``), none at zero."""
    if text.strip("$0.,") == "":
        return text
    return ("-" if value < 0 else "+" if sign else "") + text


def _int(value: float | None, sign: bool = False) -> str:
    return "-" if value is None else _signed(value, f"{abs(value):,.0f}", sign)


def _ms(value: float | None, sign: bool = False) -> str:
    return "-" if value is None else _signed(value, tables.fine_millis(abs(value)), sign)


def _usd(value: float | None, sign: bool = False) -> str:
    return "-" if value is None else _signed(value, tables.usd(abs(value)), sign)


__all__ = ["MARKS", "diff_command", "register", "render"]
