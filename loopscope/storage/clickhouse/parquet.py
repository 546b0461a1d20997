"""``loopscope export --parquet`` on ClickHouse: each table's rows (numbered, a resent copy left out)
read as Arrow and written as Parquet partitioned by UTC day (``date=YYYY-MM-DD``), as the DuckDB
engine writes them. The columns are ClickHouse's tables' (docs/clickhouse.md), not DuckDB's views'."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .tables import TOOL_CALLS, TURNS

if TYPE_CHECKING:
    from ..queries import ExportProgress
    from .reader import ClickHouseReader

EXPORTS: dict[str, str] = {
    "events": """SELECT * EXCEPT (at, seq), toDate(created_at) AS date FROM (
        SELECT row_number() OVER (PARTITION BY session_id ORDER BY at, seq, id) AS idx, * FROM (
            SELECT * FROM loopscope_events ORDER BY session_id, at, seq, id LIMIT 1 BY id))""",
    "turns": f"SELECT *, toDate(timestamp) AS date FROM {TURNS.format(where='')}",
    "tool_calls": f"SELECT *, toDate(started_at) AS date FROM {TOOL_CALLS.format(where='')}",
}
"""What each exported table holds: its rows and the UTC day (``date``) it is partitioned by."""


def export(reader: ClickHouseReader, names: Sequence[str], out: str, *,
           progress: Callable[[str], ExportProgress] | None = None) -> dict[str, int]:
    """Write the tables ``names`` under ``out`` (a table's folder replaced); their row counts."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    written: dict[str, int] = {}
    Path(out).mkdir(parents=True, exist_ok=True)
    for name in names:
        bar = progress(name) if progress is not None else None
        target = Path(out) / name
        if target.exists():
            shutil.rmtree(target)
        table = reader.runner.arrow(EXPORTS[name])
        table = table.set_column(table.schema.get_field_index("date"), "date", pc.cast(table["date"], "string"))
        ds.write_dataset(table, target, format="parquet", partitioning=["date"], partitioning_flavor="hive",
                         existing_data_behavior="overwrite_or_ignore")
        written[name] = table.num_rows
        if bar is not None:
            bar.done()
    return written
