"""The span-to-row mapping: GenAI spans in, activity events and turn summaries out.

It is a pure function of the spans, so the same rows come out whether a span was
recorded in this process or received over OTLP. A tool call's start row comes from the
``execute_tool`` span's start; a text segment from a ``chat`` span's end; the turn
summary from the ``invoke_agent`` span's end.

The work is split in two, so that little of it runs in Python per row:

* :func:`collect` reads each span once and keeps a flat tuple of plain values per row
  (a *fact*): ids as bytes, times, and the attribute values as they are, normalized
  only where a value is not the plain string the common case has. :class:`Facts` (the
  entry point) collects spans a chunk at a time into Arrow record batches.
* :data:`EVENTS_SQL` and :data:`TURNS_SQL` make the stored rows from a batch of facts
  in one vectorized statement each: hex ids, event ids and types, the ``content`` JSON,
  the usage JSON, and the choice between keeping attribute text as JSON and keeping it
  as a JSON string (exactly as Python's json module would decide).

Whatever the facts cannot express (a tool outcome that is not a string, a round's text
that is not a string) gets its content from the plain Python mapping at the end of this
module (:func:`_tool_content`, :func:`_text_content`), carried in the fact as an
override, so every value gives the row it always gave.
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Callable, Iterable
from typing import Any

from .. import _json, semconv as a
from .._guard import internal_error
from ..models import RESPONSE_SEGMENT_SEPARATOR

_START, _END = 0, 1

# -- event facts -------------------------------------------------------------------------
#
# One tuple per event row, in this field order (EVENT_FIELDS). ``code`` says which row:
TOOL_START, TOOL_END, INPUT_MESSAGE, ROUND_MESSAGE = 0, 1, 2, 3
STATE_SNAPSHOT, STATE_DELTA = 4, 5  # from a state span's end; their content is made in Python
EVENT_TYPES = {
    TOOL_START: "tool_call_start", TOOL_END: "tool_call_end", INPUT_MESSAGE: "message", ROUND_MESSAGE: "message",
    STATE_SNAPSHOT: "state_snapshot", STATE_DELTA: "state_delta",
}

EVENT_FIELDS = (
    "code",  # TOOL_START .. ROUND_MESSAGE
    "trace_id",  # 16 bytes, big-endian
    "span_id",  # 8 bytes, big-endian
    "created_us",  # microseconds since the epoch
    "session_id",  # final
    "correlation_id",  # the attribute value as it is
    "source_channel_id",  # as it is
    "source_provider",  # as it is
    "source_framework",  # as it is
    "blocked",  # bool
    "tool_name",  # final text (tool rows)
    "tool_id",  # final text (tool rows)
    "arguments",  # attribute text, JSON or not; None for JSON null (tool rows)
    "result",  # the same (tool end rows)
    "tool_status",  # final text (tool end rows)
    "outcome",  # final text (tool end rows)
    "error",  # final text or None (tool end rows)
    "duration_ms",  # float (tool end rows)
    "body",  # final text (message rows)
    "content",  # the content JSON made in Python, when the values called for it; else None
)
SESSION = EVENT_FIELDS.index("session_id")
_session_of = operator.itemgetter(SESSION)

# -- turn facts --------------------------------------------------------------------------

TURN_FIELDS = (
    "trace_id",
    "span_id",
    "correlation_id",  # final, or None for the span id
    "session_id",  # final
    "channel_id",
    "parent_correlation_id",
    "response_content",
    "segments",  # JSON text
    "tool_calls_count",
    "round_count",
    "input_tokens",  # the usage values, as ints or None
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "reasoning_tokens",
    "usage",  # the usage JSON made in Python, when the values called for it; else None
    "thinking",
    "loop_end_reason",
    "latency_ms",
    "streaming",
    "timestamp_us",
    "declared_tools",  # JSON text
    "model",
    "provider",
    "error",
)
_USAGE_KEYS = tuple(a.USAGE_ATTRIBUTES)
assert TURN_FIELDS[10:15] == _USAGE_KEYS


@functools.lru_cache(maxsize=None)
def arrow_schemas() -> tuple[Any, Any]:
    """The Arrow types of event facts and turn facts, in field order."""
    import pyarrow as pa  # imported here: a plain import of loopscope never needs it

    text, us = pa.string(), pa.timestamp("us", tz="UTC")
    events = pa.struct([
        ("code", pa.int8()), ("trace_id", pa.binary(16)), ("span_id", pa.binary(8)), ("created_us", us),
        *((name, text) for name in EVENT_FIELDS[4:9]), ("blocked", pa.bool_()),
        *((name, text) for name in EVENT_FIELDS[10:17]), ("duration_ms", pa.float64()), ("body", text), ("content", text),
    ])
    turns = pa.struct([
        ("trace_id", pa.binary(16)), ("span_id", pa.binary(8)), *((name, text) for name in TURN_FIELDS[2:8]),
        ("tool_calls_count", pa.int32()), ("round_count", pa.int32()), *((name, pa.int64()) for name in _USAGE_KEYS),
        ("usage", text), ("thinking", text), ("loop_end_reason", text), ("latency_ms", pa.float64()), ("streaming", pa.bool_()),
        ("timestamp_us", us), *((name, text) for name in TURN_FIELDS[21:]),
    ])
    assert [f.name for f in events] == list(EVENT_FIELDS) and [f.name for f in turns] == list(TURN_FIELDS)
    return events, turns


# -- from facts to rows, in SQL ------------------------------------------------------------

# Attribute text that should hold JSON is kept as it is when it is JSON, and as a JSON
# string otherwise, exactly as Python's json module decides. DuckDB's json_valid accepts
# a little more (trailing commas; nan and inf in any spelling): text in which such a thing
# may hide (SUSPECT) is checked once more with its strings blanked out, and refused if it
# has a trailing comma, a literal other than the six Python accepts, or a stray sign.
# DuckDB refuses escaped lone surrogates, which Python accepts: those texts are kept as
# JSON strings (a JSON column could not hold them).
_SUSPECT = r",\s*[\]}]|(^|[\[:,])\s*[-+]?([nN][aA][nN]|[iI][nN][fF])"
_STRING = r'"(\\.|[^"\\])*"'
_LITERAL = r"-?Infinity|NaN|true|false|null"
_REFUSED = r",\s*[\]}]|[a-df-zA-DF-Z]|(^|[^eE])\+|-[^0-9]"


def json_text_sql(column: str) -> str:
    """SQL for the JSON a text column stands for: its text, a JSON string, or ``null``."""
    return (
        f"CASE WHEN {column} IS NULL THEN 'null' "
        f"WHEN NOT json_valid({column}) THEN to_json({column})::VARCHAR "
        f"WHEN NOT regexp_matches({column}, '{_SUSPECT}') THEN {column} "
        f"WHEN regexp_matches(regexp_replace(regexp_replace({column}, '{_STRING}', '\"\"', 'g'), '{_LITERAL}', '@', 'g'), "
        f"'{_REFUSED}') THEN to_json({column})::VARCHAR "
        f"ELSE {column} END"
    )


EVENTS_TABLE, TURNS_TABLE = "_loopscope_event_facts", "_loopscope_turn_facts"

_TOOL_CONTENT = (
    """'{"type":"tool_call","tool_name":' || to_json(tool_name) || ',"tool_id":' || to_json(tool_id)"""
    f""" || ',"arguments":' || {json_text_sql("arguments")} || CASE code WHEN {TOOL_START} THEN"""
    """ ',"result":null,"status":"pending","outcome":null,"duration_ms":null,"error":null}'"""
    f""" ELSE ',"result":' || {json_text_sql("result")}"""
    """ || ',"status":' || to_json(tool_status) || ',"outcome":' || to_json(outcome)"""
    """ || ',"duration_ms":' || to_json(duration_ms) || ',"error":' || coalesce(to_json(error)::VARCHAR, 'null') || '}' END"""
)
_TEXT_CONTENT = (
    f"""'{{"type":"text","body":' || to_json(body) || CASE code WHEN {INPUT_MESSAGE} THEN ',"role":"user"}}'"""
    """ ELSE ',"role":"assistant"}' END"""
)

EVENT_COLUMNS = (
    "id", "session_id", "idx", "type", "created_at", "correlation_id", "source_channel_id", "source_provider",
    "source_framework", "status", "content", "trace_id", "span_id",
    "tool_name", "tool_call_id", "tool_status", "tool_outcome", "tool_duration_ms",
)
"""The columns :data:`EVENTS_SQL` fills, in its order. A writer of ``events`` rows names
the columns it inserts: one that leaves the tool columns out (NULL) still works, the
views then read those rows' ``content``."""

# The tool columns hold what the row's content JSON says (the views read either): taken
# from the facts where the SQL makes the content, and from the content JSON where Python
# made it (``tj``, rare: values the SQL cannot express).
_TOOL_COLUMNS_SQL = f"""CASE WHEN code <= {TOOL_END} THEN (CASE WHEN content IS NULL THEN tool_name ELSE tj[1] END) END,
  CASE WHEN code <= {TOOL_END} THEN (CASE WHEN content IS NULL THEN tool_id ELSE tj[2] END) END,
  CASE WHEN code <= {TOOL_END} THEN (CASE WHEN content IS NOT NULL THEN tj[3] WHEN code = {TOOL_START} THEN 'pending' ELSE tool_status END) END,
  CASE WHEN code <= {TOOL_END} THEN (CASE WHEN content IS NOT NULL THEN tj[4] ELSE outcome END) END,
  CASE WHEN code <= {TOOL_END} THEN (CASE WHEN content IS NOT NULL THEN TRY_CAST(tj[5] AS DOUBLE) ELSE duration_ms END) END"""
_TOOL_JSON_SQL = (
    f"CASE WHEN content IS NOT NULL AND code <= {TOOL_END} AND json_valid(content) THEN "
    "json_extract_string(content, ['$.tool_name', '$.tool_id', '$.status', '$.outcome', '$.duration_ms']) END"
)

EVENTS_SQL = f"""
INSERT INTO events ({", ".join(EVENT_COLUMNS)})
SELECT th || sh || CASE code WHEN {TOOL_START} THEN 's' WHEN {TOOL_END} THEN 'e' WHEN {INPUT_MESSAGE} THEN 'i' WHEN {STATE_SNAPSHOT} THEN 'x' WHEN {STATE_DELTA} THEN 'x' ELSE 'm' END,
  session_id, idx,
  CASE code WHEN {TOOL_START} THEN 'tool_call_start' WHEN {TOOL_END} THEN 'tool_call_end'
    WHEN {STATE_SNAPSHOT} THEN 'state_snapshot' WHEN {STATE_DELTA} THEN 'state_delta' ELSE 'message' END,
  created_us, correlation_id, source_channel_id, source_provider, source_framework,
  CASE WHEN blocked THEN 'blocked' ELSE 'delivered' END,
  CASE WHEN content IS NOT NULL THEN (CASE WHEN json_valid(content) THEN content ELSE to_json(content)::VARCHAR END)
       WHEN code <= {TOOL_END} THEN {_TOOL_CONTENT}
       ELSE {_TEXT_CONTENT} END,
  th, sh,
  {_TOOL_COLUMNS_SQL}
FROM (SELECT *, lower(hex(trace_id)) AS th, lower(hex(span_id)) AS sh, {_TOOL_JSON_SQL} AS tj FROM {EVENTS_TABLE})
"""
"""Inserts the rows of the registered table of event facts, which has an ``idx`` column too."""

_USAGE_SQL = "'{' || concat_ws(',', " + ", ".join(f"""'"{key}":' || {key}""" for key in _USAGE_KEYS) + ") || '}'"


TURNS_SQL = f"""
INSERT INTO turns
SELECT coalesce(correlation_id, sh), session_id, channel_id, parent_correlation_id, response_content,
  segments, tool_calls_count, round_count,
  coalesce(usage, {_USAGE_SQL}), input_tokens, output_tokens, thinking, loop_end_reason, latency_ms, streaming,
  timestamp_us, declared_tools, model, provider, error, th, sh
FROM (SELECT *, lower(hex(trace_id)) AS th, lower(hex(span_id)) AS sh FROM {TURNS_TABLE})
"""
"""Inserts the rows of the registered table of turn facts (whose JSON texts are JSON
DuckDB takes: see :func:`_segments` and :func:`_declared_text`)."""


# -- facts as Arrow tables ------------------------------------------------------------------

CHUNK = 4096
"""Spans reduced to facts and converted to Arrow at a time: the values just read are still
in the CPU's caches when Arrow copies them (a whole batch at once would not be)."""

PAUSE_EVERY = 256
"""Spans reduced to facts between two calls of :meth:`Facts.add`'s ``pause``."""


class Facts:
    """The facts of a batch of spans as Arrow record batches, in span order: the input of
    :data:`EVENTS_SQL` and :data:`TURNS_SQL`. This is the one entry point from spans to
    what the store writes, whatever recorded or received the spans.

    ``sessions`` holds each event row's session id (the writer numbers rows per session
    with it). Values Arrow cannot take (text with lone surrogates, numbers out of range,
    other types where a raw attribute goes) are first made storable as :func:`_clean`
    says; a fact that still cannot be stored is dropped and reported.
    """

    __slots__ = ("events", "sessions", "turns", "turn_rows", "excluded")

    def __init__(self) -> None:
        self.events: list[Any] = []  # pyarrow RecordBatches of event facts
        self.sessions: list[str] = []
        self.turns: list[Any] = []  # pyarrow RecordBatches of turn facts
        self.turn_rows = 0
        self.excluded = 0

    @property
    def event_rows(self) -> int:
        return len(self.sessions)

    @property
    def rows(self) -> int:
        return len(self.sessions) + self.turn_rows

    def add(self, items: list[tuple[int, Any]], skip: frozenset[str] = frozenset(),
            pause: Callable[[], Any] | None = None) -> None:
        """Add the rows of ``(kind, span)`` pairs (see :func:`collect`).

        ``pause``, when given, is called after every :data:`PAUSE_EVERY` spans (a
        background thread passes a function that lets other threads take the GIL).
        """
        for i in range(0, len(items), CHUNK):
            events: list[tuple[Any, ...]] = []
            turns: list[tuple[Any, ...]] = []
            if pause is None:
                self.excluded += collect(items[i:i + CHUNK], events, turns, skip)
            else:
                for j in range(i, min(i + CHUNK, len(items)), PAUSE_EVERY):
                    self.excluded += collect(items[j:j + PAUSE_EVERY], events, turns, skip)
                    pause()
            if events:
                events, batch = _record_batch(events, arrow_schemas()[0], _EVENT_KINDS)
                self.events.append(batch)
                self.sessions.extend(map(_session_of, events))
            if turns:
                turns, batch = _record_batch(turns, arrow_schemas()[1], _TURN_KINDS)
                self.turns.append(batch)
                self.turn_rows += len(turns)

    def extend(self, other: Facts) -> None:
        """Append ``other``'s rows after these."""
        self.events += other.events
        self.sessions += other.sessions
        self.turns += other.turns
        self.turn_rows += other.turn_rows
        self.excluded += other.excluded

    def drop_oldest(self, count: int) -> None:
        """Leave out the ``count`` oldest rows: events first, then turn summaries."""
        cut = min(count, self.event_rows)
        if cut:
            self.events = self.event_table().slice(cut).to_batches()  # type: ignore[union-attr]
            self.sessions = self.sessions[cut:]
        if count > cut and self.turn_rows:
            self.turns = self.turn_table().slice(count - cut).to_batches()  # type: ignore[union-attr]
            self.turn_rows = max(0, self.turn_rows - (count - cut))

    def event_table(self) -> Any:
        """The event facts as one pyarrow Table (None without any)."""
        import pyarrow as pa

        return pa.Table.from_batches(self.events, pa.schema(arrow_schemas()[0])) if self.events else None

    def turn_table(self) -> Any:
        """The turn facts as one pyarrow Table (None without any)."""
        import pyarrow as pa

        return pa.Table.from_batches(self.turns, pa.schema(arrow_schemas()[1])) if self.turns else None


def _record_batch(facts: list[tuple[Any, ...]], struct: Any, kinds: tuple[str, ...]) -> tuple[list[tuple[Any, ...]], Any]:
    import pyarrow as pa

    try:
        return facts, pa.RecordBatch.from_struct_array(pa.array(facts, struct))
    except Exception:  # noqa: S110 - the slow way below, fact by fact
        pass
    kept = []
    for fact in facts:
        try:
            fact = _clean(fact, kinds)
            pa.array([fact], struct)
            kept.append(fact)
        except Exception:
            internal_error("span mapping")
    return kept, pa.RecordBatch.from_struct_array(pa.array(kept, struct))


# What each field of a fact holds, for _clean.
_EVENT_KINDS = (
    "int", "bytes", "bytes", "int64", "raw", "raw", "raw", "raw", "raw", "bool",
    "text", "text", "json", "json", "text", "text", "text", "float", "text", "json",
)
_TURN_KINDS = (
    "bytes", "bytes", "raw", "raw", "raw", "raw", "text", "json", "int32", "int32",
    "usage", "usage", "usage", "usage", "usage", "json", "text", "raw", "float", "bool", "int64", "json", "raw", "raw", "text",
)
assert len(_EVENT_KINDS) == len(EVENT_FIELDS) and len(_TURN_KINDS) == len(TURN_FIELDS)


def _clean(fact: tuple[Any, ...], kinds: tuple[str, ...]) -> tuple[Any, ...]:
    """A fact whose values Arrow takes.

    Text with lone surrogates gets them escaped, as :func:`loopscope._json.to_jsonable`
    does, which is what the Python mapping always stored for text inside JSON (and JSON
    text holding them becomes a JSON string). A raw attribute value that is not text
    (the row kept it as it was) becomes its ``str``. Numbers a column cannot hold: a
    count becomes NULL, a token count too (the usage JSON keeps it), a time fails.
    """
    values = list(fact)
    usage_json = None
    for i, (kind, value) in enumerate(zip(kinds, fact)):
        if value is None:
            continue
        if kind in ("raw", "text", "json"):
            if type(value) is not str:
                if isinstance(value, (bytes, bytearray, memoryview)):
                    value = bytes(value).decode("utf-8", "backslashreplace")
                else:
                    try:
                        value = str(value)
                    except Exception:  # an int too long to write in decimal, a __str__ that raises
                        value = _json.to_text(value)
            if not (value.isascii() or _json._encodable(value)):
                value = _json.dumps(value) if kind == "json" else value.encode("utf-8", "backslashreplace").decode("utf-8")
        elif kind == "int64":
            value = int(value)
            if not -(1 << 63) <= value < (1 << 63):
                raise OverflowError(f"{value} is out of range")
        elif kind == "int32":
            value = value if -(1 << 31) <= value < (1 << 31) else None
        elif kind == "usage":
            value = _usage_value(value)
            if value is not None and not -(1 << 63) <= value < (1 << 63):
                if usage_json is None:
                    usage = (_usage_value(v) for v in fact[10:15])
                    usage_json = _json.dumps({k: v for k, v in zip(_USAGE_KEYS, usage) if v is not None})
                value = None
        values[i] = value
    if usage_json is not None:
        values[TURN_FIELDS.index("usage")] = usage_json
    return tuple(values)


# -- from spans to facts, in Python --------------------------------------------------------

try:  # the SDK's spans, read through their fields: the public properties cost a frame each
    from opentelemetry.attributes import BoundedAttributes
    from opentelemetry.sdk.trace import ReadableSpan, Span, _Span

    _probe = ReadableSpan("probe", attributes=BoundedAttributes(attributes={"k": "v"}), start_time=1, end_time=2)
    _FAST_TYPES: frozenset[type] = (
        frozenset({ReadableSpan, Span, _Span})
        if _probe._attributes._dict == {"k": "v"} and (_probe._start_time, _probe._end_time, _probe._context) == (1, 2, None)
        else frozenset()
    )
    _BOUNDED: type | None = BoundedAttributes
    del _probe
except Exception:  # another SDK version: the public properties, always right
    _FAST_TYPES, _BOUNDED = frozenset(), None


def _plain(attrs: Any) -> dict[str, Any]:
    """The attributes as a plain dict, so that every lookup is a C-level ``dict.get``."""
    if attrs is None:
        return {}
    if type(attrs) is dict:
        return attrs
    if _BOUNDED is not None and type(attrs) is _BOUNDED:
        return attrs._dict  # type: ignore[attr-defined, no-any-return]
    try:
        copied = attrs.copy()
    except Exception:
        copied = None
    return copied if type(copied) is dict else dict(attrs)


def collect(items: Iterable[tuple[int, Any]], events: list[tuple[Any, ...]], turns: list[tuple[Any, ...]],
            skip: frozenset[str] = frozenset()) -> int:
    """Append the facts of each ``(kind, span)`` pair (kind 0: started, 1: ended) to
    ``events`` and ``turns``, in order; rows of the event types in ``skip`` are left out.

    Returns how many rows were left out. A span whose facts cannot be read (a foreign
    span without times or ids, say) yields no row, and the failure is reported.
    """
    keep_start = "tool_call_start" not in skip
    keep_end = "tool_call_end" not in skip
    keep_message = "message" not in skip
    add = events.append
    excluded = 0
    fast, bounded = _FAST_TYPES, _BOUNDED
    # this loop runs per span over spans long gone cold: names are bound to locals once
    OPERATION, EXECUTE_TOOL, CHAT, INVOKE_AGENT = a.OPERATION, a.OP_EXECUTE_TOOL, a.OP_CHAT, a.OP_INVOKE_AGENT
    CONVERSATION_ID, TURN_ID, AGENT_NAME = a.CONVERSATION_ID, a.TURN_ID, a.AGENT_NAME
    PROVIDER, FRAMEWORK = a.PROVIDER, a.FRAMEWORK
    TOOL_NAME, TOOL_CALL_ID = a.TOOL_NAME, a.TOOL_CALL_ID
    TOOL_CALL_ARGUMENTS, TOOL_CALL_RESULT = a.TOOL_CALL_ARGUMENTS, a.TOOL_CALL_RESULT
    TOOL_OUTCOME, TOOL_STATUS, TOOL_ERROR = a.TOOL_OUTCOME, a.TOOL_STATUS, a.TOOL_ERROR
    ROUND_TEXT, ROUND_BLOCKED = a.ROUND_TEXT, a.ROUND_BLOCKED
    TURN_INPUT, TURN_INPUT_BLOCKED = a.TURN_INPUT, a.TURN_INPUT_BLOCKED
    STATE_KIND, STATE_VALUE, STATE_KINDS = a.STATE_KIND, a.STATE_VALUE, a.STATE_KINDS
    last_tid: Any = None
    trace = b""
    for kind, span in items:
        try:
            if type(span) in fast:
                attrs = span._attributes
                d = attrs._dict if type(attrs) is bounded else _plain(attrs)
                ctx = span._context
                tid = ctx[0]
                sid = ctx[1]
                sdk = True
            else:
                d = _plain(span.attributes)
                ctx = span.context
                tid = ctx.trace_id
                sid = ctx.span_id
                sdk = False
            # each time is read only where a row needs it: every value read is a cache miss
            if tid is not last_tid:  # the spans of a trace share its id: its bytes are made once
                trace = tid.to_bytes(16, "big")
                last_tid = tid
            get = d.get
            op = get(OPERATION)
            if op == EXECUTE_TOOL:
                if not (keep_start if kind == _START else keep_end):
                    excluded += 1
                    continue
                name = get(TOOL_NAME, "")
                if type(name) is not str:
                    name = str(name)
                call_id = get(TOOL_CALL_ID, "")
                if type(call_id) is not str:
                    call_id = str(call_id)
                arguments = get(TOOL_CALL_ARGUMENTS)
                if arguments is not None and type(arguments) is not str:
                    arguments = _text_or_json(arguments)
                session = get(CONVERSATION_ID) or "%032x" % tid
                if kind == _START:
                    add((
                        TOOL_START, trace, sid.to_bytes(8, "big"), (span._start_time if sdk else span.start_time) // 1000,
                        session if type(session) is str else str(session),
                        get(TURN_ID), get(AGENT_NAME), get(PROVIDER), get(FRAMEWORK), False,
                        name, call_id, arguments, None, None, None, None, None, None, None,
                    ))
                    continue
                start, end = (span._start_time, span._end_time) if sdk else (span.start_time, span.end_time)
                duration = round((end - start) / 1e6, 3)
                result = get(TOOL_CALL_RESULT)
                if result is not None and type(result) is not str:
                    result = _text_or_json(result)
                outcome = get(TOOL_OUTCOME) or "served"
                status = get(TOOL_STATUS) or ("completed" if outcome == "served" else "failed")
                error = get(TOOL_ERROR)
                content = None
                if type(outcome) is not str or type(status) is not str or (error is not None and type(error) is not str):
                    content = _tool_content(d, True, duration)
                add((
                    TOOL_END, trace, sid.to_bytes(8, "big"), end // 1000,
                    session if type(session) is str else str(session),
                    get(TURN_ID), get(AGENT_NAME), get(PROVIDER), get(FRAMEWORK), False,
                    name, call_id, arguments, result, status, outcome, error, duration, None, content,
                ))
            elif op == CHAT:
                if kind != _END:
                    continue
                text = get(ROUND_TEXT)
                if not text:
                    continue
                if not keep_message:
                    excluded += 1
                    continue
                content = None
                if type(text) is not str:
                    content, text = _text_content(text, "assistant"), ""
                session = get(CONVERSATION_ID) or "%032x" % tid
                add((
                    ROUND_MESSAGE, trace, sid.to_bytes(8, "big"), (span._end_time if sdk else span.end_time) // 1000,
                    session if type(session) is str else str(session),
                    get(TURN_ID), get(AGENT_NAME), get(PROVIDER), get(FRAMEWORK), bool(get(ROUND_BLOCKED)),
                    None, None, None, None, None, None, None, None, text, content,
                ))
            elif op == INVOKE_AGENT:
                if kind == _END:
                    start, end = (span._start_time, span._end_time) if sdk else (span.start_time, span.end_time)
                    turns.append(_turn_fact(span, d, tid, trace, sid, start, end))
                    continue
                if TURN_INPUT not in d:
                    continue
                if not keep_message:
                    excluded += 1
                    continue
                body = d[TURN_INPUT]
                if type(body) is not str:
                    body = str(body) if isinstance(body, str) else _json.dumps(body)
                session = get(CONVERSATION_ID) or "%032x" % tid
                add((
                    INPUT_MESSAGE, trace, sid.to_bytes(8, "big"), (span._start_time if sdk else span.start_time) // 1000,
                    session if type(session) is str else str(session),
                    get(TURN_ID), get(AGENT_NAME), get(PROVIDER), get(FRAMEWORK), bool(get(TURN_INPUT_BLOCKED)),
                    None, None, None, None, None, None, None, None, body, None,
                ))
            elif STATE_KIND in d:  # a state snapshot or delta: no GenAI operation, ended at once
                if kind != _END:
                    continue
                state_type = STATE_KINDS.get(get(STATE_KIND))
                value = get(STATE_VALUE)
                if state_type is None or value is None:
                    continue  # an unknown kind, or a value left out on export (content capture off)
                if state_type in skip:
                    excluded += 1
                    continue
                code = STATE_SNAPSHOT if state_type == "state_snapshot" else STATE_DELTA
                session = get(CONVERSATION_ID) or "%032x" % tid
                add((
                    code, trace, sid.to_bytes(8, "big"), (span._end_time if sdk else span.end_time) // 1000,
                    session if type(session) is str else str(session),
                    get(TURN_ID), get(AGENT_NAME), get(PROVIDER), get(FRAMEWORK), False,
                    None, None, None, None, None, None, None, None, None, _state_content(code, value),
                ))
        except Exception:
            internal_error("span mapping")
    return excluded


def _state_content(code: int, value: Any) -> str:
    """A state row's content: ``{"snapshot": <object>}`` or ``{"delta": [<operations>]}``."""
    text = value if type(value) is str else _text_or_json(value)
    return ('{"snapshot":' if code == STATE_SNAPSHOT else '{"delta":') + _json_text(text) + "}"


def _text_or_json(value: Any) -> str:
    """Text for a JSON-holding attribute that is not a plain str: a str subclass's text,
    or any other value as JSON (which the SQL then keeps as it is)."""
    return str(value) if isinstance(value, str) else _json.dumps(value)


_scan_once = json.JSONDecoder().scan_once


def _segments(value: Any) -> tuple[str, str]:
    """The response text and the segments JSON of a turn's segments attribute."""
    if not value:
        return "", "[]"
    if type(value) is str:
        # json.loads runs Python frames around the C scanner: the scanner alone answers
        # the common case (a whole JSON list, no surrounding whitespace)
        try:
            segments, end = _scan_once(value, 0)
        except (StopIteration, ValueError):
            segments, end = None, -1
        if end == len(value) and type(segments) is list:
            text = RESPONSE_SEGMENT_SEPARATOR.join(segments)  # a TypeError for anything but strings, as ever
            if text.isascii() or _json._encodable(text):
                # a list of plain strings: its text is the very JSON json.dumps would give it
                return text, value
    segments = _json.loads(value)
    return RESPONSE_SEGMENT_SEPARATOR.join(segments), _json.dumps(segments)


def _turn_fact(span: Any, d: dict[str, Any], tid: int, trace: bytes, sid: int, start: int, end: int) -> tuple[Any, ...]:
    get = d.get
    correlation_id = get(a.TURN_ID)
    if not correlation_id:
        correlation_id = None  # the span id, in SQL
    elif type(correlation_id) is not str:
        correlation_id = str(correlation_id)
    session = get(a.CONVERSATION_ID) or "%032x" % tid
    response, segments = _segments(get(a.SEGMENTS))
    thinking = get(a.THINKING) or ""
    reason = get(a.LOOP_END_REASON) or None
    return (
        trace,
        sid.to_bytes(8, "big"),
        correlation_id,
        session if type(session) is str else str(session),
        get(a.AGENT_NAME),
        get(a.PARENT_TURN_ID),
        response,
        segments,
        int(get(a.TOOL_CALLS_COUNT) or 0),
        int(get(a.ROUND_COUNT) or 0),
        # the usage values as they are: Arrow takes ints (and floats, truncated as int()
        # does); anything else fails the chunk's conversion and _clean reads it as
        # semconv.usage_from_attributes does
        get(a.USAGE_INPUT),
        get(a.USAGE_OUTPUT),
        get(a.USAGE_CACHE_READ),
        get(a.USAGE_CACHE_CREATION),
        get(a.USAGE_REASONING),
        None,  # usage: made in SQL
        thinking if type(thinking) is str else str(thinking),
        reason,
        round((end - start) / 1e6, 3),
        bool(get(a.STREAMING)),
        end // 1000,
        _declared_text(get(a.DECLARED_TOOLS) or "[]"),
        get(a.RESPONSE_MODEL) or get(a.REQUEST_MODEL),
        get(a.PROVIDER),
        _error_text(span, reason, get(a.ERROR_TYPE)) if reason == "error" else None,
    )


assert tuple(a.USAGE_ATTRIBUTES.values()) == (
    a.USAGE_INPUT, a.USAGE_OUTPUT, a.USAGE_CACHE_READ, a.USAGE_CACHE_CREATION, a.USAGE_REASONING
), "_turn_fact reads the usage attributes in this order"


_usage_value = a.usage_value  # a usage attribute as semconv.usage_from_attributes reads it


def _error_text(span: Any, reason: Any, kind: Any) -> str | None:
    description = getattr(span.status, "description", None)
    return f"{kind}: {description}" if kind and description else (kind or description)


# -- the plain Python mapping, for what the SQL does not cover ----------------------------------

def _json_text(value: Any) -> str:
    """Attribute text that should hold JSON; anything else is kept as a JSON string."""
    if isinstance(value, str):
        try:
            valid = _scan_once(value, 0)[1] == len(value)
        except (StopIteration, ValueError):
            valid = False
        if not valid:
            try:
                json.loads(value)
            except ValueError:
                return _json.dumps(value)
        return value
    return _json.dumps(value)


# Every turn of an agent declares the same tools, as equal (not identical) text: the texts
# found valid lately are remembered by value, a few dozen at most.
_valid_declared: dict[str, None] = {}


def _declared_text(value: Any) -> str:
    """:func:`_json_text` for a turn's declared tools, remembering the texts found valid.

    JSON whose strings hold escaped lone surrogates is valid to Python but not to DuckDB
    (no JSON column could hold it): it is kept as a JSON string instead."""
    if type(value) is str and value in _valid_declared:
        return value
    text = _json_text(value)
    if text is value:  # valid JSON as it was
        if "\\u" in text and not _json._encodable(json.dumps(json.loads(text), ensure_ascii=False)):
            return _json.dumps(text)
        if len(_valid_declared) >= 64:
            _valid_declared.clear()
        _valid_declared[text] = None
    return text


def _number(value: Any) -> str:
    """JSON for a duration: a finite float is its repr, exactly as ``json.dumps`` writes it."""
    if type(value) is float and value - value == 0.0:  # finite: inf - inf and nan - nan are nan
        return repr(value)
    return _json.dumps(value)


_MISSING: Any = object()


def _tool_content(attrs: dict[str, Any], ended: bool, duration_ms: float | None = None) -> str:
    get = attrs.get
    arguments = get(a.TOOL_CALL_ARGUMENTS, _MISSING)
    head = (
        '{"type":"tool_call","tool_name":'
        + _json.dumps(str(get(a.TOOL_NAME, "")))
        + ',"tool_id":'
        + _json.dumps(str(get(a.TOOL_CALL_ID, "")))
        + ',"arguments":'
        + ("null" if arguments is _MISSING else _json_text(arguments))
    )
    if not ended:
        return head + ',"result":null,"status":"pending","outcome":null,"duration_ms":null,"error":null}'
    outcome = get(a.TOOL_OUTCOME) or "served"
    status = get(a.TOOL_STATUS) or ("completed" if outcome == "served" else "failed")
    error = get(a.TOOL_ERROR)
    result = get(a.TOOL_CALL_RESULT, _MISSING)
    return "".join((
        head,
        ',"result":',
        "null" if result is _MISSING else _json_text(result),
        ',"status":',
        _json.dumps(status),
        ',"outcome":',
        _json.dumps(outcome),
        ',"duration_ms":',
        _number(duration_ms),
        ',"error":',
        "null" if error is None else _json.dumps(error),
        "}",
    ))


def _text_content(body: Any, role: str) -> str:
    return '{"type":"text","body":' + _json.dumps(body) + ',"role":' + _json.dumps(role) + "}"
