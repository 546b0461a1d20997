"""Reading an AG-UI event stream: SSE, JSON lines, a JSON array, or event objects.

Every event comes out as a :class:`Received`: where it was in the input (for error
messages), its JSON text exactly as it arrived (what the store keeps verbatim), the
parsed JSON, and the ``ag_ui.core`` model it validates as. The whole input is read and
checked before anything is stored, so a malformed stream changes nothing.

Events of the 0.x protocol that 1.0 retired (``THINKING_*``) are read as their
``REASONING_*`` successors, as the TypeScript client's compatibility boundary does; their
raw text is kept as it came.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

__all__ = ["AguiFormatError", "Received", "Source", "read_events"]

Source = str | bytes | bytearray | os.PathLike | IO[str] | IO[bytes] | Iterable[Any]
"""What :func:`read_events` takes: stream text or bytes (SSE, JSON lines or a JSON array),
a path to a file holding one, an open file, or an iterable of ``ag_ui.core`` events,
dicts or JSON texts."""


class AguiFormatError(ValueError):
    """The input is not a valid AG-UI event stream; the message names the line (or the
    position of the event in an iterable) where it goes wrong."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where


@dataclass(frozen=True)
class Received:
    """One event as it arrived."""

    where: str  # "line 12" (text input) or "event 3" (an iterable of events)
    raw: str  # the event's JSON text, exactly as received
    data: dict[str, Any]  # the parsed JSON, THINKING_* translated
    event: Any  # the ag_ui.core model it validates as
    type: str  # the event type as it arrived (THINKING_START stays so)


def read_events(source: Source) -> list[Received]:
    """Every event of ``source``, parsed and validated; raises :class:`AguiFormatError`."""
    texts = list(_texts(source))
    legacy = _Legacy()
    return [_validate(where, raw, data, legacy) for where, raw, data in texts]


# -- from the input to JSON texts ------------------------------------------------------------


def _texts(source: Source) -> Iterator[tuple[str, str, dict[str, Any]]]:
    if isinstance(source, (bytes, bytearray)):
        yield from _parse_text(_decode(bytes(source)))
    elif isinstance(source, str):
        yield from _parse_text(source)
    elif isinstance(source, os.PathLike):
        yield from _parse_text(_decode(Path(source).read_bytes()))
    elif hasattr(source, "read"):
        content = cast("IO[Any]", source).read()  # an open file, text or binary
        yield from _parse_text(_decode(content) if isinstance(content, (bytes, bytearray)) else content)
    else:
        yield from _objects(source)


def _decode(content: bytes | bytearray) -> str:
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = content.count(b"\n", 0, exc.start) + 1
        raise AguiFormatError(f"line {line}", f"not UTF-8 text (byte {exc.start})") from None
    return text.removeprefix("\ufeff")


def _parse_text(text: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
    first = text.lstrip()
    if not first:
        return
    if first[0] == "{":
        yield from _json_lines(text)
    elif first[0] == "[":
        yield from _json_array(text)
    else:
        yield from _sse(text)


_LINES = re.compile(r"\r\n|\r|\n")


def _split_lines(text: str) -> list[str]:
    return _LINES.split(text)


def _object(where: str, raw: str) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise AguiFormatError(where, f"not JSON ({exc.msg} at column {exc.colno})") from None
    except ValueError as exc:  # JSON Python refuses to read: an integer past its digit limit
        raise AguiFormatError(where, f"not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise AguiFormatError(where, f"an AG-UI event is a JSON object, not {type(data).__name__}")
    return data


def _json_lines(text: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for number, line in enumerate(_split_lines(text), 1):
        if not line.strip():
            continue
        where = f"line {number}"
        yield where, line, _object(where, line)


def _json_array(text: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """A JSON array of events; each element's text is cut out of the input as it is."""
    decoder = json.JSONDecoder()
    ws = re.compile(r"\s*")
    pos = ws.match(text, text.index("[") + 1).end()  # type: ignore[union-attr]

    def line_at(offset: int) -> str:
        return f"line {text.count(chr(10), 0, offset) + 1}"

    if text.startswith("]", pos):
        pos += 1
    else:
        while True:
            try:
                value, end = decoder.raw_decode(text, pos)
            except json.JSONDecodeError as exc:
                raise AguiFormatError(line_at(exc.pos), f"not JSON ({exc.msg})") from None
            except ValueError as exc:  # JSON Python refuses to read: an integer past its digit limit
                raise AguiFormatError(line_at(pos), f"not readable JSON ({exc})") from None
            where = line_at(pos)
            if not isinstance(value, dict):
                raise AguiFormatError(where, f"an AG-UI event is a JSON object, not {type(value).__name__}")
            yield where, text[pos:end], value
            pos = ws.match(text, end).end()  # type: ignore[union-attr]
            if text.startswith(",", pos):
                pos = ws.match(text, pos + 1).end()  # type: ignore[union-attr]
                continue
            if text.startswith("]", pos):
                pos += 1
                break
            raise AguiFormatError(line_at(pos), "the JSON array is cut short or broken (expected ',' or ']')")
    if text[pos:].strip():
        raise AguiFormatError(line_at(pos), "text after the end of the JSON array")


def _sse(text: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """Server-sent events (the WHATWG rules): ``data:`` lines joined by newlines make an
    event's data, a blank line dispatches it; comments, ``event``, ``id`` and ``retry``
    carry nothing AG-UI needs."""
    lines = _split_lines(text)
    # a final newline leaves one empty string after it: not a line of its own
    if lines and lines[-1] == "":
        lines.pop()
    data: list[str] = []
    start = 0
    seen_field = False
    for number, line in enumerate(lines, 1):
        if line == "":
            if data:
                where = f"line {start}"
                raw = "\n".join(data)
                yield where, raw, _object(where, raw)
            data, seen_field = [], False
            continue
        if line.startswith(":"):
            continue
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            if not data:
                start = number
            data.append(value)
        elif name in ("event", "id", "retry"):
            pass
        elif not seen_field and not data:
            raise AguiFormatError(f"line {number}", "neither SSE ('data: {...}' lines) nor JSON lines")
        seen_field = True
    if data:
        raise AguiFormatError(
            f"line {start}",
            "the SSE stream is truncated: its last event is not ended by a blank line",
        )


def _objects(source: Iterable[Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for number, item in enumerate(source, 1):
        where = f"event {number}"
        if isinstance(item, str):
            yield where, item, _object(where, item)
        elif isinstance(item, dict):
            try:
                raw = json.dumps(item, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise AguiFormatError(where, f"not JSON-serializable ({exc})") from None
            yield where, raw, json.loads(raw)
        elif hasattr(item, "model_dump_json"):
            # what ag_ui's EventEncoder puts on the wire
            raw = item.model_dump_json(by_alias=True)
            yield where, raw, json.loads(raw)
        else:
            kind = type(item).__name__
            raise AguiFormatError(where, f"expected an ag_ui.core event, a dict or JSON text, not {kind}")


# -- validation ---------------------------------------------------------------------------------

_LEGACY = {
    "THINKING_START": "REASONING_START",
    "THINKING_END": "REASONING_END",
    "THINKING_TEXT_MESSAGE_START": "REASONING_MESSAGE_START",
    "THINKING_TEXT_MESSAGE_CONTENT": "REASONING_MESSAGE_CONTENT",
    "THINKING_TEXT_MESSAGE_END": "REASONING_MESSAGE_END",
}
"""0.x events and their 1.0 successors (ag-ui's DEPRECATIONS.md)."""


class _Legacy:
    """THINKING_* to REASONING_*, as the TypeScript ``BackwardCompatibility_0_0_45``
    does, with ids derived from the event's text and position instead of random ones,
    so that a re-import of the same stream reads the same."""

    def __init__(self) -> None:
        self.reasoning_id: str | None = None
        self.message_id: str | None = None
        self.count = 0

    def _new_id(self, raw: str) -> str:
        self.count += 1
        return "thinking-" + hashlib.blake2b(f"{self.count}\0{raw}".encode(), digest_size=8).hexdigest()

    def upgrade(self, data: dict[str, Any], raw: str) -> dict[str, Any]:
        kind = data.get("type")
        target = _LEGACY.get(kind) if isinstance(kind, str) else None
        if target is None:
            return data
        data = {**data, "type": target}
        if kind == "THINKING_START":
            data.pop("title", None)
            self.reasoning_id = self._new_id(raw)
            data["messageId"] = self.reasoning_id
        elif kind == "THINKING_TEXT_MESSAGE_START":
            self.message_id = self._new_id(raw)
            data["messageId"] = self.message_id
            data["role"] = "reasoning"
        elif kind in ("THINKING_TEXT_MESSAGE_CONTENT", "THINKING_TEXT_MESSAGE_END"):
            data["messageId"] = self.message_id or self._new_id(raw)
        else:  # THINKING_END
            data["messageId"] = self.reasoning_id or self._new_id(raw)
        return data


_adapter: Any = None


def _event_adapter() -> Any:
    global _adapter
    if _adapter is None:
        from ag_ui.core import Event  # imported here: importing loopscope never needs ag_ui
        from pydantic import TypeAdapter

        _adapter = TypeAdapter(Event)
    return _adapter


def _validate(where: str, raw: str, data: dict[str, Any], legacy: _Legacy) -> Received:
    from ag_ui.core import EventType
    from pydantic import ValidationError

    kind = data.get("type")
    if kind is None:
        raise AguiFormatError(where, "an AG-UI event needs a 'type'")
    data = legacy.upgrade(data, raw)
    if data["type"] not in EventType._value2member_map_:
        raise AguiFormatError(where, f"unknown AG-UI event type {kind!r}")
    try:
        event = _event_adapter().validate_python(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'][1:]) or 'event'}: {err['msg']}" for err in exc.errors()[:3]
        )
        raise AguiFormatError(where, f"invalid {data['type']} event ({problems})") from None
    return Received(where, raw, data, event, str(kind))
