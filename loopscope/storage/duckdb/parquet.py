"""``loopscope export --parquet``'s writing on a DuckDB file: each table's rows and their UTC
day by DuckDB's own ``COPY ... TO ... (FORMAT parquet, PARTITION_BY (date))``, from a
read-only database of its own that may write files (only these statements run on it)."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .connection import open_store
from .engine import duckdb
from .schema import check_readable, missing_views

if TYPE_CHECKING:
    from ..queries import ExportProgress

EXPORTS: dict[str, str] = {
    "events": """SELECT * REPLACE (content::VARCHAR AS content),
        CAST(timezone('UTC', created_at) AS DATE) AS date FROM events""",
    "turns": """SELECT * REPLACE (segments::VARCHAR AS segments, usage::VARCHAR AS usage,
        declared_tools::VARCHAR AS declared_tools),
        CAST(timezone('UTC', "timestamp") AS DATE) AS date FROM turns""",
    "tool_calls": """SELECT * REPLACE (arguments::VARCHAR AS arguments, result::VARCHAR AS result),
        CAST(timezone('UTC', started_at) AS DATE) AS date FROM tool_calls""",
}
"""What each exported table holds: its rows and the UTC day (``date``) it is partitioned by."""


def export(
    path: str, names: Sequence[str], out: str, *, timeout: float, progress: Callable[[str], ExportProgress] | None,
) -> dict[str, int]:
    """Write the tables ``names`` of the store at ``path`` under ``out`` (a table's folder
    replaced); their row counts, in ``names``' order."""
    written: dict[str, int] = {}
    with open_store(path, read_only=True, timeout=timeout, isolated=True, sealed=False) as con:
        check_readable(con)
        for statement in missing_views(con):
            con.execute(statement)
        Path(out).mkdir(parents=True, exist_ok=True)
        for name in names:
            target = Path(out) / name
            if target.exists():
                shutil.rmtree(target)
            written[name] = _copy(con, EXPORTS[name], target, progress(name) if progress is not None else None)
    return written


def _copy(con: duckdb.DuckDBPyConnection, query: str, target: Path, bar: ExportProgress | None) -> int:
    """Write one table; with a progress bar, drawn while DuckDB works."""
    statement = f"COPY ({query}) TO '{_quote(str(target))}' (FORMAT parquet, PARTITION_BY (date))"
    if bar is None:
        row = con.execute(statement).fetchone()
        return int(row[0]) if row and row[0] is not None else 0
    con.execute("SET enable_progress_bar = true")  # DuckDB tracks progress only with it on
    con.execute("SET enable_progress_bar_print = false")  # ... and we draw it ourselves
    result: dict[str, Any] = {}

    def work() -> None:
        try:
            result["row"] = con.execute(statement).fetchone()
        except BaseException as exc:  # handed to the main thread
            result["error"] = exc

    worker = threading.Thread(target=work, name=f"loopscope-export-{target.name}", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            try:
                bar.draw(con.query_progress())
            except duckdb.Error:
                pass
            worker.join(0.2)
    except KeyboardInterrupt:
        con.interrupt()
        worker.join(5)
        bar.done(interrupted=True)
        raise
    bar.done()
    if "error" in result:
        raise result["error"]
    row = result.get("row")
    return int(row[0]) if row and row[0] is not None else 0


def _quote(text: str) -> str:
    return text.replace("'", "''")
