"""The recorder: the turn model and the spans it emits."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from . import settings
from .records import ToolResult
from .score import score
from .state import state_delta, state_snapshot
from .stitch import session
from .tool import ToolExecution, tool
from .turn import Round, Turn


def turn(
    session_id: str | None = None,
    agent: str | None = None,
    tools: Iterable[Any] | None = None,
    *,
    input: str | None = None,
    input_blocked: bool = False,
    model: str | None = None,
    provider: str | None = None,
    framework: str | None = None,
    correlation_id: str | None = None,
    streaming: bool = False,
) -> Turn:
    """Record one agent turn: ``with loopscope.turn(...) as t:`` (or ``async with``).

    ``session_id`` groups turns into a conversation (a nested turn inherits its
    parent's); ``agent`` names who answers; ``tools`` are the tools offered, in any
    provider's format; ``input`` is the user message that started the turn. Record each
    model call with :meth:`Turn.round` or :meth:`Turn.generation` and run tools
    decorated with :func:`loopscope.tool`. The loop end reason follows from what
    happened, or from :meth:`Turn.end`; afterwards ``t.response`` is the turn's
    :class:`~loopscope.AIResponseEvent`.
    """
    return Turn(
        settings.tracer(),
        session_id=session_id,
        agent=agent,
        tools=tools,
        input=input,
        input_blocked=input_blocked,
        model=model,
        provider=provider,
        framework=framework,
        correlation_id=correlation_id,
        streaming=streaming,
    )


__all__ = ["Round", "ToolExecution", "ToolResult", "Turn", "score", "session", "state_delta", "state_snapshot", "tool", "turn"]
