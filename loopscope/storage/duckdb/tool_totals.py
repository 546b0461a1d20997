"""Per-tool totals kept as rows are written, so that ``tool_stats`` does not read every tool row.

``tool_stats`` over the raw ``events`` grows with the store (0.36 s at 10 M events, about
1 s near 30 M). Its figures are sums, extremes, a count of distinct agents and three
quantiles of the durations. Two tables keep what they need, written in the same
transaction as the rows they count (:func:`batch_script`, run by ``write_batch``, and
:func:`batch_statements`, by the conversation store and the migration), so that they hold exactly what ``events`` holds:

* :data:`TOTALS` -- one row per tool, agent and duration bucket: counts of start and
  end rows and of each outcome, the count, sum and maximum of the durations, the first
  and last row's time. Mergeable: a batch appends its own (one row per key it has),
  whether it is a whole batch, one of its halves, what is left of a resend, or a dead
  writer's turns closed by recovery; the view adds up the rows of a key. A process folds
  the table back to one row per key once it has appended :data:`COMPACT_AFTER` rows
  (an upsert per batch cost three times an append).
* :data:`DURATIONS` -- each finished call's duration with its tool and bucket, as batches
  append them; :data:`SORTED` -- the same, folded out of :data:`DURATIONS` in
  (:func:`~loopscope.storage.duckdb.views.duration_key`, duration) order. A quantile needs the
  values: the bucket counts of :data:`TOTALS` say which bucket holds the wanted rank, so
  only the durations of those few buckets are read and sorted. In :data:`SORTED` a read
  finds them by key without scanning the rest (10 M events, 3 M durations: ``tool_stats``
  0.61x the CPU of a scan of them all); :data:`DURATIONS` it scans whole. So a process,
  every :data:`SORT_CHECK_AFTER` durations it appended, folds :data:`DURATIONS` into
  :data:`SORTED` once it holds 1/:data:`SORT_SHARE` of its rows (in that batch's
  transaction: ~10 ms when not due; when due, a rewrite of the sorted table, ~1.5 s of
  the writer at 3 M durations, every ~190 000 durations there).

Buckets are 1/32 of an octave of milliseconds (:func:`bucket_sql`), monotone in the
duration: the values at a rank are found exactly, and ``p50_ms`` / ``p95_ms`` / ``p99_ms``
interpolate between them as DuckDB's ``quantile_cont`` does.

A tool or agent that is NULL is kept as ``''`` with a flag (keys compare as plain values). ``tool_stats`` uses the totals only while every row of ``events`` was written by a
writer that keeps them (:data:`~loopscope.storage.duckdb.views.TOTALS_COVER`: the table's row
count, which DuckDB keeps, equals the sum of the sessions' last indices): rows inserted
by a program that does not keep them (an importer's plain ``INSERT``), or deleted, make
the view compute everything from ``events`` again, as before.
"""

from __future__ import annotations

import math
from typing import Any

from .. import rows
from .views import OUTCOMES, SORTED_DURATIONS, TOOL_DURATIONS, TOOL_TOTALS, duration_key

TOTALS, DURATIONS, SORTED = TOOL_TOTALS, TOOL_DURATIONS, SORTED_DURATIONS
NO_BUCKET = -32768
"""The bucket of rows without a duration (start rows, ends that did not say)."""

DDL = (
    f"""CREATE TABLE IF NOT EXISTS {TOTALS} (
    tool VARCHAR NOT NULL,
    has_tool BOOLEAN NOT NULL,
    agent VARCHAR NOT NULL,
    has_agent BOOLEAN NOT NULL,
    bucket SMALLINT NOT NULL,
    started BIGINT NOT NULL,
    finished BIGINT NOT NULL,
    {", ".join(f"{o} BIGINT NOT NULL" for o in OUTCOMES)},
    durations BIGINT NOT NULL,
    duration_sum DOUBLE,
    duration_max DOUBLE,
    first_seen TIMESTAMPTZ,
    last_seen TIMESTAMPTZ
)""",
    f"""CREATE TABLE IF NOT EXISTS {DURATIONS} (
    tool VARCHAR NOT NULL,
    has_tool BOOLEAN NOT NULL,
    bucket SMALLINT NOT NULL,
    duration_ms DOUBLE NOT NULL
)""",
)


SORTED_DDL = f"""CREATE TABLE IF NOT EXISTS {SORTED} (
    key BIGINT NOT NULL,
    tool VARCHAR NOT NULL,
    has_tool BOOLEAN NOT NULL,
    bucket SMALLINT NOT NULL,
    duration_ms DOUBLE NOT NULL
)"""
"""The durations folded out of :data:`DURATIONS`, in (key, duration) order (``m013_sorted_durations``)."""

SORT_SHARE = 16
""":data:`DURATIONS` is folded into :data:`SORTED` once it holds a sixteenth as many rows
(``tool_stats`` scans the unsorted ones whole; folding rewrites the sorted ones)."""
SORT_CHECK_AFTER = 20_000
"""Durations a process appends before a batch of its checks whether to fold them (a
writer that appends fewer never does: the next one, or a migration, will)."""
_SORT_DUE = "_loopscope_sort_due"
_FOLDED = "_loopscope_durations_folded"
# In the batch's transaction. The first statement finds whether folding is due from the
# tables' row counts (DuckDB keeps them); each other one reads nothing when it is not:
# joined to that one-row answer, which DuckDB evaluates first, as views.tool_rows' scans
def sort_sql(share: int) -> tuple[str, ...]:
    """The statements that fold :data:`DURATIONS` into :data:`SORTED` if it holds a
    ``share``-th as many rows (:data:`SORT_SHARE`)."""
    folded = f"""CREATE OR REPLACE TEMP TABLE {_FOLDED} AS
SELECT key, tool, has_tool, bucket, duration_ms FROM (
    SELECT s.* FROM {SORTED} s, {_SORT_DUE}
    UNION ALL
    SELECT {duration_key('d.tool', 'd.bucket')}, d.tool, d.has_tool, d.bucket, d.duration_ms FROM {DURATIONS} d, {_SORT_DUE}
)
ORDER BY key, duration_ms"""
    return (
        f"""CREATE OR REPLACE TEMP TABLE {_SORT_DUE} AS
SELECT due FROM (SELECT (SELECT count(*) FROM {DURATIONS}) AS unsorted, (SELECT count(*) FROM {SORTED}) AS sorted),
    LATERAL (SELECT unsorted > 0 AND unsorted * {share} >= sorted AS due)
WHERE due""",
        folded,
        f"DELETE FROM {SORTED} WHERE EXISTS (SELECT 1 FROM {_SORT_DUE})",
        f"DELETE FROM {DURATIONS} WHERE EXISTS (SELECT 1 FROM {_SORT_DUE})",
        f"INSERT INTO {SORTED} SELECT * FROM {_FOLDED}",
        f"DROP TABLE {_FOLDED}",
        f"DROP TABLE {_SORT_DUE}",
    )


_SORT_SQL = sort_sql(SORT_SHARE)
_durations_appended = 0  # durations this process appended since its last check


def fold_statements() -> list[str]:
    """Statements that move every duration of :data:`DURATIONS` into an empty :data:`SORTED`
    (``m013_sorted_durations``): a batch's fold, due whenever there is a duration."""
    return list(sort_sql(1))


def bucket_sql(value: str) -> str:
    """The bucket of a duration: ``floor(32 * log2(ms))`` within -4000..4000 (non-positive
    durations in the lowest, infinite and NaN ones in the highest, where DuckDB sorts them)."""
    return (
        f"CAST(CASE WHEN {value} > 0 THEN least(greatest(floor(32 * log2({value})), -4000), 4000)"
        f" WHEN isnan({value}) THEN 4000 ELSE -4000 END AS SMALLINT)"
    )


def _with_buckets(source: str) -> str:
    # the rows of source with a bucket: a duration counts only on an end row
    return f"""
    SELECT type, tool, outcome, agent, created_at,
        CASE WHEN type = 'tool_call_end' THEN duration_ms END AS duration_ms,
        CASE WHEN type = 'tool_call_end' AND duration_ms IS NOT NULL THEN {bucket_sql('duration_ms')} ELSE {NO_BUCKET} END AS bucket
    FROM ({source})
    WHERE type IN ('tool_call_start', 'tool_call_end')"""


_OUTCOME_AT = {o: 2 + i for i, o in enumerate(OUTCOMES)}  # an outcome's place in a row of totals
_OUTCOME_COUNTS = ", ".join(f"count(*) FILTER (WHERE type = 'tool_call_end' AND outcome = '{o}')" for o in OUTCOMES)
_SUMMED = ("started", "finished", *OUTCOMES, "durations")


def batch_statements(source: str) -> list[str]:
    """Statements adding the tool rows of ``source`` to the totals: a SELECT of ``type,
    tool, outcome, duration_ms, agent, created_at`` over rows being inserted into ``events``
    (the same values the views read from those rows). Run them in the rows' transaction."""
    rows = _with_buckets(source)
    return [
        f"""INSERT INTO {TOTALS}
SELECT coalesce(tool, ''), tool IS NOT NULL, coalesce(agent, ''), agent IS NOT NULL, bucket,
    count(*) FILTER (WHERE type = 'tool_call_start'),
    count(*) FILTER (WHERE type = 'tool_call_end'),
    {_OUTCOME_COUNTS},
    count(duration_ms), sum(duration_ms), max(duration_ms), min(created_at), max(created_at)
FROM ({rows})
GROUP BY ALL""",
        f"""INSERT INTO {DURATIONS}
SELECT coalesce(tool, ''), tool IS NOT NULL, bucket, duration_ms
FROM ({rows})
WHERE duration_ms IS NOT NULL""",
    ]


# The tool rows of a batch of event facts (write_batch's registered table), with the values
# rows.EVENTS_SQL stores for them: from the facts, or from the content JSON Python made
# (where that is not JSON, the stored row's fields are NULL, as here)
_FACT_ROWS = f"""
    SELECT CASE code WHEN {rows.TOOL_START} THEN 'tool_call_start' ELSE 'tool_call_end' END AS type,
        CASE WHEN content IS NULL THEN tool_name ELSE tj[1] END AS tool,
        CASE WHEN content IS NULL THEN outcome ELSE tj[4] END AS outcome,
        CASE WHEN content IS NULL THEN duration_ms ELSE TRY_CAST(tj[5] AS DOUBLE) END AS duration_ms,
        source_channel_id AS agent, created_us AS created_at
    FROM (
        SELECT *, CASE WHEN content IS NOT NULL AND json_valid(content) THEN
            json_extract_string(content, ['$.tool_name', '$.tool_id', '$.status', '$.outcome', '$.duration_ms']) END AS tj
        FROM {rows.EVENTS_TABLE}
        WHERE code <= {rows.TOOL_END}
    )"""

BATCH_SQL: tuple[str, ...] = tuple(batch_statements(_FACT_ROWS))
"""What ``write_batch`` runs after inserting a batch's events (from the same registered table)."""

_MOVED = ", ".join("-count(*)" if o == "served" else "count(*)" if o == "failed" else "0" for o in OUTCOMES)
def fix_sql(since_us: int) -> str:
    """What ``write_batch`` runs before :func:`rows.fix_sql`: the calls it is about to set
    ``failed`` move from ``served`` to ``failed`` in the totals (a row of differences, merged
    as any other)."""
    return f"""INSERT INTO {TOTALS}
SELECT coalesce(tool, ''), tool IS NOT NULL, coalesce(agent, ''), agent IS NOT NULL,
    CASE WHEN duration_ms IS NOT NULL THEN {bucket_sql('duration_ms')} ELSE {NO_BUCKET} END,
    0, 0, {_MOVED}, 0, NULL, NULL, NULL, NULL
FROM ({rows.fixed_rows_sql(since_us)})
GROUP BY ALL"""

TOTALS_BATCH, DURATIONS_BATCH = "_loopscope_tool_totals_batch", "_loopscope_tool_durations_batch"

_MERGE_SQL = f"INSERT INTO {TOTALS} SELECT * FROM {TOTALS_BATCH}"
COMPACT_AFTER = 20_000
"""Rows of totals a process appends before a batch of its folds the table to one row per
key again (in that batch's transaction; a few milliseconds for a table of that size)."""
_COMPACTED = "_loopscope_tool_totals_compacted"
_COMPACT_SQL = (
    f"""CREATE OR REPLACE TEMP TABLE {_COMPACTED} AS
SELECT tool, has_tool, agent, has_agent, bucket,
    {", ".join(f"CAST(sum({c}) AS BIGINT) AS {c}" for c in _SUMMED)},
    sum(duration_sum) AS duration_sum, max(duration_max) AS duration_max,
    min(first_seen) AS first_seen, max(last_seen) AS last_seen
FROM {TOTALS}
GROUP BY ALL""",
    f"DELETE FROM {TOTALS}",
    f"INSERT INTO {TOTALS} SELECT * FROM {_COMPACTED}",
    f"DROP TABLE {_COMPACTED}",
)
_appended = 0  # rows of totals this process appended since its last compaction

_APPEND_SQL = f"INSERT INTO {DURATIONS} SELECT * FROM {DURATIONS_BATCH}"


def bucket_of(ms: float) -> int:
    """:func:`bucket_sql` in Python (the same C library's ``log2``; NaN is left to the SQL)."""
    if ms > 0:
        return int(max(min(math.floor(32 * math.log2(ms)), 4000), -4000)) if ms != math.inf else 4000
    return -4000


def batch_script(con: Any, events: Any) -> tuple[str, ...]:
    """The statements that add a batch's tool rows (``events``: write_batch's Arrow table of
    event facts) to the totals, in its transaction: the batch's totals made here and merged
    by two plain statements (an aggregating statement costs DuckDB several milliseconds to
    plan and run; a batch holds a few tool rows, added up in Python in microseconds), or
    :data:`BATCH_SQL` where the rows need DuckDB's reading (a content JSON made in Python,
    a NaN duration). Registers what the statements read on ``con`` (a connection, or
    the batch's :class:`~loopscope.storage.duckdb.writer.Tables`); nothing for a batch
    without tool rows."""
    import pyarrow as pa  # the writer's batches have it imported already

    codes = events.column("code").to_pylist()
    picked = [i for i, code in enumerate(codes) if code <= rows.TOOL_END]
    if not picked:
        return ()
    # the indices as an Arrow array: a Python list costs pyarrow a failed import of dateutil
    # (where it is not installed) on every call, ~85 us a batch
    fields = ("code", "tool_name", "source_channel_id", "outcome", "duration_ms", "created_us")
    # only the columns read below: a take of the whole table copied every value of the tool
    # rows (3-4 s for a batch of 120 tool results of 1 MiB, the writer's thread in Arrow meanwhile)
    tools = events.select([*fields, "content"]).take(pa.array(picked, pa.int64()))
    if tools.column("content").null_count != len(picked):
        return (*BATCH_SQL, *_sorting(sum(codes[i] == rows.TOOL_END for i in picked)))  # about its durations
    totals: dict[tuple[str, bool, str, bool, int], list[Any]] = {}
    durations: list[tuple[str, bool, int, float]] = []
    for code, tool, agent, outcome, ms, created in zip(*(tools.column(f).to_pylist() for f in fields), strict=True):
        end = code == rows.TOOL_END
        if end and ms is not None:
            if math.isnan(ms):  # ordered as DuckDB orders NaN, by the SQL
                return (*BATCH_SQL, *_sorting(len(picked)))
            bucket = bucket_of(ms)
            durations.append((tool or "", tool is not None, bucket, ms))
        else:
            ms, bucket = None, NO_BUCKET
        key = (tool or "", tool is not None, "" if agent is None else str(agent), agent is not None, bucket)
        row = totals.get(key)
        if row is None:
            # started, finished, the outcomes, durations, their sum and max, first and last seen
            row = totals[key] = [0, 0, *(0 for _ in OUTCOMES), 0, None, None, created, created]
        row[1 if end else 0] += 1
        if end and outcome in _OUTCOME_AT:
            row[_OUTCOME_AT[outcome]] += 1
        if ms is not None:
            row[-5] += 1
            row[-4] = ms if row[-4] is None else row[-4] + ms
            row[-3] = ms if row[-3] is None else max(row[-3], ms)
        row[-2], row[-1] = min(row[-2], created), max(row[-1], created)
    names = ["tool", "has_tool", "agent", "has_agent", "bucket", *_SUMMED, "duration_sum", "duration_max", "first_seen", "last_seen"]
    values = [(*key, *row) for key, row in totals.items()]
    created_type = events.schema.field("created_us").type
    types = [pa.string(), pa.bool_(), pa.string(), pa.bool_(), pa.int16(), *(pa.int64() for _ in _SUMMED),
             pa.float64(), pa.float64(), created_type, created_type]
    con.register(TOTALS_BATCH, pa.table([pa.array(column, t) for column, t in zip(zip(*values, strict=True), types, strict=True)], names=names))
    script: tuple[str, ...] = (_MERGE_SQL, *_compaction(len(values)))
    if not durations:
        return script
    con.register(DURATIONS_BATCH, pa.table(
        [pa.array(c, t) for c, t in zip(zip(*durations, strict=True), (pa.string(), pa.bool_(), pa.int16(), pa.float64()), strict=True)],
        names=["tool", "has_tool", "bucket", "duration_ms"],
    ))
    return (*script, _APPEND_SQL, *_sorting(len(durations)))


def _sorting(appended: int) -> tuple[str, ...]:
    """The statements that fold the unsorted durations into :data:`SORTED` when due, once
    this process has appended :data:`SORT_CHECK_AFTER` durations since it last checked."""
    global _durations_appended
    _durations_appended += appended
    if _durations_appended < SORT_CHECK_AFTER:
        return ()
    _durations_appended = 0
    return _SORT_SQL


def _compaction(appended: int) -> tuple[str, ...]:
    """The statements that fold the totals again, once this process has appended
    :data:`COMPACT_AFTER` rows to them since it last did (none before)."""
    global _appended
    _appended += appended
    if _appended < COMPACT_AFTER:
        return ()
    _appended = 0
    return _COMPACT_SQL
