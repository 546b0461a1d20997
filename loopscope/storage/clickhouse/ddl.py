"""The ClickHouse schema: ``otel_traces`` as the Collector's ``clickhouseexporter`` creates it, and
loopscope's derived tables, each filled by a materialized view over ``otel_traces``.

``otel_traces`` (:func:`otel_traces`) is the exporter's current template (its
``internal/sqltemplates/traces_table.sql``): the same columns, types, codecs, ALIAS columns, indexes
(bloom filters before ClickHouse 26.2, text indexes from 26.2 on, as the exporter picks by the
server's version: :func:`has_full_text`), partitioning, primary key, sort key and settings. A table
the exporter made first is left as it is (``IF NOT EXISTS``); loopscope never writes to it, the
Collector does (or a test, as the exporter would).

The exporter writes every attribute value as text (pdata's ``Value.AsString``: a string as it is,
``true``/``false``, an integer in decimal, a float in the shortest form, a list or a map as JSON) and
one row per ended span, at its start (``Timestamp``) with its ``Duration`` in nanoseconds. So every
row here comes from an ended span, read with the same rules as :mod:`loopscope.ingest.mapping`
(``docs/clickhouse.md`` lists where they differ):

* ``loopscope_events``: the timeline, one row per fact (a tool call's start and its end, the turn's
  input, each round's text, a failed model call), ordered by ``(session_id, at, seq, id)``: a
  session's timeline is one narrow range of the sort key. Its per-session index is not stored: a
  read numbers the rows (``row_number()`` over that order, :data:`TIMELINE`), so that any number of
  writers, with no single one, give the same gap-free indices;
* ``loopscope_turns``, ``loopscope_model_calls``, ``loopscope_tool_calls``: one row per
  ``invoke_agent``, ``chat`` and ``execute_tool`` span, ordered by session and start;
* ``loopscope_tool_durations``: the tool calls again, ordered by tool name and time (what the tool
  statistics read: one tool's range);
* ``loopscope_sessions``: first and last activity per session (min / max, which a resent span
  cannot change).

Every derived table is a ``ReplacingMergeTree`` whose sort key ends with the span's id (or, for
sessions, an ``AggregatingMergeTree`` of min and max): a batch the Collector sends again (its retry
after a timeout) makes the same keys, merged away in the background and never seen by a read with
``FINAL``. Retention is a setting (``ttl_days``): ``TTL`` on every table, whole days dropped at once
(``ttl_only_drop_parts``) as the exporter does for ``otel_traces``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ... import semconv as a
from . import views

OTEL_TRACES = "otel_traces"
"""The exporter's default traces table name (its ``traces_table_name``)."""

FULL_TEXT_SINCE = (26, 2)
"""The ClickHouse version from which the exporter makes text indexes instead of bloom filters."""


def ident(name: str) -> str:
    """A ClickHouse identifier, quoted as the exporter quotes its own (backticks)."""
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def has_full_text(version: str) -> bool:
    """Whether the exporter makes text indexes on a server of ``version`` (``SELECT version()``)."""
    parts = []
    for part in version.split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts) >= FULL_TEXT_SINCE


def _ttl(column: str, ttl_days: int) -> str:
    return f"TTL toDateTime({column}) + toIntervalDay({int(ttl_days)})" if ttl_days > 0 else ""


def otel_traces(database: str = "default", table: str = OTEL_TRACES, *, ttl_days: int = 0, full_text: bool = False,
                engine: str = "MergeTree()", cluster: str = "") -> str:
    """The exporter's ``CREATE TABLE`` for its traces table, rendered as it renders it (``ttl_days``:
    its ``ttl`` setting in whole days; ``full_text``: a server from 26.2 on; ``engine`` its
    ``table_engine``; ``cluster`` its ``cluster_name``)."""
    if full_text:
        indexes = """
    INDEX idx_trace_id TraceId TYPE text(tokenizer = 'array'),
    INDEX idx_res_attr_key mapKeys(ResourceAttributes) TYPE text(tokenizer = 'array'),
    INDEX idx_res_attr_items ResourceAttributeItems TYPE text(tokenizer = 'array'),
    INDEX idx_span_attr_key mapKeys(SpanAttributes) TYPE text(tokenizer = 'array'),
    INDEX idx_span_attr_items SpanAttributeItems TYPE text(tokenizer = 'array'),"""
    else:
        indexes = """
    INDEX idx_trace_id TraceId TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_res_attr_key mapKeys(ResourceAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_res_attr_value mapValues(ResourceAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_span_attr_key mapKeys(SpanAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_span_attr_value mapValues(SpanAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,"""
    on_cluster = f"ON CLUSTER {ident(cluster)}" if cluster else ""
    return f"""CREATE TABLE IF NOT EXISTS {ident(database)}.{ident(table)} {on_cluster} (
    Timestamp DateTime64(9) CODEC(Delta(8), ZSTD(1)),
    TraceId String CODEC(ZSTD(1)),
    SpanId String CODEC(ZSTD(1)),
    ParentSpanId String CODEC(ZSTD(1)),
    TraceState String CODEC(ZSTD(1)),
    SpanName LowCardinality(String) CODEC(ZSTD(1)),
    SpanKind LowCardinality(String) CODEC(ZSTD(1)),
    ServiceName LowCardinality(String) CODEC(ZSTD(1)),
    ResourceAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    ScopeName String CODEC(ZSTD(1)),
    ScopeVersion String CODEC(ZSTD(1)),
    SpanAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    Duration UInt64 CODEC(T64, ZSTD(1)),
    StatusCode LowCardinality(String) CODEC(ZSTD(1)),
    StatusMessage String CODEC(ZSTD(1)),
    Events Nested (
        Timestamp DateTime64(9),
        Name LowCardinality(String),
        Attributes Map(LowCardinality(String), String)
    ) CODEC(ZSTD(1)),
    Links Nested (
        TraceId String,
        SpanId String,
        TraceState String,
        Attributes Map(LowCardinality(String), String)
    ) CODEC(ZSTD(1)),
    ResourceAttributeItems Array(String) ALIAS arrayMap(kv -> concat(kv.1, '=', kv.2), CAST(ResourceAttributes, 'Array(Tuple(String, String))')),
    SpanAttributeItems Array(String) ALIAS arrayMap(kv -> concat(kv.1, '=', kv.2), CAST(SpanAttributes, 'Array(Tuple(String, String))')),{indexes}
    INDEX idx_duration Duration TYPE minmax GRANULARITY 1
) ENGINE = {engine}
PARTITION BY toDate(Timestamp)
PRIMARY KEY (ServiceName, SpanName, toDateTime(Timestamp))
ORDER BY (ServiceName, SpanName, toDateTime(Timestamp), Timestamp)
{_ttl("Timestamp", ttl_days)}
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1"""


# -- the mapping's rules, as expressions over one otel_traces row --------------------------------------

def _attr(name: str) -> str:
    return f"SpanAttributes['{name}']"


def _text(name: str) -> str:
    """An attribute as nullable text: NULL where the span has none (or an empty one)."""
    return f"nullIf({_attr(name)}, '')"


def _flag(name: str) -> str:
    return f"({_attr(name)} = 'true')"


def _count(name: str, *more: str) -> str:
    """A token count: the first of the attributes that holds an integer, else NULL."""
    return "coalesce(" + ", ".join(f"toInt64OrNull({_attr(n)})" for n in (name, *more)) + ")"


def _json_text(name: str) -> str:
    """An attribute that should hold JSON: as it is when it does, else as a JSON string; ``null``
    for none (the mapping's ``_json_text``)."""
    value = _attr(name)
    return f"if(mapContains(SpanAttributes, '{name}'), if(isValidJSON({value}), {value}, toJSONString({value})), 'null')"


def _json_or_null(expr: str) -> str:
    return f"if(isNull({expr}), 'null', toJSONString(assumeNotNull({expr})))"


_OP = _attr(a.OPERATION)
_START_NS = "toUnixTimestamp64Nano(Timestamp)"
_END_NS = f"({_START_NS} + toInt64(Duration))"
_START_US = f"fromUnixTimestamp64Micro(intDiv({_START_NS}, 1000), 'UTC')"
_END_US = f"fromUnixTimestamp64Micro(intDiv({_END_NS}, 1000), 'UTC')"
_START_AT = f"fromUnixTimestamp64Nano({_START_NS}, 'UTC')"
_END_AT = f"fromUnixTimestamp64Nano({_END_NS}, 'UTC')"
_DURATION_MS = "round(Duration / 1e6, 3)"
_SESSION = f"if({_attr(a.CONVERSATION_ID)} != '', {_attr(a.CONVERSATION_ID)}, lower(TraceId))"
_PROVIDER = f"coalesce({_text(a.PROVIDER)}, {_text(a.TURN_PROVIDER)})"
_SOURCE = f"""{_text(a.TURN_ID)} AS correlation_id, {_text(a.AGENT_NAME)} AS source_channel_id,
    {_PROVIDER} AS source_provider, {_text(a.FRAMEWORK)} AS source_framework"""
_TOOL_OUTCOME = f"if({_attr(a.TOOL_OUTCOME)} != '', {_attr(a.TOOL_OUTCOME)}, 'served')"
_TOOL_STATUS = f"if({_attr(a.TOOL_STATUS)} != '', {_attr(a.TOOL_STATUS)}, if({_TOOL_OUTCOME} = 'served', 'completed', 'failed'))"
_CALL_FAILED = f"({_attr(a.CALL_OUTCOME)} = 'error' OR ({_attr(a.CALL_OUTCOME)} = '' AND {_attr(a.ERROR_TYPE)} != ''))"
_CALL_ERROR = (f"if(mapContains(SpanAttributes, '{a.CALL_ERROR}'), {_attr(a.CALL_ERROR)}, "
               f"if({_attr(a.ERROR_TYPE)} != '', nullIf(StatusMessage, ''), NULL))")
_FINISH = {  # mapping._FINISH_OUTCOMES: how a call ended, where its span does not say
    "stop": "completed", "tool_calls": "completed", "tool_call": "completed", "end_turn": "completed",
    "tool_use": "completed", "stop_sequence": "completed", "function_call": "completed", "pause_turn": "completed",
    "completed": "completed", "length": "truncated", "max_tokens": "truncated", "max_output_tokens": "truncated",
    "incomplete": "truncated", "content_filter": "content_filter", "refusal": "refusal",
}
_REASONS = f"JSONExtract({_attr(a.RESPONSE_FINISH_REASONS)}, 'Array(String)')"
_CALL_OUTCOME = (
    f"multiIf({_attr(a.CALL_OUTCOME)} != '', {_attr(a.CALL_OUTCOME)}, {_attr(a.ERROR_TYPE)} != '', 'error', "
    f"notEmpty({_REASONS}), transform({_REASONS}[1], [{', '.join(repr(k) for k in _FINISH)}], "
    f"[{', '.join(repr(v) for v in _FINISH.values())}], ''), '')"
)

# event kinds: the ``type`` a row has, the id suffix the DuckDB store gives it, and ``seq``: the
# order of rows of one session at the same nanosecond (a turn's input first; a tool call's end
# before what starts at its very end)
_EVENT_COLUMNS = """
    id String,
    session_id String,
    at DateTime64(9, 'UTC'),
    seq UInt8,
    type LowCardinality(String),
    created_at DateTime64(6, 'UTC'),
    correlation_id Nullable(String),
    source_channel_id Nullable(String),
    source_provider Nullable(String),
    source_framework Nullable(String),
    status LowCardinality(String),
    content String CODEC(ZSTD(1)),
    trace_id String,
    span_id String,
    tool_name Nullable(String),
    tool_call_id Nullable(String),
    tool_status Nullable(String),
    tool_outcome Nullable(String),
    tool_duration_ms Nullable(Float64)"""
EVENT_COLUMNS = tuple(line.split()[0] for line in _EVENT_COLUMNS.strip().splitlines())
"""The columns of ``loopscope_events``, in order."""


def _tool_content(ended: bool) -> str:
    head = (f"""concat('{{"type":"tool_call","tool_name":', toJSONString({_attr(a.TOOL_NAME)}), ',"tool_id":', """
            f"""toJSONString({_attr(a.TOOL_CALL_ID)}), ',"arguments":', {_json_text(a.TOOL_CALL_ARGUMENTS)}""")
    if not ended:
        return head + """, ',"result":null,"status":"pending","outcome":null,"duration_ms":null,"error":null}')"""
    return (head + f""", ',"result":', {_json_text(a.TOOL_CALL_RESULT)}, ',"status":', toJSONString({_TOOL_STATUS}),
        ',"outcome":', toJSONString({_TOOL_OUTCOME}), ',"duration_ms":', toString({_DURATION_MS}),
        ',"error":', {_json_or_null(_text(a.TOOL_ERROR))}, '}}')""")


def _event_views(database: str, source: str) -> dict[str, str]:
    """The ``SELECT`` of each view that feeds ``loopscope_events``, by view name."""
    src = f"{ident(database)}.{ident(source)}"
    common = f"{_SESSION} AS session_id, {_SOURCE}, lower(TraceId) AS trace_id, lower(SpanId) AS span_id"
    tool = (f"{_attr(a.TOOL_NAME)} AS tool_name, {_attr(a.TOOL_CALL_ID)} AS tool_call_id")
    no_tool = ("CAST(NULL AS Nullable(String)) AS tool_name, CAST(NULL AS Nullable(String)) AS tool_call_id, "
               "CAST(NULL AS Nullable(String)) AS tool_status, CAST(NULL AS Nullable(String)) AS tool_outcome, "
               "CAST(NULL AS Nullable(Float64)) AS tool_duration_ms")
    said_input = f"(mapContains(SpanAttributes, '{a.TURN_INPUT}') OR {_flag(a.CONTENT_WITHHELD)})"
    said_round = f"({_attr(a.ROUND_TEXT)} != '' OR {_flag(a.CONTENT_WITHHELD)})"
    return {
        "loopscope_events_tool_start_mv": f"""SELECT concat(lower(TraceId), lower(SpanId), 's') AS id, {_START_AT} AS at, 4 AS seq,
    'tool_call_start' AS type, {_START_US} AS created_at, 'delivered' AS status, {_tool_content(False)} AS content,
    {common}, {tool}, 'pending' AS tool_status, CAST(NULL AS Nullable(String)) AS tool_outcome,
    CAST(NULL AS Nullable(Float64)) AS tool_duration_ms
FROM {src} WHERE {_OP} = '{a.OP_EXECUTE_TOOL}'""",
        "loopscope_events_tool_end_mv": f"""SELECT concat(lower(TraceId), lower(SpanId), 'e') AS id, {_END_AT} AS at, 1 AS seq,
    'tool_call_end' AS type, {_END_US} AS created_at, 'delivered' AS status, {_tool_content(True)} AS content,
    {common}, {tool}, {_TOOL_STATUS} AS tool_status, {_TOOL_OUTCOME} AS tool_outcome, {_DURATION_MS} AS tool_duration_ms
FROM {src} WHERE {_OP} = '{a.OP_EXECUTE_TOOL}'""",
        "loopscope_events_input_mv": f"""SELECT concat(lower(TraceId), lower(SpanId), 'i') AS id, {_START_AT} AS at, 0 AS seq,
    'message' AS type, {_START_US} AS created_at, if({_flag(a.TURN_INPUT_BLOCKED)}, 'blocked', 'delivered') AS status,
    concat('{{"type":"text","body":', toJSONString({_attr(a.TURN_INPUT)}), ',"role":"user"}}') AS content,
    {common}, {no_tool}
FROM {src} WHERE {_OP} = '{a.OP_INVOKE_AGENT}' AND {said_input}""",
        "loopscope_events_message_mv": f"""SELECT concat(lower(TraceId), lower(SpanId), 'm') AS id, {_END_AT} AS at, 2 AS seq,
    'message' AS type, {_END_US} AS created_at, if({_flag(a.ROUND_BLOCKED)}, 'blocked', 'delivered') AS status,
    concat('{{"type":"text","body":', toJSONString({_attr(a.ROUND_TEXT)}), ',"role":"assistant"}}') AS content,
    {common}, {no_tool}
FROM {src} WHERE {_OP} = '{a.OP_CHAT}' AND {said_round}""",
        "loopscope_events_model_error_mv": f"""SELECT concat(lower(TraceId), lower(SpanId), 'f') AS id, {_END_AT} AS at, 3 AS seq,
    'model_error' AS type, {_END_US} AS created_at, 'delivered' AS status,
    concat('{{"type":"model_error","model":', {_json_or_null(f"coalesce({_text(a.RESPONSE_MODEL)}, {_text(a.REQUEST_MODEL)})")},
        ',"error_type":', {_json_or_null(_text(a.ERROR_TYPE))}, ',"error":', {_json_or_null(_CALL_ERROR)},
        ',"duration_ms":', toString({_DURATION_MS}), '}}') AS content,
    {common}, {no_tool}
FROM {src} WHERE {_OP} = '{a.OP_CHAT}' AND {_CALL_FAILED}""",
    }


def _turns_select(src: str) -> str:
    segments = f"if({_attr(a.SEGMENTS)} != '', {_attr(a.SEGMENTS)}, '[]')"
    loop_end = _text(a.LOOP_END_REASON)
    error_type, description = _text(a.ERROR_TYPE), "nullIf(StatusMessage, '')"
    error = (f"if({loop_end} = 'error', if(isNotNull({error_type}) AND isNotNull({description}), "
             f"concat({error_type}, ': ', {description}), coalesce({error_type}, {description})), NULL)")
    return f"""SELECT if({_attr(a.TURN_ID)} != '', {_attr(a.TURN_ID)}, lower(SpanId)) AS correlation_id,
    {_SESSION} AS session_id, {_START_US} AS started_at, {_END_US} AS timestamp,
    {_text(a.AGENT_NAME)} AS channel_id, {_text(a.PARENT_TURN_ID)} AS parent_correlation_id,
    arrayStringConcat(JSONExtract({segments}, 'Array(String)'), '\\n\\n') AS response_content, {segments} AS segments,
    toInt64OrZero({_attr(a.TOOL_CALLS_COUNT)}) AS tool_calls_count, toInt64OrZero({_attr(a.ROUND_COUNT)}) AS round_count,
    {_count(a.USAGE_INPUT)} AS input_tokens, {_count(a.USAGE_OUTPUT)} AS output_tokens,
    {_count(a.USAGE_CACHE_READ, a.TURN_CACHE_READ)} AS cache_read_input_tokens,
    {_count(a.USAGE_CACHE_CREATION, a.TURN_CACHE_WRITE, a.USAGE_CACHE_WRITE)} AS cache_creation_input_tokens,
    {_count(a.USAGE_REASONING, a.TURN_REASONING)} AS reasoning_tokens,
    {_attr(a.THINKING)} AS thinking, {loop_end} AS loop_end_reason, {_DURATION_MS} AS latency_ms,
    {_flag(a.STREAMING)} AS streaming,
    if({_attr(a.DECLARED_TOOLS)} != '', {_attr(a.DECLARED_TOOLS)}, '[]') AS declared_tools,
    coalesce({_text(a.RESPONSE_MODEL)}, {_text(a.TURN_MODEL)}, {_text(a.REQUEST_MODEL)}) AS model,
    {_PROVIDER} AS provider, {error} AS error, toInt64OrNull({_attr(a.MODEL_CALL_COUNT)}) AS model_call_count,
    lower(TraceId) AS trace_id, lower(SpanId) AS span_id
FROM {src} WHERE {_OP} = '{a.OP_INVOKE_AGENT}'"""


def _calls_select(src: str) -> str:
    ttfc = f"toFloat64OrNull({_attr(a.TIME_TO_FIRST_CHUNK)})"
    return f"""SELECT {_SESSION} AS session_id, {_START_US} AS started_at, {_END_US} AS ended_at,
    {_text(a.TURN_ID)} AS correlation_id, toInt64OrNull({_attr(a.CALL_POSITION)}) AS position,
    {_text(a.PROVIDER)} AS provider, {_text(a.FRAMEWORK)} AS framework, {_text(a.AGENT_NAME)} AS agent,
    {_text(a.REQUEST_MODEL)} AS request_model, {_text(a.RESPONSE_MODEL)} AS response_model,
    {_text(a.RESPONSE_ID)} AS response_id, {_text(a.RESPONSE_FINISH_REASONS)} AS finish_reasons,
    nullIf({_CALL_OUTCOME}, '') AS outcome,
    if(mapContains(SpanAttributes, '{a.REQUEST_STREAM}'), {_flag(a.REQUEST_STREAM)}, NULL) AS streaming,
    {_DURATION_MS} AS duration_ms, if(isNull({ttfc}), NULL, round({ttfc} * 1000, 3)) AS time_to_first_chunk_ms,
    {_count(a.USAGE_INPUT)} AS input_tokens, {_count(a.USAGE_OUTPUT)} AS output_tokens,
    {_count(a.USAGE_CACHE_READ)} AS cache_read_input_tokens,
    {_count(a.USAGE_CACHE_CREATION, a.USAGE_CACHE_WRITE)} AS cache_creation_input_tokens,
    {_count(a.USAGE_REASONING)} AS reasoning_tokens, {_text(a.USAGE_PROVIDER)} AS provider_usage,
    {_text(a.ERROR_TYPE)} AS error_type, {_CALL_ERROR} AS error, {_text(a.CALL_REFUSAL)} AS refusal,
    {_text(a.INPUT_MESSAGES)} AS input_messages, {_text(a.OUTPUT_MESSAGES)} AS output_messages,
    lower(TraceId) AS trace_id, lower(SpanId) AS span_id
FROM {src} WHERE {_OP} = '{a.OP_CHAT}'"""


def _tools_select(src: str) -> str:
    return f"""SELECT {_SESSION} AS session_id, {_START_US} AS started_at, {_END_US} AS ended_at,
    {_attr(a.TOOL_NAME)} AS tool, {_attr(a.TOOL_CALL_ID)} AS call_id, {_text(a.TURN_ID)} AS turn_id,
    {_text(a.AGENT_NAME)} AS agent, {_json_text(a.TOOL_CALL_ARGUMENTS)} AS arguments,
    {_json_text(a.TOOL_CALL_RESULT)} AS result, {_TOOL_STATUS} AS status, {_TOOL_OUTCOME} AS outcome,
    {_text(a.TOOL_ERROR)} AS error, {_DURATION_MS} AS duration_ms, lower(TraceId) AS trace_id, lower(SpanId) AS span_id
FROM {src} WHERE {_OP} = '{a.OP_EXECUTE_TOOL}'"""


_TABLES = {
    "loopscope_events": (_EVENT_COLUMNS, "toDate(at)", "(session_id, at, seq, id)", "at"),
    "loopscope_turns": ("""
    correlation_id String, session_id String, started_at DateTime64(6, 'UTC'), timestamp DateTime64(6, 'UTC'),
    channel_id Nullable(String), parent_correlation_id Nullable(String), response_content String CODEC(ZSTD(1)),
    segments String CODEC(ZSTD(1)), tool_calls_count Int64, round_count Int64, input_tokens Nullable(Int64),
    output_tokens Nullable(Int64), cache_read_input_tokens Nullable(Int64), cache_creation_input_tokens Nullable(Int64),
    reasoning_tokens Nullable(Int64), thinking String CODEC(ZSTD(1)), loop_end_reason LowCardinality(Nullable(String)),
    latency_ms Float64, streaming Bool, declared_tools String CODEC(ZSTD(1)), model LowCardinality(Nullable(String)),
    provider LowCardinality(Nullable(String)), error Nullable(String), model_call_count Nullable(Int64),
    trace_id String, span_id String""", "toDate(started_at)", "(session_id, started_at, correlation_id, span_id)", "started_at"),
    "loopscope_model_calls": ("""
    session_id String, started_at DateTime64(6, 'UTC'), ended_at DateTime64(6, 'UTC'), correlation_id Nullable(String),
    position Nullable(Int64), provider LowCardinality(Nullable(String)), framework LowCardinality(Nullable(String)),
    agent Nullable(String), request_model LowCardinality(Nullable(String)), response_model LowCardinality(Nullable(String)),
    response_id Nullable(String), finish_reasons Nullable(String), outcome LowCardinality(Nullable(String)),
    streaming Nullable(Bool), duration_ms Float64, time_to_first_chunk_ms Nullable(Float64), input_tokens Nullable(Int64),
    output_tokens Nullable(Int64), cache_read_input_tokens Nullable(Int64), cache_creation_input_tokens Nullable(Int64),
    reasoning_tokens Nullable(Int64), provider_usage Nullable(String), error_type Nullable(String), error Nullable(String),
    refusal Nullable(String), input_messages Nullable(String) CODEC(ZSTD(1)), output_messages Nullable(String) CODEC(ZSTD(1)),
    trace_id String, span_id String""", "toDate(started_at)", "(session_id, started_at, span_id)", "started_at"),
    "loopscope_tool_calls": ("""
    session_id String, started_at DateTime64(6, 'UTC'), ended_at DateTime64(6, 'UTC'), tool String, call_id String,
    turn_id Nullable(String), agent Nullable(String), arguments String CODEC(ZSTD(1)), result String CODEC(ZSTD(1)),
    status LowCardinality(String), outcome LowCardinality(String), error Nullable(String), duration_ms Float64,
    trace_id String, span_id String""", "toDate(started_at)", "(session_id, started_at, span_id)", "started_at"),
    "loopscope_tool_durations": ("""
    tool String, started_at DateTime64(6, 'UTC'), duration_ms Float64, status LowCardinality(String),
    outcome LowCardinality(String), session_id String, span_id String""",
                                 "toDate(started_at)", "(tool, started_at, span_id)", "started_at"),
}


def derived(database: str = "default", source: str = OTEL_TRACES, *, ttl_days: int = 0) -> list[str]:
    """loopscope's tables and the materialized views that fill them from ``source`` (the exporter's
    traces table), then the read-time views; in order, each ``IF NOT EXISTS``; last the SQL views
    of the DuckDB store's names (:mod:`.views`), each ``OR REPLACE``."""
    db, src = ident(database), f"{ident(database)}.{ident(source)}"
    out = []
    for name, (columns, partition, order, time) in _TABLES.items():
        out.append(f"""CREATE TABLE IF NOT EXISTS {db}.{ident(name)} ({columns}
) ENGINE = ReplacingMergeTree
PARTITION BY {partition}
ORDER BY {order}
{_ttl(time, ttl_days)}
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1""")
    out.append(f"""CREATE TABLE IF NOT EXISTS {db}.`loopscope_sessions` (
    session_id String,
    first_at SimpleAggregateFunction(min, DateTime64(6, 'UTC')),
    last_at SimpleAggregateFunction(max, DateTime64(6, 'UTC')),
    agents SimpleAggregateFunction(groupUniqArrayArray, Array(String))
) ENGINE = AggregatingMergeTree
ORDER BY session_id
{_ttl("last_at", ttl_days)}""")
    events = f"{db}.`loopscope_events`"
    for view, select in _event_views(database, source).items():
        out.append(f"CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.{ident(view)} TO {events} AS {select}")
    out.append(f"CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.`loopscope_turns_mv` TO {db}.`loopscope_turns` AS {_turns_select(src)}")
    out.append(f"CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.`loopscope_model_calls_mv` TO {db}.`loopscope_model_calls` AS "
               f"{_calls_select(src)}")
    out.append(f"CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.`loopscope_tool_calls_mv` TO {db}.`loopscope_tool_calls` AS "
               f"{_tools_select(src)}")
    out.append(f"""CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.`loopscope_tool_durations_mv` TO {db}.`loopscope_tool_durations` AS
SELECT {_attr(a.TOOL_NAME)} AS tool, {_START_US} AS started_at, {_DURATION_MS} AS duration_ms, {_TOOL_STATUS} AS status,
    {_TOOL_OUTCOME} AS outcome, {_SESSION} AS session_id, lower(SpanId) AS span_id
FROM {src} WHERE {_OP} = '{a.OP_EXECUTE_TOOL}'""")
    ops = ", ".join(f"'{op}'" for op in (a.OP_INVOKE_AGENT, a.OP_CHAT, a.OP_EXECUTE_TOOL))
    out.append(f"""CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.`loopscope_sessions_mv` TO {db}.`loopscope_sessions` AS
SELECT {_SESSION} AS session_id, min({_START_US}) AS first_at, max({_END_US}) AS last_at,
    groupUniqArrayIf({_attr(a.AGENT_NAME)}, {_attr(a.AGENT_NAME)} != '') AS agents
FROM {src} WHERE {_OP} IN ({ops}) GROUP BY session_id""")
    out.append(f"CREATE VIEW IF NOT EXISTS {db}.`loopscope_timeline` AS {TIMELINE.format(events=events)}")
    from .scores import statements as scores  # loopscope_scores and its views (storage/clickhouse/scores.py)
    out.extend(scores(database, source, ttl_days=ttl_days))
    out.extend(views.create_statements(db))  # the DuckDB store's SQL views, by the same names
    return out


TIMELINE = """SELECT row_number() OVER (ORDER BY at, seq, id) AS idx, *
FROM {events} FINAL WHERE session_id = {{session_id:String}}
ORDER BY at, seq, id"""
"""One session's timeline with its indices (a parameterized view: ``SELECT * FROM
loopscope_timeline(session_id = 's1')``): the rows in the sort key's order, numbered from 1 at read
time (as the DuckDB store numbers them). The same rows give the same numbers whoever wrote them and in whatever order they arrived;
a resent row is one row (``FINAL``), so the numbers have no gap."""


def statements(database: str = "default", *, ttl_days: int = 0, full_text: bool = False,
               source: str = OTEL_TRACES) -> list[str]:
    """Every statement, in order: the database, ``otel_traces`` (as the exporter makes it), then
    :func:`derived`."""
    return [f"CREATE DATABASE IF NOT EXISTS {ident(database)}",
            otel_traces(database, source, ttl_days=ttl_days, full_text=full_text),
            *derived(database, source, ttl_days=ttl_days)]


def create(run: Callable[[str], Any], version: str, database: str = "default", *, ttl_days: int = 0) -> None:
    """Run :func:`statements` through ``run`` (one statement a call), for a server of ``version``."""
    for statement in statements(database, ttl_days=ttl_days, full_text=has_full_text(version)):
        run(statement)
