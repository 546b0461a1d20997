"""Application state as events of the log: snapshots and JSON Patch deltas.

The state is never kept apart from the activity log: each snapshot (or delta) is a
zero-duration span, under the current turn's ``invoke_agent`` span when there is one,
that the store maps to a ``state_snapshot`` (``state_delta``) row and the OTLP export
carries like any other span. :meth:`loopscope.Store.derive_state` rebuilds the state
from those rows.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import _json
from .. import semconv as a
from .._guard import guard
from . import settings
from .context import current_session, current_turn, open_stitched_turn

if TYPE_CHECKING:
    from .turn import Turn

_OPS = frozenset({"add", "remove", "replace", "move", "copy", "test"})


def _check_delta(operations: Any) -> list[Any]:
    """The operations of a JSON Patch, checked for shape only (they apply to the state
    of the moment, which only a reader of the log knows)."""
    if isinstance(operations, (str, bytes)) or not isinstance(operations, Sequence):
        raise TypeError("a state delta is a JSON Patch: a list of operations such as {'op': 'add', 'path': '/a', 'value': 1}")
    ops = list(operations)
    for op in ops:
        if not isinstance(op, Mapping) or op.get("op") not in _OPS or not isinstance(op.get("path"), str):
            raise ValueError(f"not a JSON Patch operation: {op!r}")
    return ops


def record_state(kind: str, value: Any, *, session_id: str | None = None, turn: Turn | None = None) -> None:
    """Record a ``snapshot`` or ``delta`` of the state of ``session_id`` (default: the
    turn's session, else the one of ``loopscope.session()``)."""
    if kind == "delta":
        value = _check_delta(value)
    if turn is None:
        turn = current_turn.get() or open_stitched_turn()
    if session_id is not None and type(session_id) is not str:
        session_id = _json.to_text(session_id)  # session_id=12345 is the session "12345"
    session = session_id or (turn.session_id if turn is not None else None) or current_session.get()
    if not session:
        raise ValueError("state belongs to a session: give session_id, or record it inside a turn or loopscope.session()")
    if turn is not None and turn.session_id != session:
        turn = None  # another conversation's state: not part of this turn
    text = _json.dumps(value)  # now: the caller may change its object right after
    with guard("state record"):
        attributes: dict[str, Any] = {a.CONVERSATION_ID: session, a.STATE_KIND: kind, a.STATE_VALUE: text}
        context = None
        if turn is not None:
            attributes[a.TURN_ID] = turn.correlation_id
            if turn.agent:
                attributes[a.AGENT_NAME] = turn.agent
            if turn.framework:
                attributes[a.FRAMEWORK] = turn.framework
            context = turn._context()
        now = time.time_ns()
        span = settings.tracer().start_span(a.STATE_KINDS[kind], context=context, attributes=attributes, start_time=now)
        span.end(end_time=now)


def state_snapshot(snapshot: Any, *, session_id: str | None = None) -> None:
    """Record the whole state of a session as it is now (a ``state_snapshot`` event).

    ``snapshot`` is any JSON-able value, usually a dict; it is serialised at once, so
    changing the object afterwards changes nothing recorded. Inside a turn the event
    belongs to that turn (and its session, unless ``session_id`` names another);
    outside one, ``session_id`` (or ``loopscope.session()``) says whose state it is.
    """
    record_state("snapshot", snapshot, session_id=session_id)


def state_delta(operations: Sequence[Mapping[str, Any]], *, session_id: str | None = None) -> None:
    """Record a change of a session's state as a JSON Patch (RFC 6902), applied to the
    state the events before it make (a ``state_delta`` event); see :func:`state_snapshot`."""
    record_state("delta", operations, session_id=session_id)
