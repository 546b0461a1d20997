"""The application's values at the hand API, made into what a turn records, never raising.

``loopscope.turn(session_id=12345)``, ``usage={"input_tokens": float("nan")}``: what the
application hands over is whatever its data held. An id or a name that is not text is
recorded as text (``"12345"``); a usage value that is not a token count is left out of
the usage, said once in the log (``loopscope`` logger) and kept, as text, in the span's
``loopscope.usage.invalid`` attribute, so nothing is silently lost and the call goes on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import _json
from .._guard import warn_once
from ..semconv import MAX_COUNT, token_count


def text(value: Any) -> str | None:
    """An id, a name or a text as ``str`` (None stays None): see :func:`loopscope._json.to_text`.
    A ``str`` subclass (an SDK's open enum: mistralai's ``UnrecognizedStr``, a ``StrEnum``)
    is the text it holds, not its JSON."""
    if value is None or type(value) is str:
        return value
    if isinstance(value, str):
        return str.__str__(value)
    return _json.to_text(value)


def flag(value: Any) -> bool:
    """A yes/no the application gave, as ``bool`` (a value whose truth cannot be told: False)."""
    try:
        return bool(value)
    except Exception:
        kind = type(value).__qualname__
        warn_once(f"flag:{kind}", "loopscope: a %s given as a flag has no truth value; taken as False", kind)
        return False


def time_ns(value: Any, what: str) -> int | None:
    """A time in nanoseconds since the epoch (an int, or a finite float), else None: now."""
    if value is None or (type(value) is int and 0 <= value <= MAX_COUNT):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < MAX_COUNT:  # NaN is not
        return int(value)
    warn_once(
        f"time:{what}", "loopscope: %s=%s is not a time in nanoseconds since the epoch; the time of recording is used",
        what, _short(value),
    )
    return None


_LONGEST_MS = 9e12  # some 285 years: past it, not a duration (its nanoseconds would not fit an int64)


def duration_ms(value: Any) -> float | None:
    """A duration in milliseconds (finite, not negative), else None."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < _LONGEST_MS:  # NaN is not
        return float(value)
    warn_once("duration_ms", "loopscope: duration_ms=%s is not a duration; the recorded one is kept", _short(value))
    return None


def add_usage(into: dict[str, int], usage: Any) -> dict[str, str] | None:
    """Add the token counts of ``usage`` to ``into``; return what is not one (key -> the
    value as text; None when all were), each said once per key in the log."""
    if type(usage) is dict:  # the common case, checked first: str keys, int counts
        for key, value in usage.items():
            if value is not None and not (type(value) is int and type(key) is str and 0 <= value <= MAX_COUNT):
                break
        else:
            for key, value in usage.items():
                if value is not None:
                    into[key] = into.get(key, 0) + value
            return None
    invalid: dict[str, str] = {}
    if usage is None:
        return None
    if not isinstance(usage, Mapping):
        # a pydantic usage object: its fields; text is no usage
        converted = None if isinstance(usage, (str, bytes, bytearray)) else _json.to_jsonable(usage)
        if not isinstance(converted, dict):
            _reject(invalid, "usage", usage)
            return invalid
        usage = converted
    try:
        items = list(usage.items())
    except Exception:
        _reject(invalid, "usage", usage)
        return invalid
    for key, value in items:
        if value is None:
            continue
        name = key if type(key) is str else _json.to_text(key)
        count = token_count(value)
        if count is None:
            _reject(invalid, name, value)
        else:
            into[name] = into.get(name, 0) + count
    return invalid or None


def items(values: Any, what: str) -> list[Any]:
    """The items of a list the application gave; a value that is not one gives none (said once)."""
    if isinstance(values, (str, bytes)):
        return [values]
    try:
        return list(values)
    except Exception:
        warn_once(f"items:{what}", "loopscope: %s=%s is not a list; left out", what, _short(values))
        return []


def count(value: Any, what: str) -> int | None:
    """A count (tool calls, rounds) as :func:`~loopscope.semconv.token_count` reads it;
    None (said once in the log) for anything else."""
    found = token_count(value)
    if found is None and value is not None:
        warn_once(f"count:{what}", "loopscope: %s=%s is not a count; left out", what, _short(value))
    return found


def _reject(invalid: dict[str, str], key: str, value: Any) -> None:
    invalid[key] = _json.to_text(value)
    warn_once(
        f"usage:{key[:100]}",
        "loopscope: usage %s=%s is not a token count (a whole number from 0 to 2**63-1); it is left out of the "
        "usage and kept as text in the span attribute loopscope.usage.invalid",
        key[:100], _short(value),
    )


def _short(value: Any) -> str:
    shown = _json.to_text(value)
    return shown if len(shown) <= 80 else shown[:80] + "…"
