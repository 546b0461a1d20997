"""Conversations found on their own: a stitched turn that continues an earlier one's
conversation joins that turn's session (in every mode, while nothing names the session and
:data:`~loopscope.recorder.settings.find_conversations` is on).

A loop sends the whole history with every model call. A request continues an ended
stitched turn when that turn's last request, then its answer, are the start of the new
request. Comparing histories would cost more with every message; instead each ended turn
leaves a key of its boundary: (the length of its last request plus one, a fingerprint of
that request's first message, of its last one, and of the answer's text). A new request is
looked at only at its boundary, its last assistant message ``j`` (found from the end,
usually one step): (``j + 1``, its first message, message ``j - 1``, message ``j``'s text).
A handful of messages are read, however long the conversation: the cost per call is flat
(``benchmarks/bench_conversations.py`` measures it at 10 and 500 messages). A request that
names the answer it continues (OpenAI Responses' ``previous_response_id``: the server keeps
the history) is matched by that id.

The key proves no prefix; it takes two conversations of the same length with the same first
message, the same message before the boundary and the same answer at it to be confused.
What is remembered is bounded: :data:`MAX_REMEMBERED` keys, each forgotten after
:data:`IDLE_EXPIRY` seconds without use.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

MAX_REMEMBERED = 10_000
"""Ended turns remembered at most (the oldest used is forgotten first)."""

IDLE_EXPIRY = 3600.0
"""Seconds an ended turn stays findable after it ended or was last continued."""

_SCAN = 64
"""Messages looked at from the end of a request for its last assistant message: a request
that adds more than this after it starts a conversation of its own."""

Boundary = tuple[int, int, int]
"""What a request leaves for the key of the turn it ends: (its length, the fingerprint of its
first message, of its last)."""


def _get(value: Any, name: str) -> Any:
    if type(value) is dict:  # the common case, without the ABC check
        return value.get(name)
    return value.get(name) if isinstance(value, Mapping) else getattr(value, name, None)


def _text(content: Any) -> str:
    """A message's text: a string, or the text of its parts (OpenAI parts, Anthropic blocks,
    Responses items), nested tool results included; other parts are left out."""
    if content is None:
        return ""
    if type(content) is str:
        return content
    if isinstance(content, (list, tuple)):
        texts = []
        for part in content[:_SCAN]:
            if type(part) is str:
                texts.append(part)
                continue
            text = _get(part, "text")
            if text is None:
                text = _get(part, "content")
                text = _text(text) if text is not None and not isinstance(text, Mapping) else None
            if isinstance(text, str):
                texts.append(text)
        return "\n".join(texts)
    text = _get(content, "text")
    return text if isinstance(text, str) else ""


def _role(message: Any) -> Any:
    return _get(message, "role") or _get(message, "type")


def fingerprint(message: Any) -> int:
    """A message's fingerprint: its role, text and the call id it answers (a tool result's)."""
    try:
        if type(message) is dict:
            get = message.get
            role, content, call_id = get("role") or get("type"), get("content"), get("tool_call_id") or get("call_id")
        else:
            role, content = _role(message), _get(message, "content")
            call_id = _get(message, "tool_call_id") or _get(message, "call_id")
        text = content if type(content) is str else _text(content)
        return hash((role, text, call_id if type(call_id) is str else None))
    except Exception:
        return hash(id(message))  # unreadable: it matches only itself


def answer_print(text: str | None) -> int:
    """The fingerprint of an answer's text, as the model sent it or as the loop sends it
    back (whitespace between parts left out: the two may join parts differently)."""
    return hash("".join((text or "").split()))


def boundary(messages: Sequence[Any]) -> Boundary | None:
    """What a request leaves for the key of the turn it may end; None for an empty one."""
    try:
        if not messages:
            return None
        return (len(messages), fingerprint(messages[0]), fingerprint(messages[-1]))
    except Exception:
        return None


def _continued_key(messages: Sequence[Any]) -> tuple[int, int, int, int] | None:
    """The key of the turn a request would continue: at its last assistant message."""
    count = len(messages)
    for j in range(count - 1, max(count - 1 - _SCAN, 0), -1):  # j >= 1: a message before it
        message = messages[j]
        if _role(message) == "assistant":
            return (j + 1, fingerprint(messages[0]), fingerprint(messages[j - 1]), answer_print(_text(_get(message, "content"))))
    return None


class Conversations:
    """The ended stitched turns' keys, with their sessions: bounded in count and idle time."""

    def __init__(self, max_remembered: int = MAX_REMEMBERED, idle_expiry: float = IDLE_EXPIRY) -> None:
        self.max_remembered = max_remembered
        self.idle_expiry = idle_expiry
        # boundary keys (four ints), and ("response", id) for a server that keeps the
        # conversation itself (OpenAI Responses' ``previous_response_id``)
        self._keys: OrderedDict[tuple[Any, ...], tuple[str, float]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._keys)

    def remember(self, request: Boundary | None, answer: str | None, session_id: str, response_id: str | None = None) -> None:
        """A stitched turn ended: its last request's boundary and the answer that ended it
        (and that answer's response id, which a later request may name as its previous)."""
        found: list[tuple[Any, ...]] = []
        if request is not None:
            found.append((request[0] + 1, request[1], request[2], answer_print(answer)))
        if response_id:
            found.append(("response", response_id))
        now = time.monotonic()
        with self._lock:
            keys = self._keys
            for key in found:
                keys[key] = (session_id, now)
                keys.move_to_end(key)
            self._forget(now)

    def find(self, messages: Sequence[Any] | None, previous_response_id: str | None = None) -> str | None:
        """The session of the ended turn this request continues, or None: the turn whose
        answer ``previous_response_id`` names, else the one at the messages' boundary."""
        key: tuple[Any, ...] | None = None
        if previous_response_id:
            key = ("response", previous_response_id)
        elif messages:
            try:
                key = _continued_key(messages)
            except Exception:
                return None
        if key is None:
            return None
        now = time.monotonic()
        with self._lock:
            found = self._keys.get(key)
            if found is None:
                return None
            if now - found[1] > self.idle_expiry:
                del self._keys[key]
                return None
            self._keys[key] = (found[0], now)  # continued: kept as recently used
            self._keys.move_to_end(key)
            return found[0]

    def _forget(self, now: float) -> None:
        """Drop the oldest used keys beyond the count, and those idle too long (the oldest
        first: one look at the front suffices)."""
        keys = self._keys
        while keys:
            _, (_, used) = next(iter(keys.items()))
            if len(keys) <= self.max_remembered and now - used <= self.idle_expiry:
                break
            keys.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._keys.clear()


conversations = Conversations()
"""This process's remembered conversations (used when :data:`settings.find_conversations` is on)."""
