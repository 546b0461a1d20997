"""A session's state, derived from its log: the last snapshot and the deltas after it.

State is never stored apart from the activity log. ``state_snapshot`` rows carry
``{"snapshot": <object>}``, ``state_delta`` rows ``{"delta": [<JSON Patch operations>]}``;
:func:`derive_state` scans back to the last snapshot and applies the deltas after it in
index order, as AG-UI clients apply STATE_SNAPSHOT and STATE_DELTA events.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import duckdb

from .replay import _span, session_mark
from .values import fill

__all__ = ["StatePatchError", "apply_patch", "derive_state"]

_STATE_TYPES = ["state_delta", "state_snapshot"]


class StatePatchError(ValueError):
    """A JSON Patch that does not apply to the state before it."""


def _tokens(pointer: Any) -> list[str]:
    """The reference tokens of a JSON Pointer (RFC 6901)."""
    if not isinstance(pointer, str) or (pointer and not pointer.startswith("/")):
        raise StatePatchError(f"not a JSON Pointer: {pointer!r}")
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer.split("/")[1:]]


def _index(token: str, size: int, *, append: bool = False) -> int:
    if append and token == "-":
        return size
    if not token.isdigit() or (len(token) > 1 and token[0] == "0"):
        raise StatePatchError(f"not an array index: {token!r}")
    index = int(token)
    if index > size or (index == size and not append):
        raise StatePatchError(f"array index {index} out of range")
    return index


def _get(doc: Any, tokens: list[str]) -> Any:
    for token in tokens:
        if isinstance(doc, list):
            doc = doc[_index(token, len(doc))]
        elif isinstance(doc, dict):
            if token not in doc:
                raise StatePatchError(f"no member {token!r}")
            doc = doc[token]
        else:
            raise StatePatchError(f"cannot look up {token!r} in a {type(doc).__name__}")
    return doc


def _add(doc: Any, tokens: list[str], value: Any) -> Any:
    if not tokens:
        return value
    parent, key = _get(doc, tokens[:-1]), tokens[-1]
    if isinstance(parent, list):
        parent.insert(_index(key, len(parent), append=True), value)
    elif isinstance(parent, dict):
        parent[key] = value
    else:
        raise StatePatchError(f"cannot add {key!r} to a {type(parent).__name__}")
    return doc


def _remove(doc: Any, tokens: list[str]) -> Any:
    if not tokens:
        return None
    parent, key = _get(doc, tokens[:-1]), tokens[-1]
    if isinstance(parent, list):
        del parent[_index(key, len(parent))]
    elif isinstance(parent, dict) and key in parent:
        del parent[key]
    else:
        raise StatePatchError(f"no member {key!r} to remove")
    return doc


def apply_patch(doc: Any, operations: object) -> Any:
    """``doc`` with a JSON Patch (RFC 6902) applied, as a new object: all operations or none.
    ``operations`` comes from stored JSON: anything but a list of operations is refused."""
    if not isinstance(operations, list):
        raise StatePatchError("a JSON Patch is a list of operations")
    doc = copy.deepcopy(doc)
    for op in operations:
        if not isinstance(op, dict):
            raise StatePatchError(f"not a JSON Patch operation: {op!r}")
        kind, path = op.get("op"), _tokens(op.get("path"))
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)  # must exist
            doc = _add(_remove(doc, path), path, copy.deepcopy(op.get("value"))) if path else copy.deepcopy(op.get("value"))
        elif kind in ("move", "copy"):
            source = _tokens(op.get("from"))
            if kind == "move" and path[: len(source)] == source and path != source:
                raise StatePatchError("cannot move a value into itself")
            value = copy.deepcopy(_get(doc, source))
            if kind == "move":
                doc = _remove(doc, source)
            doc = _add(doc, path, value)
        elif kind == "test":
            if _get(doc, path) != op.get("value"):
                raise StatePatchError(f"test failed at {op.get('path')!r}")
        else:
            raise StatePatchError(f"unknown JSON Patch operation {kind!r}")
    return doc


def derive_state(con: duckdb.DuckDBPyConnection, session_id: str, at_index: int | None = None) -> Any | None:
    """The state of ``session_id`` (as of event ``at_index``, default: now) from one open
    store: the last snapshot with the deltas after it applied; None without either.

    Deltas before any snapshot apply to an empty object. Blocked rows do not count. A
    delta that does not apply raises :class:`StatePatchError` naming its index.
    """
    mark = session_mark(con, session_id)
    if mark is None:
        return None
    span_clauses, span_params = _span(mark)
    where = ["session_id = ?", "status <> 'blocked'", *span_clauses]
    params: list[Any] = [session_id, *span_params]
    if at_index is not None:
        where.append("idx <= ?")
        params.append(at_index)
    condition = " AND ".join(where)
    rows = con.execute(
        f"""SELECT idx, type, content, id FROM events
            WHERE {condition} AND list_contains(?, type)
              AND idx >= (SELECT coalesce(max(idx), 0) FROM events WHERE {condition} AND type = 'state_snapshot')
            ORDER BY idx""",
        [*params, _STATE_TYPES, *params],
    ).fetchall()
    rows = fill(con, rows, 3, 2)  # a large snapshot whole (values.py)
    state: Any = None
    for index, kind, text, _ in rows:
        content = json.loads(text) if text else {}
        if not isinstance(content, dict):
            continue
        if kind == "state_snapshot":
            state = content.get("snapshot")
        else:
            try:
                state = apply_patch({} if state is None else state, content.get("delta"))
            except StatePatchError as exc:
                raise StatePatchError(f"the state delta at index {index} of session {session_id!r} does not apply: {exc}") from None
    return state
