"""A batch's stored rows made in Python and Arrow, so that each INSERT is a plain ``SELECT *``.

DuckDB binds and plans a statement afresh every time it runs, and with the few hundred rows
of a writer's batch that is most of a statement's cost: the events insert of
:data:`rows.PLAIN_EVENTS_SQL` (ids, types, the content JSON, the JSON check of the tool
arguments) took ~4 ms a batch where an insert of the same rows already made took ~1 ms; the
model calls' and turns' inserts likewise ~3 and ~2.3 ms. So the common batch's rows are
made here, column by column, exactly as that SQL makes them, and inserted by
:data:`EVENTS_INSERT`, :data:`TURNS_INSERT` and :data:`CALLS_INSERT`, which name every
column and have no expression to bind.

Each function returns None for a batch whose rows only DuckDB can make the same (the
writer then runs the SQL of :mod:`rows` on the facts, as before): content made in Python
(state rows, a tool outcome that is not text), a text in a JSON column whose verdict is
DuckDB's own (an escaped lone surrogate, which DuckDB refuses and Python accepts; nesting
deeper than Python parses), a duration DuckDB's ``to_json`` writes another way than
Python's ``repr`` (outside 1e-4..1e15), a fact without its ids. A test writes the same
facts both ways and compares every column.

The JSON check: attribute text kept as it is when it is JSON, as a JSON string otherwise,
as Python's json module decides (:func:`rows.json_text_sql` reproduces that decision in
SQL; they agree on every text but those left to DuckDB above). ``to_json`` of a text is
Python's encoding of a JSON string without ASCII escapes, except that DuckDB writes the
hexadecimal digits of the control characters that have no short escape in capitals.
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
import re
from collections.abc import Callable
from typing import Any, cast

from ... import semconv as a
from .. import rows

__all__ = ["CALLS_INSERT", "EVENTS_INSERT", "TURNS_INSERT", "call_rows", "event_rows", "turn_rows"]

EVENT_ROWS, TURN_ROWS, CALL_ROWS = "_loopscope_event_rows", "_loopscope_turn_rows", "_loopscope_call_rows"

EVENTS_INSERT = f"INSERT INTO events ({', '.join(rows.EVENT_COLUMNS)}) SELECT * FROM {EVENT_ROWS}"
"""Inserts the registered table of :func:`event_rows`."""
TURNS_INSERT = f"INSERT INTO turns ({', '.join(rows.TURN_COLUMNS)}) SELECT * FROM {TURN_ROWS}"
"""Inserts the registered table of :func:`turn_rows`."""
CALLS_INSERT = f"INSERT INTO model_calls ({', '.join(rows.CALL_COLUMNS)}) SELECT * FROM {CALL_ROWS}"
"""Inserts the registered table of :func:`call_rows`."""


class _DuckDBsOwn(Exception):
    """A value whose stored form only DuckDB's SQL gives (the batch goes through it)."""


# -- JSON text as DuckDB's to_json writes it ---------------------------------------------------

_encode: Callable[[str], str] = json.encoder.encode_basestring  # C, where the interpreter has it
_CONTROL = {i: f"\\u{i:04X}" for i in range(0x20)} | {
    0x08: "\\b", 0x09: "\\t", 0x0A: "\\n", 0x0C: "\\f", 0x0D: "\\r", 0x22: '\\"', 0x5C: "\\\\",
}


def to_json_text(text: str) -> str:
    """DuckDB's ``to_json(text)``: a JSON string, non-ASCII as it is."""
    out = _encode(text)
    if "\\u00" in out:  # a control character (or a backslash before "u00"): DuckDB's capitals
        out = '"' + text.translate(_CONTROL) + '"'
    return out


def _double(value: float) -> str:
    """DuckDB's ``to_json`` of a double, where it is Python's ``repr`` (else its own)."""
    if value == 0 or 1e-4 <= abs(value) < 1e15:
        return repr(value)
    raise _DuckDBsOwn


_LONE = re.compile(r"\\u[dD][89a-fA-F]")  # an escaped surrogate (pairs are fine: checked by DuckDB alone)
# json.loads(text) without what it does around its scanner (2.5x faster on short texts):
# the BOM it refuses, the whitespace it skips on either side, the rest it refuses
_scan: Callable[[str, int], tuple[Any, int]] = json.scanner.make_scanner(cast(Any, json.decoder.JSONDecoder()))
_SPACE = re.compile(r"[ \t\n\r]*")  # json.decoder's WHITESPACE


def _skip(text: str, at: int) -> int:
    """Where the whitespace from ``at`` on ends (as json.loads skips it)."""
    match = _SPACE.match(text, at)
    return match.end() if match is not None else at

JSON_TEXT_LIMIT = 128 << 10
"""Characters of JSON text a batch's table checks in Python at most: Python parses ~90 MB/s,
DuckDB's check costs ~1.5 ms to bind and then much less a byte, so past this a batch with
long texts (a long conversation's messages, a large tool result) goes to the SQL."""


def json_text(text: str | None) -> str:
    """What :func:`rows.json_text_sql` makes of ``text``: itself when it is JSON, a JSON
    string of it otherwise, ``null`` for None."""
    if text is None:
        return "null"
    if "\\u" in text and _LONE.search(text):
        raise _DuckDBsOwn
    try:
        if text.startswith("\ufeff"):
            raise ValueError(text)
        end = _scan(text, _skip(text, 0))[1]
        if _skip(text, end) != len(text):
            raise ValueError(text)
    except (ValueError, StopIteration):
        return to_json_text(text)
    except RecursionError:
        raise _DuckDBsOwn from None
    return text


def _long(*columns: Any) -> bool:
    """Whether ``columns`` (of text) hold more than :data:`JSON_TEXT_LIMIT` characters."""
    import pyarrow.compute as pc

    total = 0
    for values in columns:
        total += pc.sum(pc.utf8_length(values)).as_py() or 0  # pyright: ignore[reportAttributeAccessIssue]
    return total > JSON_TEXT_LIMIT


# -- the rows ------------------------------------------------------------------------------------

_LETTER = {rows.TOOL_START: "s", rows.TOOL_END: "e", rows.INPUT_MESSAGE: "i", rows.STATE_SNAPSHOT: "x", rows.STATE_DELTA: "x",
           rows.MODEL_ERROR: "f"}
_TYPE = {rows.TOOL_START: "tool_call_start", rows.TOOL_END: "tool_call_end",
         rows.STATE_SNAPSHOT: "state_snapshot", rows.STATE_DELTA: "state_delta", rows.MODEL_ERROR: "model_error"}
_TOOL_START_TAIL = ',"result":null,"status":"pending","outcome":null,"duration_ms":null,"error":null}'


def _hex(values: list[bytes | None]) -> list[str]:
    if None in values:
        raise _DuckDBsOwn  # no id: whatever the SQL makes of it
    return [value.hex() for value in values]  # type: ignore[union-attr]


def _tool_content(code: int, name: str | None, tool_id: str | None, arguments: str | None, result: str | None,
                  status: str | None, outcome: str | None, ms: float | None, error: str | None) -> str | None:
    # the SQL's || gives NULL when any part is NULL (coalesce only around the error)
    if name is None or tool_id is None:
        return None
    head = f'{{"type":"tool_call","tool_name":{to_json_text(name)},"tool_id":{to_json_text(tool_id)},"arguments":{json_text(arguments)}'
    if code == rows.TOOL_START:
        return head + _TOOL_START_TAIL
    if status is None or outcome is None or ms is None:
        return None
    return (
        f'{head},"result":{json_text(result)},"status":{to_json_text(status)},"outcome":{to_json_text(outcome)}'
        f',"duration_ms":{_double(ms)},"error":{"null" if error is None else to_json_text(error)}}}'
    )


def event_rows(events: Any, *, any_length: bool = False) -> Any:
    """The ``events`` rows of a table of event facts with an ``idx`` column (``write_batch``'s),
    as :data:`rows.PLAIN_EVENTS_SQL` makes them, in :data:`rows.EVENT_COLUMNS`' order; None
    when DuckDB's SQL must make them (see the module's docstring). ``any_length``: past
    :data:`JSON_TEXT_LIMIT` too (a batch whose large values are cut into parts: Python's
    check of a 1 MiB text, ~10 ms, cost less than DuckDB's rows read back as Arrow, ~75 ms
    in a batch of 32 such values)."""
    import pyarrow as pa

    column = events.column
    if column("content").null_count != events.num_rows:
        return None  # content made in Python: rows.EVENTS_SQL
    codes = column("code").to_pylist()
    if None in codes or (not any_length and _long(column("arguments"), column("result"))):
        return None
    try:
        traces, spans = _hex(column("trace_id").to_pylist()), _hex(column("span_id").to_pylist())
        tool = [code <= rows.TOOL_END for code in codes]
        fields = ("tool_name", "tool_id", "arguments", "result", "tool_status", "outcome", "duration_ms", "error", "body")

        def values(name: str) -> Any:
            # a batch of large values (any_length) reads its texts one at a time, and its
            # contents go into Arrow as they are made: a batch's texts as Python strings, and
            # its contents too, were two more copies of its values held at once (issue 30)
            if any_length and name in ("arguments", "result", "body"):
                return (value.as_py() for value in column(name))
            return column(name).to_pylist()

        made = (
            _tool_content(code, name, tool_id, arguments, result, status, outcome, ms, error) if is_tool
            else None if body is None
            else f'{{"type":"text","body":{to_json_text(body)},"role":"{"user" if code == rows.INPUT_MESSAGE else "assistant"}"}}'
            for code, is_tool, name, tool_id, arguments, result, status, outcome, ms, error, body in zip(
                codes, tool, *(values(f) for f in fields), strict=True
            )
        )
        content = pa.array(made if any_length else list(made), pa.string())
    except _DuckDBsOwn:
        return None
    letter, kind = _LETTER.get, _TYPE.get
    tools = pa.array(tool, pa.bool_())
    nothing = pa.nulls(events.num_rows, pa.string())
    status = pa.array(["blocked" if b else "delivered" for b in column("blocked").to_pylist()], pa.string())
    tool_status = [("pending" if code == rows.TOOL_START else s) if code <= rows.TOOL_END else None
                   for code, s in zip(codes, column("tool_status").to_pylist(), strict=True)]
    only_tools = _only(tools, nothing)
    return pa.table(
        [
            pa.array([t + s + letter(code, "m") for t, s, code in zip(traces, spans, codes, strict=True)], pa.string()),
            column("session_id"), column("idx"),
            pa.array([kind(code, "message") for code in codes], pa.string()),
            column("created_us"), column("correlation_id"), column("source_channel_id"), column("source_provider"),
            column("source_framework"), status, content,
            pa.array(traces, pa.string()), pa.array(spans, pa.string()),
            only_tools(column("tool_name")), only_tools(column("tool_id")), pa.array(tool_status, pa.string()),
            only_tools(column("outcome")), _only(tools, pa.nulls(events.num_rows, pa.float64()))(column("duration_ms")),
        ],
        names=list(rows.EVENT_COLUMNS),
    )


def _only(mask: Any, nothing: Any) -> Callable[[Any], Any]:
    """A column's values where ``mask`` holds, NULL elsewhere."""
    import pyarrow.compute as pc

    return lambda values: pc.if_else(mask, values, nothing)  # pyright: ignore[reportAttributeAccessIssue]


_USAGE_KEYS = tuple(a.USAGE_ATTRIBUTES)  # the order of rows.TURNS_SQL's usage JSON


def turn_rows(turns: Any) -> Any:
    """The ``turns`` rows of a table of turn facts, as :data:`rows.TURNS_SQL` makes them, in
    :data:`rows.TURN_COLUMNS`' order; None when DuckDB's SQL must make them."""
    import pyarrow as pa

    column = turns.column
    try:
        traces, spans = _hex(column("trace_id").to_pylist()), _hex(column("span_id").to_pylist())
    except _DuckDBsOwn:
        return None
    correlations = [c if c is not None else s for c, s in zip(column("correlation_id").to_pylist(), spans, strict=True)]
    usage = column("usage").to_pylist()
    if None in usage:  # the usage JSON of the token counts, where the mapping did not make one
        counts = zip(*(column(key).to_pylist() for key in _USAGE_KEYS), strict=True)
        usage = [u if u is not None else _usage_json(values) for u, values in zip(usage, counts, strict=True)]
    by_name = {
        "correlation_id": pa.array(correlations, pa.string()), "usage": pa.array(usage, pa.string()),
        "timestamp": column("timestamp_us"), "trace_id": pa.array(traces, pa.string()), "span_id": pa.array(spans, pa.string()),
    }
    return pa.table([by_name[name] if name in by_name else column(name) for name in rows.TURN_COLUMNS], names=list(rows.TURN_COLUMNS))


def _usage_json(values: tuple[int | None, ...]) -> str:
    # '{' || concat_ws(',', '"key":' || value, ...) || '}': a NULL value's pair is left out
    return "{" + ",".join(f'"{key}":{value}' for key, value in zip(_USAGE_KEYS, values, strict=True) if value is not None) + "}"


_CALL_RENAMED = {"started_at": "started_us", "ended_at": "ended_us"}
_CALL_JSON = ("provider_usage", "input_messages", "output_messages")


def call_rows(calls: Any) -> Any:
    """The ``model_calls`` rows of a table of model call facts, as :data:`rows.CALLS_SQL`
    makes them, in :data:`rows.CALL_COLUMNS`' order; None when DuckDB's SQL must make them."""
    import pyarrow as pa

    column = calls.column
    if _long(*(column(name) for name in _CALL_JSON)):
        return None
    try:
        by_name = {"trace_id": _hex(column("trace_id").to_pylist()), "span_id": _hex(column("span_id").to_pylist())}
        for name in _CALL_JSON:  # NULL stays NULL here
            by_name[name] = [None if text is None else json_text(text) for text in column(name).to_pylist()]  # type: ignore[misc]
    except _DuckDBsOwn:
        return None
    return pa.table(
        [pa.array(by_name[name], pa.string()) if name in by_name else column(_CALL_RENAMED.get(name, name)) for name in rows.CALL_COLUMNS],
        names=list(rows.CALL_COLUMNS),
    )
