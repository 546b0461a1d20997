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
"""

from __future__ import annotations

from collections.abc import Callable

import duckdb

from .errors import StoreError


def _views() -> list[str]:
    # imported when a migration runs: the dashboards package never loads with the storage
    from ..dashboards.views import create_statements

    return create_statements()


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
]

SCHEMA_VERSION = len(MIGRATIONS)


def schema_version(con: duckdb.DuckDBPyConnection) -> int:
    """The version of the schema in an open file (the connection's default database); 0 for
    a file loopscope never wrote."""
    exists = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() "
        "AND schema_name = 'main' AND table_name = 'loopscope_meta'"
    ).fetchone()
    if not exists or not exists[0]:
        return 0
    row = con.execute("SELECT value FROM loopscope_meta WHERE key = 'schema_version'").fetchone()
    return int(row[0]) if row else 0


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
    from ..dashboards.views import VIEWS

    present = {
        r[0]
        for r in con.execute(
            "SELECT view_name FROM duckdb_views() WHERE database_name = current_database() AND schema_name = 'main'"
        ).fetchall()
    }
    return [f"CREATE OR REPLACE TEMP VIEW {name} AS {sql.strip()}" for name, sql in VIEWS.items() if name not in present]
