"""A run's trajectory put together from its steps, the same on every engine (``Reader.trajectory``,
``loopscope diff``): an engine reads a session's or turn's model calls, tool calls and turn ends,
each in its own order, and :func:`assemble` orders them as one run.

Within a turn the steps are ordered by start time (a tool call starts after the model call that
asked for it; calls that started together keep the model call first, then the store's order); a
turn that has ended closes with its ``end`` step; a session's turns follow each other by their
first step (a turn still running has no end step yet)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from .results import Trajectory, TrajectoryStep

MAX_CANDIDATES = 6
"""The ids a prefix that names several runs lists at most."""


def parsed(value: Any) -> Any:
    """A JSON text parsed (text that is not JSON kept as it is); other values as they are."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def answer_of(messages: Any) -> tuple[str | None, tuple[str, ...]]:
    """A model call's answered text and the tools it asked for, from its ``output_messages``
    (the GenAI conventions' parts); none where content was not kept."""
    found = parsed(messages)
    texts: list[str] = []
    tools: list[str] = []
    for message in found if isinstance(found, list) else []:
        for part in message.get("parts") or [] if isinstance(message, dict) else []:
            if not isinstance(part, dict):
                continue
            if part.get("type") == "text" and isinstance(part.get("content"), str):
                texts.append(part["content"])
            elif part.get("type") == "tool_call" and part.get("name"):
                tools.append(str(part["name"]))
    return ("\n".join(texts) if texts else None), tuple(tools)


def assemble(
    kind: str, ident: str, session_id: str, model_calls: Sequence[TrajectoryStep], tool_calls: Sequence[TrajectoryStep],
    ends: Sequence[tuple[datetime | None, TrajectoryStep]],
) -> Trajectory:
    """The trajectory of session ``session_id`` (``kind`` ``session``) or of its turn ``ident``:
    ``model_calls`` and ``tool_calls`` each in the store's order, ``ends`` each turn's first
    moment and its end step, in the turns' order."""
    steps = [(s.started_at, 0, n, s) for n, s in enumerate(model_calls)]
    steps += [(s.started_at, 1, n, s) for n, s in enumerate(tool_calls)]
    first: dict[str | None, datetime | None] = {}
    end_of: dict[str | None, TrajectoryStep] = {}
    for started, end in ends:
        end_of[end.turn_id], first[end.turn_id] = end, started
    by_turn: dict[str | None, list[tuple[datetime | None, int, int, TrajectoryStep]]] = {}
    for item in steps:
        by_turn.setdefault(item[3].turn_id, []).append(item)
    for turn_id, items in by_turn.items():
        start = min((t for t, *_ in items if t is not None), default=None)
        known = first.get(turn_id)
        first[turn_id] = start if known is None or (start is not None and start < known) else known
    floor = datetime.min.replace(tzinfo=timezone.utc)
    order = sorted(first, key=lambda t: (first[t] or floor, t or ""))
    out: list[TrajectoryStep] = []
    for turn_id in order:
        items = sorted(by_turn.get(turn_id, []), key=lambda i: (i[0] or floor, i[1], i[2]))
        out.extend(i[3] for i in items)
        if turn_id in end_of:
            out.append(end_of[turn_id])
    return Trajectory(kind=kind, id=ident, session_id=session_id, turn_ids=tuple(t for t in order if t), steps=tuple(out))


__all__ = ["MAX_CANDIDATES", "answer_of", "assemble", "parsed"]
