"""The store's input: the facts of event rows and turn summaries, and the SQL that makes the rows.

A *fact* is a flat tuple of plain values per row (ids as bytes, times, attribute values
as they are, normalized only where a value is not the plain string the common case
has), in :data:`EVENT_FIELDS` / :data:`TURN_FIELDS` order. :class:`Facts` holds a batch
of them as Arrow record batches; :data:`EVENTS_SQL` and :data:`TURNS_SQL` make the
stored rows from a batch in one vectorized statement each: hex ids, event ids and types,
the ``content`` JSON, the usage JSON, and the choice between keeping attribute text as
JSON and keeping it as a JSON string (exactly as Python's json module would decide).

Facts are what any store engine takes: the mapping from spans (loopscope's own and other
instrumentations' conventions) to facts lives in :mod:`loopscope.ingest.mapping`, and
reaches the writer through :class:`SpanMapping`.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any, Protocol

from .. import _json, semconv as a
from .._guard import internal_error

START, END = 0, 1
"""What a queued item says of its span: it started, or it ended (the writer's ``submit``)."""

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
"""Spans reduced to facts between two calls of the ``pause`` of :meth:`SpanMapping.add`."""


class Facts:
    """The facts of a batch of rows as Arrow record batches, in order: the input of
    :data:`EVENTS_SQL` and :data:`TURNS_SQL`, whatever recorded, received or imported
    them (:func:`loopscope.ingest.mapping.add_spans` fills it from spans).

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

    def append(self, events: list[tuple[Any, ...]], turns: list[tuple[Any, ...]], excluded: int = 0) -> None:
        """Add event facts and turn facts (tuples in field order), and ``excluded`` rows
        left out by policy. A fact Arrow cannot take even once cleaned is dropped and
        reported."""
        self.excluded += excluded
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
            value = a.usage_value(value)
            if value is not None and not -(1 << 63) <= value < (1 << 63):
                if usage_json is None:
                    usage = (a.usage_value(v) for v in fact[10:15])
                    usage_json = _json.dumps({k: v for k, v in zip(_USAGE_KEYS, usage) if v is not None})
                value = None
        values[i] = value
    if usage_json is not None:
        values[TURN_FIELDS.index("usage")] = usage_json
    return tuple(values)


class SpanMapping(Protocol):
    """What the writer needs of the span-to-fact mapping (the writer knows facts, not
    spans): :mod:`loopscope.ingest.mapping` implements it as ``SPANS``. A second store
    engine takes the same facts through the same mapping."""

    def add(self, facts: Facts, items: list[tuple[int, Any]], skip: frozenset[str] = frozenset(),
            pause: Callable[[], Any] | None = None) -> None:
        """Add the facts of ``(START or END, span)`` pairs to ``facts``; rows of the event
        types in ``skip`` are left out and counted in ``facts.excluded``."""

    def size(self, span: Any) -> int:
        """What a queued ended span counts against the writer's byte bound."""

    def recover(self, con: Any) -> int:
        """Close the turns that writers whose process ended left open (``con`` holds the
        file for writing); returns how many were closed."""

