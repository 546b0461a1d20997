"""The web dashboard's pages on ClickHouse (``Reader.page_*``): the same JSON-ready dicts, with the
same keys, as the DuckDB engine's (``storage/duckdb/dashboard.py``, docs/dashboards.md), read from
loopscope's derived tables. Times are epoch milliseconds (UTC).

What differs: no cost (``cost_usd`` None, every call with tokens counted ``unpriced_calls``); no
running tool call (the exporter writes ended spans: ``running`` is 0); a timeline's ``cursor`` is
the highest index the page read (blocked rows included), as DuckDB's ``read_after`` gives it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..pages import (
    LIVE_SECONDS,
    content_of,
    declared_page,
    json_safe,
    loads,
    now_ms,
    page_args,
    since,
    timeline_limit,
)
from .scores import turn_scores
from .tables import CALLS, EVENT_NAMES, EVENT_SELECT, IN_IDS, SESSION_ROWS, TOOL_CALLS, TURNS, ids_param

if TYPE_CHECKING:
    from .reader import ClickHouseReader

_BUCKETS = (1, 10, 60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86_400, 7 * 86_400, 30 * 86_400)
_MAX_BUCKETS = 60
OUTCOMES = ("served", "failed", "refused", "blocked", "cancelled", "unserved")
# milliseconds rounded to the nearest, as DuckDB's epoch_ms gives them
_MS = "intDiv(toUnixTimestamp64Micro({0}) + 500, 1000)"


def _ms(us: int | None) -> int | None:
    return None if us is None else (int(us) + 500) // 1000


def _records(reader: ClickHouseReader, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return [json_safe(r) for r in reader.records(sql, params)]


def _session_rows(reader: ClickHouseReader, q: str | None, limit: int, offset: int) -> tuple[list[dict[str, Any]], int]:
    picked = reader._session_ids(limit, offset, search=q)
    total = reader.session_count(q)
    if not picked:
        return [], total
    infos = reader.session_infos(picked)
    turns = {r["session_id"]: r for r in _records(reader, f"""SELECT session_id, count() AS turns,
            arraySort(groupUniqArrayIf(channel_id, isNotNull(channel_id))) AS agents,
            arraySort(groupUniqArrayIf(model, isNotNull(model))) AS models,
            sum(coalesce(t.input_tokens, 0)) AS input_tokens, sum(coalesce(t.output_tokens, 0)) AS output_tokens,
            sum(tool_calls_count) AS tool_calls, argMax(loop_end_reason, timestamp) AS last_loop_end_reason,
            countIf(coalesce(loop_end_reason, '') != 'completed') AS not_completed,
            sum(coalesce(model_call_count, 0)) AS model_calls,
            countIf(isNotNull(t.input_tokens) OR isNotNull(t.output_tokens)) AS unpriced_calls
        FROM {TURNS.format(where="WHERE session_id IN " + IN_IDS % "ids")} AS t GROUP BY session_id""",
        {"ids": ids_param(picked)})}
    live_after = now_ms() - LIVE_SECONDS * 1000
    rows = []
    for session in picked:
        info, t = infos[session], turns.get(session, {})
        last = _ms(info["last_us"])
        rows.append({
            "session_id": session, "event_count": info["event_count"],
            "first_at": _ms(info["first_us"]), "last_at": last,
            "turns": t.get("turns", 0), "agents": [a for a in t.get("agents", []) if a],
            "models": [m for m in t.get("models", []) if m], "input_tokens": t.get("input_tokens", 0),
            "output_tokens": t.get("output_tokens", 0), "tool_calls": t.get("tool_calls", 0),
            "last_loop_end_reason": t.get("last_loop_end_reason"), "not_completed": t.get("not_completed", 0),
            "model_calls": t.get("model_calls") if t else None, "cost_usd": None,
            "unpriced_calls": t.get("unpriced_calls", 0), "live": bool(last and last >= live_after),
        })
    return rows, total


def sessions(reader: ClickHouseReader, q: str | None = None, limit: int | None = None, offset: int | None = None) -> dict[str, Any]:
    limit, offset = page_args(limit, offset, 50)
    rows, total = _session_rows(reader, q, limit, offset)
    return {"sessions": rows, "total": total, "limit": limit, "offset": offset, "q": q or ""}


def overview(reader: ClickHouseReader, limit: int = 50) -> dict[str, Any]:
    [totals] = _records(reader, f"""SELECT uniqExact(session_id) AS sessions, uniqExact(id) AS events,
        if(events = 0, NULL, {_MS.format("max(created_at)")}) AS last_at FROM loopscope_events""")
    turns = TURNS.format(where="")
    [turn_totals] = _records(reader, f"""SELECT count() AS turns, sum(tool_calls_count) AS tool_calls,
        sum(coalesce(t.input_tokens, 0)) AS input_tokens, sum(coalesce(t.output_tokens, 0)) AS output_tokens,
        if(turns = 0, NULL, quantileExactInclusive(0.5)(latency_ms)) AS latency_p50_ms,
        if(turns = 0, NULL, quantileExactInclusive(0.95)(latency_ms)) AS latency_p95_ms FROM {turns} AS t""")
    reasons = _records(reader, f"""SELECT coalesce(loop_end_reason, 'unknown') AS reason, count() AS turns
        FROM {turns} GROUP BY reason ORDER BY turns DESC, reason""")
    [costs] = _records(reader, f"""SELECT count() AS model_calls, CAST(NULL AS Nullable(Float64)) AS cost_usd,
        countIf(isNotNull(input_tokens) OR isNotNull(output_tokens)) AS unpriced_calls FROM {CALLS.format(where="")}""")
    recent, total = _session_rows(reader, None, limit, 0)
    return {"store": reader.path, "generated_at": now_ms(), "totals": {**totals, **turn_totals, **costs},
            "loop_end_reasons": reasons, "sessions": recent, "sessions_total": total}


_EVENT_COLUMNS = EVENT_SELECT.replace("toUnixTimestamp64Micro(created_at) AS created_us", _MS.format("created_at") + " AS t")


_EVENT_NAMES = tuple("t" if name == "created_us" else name for name in EVENT_NAMES)


def _event_row(row: dict[str, Any], clip: bool = True) -> dict[str, Any]:
    content, truncated = content_of(row["content"], clip)
    return {"id": row["id"], "index": row["idx"], "type": row["type"], "t": row["t"], "correlation_id": row["correlation_id"],
            "status": row["status"], "agent": row["source_channel_id"], "provider": row["source_provider"],
            "framework": row["source_framework"], "content": json_safe(content), "truncated": truncated}


def _loaded(text: Any) -> Any:
    try:
        return loads(text) if text else None
    except ValueError:
        return None


def timeline(
    reader: ClickHouseReader, session_id: str, *, after_index: int | None = None, before_index: int | None = None,
    limit: int | None = None, include_blocked: bool = False, turn_ids: Sequence[str] = (),
) -> dict[str, Any]:
    """A page of a session's timeline, the turns on it and their model calls (see the DuckDB engine's)."""
    limit = timeline_limit(limit, after_index, before_index)
    from ..policy import EventFilter

    info = reader.session_infos([session_id])[session_id]
    found = info["event_count"] > 0
    names = _EVENT_NAMES
    if after_index is not None:
        # blocked rows read too, so the cursor passes them: nothing lands twice or in neither page
        rows = [dict(zip(names, r)) for r in reader.timeline_rows(
            session_id, limit + 1, after_index=after_index, event_filter=EventFilter(include_blocked=True),
            select=_EVENT_COLUMNS)]
        more = len(rows) > limit
        rows = rows[:limit]
        cursor = rows[-1]["idx"] if rows else after_index
        rows = [r for r in rows if include_blocked or r["status"] != "blocked"]
    else:
        rows = [dict(zip(names, r)) for r in reader.timeline_rows(
            session_id, limit + 1, before_index=before_index, newest_first=True,
            event_filter=EventFilter(include_blocked=include_blocked), select=_EVENT_COLUMNS)]
        more = len(rows) > limit
        rows = rows[len(rows) - limit:] if more else rows
        cursor = info["event_count"] if before_index is None else None
    events = [_event_row(r) for r in rows]
    wanted = sorted({e["correlation_id"] for e in events if e["correlation_id"]} | set(turn_ids))
    turns: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    if wanted:
        params = {"session_id": session_id, "ids": ids_param(wanted)}
        where = "WHERE session_id = {session_id:String} AND correlation_id IN " + IN_IDS % "ids"
        turns = _records(reader, f"""SELECT correlation_id, session_id, channel_id AS agent, parent_correlation_id,
                tool_calls_count, round_count, input_tokens, output_tokens, loop_end_reason, latency_ms, streaming,
                {_MS.format("timestamp")} AS t, model, provider, error, declared_tools, trace_id,
                cache_read_input_tokens, cache_creation_input_tokens, reasoning_tokens, model_call_count
            FROM {TURNS.format(where=where)} ORDER BY timestamp, correlation_id""", params)
        calls = _records(reader, f"""SELECT correlation_id AS turn_id, coalesce(position, toInt64(row_number() OVER
                    (PARTITION BY correlation_id ORDER BY started_at, span_id))) AS position,
                {_MS.format("started_at")} AS started_at, {_MS.format("ended_at")} AS ended_at, duration_ms,
                time_to_first_chunk_ms AS ttfc_ms, coalesce(response_model, request_model) AS model, provider, agent,
                input_tokens, output_tokens, cache_read_input_tokens, cache_creation_input_tokens, reasoning_tokens,
                CAST(NULL AS Nullable(Float64)) AS cost_usd, outcome, finish_reasons, error_type, error, refusal, streaming,
                response_id, span_id
            FROM {CALLS.format(where=where)} ORDER BY started_at, span_id""", params)
        per_turn: dict[str, list[dict[str, Any]]] = {}
        for call in calls:
            reasons = _loaded(call["finish_reasons"])
            call["finish_reasons"] = reasons if isinstance(reasons, list) else []
            per_turn.setdefault(call["turn_id"], []).append(call)
        for turn in turns:
            usage = {k: turn.pop(k) for k in ("cache_read_input_tokens", "cache_creation_input_tokens", "reasoning_tokens")}
            usage = {"input_tokens": turn["input_tokens"], "output_tokens": turn["output_tokens"], **usage}
            turn["usage"] = {k: v for k, v in usage.items() if v is not None} or None
            declared = _loaded(turn["declared_tools"])
            turn["declared_tools"] = [d.get("name") for d in declared or [] if isinstance(d, dict)]
            own = per_turn.get(turn["correlation_id"], [])
            counted = turn.pop("model_call_count")
            turn["model_calls"] = counted if counted is not None else len(own)
            turn["cost_usd"] = None
            turn["unpriced_calls"] = sum(1 for c in own if c["input_tokens"] is not None or c["output_tokens"] is not None)
    return {
        "session_id": session_id, "found": found, "last_index": info["event_count"],
        "first_at": _ms(info["first_us"]) if found else None, "last_at": _ms(info["last_us"]) if found else None,
        "events": events, "turns": turns, "model_calls": calls,
        "scores": turn_scores(reader, session_id, wanted),  # the page's turns' (and their calls' and tools') scores
        "more_before": more if after_index is None else None, "more_after": more if after_index is not None else None,
        "cursor": cursor, "generated_at": now_ms(),
    }


def event(reader: ClickHouseReader, event_id: str) -> dict[str, Any] | None:
    """One event in full, numbered in its session."""
    found = reader.rows("SELECT session_id FROM loopscope_events WHERE id = {id:String} LIMIT 1", {"id": event_id})
    if not found:
        return None
    names = _EVENT_NAMES

    rows = reader.rows(f"SELECT {_EVENT_COLUMNS} FROM ({SESSION_ROWS}) WHERE id = {{id:String}}",
                       {"session_id": found[0][0], "id": event_id})
    return _event_row(dict(zip(names, rows[0])), clip=False) if rows else None


def _bucket(reader: ClickHouseReader, since_s: float | None) -> tuple[int, int | None]:
    """A bucket width (seconds) giving at most ~60 buckets over the data in range, and its start."""
    [(first, last)] = reader.rows("SELECT toUnixTimestamp(min(first_at)), toUnixTimestamp(max(last_at)) FROM loopscope_sessions "
                                  "HAVING count() > 0") or [(None, None)]
    if first is None or last is None:
        return 60, None
    start = max(first, since_s) if since_s is not None else first
    span = max(0.0, float(last) - float(start))
    width = next((b for b in _BUCKETS if span / b <= _MAX_BUCKETS), _BUCKETS[-1])
    return width, int(start)


def _since_clause(since_s: float | None, column: str, params: dict[str, Any]) -> str:
    if since_s is None:
        return ""
    params["since_us"] = int(since_s * 1_000_000)
    return f"WHERE {column} >= fromUnixTimestamp64Micro({{since_us:Int64}}, 'UTC')"


def _bucketed(column: str) -> str:
    """``column``'s bucket start in ms: buckets of ``{width}`` seconds from ``{start}`` (both bound)."""
    return (f"({{start:Int64}} + intDiv(toUnixTimestamp({column}) - {{start:Int64}}, {{width:Int64}}) * {{width:Int64}}) * 1000")


def tool_analytics(reader: ClickHouseReader, range_: str | None = "all", tool: str | None = None) -> dict[str, Any]:
    since_s = since(range_)
    width, start = _bucket(reader, since_s)
    params: dict[str, Any] = {"width": width, "start": start or 0}
    where = _since_clause(since_s, "started_at", params)
    calls = TOOL_CALLS.format(where=where)
    outcome_counts = ", ".join(f"countIf(outcome = '{o}') AS {o}" for o in OUTCOMES)
    known = ", ".join(f"'{o}'" for o in OUTCOMES)
    per_tool = _records(reader, f"""SELECT tool, count() AS ended, {outcome_counts}, countIf(outcome NOT IN ({known})) AS other,
            quantilesExactInclusive(0.5, 0.95, 0.99)(duration_ms) AS q, max(duration_ms) AS max_ms, avg(duration_ms) AS avg_ms,
            {_MS.format("max(ended_at)")} AS last_seen
        FROM {calls} GROUP BY tool""", params)
    tools = []
    for row in per_tool:
        q = row.pop("q")
        failures = row["ended"] - row["served"]
        tools.append({"tool": row["tool"], "calls": row["ended"], "running": 0, "ended": row["ended"],
                      **{o: row[o] for o in OUTCOMES}, "other": row["other"], "p50_ms": q[0], "p95_ms": q[1],
                      "p99_ms": q[2], "max_ms": row["max_ms"], "avg_ms": row["avg_ms"], "last_seen": row["last_seen"],
                      "failures": failures, "failure_share": failures / row["ended"] if row["ended"] else None})
    tools.sort(key=lambda r: (-r["calls"], r["tool"] or ""))
    one = ""
    if tool is not None:
        params["tool"] = tool
        one = "WHERE tool = {tool:String}"
    over_time = _records(reader, f"""SELECT {_bucketed("ended_at")} AS t, if(outcome = '', 'unknown', outcome) AS outcome,
            count() AS calls FROM {calls} {one} GROUP BY t, outcome ORDER BY t, outcome""", params)
    return {"range": range_ or "all", "tool": tool, "bucket_seconds": width, "tools": tools, "outcomes": list(OUTCOMES),
            "over_time": over_time, "generated_at": now_ms()}


def turn_analytics(reader: ClickHouseReader, range_: str | None = "all") -> dict[str, Any]:
    since_s = since(range_)
    width, start = _bucket(reader, since_s)
    params: dict[str, Any] = {"width": width, "start": start or 0}
    turns = TURNS.format(where=_since_clause(since_s, "timestamp", params))
    calls = "coalesce(model_call_count, 0)"
    unpriced = "if(isNotNull(x.input_tokens) OR isNotNull(x.output_tokens), 1, 0)"
    reasons = _records(reader, f"""SELECT coalesce(loop_end_reason, 'unknown') AS reason, count() AS turns,
        turns / sum(count()) OVER () AS share FROM {turns} AS x GROUP BY reason ORDER BY turns DESC, reason""", params)
    over_time = _records(reader, f"""SELECT {_bucketed("timestamp")} AS t, coalesce(loop_end_reason, 'unknown') AS reason,
            count() AS turns, sum(coalesce(x.input_tokens, 0)) AS input_tokens, sum(coalesce(x.output_tokens, 0)) AS output_tokens,
            quantileExactInclusive(0.95)(latency_ms) AS p95_ms
        FROM {turns} AS x GROUP BY t, reason ORDER BY t, reason""", params)
    models = _records(reader, f"""SELECT coalesce(x.model, '(unknown)') AS model, coalesce(x.provider, '') AS provider,
            count() AS turns, sum(coalesce(x.input_tokens, 0)) AS input_tokens, sum(coalesce(x.output_tokens, 0)) AS output_tokens,
            avg(coalesce(x.input_tokens, 0) + coalesce(x.output_tokens, 0)) AS avg_tokens, sum({calls}) AS model_calls,
            CAST(NULL AS Nullable(Float64)) AS cost_usd, sum({unpriced}) AS unpriced_calls
        FROM {turns} AS x GROUP BY model, provider
        ORDER BY sum(coalesce(x.input_tokens, 0) + coalesce(x.output_tokens, 0)) DESC, model""", params)
    latency = _records(reader, f"""SELECT if(grouping(channel_id) = 1, 'all agents', coalesce(channel_id, '(no agent)')) AS agent,
            count() AS turns, quantileExactInclusive(0.5)(latency_ms) AS p50_ms,
            quantileExactInclusive(0.95)(latency_ms) AS p95_ms, quantileExactInclusive(0.99)(latency_ms) AS p99_ms,
            max(latency_ms) AS max_ms, avg(round_count) AS avg_rounds, avg(tool_calls_count) AS avg_tool_calls,
            avg({calls}) AS avg_model_calls
        FROM {turns} AS x GROUP BY ROLLUP(channel_id) HAVING turns > 0 ORDER BY grouping(channel_id) DESC, turns DESC
        SETTINGS group_by_use_nulls = 1""", params)
    slowest = _records(reader, f"""SELECT correlation_id, session_id, channel_id AS agent, model, loop_end_reason, latency_ms,
            round_count, tool_calls_count, input_tokens, output_tokens, {_MS.format("timestamp")} AS t,
            {calls} AS model_calls, CAST(NULL AS Nullable(Float64)) AS cost_usd, {unpriced} AS unpriced_calls
        FROM {turns} AS x ORDER BY latency_ms DESC LIMIT 10""", params)
    return {"range": range_ or "all", "bucket_seconds": width, "loop_end_reasons": reasons, "over_time": over_time,
            "models": models, "latency": latency, "slowest": slowest, "generated_at": now_ms()}


def declared_vs_used(reader: ClickHouseReader, range_: str | None = "all") -> dict[str, Any]:
    since_s = since(range_)
    params: dict[str, Any] = {}
    turns = TURNS.format(where=_since_clause(since_s, "timestamp", params))
    tool_calls = TOOL_CALLS.format(where=_since_clause(since_s, "started_at", params))
    rows = _records(reader, f"""WITH t AS (SELECT coalesce(channel_id, '') AS agent, declared_tools FROM {turns}),
        agent_turns AS (SELECT agent, count() AS turns FROM t GROUP BY agent),
        declared AS (
            SELECT agent, tool, count() AS turns_declared FROM (
                SELECT agent, arrayJoin(arrayDistinct(arrayFilter(x -> x != '', arrayMap(d -> JSONExtractString(d, 'name'),
                    JSONExtractArrayRaw(declared_tools))))) AS tool FROM t)
            GROUP BY agent, tool),
        used AS (SELECT coalesce(c.agent, '') AS agent, c.tool AS tool, count() AS calls, uniqExact(c.turn_id) AS turns_used
                 FROM {tool_calls} AS c GROUP BY agent, tool),
        joined AS (
            SELECT if(d.tool != '', d.agent, u.agent) AS agent, if(d.tool != '', d.tool, u.tool) AS tool,
                d.turns_declared AS turns_declared, u.calls AS calls, u.turns_used AS turns_used
            FROM declared AS d FULL OUTER JOIN used AS u ON d.agent = u.agent AND d.tool = u.tool
            SETTINGS join_use_nulls = 0)
        SELECT j.agent AS agent, j.tool AS tool, j.turns_declared AS turns_declared, j.calls AS calls,
            j.turns_used AS turns_used, a.turns AS agent_turns
        FROM joined AS j LEFT JOIN agent_turns AS a ON a.agent = j.agent
        ORDER BY agent, calls DESC, turns_declared DESC, tool
        SETTINGS join_use_nulls = 0""", params)
    return declared_page(rows, range_)


__all__ = ["declared_vs_used", "event", "overview", "sessions", "timeline", "tool_analytics", "turn_analytics"]
