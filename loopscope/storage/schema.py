"""The DuckDB schema of a loopscope store, and the migrations that bring a file up to date.

Each migration is a list of statements applied in one transaction; the version reached
is kept in ``loopscope_meta``. A file written by a newer loopscope is refused, not
altered.
"""

from __future__ import annotations

import duckdb

from .errors import StoreError

MIGRATIONS: list[list[str]] = [
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
]

SCHEMA_VERSION = len(MIGRATIONS)


def schema_version(con: duckdb.DuckDBPyConnection) -> int:
    """The version of the schema in an open file; 0 for a file loopscope never wrote."""
    exists = con.execute(
        "SELECT count(*) FROM information_schema.tables WHERE table_name = 'loopscope_meta' AND table_schema = 'main'"
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
        con.execute("BEGIN TRANSACTION")
        try:
            for statement in MIGRATIONS[version]:
                con.execute(statement)
            con.execute("INSERT OR REPLACE INTO loopscope_meta VALUES ('schema_version', ?)", [str(version + 1)])
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    return found


def check_readable(con: duckdb.DuckDBPyConnection) -> None:
    """Refuse to read a file that is not a loopscope store, or one from a newer loopscope."""
    found = schema_version(con)
    if found == 0:
        raise StoreError("this file holds no loopscope data yet (no events were written to it)")
    if found > SCHEMA_VERSION:
        raise StoreError(f"this store was written by a newer loopscope (schema {found}); upgrade loopscope to read it")
