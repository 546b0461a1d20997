"""The ClickHouse engine against the DuckDB store at the same size, and what loopscope's views cost an insert.

Issue 34's acceptance: at 10M events, a timeline page, tool statistics and the turns list on chDB
(ClickHouse in this process) and on DuckDB side by side, and the insert rate into ``otel_traces``
with loopscope's materialized views on and without them, in one run, printed as ratios.

The same synthetic agent traffic goes into both engines, generated in SQL (seconds per million rows,
no Python per row): sessions of 50 turns, each turn ten timeline rows (the user's input, three
assistant texts, three tool calls as start and end rows, two of them in parallel), 12 tools, five
agents; sessions start every 130 s and overlap (about 27 at a time). ``--events`` sets the size
(default 10,000,000: 20,000 sessions; rounded to whole sessions of 500 events).

* DuckDB: loopscope's own schema, filled by ``_gen_views_data.py`` (the generator of
  ``bench_views.py``: bulk ``INSERT ... SELECT``, rows in time order, the tool totals the writer
  keeps), read through the public ``loopscope.Store`` (``keep_open=True``, as the dashboard reads).
* chDB: the same turns as the spans loopscope emits (``invoke_agent``, three ``chat``, three
  ``execute_tool`` per turn: seven spans for ten timeline rows), as ``otel_traces`` rows the way the
  Collector's ``clickhouseexporter`` writes them (``otel_rows.py``'s rules: ids in hex, attributes
  as text, the exporter's resource and scope), made with ``INSERT ... SELECT ... FROM numbers()``
  into a staging table first, in time order. Then the same rows go, in time windows of
  ``--batch`` spans (a Collector's batches: every session active then), into ``otel_traces``
  with loopscope's materialized views (``ddl.py``), which fill the derived tables the reads use,
  and again into a copy of ``otel_traces`` with no views: the insert rate each way. Read through
  ``loopscope/storage/clickhouse/queries.py``.

Then, in the same run, each read ``--repeats`` times, the two engines taking turns: the median
latency of a timeline page (50 rows at offset 200 of a session in the middle), tool statistics (all
time: DuckDB's ``tool_stats`` view, which reads the per-tool totals its writer keeps; chDB computes
them from the tool durations table), the newest 50 turns, the 50 most recent sessions, and
``SELECT * FROM tool_stats`` (the SQL view of that name on each engine, every column: what
``loopscope sql`` reads; on chDB a plain view, ``views.py``, over the tool calls read ``FINAL``); printed
side by side with the chDB / DuckDB ratio. The load average is printed before and after (the machine
is shared). Memory is bounded: chDB's ``max_memory_usage`` (``--ch-memory``, default 4 GB), DuckDB's
defaults (the generator's sort is of narrow keys).

It needs chDB: run from any venv, it runs itself again in the ``clickhouse`` stack's venv
(tests/stacks.toml), building that first when missing or stale (unless ``--no-setup``).

    .venv/bin/python benchmarks/bench_clickhouse.py                     # 10M events: ~12 min here, 4.4 GB RSS
    .venv/bin/python benchmarks/bench_clickhouse.py --events 1000000
    .venv/bin/python benchmarks/bench_clickhouse.py --smoke             # tiny: that it runs (CI)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STACK = "clickhouse"
TOOLS = ("search_docs", "fetch_url", "run_sql", "send_email", "get_weather", "book_table",
         "create_ticket", "lookup_user", "calculator", "translate", "summarize", "read_file")
AGENTS = ("concierge", "support", "researcher", "analyst", "scheduler")
MODELS = ("gpt-4o", "claude-sonnet-4", "gpt-4o-mini")
TURNS_PER_SESSION, EVENTS_PER_TURN, SPANS_PER_TURN = 50, 10, 7
PAGE_OFFSET, PAGE = 200, 50


def _in_stack(args: argparse.Namespace) -> None:
    """Run this script again in the clickhouse stack's venv, unless chDB is importable here."""
    try:
        import chdb  # noqa: F401
        return
    except ImportError:
        pass
    sys.path.insert(0, str(ROOT / "tests"))
    import stacks

    stack = stacks.load()[STACK]
    if not stacks.is_built(stack):
        if args.no_setup:
            sys.exit(f"the {STACK} stack ({stack.folder}) is missing or stale: run without --no-setup to build it")
        print(f"building the {STACK} stack (tests/stacks.toml) ...", flush=True)
        stacks.build(stack, say=lambda m: print(f"  {m}", flush=True))
    python = str(stack.executable)
    os.execv(python, [python, str(Path(__file__).resolve()), *sys.argv[1:]])


def _sql_list(values: Sequence[str]) -> str:
    return "[" + ", ".join("'" + v.replace("'", "\\'") + "'" for v in values) + "]"


# -- chDB: the traffic as the exporter's otel_traces rows ------------------------------------------------

def _span_rows_sql(first: int, count: int) -> str:
    """A ``SELECT`` of ``otel_traces`` rows (its columns, in order) for spans ``first`` to
    ``first + count`` of the traffic: span ``n`` is turn ``n // 7``'s span ``n % 7`` (0 its
    ``invoke_agent``, 1, 3 and 5 its ``chat`` rounds, 2 and 4 the two parallel tool calls of the first
    round, 6 the tool call of the second)."""
    from loopscope import semconv as a

    tools, agents, models = _sql_list(TOOLS), _sql_list(AGENTS), _sql_list(MODELS)
    attrs = {  # the attributes each kind of span carries (those a real recording with content has)
        "invoke": f"""map('{a.OPERATION}', 'invoke_agent', '{a.CONVERSATION_ID}', session_id, '{a.TURN_ID}', turn_id,
            '{a.AGENT_NAME}', agent, '{a.TURN_INPUT}', question, '{a.LOOP_END_REASON}', reason,
            '{a.ROUND_COUNT}', '2', '{a.TOOL_CALLS_COUNT}', '3', '{a.STREAMING}', 'false',
            '{a.DECLARED_TOOLS}', declared, '{a.TURN_MODEL}', model, '{a.TURN_PROVIDER}', provider,
            '{a.USAGE_INPUT}', toString(tin), '{a.USAGE_OUTPUT}', toString(tout), '{a.MODEL_CALL_COUNT}', '3',
            '{a.SEGMENTS}', concat('[', toJSONString(text1), ',', toJSONString(text2), ',', toJSONString(text3), ']'),
            'gen_ai.agent.turn.count', '3', 'gen_ai.agent.finish_reason', reason)""",
        "chat": f"""map('{a.OPERATION}', 'chat', '{a.CONVERSATION_ID}', session_id, '{a.TURN_ID}', turn_id,
            '{a.AGENT_NAME}', agent, '{a.REQUEST_MODEL}', model, '{a.RESPONSE_MODEL}', model, '{a.PROVIDER}', provider,
            '{a.CALL_POSITION}', toString(round_no), '{a.USAGE_INPUT}', toString(intDiv(tin, 3)),
            '{a.USAGE_OUTPUT}', toString(intDiv(tout, 3)), '{a.CALL_OUTCOME}', 'completed',
            '{a.RESPONSE_FINISH_REASONS}', if(round_no = 3, '["stop"]', '["tool_calls"]'),
            '{a.ROUND_TEXT}', multiIf(round_no = 1, text1, round_no = 2, text2, text3),
            '{a.INPUT_MESSAGES}', concat('[{{"role":"user","parts":[{{"type":"text","content":', toJSONString(question), '}}]}}]'),
            '{a.OUTPUT_MESSAGES}', concat('[{{"role":"assistant","parts":[{{"type":"text","content":',
                toJSONString(multiIf(round_no = 1, text1, round_no = 2, text2, text3)), '}}]}}]'))""",
        "tool": f"""map('{a.OPERATION}', 'execute_tool', '{a.CONVERSATION_ID}', session_id, '{a.TURN_ID}', turn_id,
            '{a.AGENT_NAME}', agent, '{a.TOOL_NAME}', tool, 'gen_ai.tool.type', 'function', '{a.TOOL_CALL_ID}', call_id,
            '{a.TOOL_CALL_ARGUMENTS}', concat('{{"query":"question ', toString(t), ' of session ', toString(s), '","limit":5}}'),
            '{a.TOOL_CALL_RESULT}', if(outcome = 'served', concat('{{"hits":[{{"title":"result for ', toString(t),
                '","score":0.91}},{{"title":"another","score":0.42}}]}}'), 'null'),
            '{a.TOOL_OUTCOME}', outcome, '{a.TOOL_STATUS}', if(outcome = 'served', 'completed', 'failed'),
            '{a.TOOL_ERROR}', if(outcome = 'failed', 'TimeoutError: upstream did not answer', ''))""",
    }
    return f"""
SELECT fromUnixTimestamp64Nano(start_ns) AS Timestamp, trace_id AS TraceId, span_id AS SpanId,
    if(k = 0, '', root_id) AS ParentSpanId, '' AS TraceState,
    multiIf(k = 0, concat('invoke_agent ', agent), k IN (1, 3, 5), concat('chat ', model), concat('execute_tool ', tool)) AS SpanName,
    if(k IN (1, 3, 5), 'SPAN_KIND_CLIENT', 'SPAN_KIND_INTERNAL') AS SpanKind, 'agents' AS ServiceName,
    map('service.name', 'agents', 'telemetry.sdk.language', 'python', 'telemetry.sdk.name', 'opentelemetry',
        'telemetry.sdk.version', '1.39.0') AS ResourceAttributes,
    'loopscope' AS ScopeName, '0.1.0' AS ScopeVersion,
    multiIf(k = 0, {attrs["invoke"]}, k IN (1, 3, 5), {attrs["chat"]}, {attrs["tool"]}) AS SpanAttributes,
    toUInt64(end_ns - start_ns) AS Duration,
    if(k IN (2, 4, 6) AND outcome = 'failed', 'STATUS_CODE_ERROR', 'STATUS_CODE_UNSET') AS StatusCode,
    if(k IN (2, 4, 6) AND outcome = 'failed', 'TimeoutError: upstream did not answer', '') AS StatusMessage,
    CAST([] AS Array(DateTime64(9))) AS `Events.Timestamp`, CAST([] AS Array(LowCardinality(String))) AS `Events.Name`,
    CAST([] AS Array(Map(LowCardinality(String), String))) AS `Events.Attributes`,
    CAST([] AS Array(String)) AS `Links.TraceId`, CAST([] AS Array(String)) AS `Links.SpanId`,
    CAST([] AS Array(String)) AS `Links.TraceState`, CAST([] AS Array(Map(LowCardinality(String), String))) AS `Links.Attributes`
FROM (
    SELECT *,
        {tools}[tool_i + 1] AS tool,
        round(exp((cityHash64('ms', s, t, c) % 1000) / 1000.0 * 6.0) * (1 + tool_i / 4.0), 3) AS ms,
        multiIf(o < 900, 'served', o < 950, 'failed', o < 970, 'refused', o < 980, 'unserved', o < 990, 'blocked',
                'cancelled') AS outcome,
        -- times in ns: the turn at t0; round 1 0.001-0.4 s; its two tools from 0.5 s; round 2 2.1-2.5 s;
        -- its tool from 2.6 s; round 3 4.2-4.6 s; the turn ends at 4.65 s
        t0 + multiIf(k = 0, 0, k = 1, 1000000, k = 2, 500000000, k = 3, 2100000000, k = 4, 501000000, k = 5, 4200000000,
                     2600000000) AS start_ns,
        multiIf(k = 0, t0 + 4650000000, k = 1, t0 + 400000000, k = 3, t0 + 2500000000, k = 5, t0 + 4600000000,
                start_ns + toInt64(ms * 1000000)) AS end_ns
    FROM (
        SELECT number AS n, intDiv(n, {SPANS_PER_TURN}) AS turn, n % {SPANS_PER_TURN} AS k,
            intDiv(turn, {TURNS_PER_SESSION}) AS s, turn % {TURNS_PER_SESSION} AS t,
            lower(hex(MD5(concat('session-', toString(s))))) AS session_id,
            lower(hex(MD5(concat('turn-', toString(s), '-', toString(t))))) AS turn_id,
            lower(hex(MD5(concat('trace-', toString(s), '-', toString(t))))) AS trace_id,
            substring(lower(hex(MD5(concat('span-', toString(s), '-', toString(t), '-', toString(k))))), 1, 16) AS span_id,
            substring(lower(hex(MD5(concat('span-', toString(s), '-', toString(t), '-0')))), 1, 16) AS root_id,
            toUInt32(cityHash64('agent', s) % {len(AGENTS)}) AS ai, {agents}[ai + 1] AS agent,
            {models}[(ai % {len(MODELS)}) + 1] AS model, if(ai % 3 = 1, 'anthropic', 'openai') AS provider,
            multiIf(k = 2, 0, k = 4, 1, 2) AS c, if(k = 1, 1, if(k = 3, 2, 3)) AS round_no,
            toUInt32((ai * 2 + cityHash64(s, t, c) % 4) % {len(TOOLS)}) AS tool_i,
            toUInt32(cityHash64('outcome', s, t, c) % 1000) AS o,
            concat('call_', toString(s), '_', toString(t), '_', toString(c)) AS call_id,
            toInt64(1735689600000000000) + toInt64(s) * 130000000000 + toInt64(cityHash64(s) % 60000000) * 1000
                + toInt64(t) * 70000000000 + toInt64(cityHash64(s, t) % 300000) * 1000 AS t0,
            concat('Question ', toString(t), ': could you look into order ', toString(cityHash64(s, t) % 100000),
                   ' and tell me what happened?') AS question,
            'Let me check that with a tool; one moment while I look it up.' AS text1,
            'Let me check that with a tool; one moment while I look it up.' AS text2,
            concat('Here is what I found: the order ', toString(cityHash64(s, t) % 100000),
                   ' shipped on time and should arrive tomorrow.') AS text3,
            toUInt32(cityHash64('reason', s, t) % 1000) AS r,
            multiIf(r < 850, 'completed', r < 900, 'max_rounds', r < 930, 'error', r < 950, 'timeout', r < 970, 'truncated',
                    r < 980, 'unfinished', r < 990, 'cancelled', 'budget_exceeded') AS reason,
            1000 + cityHash64('in', s, t) % 9000 AS tin, 50 + cityHash64('out', s, t) % 900 AS tout,
            concat('[', arrayStringConcat(arrayMap(j -> concat('{{"name":"', {tools}[((ai * 2 + j) % {len(TOOLS)}) + 1],
                '","parameters":{{"type":"object","properties":{{"query":{{"type":"string"}}}}}},"origin":"always"}}'),
                range(6)), ','), ']') AS declared
        FROM numbers({int(first)}, {int(count)})
    )
)"""


class Chdb:
    """A chDB session on a folder, memory bounded, with loopscope's schema."""

    def __init__(self, folder: Path, memory: int) -> None:
        from chdb import session

        self.session = session.Session(str(folder))
        for setting in (f"max_memory_usage = {int(memory)}", "max_threads = 2", "max_insert_threads = 1",
                        "max_block_size = 16384", "max_insert_block_size = 65536", "min_insert_block_size_rows = 65536",
                        "session_timezone = 'UTC'"):
            self.session.query(f"SET {setting}")

    def run(self, sql: str, params: Mapping[str, Any] | None = None) -> Sequence[Sequence[Any]]:
        text = self.session.query(sql, "JSONCompact", params=dict(params or {})).bytes().decode()
        return json.loads(text)["data"] if text.strip() else []

    def value(self, sql: str) -> Any:
        rows = self.run(sql)
        return rows[0][0] if rows else None

    def close(self) -> None:
        self.session.close()


def load_chdb(ch: Chdb, spans: int, batch: int, log: Callable[[str], None]) -> dict[str, float]:
    """Stage the spans, then insert them into ``otel_traces`` (views on) and into a copy without
    views, in the same time windows; the seconds and rows of each."""
    from loopscope.storage.clickhouse import ddl

    version = str(ch.value("SELECT version()"))
    ddl.create(ch.run, version)
    ch.run(ddl.otel_traces(table="otel_staging"))
    ch.run(ddl.otel_traces(table="otel_traces_plain"))  # the same table, no view reads it
    t0 = time.perf_counter()
    step = 500_000
    for first in range(0, spans, step):
        ch.run(f"INSERT INTO otel_staging {_span_rows_sql(first, min(step, spans - first))}")
    staged = time.perf_counter() - t0
    lo, hi = (int(v) for v in ch.run("SELECT toUnixTimestamp64Nano(min(Timestamp)), "
                                     "toUnixTimestamp64Nano(max(Timestamp)) + 1 FROM otel_staging")[0])
    windows = max(1, -(-spans // batch))
    width = -(-(hi - lo) // windows)
    log(f"  chDB: {spans:,} spans staged in {staged:.1f} s; inserting them in {windows} time windows of ~{batch:,} spans")
    timed = {}
    for table in ("otel_traces", "otel_traces_plain"):
        t0 = time.perf_counter()
        for w in range(windows):
            ch.run(f"INSERT INTO {table} SELECT * FROM otel_staging WHERE Timestamp >= fromUnixTimestamp64Nano("
                   f"toInt64({lo + w * width})) AND Timestamp < fromUnixTimestamp64Nano(toInt64({lo + (w + 1) * width}))")
        timed[table] = time.perf_counter() - t0
        log(f"  chDB: into {table}: {timed[table]:.1f} s")
    rows = {t: int(ch.value(f"SELECT count() FROM {t}")) for t in ("otel_staging", "otel_traces", "otel_traces_plain")}
    if len(set(rows.values())) != 1 or rows["otel_traces"] != spans:
        raise SystemExit(f"the inserts lost rows: {rows} (expected {spans:,} each)")
    ch.run("DROP TABLE otel_staging SYNC")
    ch.run("DROP TABLE otel_traces_plain SYNC")
    return {"staged_s": staged, "views_on_s": timed["otel_traces"], "views_off_s": timed["otel_traces_plain"]}


def settle(ch: Chdb, most: float) -> float:
    """Wait (at most ``most`` s) for the background merges the inserts started, so that the reads
    find the steady state a long-running server has rather than the merges' CPU; the seconds
    waited, or -1 when they were still running."""
    t0 = time.perf_counter()
    while int(ch.value("SELECT count() FROM system.merges") or 0):
        if time.perf_counter() - t0 > most:
            return -1.0
        time.sleep(0.5)
    return time.perf_counter() - t0


# -- DuckDB: loopscope's own schema -------------------------------------------------------------------

def load_duckdb(path: Path, sessions: int, log: Callable[[str], None]) -> float:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _gen_views_data import generate

    t0 = time.perf_counter()
    generate(str(path), sessions, log=lambda line: log(f"  DuckDB:{line}"))
    return time.perf_counter() - t0


# -- the reads --------------------------------------------------------------------------------------

def reads(store: Any, con: Any, ch: Chdb, session: str) -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
    """Each read as (DuckDB's, chDB's): what the CLI and dashboard ask. DuckDB's through the public
    ``Store`` (the file kept attached, as the dashboard reads), its ``tool_stats`` view as raw SQL on a
    read-only connection kept open (``Store.sql`` opens a fresh isolated one per call, which would
    time the attach too)."""
    from loopscope.storage.clickhouse import queries

    return {
        "timeline page": (lambda: store.get_timeline(session, PAGE_OFFSET, PAGE),
                          lambda: queries.timeline_page(ch.run, session, PAGE_OFFSET, PAGE)),
        "tool stats": (lambda: con.execute("SELECT tool, finished, finished - served, p50_ms, p95_ms FROM tool_stats").fetchall(),
                       lambda: queries.tool_stats(ch.run)),
        "turns list": (lambda: store.list_turns(limit=PAGE, newest_first=True),
                       lambda: queries.turns_list(ch.run, PAGE)),
        "sessions list": (lambda: store.list_sessions(PAGE), lambda: queries.sessions(ch.run, PAGE)),
        # the SQL view of that name on each engine, every column (what `loopscope sql` reads)
        "tool_stats view": (lambda: con.execute("SELECT * FROM tool_stats").fetchall(),
                            lambda: ch.run("SELECT * FROM tool_stats")),
    }


def time_reads(store: Any, con: Any, ch: Chdb, session: str,
               repeats: int) -> dict[str, tuple[list[float], list[float], int, int]]:
    out = {}
    for name, (duck, click) in reads(store, con, ch, session).items():
        got = (len(duck()), len(click()))  # warm: the file attached, the parts' marks loaded
        times: tuple[list[float], list[float]] = ([], [])
        for i in range(repeats):  # the engines take turns, the first alternating: load hits both alike
            order = ((0, duck), (1, click)) if i % 2 == 0 else ((1, click), (0, duck))
            for which, read in order:
                t0 = time.perf_counter()
                read()
                times[which].append(time.perf_counter() - t0)
        out[name] = (times[0], times[1], *got)
    return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.2f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=10_000_000, help="timeline rows (default 10M; 500 a session)")
    parser.add_argument("--repeats", type=int, default=15, help="reads of each query per engine (medians quoted)")
    parser.add_argument("--batch", type=int, default=100_000, help="spans per insert into otel_traces (a Collector's batch)")
    parser.add_argument("--ch-memory", type=float, default=4.0, help="chDB's max_memory_usage in GB")
    parser.add_argument("--folder", type=Path, help="where both stores go (default: a temporary folder, removed after)")
    parser.add_argument("--no-setup", action="store_true", help="do not build the clickhouse stack's venv")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks that it runs, measures nothing")
    args = parser.parse_args()
    _in_stack(args)
    if args.smoke:
        args.events, args.repeats, args.batch = 2 * TURNS_PER_SESSION * EVENTS_PER_TURN, 2, 200
    sessions = max(1, args.events // (TURNS_PER_SESSION * EVENTS_PER_TURN))
    turns = sessions * TURNS_PER_SESSION
    events, spans = turns * EVENTS_PER_TURN, turns * SPANS_PER_TURN
    folder = args.folder or Path(tempfile.mkdtemp(prefix="loopscope-bench-ch-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        return run(args, folder, sessions, events, spans)
    finally:
        if args.folder is None:
            shutil.rmtree(folder, ignore_errors=True)


def run(args: argparse.Namespace, folder: Path, sessions: int, events: int, spans: int) -> int:
    import chdb
    import duckdb

    import loopscope

    def log(line: str) -> None:
        print(line, flush=True)

    log(f"Python {sys.version.split()[0]}, DuckDB {duckdb.__version__}, chDB {chdb.__version__}; {os.cpu_count()} cores; "
        f"load average {os.getloadavg()[0]:.1f} (shared machine)")
    log(f"{events:,} events: {sessions:,} sessions x {TURNS_PER_SESSION} turns x {EVENTS_PER_TURN} timeline rows "
        f"({spans:,} spans for chDB); reads repeated {args.repeats}x")
    duck_path = folder / "bench.duckdb"
    duck_s = load_duckdb(duck_path, sessions, log)
    ch = Chdb(folder / "chdb", int(args.ch_memory * 1e9))
    try:
        log(f"  chDB: ClickHouse {ch.value('SELECT version()')}, max_memory_usage {args.ch_memory:g} GB, max_threads 2")
        loaded = load_chdb(ch, spans, args.batch, log)
        counts = {t: int(ch.value(f"SELECT count() FROM {t} FINAL")) for t in
                  ("loopscope_events", "loopscope_turns", "loopscope_tool_durations")}
        if counts["loopscope_events"] != events or counts["loopscope_turns"] != sessions * TURNS_PER_SESSION:
            raise SystemExit(f"chDB's derived tables hold {counts}, expected {events:,} events")
        settled = settle(ch, 120.0)
        parts = {str(r[0]): int(r[1]) for r in ch.run(
            "SELECT table, count() FROM system.parts WHERE active AND database = currentDatabase() GROUP BY table")}
        log(f"  chDB: background merges {'done' if settled >= 0 else 'still running after 120 s'}"
            f"{f' after {settled:.0f} s' if settled > 0 else ''}; active parts: "
            + ", ".join(f"{t} {n}" for t, n in sorted(parts.items())))
        session = str(duckdb.connect(":memory:").execute(f"SELECT md5('session-{sessions // 2}')").fetchone()[0])
        store = loopscope.Store(str(duck_path), keep_open=True)
        con = duckdb.connect(str(duck_path), read_only=True)
        load_before = os.getloadavg()[0]
        try:
            timed = time_reads(store, con, ch, session, args.repeats)
        finally:
            con.close()
        load_after = os.getloadavg()[0]
    finally:
        ch.close()
    chdb_bytes = sum(p.stat().st_size for p in (folder / "chdb").rglob("*") if p.is_file())
    log(f"\nLoaded: DuckDB {duck_s:.1f} s (generated in SQL, {duck_path.stat().st_size / 1e9:.2f} GB); chDB staged "
        f"{loaded['staged_s']:.1f} s, {chdb_bytes / 1e9:.2f} GB with the derived tables")
    on, off = spans / loaded["views_on_s"], spans / loaded["views_off_s"]
    log("\nInsert into otel_traces, the same rows in the same batches:")
    log(f"  views on   {loaded['views_on_s']:8.1f} s  {on:12,.0f} spans/s  (the derived tables filled as they land)")
    log(f"  views off  {loaded['views_off_s']:8.1f} s  {off:12,.0f} spans/s  (a copy of otel_traces, no view reads it)")
    log(f"  views on / off rate: {on / off:.2f}x")
    log(f"\nReads, median of {args.repeats} (load average {load_before:.1f} before, {load_after:.1f} after; "
        f"a session in the middle: {session}):")
    log(f"  {'read':<15} {'DuckDB':>12} {'chDB':>12} {'chDB/DuckDB':>12}  rows (DuckDB, chDB)")
    for name, (duck, click, duck_rows, ch_rows) in timed.items():
        d, c = statistics.median(duck), statistics.median(click)
        log(f"  {name:<15} {_ms(d):>12} {_ms(c):>12} {c / d:>11.2f}x  {duck_rows}, {ch_rows}")
    log(f"\npeak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
