"""The SQL views every loopscope store holds: tool calls, turns, tool statistics and more.

The store's tables keep what the writer wrote (``events``: the activity log with a JSON
``content`` per row, and a tool row's name, call id, status, outcome and duration as
columns too, :data:`TOOL_COLUMNS`; ``turns``: one summary per turn; ``sessions``). The
tool views read those columns, and ``content`` for rows that lack them (written by a
writer that does not fill them, or in a file from before they existed). These views answer
the usual questions over them in plain SQL, so they work the same from the ``duckdb``
command line, pandas, polars or any DuckDB client that opens the file: only core SQL and
DuckDB's built-in JSON functions, nothing of loopscope's at query time.

This module is the one source of their definitions: the schema migrations
(:mod:`loopscope.storage.duckdb.schema`) create them from :data:`VIEWS`, in this order (later
views read earlier ones). A change to a view needs a new migration that calls
:func:`create_statements` again, so that existing files get it too.

Times are ``TIMESTAMPTZ``; days are UTC days. Durations and latencies are milliseconds.

``tool_calls`` -- one row per tool call: its start and end rows grouped by session, turn
(correlation id) and call id (a call the model asked for without an id, by its span). A call whose end is not written yet has ``status =
'pending'`` and no outcome. Columns: ``tool, call_id, session_id, turn_id, agent,
arguments, result, status, outcome, started_at, ended_at, duration_ms, error,
start_index, end_index``. ``arguments`` and ``result`` are JSON; ``status`` is
``pending``, ``completed`` or ``failed``; ``outcome`` is ``served``, ``failed``,
``refused``, ``blocked``, ``unserved`` or ``cancelled``; ``started_at`` is the start
row's time (for an end whose start was not stored: its end time less its duration).
Filter it by ``session_id`` or ``turn_id`` and only those rows are read.

``turn_summaries`` -- the ``turns`` table flattened, one row per turn: ``turn_id,
session_id, agent, parent_turn_id, started_at, ended_at, model, provider,
loop_end_reason, rounds, tool_calls, latency_ms, streaming, input_tokens,
output_tokens, cache_read_input_tokens, cache_creation_input_tokens, reasoning_tokens,
total_tokens, declared_tool_count, declared_tools`` (the names, a ``VARCHAR[]``),
``segment_count, response_content, error, trace_id, span_id, model_calls, cost_usd,
unpriced_calls``. ``agent`` is the turn's ``channel_id``; ``total_tokens`` is input +
output. ``model_calls`` is the turn's own count (``loopscope.turn.model_call_count``), else
its rows in ``model_calls``; ``cost_usd`` (USD) the sum of its calls' costs, or for a turn
without call rows (an older writer, a foreign turn) its own price from its usage and
model; ``unpriced_calls`` how many of its calls used tokens and have no price.

``tool_stats`` -- per tool, most called first: ``tool, calls, pending, finished,
served, failed, refused, blocked, unserved, cancelled`` (counts), ``served_share,
failed_share, refused_share, blocked_share, unserved_share, cancelled_share`` (of the
finished calls), ``failure_share`` (finished calls not served), ``avg_ms, p50_ms,
p95_ms, p99_ms, max_ms`` (durations of finished calls; continuous quantiles, as
``numpy.percentile`` computes them), ``agents`` (how many agents called it),
``first_seen, last_seen``. A call counts once, by its start row (or its end row where
the persistence policy left start rows out), so ``pending = calls - finished``.

``loop_end_reasons`` -- per UTC day and loop end reason: ``day, loop_end_reason, turns,
share`` (of that day's turns), ``avg_latency_ms``.

``declared_vs_used`` -- per agent and tool, over the agent's recorded turns: ``agent,
tool, turns_offered`` (turns that declared the tool), ``turns_used`` (of those, turns
that called it), ``use_share`` (turns_used / turns_offered), ``calls`` (calls of it in
the agent's turns, declared or not), ``undeclared_calls`` (calls in turns that did not
declare it), ``last_offered, last_called``. Least used first: a tool offered in many
turns and never called only makes every prompt longer. A turn's output tools (declared
with origin ``output``, such as pydantic-ai's ``final_result``: calling one is the
model's answer) are left out, offered and called.

``token_usage`` -- per session and model: ``session_id, model, provider, turns,
input_tokens, output_tokens, cache_read_input_tokens, cache_creation_input_tokens,
reasoning_tokens, total_tokens, first_at, last_at, model_calls, cost_usd,
unpriced_calls``.

``model_call_summaries`` -- one row per model call (the ``model_calls`` table, one row per
``chat`` span): ``session_id, turn_id, position`` (1-based in the turn; numbered by start
time where the recording did not say), ``agent, provider, framework, model`` (the
response's, else the request's), ``request_model, response_model, response_id,
finish_reasons`` (JSON list, one per choice), ``outcome`` (completed, truncated, refusal,
content_filter, error, cancelled), ``streaming, started_at, ended_at, duration_ms,
time_to_first_chunk_ms``, the usage (input includes cached tokens) and ``total_tokens``,
``cost_usd, price_source`` (``genai-prices`` or ``override``), ``unpriced`` (tokens used,
no price known), ``error_type, error, refusal, provider_usage, parameters`` (JSON),
``input_messages, output_messages`` (JSON, content), ``trace_id, span_id``.

``model_usage`` -- per provider and model: ``calls, failed``, the token sums,
``cost_usd, unpriced_calls, avg_ms, p95_ms, avg_ttfc_ms, first_at, last_at``.

``session_costs`` -- per session: ``turns, model_calls, input_tokens, output_tokens,
cost_usd, unpriced_calls, first_at, last_at``.

``cost_totals`` -- one row: ``model_calls, cost_usd, unpriced_calls`` for the whole store
(turns without call rows count by their own price), ``turns_priced_alone``.

``slowest_turns`` -- every turn ranked by latency, slowest first: ``rank, turn_id,
session_id, agent, model, provider, loop_end_reason, latency_ms, rounds, tool_calls,
total_tokens, started_at, ended_at, error``. What the turn's tools took:
``SELECT sum(duration_ms) FROM tool_calls WHERE turn_id = ...``.
"""

from __future__ import annotations

from ..results import TOOL_OUTCOMES as OUTCOMES  # the outcomes the views count, in their columns' order

TOOL_TOTALS, TOOL_DURATIONS = "loopscope_tool_totals", "loopscope_tool_durations"
"""The tables of per-tool totals kept by the writers (``m010_tool_totals``, see
:mod:`loopscope.storage.duckdb.tool_totals`) that ``tool_stats`` reads."""
SORTED_DURATIONS = "loopscope_tool_durations_sorted"
"""The durations folded out of :data:`TOOL_DURATIONS` in :func:`duration_key` order
(``m013_sorted_durations``, see :mod:`loopscope.storage.duckdb.tool_totals`)."""


def duration_key(tool: str, bucket: str) -> str:
    """A BIGINT for a tool's duration bucket (``tool`` and ``bucket`` SQL expressions), in
    whose order :data:`SORTED_DURATIONS` is kept: a join on this one column lets DuckDB
    filter the scan by the few keys ``tool_stats`` wants (a join on tool and bucket
    filters nothing), and the sorted column is a few runs to scan. Two tools may share a
    key (44 bits of the name's MD5, stable across DuckDB versions as ``hash()`` is not):
    the join compares tool and bucket too."""
    return f"(CAST(md5_number_lower({tool}) >> 20 AS BIGINT) * 65536 + ({bucket} + 32768))"

TOTALS_COVER = "(SELECT count(*) FROM events) = (SELECT coalesce(sum(last_index), 0) FROM sessions)"
"""Whether every row of ``events`` was written by a writer that keeps the tool totals: those
writers number each session's rows 1, 2, ... and keep the last number in ``sessions``, so
the counts agree (DuckDB counts a table's rows from its metadata). Rows inserted
otherwise (an importer's plain ``INSERT``), or deleted, make ``tool_stats`` read ``events``."""

TOOL_COLUMNS = ("tool_name", "tool_call_id", "tool_status", "tool_outcome", "tool_duration_ms")
"""The tool fields the writer stores as columns of ``events`` (besides the ``content``
JSON): reading them is far cheaper than parsing every tool row's JSON. They are NULL on
other rows, and on tool rows of writers that do not fill them (an older loopscope that
only reads, an importer); the views then read the same fields from ``content``."""

_TOOL_KEYS = "session_id, correlation_id AS turn_id, type, idx, created_at, source_channel_id AS agent"
# DuckDB (2.0) pushes an IN list into the scan only as an optional filter (for zone maps)
# and filters afterwards, so every row's other columns are fetched first, ``content``
# included (0.3 s per 10 M rows even when no row is kept). A prefix is a range filter it
# applies in the scan: rows of other types never have their columns fetched.
_TOOL_TYPES = "starts_with(type, 'tool_call_') AND type IN ('tool_call_start', 'tool_call_end')"


def tool_rows(tool_columns: bool, content: bool = False, unless: str = "") -> str:
    """The tool start and end rows with their fields: ``session_id, turn_id, type, idx,
    created_at, agent, [content, span_id,] tool, call_id, status, outcome, duration_ms``.

    With ``tool_columns`` (a file whose ``events`` has them) the fields come from the
    columns, and from the ``content`` JSON only for rows whose ``tool_name`` is NULL: a
    UNION ALL, so that a store whose rows all have the columns never reads ``content``
    here (the second branch's filter skips every row before ``content`` is fetched).
    ``unless``: a condition without columns under which no row is read: the scans stop
    at their first tool row. (A condition on the rows themselves would keep a scan going
    through the whole table when no row passes it, as the second branch's does: so each
    branch's scan is filtered by type alone, joined to the condition, which DuckDB
    evaluates first and which stops the scan when it leaves no row, and the branch's own
    filter is applied after the join, in a form it cannot push below it.)
    """
    extra = ", content, span_id" if content else ""

    def where(own: str) -> str:
        if not unless:
            return f"FROM events\n        WHERE {_TOOL_TYPES}{f' AND {own}' if own else ''}"
        kept = f" AND CASE WHEN g.live THEN {own} END" if own else ""
        return f"FROM events, (SELECT NOT ({unless}) AS live) g\n        WHERE {_TOOL_TYPES} AND g.live{kept}"

    parsed = f"""
    SELECT session_id, turn_id, type, idx, created_at, agent{extra},
        f[1] AS tool, f[2] AS call_id, f[3] AS status, f[4] AS outcome, TRY_CAST(f[5] AS DOUBLE) AS duration_ms
    FROM (
        SELECT {_TOOL_KEYS}, content{", span_id" if content else ""},
            json_extract_string(content, ['$.tool_name', '$.tool_id', '$.status', '$.outcome', '$.duration_ms']) AS f
        {where("tool_name IS NULL" if tool_columns else "")}
    )"""
    if not tool_columns:
        return parsed
    return f"""
    SELECT {_TOOL_KEYS}{extra},
        tool_name AS tool, tool_call_id AS call_id, tool_status AS status, tool_outcome AS outcome,
        tool_duration_ms AS duration_ms
    {where("tool_name IS NOT NULL")}
    UNION ALL{parsed}"""


def _json_field(path: str) -> str:
    """A JSON member of ``content``; SQL NULL where it is JSON null or missing."""
    return f"CAST(nullif(json_extract(content, '{path}')::VARCHAR, 'null') AS JSON)"


# One group per call. Grouping (rather than joining starts to ends) lets a filter on
# session_id or turn_id reach the events scan, so one session's calls are read alone. Calls
# the model asked for without an id (stored with an empty one) are told apart by their
# execute_tool span, whose start and end rows they are.
def _tool_calls(tool_columns: bool) -> str:
    return f"""
SELECT
    coalesce(any_value(tool) FILTER (WHERE type = 'tool_call_end'), any_value(tool)) AS tool,
    call_id,
    session_id,
    turn_id,
    any_value(agent) AS agent,
    coalesce(
        any_value({_json_field('$.arguments')}) FILTER (WHERE type = 'tool_call_start'),
        any_value({_json_field('$.arguments')})
    ) AS arguments,
    any_value({_json_field('$.result')}) FILTER (WHERE type = 'tool_call_end') AS result,
    coalesce(any_value(status) FILTER (WHERE type = 'tool_call_end'), 'pending') AS status,
    any_value(outcome) FILTER (WHERE type = 'tool_call_end') AS outcome,
    coalesce(
        min(created_at) FILTER (WHERE type = 'tool_call_start'),
        min(created_at - to_microseconds(CAST(round(coalesce(duration_ms, 0) * 1000) AS BIGINT)))
    ) AS started_at,
    max(created_at) FILTER (WHERE type = 'tool_call_end') AS ended_at,
    any_value(duration_ms) FILTER (WHERE type = 'tool_call_end') AS duration_ms,
    any_value(json_extract_string(content, '$.error')) FILTER (WHERE type = 'tool_call_end') AS error,
    min(idx) FILTER (WHERE type = 'tool_call_start') AS start_index,
    max(idx) FILTER (WHERE type = 'tool_call_end') AS end_index
FROM ({tool_rows(tool_columns, content=True)})
GROUP BY session_id, turn_id, call_id, CASE WHEN call_id = '' THEN span_id END
"""


# What each turn's model calls add up to (the calls of a turn share its session and correlation id)
_TURN_CALLS = """
    SELECT session_id AS call_session, correlation_id AS call_turn, count(*) AS calls, sum(cost_usd) AS calls_cost,
        count(*) FILTER (WHERE cost_usd IS NULL AND (input_tokens IS NOT NULL OR output_tokens IS NOT NULL)) AS unpriced
    FROM model_calls
    GROUP BY ALL
"""

# a turn's cost: the sum of its calls' costs; a turn without call rows (an older writer, a
# foreign turn) is priced from its own usage and model
_TURN_COST_COLUMNS = """,
    coalesce(t.model_call_count, c.calls, 0) AS model_calls,
    CASE WHEN c.calls > 0 THEN c.calls_cost ELSE t.cost_usd END AS cost_usd,
    CASE WHEN c.calls > 0 THEN c.unpriced
         WHEN t.cost_usd IS NULL AND (t.input_tokens IS NOT NULL OR t.output_tokens IS NOT NULL) THEN 1
         ELSE 0 END AS unpriced_calls"""

_TURN_SUMMARIES = """
SELECT
    correlation_id AS turn_id,
    session_id,
    channel_id AS agent,
    parent_correlation_id AS parent_turn_id,
    "timestamp" - to_microseconds(CAST(round(coalesce(latency_ms, 0) * 1000) AS BIGINT)) AS started_at,
    "timestamp" AS ended_at,
    model,
    provider,
    loop_end_reason,
    round_count AS rounds,
    tool_calls_count AS tool_calls,
    latency_ms,
    streaming,
    input_tokens,
    output_tokens,
    TRY_CAST(u[1] AS BIGINT) AS cache_read_input_tokens,
    TRY_CAST(u[2] AS BIGINT) AS cache_creation_input_tokens,
    TRY_CAST(u[3] AS BIGINT) AS reasoning_tokens,
    CASE WHEN input_tokens IS NULL AND output_tokens IS NULL THEN NULL
         ELSE coalesce(input_tokens, 0) + coalesce(output_tokens, 0) END AS total_tokens,
    coalesce(json_array_length(declared_tools), 0) AS declared_tool_count,
    coalesce(json_extract_string(declared_tools, '$[*].name'), []) AS declared_tools,
    coalesce(json_array_length(segments), 0) AS segment_count,
    response_content,
    error,
    t.trace_id,
    t.span_id{costs}
FROM (
    SELECT *, json_extract_string(usage, ['$.cache_read_input_tokens', '$.cache_creation_input_tokens', '$.reasoning_tokens']) AS u
    FROM turns
) t{join}
"""


def _turn_summaries(model_calls: bool) -> str:
    if not model_calls:
        return _TURN_SUMMARIES.format(costs="", join="")
    join = f"\nLEFT JOIN ({_TURN_CALLS}) c ON c.call_session = t.session_id AND c.call_turn = t.correlation_id"
    return _TURN_SUMMARIES.format(costs=_TURN_COST_COLUMNS, join=join)


TURN_SUMMARIES = _turn_summaries(False)

MODEL_CALL_SUMMARIES = """
SELECT
    session_id,
    correlation_id AS turn_id,
    coalesce(position, CAST(row_number() OVER (
        PARTITION BY session_id, correlation_id ORDER BY started_at, span_id) AS INTEGER)) AS position,
    agent,
    provider,
    framework,
    coalesce(response_model, request_model) AS model,
    request_model,
    response_model,
    response_id,
    finish_reasons,
    outcome,
    streaming,
    started_at,
    ended_at,
    duration_ms,
    time_to_first_chunk_ms,
    input_tokens,
    output_tokens,
    cache_read_input_tokens,
    cache_creation_input_tokens,
    reasoning_tokens,
    CASE WHEN input_tokens IS NULL AND output_tokens IS NULL THEN NULL
         ELSE coalesce(input_tokens, 0) + coalesce(output_tokens, 0) END AS total_tokens,
    cost_usd,
    price_source,
    cost_usd IS NULL AND (input_tokens IS NOT NULL OR output_tokens IS NOT NULL) AS unpriced,
    error_type,
    error,
    refusal,
    provider_usage,
    parameters,
    input_messages,
    output_messages,
    trace_id,
    span_id
FROM model_calls
"""

MODEL_USAGE = """
SELECT
    provider,
    model,
    count(*) AS calls,
    count(*) FILTER (WHERE outcome = 'error' OR error_type IS NOT NULL) AS failed,
    sum(input_tokens) AS input_tokens,
    sum(output_tokens) AS output_tokens,
    sum(cache_read_input_tokens) AS cache_read_input_tokens,
    sum(cache_creation_input_tokens) AS cache_creation_input_tokens,
    sum(reasoning_tokens) AS reasoning_tokens,
    sum(cost_usd) AS cost_usd,
    count(*) FILTER (WHERE unpriced) AS unpriced_calls,
    avg(duration_ms) AS avg_ms,
    quantile_cont(duration_ms, 0.95) AS p95_ms,
    avg(time_to_first_chunk_ms) AS avg_ttfc_ms,
    min(started_at) AS first_at,
    max(ended_at) AS last_at
FROM model_call_summaries
GROUP BY ALL
ORDER BY calls DESC, provider, model
"""

_OUTCOME_COUNTS = ",\n        ".join(f"count(*) FILTER (WHERE type = 'tool_call_end' AND outcome = '{o}') AS {o}" for o in OUTCOMES)
_OUTCOME_SHARES = ",\n    ".join(f"{o} / nullif(finished, 0) AS {o}_share" for o in OUTCOMES)

# One pass over the tool rows, no per-call grouping: a call is counted by its start row,
# or by its end row where no start rows were stored (a persistence policy can leave them
# out). In a store that keeps both, calls - finished is exactly the pending calls.
def _tool_stats(tool_columns: bool, unless: str = "") -> str:
    return f"""
SELECT
    tool,
    greatest(started, finished) AS calls,
    greatest(started, finished) - finished AS pending,
    finished,
    {", ".join(OUTCOMES)},
    {_OUTCOME_SHARES},
    (finished - served) / nullif(finished, 0) AS failure_share,
    avg_ms, q[1] AS p50_ms, q[2] AS p95_ms, q[3] AS p99_ms, max_ms,
    agents, first_seen, last_seen
FROM (
    SELECT
        tool,
        count(*) FILTER (WHERE type = 'tool_call_start') AS started,
        count(*) FILTER (WHERE type = 'tool_call_end') AS finished,
        {_OUTCOME_COUNTS},
        avg(duration_ms) FILTER (WHERE type = 'tool_call_end') AS avg_ms,
        quantile_cont(duration_ms, [0.5, 0.95, 0.99]) FILTER (WHERE type = 'tool_call_end') AS q,
        max(duration_ms) FILTER (WHERE type = 'tool_call_end') AS max_ms,
        count(DISTINCT agent) AS agents,
        min(created_at) AS first_seen,
        max(created_at) AS last_seen
    FROM ({tool_rows(tool_columns, unless=unless)})
    GROUP BY tool
)
ORDER BY calls DESC, tool
"""

def _tool_stats_from_totals(live: str, sorted_durations: bool = True) -> str:
    """``tool_stats`` from the tool totals (:mod:`loopscope.storage.duckdb.tool_totals`) while they
    account for every row of ``events`` (:data:`TOTALS_COVER`), else ``live`` (the SELECT
    that computes it from ``events``, the same columns, reading nothing while they do).
    ``sorted_durations=False``: for a file without :data:`SORTED_DURATIONS` (before
    ``m013_sorted_durations``), every duration is in :data:`TOOL_DURATIONS`."""
    # joined on the key alone: on one column DuckDB filters the scan by the build side's few
    # keys (a join on four scans every row: 0.69x the view's CPU at 10M events); the exact
    # check is kept out of the join's conditions by IS TRUE (the columns are NOT NULL)
    from_sorted = f"""SELECT k.tool, k.has_tool, k.bucket, d.duration_ms
    FROM {SORTED_DURATIONS} d JOIN keys k ON k.key = d.key
    WHERE (d.tool = k.tool AND d.has_tool = k.has_tool AND d.bucket = k.bucket) IS TRUE
    UNION ALL
    """ if sorted_durations else ""
    quantiles = "(VALUES (1, 0.5::DOUBLE), (2, 0.95::DOUBLE), (3, 0.99::DOUBLE)) qs(i, q)"
    return f"""
WITH covered AS MATERIALIZED (SELECT {TOTALS_COVER} AS yes),
totals AS MATERIALIZED (
    SELECT t.* FROM {TOOL_TOTALS} t, covered WHERE covered.yes
),
per_tool AS (
    SELECT tool, has_tool,
        CAST(sum(started) AS BIGINT) AS started, CAST(sum(finished) AS BIGINT) AS finished,
        {", ".join(f"CAST(sum({o}) AS BIGINT) AS {o}" for o in OUTCOMES)},
        CAST(sum(durations) AS BIGINT) AS durations, sum(duration_sum) AS duration_sum, max(duration_max) AS max_ms,
        count(DISTINCT agent) FILTER (WHERE has_agent) AS agents,
        min(first_seen) AS first_seen, max(last_seen) AS last_seen
    FROM totals
    GROUP BY tool, has_tool
),
buckets AS (
    SELECT tool, has_tool, bucket, n,
        CAST(sum(n) OVER (PARTITION BY tool, has_tool ORDER BY bucket ROWS UNBOUNDED PRECEDING) - n AS BIGINT) AS below
    FROM (SELECT tool, has_tool, bucket, CAST(sum(durations) AS BIGINT) AS n FROM totals WHERE durations > 0 GROUP BY ALL)
),
-- the 0-based ranks quantile_cont interpolates between: floor and ceil of (n - 1) * q
ranks AS (
    SELECT p.tool, p.has_tool, qs.i, (p.durations - 1) * qs.q AS rn
    FROM per_tool p, {quantiles}
    WHERE p.durations > 0
),
wanted AS (
    SELECT r.tool, r.has_tool, r.i, r.rn, w.hi, w.rank, b.bucket, w.rank - b.below AS offset
    FROM ranks r,
        LATERAL (SELECT false AS hi, CAST(floor(r.rn) AS BIGINT) AS rank UNION ALL SELECT true, CAST(ceil(r.rn) AS BIGINT)) w,
        buckets b
    WHERE b.tool = r.tool AND b.has_tool = r.has_tool AND w.rank >= b.below AND w.rank < b.below + b.n
),
keys AS (
    SELECT DISTINCT tool, has_tool, bucket, {duration_key('tool', 'bucket')} AS key FROM wanted
),
-- the wanted buckets' durations: from the sorted ones by key (DuckDB filters the scan by the
-- few keys: the join's build side is small), and from those appended since they were sorted.
-- Materialized: else DuckDB may group the whole table before joining it
fetched AS MATERIALIZED (
    {from_sorted}SELECT d.tool, d.has_tool, d.bucket, d.duration_ms
    FROM {TOOL_DURATIONS} d
    SEMI JOIN keys k ON k.tool = d.tool AND k.has_tool = d.has_tool AND k.bucket = d.bucket
),
sorted AS (
    SELECT tool, has_tool, bucket, list_sort(list(duration_ms)) AS values
    FROM fetched
    GROUP BY ALL
),
picked AS (
    SELECT w.tool, w.has_tool, w.i,
        any_value(w.rn) AS rn,
        any_value(s.values[w.offset + 1]) FILTER (WHERE NOT w.hi) AS lo,
        any_value(s.values[w.offset + 1]) FILTER (WHERE w.hi) AS hi
    FROM wanted w JOIN sorted s ON s.tool = w.tool AND s.has_tool = w.has_tool AND s.bucket = w.bucket
    GROUP BY ALL
),
-- as quantile_cont: the value at the rank, or between two ranks lo * (1 - d) + hi * d, d the
-- fraction of the rank (DuckDB's own formula; its build may fuse a multiply-add, so the last bit can differ)
quantiles AS (
    SELECT tool, has_tool,
        list(CASE WHEN floor(rn) = ceil(rn) THEN lo ELSE lo * (1.0 - (rn - floor(rn))) + hi * (rn - floor(rn)) END ORDER BY i) AS q
    FROM picked
    GROUP BY ALL
)
SELECT * FROM (
SELECT
    CASE WHEN p.has_tool THEN p.tool END AS tool,
    greatest(started, finished) AS calls,
    greatest(started, finished) - finished AS pending,
    finished,
    {", ".join(OUTCOMES)},
    {", ".join(f"{o} / nullif(finished, 0) AS {o}_share" for o in OUTCOMES)},
    (finished - served) / nullif(finished, 0) AS failure_share,
    duration_sum / nullif(durations, 0) AS avg_ms, q.q[1] AS p50_ms, q.q[2] AS p95_ms, q.q[3] AS p99_ms, max_ms,
    agents, first_seen, last_seen
FROM per_tool p LEFT JOIN quantiles q ON q.tool = p.tool AND q.has_tool = p.has_tool
UNION ALL
{live}
)
ORDER BY calls DESC, tool
"""


LOOP_END_REASONS = """
SELECT
    day,
    loop_end_reason,
    turns,
    turns / sum(turns) OVER (PARTITION BY day) AS share,
    avg_latency_ms
FROM (
    SELECT
        CAST(timezone('UTC', "timestamp") AS DATE) AS day,
        loop_end_reason,
        count(*) AS turns,
        avg(latency_ms) AS avg_latency_ms
    FROM turns
    GROUP BY ALL
)
ORDER BY day, turns DESC, loop_end_reason
"""

# Calls are counted per turn as tool_stats counts them (start rows, or end rows where no
# start rows were stored), without grouping every call first.
def _declared_vs_used(tool_columns: bool) -> str:
    # output tools: the model's way to answer, not a tool offered for use (the text
    # prefilter spares parsing the declared tools of every turn that has none)
    outputs = """
outputs AS (
    SELECT session_id, turn_id, json_extract_string(d, '$.name') AS tool
    FROM (
        SELECT session_id, correlation_id AS turn_id, unnest(CAST(declared_tools AS JSON[])) AS d
        FROM turns
        WHERE contains(CAST(declared_tools AS VARCHAR), '"output"')
    )
    WHERE json_extract_string(d, '$.origin') = 'output'
),"""
    not_output = """
    ANTI JOIN outputs x ON x.session_id IS NOT DISTINCT FROM {0}.session_id AND x.turn_id = {0}.turn_id AND x.tool = {0}.tool"""
    return f"""
WITH{outputs}
offered AS (
    SELECT DISTINCT s.agent, s.session_id, s.turn_id, s.tool, s.ended_at
    FROM (SELECT agent, session_id, turn_id, unnest(declared_tools) AS tool, ended_at FROM turn_summaries) s{not_output.format("s")}
),
called AS (
    SELECT r.session_id, r.turn_id, r.tool,
        greatest(count(*) FILTER (WHERE r.type = 'tool_call_start'), count(*) FILTER (WHERE r.type = 'tool_call_end')) AS calls,
        max(r.created_at) AS last_called
    FROM ({tool_rows(tool_columns)}) r{not_output.format("r")}
    GROUP BY ALL
),
used AS (
    SELECT t.agent, c.session_id, c.turn_id, c.tool, c.calls, c.last_called
    FROM called c
    JOIN turn_summaries t ON t.session_id IS NOT DISTINCT FROM c.session_id AND t.turn_id = c.turn_id
)
SELECT
    coalesce(o.agent, u.agent) AS agent,
    coalesce(o.tool, u.tool) AS tool,
    count(o.turn_id) AS turns_offered,
    count(o.turn_id) FILTER (WHERE u.calls IS NOT NULL) AS turns_used,
    count(o.turn_id) FILTER (WHERE u.calls IS NOT NULL) / nullif(count(o.turn_id), 0) AS use_share,
    coalesce(sum(u.calls), 0) AS calls,
    coalesce(sum(u.calls) FILTER (WHERE o.turn_id IS NULL), 0) AS undeclared_calls,
    max(o.ended_at) AS last_offered,
    max(u.last_called) AS last_called
FROM offered o
FULL OUTER JOIN used u
    ON o.agent IS NOT DISTINCT FROM u.agent AND o.session_id IS NOT DISTINCT FROM u.session_id
    AND o.turn_id = u.turn_id AND o.tool = u.tool
GROUP BY ALL
ORDER BY agent NULLS LAST, use_share NULLS LAST, turns_offered DESC, tool
"""

_TOKEN_USAGE = """
SELECT
    session_id,
    model,
    provider,
    count(*) AS turns,
    sum(input_tokens) AS input_tokens,
    sum(output_tokens) AS output_tokens,
    sum(cache_read_input_tokens) AS cache_read_input_tokens,
    sum(cache_creation_input_tokens) AS cache_creation_input_tokens,
    sum(reasoning_tokens) AS reasoning_tokens,
    sum(total_tokens) AS total_tokens,
    min(started_at) AS first_at,
    max(ended_at) AS last_at{costs}
FROM turn_summaries
GROUP BY session_id, model, provider
ORDER BY last_at DESC, session_id, model
"""
TOKEN_USAGE = _TOKEN_USAGE.format(costs="")

COST_TOTALS = """
WITH c AS (
    SELECT session_id, correlation_id, count(*) AS calls, sum(cost_usd) AS cost,
        count(*) FILTER (WHERE cost_usd IS NULL AND (input_tokens IS NOT NULL OR output_tokens IS NOT NULL)) AS unpriced
    FROM model_calls
    GROUP BY ALL
)
SELECT
    (SELECT count(*) FROM model_calls) AS model_calls,
    sum(cost) AS cost_usd,
    coalesce(sum(unpriced), 0) AS unpriced_calls,
    count(*) FILTER (WHERE from_turn) AS turns_priced_alone
FROM (
    SELECT cost, unpriced, false AS from_turn FROM c
    UNION ALL
    SELECT t.cost_usd,
        CASE WHEN t.cost_usd IS NULL AND (t.input_tokens IS NOT NULL OR t.output_tokens IS NOT NULL) THEN 1 ELSE 0 END,
        true
    FROM turns t ANTI JOIN c ON c.session_id = t.session_id AND c.correlation_id = t.correlation_id
)
"""

SESSION_COSTS = """
SELECT
    session_id,
    count(*) AS turns,
    sum(model_calls) AS model_calls,
    sum(input_tokens) AS input_tokens,
    sum(output_tokens) AS output_tokens,
    sum(cost_usd) AS cost_usd,
    sum(unpriced_calls) AS unpriced_calls,
    min(started_at) AS first_at,
    max(ended_at) AS last_at
FROM turn_summaries
GROUP BY session_id
ORDER BY last_at DESC, session_id
"""

SLOWEST_TURNS = """
SELECT
    row_number() OVER (ORDER BY latency_ms DESC NULLS LAST, ended_at DESC, turn_id) AS rank,
    turn_id, session_id, agent, model, provider, loop_end_reason, latency_ms,
    rounds, tool_calls, total_tokens, started_at, ended_at, error
FROM turn_summaries
ORDER BY rank
"""

def views(
    tool_columns: bool = True, model_calls: bool = True, tool_totals: bool = True, sorted_durations: bool = True
) -> dict[str, str]:
    """Every view, by name, as the SELECT that defines it; in creation order.

    ``tool_columns=False`` gives the definitions for a file whose ``events`` table lacks
    the :data:`TOOL_COLUMNS` (schema before they were added): the tool fields are then
    read from the ``content`` JSON alone. Both give the same rows. ``model_calls=False``
    gives the views as they were before ``m009_model_calls`` (no ``model_calls`` table,
    no costs): what the migrations before it create. ``tool_totals=False`` gives
    ``tool_stats`` computed from ``events`` alone, for a file without the tables of
    ``m010_tool_totals`` (the migrations before it, an older file read as it is);
    ``sorted_durations=False`` its quantiles from :data:`TOOL_DURATIONS` alone, for a file
    without :data:`SORTED_DURATIONS` (before ``m013_sorted_durations``).
    """
    defined = {
        "tool_calls": _tool_calls(tool_columns),
        "turn_summaries": _turn_summaries(model_calls),
        "tool_stats": (
            _tool_stats_from_totals(_tool_stats(tool_columns, unless=TOTALS_COVER), sorted_durations)
            if tool_totals else _tool_stats(tool_columns)
        ),
        "loop_end_reasons": LOOP_END_REASONS,
        "declared_vs_used": _declared_vs_used(tool_columns),
        "token_usage": _TOKEN_USAGE.format(costs=_TOKEN_COSTS if model_calls else ""),
        "slowest_turns": SLOWEST_TURNS,
    }
    if model_calls:
        defined |= {
            "model_call_summaries": MODEL_CALL_SUMMARIES,
            "model_usage": MODEL_USAGE,
            "session_costs": SESSION_COSTS,
            "cost_totals": COST_TOTALS,
        }
    return defined


_TOKEN_COSTS = """,
    sum(model_calls) AS model_calls,
    sum(cost_usd) AS cost_usd,
    sum(unpriced_calls) AS unpriced_calls"""


VIEWS: dict[str, str] = views()
"""Every view, by name, as the SELECT that defines it; in creation order."""

TOOL_STATS = VIEWS["tool_stats"]
TOOL_CALLS = VIEWS["tool_calls"]
DECLARED_VS_USED = VIEWS["declared_vs_used"]


def create_statements(
    tool_columns: bool = True, model_calls: bool = True, tool_totals: bool = True, sorted_durations: bool = True
) -> list[str]:
    """``CREATE OR REPLACE VIEW`` statements for every view, in dependency order (see
    :func:`views` for ``tool_columns``, ``model_calls``, ``tool_totals`` and ``sorted_durations``)."""
    definitions = views(tool_columns, model_calls, tool_totals, sorted_durations)
    return [f"CREATE OR REPLACE VIEW {name} AS {sql.strip()}" for name, sql in definitions.items()]


# -- scores (m018_scores) ------------------------------------------------------------------------

SCORES_DDL = """CREATE TABLE scores (
    id VARCHAR NOT NULL,
    created_at TIMESTAMPTZ NOT NULL,
    name VARCHAR NOT NULL,
    value DOUBLE,
    label VARCHAR,
    explanation VARCHAR,
    source VARCHAR,
    target_kind VARCHAR,
    target_id VARCHAR,
    trace_id VARCHAR,
    span_id VARCHAR,
    response_id VARCHAR,
    session_id VARCHAR,
    correlation_id VARCHAR,
    agent VARCHAR,
    error_type VARCHAR
)"""
"""One row per score (``loopscope.score``, another instrumentation's ``gen_ai.evaluation.result``):
the ids of what it scores as the scorer had them (the scored span's, a response id, an id given
as text); :data:`SCORE_TARGETS` finds the turn, call or tool they name."""

_SCORE_MATCH = """
    SELECT s.id, {rank} AS rank, '{target}' AS target, {columns}, s.session_id AS given_session
    FROM {scores} s JOIN {source} ON {on}"""
_TURN_MATCH = ("turns", "t", (
    "t.session_id, t.correlation_id AS turn_id, t.channel_id AS agent, t.model, NULL::VARCHAR AS tool, "
    "NULL::VARCHAR AS tool_call_id, NULL::VARCHAR AS call_response_id, NULL::INTEGER AS call_position"
))
_CALL_MATCH = ("model_calls", "m", (
    "m.session_id, m.correlation_id, m.agent, coalesce(m.response_model, m.request_model), NULL, NULL, m.response_id, m.position"
))
_TOOL_MATCH = ("events", "e", "e.session_id, e.correlation_id, e.source_channel_id, NULL, e.tool_name, e.tool_call_id, NULL, NULL")
_TOOL_ROW = "e.type IN ('tool_call_start', 'tool_call_end')"
_SCORE_ON = [
    # the scored span itself (loopscope.score of an object, the conventions' parent span)
    (1, "turn", _TURN_MATCH, "t.span_id = s.span_id AND t.trace_id = s.trace_id"),
    (1, "call", _CALL_MATCH, "m.span_id = s.span_id AND m.trace_id = s.trace_id"),
    (1, "tool", _TOOL_MATCH, f"e.span_id = s.span_id AND e.trace_id = s.trace_id AND {_TOOL_ROW}"),
    # a response id (the conventions' way where no span is at hand)
    (2, "call", _CALL_MATCH, "m.response_id = coalesce(s.response_id, s.target_id)"),
    # an id given as text: a turn's correlation id, a tool call id
    (3, "turn", _TURN_MATCH, "t.correlation_id = s.target_id"),
    (3, "tool", _TOOL_MATCH, f"e.tool_call_id = s.target_id AND {_TOOL_ROW}"),
]


def score_targets(**sources: str) -> str:
    """The SELECT of :data:`SCORE_TARGETS`, reading ``sources`` instead of the tables of those
    names (``scores``, ``turns``, ``model_calls``, ``events``): a timeline page reads one
    session's rows only (``storage/duckdb/scores.py``)."""
    def source(table: str) -> str:
        return sources.get(table, table)

    matches = " UNION ALL ".join(
        _SCORE_MATCH.format(rank=rank, target=target, columns=columns, scores=source("scores"),
                            source=f"{source(table)} {alias}", on=on)
        for rank, target, (table, alias, columns), on in _SCORE_ON
    )
    return f"""
WITH matched AS ({matches}
), best AS (
    -- one match per score: the surest way first; an id several things have, in the score's own session first
    SELECT * FROM matched
    QUALIFY row_number() OVER (
        PARTITION BY id ORDER BY rank, session_id IS NOT DISTINCT FROM given_session DESC, target, session_id) = 1
), turn_of AS (
    SELECT session_id, correlation_id, any_value(channel_id) AS agent, any_value(model) AS model
    FROM {source("turns")} t WHERE correlation_id IN (SELECT turn_id FROM best UNION ALL SELECT correlation_id FROM {source("scores")} s)
    GROUP BY session_id, correlation_id
)
SELECT
    s.id,
    s.created_at,
    s.name,
    s.value,
    s.label,
    s.explanation,
    s.source,
    coalesce(b.target, s.target_kind) AS target,
    coalesce(b.session_id, s.session_id) AS session_id,
    coalesce(b.turn_id, s.correlation_id) AS turn_id,
    coalesce(b.agent, t.agent, s.agent) AS agent,
    coalesce(b.model, t.model) AS model,
    b.tool,
    b.tool_call_id,
    coalesce(b.call_response_id, s.response_id) AS response_id,
    b.call_position,
    b.target IS NOT NULL AS found,
    s.target_id,
    s.trace_id,
    s.span_id,
    s.error_type
FROM {source("scores")} s
LEFT JOIN best b ON b.id = s.id
LEFT JOIN turn_of t ON t.correlation_id = coalesce(b.turn_id, s.correlation_id)
    AND t.session_id = coalesce(b.session_id, s.session_id)
"""


SCORE_TARGETS = score_targets()
"""``score_targets``: every score with what it scores, found by the scored span's ids, else the
response id, else the id given as text (a turn's correlation id, a tool call id): ``target``
(turn, call, tool), session, turn, agent, model, tool; ``found`` is false while what it names
is not in the store (not written yet, or another store's)."""

EMPTY_SCORE_TARGETS = """
SELECT NULL::VARCHAR AS id, NULL::TIMESTAMPTZ AS created_at, NULL::VARCHAR AS name, NULL::DOUBLE AS value,
       NULL::VARCHAR AS label, NULL::VARCHAR AS explanation, NULL::VARCHAR AS source, NULL::VARCHAR AS target,
       NULL::VARCHAR AS session_id, NULL::VARCHAR AS turn_id, NULL::VARCHAR AS agent, NULL::VARCHAR AS model,
       NULL::VARCHAR AS tool, NULL::VARCHAR AS tool_call_id, NULL::VARCHAR AS response_id, NULL::INTEGER AS call_position,
       NULL::BOOLEAN AS found, NULL::VARCHAR AS target_id, NULL::VARCHAR AS trace_id, NULL::VARCHAR AS span_id,
       NULL::VARCHAR AS error_type
WHERE false
"""
"""``score_targets`` of a file from before ``m018_scores`` read as it is (no scores, and maybe no
tool columns to match them by)."""

SCORES_OVER_TIME = """
SELECT
    date_trunc('day', created_at) AS day,
    name,
    target,
    agent,
    model,
    tool,
    count(*) AS scores,
    count(value) AS valued,
    avg(value) AS mean_value,
    min(value) AS min_value,
    max(value) AS max_value,
    count(label) AS labelled,
    CAST(to_json(histogram(label) FILTER (WHERE label IS NOT NULL)) AS VARCHAR) AS labels
FROM score_targets
GROUP BY ALL
"""
"""``scores_over_time``: per UTC day, evaluation name, target kind, agent, model and tool: how
many scores, their values' mean, least and most, and each label's count (JSON)."""

SCORE_VIEWS = {"score_targets": SCORE_TARGETS, "scores_over_time": SCORES_OVER_TIME}
"""The score views (``m018_scores``), by name, in creation order."""
VIEWS.update(SCORE_VIEWS)  # every view of a file of this loopscope (views() gives those of the migrations before m018)
