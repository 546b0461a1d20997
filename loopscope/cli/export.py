"""``loopscope export --parquet DIR``: the store as Parquet files partitioned by day.

Each table goes to ``DIR/<table>/date=YYYY-MM-DD/data_0.parquet`` (hive-style
partitions, UTC days), which DuckDB, Spark, Trino, ClickHouse, polars and pandas read as
one table with a ``date`` column. DuckDB writes the files itself (``COPY ... TO ...
(FORMAT parquet, PARTITION_BY (date))``) from a read-only connection. JSON columns are
written as text. While a table is written, a progress bar on stderr follows DuckDB's own
progress (when stderr is a terminal, or with ``--progress``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from ..storage.queries import EXPORT_TABLES, open_reader
from . import _args, agui
from .commands import CommandError, db_path, emit, emit_json

EXPORTS = EXPORT_TABLES
"""The tables ``--tables`` may name (each with its rows' UTC day, ``date``, that it is partitioned by)."""


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    export = sub.add_parser(
        "export",
        parents=[common],
        help="write events, turns and tool calls as Parquet files partitioned by day, or a session as AG-UI events",
        description="Write the store's events, turns and tool calls (the tool_calls view: one row per call) "
        "as Parquet under DIR, one folder per table and one per UTC day inside it "
        "(DIR/events/date=2025-01-31/data_0.parquet): hive-style partitions that DuckDB, Spark, Trino, "
        "ClickHouse, polars and pandas read as one table. The store is read read-only; an agent writing "
        "it waits while a table is written.",
    )
    mode = export.add_mutually_exclusive_group(required=True)
    mode.add_argument("--parquet", metavar="DIR", help="the folder to write into (created if missing)")
    agui.add_export_arguments(export, mode)
    export.add_argument(
        "--tables", default=",".join(EXPORTS), metavar="NAMES",
        help=f"which tables, comma-separated (default: {','.join(EXPORTS)})",
    )
    export.add_argument(
        "--overwrite", action="store_true", help="replace the tables an earlier export wrote under DIR"
    )
    export.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=None,
        help="show a progress bar on stderr (default: when stderr is a terminal)",
    )
    _args.add_json(export, "what was written")
    export.set_defaults(handler=run)


def _tables(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = [t for t in names if t not in EXPORTS]
    if unknown or not names:
        raise CommandError(f"unknown table {', '.join(unknown) or '(none)'} for --tables; choose from {', '.join(EXPORTS)}")
    return list(dict.fromkeys(names))


def run(args: argparse.Namespace) -> int:
    if args.agui is not None:
        return agui.run_export(args)
    agui.refuse_agui_flags(args)
    names = _tables(args.tables)
    out = Path(os.path.expanduser(args.parquet))
    if out.exists() and not out.is_dir():
        raise CommandError(f"{out} is a file; --parquet takes a folder")
    for name in names:
        target = out / name
        if target.exists() and any(target.iterdir()) and not args.overwrite:
            raise CommandError(f"{target} already holds an export; --overwrite replaces it")
    show = args.progress if args.progress is not None else sys.stderr.isatty()
    path = os.path.abspath(db_path(args))
    written: dict[str, dict[str, Any]] = {}
    reader = open_reader(path, lock_timeout=getattr(args, "wait", 10.0))
    for name, rows in reader.export_parquet(names, str(out), progress=_Bar if show else None).items():
        target = out / name
        days = sorted(p.name.split("=", 1)[1] for p in target.iterdir() if p.name.startswith("date=")) if target.exists() else []
        written[name] = {"rows": rows, "days": len(days), "first_day": days[0] if days else None,
                         "last_day": days[-1] if days else None, "path": str(target)}
    if args.json:
        emit_json({"db": path, "dir": str(out), "tables": written})
        return 0
    width = max(len(n) for n in written)
    for name, info in written.items():
        span = f"{info['first_day']} .. {info['last_day']}" if info["days"] else "no rows"
        emit(f"{name:<{width}}  {info['rows']:>12,} rows  {info['days']:>4} days ({span})  {info['path']}")
    first = next(iter(written.values()))["path"]
    emit()
    emit("Read it back, e.g.:")
    emit(f"""  duckdb -c "SELECT date, count(*) FROM read_parquet('{first}/*/*.parquet', hive_partitioning = true) GROUP BY date ORDER BY date" """.rstrip())
    return 0


class _Bar:
    """``events    [#########.........]  45%`` redrawn in place on stderr."""

    WIDTH = 30

    def __init__(self, label: str) -> None:
        self.label = label
        self.start = time.monotonic()
        self.last = -1.0

    def draw(self, percent: float) -> None:
        if percent < 0:
            percent = 0.0
        percent = min(percent, 100.0)
        filled = int(self.WIDTH * percent / 100)
        elapsed = time.monotonic() - self.start
        bar = "#" * filled + "." * (self.WIDTH - filled)
        note = "writing files" if percent >= 100 else f"{percent:5.1f}%"
        sys.stderr.write(f"\r{self.label:<10} [{bar}] {note}  {elapsed:5.1f}s ")
        sys.stderr.flush()
        self.last = percent

    def done(self, interrupted: bool = False) -> None:
        elapsed = time.monotonic() - self.start
        bar = "#" * self.WIDTH
        state = "interrupted" if interrupted else "done"
        sys.stderr.write(f"\r{self.label:<10} [{bar}] {state}  {elapsed:5.1f}s          \n")
        sys.stderr.flush()
