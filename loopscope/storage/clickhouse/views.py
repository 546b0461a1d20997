"""The user-facing SQL views of a ClickHouse store: the names and columns the DuckDB store's views
have (:mod:`loopscope.storage.duckdb.views`, ``docs/sql-views.md``), so that ``loopscope sql`` and
people's own SQL read the same rows from either engine.

They are plain views over loopscope's derived tables (:mod:`.ddl`): nothing is stored, nothing is
computed at insert time; a read computes them. Each reads a derived table ``FINAL``, so a row the
Collector resent and the background has not merged away yet counts once; ``FINAL`` (rather than
the engine reads' ``LIMIT 1 BY``) lets a filter on the view (``WHERE session_id = ...``) reach the
table's read, where the sort key narrows it. Later views read earlier ones (:data:`VIEWS` is in
creation order).

The columns are the DuckDB views' in the same order and meaning; times are ``DateTime64(6, 'UTC')``,
a day a ``Date`` (UTC), counts ``Int64``, shares and durations ``Float64`` (milliseconds), JSON
columns JSON text. What ClickHouse has no data for is there and NULL: costs (``cost_usd``,
``price_source``: no price table in ClickHouse, so every call that used tokens counts in
``unpriced`` / ``unpriced_calls``) and a call's request ``parameters``. Every call here has ended
(the exporter writes ended spans): ``tool_calls.status`` is never ``pending`` and
``tool_stats.pending`` is 0.
"""

from __future__ import annotations

from ..results import TOOL_OUTCOMES
from .scores import SCORE_VIEWS

__all__ = ["VIEWS", "create_statements"]

_TIME = "DateTime64(6, 'UTC')"
_NO_COST = "CAST(NULL AS Nullable(Float64))"

# each tool call's start and end rows' indices in its session's timeline (numbered as
# loopscope_timeline numbers them: by at, seq, id over the session's rows)
_TOOL_INDICES = """SELECT session_id, trace_id, span_id,
        CAST(minIf(idx, type = 'tool_call_start') AS Nullable(Int64)) AS start_index,
        CAST(maxIf(idx, type = 'tool_call_end') AS Nullable(Int64)) AS end_index
    FROM (
        SELECT session_id, trace_id, span_id, type, toInt64(row_number() OVER (PARTITION BY session_id ORDER BY at, seq, id)) AS idx
        FROM loopscope_events FINAL
    )
    WHERE type IN ('tool_call_start', 'tool_call_end')
    GROUP BY session_id, trace_id, span_id"""

TOOL_CALLS = f"""SELECT c.tool AS tool, c.call_id AS call_id, c.session_id AS session_id, c.turn_id AS turn_id,
    c.agent AS agent, nullIf(c.arguments, 'null') AS arguments, nullIf(c.result, 'null') AS result,
    c.status AS status, CAST(c.outcome AS Nullable(String)) AS outcome, c.started_at AS started_at,
    CAST(c.ended_at AS Nullable({_TIME})) AS ended_at, CAST(c.duration_ms AS Nullable(Float64)) AS duration_ms,
    c.error AS error, i.start_index AS start_index, i.end_index AS end_index
FROM loopscope_tool_calls AS c FINAL
LEFT JOIN ({_TOOL_INDICES}) AS i
    ON i.session_id = c.session_id AND i.trace_id = c.trace_id AND i.span_id = c.span_id"""

# what each turn's model calls add up to: how many, and how many used tokens (all unpriced here)
_TURN_CALLS = """SELECT session_id, correlation_id, toInt64(count()) AS calls,
        toInt64(countIf(input_tokens IS NOT NULL OR output_tokens IS NOT NULL)) AS tokened
    FROM loopscope_model_calls FINAL
    WHERE correlation_id IS NOT NULL
    GROUP BY session_id, correlation_id"""

TURN_SUMMARIES = f"""SELECT t.correlation_id AS turn_id, t.session_id AS session_id, t.channel_id AS agent,
    t.parent_correlation_id AS parent_turn_id,
    t.timestamp - toIntervalMicrosecond(toInt64(round(t.latency_ms * 1000))) AS started_at, t.timestamp AS ended_at,
    CAST(t.model AS Nullable(String)) AS model, CAST(t.provider AS Nullable(String)) AS provider,
    CAST(t.loop_end_reason AS Nullable(String)) AS loop_end_reason, t.round_count AS rounds,
    t.tool_calls_count AS tool_calls, t.latency_ms AS latency_ms, t.streaming AS streaming,
    t.input_tokens AS input_tokens, t.output_tokens AS output_tokens,
    t.cache_read_input_tokens AS cache_read_input_tokens, t.cache_creation_input_tokens AS cache_creation_input_tokens,
    t.reasoning_tokens AS reasoning_tokens,
    if(t.input_tokens IS NULL AND t.output_tokens IS NULL, NULL,
       coalesce(t.input_tokens, 0) + coalesce(t.output_tokens, 0)) AS total_tokens,
    toInt64(length(JSONExtractArrayRaw(t.declared_tools))) AS declared_tool_count,
    arrayMap(d -> JSONExtractString(d, 'name'), JSONExtractArrayRaw(t.declared_tools)) AS declared_tools,
    toInt64(length(JSONExtractArrayRaw(t.segments))) AS segment_count, t.response_content AS response_content,
    t.error AS error, t.trace_id AS trace_id, t.span_id AS span_id,
    coalesce(t.model_call_count, c.calls, 0) AS model_calls, {_NO_COST} AS cost_usd,
    toInt64(multiIf(c.calls > 0, c.tokened, t.input_tokens IS NOT NULL OR t.output_tokens IS NOT NULL, 1, 0)) AS unpriced_calls
FROM loopscope_turns AS t FINAL
LEFT JOIN ({_TURN_CALLS}) AS c ON c.session_id = t.session_id AND c.correlation_id = t.correlation_id"""

_COUNTS = ", ".join(f"toInt64(countIf(outcome = '{o}')) AS {o}" for o in TOOL_OUTCOMES)
_SHARES = ", ".join(f"{o} / nullIf(finished, 0) AS {o}_share" for o in TOOL_OUTCOMES)

TOOL_STATS = f"""SELECT tool, calls, pending, finished, {", ".join(TOOL_OUTCOMES)}, {_SHARES},
    (finished - served) / nullIf(finished, 0) AS failure_share, avg_ms, q[1] AS p50_ms, q[2] AS p95_ms, q[3] AS p99_ms,
    max_ms, agents, first_seen, last_seen
FROM (
    SELECT tool, toInt64(count()) AS calls, toInt64(0) AS pending, calls AS finished, {_COUNTS}, avg(duration_ms) AS avg_ms,
        quantilesExactInclusive(0.5, 0.95, 0.99)(duration_ms) AS q, max(duration_ms) AS max_ms,
        toInt64(uniqExact(agent)) AS agents, min(started_at) AS first_seen, max(ended_at) AS last_seen
    FROM loopscope_tool_calls FINAL
    GROUP BY tool
)
ORDER BY calls DESC, tool"""

LOOP_END_REASONS = """SELECT day, loop_end_reason, turns, turns / sum(turns) OVER (PARTITION BY day) AS share, avg_latency_ms
FROM (
    SELECT toDate(timestamp, 'UTC') AS day, CAST(loop_end_reason AS Nullable(String)) AS loop_end_reason,
        toInt64(count()) AS turns, avg(latency_ms) AS avg_latency_ms
    FROM loopscope_turns FINAL
    GROUP BY day, loop_end_reason
)
ORDER BY day, turns DESC, loop_end_reason"""

# per agent, session, turn and tool: offered (declared, not an output tool) and the calls made (of
# turns that are recorded), as one UNION ALL grouped: the same answer whatever join_use_nulls says
_DECLARED_PAIRS = f"""SELECT agent, session_id, turn_id, tool, max(o) AS offered, max(o_at) AS offered_at,
        sum(n) AS pair_calls, max(n_at) AS called_at
    FROM (
        SELECT DISTINCT t.agent AS agent, t.session_id AS session_id, t.turn_id AS turn_id,
            JSONExtractString(d, 'name') AS tool, 1 AS o, CAST(t.ended_at AS Nullable({_TIME})) AS o_at,
            toInt64(0) AS n, CAST(NULL AS Nullable({_TIME})) AS n_at
        FROM (SELECT channel_id AS agent, session_id, correlation_id AS turn_id, timestamp AS ended_at, declared_tools
              FROM loopscope_turns FINAL) AS t
        ARRAY JOIN JSONExtractArrayRaw(t.declared_tools) AS d
        WHERE JSONExtractString(d, 'origin') != 'output' AND JSONExtractString(d, 'name') != ''
        UNION ALL
        SELECT t.channel_id, c.session_id, c.turn_id, c.tool, 0, NULL, toInt64(count()), max(c.ended_at)
        FROM loopscope_tool_calls AS c FINAL
        INNER JOIN (SELECT channel_id, session_id, correlation_id, declared_tools FROM loopscope_turns FINAL) AS t
            ON t.session_id = c.session_id AND t.correlation_id = c.turn_id
        WHERE NOT has(arrayMap(d -> JSONExtractString(d, 'name'),
                               arrayFilter(d -> JSONExtractString(d, 'origin') = 'output',
                                           JSONExtractArrayRaw(t.declared_tools))), c.tool)
        GROUP BY t.channel_id, c.session_id, c.turn_id, c.tool
    )
    GROUP BY agent, session_id, turn_id, tool"""

DECLARED_VS_USED = f"""SELECT agent, tool, toInt64(countIf(offered = 1)) AS turns_offered,
    toInt64(countIf(offered = 1 AND pair_calls > 0)) AS turns_used, turns_used / nullIf(turns_offered, 0) AS use_share,
    toInt64(sum(pair_calls)) AS calls, toInt64(sumIf(pair_calls, offered = 0)) AS undeclared_calls,
    max(offered_at) AS last_offered, max(called_at) AS last_called
FROM ({_DECLARED_PAIRS})
GROUP BY agent, tool
ORDER BY agent NULLS LAST, use_share NULLS LAST, turns_offered DESC, tool"""

TOKEN_USAGE = """SELECT session_id, model, provider, toInt64(count()) AS turns, sum(input_tokens) AS input_tokens,
    sum(output_tokens) AS output_tokens, sum(cache_read_input_tokens) AS cache_read_input_tokens,
    sum(cache_creation_input_tokens) AS cache_creation_input_tokens, sum(reasoning_tokens) AS reasoning_tokens,
    sum(total_tokens) AS total_tokens, min(started_at) AS first_at, max(ended_at) AS last_at,
    sum(model_calls) AS model_calls, sum(cost_usd) AS cost_usd, sum(unpriced_calls) AS unpriced_calls
FROM turn_summaries
GROUP BY session_id, model, provider
ORDER BY last_at DESC, session_id, model"""

SLOWEST_TURNS = """SELECT toInt64(row_number() OVER (ORDER BY latency_ms DESC NULLS LAST, ended_at DESC, turn_id)) AS rank,
    turn_id, session_id, agent, model, provider, loop_end_reason, latency_ms, rounds, tool_calls, total_tokens,
    started_at, ended_at, error
FROM turn_summaries
ORDER BY rank"""

MODEL_CALL_SUMMARIES = f"""SELECT session_id, correlation_id AS turn_id,
    coalesce(position, toInt64(row_number() OVER (PARTITION BY session_id, correlation_id ORDER BY started_at, span_id)))
        AS position,
    agent, CAST(provider AS Nullable(String)) AS provider, CAST(framework AS Nullable(String)) AS framework,
    CAST(coalesce(response_model, request_model) AS Nullable(String)) AS model,
    CAST(request_model AS Nullable(String)) AS request_model, CAST(response_model AS Nullable(String)) AS response_model,
    response_id, finish_reasons, CAST(outcome AS Nullable(String)) AS outcome, streaming, started_at, ended_at,
    duration_ms, time_to_first_chunk_ms, input_tokens, output_tokens, cache_read_input_tokens,
    cache_creation_input_tokens, reasoning_tokens,
    if(input_tokens IS NULL AND output_tokens IS NULL, NULL, coalesce(input_tokens, 0) + coalesce(output_tokens, 0))
        AS total_tokens,
    {_NO_COST} AS cost_usd, CAST(NULL AS Nullable(String)) AS price_source,
    CAST(input_tokens IS NOT NULL OR output_tokens IS NOT NULL AS Bool) AS unpriced, error_type, error, refusal, provider_usage,
    CAST(NULL AS Nullable(String)) AS parameters, input_messages, output_messages, trace_id, span_id
FROM loopscope_model_calls FINAL"""

MODEL_USAGE = """SELECT provider, model, toInt64(count()) AS calls,
    toInt64(countIf(outcome = 'error' OR error_type IS NOT NULL)) AS failed, sum(input_tokens) AS input_tokens,
    sum(output_tokens) AS output_tokens, sum(cache_read_input_tokens) AS cache_read_input_tokens,
    sum(cache_creation_input_tokens) AS cache_creation_input_tokens, sum(reasoning_tokens) AS reasoning_tokens,
    sum(cost_usd) AS cost_usd, toInt64(countIf(unpriced)) AS unpriced_calls, avg(duration_ms) AS avg_ms,
    quantileExactInclusive(0.95)(duration_ms) AS p95_ms, avg(time_to_first_chunk_ms) AS avg_ttfc_ms,
    min(started_at) AS first_at, max(ended_at) AS last_at
FROM model_call_summaries
GROUP BY provider, model
ORDER BY calls DESC, provider, model"""

SESSION_COSTS = """SELECT session_id, toInt64(count()) AS turns, sum(model_calls) AS model_calls,
    sum(input_tokens) AS input_tokens, sum(output_tokens) AS output_tokens, sum(cost_usd) AS cost_usd,
    sum(unpriced_calls) AS unpriced_calls, min(started_at) AS first_at, max(ended_at) AS last_at
FROM turn_summaries
GROUP BY session_id
ORDER BY last_at DESC, session_id"""

# the whole store: its calls (all unpriced where they used tokens), and the turns without call rows,
# each counted as one unpriced call where it used tokens (as the DuckDB view prices such a turn alone)
COST_TOTALS = f"""SELECT
    assumeNotNull((SELECT toInt64(count()) FROM loopscope_model_calls FINAL)) AS model_calls, {_NO_COST} AS cost_usd,
    assumeNotNull((SELECT toInt64(countIf(input_tokens IS NOT NULL OR output_tokens IS NOT NULL))
                   FROM loopscope_model_calls FINAL))
        + toInt64(countIf(input_tokens IS NOT NULL OR output_tokens IS NOT NULL)) AS unpriced_calls,
    toInt64(count()) AS turns_priced_alone
FROM (SELECT session_id, correlation_id, input_tokens, output_tokens FROM loopscope_turns FINAL) AS t
WHERE (t.session_id, t.correlation_id) NOT IN (
    SELECT session_id, assumeNotNull(correlation_id) FROM loopscope_model_calls FINAL WHERE correlation_id IS NOT NULL)"""

VIEWS: dict[str, str] = {
    "tool_calls": TOOL_CALLS,
    "turn_summaries": TURN_SUMMARIES,
    "tool_stats": TOOL_STATS,
    "loop_end_reasons": LOOP_END_REASONS,
    "declared_vs_used": DECLARED_VS_USED,
    "token_usage": TOKEN_USAGE,
    "slowest_turns": SLOWEST_TURNS,
    "model_call_summaries": MODEL_CALL_SUMMARIES,
    "model_usage": MODEL_USAGE,
    "session_costs": SESSION_COSTS,
    "cost_totals": COST_TOTALS,
}
"""Every view, by name, as the SELECT that defines it; in creation order (later ones read earlier ones)."""
VIEWS.update(SCORE_VIEWS)  # score_targets, scores_over_time (.scores), last as in the DuckDB store


def create_statements(database: str) -> list[str]:
    """``CREATE OR REPLACE VIEW`` for every view in ``database`` (a quoted identifier), in order.

    ``OR REPLACE``, unlike the tables' ``IF NOT EXISTS``: a view holds no data, so each ``prepare``
    of a newer loopscope brings an existing database's views to its definitions, at no cost."""
    return [f"CREATE OR REPLACE VIEW {database}.`{name}` AS {sql}" for name, sql in VIEWS.items()]
