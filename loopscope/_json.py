"""Turn arbitrary Python values into JSON text without ever raising.

Tool arguments and results are whatever the user's code passes: bytes, datetimes,
sets, custom objects, cycles, integers too long for Python to write in decimal. Each
is kept in a readable form rather than lost.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import re
import sys
from collections.abc import Callable, Mapping
from contextlib import suppress
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from enum import Enum
from pathlib import PurePath
from typing import Any, cast
from uuid import UUID

_MAX_DEPTH = 64


def to_jsonable(value: Any) -> Any:
    """A JSON-compatible copy of ``value``; unknown objects become their ``repr``."""
    return _convert(value, set(), 0)


# ``json.dumps(value, ensure_ascii=False)`` builds a new JSONEncoder on every call, which
# costs more than encoding a small value. One shared encoder gives the very same text
# (``dumps`` is exactly ``JSONEncoder(**options).encode``) and is safe to share between
# threads: ``encode`` keeps no state on the instance.
_encode = json.JSONEncoder(ensure_ascii=False).encode
_encode_str = json.encoder.encode_basestring  # what that encoder does with a str


def _c_iterencode() -> Any:
    """``encode``'s C encoder, made once: ``encode`` builds it anew (and a ``markers`` dict
    for cycles) on every call, which costs more than encoding a small value. Made with the
    same options it gives the same text; without ``markers`` a cycle raises
    ``RecursionError`` instead of ``ValueError``, and both fall back to :func:`to_jsonable`
    in :func:`dumps`. It keeps no state between calls: threads share it. None without the
    C accelerator (or if it does not answer as ``encode`` does)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    options = json.JSONEncoder(ensure_ascii=False)
    iterencode = make(
        None, options.default, _encode_str, None, options.key_separator, options.item_separator,
        options.sort_keys, options.skipkeys, options.allow_nan,
    )
    probe = {"a": [1, 2.5, None, True, "é"], "b": {"c": float("nan")}}
    return iterencode if "".join(iterencode(probe, 0)) == _encode(probe) else None


_iterencode = _c_iterencode()
_join = "".join


def dumps(value: Any) -> str:
    """JSON text for ``value``; the fast path is plain ``json.dumps``."""
    text = plain(value)
    return text if text is not None else _encode(to_jsonable(value))


def plain(value: Any) -> str | None:
    """The JSON text :func:`dumps` gives ``value`` when it needs none of its fallbacks (no
    value the encoder refuses, no lone surrogate), else None. For text assembled from parts
    encoded once each (an answer's tool-call arguments, kept for their ``execute_tool``
    spans): the parts joined are the whole's :func:`dumps`, since the encoder writes a
    value the same wherever it sits, and only a fallback (which converts the whole) differs."""
    try:
        if type(value) is str:
            text = _encode_str(value)
        elif _iterencode is not None:
            text = _join(_iterencode(value, 0))
        else:
            text = _encode(value)
    except (TypeError, ValueError, RecursionError):
        return None
    return text if text.isascii() or _encodable(text) else None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:  # a lone surrogate somewhere inside
        return False


# what json.loads runs, after three Python frames: the scanner JSONDecoder.__init__ sets
# (typeshed does not declare the attribute)
_scan_once: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # pyright: ignore[reportAttributeAccessIssue]
# json.decoder.WHITESPACE's pattern (typeshed has no WHITESPACE); `*` matches everywhere, never None
_whitespace = cast("Callable[[str, int], re.Match[str]]", re.compile(r"[ \t\n\r]*").match)
_WHITESPACE_CHARS = frozenset(" \t\n\r")  # what it matches


def parse(text: str) -> Any:
    """``json.loads(text)`` for a ``str``: the same value, or the same ``JSONDecodeError``
    (a ``ValueError``), without the frames of ``loads``, ``decode`` and ``raw_decode``."""
    if text.startswith("\ufeff"):
        return json.loads(text)  # the error json.loads gives for it
    end = _whitespace(text, 0).end() if text[:1] in _WHITESPACE_CHARS else 0
    try:
        value, end = _scan_once(text, end)
    except StopIteration as err:
        raise json.JSONDecodeError("Expecting value", text, err.value) from None
    if end != len(text):  # what is left may only be whitespace
        end = _whitespace(text, end).end()
        if end != len(text):
            raise json.JSONDecodeError("Extra data", text, end)
    return value


def result_value(content: Any) -> Any:
    """A tool result as the application sent it; JSON text becomes the value it encodes."""
    if isinstance(content, str):
        stripped = content.lstrip()
        if stripped[:1] in ("{", "["):
            try:
                return parse(content)  # json.loads, without its frames
            except ValueError:
                pass
    return content


def loads(text: str | None) -> Any:
    """Parse stored JSON text; ``None`` stays ``None``."""
    if text is None:
        return None
    return json.loads(text)


def to_text(value: Any) -> str:
    """``value`` as text, never raising: a ``str`` as it is (lone surrogates escaped),
    anything else as the JSON text of its readable form (``12345`` -> ``"12345"``, a
    datetime -> its ISO form, bytes -> their UTF-8 text, an object -> its ``repr``).
    For ids and names the application passes as something other than text."""
    converted = _convert(value, set(), 0)
    return converted if isinstance(converted, str) else _encode(converted)


def _int(value: int) -> int | str:
    """An ``int`` as JSON takes it, or, past the digits Python writes in decimal
    (``sys.get_int_max_str_digits``: writing more raises ``ValueError``), its exact hex
    text (``"0x..."``, ``int(text, 16)`` reads it back), which costs time in proportion
    to its size only."""
    limit = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 0  # 3.10 before .7: none
    # bit_length * log10(2) bounds the digit count from below: under it, decimal is allowed
    if not limit or value.bit_length() * 0.30102999566398 < limit - 1:
        return value
    try:
        int.__repr__(value)
        return value
    except ValueError:
        return hex(value)


def _safe_repr(value: Any) -> str:
    try:
        return repr(value)
    except Exception as exc:  # a __repr__ that raises must not lose the rest
        return f"<unrepresentable {type(value).__qualname__}: {type(exc).__name__}>"


def _convert(value: Any, seen: set[int], depth: int) -> Any:
    if isinstance(value, str):
        # lone surrogates cannot be encoded as UTF-8: keep them visible, escaped
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return _int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)  # NaN and the infinities are not JSON
    if depth > _MAX_DEPTH:
        return "<too deep>"
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return {"$bytes_base64": base64.b64encode(raw).decode("ascii")}
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, (Decimal, UUID, PurePath)):
        return str(value)
    if isinstance(value, Enum):
        return _convert(value.value, seen, depth + 1)
    ident = id(value)
    if ident in seen:
        return "<cycle>"
    seen.add(ident)
    try:
        if isinstance(value, Mapping):
            return {to_text(k): _convert(v, seen, depth + 1) for k, v in list(value.items())}
        if isinstance(value, (list, tuple)):
            return [_convert(v, seen, depth + 1) for v in value]
        if isinstance(value, (set, frozenset)):
            items = [_convert(v, seen, depth + 1) for v in value]
            try:
                return sorted(items)
            except TypeError:
                return items
        model_dump = getattr(value, "model_dump", None)
        # a model_dump or a field that raises: the next way, down to the repr
        if callable(model_dump):
            with suppress(Exception):
                return _convert(model_dump(mode="json"), seen, depth + 1)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            with suppress(Exception):
                fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
                return _convert(fields, seen, depth + 1)
        return _safe_repr(value)
    finally:
        seen.discard(ident)

