"""Large ``events.content`` values kept in parts, in a table of their own (``loopscope_values``).

DuckDB rewrites a table's last row group whole at each checkpoint and holds its values
while it does, so a writer's memory grows with the bytes one row group holds: with 1 MiB
tool results in ``events.content`` the writer peaked at ~0.8-1.6 GB and wrote 2-5 MiB/s
(``benchmarks/bench_value_layout.py``, ``bench_big_values.py``). A row group holds at least
2,048 rows, so only a value cut into parts bounds it: a content over :data:`CUT_OVER`
bytes is stored as parts of :data:`PART_BYTES` bytes at most in ``loopscope_values``
(``id`` the event's id, ``part`` from 0, ``text``), and the row's ``content`` is NULL;
the attaches that write a store holding parts give ``ROW_GROUP_SIZE 2048``
(:data:`~loopscope.storage.duckdb.connection.ROW_GROUP_SIZE`), so that a row group of parts holds
8 MiB at most, each part kept inline in its segment (see :data:`PART_BYTES`). A normal
store has no value that long and pays nothing.

Reads give values back whole two ways. loopscope's own reads fetch their rows first,
then the parts of the rows whose ``content`` is NULL by id (:func:`fill`): no view can
make a filter on ``events`` reach the parts table, so a view joining them would read every
part in the store for any query. SQL that is not loopscope's (``loopscope sql``,
``Store.sql``, ``loopscope export``) runs on a connection given :func:`shadow`: a temporary
view ``events`` over the table and its parts, which the store's own views read too; there
a query costs a read of all parts, which a user's ad hoc query can afford.

A plain DuckDB client of the file sees such rows' ``content`` NULL and their parts in
``loopscope_values`` (``string_agg(text, '' ORDER BY part)`` by ``id`` puts them back).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .engine import duckdb

TABLE = "loopscope_values"
"""The parts of the large values: ``(id VARCHAR, part INTEGER, text VARCHAR)``."""

CUT_OVER = 64 << 10
"""A ``content`` of more bytes (UTF-8) than this is stored in parts. Far above any normal
row (a tool call's JSON is a few hundred bytes), well under the 1 MiB that made a row
group hold gigabytes."""

PART_BYTES = 4 << 10
"""Bytes (UTF-8) a part holds at most, cut at a character's start. Measured, in plain DuckDB
(8 MiB batches in row groups of 2,048 rows, each checkpointed): a checkpoint of 16 KiB parts
peaked 150-217 MiB over the batch's start, of 8 KiB 70-160, of 4,093-4,096 bytes 19-30 and
flat over 960 MiB (4,000 bytes: 81; see ``benchmarks/README.md``, session 20). DuckDB keeps
a string of more than 4,096 bytes in overflow blocks of its own, which may be why. A row
group of 2,048 parts holds 8 MiB at most. The cost: DuckDB tries its compressions on many
more strings, and writes parts ~1.5-2x as slowly. (Stores written before held 16 KiB parts:
they read back the same.)"""

MIGRATION = [
    f"CREATE TABLE IF NOT EXISTS {TABLE} (id VARCHAR NOT NULL, part INTEGER NOT NULL, text VARCHAR NOT NULL)",
]
"""The statements of ``m017_value_parts``."""

PARTS_ROWS = "_loopscope_value_parts"
"""The name a batch's parts are registered under for :data:`PARTS_INSERT`."""
PARTS_INSERT = f"INSERT INTO {TABLE} (id, part, text) SELECT * FROM {PARTS_ROWS}"

LONG_FACT = CUT_OVER // 6
"""A fact with a text of this many bytes may make a content over :data:`CUT_OVER` (JSON
escapes write a byte as up to six): its batch's rows are made in Arrow, then cut."""


def may_cut(events: Any) -> bool:
    """Whether a table of event facts has a text long enough that its row's content may be
    cut (:data:`LONG_FACT`): one pass over the lengths of four columns, a batch's few
    hundred rows."""
    import pyarrow.compute as pc

    for name in ("arguments", "result", "body", "content"):
        longest = pc.max(pc.binary_length(events.column(name))).as_py()  # pyright: ignore[reportAttributeAccessIssue]
        if longest is not None and longest > LONG_FACT:
            return True
    return False


def cut(made: Any) -> tuple[Any, Any]:
    """``made`` (a table of ``events`` rows, ``id`` and ``content`` columns among them)
    with every content over :data:`CUT_OVER` bytes NULL, and the table of those contents'
    parts (``id, part, text``), or None when no content is that long.

    Cut in bytes, each cut moved back to the start of its character (a UTF-8 continuation
    byte is ``0b10xxxxxx``): no value is decoded to a Python string (decoding a batch's
    32 MiB and slicing it took ~0.9 s a batch), and no part is copied: the parts of a value
    are an Arrow array over the content's own data buffer, with offsets at the cuts (one
    chunk a value). A copy of each part, in Python bytes and again in Arrow, held two more
    copies of a batch's values while it was written (issue 30: 1 MiB tool results)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    contents = made.column("content")
    long = pc.greater(pc.fill_null(pc.binary_length(contents), 0), CUT_OVER)  # pyright: ignore[reportAttributeAccessIssue]
    if not pc.any(long).as_py():  # pyright: ignore[reportAttributeAccessIssue]
        return made, None
    ids: list[str] = []
    numbers: list[int] = []
    chunks: list[Any] = []
    event_ids = made.column("id")
    wide = pa.types.is_large_string(contents.type)
    if not (wide or pa.types.is_string(contents.type)):  # (DuckDB's rows read back give text as string)
        contents = contents.cast(pa.string())
    text_type = contents.type
    offset_type = pa.int64() if wide else pa.int32()
    first = 0  # the table's row of the chunk's first
    for chunk in contents.chunks:
        rows_long = pc.indices_nonzero(long.slice(first, len(chunk))).to_pylist()  # pyright: ignore[reportAttributeAccessIssue]
        if rows_long:
            _, offsets_buffer, data_buffer = chunk.buffers()
            data = memoryview(data_buffer)  # the bytes of every value of the chunk, read in place
            offsets = memoryview(offsets_buffer).cast("q" if wide else "i")
            for row in rows_long:
                at, size = offsets[chunk.offset + row], offsets[chunk.offset + row + 1]
                event_id = event_ids[first + row].as_py()
                cuts = [at]
                while at < size:
                    end = min(at + PART_BYTES, size)
                    while end < size and data[end] & 0xC0 == 0x80:
                        end -= 1
                    cuts.append(end)
                    at = end
                count = len(cuts) - 1
                ids += [event_id] * count
                numbers += range(count)
                chunks.append(pa.Array.from_buffers(
                    pa.large_string() if wide else pa.string(), count, [None, pa.array(cuts, offset_type).buffers()[1], data_buffer]
                ))
        first += len(chunk)
    at = made.schema.get_field_index("content")
    kept = pc.if_else(long, pa.nulls(made.num_rows, text_type), contents)  # pyright: ignore[reportAttributeAccessIssue]
    texts = pa.chunked_array(chunks, pa.large_string() if wide else pa.string())
    parts = pa.table(
        [pa.chunked_array([pa.array(ids, pa.string())]), pa.chunked_array([pa.array(numbers, pa.int32())]), texts],
        names=["id", "part", "text"],
    )
    return made.set_column(at, "content", kept), parts


# the parts of the given ids put together; a part stored twice (a batch written again
# after a failure that committed) counts once
_WHOLE_SQL = f"""SELECT id, string_agg(text, '' ORDER BY part) FROM (
  SELECT id, part, any_value(text) AS text FROM {TABLE} WHERE id IN (SELECT unnest(?::VARCHAR[])) GROUP BY id, part
) GROUP BY id"""


# whether the file has the table, without a query that fails (a failed statement ends the
# transaction it is in: conversations.py reads in a writer's)
_HAS_TABLE_SQL = (
    "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() AND schema_name = 'main' "
    f"AND table_name = '{TABLE}'"
)


def _has_table(con: duckdb.DuckDBPyConnection) -> bool:
    found = con.execute(_HAS_TABLE_SQL).fetchall()
    return bool(found and found[0][0])


def wholes(con: duckdb.DuckDBPyConnection, ids: Sequence[str]) -> dict[str, str]:
    """The whole values of the events ``ids`` that have parts, by id (one query; nothing
    for a file without the table: one written before ``m017_value_parts``)."""
    if not ids or not _has_table(con):
        return {}
    return dict(con.execute(_WHOLE_SQL, [list(ids)]).fetchall())


def fill(con: duckdb.DuckDBPyConnection, rows: list[tuple[Any, ...]], id_at: int, content_at: int) -> list[tuple[Any, ...]]:
    """``rows`` (tuples of a query of ``events`` that selects ``id`` at ``id_at`` and
    ``content`` at ``content_at``) with the whole value of each row whose content is in
    parts. Costs nothing more where no row's content is NULL (a normal store's pages),
    one query by id otherwise."""
    missing = [row[id_at] for row in rows if row[content_at] is None and row[id_at] is not None]
    if not missing:
        return rows
    found = wholes(con, missing)
    if not found:
        return rows
    out: list[tuple[Any, ...]] = []
    for row in rows:
        text = found.get(row[id_at]) if row[content_at] is None else None
        out.append(row if text is None else (*row[:content_at], text, *row[content_at + 1 :]))
    return out


def fill_dicts(con: duckdb.DuckDBPyConnection, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """:func:`fill` for rows as dicts with ``id`` and ``content`` keys (changed in place)."""
    missing = [row["id"] for row in rows if row.get("content") is None and row.get("id") is not None]
    found = wholes(con, missing) if missing else {}
    for row in rows:
        if row.get("content") is None and row.get("id") in found:
            row["content"] = found[row["id"]]
    return rows


def has_parts(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the store ``con`` reads holds any value in parts (False for a file without
    the table: one written before ``m017_value_parts``)."""
    try:  # one query where the table is (every file a writer opened since): ~2 ms, the error ~6 ms
        return bool(con.execute(f"SELECT EXISTS (SELECT 1 FROM {TABLE})").fetchall()[0][0])
    except duckdb.CatalogException:
        return False


def shadow(con: duckdb.DuckDBPyConnection) -> None:
    """Give ``con`` (a read of the store as its default database) a temporary view
    ``events`` with every value whole: it shadows the table for every query on ``con``,
    the store's own views' included. Nothing for a store without parts (most): its
    ``events`` is the table, as before."""
    if not has_parts(con):
        return
    found = con.execute("SELECT current_database()").fetchall()
    catalog = '"' + str(found[0][0]).replace('"', '""') + '"'
    con.execute(
        f"""CREATE OR REPLACE TEMP VIEW events AS
SELECT e.* REPLACE (coalesce(e.content, v.content::JSON) AS content)
FROM {catalog}.main.events e LEFT JOIN (
  SELECT id, string_agg(text, '' ORDER BY part) AS content FROM (
    SELECT id, part, any_value(text) AS text FROM {catalog}.main.{TABLE} GROUP BY id, part
  ) GROUP BY id
) v ON e.content IS NULL AND v.id = e.id"""
    )
