"""The SQL the ClickHouse engine's reads share (:mod:`.reader`, :mod:`.pages`, :mod:`.parquet`): each
derived table read with a resent copy of a row left out (``LIMIT 1 BY`` its id: a resent span makes
the very same row, and this costs less than ``FINAL``), a session's rows numbered at read time,
``tool_stats`` and ``declared_vs_used`` as the DuckDB views have them, an :class:`EventFilter` as
ClickHouse conditions, and the conversions of what comes back (Unix microseconds to datetimes)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from ..policy import EventFilter
from ..results import TOOL_OUTCOMES
from . import queries


def when(us: int) -> datetime:
    """Unix microseconds as an aware UTC datetime."""
    seconds, micros = divmod(int(us), 1_000_000)
    return datetime.fromtimestamp(seconds, timezone.utc).replace(microsecond=micros)


def at(us: int | None) -> datetime | None:
    """Unix microseconds as an aware UTC datetime (None stays None)."""
    return None if us is None else when(us)


def us_of(value: datetime) -> int:
    """An aware (or UTC naive) datetime as Unix microseconds."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return int(value.timestamp()) * 1_000_000 + value.microsecond


def ids_param(values: Sequence[Any]) -> str:
    """A list as one JSON text: a String binds the same on every client (an Array's text does not)."""
    return json.dumps([str(v) for v in values])


IN_IDS = "(SELECT arrayJoin(JSONExtract({%s:String}, 'Array(String)')))"
"""A subquery of the ids bound as :func:`ids_param` under the name given (``IN_IDS % 'ids'``)."""

EVENT_SELECT = ("id, session_id, idx, type, toUnixTimestamp64Micro(created_at) AS created_us, correlation_id, "
                "source_channel_id, source_provider, source_framework, status, content, trace_id, span_id")
EVENT_NAMES = tuple(c.split(" AS ")[-1].strip() for c in EVENT_SELECT.split(", "))

SESSION_ROWS = queries.TIMELINE_ROWS
"""One session's rows numbered (``idx``), a resent copy left out (:mod:`.queries`)."""

# every session's rows numbered, of the sessions a subquery picks (``{sessions}``)
MANY_ROWS = """SELECT row_number() OVER (PARTITION BY session_id ORDER BY at, seq, id) AS idx, * FROM (
    SELECT * FROM loopscope_events WHERE session_id IN {sessions} ORDER BY session_id, at, seq, id LIMIT 1 BY id)"""

TURN_SELECT = """correlation_id, session_id, channel_id, parent_correlation_id, response_content, segments, tool_calls_count,
    round_count, input_tokens, output_tokens, cache_read_input_tokens, cache_creation_input_tokens, reasoning_tokens,
    thinking, loop_end_reason, latency_ms, streaming, toUnixTimestamp64Micro(timestamp) AS timestamp_us, declared_tools,
    model, provider, error, trace_id, span_id, model_call_count"""
TURN_NAMES = tuple(c.strip().split(" AS ")[-1] for c in TURN_SELECT.split(","))
USAGE_NAMES = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens", "reasoning_tokens")

CALL_SELECT = """session_id, correlation_id, coalesce(position, toInt64(row_number() OVER
        (PARTITION BY session_id, correlation_id ORDER BY started_at, span_id))) AS position,
    agent, provider, framework, coalesce(response_model, request_model) AS model, request_model, response_model,
    response_id, finish_reasons, outcome, streaming, toUnixTimestamp64Micro(started_at) AS started_us,
    toUnixTimestamp64Micro(ended_at) AS ended_us, duration_ms, time_to_first_chunk_ms, input_tokens, output_tokens,
    cache_read_input_tokens, cache_creation_input_tokens, reasoning_tokens, provider_usage, error_type, error, refusal,
    input_messages, output_messages, trace_id, span_id"""
CALLS = "(SELECT * FROM loopscope_model_calls {where} ORDER BY started_at, span_id LIMIT 1 BY span_id)"
TOOL_CALLS = "(SELECT * FROM loopscope_tool_calls {where} ORDER BY started_at, span_id LIMIT 1 BY span_id)"
TURNS = "(SELECT * FROM loopscope_turns {where} ORDER BY started_at, correlation_id, span_id LIMIT 1 BY correlation_id, span_id)"

TOOL_ORDER = {
    "calls": "calls DESC, tool",
    "failures": "failure_share DESC NULLS LAST, calls DESC, tool",
    "p95": "p95_ms DESC NULLS LAST, tool",
    "name": "tool",
}

TOOL_STATS = f"""SELECT tool, count() AS calls, toUInt64(0) AS pending, count() AS finished,
    {", ".join(f"countIf(outcome = '{o}') AS {o}" for o in TOOL_OUTCOMES)},
    {", ".join(f"{o} / nullIf(finished, 0) AS {o}_share" for o in TOOL_OUTCOMES)},
    (finished - served) / nullIf(finished, 0) AS failure_share,
    avg(duration_ms) AS avg_ms, quantilesExactInclusive(0.5, 0.95, 0.99)(duration_ms) AS q, q[1] AS p50_ms,
    q[2] AS p95_ms, q[3] AS p99_ms, max(duration_ms) AS max_ms, uniqExact(agent) AS agents,
    toUnixTimestamp64Micro(min(started_at)) AS first_seen, toUnixTimestamp64Micro(max(ended_at)) AS last_seen
FROM {TOOL_CALLS.format(where="")} GROUP BY tool"""
"""``tool_stats`` as the DuckDB view has it (every call here has ended: ``pending`` is 0)."""

# per agent and tool: the turns that offered it (declared, not an output tool), the calls made
DECLARED = f"""WITH offered AS (
    SELECT DISTINCT coalesce(channel_id, '') AS agent, session_id, correlation_id AS turn_id,
        JSONExtractString(d, 'name') AS tool, timestamp AS ended_at
    FROM {TURNS.format(where="")} ARRAY JOIN JSONExtractArrayRaw(declared_tools) AS d
    WHERE JSONExtractString(d, 'origin') != 'output' AND tool != ''
), outputs AS (
    SELECT DISTINCT session_id, correlation_id AS turn_id, JSONExtractString(d, 'name') AS tool
    FROM {TURNS.format(where="")} ARRAY JOIN JSONExtractArrayRaw(declared_tools) AS d
    WHERE JSONExtractString(d, 'origin') = 'output'
), used AS (
    SELECT coalesce(t.channel_id, '') AS agent, c.session_id AS session_id, c.turn_id AS turn_id, c.tool AS tool,
        count() AS calls, max(c.ended_at) AS last_called
    FROM {TOOL_CALLS.format(where="")} AS c
    JOIN {TURNS.format(where="")} AS t ON t.session_id = c.session_id AND t.correlation_id = c.turn_id
    WHERE (c.session_id, c.turn_id, c.tool) NOT IN (SELECT session_id, turn_id, tool FROM outputs)
    GROUP BY agent, session_id, turn_id, tool
)
SELECT if(o.turn_id != '', o.agent, u.agent) AS agent, if(o.turn_id != '', o.tool, u.tool) AS tool,
    countIf(o.turn_id != '') AS turns_offered, countIf(o.turn_id != '' AND u.turn_id != '') AS turns_used,
    turns_used / nullIf(turns_offered, 0) AS use_share, sum(u.calls) AS calls,
    sumIf(u.calls, o.turn_id = '') AS undeclared_calls,
    if(turns_offered > 0, toUnixTimestamp64Micro(maxIf(o.ended_at, o.turn_id != '')), NULL) AS last_offered,
    if(sum(u.calls) > 0, toUnixTimestamp64Micro(maxIf(u.last_called, u.turn_id != '')), NULL) AS last_called
FROM offered AS o FULL OUTER JOIN used AS u
    ON o.agent = u.agent AND o.session_id = u.session_id AND o.turn_id = u.turn_id AND o.tool = u.tool
GROUP BY agent, tool
ORDER BY agent = '', agent, use_share NULLS LAST, turns_offered DESC, tool
SETTINGS join_use_nulls = 0"""

_HAS_TYPE = "WHERE position(declared_tools, '\"type\"') > 0"
# the tools turns offered as server tools (the provider runs them: a declared tool with a type)
SERVER_TOOLS = f"""SELECT DISTINCT coalesce(channel_id, '') AS agent, JSONExtractString(d, 'name') AS tool
FROM {TURNS.format(where=_HAS_TYPE)}
ARRAY JOIN JSONExtractArrayRaw(declared_tools) AS d WHERE JSONExtractString(d, 'type') != ''"""


MATCH = "positionCaseInsensitiveUTF8({text}, {{needle:String}}) > 0"
"""A row whose ``text`` holds the needle bound as ``needle`` (any case)."""

EVENT_TEXT = ("concatWithSeparator(char(31), JSONExtractString(content, 'body'), JSONExtractString(content, 'tool_name'), "
              "JSONExtractRaw(content, 'arguments'), JSONExtractRaw(content, 'result'), JSONExtractString(content, 'error'))")
"""An event's searchable text (``loopscope_events.content``), as ``policy.EVENT_TEXT`` has it."""

EVENT_NOT_SERVED = ("type = 'tool_call_end' AND "
                    "coalesce(tool_outcome, if(tool_status = 'completed', 'served', NULL), 'failed') != 'served'")
"""A tool call's end row whose call was not served (``loopscope_events``)."""


def event_filter_sql(event_filter: EventFilter, params: dict[str, Any]) -> list[str]:
    """An :class:`EventFilter` as ClickHouse conditions (joined with AND), its values in ``params``."""
    clauses: list[str] = []
    if not event_filter.include_blocked:
        clauses.append("status != 'blocked'")
    if event_filter.event_types is not None:
        params["f_types"] = ids_param(sorted(event_filter.event_types))  # type: ignore[arg-type]
        clauses.append(f"type IN {IN_IDS % 'f_types'}")
    if event_filter.exclude_types:
        params["f_not_types"] = ids_param(sorted(event_filter.exclude_types))  # type: ignore[arg-type]
        clauses.append(f"type NOT IN {IN_IDS % 'f_not_types'}")
    for column in ("correlation_id", "source_channel_id", "source_provider", "source_framework"):
        value = getattr(event_filter, column)
        if value is not None:
            clauses.append(f"{column} = {{f_{column}:String}}")
            params[f"f_{column}"] = value
    if event_filter.after_time is not None:
        clauses.append("created_at > fromUnixTimestamp64Micro({f_after:Int64}, 'UTC')")
        params["f_after"] = us_of(event_filter.after_time)
    if event_filter.before_time is not None:
        clauses.append("created_at < fromUnixTimestamp64Micro({f_before:Int64}, 'UTC')")
        params["f_before"] = us_of(event_filter.before_time)
    if event_filter.tool_name is not None:
        clauses.append("tool_name = {f_tool:String}")
        params["f_tool"] = event_filter.tool_name
    if event_filter.failed:
        clauses.append(EVENT_NOT_SERVED)
    if event_filter.text:
        clauses.append(MATCH.format(text=EVENT_TEXT).replace("{needle:", "{f_needle:"))
        params["f_needle"] = event_filter.text.lower()
    return clauses


def where_of(clauses: Sequence[str]) -> str:
    return f"WHERE {' AND '.join(clauses)}" if clauses else ""


def json_of(text: Any) -> Any:
    if text is None or text == "":
        return None
    try:
        return json.loads(text)
    except ValueError:
        return text


def usage_of(data: Mapping[str, Any]) -> dict[str, int]:
    """The token counts a row holds, as a turn's or a call's ``usage`` (those known)."""
    return {key: int(data[key]) for key in USAGE_NAMES if data.get(key) is not None}


__all__ = [
    "CALLS", "CALL_SELECT", "DECLARED", "EVENT_NAMES", "EVENT_NOT_SERVED", "EVENT_SELECT", "EVENT_TEXT", "IN_IDS", "MANY_ROWS", "MATCH", "SERVER_TOOLS", "SESSION_ROWS",
    "TOOL_CALLS", "TOOL_ORDER", "TOOL_STATS", "TURNS", "TURN_NAMES", "TURN_SELECT", "USAGE_NAMES", "at",
    "event_filter_sql", "ids_param", "json_of", "us_of", "usage_of", "when", "where_of",
]
