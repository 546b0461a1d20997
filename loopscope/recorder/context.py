"""Which turn and tool execution are current, per thread and per asyncio task."""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .turn import Turn

current_turn: ContextVar[Turn | None] = ContextVar("loopscope_current_turn", default=None)
