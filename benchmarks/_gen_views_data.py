"""Generate a large loopscope store with SQL alone (used by bench_views.py).

10 million events across 20 000 sessions by default: every session runs 50 turns of 10
events (the user's message, three assistant text segments, three tool calls as start and
end rows, two of them in parallel), and one turn summary per turn. Sessions start every
130 s over a month and overlap (about 27 at a time), and the rows are written in time
order, as a writer would write them: the sessions are interleaved in the file. Session
ids are random-looking hex, so row groups cannot be skipped by session id ranges.

Everything derives from hashes of the (session, turn, event) numbers, so two runs give
the same file.
"""

from __future__ import annotations

import time

import duckdb

from loopscope.storage.duckdb import tool_totals
from loopscope.storage.duckdb.schema import migrate
from loopscope.storage.duckdb.views import tool_rows
from loopscope.storage.rows import EVENT_COLUMNS

TOOLS = [
    "search_docs", "fetch_url", "run_sql", "send_email", "get_weather", "book_table",
    "create_ticket", "lookup_user", "calculator", "translate", "summarize", "read_file",
]
AGENTS = ["concierge", "support", "researcher", "analyst", "scheduler"]
MODELS = ["gpt-4o", "claude-sonnet-4", "gpt-4o-mini"]
EVENTS_PER_TURN = 10
TURNS_PER_SESSION = 50


def _declared_json(agent: int) -> str:
    """The tools an agent declares: six of the pool, with a description and parameters."""
    import json

    tools = []
    for j in range(6):
        name = TOOLS[(agent * 2 + j) % len(TOOLS)]
        tools.append({
            "name": name,
            "description": f"{name.replace('_', ' ').capitalize()} for the user.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}}, "required": ["query"]},
            "origin": "always",
        })
    return json.dumps(tools)


def generate(path: str, sessions: int = 20_000, *, log=print) -> None:
    t0 = time.perf_counter()
    con = duckdb.connect(path)
    try:
        migrate(con)
        con.execute("SET preserve_insertion_order = true")
        con.execute("SET enable_progress_bar = false")
        tools, agents = _list_sql(TOOLS), _list_sql(AGENTS)
        declared = _list_sql([_declared_json(a) for a in range(len(AGENTS))])
        # the keys, sorted by time: narrow rows, so the sort is cheap
        con.execute(
            f"""CREATE TEMP TABLE keys AS
            SELECT s, t, k, ts FROM (
                SELECT s, t, k,
                  TIMESTAMPTZ '2025-01-01 00:00:00+00'
                    + to_microseconds(s * 130000000 + (hash(s) % 60000000)::BIGINT + t * 70000000 + k * 400000
                                      + (hash(s, t) % 300000)::BIGINT) AS ts
                FROM range({sessions}) a(s), range({TURNS_PER_SESSION}) b(t), range({EVENTS_PER_TURN}) c(k)
            ) ORDER BY ts"""
        )
        log(f"  keys sorted in {time.perf_counter() - t0:.1f}s")
        # no joins from here on: a join would give up the time order of the keys
        con.execute("BEGIN TRANSACTION")
        con.execute(
            f"""INSERT INTO events ({", ".join(EVENT_COLUMNS)})
            WITH e AS (
                SELECT s, t, k, ts, md5('session-' || s) AS session_id, (hash('agent', s) % {len(AGENTS)})::INTEGER AS a,
                  -- the call each tool row belongs to: A (k 2, 4), B (k 3, 5), C (k 7, 8)
                  CASE WHEN k IN (2, 4) THEN 0 WHEN k IN (3, 5) THEN 1 WHEN k IN (7, 8) THEN 2 END AS c,
                  md5('turn-' || s || '-' || t) AS turn
                FROM keys
            ), f AS (
                SELECT *,
                  -- each agent calls four of its six tools; the last two are declared but never used
                  ((a * 2 + hash(s, t, c) % 4) % {len(TOOLS)})::INTEGER AS tool_i,
                  (hash('outcome', s, t, c) % 1000)::INTEGER AS o,
                  round(exp((hash('ms', s, t, c) % 1000) / 1000.0 * 6.0) * (1 + ((a * 2 + hash(s, t, c) % 4) % {len(TOOLS)}) / 4.0), 3) AS ms
                FROM e
            ), g AS (
                SELECT *, CASE WHEN o < 900 THEN 'served' WHEN o < 950 THEN 'failed' WHEN o < 970 THEN 'refused'
                               WHEN o < 980 THEN 'unserved' WHEN o < 990 THEN 'blocked' ELSE 'cancelled' END AS outcome,
                  '{{"type":"tool_call","tool_name":"' || {tools}[tool_i + 1] || '","tool_id":"call_' || s || '_' || t || '_' || c
                    || '","arguments":{{"query": "question ' || t || ' of session ' || s || '", "limit": 5}}' AS head
                FROM f
            )
            SELECT md5('trace-' || s || '-' || t) || substr(md5('span-' || s || '-' || t || '-' || coalesce(c, k)), 1, 16)
                     || CASE WHEN k IN (2, 3, 7) THEN 's' WHEN k IN (4, 5, 8) THEN 'e' WHEN k = 0 THEN 'i' ELSE 'm' END,
              session_id,
              t * {EVENTS_PER_TURN} + k + 1,
              CASE WHEN k IN (2, 3, 7) THEN 'tool_call_start' WHEN k IN (4, 5, 8) THEN 'tool_call_end' ELSE 'message' END,
              ts, turn, {agents}[a + 1],
              CASE WHEN k IN (0, 1, 6, 9) THEN CASE WHEN a % 3 = 1 THEN 'anthropic' ELSE 'openai' END END,
              NULL, 'delivered',
              CASE
                WHEN k = 0 THEN '{{"type":"text","body":"Question ' || t || ': could you look into order ' || (hash(s, t) % 100000) || ' and tell me what happened?","role":"user"}}'
                WHEN k IN (1, 6) THEN '{{"type":"text","body":"Let me check that with a tool; one moment while I look it up.","role":"assistant"}}'
                WHEN k = 9 THEN '{{"type":"text","body":"Here is what I found: the order ' || (hash(s, t) % 100000) || ' shipped on time and should arrive tomorrow.","role":"assistant"}}'
                WHEN k IN (2, 3, 7) THEN head || ',"result":null,"status":"pending","outcome":null,"duration_ms":null,"error":null}}'
                ELSE head || ',"result":' || CASE WHEN outcome = 'served' THEN '{{"hits": [{{"title": "result for ' || t || '", "score": 0.91}}, {{"title": "another", "score": 0.42}}]}}' ELSE 'null' END
                  || ',"status":"' || CASE WHEN outcome = 'served' THEN 'completed' ELSE 'failed' END
                  || '","outcome":"' || outcome || '","duration_ms":' || ms
                  || ',"error":' || CASE WHEN outcome = 'failed' THEN '"TimeoutError: upstream did not answer"' ELSE 'null' END || '}}'
              END,
              md5('trace-' || s || '-' || t),
              substr(md5('span-' || s || '-' || t || '-' || coalesce(c, k)), 1, 16),
              -- the tool columns, as the writer fills them
              CASE WHEN c IS NOT NULL THEN {tools}[tool_i + 1] END,
              CASE WHEN c IS NOT NULL THEN 'call_' || s || '_' || t || '_' || c END,
              CASE WHEN k IN (2, 3, 7) THEN 'pending' WHEN k IN (4, 5, 8) THEN CASE WHEN outcome = 'served' THEN 'completed' ELSE 'failed' END END,
              CASE WHEN k IN (4, 5, 8) THEN outcome END,
              CASE WHEN k IN (4, 5, 8) THEN ms END
            FROM g"""
        )
        log(f"  events written in {time.perf_counter() - t0:.1f}s")
        con.execute(
            f"""INSERT INTO turns
            WITH x AS (
                SELECT s, t, md5('session-' || s) AS session_id, (hash('agent', s) % {len(AGENTS)})::INTEGER AS a,
                  md5('turn-' || s || '-' || t) AS turn,
                  TIMESTAMPTZ '2025-01-01 00:00:00+00'
                    + to_microseconds(s * 130000000 + (hash(s) % 60000000)::BIGINT + t * 70000000 + 9 * 400000
                                      + (hash(s, t) % 300000)::BIGINT + 50000) AS ended,
                  (hash('reason', s, t) % 1000)::INTEGER AS r,
                  (1000 + hash('in', s, t) % 9000)::BIGINT AS tin,
                  (50 + hash('out', s, t) % 900)::BIGINT AS tout
                FROM range({sessions}) a(s), range({TURNS_PER_SESSION}) b(t)
            )
            SELECT turn, session_id, {agents}[a + 1], NULL,
              'Let me check that with a tool; one moment while I look it up.\n\nHere is what I found.',
              '["Let me check that with a tool; one moment while I look it up.", "Here is what I found."]',
              3, 3,
              '{{"input_tokens":' || tin || ',"output_tokens":' || tout
                || CASE WHEN a % 3 = 1 THEN ',"cache_read_input_tokens":' || (tin // 2) ELSE '' END
                || CASE WHEN a = 0 THEN ',"reasoning_tokens":' || (tout // 3) ELSE '' END || '}}',
              tin, tout, '',
              CASE WHEN r < 850 THEN 'completed' WHEN r < 900 THEN 'max_rounds' WHEN r < 930 THEN 'error'
                   WHEN r < 950 THEN 'timeout' WHEN r < 970 THEN 'truncated' WHEN r < 980 THEN 'unfinished'
                   WHEN r < 990 THEN 'cancelled' ELSE 'budget_exceeded' END,
              3600.0 + (hash('lat', s, t) % 4000000) / 1000.0, false, ended,
              {declared}[a + 1],
              {_list_sql(MODELS)}[(a % {len(MODELS)}) + 1], CASE WHEN a % 3 = 1 THEN 'anthropic' ELSE 'openai' END,
              CASE WHEN r >= 900 AND r < 930 THEN 'RateLimitError: slow down' END,
              md5('trace-' || s || '-' || t), substr(md5('span-' || s || '-' || t || '-turn'), 1, 16),
              -- model_call_count, cost_usd, price_source (m009_model_calls): turns of a writer
              -- without model call rows, priced from their own usage
              3, round((tin * 2.5 + tout * 10.0) / 1e6, 6), 'genai-prices'
            FROM x ORDER BY ended"""
        )
        con.execute(
            """INSERT INTO sessions
            SELECT session_id, max(idx), min(created_at), max(created_at) FROM events GROUP BY session_id"""
        )
        # tool_stats's per-tool totals, as the writer keeps them with its rows
        for statement in tool_totals.batch_statements(tool_rows(tool_columns=True)):
            con.execute(statement)
        con.execute("COMMIT")
        con.execute("CHECKPOINT")
        log(f"  generated in {time.perf_counter() - t0:.1f}s")
    finally:
        con.close()


def _list_sql(values: list[str]) -> str:
    return "[" + ", ".join("'" + v.replace("'", "''") + "'" for v in values) + "]"
