"""Scores on ClickHouse (docs/scores.md): the ``loopscope_scores`` table, the materialized views that
fill it from ``otel_traces``, the ``score_targets`` / ``scores_over_time`` views, and the three reads
(what ``loopscope score TARGET`` names, a session's scores, the Scores page) with the DuckDB
engine's answers (``storage/duckdb/scores.py``).

Rows come from two shapes of span, read with the rules of :func:`loopscope.ingest.scores.foreign_scores`
and the mapping's ``score_fact``:

* a score span (``loopscope.score``'s; ``loopscope score``'s; or one ``collect`` made of another
  instrumentation's result): its attributes as they are, the scored span's ids in
  ``loopscope.score.trace_id`` / ``.span_id``. An evaluator's own span whose attributes are the
  conventions' event (no ``gen_ai.evaluation.result`` event on it, not a chat / tool / agent span)
  is one too, its parent the scored span and only the conventions' attributes read;
* another instrumentation's span carrying ``gen_ai.evaluation.result`` events (``Events.Name``):
  one row per event, scoring that span when it is a chat, tool or agent span, else its parent.

A score's id is its span's (trace and span id, and ``-N`` for the Nth event of a span), so a span
sent twice, or a result both ``collect`` and the views read, is one row (``ReplacingMergeTree``
keyed by the id, read with ``FINAL``). Spans written before ``loopscope_scores`` existed are not
in it (a materialized view sees inserts from its creation on).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ... import semconv as a
from ..errors import StoreError
from ..pages import json_safe, now_ms, since
from ..results import ScoreTarget
from .tables import IN_IDS, ids_param

if TYPE_CHECKING:
    from .reader import ClickHouseReader

MAX_SCORES = 200
"""The most recent scores a Scores page lists (as the DuckDB engine's)."""

SCORES = "loopscope_scores"

# what an operation's span is, as a score's target (ingest/scores.py's _ROLES)
_ROLES = {a.OP_CHAT: "call", a.OP_EXECUTE_TOOL: "tool", a.OP_INVOKE_AGENT: "turn",
          "text_completion": "call", "generate_content": "call"}
_OWN_SCOPE = "loopscope"  # ingest.spans.OWN_SCOPE (storage does not import ingest)

_COLUMNS = """
    id String,
    created_at DateTime64(6, 'UTC'),
    name String,
    value Nullable(Float64),
    label Nullable(String),
    explanation Nullable(String) CODEC(ZSTD(1)),
    source LowCardinality(Nullable(String)),
    target_kind LowCardinality(Nullable(String)),
    target_id Nullable(String),
    trace_id Nullable(String),
    span_id Nullable(String),
    response_id Nullable(String),
    session_id Nullable(String),
    correlation_id Nullable(String),
    agent Nullable(String),
    error_type Nullable(String)"""


def ident(name: str) -> str:
    """A ClickHouse identifier, backticked (as ``ddl.ident``: ``ddl`` imports this module)."""
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def _get(attributes: str, name: str) -> str:
    return f"{attributes}['{name}']"


def _text(attributes: str, name: str) -> str:
    return f"nullIf({_get(attributes, name)}, '')"


def _value(attributes: str) -> str:
    """A score's value as a finite number, else NULL (the mapping's ``_score_value``: another
    instrumentation's may be text; ``true`` is no number)."""
    number = f"toFloat64OrNull({_get(attributes, a.EVALUATION_SCORE_VALUE)})"
    return f"if(isFinite(ifNull({number}, nan)), {number}, NULL)"


def _micros(ns: str) -> str:
    return f"fromUnixTimestamp64Micro(intDiv({ns}, 1000), 'UTC')"


_START_NS = "toUnixTimestamp64Nano(Timestamp)"
_END_NS = f"({_START_NS} + toInt64(Duration))"
_OP = _get("SpanAttributes", a.OPERATION)
_ROLE = (f"transform({_OP}, [{', '.join(repr(k) for k in _ROLES)}], "
         f"[{', '.join(repr(v) for v in _ROLES.values())}], '')")
# a score span as loopscope makes it (its own scope, or loopscope.score.* attributes: one collect made)
_OWN = f"(ScopeName = '{_OWN_SCOPE}' OR arrayExists(k -> startsWith(k, 'loopscope.score.'), mapKeys(SpanAttributes)))"
_NULL = "CAST(NULL AS Nullable(String))"


def _span_select(src: str) -> str:
    """The rows of score spans, and of evaluators' own spans (see the module)."""
    attrs = "SpanAttributes"

    def own(name: str) -> str:  # read on loopscope's score spans only: an evaluator's span is read for the event's
        return f"if({_OWN}, {_text(attrs, name)}, {_NULL})"

    seq = _get(attrs, a.SCORE_SEQ)
    kind = _get(attrs, a.SCORE_TARGET_KIND)
    kinds = ", ".join(f"'{k}'" for k in a.SCORE_TARGET_KINDS)
    parent_trace = f"if(ParentSpanId != '', lower(TraceId), {_NULL})"
    return f"""SELECT concat(lower(TraceId), lower(SpanId), if({seq} NOT IN ('', '0'), concat('-', {seq}), '')) AS id,
    {_micros(_END_NS)} AS created_at, {_get(attrs, a.EVALUATION_NAME)} AS name, {_value(attrs)} AS value,
    {_text(attrs, a.EVALUATION_SCORE_LABEL)} AS label, {_text(attrs, a.EVALUATION_EXPLANATION)} AS explanation,
    {own(a.SCORE_SOURCE)} AS source, if({_OWN} AND {kind} IN ({kinds}), {kind}, {_NULL}) AS target_kind,
    {own(a.SCORE_TARGET)} AS target_id,
    if({_OWN}, {_text(attrs, a.SCORE_TRACE_ID)}, {parent_trace}) AS trace_id,
    if({_OWN}, {_text(attrs, a.SCORE_SPAN_ID)}, nullIf(lower(ParentSpanId), '')) AS span_id,
    {_text(attrs, a.RESPONSE_ID)} AS response_id, {own(a.CONVERSATION_ID)} AS session_id,
    {own(a.TURN_ID)} AS correlation_id, {own(a.AGENT_NAME)} AS agent, {_text(attrs, a.ERROR_TYPE)} AS error_type
FROM {src}
WHERE mapContains({attrs}, '{a.EVALUATION_NAME}')
    AND if({_OWN}, NOT mapContains({attrs}, '{a.OPERATION}'),
           {_ROLE} = '' AND NOT has(Events.Name, '{a.EVALUATION_EVENT}'))"""


def _event_select(src: str) -> str:
    """The rows of other instrumentations' ``gen_ai.evaluation.result`` span events."""
    ev = "score_event_attributes"
    span = "SpanAttributes"
    scored_self = f"{_ROLE} != ''"
    response = (f"if(mapContains({ev}, '{a.RESPONSE_ID}'), {_text(ev, a.RESPONSE_ID)}, "
                f"if({_ROLE} = 'call', {_text(span, a.RESPONSE_ID)}, {_NULL}))")
    at_ns = "toUnixTimestamp64Nano(score_event_at)"
    return f"""SELECT concat(lower(TraceId), lower(SpanId), '-', toString(score_event_seq)) AS id,
    {_micros(f"if({at_ns} != 0, {at_ns}, {_END_NS})")} AS created_at, {_get(ev, a.EVALUATION_NAME)} AS name,
    {_value(ev)} AS value, {_text(ev, a.EVALUATION_SCORE_LABEL)} AS label,
    {_text(ev, a.EVALUATION_EXPLANATION)} AS explanation, {_NULL} AS source, nullIf({_ROLE}, '') AS target_kind,
    {_NULL} AS target_id,
    if({scored_self} OR ParentSpanId != '', lower(TraceId), {_NULL}) AS trace_id,
    if({scored_self}, lower(SpanId), nullIf(lower(ParentSpanId), '')) AS span_id,
    {response} AS response_id, {_text(span, a.CONVERSATION_ID)} AS session_id, {_NULL} AS correlation_id,
    {_text(span, a.AGENT_NAME)} AS agent, {_text(ev, a.ERROR_TYPE)} AS error_type
FROM {src}
ARRAY JOIN Events.Name AS score_event_name, Events.Attributes AS {ev}, Events.Timestamp AS score_event_at,
    arrayEnumerate(Events.Name) AS score_event_seq
WHERE NOT {_OWN} AND score_event_name = '{a.EVALUATION_EVENT}' AND mapContains({ev}, '{a.EVALUATION_NAME}')"""


# -- score_targets: what each score names (storage/duckdb/views.py's score_targets) -----------------

# the scores on the right: ClickHouse builds its hash table of a join's right side, and scores are few
_MATCH = """
    SELECT s.id AS id, {rank} AS rank, '{target}' AS target, {columns}, s.session_id AS given_session
    FROM {source} INNER JOIN {scores} AS s ON {on}"""


def _columns(session: str, turn: str, agent: str, model: str, tool: str, call_id: str, response: str, position: str) -> str:
    named = (("session_id", session), ("turn_id", turn), ("agent", agent), ("model", model), ("tool", tool),
             ("tool_call_id", call_id), ("call_response_id", response))
    return ", ".join(f"CAST({expr} AS Nullable(String)) AS {name}" for name, expr in named) + \
        f", CAST({position} AS Nullable(Int64)) AS call_position"


_TURN = ("turns", "t", _columns("t.session_id", "t.correlation_id", "t.channel_id", "t.model", "NULL", "NULL", "NULL", "NULL"))
_CALL = ("model_calls", "m", _columns("m.session_id", "m.correlation_id", "m.agent",
                                      "coalesce(m.response_model, m.request_model)", "NULL", "NULL", "m.response_id", "m.position"))
_TOOL = ("tool_calls", "c", _columns("c.session_id", "c.turn_id", "c.agent", "NULL", "c.tool", "nullIf(c.call_id, '')", "NULL", "NULL"))
_ON = [
    # the scored span itself (loopscope.score of an object, the conventions' parent span)
    (1, "turn", _TURN, "t.span_id = s.span_id AND t.trace_id = s.trace_id"),
    (1, "call", _CALL, "m.span_id = s.span_id AND m.trace_id = s.trace_id"),
    (1, "tool", _TOOL, "c.span_id = s.span_id AND c.trace_id = s.trace_id"),
    # a response id (the conventions' way where no span is at hand)
    (2, "call", _CALL, "m.response_id = coalesce(s.response_id, s.target_id)"),
    # an id given as text: a turn's correlation id, a tool call id
    (3, "turn", _TURN, "t.correlation_id = s.target_id"),
    (3, "tool", _TOOL, "c.call_id = s.target_id"),
]
_SOURCES = {"scores": f"(SELECT * FROM {SCORES} FINAL)", "turns": "(SELECT * FROM loopscope_turns FINAL)",
            "model_calls": "(SELECT * FROM loopscope_model_calls FINAL)",
            "tool_calls": "(SELECT * FROM loopscope_tool_calls FINAL)"}


def score_targets(**sources: str) -> str:
    """The ``SELECT`` of ``score_targets``: every score with what it scores (the DuckDB view's
    columns and rules), reading ``sources`` (subqueries by table: ``scores``, ``turns``,
    ``model_calls``, ``tool_calls``) instead of the whole tables: a session's page reads its own."""
    src = {**_SOURCES, **sources}
    matches = " UNION ALL ".join(
        _MATCH.format(rank=rank, target=target, columns=columns, scores=src["scores"], source=f"{src[table]} AS {alias}", on=on)
        for rank, target, (table, alias, columns), on in _ON
    )
    return f"""
WITH matched AS ({matches}
), best AS (
    -- one match per score: the surest way first; an id several things have, in the score's own session first
    SELECT * FROM matched
    ORDER BY id, rank, ifNull(session_id = given_session, 0) DESC, target, session_id
    LIMIT 1 BY id
), scored AS (
    SELECT s.id AS id, s.created_at AS created_at, s.name AS name, s.value AS value, s.label AS label,
        s.explanation AS explanation, s.source AS source, b.id = s.id AS found,
        if(found, CAST(b.target AS Nullable(String)), s.target_kind) AS target,
        if(found, b.session_id, s.session_id) AS session_id, if(found, b.turn_id, s.correlation_id) AS turn_id,
        b.agent AS matched_agent, s.agent AS given_agent, b.model AS matched_model, b.tool AS tool,
        b.tool_call_id AS tool_call_id, coalesce(b.call_response_id, s.response_id) AS response_id,
        b.call_position AS call_position, s.target_id AS target_id, s.trace_id AS trace_id, s.span_id AS span_id,
        s.error_type AS error_type
    FROM {src["scores"]} AS s LEFT JOIN best AS b ON b.id = s.id
), turn_of AS (
    SELECT session_id, correlation_id, any(channel_id) AS agent, any(model) AS model
    FROM {src["turns"]}
    WHERE correlation_id IN (SELECT turn_id FROM scored WHERE turn_id IS NOT NULL)
    GROUP BY session_id, correlation_id
)
SELECT x.id AS id, x.created_at AS created_at, x.name AS name, x.value AS value, x.label AS label,
    x.explanation AS explanation, x.source AS source, x.target AS target, x.session_id AS session_id,
    x.turn_id AS turn_id, coalesce(x.matched_agent, t.agent, x.given_agent) AS agent,
    CAST(coalesce(x.matched_model, t.model) AS Nullable(String)) AS model, x.tool AS tool,
    x.tool_call_id AS tool_call_id, x.response_id AS response_id, x.call_position AS call_position,
    CAST(x.found AS Bool) AS found, x.target_id AS target_id, x.trace_id AS trace_id, x.span_id AS span_id,
    x.error_type AS error_type
FROM scored AS x
LEFT JOIN turn_of AS t ON t.correlation_id = x.turn_id AND t.session_id = x.session_id
"""


SCORES_OVER_TIME = """
SELECT toDateTime64(toStartOfDay(created_at), 6, 'UTC') AS day, name, target, agent, model, tool, count() AS scores, count(value) AS valued,
    avg(value) AS mean_value, min(value) AS min_value, max(value) AS max_value, count(label) AS labelled,
    if(count(label) = 0, NULL, toJSONString(CAST(sumMapIf(map(assumeNotNull(label), toUInt64(1)), isNotNull(label))
        AS Map(String, UInt64)))) AS labels
FROM score_targets
GROUP BY day, name, target, agent, model, tool
"""
"""``scores_over_time``: per UTC day, evaluation name, target kind, agent, model and tool: how many
scores, their values' mean, least and most, and each label's count (JSON)."""


SCORE_VIEWS = {"score_targets": score_targets().strip(), "scores_over_time": SCORES_OVER_TIME.strip()}
"""The score views by the DuckDB store's names, in its order (``views.VIEWS`` ends with them)."""


def statements(database: str, source: str, *, ttl_days: int = 0) -> list[str]:
    """``loopscope_scores`` and its two materialized views over ``source`` (the exporter's traces
    table); each ``IF NOT EXISTS``. (The views over it: :data:`SCORE_VIEWS`.)"""
    db, src = ident(database), f"{ident(database)}.{ident(source)}"
    ttl = f"TTL toDateTime(created_at) + toIntervalDay({int(ttl_days)})" if ttl_days > 0 else ""
    table = f"{db}.{ident(SCORES)}"
    return [
        f"""CREATE TABLE IF NOT EXISTS {table} ({_COLUMNS}
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(created_at)
ORDER BY id
{ttl}
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1""",
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.`loopscope_scores_mv` TO {table} AS {_span_select(src)}",
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.`loopscope_score_events_mv` TO {table} AS {_event_select(src)}",
    ]  # the views: SCORE_VIEWS, in views.VIEWS


# -- the reads ---------------------------------------------------------------------------------------

def has_scores(reader: ClickHouseReader) -> bool:
    """Whether the store has ``loopscope_scores`` (one prepared by a loopscope from before it has not)."""
    rows = reader.rows(f"SELECT count() FROM system.tables WHERE database = currentDatabase() AND name = '{SCORES}'")
    return bool(rows and int(rows[0][0]))


def _nullable(expr: str) -> str:
    return f"CAST({expr} AS Nullable(String))"


_TARGETS = f"""
SELECT 'turn' AS kind, {_nullable('session_id')} AS session_id, {_nullable('correlation_id')} AS turn_id,
    {_nullable('channel_id')} AS agent, {_nullable('trace_id')} AS trace_id, {_nullable('span_id')} AS span_id,
    {_NULL} AS response_id, {_NULL} AS tool_call_id
FROM loopscope_turns FINAL WHERE correlation_id = {{ref:String}} OR span_id = {{ref:String}}
UNION ALL
SELECT 'call', {_nullable('session_id')}, {_nullable('correlation_id')}, {_nullable('agent')}, {_nullable('trace_id')},
    {_nullable('span_id')}, {_nullable('response_id')}, {_NULL}
FROM loopscope_model_calls FINAL WHERE response_id = {{ref:String}} OR span_id = {{ref:String}}
UNION ALL
SELECT 'tool', {_nullable('session_id')}, {_nullable('turn_id')}, {_nullable('agent')}, {_nullable('trace_id')},
    {_nullable('span_id')}, {_NULL}, {_nullable("nullIf(call_id, '')")}
FROM loopscope_tool_calls FINAL WHERE call_id = {{ref:String}} OR span_id = {{ref:String}}
"""
_TURN_PREFIX = f"""
SELECT 'turn', {_nullable('session_id')}, {_nullable('correlation_id')}, {_nullable('channel_id')},
    {_nullable('trace_id')}, {_nullable('span_id')}, {_NULL}, {_NULL}
FROM loopscope_turns FINAL WHERE startsWith(correlation_id, {{ref:String}})
"""


def score_target(reader: ClickHouseReader, ref: str) -> ScoreTarget | None:
    """What ``ref`` names (the DuckDB engine's rules): a turn's correlation id (or a unique prefix of
    it), a response id, a tool call id or a span id; None when nothing has it; a
    :class:`StoreError` for an id more than one thing has."""
    found = {tuple(r) for r in reader.rows(_TARGETS, {"ref": ref})}
    if not found and len(ref) >= 4:
        found = {tuple(r) for r in reader.rows(_TURN_PREFIX, {"ref": ref})}
    if not found:
        return None
    if len(found) > 1:
        kinds = ", ".join(sorted({f"a {r[0]} of session {r[1]}" for r in found}))
        raise StoreError(f"{ref!r} names {len(found)} things ({kinds}): give a span id, or the turn's full correlation id")
    (row,) = found
    return ScoreTarget(*row)


_MS = "intDiv(toUnixTimestamp64Micro({0}) + 500, 1000)"  # epoch ms, rounded as DuckDB's epoch_ms gives them


def _records(reader: ClickHouseReader, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: json_safe(v) if isinstance(v, float) else v for k, v in row.items()} for row in reader.records(sql, params)]


def session_page(reader: ClickHouseReader, session_id: str, turn_ids: Sequence[str]) -> dict[str, Any]:
    """A session's scores as the dashboard polls for them (``/api/scores?session=``): :func:`turn_scores`
    (the DuckDB engine's ``session_page``)."""
    return {"session_id": session_id, "scores": turn_scores(reader, session_id, turn_ids), "generated_at": now_ms()}


def turn_scores(reader: ClickHouseReader, session_id: str, turn_ids: Sequence[str]) -> list[dict[str, Any]]:
    """The scores of these turns of a session and of their model calls and tool calls (``target``:
    turn, call, tool), oldest first: what a timeline page shows on each turn."""
    if not turn_ids or not has_scores(reader):
        return []
    session = "session_id = {session:String}"
    targets = score_targets(
        scores=f"(SELECT * FROM {SCORES} FINAL WHERE {session} OR session_id IS NULL)",
        turns=f"(SELECT * FROM loopscope_turns FINAL WHERE {session})",
        model_calls=f"(SELECT * FROM loopscope_model_calls FINAL WHERE {session})",
        tool_calls=f"(SELECT * FROM loopscope_tool_calls FINAL WHERE {session})",
    )
    return _records(reader, f"""
        SELECT id, {_MS.format('created_at')} AS t, name, value, label, explanation, source, target, turn_id, tool,
            tool_call_id, call_position, response_id
        FROM ({targets})
        WHERE {session} AND turn_id IN {IN_IDS % 'turns'}
        ORDER BY created_at, id""", {"session": session_id, "turns": ids_param(turn_ids)})


def _summed(groups: list[dict[str, Any]], by: str, *, labels: bool = True) -> list[dict[str, Any]]:
    """The page's rows per name (and per ``by``: agent, model, tool, day) summed from the groups:
    count, mean value (of the scores with one), each label's count; ordered as DuckDB orders them."""
    sums: dict[tuple[Any, ...], dict[str, Any]] = {}
    for g in groups:
        key = (g["day"], g["name"]) if by == "day" else (g["name"], g[f"by_{by}"]) if by else (g["name"],)
        row = sums.setdefault(key, {"scores": 0, "valued": 0, "total": 0.0, "labels": Counter()})
        row["scores"] += g["scores"]
        row["valued"] += g["valued"]
        row["total"] += g["total"] or 0.0
        if g["label"] is not None:
            row["labels"][g["label"]] += g["scores"]
    out = []
    for key, row in sorted(sums.items(), key=lambda item: item[0]):
        named = {"day": key[0], "name": key[1]} if by == "day" else {"name": key[0], **({by: key[1]} if by else {})}
        summed = {**named, "scores": row["scores"], "mean_value": json_safe(row["total"] / row["valued"]) if row["valued"] else None}
        out.append({**summed, "labels": dict(row["labels"])} if labels else summed)
    return out


def page(reader: ClickHouseReader, range_: str | None = "all") -> dict[str, Any]:
    """The Scores page (the DuckDB engine's ``page``): per score name, and per name by agent, model
    and tool (count, mean value, each label's count), per day, and the most recent scores."""
    start = since(range_)
    answer: dict[str, Any] = {"range": range_ or "all", "generated_at": now_ms()}
    if not has_scores(reader):
        return {**answer, "names": [], "by_agent": [], "by_model": [], "by_tool": [], "over_time": [], "recent": []}
    params: dict[str, Any] = {}
    where = ""
    if start is not None:
        where, params = "WHERE created_at >= fromUnixTimestamp64Micro({since:Int64}, 'UTC')", {"since": int(start * 1e6)}
    scored = f"({score_targets()}) {where}"
    # one read of what the scores name, in groups the page's sums are made of (each a day, name, agent,
    # model, tool and label): the matching is the costly part, and the groups are few
    groups = _records(reader, f"""
        SELECT {_MS.format("toDateTime64(toStartOfDay(created_at), 6, 'UTC')")} AS day, name,
            coalesce(agent, '') AS by_agent, coalesce(model, '') AS by_model, coalesce(tool, '') AS by_tool, label,
            count() AS scores, count(value) AS valued, sum(value) AS total
        FROM {scored} GROUP BY day, name, by_agent, by_model, by_tool, label""", params)
    answer["names"] = _summed(groups, "")
    answer["by_agent"] = _summed(groups, "agent")
    answer["by_model"] = _summed(groups, "model")
    answer["by_tool"] = [r for r in _summed(groups, "tool") if r["tool"]]
    answer["over_time"] = _summed(groups, "day", labels=False)
    answer["recent"] = _records(reader, f"""
        SELECT id, {_MS.format('created_at')} AS t, name, value, label, explanation, source, target, session_id, turn_id,
            agent, model, tool, tool_call_id, call_position, found
        FROM {scored} ORDER BY created_at DESC, id LIMIT {MAX_SCORES}""", params)
    return answer


__all__ = ["MAX_SCORES", "SCORES", "SCORES_OVER_TIME", "SCORE_VIEWS", "has_scores", "page", "score_target", "score_targets",
           "session_page", "statements", "turn_scores"]
