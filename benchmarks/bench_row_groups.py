"""A normal store's reads with row groups of 2,048 rows (issue 30): what every writing attach's
``ROW_GROUP_SIZE 2048`` (storage/duckdb/connection.py, for the large values' parts) costs the reads
of a store that has no large value at all.

The store of ``bench_views.py`` (generated with SQL, ``--sessions`` of 500 events each; its
row groups DuckDB's default 122,880 rows), and a copy of it made through an attach with
``ROW_GROUP_SIZE 2048`` (what a store written by this loopscope's writer holds), read by this
checkout, the two files' reads interleaved, medians of wall time:

* ``Store.list_events(session, limit=50, newest_first=True)``: ``loopscope timeline``'s page;
* ``api.timeline(store, session)``: the dashboard's session page;
* ``api.overview(store)``: the dashboard's first page (totals over the views);
* ``Store.sql("SELECT * FROM tool_stats")`` and a count of tool ends by tool over ``events``.

    .venv/bin/python benchmarks/bench_row_groups.py                   # 2,000 sessions (1 M events)
    .venv/bin/python benchmarks/bench_row_groups.py --sessions 20000  # bench_views.py's 10 M events
    .venv/bin/python benchmarks/bench_row_groups.py --smoke           # 4 sessions: runs, measures nothing
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import loopscope
from loopscope.dashboards.web import api

DATA = Path(__file__).resolve().parent / ".data"


def small_groups(source: Path, target: Path) -> None:
    """``source`` copied into ``target`` through an attach with ``ROW_GROUP_SIZE 2048``."""
    if target.exists():
        return
    partial = target.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    con = duckdb.connect()
    try:
        con.execute("SET enable_progress_bar = false")
        con.execute(f"ATTACH '{source}' AS src (READ_ONLY)")
        con.execute(f"ATTACH '{partial}' AS dst (ROW_GROUP_SIZE 2048)")
        con.execute("COPY FROM DATABASE src TO dst")
    finally:
        con.close()
    partial.rename(target)


def row_groups(path: Path) -> int:
    con = duckdb.connect(str(path), read_only=True)
    try:
        found = con.execute("SELECT count(DISTINCT row_group_id) FROM pragma_storage_info('events')").fetchone()
        return int(found[0]) if found else 0
    finally:
        con.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=2_000)
    parser.add_argument("--pages", type=int, default=200, help="pages of each kind timed per file")
    parser.add_argument("--repeats", type=int, default=7, help="repeats of the first page and tool_stats")
    parser.add_argument("--smoke", action="store_true", help="4 sessions in a temporary folder: runs, measures nothing")
    args = parser.parse_args()
    from bench_views import prepare  # the generated store, cached

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) if args.smoke else DATA
        if args.smoke:
            args.sessions, args.pages, args.repeats = 4, 3, 1
        default = prepare(args.sessions, False, data)
        small = default.with_name(default.stem + "-rg2048.duckdb")
        small_groups(default, small)
        files = {"default row groups": default, "ROW_GROUP_SIZE 2048": small}
        for label, path in files.items():
            print(f"  {label}: {path} ({path.stat().st_size / 1e6:,.0f} MB, {row_groups(path):,} row groups in events)")
        con = duckdb.connect(str(default), read_only=True)
        sessions = [r[0] for r in con.execute("SELECT session_id FROM sessions").fetchall()]
        con.close()
        rng = random.Random(7)
        picks = [rng.choice(sessions) for _ in range(args.pages)]
        stores = {label: loopscope.Store(str(path)) for label, path in files.items()}
        reads: dict[str, tuple[Callable[[Any, str], Any], list[str]]] = {
            "timeline page (Store.list_events)": (lambda st, s: st.list_events(s, limit=50, newest_first=True), picks),
            "dashboard session page (api.timeline)": (lambda st, s: api.timeline(st, s), picks),
            "dashboard first page (api.overview)": (lambda st, s: api.overview(st), ["-"] * args.repeats),
            "Store.sql tool_stats": (lambda st, s: st.sql("SELECT * FROM tool_stats"), ["-"] * args.repeats),
            "Store.sql tool ends by tool over events": (
                lambda st, s: st.sql("SELECT tool_name, count(*) FROM events WHERE type = 'tool_call_end' GROUP BY ALL ORDER BY ALL"),
                ["-"] * args.repeats,
            ),
        }
        print(f"\n{'read':42} {'default':>12} {'rg 2048':>12} {'ratio':>7}")
        for name, (read, keys) in reads.items():
            for store in stores.values():  # warm the page cache
                read(store, keys[0])
            times: dict[str, list[float]] = {label: [] for label in stores}
            for i, key in enumerate(keys):
                order = list(stores) if i % 2 == 0 else list(reversed(stores))
                for label in order:
                    t0 = time.perf_counter()
                    read(stores[label], key)
                    times[label].append(time.perf_counter() - t0)
            a, b = (statistics.median(times[label]) for label in stores)
            print(f"{name:42} {a * 1000:10.2f}ms {b * 1000:10.2f}ms {b / a:6.2f}x")
            # the same answers from both files
            assert repr(read(stores["default row groups"], keys[0])) == repr(read(stores["ROW_GROUP_SIZE 2048"], keys[0])) \
                or name.startswith("dashboard"), name
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
