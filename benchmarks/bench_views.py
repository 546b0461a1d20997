"""Reads of a big store: a timeline page, the tool_stats view and the dashboard's first page,
each against a plain DuckDB scan of the same data.

The store: 10 million events across 20 000 sessions (500 events each: 50 turns of a user
message, three text segments and three tool calls), 1 million turn summaries, written in
time order with the sessions interleaved, as a writer appends them (see
``_gen_views_data.py``; generated with SQL in about two minutes, then cached under
``benchmarks/.data/`` and reused).

Timed, as medians, the variants of one measurement interleaved so that they share the
machine's noise:

* **timeline page** -- ``Store.list_events(session, limit=50, newest_first=True)`` for
  random sessions: what a reader in another process pays, the file's attach and detach
  included; and the same with ``Store(keep_open=True)`` (as the dashboard reads: the file
  stays attached between reads that follow each other closely). Against: the plain query ``SELECT * FROM events WHERE session_id = ? ORDER BY
  idx DESC LIMIT 50`` on a connection kept open (the baseline); and, timed apart, the same
  query starting a DuckDB database of its own each time (how ``Store`` read before).
  With ``--against DIR``, the plain ``Store`` page of this checkout and of another one (a
  folder holding ``loopscope/``), each in a worker process of its own, in the same
  interleaved run: a reader in another process, as the application's would be; each
  worker's own CPU (all its threads) is counted.
  Where a plain ``Store``'s page goes, in the same interleaved run: the file's attach and
  detach alone (an empty read), and the page query bounded by the session's span (as
  ``Store`` runs it) on the connection kept open: the query's own floor.
* **tool_stats** -- ``SELECT * FROM tool_stats`` on an open connection (DuckDB's buffers
  warm, as the baseline's), and through ``Store.sql`` (a database of its own per call, so
  the file's blocks are read and decompressed again each time); the view reads the
  per-tool totals the writers keep (``m010_tool_totals``). Side by side, the view as it
  was before them, computed from ``events`` alone. Against: a GROUP BY over the raw ``events`` table computing the same
  per-tool numbers from the tool end rows' JSON. For reference, the same statistics over
  the tool fields stored as plain columns (a side table made once in the cached file):
  what the view would cost if the writer stored them as columns.
* **dashboard first page** -- ``loopscope.dashboards.web.api.overview(store)`` when that
  module is importable. Against: the same totals, loop end reasons and recent sessions
  scanned from the raw event log on an open connection.

Goals (issue 19): timeline page under 10 ms, tool_stats under 100 ms, the dashboard's first page under 1 s.

    .venv/bin/python benchmarks/bench_views.py [--sessions N] [--pages N] [--repeats R] [--regenerate] [--data DIR] [--against DIR] [--smoke]

``--smoke`` runs every measurement once on a store of a few sessions made in a temporary
folder: it checks that the script runs, and measures nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _gen_views_data import EVENTS_PER_TURN, TURNS_PER_SESSION, generate

import loopscope
from loopscope.storage.duckdb.schema import SCHEMA_VERSION, migrate, schema_version
from loopscope.storage.duckdb.views import create_statements, views

DATA = Path(__file__).resolve().parent / ".data"
TIMELINE_GOAL_MS = 10.0
TOOL_STATS_GOAL_S = 0.1
DASHBOARD_GOAL_S = 1.0

PLAIN_PAGE = "SELECT * FROM events WHERE session_id = ? ORDER BY idx DESC LIMIT 50"
SPAN_PAGE = "SELECT * FROM events WHERE session_id = ? AND created_at BETWEEN ? AND ? ORDER BY idx DESC LIMIT 50"
PLAIN_TOOL_STATS = """
SELECT tool, count(*) AS finished,
    count(*) FILTER (WHERE outcome = 'served') AS served,
    count(*) FILTER (WHERE outcome = 'failed') AS failed,
    count(*) FILTER (WHERE outcome = 'refused') AS refused,
    count(*) FILTER (WHERE outcome = 'blocked') AS blocked,
    count(*) FILTER (WHERE outcome = 'unserved') AS unserved,
    count(*) FILTER (WHERE outcome = 'cancelled') AS cancelled,
    avg(duration_ms) AS avg_ms, quantile_cont(duration_ms, [0.5, 0.95, 0.99]) AS q, max(duration_ms) AS max_ms,
    max(created_at) AS last_seen
FROM (
    SELECT content->>'$.tool_name' AS tool, content->>'$.outcome' AS outcome,
        TRY_CAST(content->>'$.duration_ms' AS DOUBLE) AS duration_ms, created_at
    FROM events WHERE type = 'tool_call_end'
)
GROUP BY tool
"""
COLUMNS_TOOL_STATS = """
SELECT tool_name AS tool,
    count(*) FILTER (WHERE type = 'tool_call_start') AS started,
    count(*) FILTER (WHERE type = 'tool_call_end') AS finished,
    count(*) FILTER (WHERE outcome = 'served') AS served,
    count(*) FILTER (WHERE outcome = 'failed') AS failed,
    count(*) FILTER (WHERE outcome = 'refused') AS refused,
    count(*) FILTER (WHERE outcome = 'blocked') AS blocked,
    count(*) FILTER (WHERE outcome = 'unserved') AS unserved,
    count(*) FILTER (WHERE outcome = 'cancelled') AS cancelled,
    avg(duration_ms) AS avg_ms, quantile_cont(duration_ms, [0.5, 0.95, 0.99]) AS q, max(duration_ms) AS max_ms,
    count(DISTINCT agent) AS agents, min(created_at) AS first_seen, max(created_at) AS last_seen
FROM bench_tool_columns
GROUP BY tool_name
"""
PLAIN_OVERVIEW = [
    "SELECT count(DISTINCT session_id) AS sessions, count(*) AS events, max(created_at) AS last_at FROM events",
    """SELECT count(*) AS turns, sum(tool_calls_count), sum(input_tokens), sum(output_tokens),
              quantile_cont(latency_ms, 0.5), quantile_cont(latency_ms, 0.95) FROM turns""",
    "SELECT coalesce(loop_end_reason, 'unknown') AS reason, count(*) FROM turns GROUP BY 1 ORDER BY 2 DESC",
    """SELECT session_id, count(*) AS events, min(created_at), max(created_at) AS last_at FROM events
       GROUP BY session_id ORDER BY last_at DESC LIMIT 50""",
]


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(fn: Callable[[], Any]) -> tuple[float, float]:
    """Wall and CPU seconds of one call (CPU of every thread of the process)."""
    c0, t0 = cpu(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, cpu() - c0


def prepare(sessions: int, regenerate: bool, data: Path = DATA) -> Path:
    """The cached store, generated first if missing (or asked to), brought up to date."""
    data.mkdir(exist_ok=True)
    path = data / f"views-{sessions}.duckdb"
    if regenerate and path.exists():
        path.unlink()
    if not path.exists():
        print(f"Generating {sessions * TURNS_PER_SESSION * EVENTS_PER_TURN:,} events in {path} (once; reused later) ...")
        partial = path.with_suffix(".partial")
        for leftover in (partial, Path(f"{partial}.wal")):
            if leftover.exists():
                leftover.unlink()
        generate(str(partial), sessions, log=lambda line: print(line, flush=True))
        partial.rename(path)
    con = duckdb.connect(str(path))
    try:
        con.execute("SET enable_progress_bar = false")
        if schema_version(con) < SCHEMA_VERSION:
            t0 = time.perf_counter()
            found = migrate(con)
            print(f"Migrated the store from schema {found} to {SCHEMA_VERSION} in {time.perf_counter() - t0:.1f} s", flush=True)
        for statement in create_statements():  # the views as this checkout defines them
            con.execute(statement)
        tables = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        if "bench_tool_columns" not in tables:
            print("Making the side table of tool fields as columns (once) ...", flush=True)
            con.execute(
                """CREATE TABLE bench_tool_columns AS
                SELECT session_id, type, created_at, source_channel_id AS agent,
                    content->>'$.tool_name' AS tool_name, content->>'$.outcome' AS outcome,
                    TRY_CAST(content->>'$.duration_ms' AS DOUBLE) AS duration_ms
                FROM events WHERE type IN ('tool_call_start', 'tool_call_end')"""
            )
        events = con.execute("SELECT count(*) FROM events").fetchone()[0]
        n_sessions = con.execute("SELECT count(*) FROM sessions").fetchone()[0]
    finally:
        con.close()
    print(f"Store: {path} ({os.path.getsize(path) / 1e9:.2f} GB, {events:,} events, {n_sessions:,} sessions)")
    return path


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1000:,.2f} ms"


CPU_MEDIANS: dict[str, float] = {}
"""Each variant's median CPU seconds, as :func:`report` printed it (for the goal lines)."""


def report(title: str, rows: list[tuple[str, list[tuple[float, float]]]], base: str) -> dict[str, float]:
    """Print medians (wall and CPU), ratio to the baseline; returns the wall medians."""
    medians = {name: statistics.median(w for w, _ in samples) for name, samples in rows}
    CPU_MEDIANS.update({name: statistics.median(c for _, c in samples) for name, samples in rows})
    print(f"\n{title}")
    print(f"  {'variant':<56} {'median wall':>14} {'median cpu':>14} {'vs baseline':>12}")
    for name, samples in rows:
        wall = medians[name]
        cpu_time = statistics.median(c for _, c in samples)
        ratio = f"{wall / medians[base]:.2f}x" if medians[base] else ""
        print(f"  {name:<56} {fmt_ms(wall):>14} {fmt_ms(cpu_time):>14} {ratio:>12}")
    return medians


# a plain Store's pages in a process of its own: a session id a line in, its wall and CPU
# seconds (every thread of the process) and the page's last index and first id out
_PAGE_WORKER = """
import json, resource, sys, time
import loopscope

store = loopscope.Store(sys.argv[1])
print(json.dumps(loopscope.__file__), flush=True)
for line in sys.stdin:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    c0, t0 = usage.ru_utime + usage.ru_stime, time.perf_counter()
    events = store.list_events(json.loads(line), limit=50, newest_first=True)
    wall, usage = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps([wall, usage.ru_utime + usage.ru_stime - c0, events[-1].index, events[0].id]), flush=True)
"""


class PageWorker:
    """A process reading timeline pages with the loopscope found on ``tree`` (None: this
    checkout's, as installed)."""

    def __init__(self, path: Path, tree: Path | None) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        if tree is not None:
            env["PYTHONPATH"] = str(tree)
        self.process = subprocess.Popen([sys.executable, "-c", _PAGE_WORKER, str(path)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, env=env, cwd=tempfile.gettempdir())
        assert self.process.stdin is not None and self.process.stdout is not None
        self.stdin, self.stdout = self.process.stdin, self.process.stdout
        self.package = json.loads(self.stdout.readline())

    def page(self, session: str) -> tuple[tuple[float, float], tuple[Any, ...]]:
        """``(wall, cpu)`` of one page in the worker, and what the page held (to compare)."""
        self.stdin.write(json.dumps(session) + "\n")
        self.stdin.flush()
        wall, cpu_time, *seen = json.loads(self.stdout.readline())
        return (wall, cpu_time), tuple(seen)

    def close(self) -> None:
        self.stdin.close()
        self.process.wait(timeout=30)


def bench_timeline(path: Path, pages: int, against: Path | None = None) -> dict[str, float]:
    con = duckdb.connect(str(path), read_only=True)
    sessions = [r[0] for r in con.execute("SELECT session_id FROM sessions").fetchall()]
    con.execute("SET enable_progress_bar = false")
    rng = random.Random(7)
    picks = [rng.choice(sessions) for _ in range(pages)]
    store = loopscope.Store(str(path))
    kept = loopscope.Store(str(path), keep_open=True)
    spans = {s: con.execute("SELECT first_at, last_at FROM sessions WHERE session_id = ?", [s]).fetchone() for s in picks}
    variants: dict[str, Callable[[str], Any]] = {
        "Store.list_events (attach, query, detach)": lambda s: store.list_events(s, limit=50, newest_first=True),
        "baseline: plain query, connection kept open": lambda s: con.execute(PLAIN_PAGE, [s]).fetchall(),
        "part: the file's attach and detach alone": lambda s: _attach_alone(path),
        "part: the query within the session's span, kept open": lambda s: con.execute(SPAN_PAGE, [s, *spans[s]]).fetchall(),
    }
    workers: dict[str, PageWorker] = {}
    if against is not None:
        workers = {"Store.list_events, this checkout, own process": PageWorker(path, None),
                   "Store.list_events, --against checkout, own process": PageWorker(path, against)}
        for name, worker in workers.items():
            print(f"  {name}: {worker.package}")
    for s in picks[:5]:  # warm the OS page cache and DuckDB
        for fn in variants.values():
            fn(s)
        for worker in workers.values():
            worker.page(s)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in [*variants, *workers]}
    order = list(samples)
    for i, s in enumerate(picks):
        seen: set[tuple[Any, ...]] = set()
        for name in order[i % len(order):] + order[: i % len(order)]:
            if name in workers:
                sample, page = workers[name].page(s)
                samples[name].append(sample)
                seen.add(page)
            else:
                samples[name].append(timed(lambda fn=variants[name], s=s: fn(s)))
        assert len(seen) <= 1, f"the checkouts read different pages of {s}: {seen}"
    for worker in workers.values():
        worker.close()
    events = store.list_events(picks[0], limit=50, newest_first=True)
    assert len(events) == 50 and events[-1].index == TURNS_PER_SESSION * EVENTS_PER_TURN
    # kept attached: only reads that follow each other reuse it (a plain read between two
    # would detach it), so these pages run one after the other, in a pass of their own
    name = "Store(keep_open=True).list_events (kept attached)"
    samples[name] = [timed(lambda s=s: kept.list_events(s, limit=50, newest_first=True)) for s in picks]
    assert [e.id for e in kept.list_events(picks[0], limit=50, newest_first=True)] == [e.id for e in events]
    con.close()
    # how Store read before: a DuckDB database of its own per query. Timed apart, once no
    # connection to the file is open (duckdb.connect would reuse an open one's database)
    old = "(ref) plain query, own DuckDB per query (Store before)"
    samples[old] = [timed(lambda s=s: _connect_and_query(path, s)) for s in picks[: max(20, pages // 3)]]
    medians = report(f"Timeline page: the newest 50 events of a session ({pages} random sessions)",
                     list(samples.items()), "baseline: plain query, connection kept open")
    if workers:
        ours, theirs = workers
        print(f"  this checkout / --against, each in its own process: wall {medians[ours] / medians[theirs]:.2f}x, "
              f"CPU {CPU_MEDIANS[ours] / CPU_MEDIANS[theirs]:.2f}x")
    return medians


def _attach_alone(path: Path) -> None:
    from loopscope.storage.duckdb.connection import open_store

    with open_store(str(path), read_only=True):
        pass


def _connect_and_query(path: Path, session: str) -> Any:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute(PLAIN_PAGE, [session]).fetchall()
    finally:
        con.close()


# tool_stats as it was before the per-tool totals (m010_tool_totals): what the view reads
# where the totals do not account for every row
FROM_EVENTS = views(tool_totals=False)["tool_stats"]


def bench_tool_stats(path: Path, repeats: int) -> dict[str, float]:
    con = duckdb.connect(str(path), read_only=True)
    con.execute("SET enable_progress_bar = false")
    store = loopscope.Store(str(path))
    variants: dict[str, Callable[[], Any]] = {
        "tool_stats view, open connection": lambda: con.execute("SELECT * FROM tool_stats").fetchall(),
        "(before) the view computed from events alone": lambda: con.execute(FROM_EVENTS).fetchall(),
        "baseline: GROUP BY over raw events (JSON)": lambda: con.execute(PLAIN_TOOL_STATS).fetchall(),
        "(ref) the same stats over tool fields as columns": lambda: con.execute(COLUMNS_TOOL_STATS).fetchall(),
    }
    view = {r[0]: r for r in con.execute("SELECT tool, finished, served, p95_ms FROM tool_stats").fetchall()}
    plain = {r[0]: r for r in con.execute(PLAIN_TOOL_STATS).fetchall()}
    assert {t: (v[1], v[2]) for t, v in view.items()} == {t: (p[1], p[2]) for t, p in plain.items()}
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    order = list(variants)
    for i in range(repeats):
        for name in order[i % len(order):] + order[: i % len(order)]:
            samples[name].append(timed(variants[name]))
    con.close()
    # Store.sql starts a sealed DuckDB of its own, which DuckDB refuses beside another
    # configuration of the same file in one process: timed apart, once no connection is open
    name = "tool_stats view via Store.sql"
    samples[name] = [timed(lambda: store.sql("SELECT * FROM tool_stats")) for _ in range(repeats)]
    return report(f"tool_stats: per tool calls, outcomes, p50/p95/p99 over {sum(v[1] for v in view.values()):,} finished calls"
                  f" ({repeats} repeats)", list(samples.items()), "baseline: GROUP BY over raw events (JSON)")


def bench_dashboard(path: Path, repeats: int) -> dict[str, float] | None:
    try:
        from loopscope.dashboards.web import api
    except ImportError as exc:
        print(f"\nDashboard first page: skipped (loopscope.dashboards.web.api is not importable: {exc})")
        return None
    overview = getattr(api, "overview", None)
    if overview is None:
        print("\nDashboard first page: skipped (loopscope.dashboards.web.api has no overview())")
        return None
    con = duckdb.connect(str(path), read_only=True)
    con.execute("SET enable_progress_bar = false")
    store = loopscope.Store(str(path))
    variants: dict[str, Callable[[], Any]] = {
        "api.overview(store) (attach, queries, detach)": lambda: overview(store),
        "baseline: the same figures scanned from events": lambda: [con.execute(q).fetchall() for q in PLAIN_OVERVIEW],
    }
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    order = list(variants)
    for i in range(repeats):
        for name in order[i % len(order):] + order[: i % len(order)]:
            samples[name].append(timed(variants[name]))
    con.close()
    return report(f"Dashboard first page ({repeats} repeats)", list(samples.items()),
                  "baseline: the same figures scanned from events")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=20_000, help="sessions in the generated store (500 events each)")
    parser.add_argument("--pages", type=int, default=300, help="timeline pages timed per variant")
    parser.add_argument("--repeats", type=int, default=7, help="repeats of tool_stats and the dashboard page")
    parser.add_argument("--regenerate", action="store_true", help="generate the store again even if cached")
    parser.add_argument("--data", type=Path, default=DATA, help=f"where the generated store is cached (default {DATA})")
    parser.add_argument("--against", type=Path,
                        help="another checkout (a folder holding loopscope/): its plain Store page is timed beside this one's, "
                             "each in a worker process")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes in a temporary folder: checks that it runs, measures nothing")
    args = parser.parse_args()
    if args.against is not None:
        if not (args.against / "loopscope" / "__init__.py").is_file():
            parser.error(f"--against {args.against}: no loopscope/ package there")
        args.against = args.against.resolve()
    if args.smoke:
        with tempfile.TemporaryDirectory(prefix="loopscope-bench-views-") as folder:
            return run(prepare(4, True, Path(folder)), pages=3, repeats=1, against=args.against)
    return run(prepare(args.sessions, args.regenerate, args.data), pages=args.pages, repeats=args.repeats, against=args.against)


def run(path: Path, *, pages: int, repeats: int, against: Path | None = None) -> int:
    print(f"Python {sys.version.split()[0]}, DuckDB {duckdb.__version__}, {os.cpu_count()} cores; "
          f"load average {os.getloadavg()[0]:.1f}")
    t0 = time.perf_counter()
    timeline = bench_timeline(path, pages, against)
    tool_stats = bench_tool_stats(path, repeats)
    dashboard = bench_dashboard(path, repeats)
    print(f"\nGoals ({time.perf_counter() - t0:.0f} s of measuring; load average now {os.getloadavg()[0]:.1f}):")
    for name, label in (("Store.list_events (attach, query, detach)", "timeline page"),
                        ("Store(keep_open=True).list_events (kept attached)", "  keep_open")):
        page = timeline[name]
        print(f"  {label:<15} {fmt_ms(page):>12}  goal < {TIMELINE_GOAL_MS:g} ms: {'met' if page * 1000 < TIMELINE_GOAL_MS else 'NOT met'}"
              f" (median CPU {fmt_ms(CPU_MEDIANS[name])}: {'met' if CPU_MEDIANS[name] * 1000 < TIMELINE_GOAL_MS else 'NOT met'})")
    for name in ("tool_stats view, open connection", "tool_stats view via Store.sql"):
        stats = tool_stats[name]
        label = "tool_stats" if name.endswith("connection") else "  via Store.sql"
        print(f"  {label:<15} {fmt_ms(stats):>12}  goal < {TOOL_STATS_GOAL_S * 1000:g} ms: {'met' if stats < TOOL_STATS_GOAL_S else 'NOT met'}")
    if dashboard is not None:
        first = dashboard["api.overview(store) (attach, queries, detach)"]
        print(f"  dashboard page  {fmt_ms(first):>12}  goal < {DASHBOARD_GOAL_S:g} s: {'met' if first < DASHBOARD_GOAL_S else 'NOT met'}")
    else:
        print("  dashboard page  skipped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
