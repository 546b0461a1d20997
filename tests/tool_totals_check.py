"""Checks that the tool totals a store keeps (``loopscope_tool_totals``, ``loopscope_tool_durations``)
are exactly what a full recomputation from its ``events`` gives, and that ``tool_stats`` reads them."""

from __future__ import annotations

import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

import duckdb

from loopscope.storage.duckdb import tool_totals
from loopscope.storage.duckdb.views import OUTCOMES, TOTALS_COVER, duration_key, tool_rows, views
from recorded import connect_when_free


def _rounded(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    # a sum of durations may differ in its last bits with the order it was added in
    return sorted(tuple(round(v, 9) if isinstance(v, float) and math.isfinite(v) else v for v in r) for r in rows)


_KEYS = "tool, has_tool, agent, has_agent, bucket"
# the totals added up per key (batches append theirs; a process folds them now and then)
_FOLDED = {
    tool_totals.TOTALS: f"""SELECT {_KEYS}, sum(started), sum(finished), {", ".join(f"sum({o})" for o in OUTCOMES)},
        sum(durations), sum(duration_sum), max(duration_max), min(first_seen), max(last_seen)
        FROM {tool_totals.TOTALS} GROUP BY ALL""",
    # the durations appended since the last fold and those folded into the sorted table
    tool_totals.DURATIONS: f"""SELECT tool, has_tool, bucket, duration_ms FROM {tool_totals.DURATIONS}
        UNION ALL SELECT tool, has_tool, bucket, duration_ms FROM {tool_totals.SORTED}""",
}
# the sorted durations out of their order (by rowid), or with a key that is not theirs
_UNSORTED = f"""SELECT count(*) FROM (
    SELECT key, duration_ms, lag(key) OVER w AS key_before, lag(duration_ms) OVER w AS ms_before,
        {duration_key('tool', 'bucket')} AS own_key
    FROM {tool_totals.SORTED} WINDOW w AS (ORDER BY rowid))
WHERE key < key_before OR (key = key_before AND duration_ms < ms_before) OR key <> own_key"""


def kept_and_recomputed(db: str | Path) -> tuple[dict[str, list[tuple[Any, ...]]], dict[str, list[tuple[Any, ...]]]]:
    """The totals the file keeps, and those a recomputation from its tool rows gives (on a copy)."""
    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / "copy.duckdb"
        shutil.copy(db, copy)
        if Path(f"{db}.wal").exists():
            shutil.copy(f"{db}.wal", f"{copy}.wal")
        con = duckdb.connect(str(copy))
        try:
            tables = (tool_totals.TOTALS, tool_totals.DURATIONS)
            kept = {t: _rounded(con.execute(_FOLDED[t]).fetchall()) for t in tables}
            assert con.execute(_UNSORTED).fetchone() == (0,)
            for table in (*tables, tool_totals.SORTED):
                con.execute(f"DELETE FROM {table}")
            for statement in tool_totals.batch_statements(tool_rows(tool_columns=True)):
                con.execute(statement)
            again = {t: _rounded(con.execute(_FOLDED[t]).fetchall()) for t in tables}
        finally:
            con.close()
    return kept, again


def assert_totals_exact(db: str | Path) -> None:
    """The file's totals equal a recomputation, cover every row (so tool_stats reads them),
    and tool_stats equals its computation from events alone."""
    kept, again = kept_and_recomputed(db)
    assert kept == again
    assert kept[tool_totals.TOTALS], "no tool rows: nothing was checked"
    con = connect_when_free(db)
    try:
        assert con.execute(f"SELECT {TOTALS_COVER}").fetchone() == (True,)
        from_totals = con.execute("SELECT * FROM tool_stats").fetchall()
        from_events = con.execute(views(tool_totals=False)["tool_stats"]).fetchall()
    finally:
        con.close()
    assert _rounded(from_totals) == _rounded(from_events)
