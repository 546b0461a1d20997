"""Which turn is current, per thread and per asyncio task."""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .turn import Round, Turn

current_turn: ContextVar[Turn | None] = ContextVar("loopscope_current_turn", default=None)
"""The turn of the enclosing ``with loopscope.turn(...)`` block."""

current_round: ContextVar[Round | None] = ContextVar("loopscope_current_round", default=None)
"""The round of the enclosing ``with turn.round(...)`` block: an adapter fills it rather than adding one."""

current_session: ContextVar[str | None] = ContextVar("loopscope_current_session", default=None)
"""The conversation id set with ``loopscope.session(...)``."""

last_stitched: ContextVar[Turn | None] = ContextVar("loopscope_last_stitched_turn", default=None)
"""The turn an adapter stitched most recently in this context, so a decorated tool run
right after the model asked for it serves that call."""


def open_stitched_turn() -> Turn | None:
    turn = last_stitched.get()
    return turn if turn is not None and not turn.ended else None
