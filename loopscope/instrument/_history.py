"""The JSON text of a long conversation's earlier messages, kept from one model call to the next.

Every request of a tool loop carries the whole conversation so far, and every call records
it (``gen_ai.input.messages``): encoding all of it again made a call's cost grow with the
history (500 messages: ~0.25 ms of the calling thread for openai, ~0.75 ms for anthropic).
Here an adapter finds which leading messages of a request are those of an earlier request
(:meth:`History.reuse`) and encodes only the rest, then leaves the whole for the next call
(:meth:`History.keep`).

"The same" is checked, not assumed: a kept message is a copy of what was sent (dicts,
lists and SDK models copied down to their strings and numbers, :func:`snapshot`), and a
request reuses the kept text of its first ``k`` messages only while those copies equal its
messages, compared in C. A message changed in place since (a tool result shortened to save
tokens) is encoded again, with everything after it. Only the encoding is reused: adapters
still read every message for tool results and the user's text, as the call's own facts.

Short conversations take the plain path (:data:`MIN_MESSAGES`, or an adapter's own
threshold): for them, copying the new messages costs more than encoding the few kept
ones. The kept texts are bounded in conversations and characters
(:data:`MAX_CONVERSATIONS`, :data:`MAX_CHARS`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from .. import _json

MIN_MESSAGES = 16
"""Requests with fewer messages are encoded whole, unless an adapter says otherwise
(benchmarks/bench_history.py: below, copying the new messages costs more than it saves)."""
KEEP = True
"""Off: every request is encoded whole (the baseline benchmarks/bench_history.py compares with)."""
MAX_CONVERSATIONS = 64
MAX_CHARS = 1 << 21
"""The JSON characters kept in all (their messages' copies share the strings): a few MB."""
_DEPTH = 24  # a message nested deeper is not kept (encoded each time)


class _Model:
    """The copy of an SDK model object: equal to a live object of its class whose fields
    (and extra fields) equal the copied ones. On the left of ``==`` (the kept side), so
    that the C comparison of the kept messages with the request's calls it."""

    __slots__ = ("fields", "kind")
    __hash__ = None  # type: ignore[assignment]  # compared, never hashed

    def __init__(self, kind: type, fields: Any) -> None:
        self.kind = kind
        self.fields = fields

    def __eq__(self, other: object) -> bool:
        return type(other) is self.kind and self.fields == _fields(other)


def _fields(model: Any) -> tuple[Any, Any]:
    return (model.__dict__, getattr(model, "__pydantic_extra__", None))


class _Unkept(Exception):
    """A value :func:`snapshot` cannot copy faithfully."""


_SCALARS = frozenset({str, int, float, bool, type(None)})


def snapshot(value: Any, depth: int = 0) -> Any:
    """A copy of ``value`` that compares equal to it (and to anything equal to it now) and
    does not change with it; raises :class:`_Unkept` for what it cannot copy (objects other
    than dicts, lists, tuples, SDK models and plain scalars, or nesting past ``_DEPTH``)."""
    kind = type(value)
    if kind in _SCALARS:
        return value  # immutable: shared
    if depth > _DEPTH:
        raise _Unkept
    if kind is dict:
        copy = dict(value)  # copied in C; only what nests is copied further
        for key, item in copy.items():
            if type(item) not in _SCALARS:
                copy[key] = snapshot(item, depth + 1)  # the same keys: the dict's size does not change
        return copy
    if kind is list:
        items = list(value)
        for index, item in enumerate(items):
            if type(item) not in _SCALARS:
                items[index] = snapshot(item, depth + 1)
        return items
    if kind is tuple:
        return tuple(snapshot(item, depth + 1) for item in value)
    if isinstance(value, BaseModel):
        fields, extra = _fields(value)
        return _Model(kind, (snapshot(dict(fields), depth + 1), None if extra is None else snapshot(dict(extra), depth + 1)))
    raise _Unkept


LOOK_BACK = 16
"""How many messages a request may add to the last one of its conversation and still
find it (a response's tool calls and their results, a user message)."""


def _key_text(message: Any) -> Any:
    """What tells a message apart from another cheaply: its text or its first call's id,
    else (an SDK object, an unusual shape) the object itself, by identity."""
    if type(message) is dict:
        content = message.get("content")
        if type(content) is str:
            return content
        if type(content) is list and content and type(first := content[0]) is dict:
            for field in ("text", "id", "tool_use_id"):  # a text, a tool call or a tool result block
                value = first.get(field)
                if type(value) is str:
                    return value
        calls = message.get("tool_calls")
        if type(calls) is list and calls and type(call := calls[0]) is dict and type(call_id := call.get("id")) is str:
            return call_id
    return ("object", id(message))  # a different message at the same place is found unequal anyway


class _Kept:
    __slots__ = ("chars", "copies", "texts")

    def __init__(self, copies: list[Any], texts: tuple[str, ...], chars: int) -> None:
        self.copies = copies
        self.texts = texts
        self.chars = chars


class History:
    """The kept conversations of one adapter (each adapter's texts are its own encoding),
    each under its length and its last message (:func:`_key_text`): the next request of a
    conversation holds that message at that place, whatever it added after it."""

    def __init__(self, min_messages: int = MIN_MESSAGES) -> None:
        self.min_messages = min_messages
        self._kept: dict[tuple[int, Any], _Kept] = {}
        self._chars = 0
        self._lock = threading.Lock()  # keep() from threads at once: the counts stay right

    def applies(self, count: int) -> bool:
        """Whether a request of ``count`` messages is a long conversation's, kept here."""
        return count >= self.min_messages and KEEP

    def reuse(self, messages: Sequence[Any]) -> tuple[int, tuple[str, ...], Any]:
        """How many leading ``messages`` are those of a kept conversation, their texts, and
        what :meth:`keep` takes to replace it (``0, (), None``: none, or a short conversation)."""
        count = len(messages)
        if not self.applies(count) or not self._kept:
            return 0, (), None
        kept = key = None
        for length in range(count, max(count - LOOK_BACK, self.min_messages - 1), -1):
            key = (length, _key_text(messages[length - 1]))
            kept = self._kept.get(key)
            if kept is not None:
                break
        if kept is None:
            return 0, (), None
        copies = kept.copies
        known = len(copies)  # <= count: found at a place inside the request
        head = messages[:known] if type(messages) is list else list(messages[:known])
        if copies != head:  # the kept copies on the left: their _Model.__eq__ compares SDK objects
            # changed in place since, or another conversation with that message there: the equal part
            known = next((i for i in range(known) if copies[i] != head[i]), known)
        return known, kept.texts[:known], key

    def join(
        self, messages: Sequence[Any], converted: list[dict[str, Any]], known: int, kept: tuple[str, ...], found: Any
    ) -> list[dict[str, Any]] | str:
        """For an adapter that makes each message a dict in the GenAI schema: ``converted``
        (those after the ``known`` ones whose JSON ``kept`` holds, as :meth:`reuse` gave),
        as the list to encode once, or for a long conversation as the JSON text
        ``_json.dumps`` gives the whole list, each new message encoded alone and kept."""
        if not self.applies(len(messages)):
            return converted
        texts = [*kept, *map(_json.dumps, converted)]
        self.keep(messages, texts, known, found)
        return "[" + ", ".join(texts) + "]"  # the list's encoding: its items, as the encoder separates them

    def keep(self, messages: Sequence[Any], texts: Sequence[str], known: int, found: Any) -> None:
        """Keep ``messages`` with their ``texts`` (one each, in order) for the next call; the
        first ``known`` are those :meth:`reuse` found under ``found`` (copied already)."""
        count = len(messages)
        if not self.applies(count) or len(texts) != count:
            return
        with self._lock:
            before = self._kept.pop(found, None) if found is not None else None
            if before is not None:
                self._chars -= before.chars
        copies = before.copies[:known] if before is not None else []
        try:
            for message in messages[len(copies):]:
                copies.append(snapshot(message))
        except _Unkept:
            return  # a message that cannot be copied: this conversation is encoded whole each time
        kept_texts = tuple(texts)
        chars = sum(map(len, kept_texts))
        if chars > MAX_CHARS // 4:  # one huge conversation would push out the rest
            return
        key = (count, _key_text(messages[-1]))
        with self._lock:
            replaced = self._kept.pop(key, None)  # the same conversation kept by another thread
            self._kept[key] = _Kept(copies, kept_texts, chars)
            self._chars += chars - (replaced.chars if replaced is not None else 0)
            while len(self._kept) > MAX_CONVERSATIONS or self._chars > MAX_CHARS:
                self._chars -= self._kept.pop(next(iter(self._kept))).chars
