"""The DuckDB schema of a loopscope store, and the migrations that bring a file up to date.

Each migration is a list of statements applied in one transaction; the version reached
is kept in ``loopscope_meta``. A file written by a newer loopscope is refused, not
altered.

Migration 2 creates the analytics views. Their SQL lives in
:mod:`loopscope.dashboards.views` (one source for the views of every file); the
migration reads it when it runs. A later change to a view is a new migration that
creates the views again (``CREATE OR REPLACE``), so every file gets it.

Migration 3 adds the ``spans`` table, where ``loopscope collect`` keeps every span it
receives as it came.

Migration 4 adds the tool fields as columns of ``events`` (:data:`TOOL_COLUMN_TYPES`),
fills them for the rows already there from their ``content`` JSON, and creates the views
again to read them. Writers name the columns they insert, so one that leaves the tool
columns out (NULL) still works: the views read those rows' ``content``.

Migration 5 adds the ``agui_events`` table, where an AG-UI import keeps every event it
read as it came (:mod:`loopscope.storage.agui`).

Migration 6 adds ``loopscope_writers`` and ``loopscope_open_turns``: which in-process
writer started which turn that has not ended yet, so that the turns of a process that
died (SIGKILL, power loss) are closed as ``unfinished`` the next time the store is opened
for writing (:mod:`loopscope.storage.recovery`).

Migration 7 adds each writer's counters to its ``loopscope_writers`` row (what it wrote,
dropped and failed to write; :mod:`loopscope.storage.health`), for ``loopscope status``.
"""

from __future__ import annotations

from collections.abc import Callable

import duckdb

from .errors import StoreError


def _writer_counters() -> list[str]:
    from .health import migration

    return migration()


def _views() -> list[str]:
    # imported when a migration runs
    from .views import create_statements

    # the views as they were then: ``events`` has no tool columns before migration 4
    return create_statements(tool_columns=False)


TOOL_COLUMN_TYPES = {
    "tool_name": "VARCHAR",
    "tool_call_id": "VARCHAR",
    "tool_status": "VARCHAR",
    "tool_outcome": "VARCHAR",
    "tool_duration_ms": "DOUBLE",
}
"""The tool fields of ``events`` rows stored as columns too (migration 4), as
:data:`loopscope.dashboards.views.TOOL_COLUMNS` names them."""

# Exactly what the views read from ``content`` where the columns are NULL. (Joining one
# parse of the five paths back by rowid was no faster: ~15 s for 10 M rows either way.)
_TOOL_BACKFILL = """
UPDATE events SET
    tool_name = json_extract_string(content, '$.tool_name'),
    tool_call_id = json_extract_string(content, '$.tool_id'),
    tool_status = json_extract_string(content, '$.status'),
    tool_outcome = json_extract_string(content, '$.outcome'),
    tool_duration_ms = TRY_CAST(json_extract_string(content, '$.duration_ms') AS DOUBLE)
WHERE type IN ('tool_call_start', 'tool_call_end')
"""


def _tool_columns() -> list[str]:
    from .views import TOOL_COLUMNS, create_statements

    assert tuple(TOOL_COLUMN_TYPES) == TOOL_COLUMNS
    return [
        *(f"ALTER TABLE events ADD COLUMN IF NOT EXISTS {name} {kind}" for name, kind in TOOL_COLUMN_TYPES.items()),
        _TOOL_BACKFILL,
        *create_statements(),
    ]


MIGRATIONS: list[list[str] | Callable[[], list[str]]] = [
    # 1: the activity log, the turn summaries, and per-session counters
    [
        """CREATE TABLE IF NOT EXISTS loopscope_meta (key VARCHAR PRIMARY KEY, value VARCHAR)""",
        """CREATE TABLE events (
            id VARCHAR NOT NULL,
            session_id VARCHAR NOT NULL,
            idx BIGINT NOT NULL,
            type VARCHAR NOT NULL,
            created_at TIMESTAMPTZ NOT NULL,
            correlation_id VARCHAR,
            source_channel_id VARCHAR,
            source_provider VARCHAR,
            source_framework VARCHAR,
            status VARCHAR NOT NULL,
            content JSON,
            trace_id VARCHAR,
            span_id VARCHAR
        )""",
        """CREATE TABLE turns (
            correlation_id VARCHAR NOT NULL,
            session_id VARCHAR,
            channel_id VARCHAR,
            parent_correlation_id VARCHAR,
            response_content VARCHAR,
            segments JSON,
            tool_calls_count INTEGER,
            round_count INTEGER,
            usage JSON,
            input_tokens BIGINT,
            output_tokens BIGINT,
            thinking VARCHAR,
            loop_end_reason VARCHAR,
            latency_ms DOUBLE,
            streaming BOOLEAN,
            timestamp TIMESTAMPTZ,
            declared_tools JSON,
            model VARCHAR,
            provider VARCHAR,
            error VARCHAR,
            trace_id VARCHAR,
            span_id VARCHAR
        )""",
        """CREATE TABLE sessions (
            session_id VARCHAR PRIMARY KEY,
            last_index BIGINT NOT NULL,
            first_at TIMESTAMPTZ,
            last_at TIMESTAMPTZ
        )""",
    ],
    # 2: the analytics views: tool_calls, turn_summaries, tool_stats, loop_end_reasons,
    # declared_vs_used, token_usage, slowest_turns
    _views,
    # 3: every span a collector received, raw (``loopscope collect``): what the events and
    # turns do not say stays queryable. Ids are hex; attributes, resource, events and links
    # are JSON; ``role`` / ``framework`` say how the span was understood.
    [
        """CREATE TABLE spans (
            trace_id VARCHAR NOT NULL,
            span_id VARCHAR NOT NULL,
            parent_span_id VARCHAR,
            name VARCHAR,
            kind VARCHAR,
            start_time TIMESTAMPTZ,
            end_time TIMESTAMPTZ,
            duration_ms DOUBLE,
            status_code VARCHAR,
            status_message VARCHAR,
            attributes JSON,
            resource JSON,
            events JSON,
            links JSON,
            scope_name VARCHAR,
            scope_version VARCHAR,
            service_name VARCHAR,
            role VARCHAR,
            framework VARCHAR,
            received_at TIMESTAMPTZ
        )""",
    ],
    # 4: the tool fields of tool rows (name, call id, status, outcome, duration) as columns
    # of ``events`` besides ``content``, filled from ``content`` for the rows already there;
    # the tool views read them (and ``content`` where they are NULL)
    _tool_columns,
    # 5: every AG-UI event an import read (``loopscope import --agui``), verbatim: ``raw`` is
    # the event's JSON text exactly as received, ``seq`` its gap-free position in the
    # session's AG-UI log, ``run_id`` the run it belongs to (events between two runs are
    # kept with the run before them), ``type`` as received (THINKING_* stays so),
    # ``created_at`` the event's own timestamp (NULL without one)
    [
        """CREATE TABLE agui_events (
            session_id VARCHAR NOT NULL,
            run_id VARCHAR,
            seq BIGINT NOT NULL,
            type VARCHAR NOT NULL,
            created_at TIMESTAMPTZ,
            raw VARCHAR NOT NULL,
            imported_at TIMESTAMPTZ
        )""",
    ],
    # 6: what a crash leaves open (storage/recovery.py): the in-process writers that wrote
    # here, each with what tells its process apart from a later one with the same pid
    # (host, boot id, pid namespace, pid, the process's start in clock ticks), and the
    # turns they started and have not ended yet; the writer keeps both in the same
    # transaction as the rows, so a turn is open here exactly while its summary is missing
    [
        """CREATE TABLE loopscope_writers (
            writer_id VARCHAR NOT NULL,
            host VARCHAR,
            boot_id VARCHAR,
            pid_namespace VARCHAR,
            pid BIGINT,
            process_start VARCHAR,
            started_at TIMESTAMPTZ,
            last_seen TIMESTAMPTZ
        )""",
        """CREATE TABLE loopscope_open_turns (
            correlation_id VARCHAR NOT NULL,
            session_id VARCHAR NOT NULL,
            writer_id VARCHAR NOT NULL,
            trace_id VARCHAR,
            started_at TIMESTAMPTZ,
            agent VARCHAR
        )""",
    ],
    # 7: each writer's counters in its loopscope_writers row (storage/health.py): rows
    # written, events dropped (queue full / file unwritable too long), failed write
    # attempts and the last error, the OTLP exporter's drops, when it stopped
    _writer_counters,
]

SCHEMA_VERSION = len(MIGRATIONS)


def schema_version(con: duckdb.DuckDBPyConnection) -> int:
    """The version of the schema in an open file (the connection's default database); 0 for
    a file loopscope never wrote."""
    # fetchall: a result read to its end leaves the connection free for other calls
    # (DuckDB 2 refuses a register() while a result is open)
    exists = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = 'main' AND table_name = 'loopscope_meta'"
    ).fetchall()
    if not exists or not exists[0][0]:
        return 0
    rows = con.execute("SELECT value FROM loopscope_meta WHERE key = 'schema_version'").fetchall()
    return int(rows[0][0]) if rows else 0


def migrate(con: duckdb.DuckDBPyConnection) -> int:
    """Bring the file to :data:`SCHEMA_VERSION`; returns the version found before."""
    found = schema_version(con)
    if found > SCHEMA_VERSION:
        raise StoreError(f"this store was written by a newer loopscope (schema {found}, this one knows {SCHEMA_VERSION}); upgrade loopscope to use it")
    for version in range(found, SCHEMA_VERSION):
        step = MIGRATIONS[version]
        statements = step() if callable(step) else step
        con.execute("BEGIN TRANSACTION")
        try:
            for statement in statements:
                con.execute(statement)
            con.execute("INSERT OR REPLACE INTO loopscope_meta VALUES ('schema_version', ?)", [str(version + 1)])
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    return found


def check_readable(con: duckdb.DuckDBPyConnection) -> None:
    """Refuse to read a file that is not a loopscope store, or one from a newer loopscope."""
    try:  # one query in the common case (every read runs this)
        row = con.execute("SELECT value FROM main.loopscope_meta WHERE key = 'schema_version'").fetchone()
        found = int(row[0]) if row else 0
    except duckdb.CatalogException:
        found = 0
    if found == 0:
        raise StoreError("this file holds no loopscope data yet (no events were written to it)")
    if found > SCHEMA_VERSION:
        raise StoreError(f"this store was written by a newer loopscope (schema {found}); upgrade loopscope to read it")


def missing_views(con: duckdb.DuckDBPyConnection) -> list[str]:
    """``CREATE TEMP VIEW`` statements for the views an older file lacks.

    A file from an older loopscope (read-only, so not migrated) still answers queries on
    the views when the reading connection runs these first: they live in the
    connection's temporary catalog and read the file's tables.
    """
    if schema_version(con) >= SCHEMA_VERSION:
        return []
    from .views import views

    definitions = views(tool_columns=has_tool_columns(con))
    present = {
        r[0]
        for r in con.execute(
            "SELECT view_name FROM duckdb_views() WHERE database_name = current_database() AND schema_name = 'main'"
        ).fetchall()
    }
    return [f"CREATE OR REPLACE TEMP VIEW {name} AS {sql.strip()}" for name, sql in definitions.items() if name not in present]


def has_tool_columns(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the ``events`` table of the open file (the connection's default database)
    has the tool columns of migration 4 (a file of an older loopscope, read without
    migrating it, has not)."""
    row = con.execute(
        "SELECT count(*) FROM duckdb_columns() WHERE database_name = current_database() AND schema_name = 'main' "
        "AND table_name = 'events' AND column_name = 'tool_name'"
    ).fetchone()
    return bool(row and row[0])
