"""The store's input: the facts of event rows and turn summaries, and the SQL that makes the rows.

A *fact* holds the values of one row, plain (ids as bytes, times, attribute values as
they are, normalized only where a value is not the plain string the common case has).
Its fields are named by a row type, :class:`EventFact` or :class:`TurnFact`, and a fact
is a tuple of its values in the row type's field order, built from names (the mapping's
locals are named as the fields: see :mod:`loopscope.ingest.mapping`); the Arrow types of the facts
follow the same fields. :class:`Facts` holds a batch of them as Arrow record batches;
:data:`EVENTS_SQL` and :data:`TURNS_SQL` make the stored rows from a batch in one
vectorized statement each, reading the facts' fields and writing the table's columns by
name: hex ids, event ids and types, the ``content`` JSON, the usage JSON, and the choice
between keeping attribute text as JSON and keeping it as a JSON string (exactly as
Python's json module would decide).

Facts are what any store engine takes: the mapping from spans (loopscope's own and other
instrumentations' conventions) to facts lives in :mod:`loopscope.ingest.mapping`, and
reaches the writer through :class:`SpanMapping`.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from .. import _json
from .. import semconv as a
from .._guard import guard

START, END = 0, 1
"""What a queued item says of its span: it started, or it ended (the writer's ``submit``)."""

# -- event facts -------------------------------------------------------------------------
#
# One EventFact per event row. ``code`` says which row:
TOOL_START, TOOL_END, INPUT_MESSAGE, ROUND_MESSAGE = 0, 1, 2, 3
STATE_SNAPSHOT, STATE_DELTA = 4, 5  # from a state span's end; their content is made in Python
MODEL_ERROR = 6  # a failed model call, from its chat span's end (beside its text row); content made in Python
EVENT_TYPES = {
    TOOL_START: "tool_call_start", TOOL_END: "tool_call_end", INPUT_MESSAGE: "message", ROUND_MESSAGE: "message",
    STATE_SNAPSHOT: "state_snapshot", STATE_DELTA: "state_delta", MODEL_ERROR: "model_error",
}


class EventFact(NamedTuple):
    """The values an event row is made from (by :data:`EVENTS_SQL`), built by name.

    Ids are bytes, times microseconds, attribute values as they are, normalized only
    where a value is not the plain string the common case has. The fields a kind of row
    does not have are None."""

    code: int  # TOOL_START .. MODEL_ERROR
    trace_id: bytes  # 16 bytes, big-endian
    span_id: bytes  # 8 bytes, big-endian
    created_us: int  # microseconds since the epoch
    session_id: str  # final
    correlation_id: Any  # the attribute value as it is
    source_channel_id: Any  # as it is
    source_provider: Any  # as it is
    source_framework: Any  # as it is
    blocked: bool
    tool_name: str | None = None  # final text (tool rows)
    tool_id: str | None = None  # final text (tool rows)
    arguments: str | None = None  # attribute text, JSON or not; None for JSON null (tool rows)
    result: str | None = None  # the same (tool end rows)
    tool_status: str | None = None  # final text (tool end rows)
    outcome: str | None = None  # final text (tool end rows)
    error: str | None = None  # final text or None (tool end rows)
    duration_ms: float | None = None  # tool end rows
    body: str | None = None  # final text (message rows)
    content: str | None = None  # the content JSON made in Python, when the values called for it


EVENT_FIELDS: tuple[str, ...] = EventFact._fields
_session_of = operator.itemgetter(EVENT_FIELDS.index("session_id"))

# -- turn facts --------------------------------------------------------------------------


class TurnFact(NamedTuple):
    """The values a turn summary is made from (by :data:`TURNS_SQL`), built by name."""

    trace_id: bytes
    span_id: bytes
    correlation_id: str | None  # final, or None for the span id
    session_id: str  # final
    channel_id: Any
    parent_correlation_id: Any
    response_content: str
    segments: str  # JSON text
    tool_calls_count: int
    round_count: int
    input_tokens: Any  # the usage values as they are (see _clean); named as semconv.USAGE_ATTRIBUTES
    output_tokens: Any
    cache_read_input_tokens: Any
    cache_creation_input_tokens: Any
    reasoning_tokens: Any
    usage: str | None  # the usage JSON made in Python, when the values called for it; else None
    thinking: str
    loop_end_reason: Any
    latency_ms: float
    streaming: bool
    timestamp_us: int
    declared_tools: str  # JSON text
    model: Any
    provider: Any
    error: str | None
    model_call_count: Any = None  # loopscope.turn.model_call_count as it is (None: the views count the calls)
    cost_usd: float | None = None  # priced from the turn's own usage and model (the views prefer its calls' sum)
    price_source: str | None = None


TURN_FIELDS: tuple[str, ...] = TurnFact._fields
_USAGE_KEYS = tuple(a.USAGE_ATTRIBUTES)

# -- model call facts ----------------------------------------------------------------------


class CallFact(NamedTuple):
    """The values a ``model_calls`` row is made from (by :data:`CALLS_SQL`), built by name:
    one per ``chat`` span's end (a model call)."""

    trace_id: bytes
    span_id: bytes
    session_id: str  # final
    correlation_id: Any  # the turn's id, as it is
    position: Any  # loopscope.call.position as it is (None: the view numbers the call)
    provider: Any
    framework: Any
    agent: Any
    request_model: Any
    response_model: Any
    response_id: Any
    finish_reasons: str | None  # JSON text of the list
    outcome: Any
    streaming: Any  # gen_ai.request.stream as it is
    started_us: int
    ended_us: int
    duration_ms: float
    time_to_first_chunk_ms: float | None
    input_tokens: Any  # the usage values as they are (normalized: input includes cached tokens)
    output_tokens: Any
    cache_read_input_tokens: Any
    cache_creation_input_tokens: Any
    reasoning_tokens: Any
    provider_usage: Any  # JSON text (loopscope.usage.provider)
    parameters: str | None  # JSON text: the request parameters
    error_type: Any
    error: str | None  # final text
    refusal: Any  # text (content)
    input_messages: Any  # JSON text (content)
    output_messages: Any  # JSON text (content)
    cost_usd: float | None
    price_source: str | None


CALL_FIELDS: tuple[str, ...] = CallFact._fields


class ToolFix(NamedTuple):
    """A tool call whose row is corrected to ``failed`` (a ``tool_outcome_correction`` span:
    a decorated tool served it, then the application sent its result to the model marked as
    an error). No row of its own: :data:`FIX_SQL` updates the call's ``tool_call_end`` row."""

    session_id: str
    correlation_id: str | None  # the turn's id
    tool_id: str
    error: str  # the result's text (the content policy applied, as to a row's error)
    created_us: int
    since_us: int  # the call's row is no older than this (where its span ended; else its turn began)


class ScoreFact(NamedTuple):
    """A score (the GenAI conventions' ``gen_ai.evaluation.result``) of a turn, a model call or a
    tool call: one ``scores`` row, kept apart from the log (a score may come long after what it
    scores, from another process, before or after its rows). The ids of what it scores are as
    the scorer had them; the views match them to a turn, a call or a tool
    (``storage/duckdb/views.py``, ``score_targets``)."""

    id: str  # the score span's trace and span ids in hex (and the event's place, for another instrumentation's)
    created_us: int
    name: str
    value: float | None
    label: str | None
    explanation: str | None
    source: str | None
    target_kind: str | None  # turn, call, tool, or None: not said
    target_id: str | None  # an id as given: a turn's correlation id, a response id, a tool call id
    trace_id: str | None  # the scored span's, hex
    span_id: str | None
    response_id: str | None
    session_id: str | None
    correlation_id: str | None  # the scored turn's, where the scorer knew it
    agent: str | None
    error_type: str | None


SCORE_FIELDS: tuple[str, ...] = ScoreFact._fields
SCORES_TABLE = "_loopscope_scores"
"""The name a batch's :class:`ScoreFact` rows are registered under for :data:`SCORES_INSERT`."""
SCORES_INSERT = f"""INSERT INTO scores
SELECT id, make_timestamptz(created_us) AS created_at, name, value, label, explanation, source, target_kind, target_id,
       trace_id, span_id, response_id, session_id, correlation_id, agent, error_type
FROM {SCORES_TABLE} f WHERE NOT EXISTS (SELECT 1 FROM scores s WHERE s.id = f.id)"""
"""Stores a batch's scores; one stored already (a span sent again) is left out."""


def score_schema() -> Any:
    """The Arrow schema of a batch's :class:`ScoreFact` rows."""
    import pyarrow as pa

    kinds = {"created_us": pa.int64(), "value": pa.float64()}
    return pa.schema([(name, kinds.get(name, pa.string())) for name in SCORE_FIELDS])


assert set(_USAGE_KEYS) <= set(TURN_FIELDS), "a usage value has a field of its own"

# What each field is in Arrow ("us": a UTC timestamp from microseconds) and how _clean
# makes a value Arrow refused storable: by name, checked against the row types.
_EVENT_FIELD_TYPES = {
    "code": ("int8", "int"), "trace_id": ("binary16", "bytes"), "span_id": ("binary8", "bytes"),
    "created_us": ("us", "int64"), "session_id": ("string", "raw"), "correlation_id": ("string", "raw"),
    "source_channel_id": ("string", "raw"), "source_provider": ("string", "raw"), "source_framework": ("string", "raw"),
    "blocked": ("bool", "bool"), "tool_name": ("string", "text"), "tool_id": ("string", "text"),
    "arguments": ("string", "json"), "result": ("string", "json"), "tool_status": ("string", "text"),
    "outcome": ("string", "text"), "error": ("string", "text"), "duration_ms": ("float64", "float"),
    "body": ("string", "text"), "content": ("string", "json"),
}
_TURN_FIELD_TYPES = {
    "trace_id": ("binary16", "bytes"), "span_id": ("binary8", "bytes"), "correlation_id": ("string", "raw"),
    "session_id": ("string", "raw"), "channel_id": ("string", "raw"), "parent_correlation_id": ("string", "raw"),
    "response_content": ("string", "text"), "segments": ("string", "json"),
    "tool_calls_count": ("int32", "int32"), "round_count": ("int32", "int32"),
    **{key: ("int64", "usage") for key in _USAGE_KEYS},
    "usage": ("string", "json"), "thinking": ("string", "text"), "loop_end_reason": ("string", "raw"),
    "latency_ms": ("float64", "float"), "streaming": ("bool", "bool"), "timestamp_us": ("us", "int64"),
    "declared_tools": ("string", "json"), "model": ("string", "raw"), "provider": ("string", "raw"),
    "error": ("string", "text"), "model_call_count": ("int32", "int32"), "cost_usd": ("float64", "float"),
    "price_source": ("string", "raw"),
}
_CALL_FIELD_TYPES = {
    "trace_id": ("binary16", "bytes"), "span_id": ("binary8", "bytes"), "session_id": ("string", "raw"),
    "correlation_id": ("string", "raw"), "position": ("int32", "int32"), "provider": ("string", "raw"),
    "framework": ("string", "raw"), "agent": ("string", "raw"), "request_model": ("string", "raw"),
    "response_model": ("string", "raw"), "response_id": ("string", "raw"), "finish_reasons": ("string", "json"),
    "outcome": ("string", "raw"), "streaming": ("bool", "bool"), "started_us": ("us", "int64"),
    "ended_us": ("us", "int64"), "duration_ms": ("float64", "float"), "time_to_first_chunk_ms": ("float64", "float"),
    **{key: ("int64", "usage") for key in _USAGE_KEYS},
    "provider_usage": ("string", "json"), "parameters": ("string", "json"), "error_type": ("string", "raw"),
    "error": ("string", "text"), "refusal": ("string", "text"), "input_messages": ("string", "json"),
    "output_messages": ("string", "json"), "cost_usd": ("float64", "float"), "price_source": ("string", "raw"),
}
assert set(_EVENT_FIELD_TYPES) == set(EVENT_FIELDS) and set(_TURN_FIELD_TYPES) == set(TURN_FIELDS)
assert set(_CALL_FIELD_TYPES) == set(CALL_FIELDS)
_KINDS: dict[type, tuple[str, ...]] = {
    EventFact: tuple(_EVENT_FIELD_TYPES[name][1] for name in EVENT_FIELDS),
    TurnFact: tuple(_TURN_FIELD_TYPES[name][1] for name in TURN_FIELDS),
    CallFact: tuple(_CALL_FIELD_TYPES[name][1] for name in CALL_FIELDS),
}


def _arrow_struct(fields: tuple[str, ...], types: dict[str, tuple[str, str]]) -> Any:
    import pyarrow as pa  # imported here: a plain import of loopscope never needs it

    made = {
        "int8": pa.int8(), "int32": pa.int32(), "int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_(),
        "string": pa.string(), "binary16": pa.binary(16), "binary8": pa.binary(8), "us": pa.timestamp("us", tz="UTC"),
    }
    return pa.struct([(name, made[types[name][0]]) for name in fields])


@functools.cache
def arrow_schemas() -> tuple[Any, Any]:
    """The Arrow types of event facts and turn facts: structs whose fields are the row
    types' fields, in their order (a fact converts to it as the tuple it is)."""
    return _arrow_struct(EVENT_FIELDS, _EVENT_FIELD_TYPES), _arrow_struct(TURN_FIELDS, _TURN_FIELD_TYPES)


@functools.cache
def call_schema() -> Any:
    """The Arrow type of model call facts (see :func:`arrow_schemas`)."""
    return _arrow_struct(CALL_FIELDS, _CALL_FIELD_TYPES)


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


def json_texts_sql(columns: tuple[str, ...]) -> str:
    """SQL for a list of what :func:`json_text_sql` gives each of ``columns`` (index it
    from 1). A statement binds its expressions afresh every time it runs, and binding the
    check's regular expressions costs ~0.5 ms each (with a few rows, most of a batch's
    cost is binding): in one lambda they are bound once for all the columns."""
    return f"list_transform([{', '.join(columns)}], lambda x: {json_text_sql('x')})"


EVENTS_TABLE, TURNS_TABLE, CALLS_TABLE = "_loopscope_event_facts", "_loopscope_turn_facts", "_loopscope_call_facts"

_TOOL_CONTENT = (
    """'{"type":"tool_call","tool_name":' || to_json(tool_name) || ',"tool_id":' || to_json(tool_id)"""
    f""" || ',"arguments":' || jt[1] || CASE code WHEN {TOOL_START} THEN"""
    """ ',"result":null,"status":"pending","outcome":null,"duration_ms":null,"error":null}'"""
    """ ELSE ',"result":' || jt[2]"""
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

# Without content made in Python (the common batch: no state rows, no tool outcome that
# is not a string), the tool columns and the content are the facts' own: a statement
# without those branches binds in less time (see write_batch).
_PLAIN_TOOL_COLUMNS_SQL = f"""CASE WHEN code <= {TOOL_END} THEN tool_name END, CASE WHEN code <= {TOOL_END} THEN tool_id END,
  CASE code WHEN {TOOL_START} THEN 'pending' WHEN {TOOL_END} THEN tool_status END,
  CASE WHEN code <= {TOOL_END} THEN outcome END, CASE WHEN code <= {TOOL_END} THEN duration_ms END"""


def _events_sql(overrides: bool) -> str:
    return f"""
INSERT INTO events ({", ".join(EVENT_COLUMNS)})
{events_select(overrides)}"""


def events_select(overrides: bool) -> str:
    """The ``SELECT`` of :data:`EVENTS_SQL` (``overrides``) or :data:`PLAIN_EVENTS_SQL`:
    the rows themselves, in :data:`EVENT_COLUMNS`' order (what the writer reads back as
    Arrow to cut a batch's large values: see :mod:`.values`)."""
    content = (
        f"""CASE WHEN content IS NOT NULL THEN (CASE WHEN json_valid(content) THEN content ELSE to_json(content)::VARCHAR END)
       WHEN code <= {TOOL_END} THEN {_TOOL_CONTENT}
       ELSE {_TEXT_CONTENT} END"""
        if overrides else f"CASE WHEN code <= {TOOL_END} THEN {_TOOL_CONTENT} ELSE {_TEXT_CONTENT} END"
    )
    return f"""SELECT th || sh || CASE code WHEN {TOOL_START} THEN 's' WHEN {TOOL_END} THEN 'e' WHEN {INPUT_MESSAGE} THEN 'i' WHEN {STATE_SNAPSHOT} THEN 'x' WHEN {STATE_DELTA} THEN 'x' WHEN {MODEL_ERROR} THEN 'f' ELSE 'm' END,
  session_id, idx,
  CASE code WHEN {TOOL_START} THEN 'tool_call_start' WHEN {TOOL_END} THEN 'tool_call_end'
    WHEN {STATE_SNAPSHOT} THEN 'state_snapshot' WHEN {STATE_DELTA} THEN 'state_delta'
    WHEN {MODEL_ERROR} THEN 'model_error' ELSE 'message' END,
  created_us, correlation_id, source_channel_id, source_provider, source_framework,
  CASE WHEN blocked THEN 'blocked' ELSE 'delivered' END,
  {content},
  th, sh,
  {_TOOL_COLUMNS_SQL if overrides else _PLAIN_TOOL_COLUMNS_SQL}
FROM (SELECT *, lower(hex(trace_id)) AS th, lower(hex(span_id)) AS sh,{f" {_TOOL_JSON_SQL} AS tj," if overrides else ""}
  CASE WHEN code <= {TOOL_END} THEN {json_texts_sql(("arguments", "result"))} END AS jt FROM {EVENTS_TABLE})
"""


EVENTS_SQL = _events_sql(overrides=True)
"""Inserts the rows of the registered table of event facts, which has an ``idx`` column too."""
PLAIN_EVENTS_SQL = _events_sql(overrides=False)
""":data:`EVENTS_SQL` for a table of event facts whose ``content`` is NULL in every row."""

_USAGE_SQL = "'{' || concat_ws(',', " + ", ".join(f"""'"{key}":' || {key}""" for key in _USAGE_KEYS) + ") || '}'"


TURN_COLUMNS = (
    "correlation_id", "session_id", "channel_id", "parent_correlation_id", "response_content", "segments",
    "tool_calls_count", "round_count", "usage", "input_tokens", "output_tokens", "thinking", "loop_end_reason",
    "latency_ms", "streaming", "timestamp", "declared_tools", "model", "provider", "error", "trace_id", "span_id",
    "model_call_count", "cost_usd", "price_source",
)
"""The columns :data:`TURNS_SQL` fills, in its order: every column of ``turns``."""

TURNS_SQL = f"""
INSERT INTO turns ({", ".join(TURN_COLUMNS)})
SELECT coalesce(correlation_id, sh), session_id, channel_id, parent_correlation_id, response_content,
  segments, tool_calls_count, round_count,
  coalesce(usage, {_USAGE_SQL}), input_tokens, output_tokens, thinking, loop_end_reason, latency_ms, streaming,
  timestamp_us, declared_tools, model, provider, error, th, sh, model_call_count, cost_usd, price_source
FROM (SELECT *, lower(hex(trace_id)) AS th, lower(hex(span_id)) AS sh FROM {TURNS_TABLE})
"""
"""Inserts the rows of the registered table of turn facts (whose JSON texts are JSON
DuckDB takes: see :func:`_segments` and :func:`_declared_text`)."""

CALL_COLUMNS = (
    "session_id", "correlation_id", "position", "provider", "framework", "agent", "request_model", "response_model",
    "response_id", "finish_reasons", "outcome", "streaming", "started_at", "ended_at", "duration_ms",
    "time_to_first_chunk_ms", *_USAGE_KEYS, "provider_usage", "parameters", "error_type", "error", "refusal",
    "input_messages", "output_messages", "cost_usd", "price_source", "trace_id", "span_id",
)
"""The columns :data:`CALLS_SQL` fills, in its order: every column of ``model_calls``."""

CALLS_SQL = f"""
INSERT INTO model_calls ({", ".join(CALL_COLUMNS)})
SELECT session_id, correlation_id, position, provider, framework, agent, request_model, response_model,
  response_id, finish_reasons, outcome, streaming, started_us, ended_us, duration_ms, time_to_first_chunk_ms,
  {", ".join(_USAGE_KEYS)}, CASE WHEN provider_usage IS NOT NULL THEN jt[1] END,
  parameters, error_type, error, refusal,
  CASE WHEN input_messages IS NOT NULL THEN jt[2] END,
  CASE WHEN output_messages IS NOT NULL THEN jt[3] END,
  cost_usd, price_source, lower(hex(trace_id)), lower(hex(span_id))
FROM (SELECT *, {json_texts_sql(("provider_usage", "input_messages", "output_messages"))} AS jt FROM {CALLS_TABLE})
"""
"""Inserts the rows of the registered table of model call facts (``finish_reasons`` and
``parameters`` are JSON made in Python; the messages and the provider's usage are
attribute text, kept as JSON when they are, as a JSON string otherwise)."""


FIXES_TABLE = "_loopscope_tool_fixes"


def _fixed(e: str) -> str:
    """The condition of a ``tool_call_end`` row ``e`` that a fact ``f`` of :data:`FIXES_TABLE` fixes."""
    return (
        f"{e}.type = 'tool_call_end' AND {e}.tool_outcome = 'served' AND {e}.session_id = f.session_id "
        f"AND {e}.tool_call_id = f.tool_id AND {e}.correlation_id IS NOT DISTINCT FROM f.correlation_id"
    )


FIX_SLACK_US = 1_000_000
"""Microseconds before a fact's ``since_us`` a row it fixes may be dated (clocks of two processes)."""


def _since(e: str, since_us: int) -> str:
    # a literal, not a column: the range is known when the scan is planned, so DuckDB reads
    # only the row groups of events that recent (zone maps), not the whole table
    return f"{e}.created_at >= make_timestamptz({int(since_us) - FIX_SLACK_US})"


def fix_sql(since_us: int) -> str:
    """Sets the ``tool_call_end`` rows that the registered table of :class:`ToolFix` facts
    names (session, turn, call id; one fact per call) ``failed`` with the fact's error, in
    the columns and the ``content`` JSON alike, where they say ``served``: so every reader
    (the views, the timeline, the dashboard) reads the call as failed, and a fact applied
    twice (a resent span) changes nothing more. Run after the batch's rows (the call's row
    may be one); ``since_us``: the least ``since_us`` of the facts. A row whose content is
    in parts (:mod:`.values`) keeps it NULL: its columns say failed, its content as served."""
    return f"""UPDATE events SET tool_status = 'failed', tool_outcome = 'failed',
  content = CASE WHEN content IS NOT NULL
    THEN json_merge_patch(content, json_object('status', 'failed', 'outcome', 'failed', 'error', f.error)) END
FROM {FIXES_TABLE} f WHERE {_since("events", since_us)} AND {_fixed("events")}"""


def fixed_rows_sql(since_us: int) -> str:
    """The rows :func:`fix_sql` changes (before it runs): what the tool totals move from
    ``served`` to ``failed``."""
    return f"""SELECT e.tool_name AS tool, e.source_channel_id AS agent, e.tool_duration_ms AS duration_ms
FROM (SELECT * FROM events e WHERE {_since("e", since_us)}) e SEMI JOIN {FIXES_TABLE} f ON {_fixed("e")}"""


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

    __slots__ = (
        "call_rows", "calls", "events", "excluded", "fixes", "raw", "raw_bytes", "scores", "sessions", "turn_rows", "turns",
    )

    def __init__(self) -> None:
        self.fixes: list[tuple[Any, ...]] = []  # ToolFix tuples, in order: applied after the batch's rows
        self.scores: list[tuple[Any, ...]] = []  # ScoreFact tuples (rare): a table of their own
        # the raw copies of received spans (a collector's ``spans`` table, tuples in
        # raw_spans.RAW_COLUMNS' order), written in the same transaction as the rows made of
        # them (see StoreWriter.end_bundle); not counted in :attr:`rows`
        self.raw: list[tuple[Any, ...]] = []
        self.raw_bytes = 0
        self.events: list[Any] = []  # pyarrow RecordBatches of event facts
        self.sessions: list[str] = []
        self.turns: list[Any] = []  # pyarrow RecordBatches of turn facts
        self.turn_rows = 0
        self.calls: list[Any] = []  # pyarrow RecordBatches of model call facts
        self.call_rows = 0
        self.excluded = 0

    @property
    def event_rows(self) -> int:
        return len(self.sessions)

    @property
    def rows(self) -> int:
        return len(self.sessions) + self.turn_rows + self.call_rows

    def append(self, events: list[tuple[Any, ...]], turns: list[tuple[Any, ...]], excluded: int = 0,
               calls: list[tuple[Any, ...]] | None = None) -> None:
        """Add event facts, turn facts and model call facts (tuples in the fields' order of
        :class:`EventFact`, :class:`TurnFact` and :class:`CallFact`, or those row types
        themselves), and ``excluded`` rows left out by policy. A fact Arrow cannot take
        even once cleaned is dropped and reported."""
        self.excluded += excluded
        if events:
            events, batch = _record_batch(events, arrow_schemas()[0], EventFact)
            self.events.append(batch)
            self.sessions.extend(map(_session_of, events))
        if calls:
            calls, batch = _record_batch(calls, call_schema(), CallFact)
            self.calls.append(batch)
            self.call_rows += len(calls)
        if turns:
            turns, batch = _record_batch(turns, arrow_schemas()[1], TurnFact)
            self.turns.append(batch)
            self.turn_rows += len(turns)

    def extend(self, other: Facts) -> None:
        """Append ``other``'s rows after these."""
        self.events += other.events
        self.sessions += other.sessions
        self.turns += other.turns
        self.turn_rows += other.turn_rows
        self.calls += other.calls
        self.call_rows += other.call_rows
        self.excluded += other.excluded
        self.fixes += other.fixes
        self.scores += other.scores
        self.raw += other.raw
        self.raw_bytes += other.raw_bytes

    def drop_oldest(self, count: int) -> None:
        """Leave out the ``count`` oldest rows: events first, then model calls, then turn summaries."""
        cut = min(count, self.event_rows)
        if cut:
            self.events = self.event_table().slice(cut).to_batches()  # type: ignore[union-attr]
            self.sessions = self.sessions[cut:]
        count -= cut
        cut = min(count, self.call_rows)
        if cut:
            self.calls = self.call_table().slice(cut).to_batches()  # type: ignore[union-attr]
            self.call_rows -= cut
        count -= cut
        if count > 0 and self.turn_rows:
            self.turns = self.turn_table().slice(count).to_batches()  # type: ignore[union-attr]
            self.turn_rows = max(0, self.turn_rows - count)

    def event_table(self) -> Any:
        """The event facts as one pyarrow Table (None without any)."""
        import pyarrow as pa

        return pa.Table.from_batches(self.events, pa.schema(arrow_schemas()[0])) if self.events else None

    def turn_table(self) -> Any:
        """The turn facts as one pyarrow Table (None without any)."""
        import pyarrow as pa

        return pa.Table.from_batches(self.turns, pa.schema(arrow_schemas()[1])) if self.turns else None

    def call_table(self) -> Any:
        """The model call facts as one pyarrow Table (None without any)."""
        import pyarrow as pa

        return pa.Table.from_batches(self.calls, pa.schema(call_schema())) if self.calls else None


_MAPPING_GUARD = guard("span mapping")


def _record_batch(facts: list[tuple[Any, ...]], struct: Any, row: Any) -> tuple[list[tuple[Any, ...]], Any]:
    import pyarrow as pa

    try:
        return facts, pa.RecordBatch.from_struct_array(pa.array(facts, struct))
    except Exception:  # noqa: S110 - the slow way below, fact by fact
        pass
    kept = []
    for fact in facts:
        with _MAPPING_GUARD:
            fact = _clean(row._make(fact))
            pa.array([fact], struct)
            kept.append(fact)
    return kept, pa.RecordBatch.from_struct_array(pa.array(kept, struct))


def _clean(fact: Any) -> Any:
    """A fact (an :class:`EventFact` or :class:`TurnFact`) whose values Arrow takes.

    Text with lone surrogates gets them escaped, as :func:`loopscope._json.to_jsonable`
    does, which is what the Python mapping always stored for text inside JSON (and JSON
    text holding them becomes a JSON string). A raw attribute value that is not text
    (the row kept it as it was) becomes its ``str``. Numbers a column cannot hold: a
    count becomes NULL, a token count too (the usage JSON keeps it), a time fails.
    """
    kinds = _KINDS[type(fact)]
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
                if usage_json is None and "usage" in fact._fields:  # a call's raw figures are in provider_usage
                    usage = {key: a.usage_value(getattr(fact, key)) for key in _USAGE_KEYS}
                    usage_json = _json.dumps({k: v for k, v in usage.items() if v is not None})
                value = None
        values[i] = value
    cleaned = fact._make(values)
    return cleaned if usage_json is None else cleaned._replace(usage=usage_json)


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
        ...

    def rows(self, kind: int, span: Any, skip: frozenset[str] = frozenset()) -> tuple[int, int]:
        """How many event rows and turn rows the span would make (``skip`` as in :meth:`add`):
        what the writer counts as lost when it loses a span before mapping it."""
        ...

    def recover(self, con: Any) -> int:
        """Close the turns that writers whose process ended left open (``con`` holds the
        file for writing); returns how many were closed."""
        ...

    def cap(self, limit: int) -> tuple[float, Callable[[Any], tuple[Any, int]]]:
        """The cap check for ``limit`` characters (0: none): ``(over, cut)``. An ended span
        whose :meth:`size` is over ``over`` may hold a value over the cap: ``cut(span)`` is
        then a copy of it with those values cut (the span is left as it is) and its size,
        what the writer queues instead (see :func:`loopscope.ingest.big_values.cap`)."""
        ...

