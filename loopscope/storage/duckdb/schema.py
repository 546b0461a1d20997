"""The DuckDB schema of a loopscope store, and the migrations that bring a file up to date.

Each migration is a function named ``mNNN_what`` that returns SQL statements, registered
in order by the :func:`migration` decorator (as simonw/llm's ``migrations.py`` does).
Opening a file for writing runs :func:`migrate`: every migration the file has not
recorded runs, in order, in one transaction with its row in ``loopscope_migrations``
(``name``, ``applied_at``). A file up to date costs one query. The number of migrations
a file has is kept too, as ``schema_version`` in ``loopscope_meta``: readers check it in
the query they run anyway, and a loopscope from before the names refuses a file whose
number is above its own.

A file written before migrations had names has ``schema_version`` N and no
``loopscope_migrations``: its N migrations are the first N here (the list was positional
then), recorded by name when it is first opened for writing, before the rest run. A file
that records a name this loopscope does not know comes from a newer one and is refused,
not altered.

``m002_views`` creates the analytics views. Their SQL lives in
:mod:`loopscope.storage.duckdb.views` (one source for the views of every file); the
migration reads it when it runs. A later change to a view is a new migration that
creates the views again (``CREATE OR REPLACE``), so every file gets it.
``m004_tool_columns`` adds the tool fields as columns of ``events``
(:data:`TOOL_COLUMN_TYPES`), fills them for the rows already there from their
``content`` JSON, and creates the views again to read them. Writers name the columns
they insert, so one that leaves the tool columns out (NULL) still works: the views read
those rows' ``content``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from ..errors import StoreError
from .connection import file_identity, read_path, scratch_database
from .engine import duckdb


def _views() -> list[str]:
    # imported when a migration runs
    from .views import create_statements

    # the views as they were then: ``events`` has no tool columns before m004_tool_columns,
    # and there is no ``model_calls`` table before m009_model_calls
    return create_statements(tool_columns=False, model_calls=False, tool_totals=False)


TOOL_COLUMN_TYPES = {
    "tool_name": "VARCHAR",
    "tool_call_id": "VARCHAR",
    "tool_status": "VARCHAR",
    "tool_outcome": "VARCHAR",
    "tool_duration_ms": "DOUBLE",
}
"""The tool fields of ``events`` rows stored as columns too (``m004_tool_columns``), as
:data:`loopscope.storage.duckdb.views.TOOL_COLUMNS` names them."""

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
        *create_statements(model_calls=False, tool_totals=False),
    ]


class Migration(NamedTuple):
    """One step of the schema: a name recorded in the file once its statements ran."""

    name: str
    """Recorded in ``loopscope_migrations``; never renamed once released (files hold it)."""
    statements: Callable[[], list[str]]
    """Makes the statements, when the migration runs (some read the code of that moment)."""


MIGRATIONS: list[Migration] = []
"""Every migration, in the order they run. A change to the schema is a new function with
the :func:`migration` decorator after the last one (above :data:`SCHEMA_VERSION`, which
counts them), never an edit of one that was released."""


def migration(steps: Callable[[], list[str]]) -> Callable[[], list[str]]:
    """Register ``steps`` (a function returning SQL statements) as the next migration,
    named after the function."""
    if any(m.name == steps.__name__ for m in MIGRATIONS):
        raise ValueError(f"two migrations named {steps.__name__}")
    MIGRATIONS.append(Migration(steps.__name__, steps))
    return steps


@migration
def m001_activity_log() -> list[str]:
    """The activity log, the turn summaries, and per-session counters."""
    return [
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
    ]


@migration
def m002_views() -> list[str]:
    """The analytics views: tool_calls, turn_summaries, tool_stats, loop_end_reasons,
    declared_vs_used, token_usage, slowest_turns."""
    return _views()


@migration
def m003_spans() -> list[str]:
    """Every span a collector received, raw (``loopscope collect``): what the events and
    turns do not say stays queryable. Ids are hex; attributes, resource, events and links
    are JSON; ``role`` / ``framework`` say how the span was understood."""
    return [
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
    ]


@migration
def m004_tool_columns() -> list[str]:
    """The tool fields of tool rows (name, call id, status, outcome, duration) as columns
    of ``events`` besides ``content``, filled from ``content`` for the rows already there;
    the tool views read them (and ``content`` where they are NULL)."""
    return _tool_columns()


@migration
def m005_agui_events() -> list[str]:
    """Every AG-UI event an import read (``loopscope import --agui``), verbatim: ``raw`` is
    the event's JSON text exactly as received, ``seq`` its gap-free position in the
    session's AG-UI log, ``run_id`` the run it belongs to (events between two runs are
    kept with the run before them), ``type`` as received (THINKING_* stays so),
    ``created_at`` the event's own timestamp (NULL without one)."""
    return [
        """CREATE TABLE agui_events (
            session_id VARCHAR NOT NULL,
            run_id VARCHAR,
            seq BIGINT NOT NULL,
            type VARCHAR NOT NULL,
            created_at TIMESTAMPTZ,
            raw VARCHAR NOT NULL,
            imported_at TIMESTAMPTZ
        )""",
    ]


@migration
def m006_open_turns() -> list[str]:
    """What a crash leaves open (storage/duckdb/recovery.py): the in-process writers that wrote
    here, each with what tells its process apart from a later one with the same pid
    (host, boot id, pid namespace, pid, the process's start in clock ticks), and the
    turns they started and have not ended yet; the writer keeps both in the same
    transaction as the rows, so a turn is open here exactly while its summary is missing."""
    return [
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
    ]


@migration
def m007_writer_counters() -> list[str]:
    """Each writer's counters in its loopscope_writers row (storage/duckdb/health.py): rows
    written, events dropped (queue full / file unwritable too long), failed write
    attempts and the last error, the OTLP exporter's drops, when it stopped."""
    from .health import migration as writer_counters

    return writer_counters()


@migration
def m008_output_tools() -> list[str]:
    """The views again: ``declared_vs_used`` leaves out the output tools a turn declared
    (origin ``output``, such as pydantic-ai's ``final_result``), whose call is the answer.
    Only that view is made again: it reads no view made after it."""
    from .views import create_statements

    return [s for s in create_statements() if s.startswith("CREATE OR REPLACE VIEW declared_vs_used AS")]


MODEL_CALLS_DDL = """CREATE TABLE model_calls (
    session_id VARCHAR NOT NULL,
    correlation_id VARCHAR,
    position INTEGER,
    provider VARCHAR,
    framework VARCHAR,
    agent VARCHAR,
    request_model VARCHAR,
    response_model VARCHAR,
    response_id VARCHAR,
    finish_reasons JSON,
    outcome VARCHAR,
    streaming BOOLEAN,
    started_at TIMESTAMPTZ,
    ended_at TIMESTAMPTZ,
    duration_ms DOUBLE,
    time_to_first_chunk_ms DOUBLE,
    input_tokens BIGINT,
    output_tokens BIGINT,
    cache_read_input_tokens BIGINT,
    cache_creation_input_tokens BIGINT,
    reasoning_tokens BIGINT,
    provider_usage JSON,
    parameters JSON,
    error_type VARCHAR,
    error VARCHAR,
    refusal VARCHAR,
    input_messages JSON,
    output_messages JSON,
    cost_usd DOUBLE,
    price_source VARCHAR,
    trace_id VARCHAR,
    span_id VARCHAR
)"""
"""The ``model_calls`` table of ``m009_model_calls`` (its columns: :data:`rows.CALL_COLUMNS`)."""

TURN_CALL_COLUMNS = {"model_call_count": "INTEGER", "cost_usd": "DOUBLE", "price_source": "VARCHAR"}
"""The columns ``m009_model_calls`` adds to ``turns``."""


@migration
def m009_model_calls() -> list[str]:
    """One row per model call (a ``chat`` span's end) in ``model_calls``: session, turn,
    position, provider, models, response id, finish reasons, outcome, times, normalized
    usage and the provider's raw figures, request parameters, error, refusal, messages
    (content) and the cost in USD with where its price came from. ``turns`` gains the
    turn's model call count and its own cost (priced from its usage where it has no call
    rows); the views are made again with the calls and the costs."""
    from .views import create_statements

    return [
        MODEL_CALLS_DDL,
        *(f"ALTER TABLE turns ADD COLUMN IF NOT EXISTS {name} {kind}" for name, kind in TURN_CALL_COLUMNS.items()),
        *create_statements(tool_totals=False),
    ]


@migration
def m010_tool_totals() -> list[str]:
    """Per-tool totals kept by the writers in the rows' transaction (counts, outcomes,
    durations by bucket, agents, first and last seen) and every finished call's duration,
    filled here from the tool rows already stored; ``tool_stats`` reads them while they
    account for every tool row (see :mod:`loopscope.storage.duckdb.tool_totals`)."""
    from . import tool_totals
    from .views import create_statements, tool_rows

    return [
        *tool_totals.DDL, *tool_totals.batch_statements(tool_rows(tool_columns=True)), *create_statements(sorted_durations=False),
    ]


@migration
def m011_notice_counters() -> list[str]:
    """Each writer's start notice counters in its loopscope_writers row (storage/duckdb/health.py):
    notices its process's OTLP exporter sent, had refused, failed to send, and why they
    were turned off for good."""
    from .health import notice_migration

    return notice_migration()


@migration
def m012_writer_mode() -> list[str]:
    """Where each writer ran in its loopscope_writers row (storage/duckdb/health.py): in a thread
    of the recording process, or in a writer process of its own (and for which application)."""
    from .health import mode_migration

    return mode_migration()


@migration
def m013_sorted_durations() -> list[str]:
    """The durations ``tool_stats`` reads its quantiles from, moved into a table kept in
    (tool's key, bucket, duration) order, where a read finds the few buckets it wants
    without scanning every duration; the writers append to the old table and fold it into
    the sorted one from time to time (see :mod:`loopscope.storage.duckdb.tool_totals`)."""
    from . import tool_totals
    from .views import create_statements

    return [tool_totals.SORTED_DDL, *tool_totals.fold_statements(), *create_statements()]


@migration
def m014_unnamed_tool_calls() -> list[str]:
    """``tool_calls`` tells apart the calls a model asked for without an id (stored with an
    empty one, as sent): by their span, where it grouped them all into one call."""
    from .views import create_statements

    return [s for s in create_statements() if s.startswith("CREATE OR REPLACE VIEW tool_calls AS")]


@migration
def m015_lost_turns() -> list[str]:
    """Each writer's lost turn summaries beside its lost events, in its loopscope_writers
    row (storage/duckdb/health.py): every loss counted in the store's rows, events and turns."""
    from .health import lost_turns_migration

    return lost_turns_migration()


@migration
def m016_collector_refusals() -> list[str]:
    """The traces requests ``loopscope collect`` refused whole, in its writer's row of
    loopscope_writers (storage/duckdb/health.py), so that ``loopscope status`` counts them."""
    from .health import refused_migration

    return refused_migration()


@migration
def m017_value_parts() -> list[str]:
    """The parts of ``events.content`` values over 64 KiB, in ``loopscope_values``
    (storage/duckdb/values.py): a checkpoint rewrites a row group of 2,048 parts, not of 2,048
    values of a MiB each, so the writer's memory stays bounded."""
    from .values import MIGRATION

    return list(MIGRATION)


@migration
def m018_scores() -> list[str]:
    """Scores and feedback (``loopscope.score``, ``gen_ai.evaluation.result``) in ``scores``, and
    the views that find what each scores (``score_targets``) and sum them up per day, agent,
    model and tool (``scores_over_time``)."""
    from .views import SCORE_VIEWS, SCORES_DDL

    return [SCORES_DDL, *(f"CREATE OR REPLACE VIEW {name} AS {sql.strip()}" for name, sql in SCORE_VIEWS.items())]


MODEL_CALLS_SINCE = [m.name for m in MIGRATIONS].index("m009_model_calls") + 1
"""The schema version from which a file has ``model_calls`` and the turns'
``model_call_count`` column (an older file, read without migrating it, has neither)."""

SCHEMA_VERSION = len(MIGRATIONS)
"""How many migrations a file of this loopscope has. Kept in ``loopscope_meta`` as
``schema_version`` beside the names: the readers' one-query check, ``loopscope status``,
and what a loopscope older than named migrations compares to refuse a newer file."""

MIGRATIONS_TABLE = "loopscope_migrations"
_KNOWN = frozenset(m.name for m in MIGRATIONS)


_versions: dict[str, tuple[tuple[int, ...], int]] = {}
"""Each store file's schema version as a read found it, with the file's identity then."""


def remembered_version(con: duckdb.DuckDBPyConnection) -> int | None:
    """The schema version a read found in the file ``con`` reads, if that file is the same
    (:func:`~loopscope.storage.duckdb.connection.file_identity`) as then; else None (``con`` is
    not a read's, or the file was never checked, or changed since).

    Every read of a store checks its schema first, and on a freshly attached file reading
    ``loopscope_meta`` costs a table's load (~0.4 ms of a timeline page's ~13). A file
    changes (size, mtime, inode, or its WAL) whenever anything migrates or writes it, so a
    read of an unchanged file takes the version it found before. The narrow caveat is the
    file system's: it keeps mtimes to its clock's tick (a few ms on Linux), so a write of
    the same size in the same tick as the one a read saw goes unseen until the next write."""
    path = read_path(con)
    if path is None:
        return None
    known = _versions.get(path)
    return known[1] if known is not None and known[0] == file_identity(path) else None


def remember_version(con: duckdb.DuckDBPyConnection, version: int) -> None:
    """Keep ``version`` as what the file ``con`` reads holds now (:func:`remembered_version`)."""
    path = read_path(con)
    if path is not None:
        _versions[path] = (file_identity(path), version)


def _recalled(con: duckdb.DuckDBPyConnection, read: Callable[[duckdb.DuckDBPyConnection], int]) -> int:
    """The schema version :func:`remembered_version` holds for the file ``con`` reads, else
    ``read(con)``'s, remembered."""
    found = remembered_version(con)
    if found is None:
        found = read(con)
        remember_version(con, found)
    return found


def _kept_version(con: duckdb.DuckDBPyConnection) -> int:
    """The ``schema_version`` of ``loopscope_meta`` (0 for a file loopscope never wrote)."""
    return _recalled(con, _read_version)


def _read_version(con: duckdb.DuckDBPyConnection) -> int:
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


def applied(con: duckdb.DuckDBPyConnection) -> list[str] | None:
    """The names of the migrations recorded in the open file (the connection's default
    database), or None when it has no ``loopscope_migrations`` table (a new file, or one
    written before migrations had names). One query."""
    try:
        # fetchall: a result read to its end leaves the connection free for other calls
        return [r[0] for r in con.execute(f"SELECT name FROM {MIGRATIONS_TABLE}").fetchall()]
    except duckdb.CatalogException:
        return None


def schema_version(con: duckdb.DuckDBPyConnection) -> int:
    """The version of the schema in an open file (the connection's default database): how
    many migrations it has; 0 for a file loopscope never wrote."""
    return _kept_version(con)


def _adopt(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Record by name the migrations a file without names has: its version N is the first
    N of :data:`MIGRATIONS` (the list was positional then). ``applied_at`` stays NULL: when
    they ran was not kept."""
    found = _kept_version(con)
    if found > SCHEMA_VERSION:
        raise StoreError(
            f"this store was written by a newer loopscope (schema {found}, this one knows {SCHEMA_VERSION}); "
            "upgrade loopscope to use it"
        )
    names = [m.name for m in MIGRATIONS[:found]]
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(f"CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} (name VARCHAR PRIMARY KEY, applied_at TIMESTAMPTZ)")
        if names:
            con.executemany(f"INSERT INTO {MIGRATIONS_TABLE} VALUES (?, NULL)", [[n] for n in names])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return names


def migrate(con: duckdb.DuckDBPyConnection) -> int:
    """Run the migrations the open file has not recorded, in order, each in one transaction
    with its record; returns how many it had before (its version then).

    A file up to date costs one query. A file written before migrations had names is
    recognised by the version it keeps and its migrations recorded by name first. A file
    that records a migration this loopscope does not know was written by a newer one, and
    is refused, not altered: what that migration changed is unknown here, and rows written
    as this loopscope writes them could break it.
    """
    names = applied(con)
    if names is not None and len(names) == SCHEMA_VERSION and _KNOWN.issuperset(names):
        return SCHEMA_VERSION  # the common case: every writer's open comes here
    if not names and _kept_version(con) == 0:
        _check_ours(con)  # a file loopscope never wrote: refused, untouched, unless it is empty
    if names is None:
        names = _adopt(con)
    unknown = sorted(set(names) - _KNOWN)
    if unknown:
        raise StoreError(
            f"this store was written by a newer loopscope (it has migration {', '.join(unknown)}, which this one does "
            "not know); upgrade loopscope to use it"
        )
    found = len(names)
    done = set(names)
    for step in MIGRATIONS:
        if step.name in done:
            continue
        statements = step.statements()
        con.execute("BEGIN TRANSACTION")
        try:
            for statement in statements:
                con.execute(statement)
            con.execute(f"INSERT INTO {MIGRATIONS_TABLE} VALUES (?, now())", [step.name])
            done.add(step.name)
            con.execute("INSERT OR REPLACE INTO loopscope_meta VALUES ('schema_version', ?)", [str(len(done))])
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    return found


# What a file may hold besides loopscope's own: tables, views, sequences, schemas (DuckDB's
# internal ones left out). Not macros or types alone: duckdb_functions() lists every built-in
# function to find them (~120 ms, on every new store's first open), and a database of the
# user's without a single table, view or schema is rare
_OBJECTS = """
SELECT schema_name, table_name FROM duckdb_tables() WHERE database_name = current_database()
UNION ALL SELECT schema_name, view_name FROM duckdb_views() WHERE database_name = current_database() AND NOT internal
UNION ALL SELECT schema_name, sequence_name FROM duckdb_sequences() WHERE database_name = current_database()
UNION ALL SELECT schema_name, NULL FROM duckdb_schemas() WHERE database_name = current_database() AND NOT internal
"""
_BOOKKEEPING = {("main", MIGRATIONS_TABLE), ("main", "loopscope_meta")}


def _objects(con: duckdb.DuckDBPyConnection) -> set[tuple[str, str | None]]:
    return {(r[0], r[1]) for r in con.execute(_OBJECTS).fetchall()}


_loopscope_objects: set[tuple[str, str | None]] = set()


def _ours() -> set[tuple[str, str | None]]:
    """The names of everything the migrations make (found once, by running them in memory)."""
    if not _loopscope_objects:
        scratch = scratch_database()
        try:
            migrate(scratch)
            _loopscope_objects.update(_objects(scratch))
        finally:
            scratch.close()
    return _loopscope_objects


def _check_ours(con: duckdb.DuckDBPyConnection) -> None:
    """Refuse a file that holds no loopscope data and something else (a database of the
    user's), before anything is written to it. An empty file is loopscope's to use. The
    user may ask for loopscope's tables beside their own (``configure(share_db=True)``,
    ``LOOPSCOPE_SHARE_DB=1``): then only a name both use is refused."""
    theirs = _objects(con) - _BOOKKEEPING
    if not theirs:
        return
    from ..recording import shares

    row = con.execute("SELECT path FROM duckdb_databases() WHERE database_name = current_database()").fetchone()
    path = str(row[0]) if row and row[0] else ""
    if not shares(path):
        raise StoreError(
            f"{path or 'this file'} is not a loopscope store: it holds a database of its own ({_named(theirs)}), "
            "and loopscope writes nothing to it. Give loopscope a file of its own (LOOPSCOPE_DB, --db, "
            "configure(db=...)), or, to keep loopscope's tables beside yours, configure(share_db=True) or "
            "LOOPSCOPE_SHARE_DB=1"
        )
    clash = theirs & _ours()
    if clash:
        raise StoreError(
            f"{path or 'this file'} is not a loopscope store, and it already has what loopscope would make "
            f"({_named(clash)}): loopscope writes nothing to it. Give loopscope a file of its own"
        )


def _named(found: set[tuple[str, str | None]]) -> str:
    """Objects of a file, by name (their schema's when not ``main``), the first five."""
    listed = sorted(f"{schema}.{name}" if name is not None and schema != "main" else name or schema
                    for schema, name in found)
    return ", ".join(listed[:5]) + (f" and {len(listed) - 5} more" if len(listed) > 5 else "")


def _meta_version(con: duckdb.DuckDBPyConnection) -> int:
    """:func:`_read_version` in one query, for a read (no transaction that a missing table's
    error would spoil): every read of a changed file runs it."""
    try:
        row = con.execute("SELECT value FROM main.loopscope_meta WHERE key = 'schema_version'").fetchone()
        return int(row[0]) if row else 0
    except duckdb.CatalogException:
        return 0


def check_readable(con: duckdb.DuckDBPyConnection) -> int:
    """Refuse to read a file that is not a loopscope store, or one from a newer loopscope;
    else its schema version (what an older file, read as it is, lacks: see
    :data:`MODEL_CALLS_SINCE`). A read's connection (:func:`~loopscope.storage.duckdb.connection.open_store`)
    of a file unchanged since a read found its version takes that one
    (:func:`remembered_version`)."""
    found = _recalled(con, _meta_version)
    if found == 0:
        found_objects = _objects(con)
        theirs = found_objects - _BOOKKEEPING
        if theirs and not found_objects & _BOOKKEEPING:  # a database of the user's (not one loopscope began)
            raise StoreError(f"this file is not a loopscope store: it holds a database of its own ({_named(theirs)})")
        raise StoreError("this file holds no loopscope data yet (no events were written to it)")
    if found > SCHEMA_VERSION:
        raise StoreError(f"this store was written by a newer loopscope (schema {found}); upgrade loopscope to read it")
    return found


def missing_views(con: duckdb.DuckDBPyConnection) -> list[str]:
    """``CREATE TEMP VIEW`` statements that give an older file this loopscope's views.

    A file from an older loopscope (read-only, so not migrated) still answers queries on
    the views when the reading connection runs these first: they live in the
    connection's temporary catalog (hiding the file's own views of the same names) and
    read the file's tables; a file from before ``m009_model_calls`` is given an empty
    ``model_calls`` and ``turns`` with the new columns NULL.
    """
    if schema_version(con) >= SCHEMA_VERSION:
        return []
    from .views import views

    database = con.execute("SELECT current_database()").fetchall()[0][0]
    tables = {
        (r[0], r[1])
        for r in con.execute(
            "SELECT table_name, column_name FROM duckdb_columns() WHERE database_name = current_database() "
            "AND schema_name = 'main' AND table_name IN ('turns', 'model_calls')"
        ).fetchall()
    }
    statements = []
    if not any(table == "model_calls" for table, _ in tables):
        # no model calls were recorded before m009_model_calls: an empty relation of the same columns
        columns = MODEL_CALLS_DDL.split("(", 1)[1].rsplit(")", 1)[0]
        typed = ", ".join(
            f"NULL::{kind} AS {name}" for name, kind, *_ in (line.strip().rstrip(",").split() for line in columns.splitlines() if line.strip())
        )
        statements.append(f"CREATE OR REPLACE TEMP VIEW model_calls AS SELECT {typed} WHERE false")
    missing = [name for name in TURN_CALL_COLUMNS if ("turns", name) not in tables]
    if missing:
        added = ", ".join(f"NULL::{TURN_CALL_COLUMNS[name]} AS {name}" for name in missing)
        statements.append(f"CREATE OR REPLACE TEMP VIEW turns AS SELECT *, {added} FROM {_quoted(database)}.main.turns")
    if not _has_tables(con, "scores"):  # no scores before m018_scores: an empty relation of the same columns
        from .views import SCORES_DDL

        columns = SCORES_DDL.split("(", 1)[1].rsplit(")", 1)[0]
        typed = ", ".join(
            f"NULL::{kind} AS {name}" for name, kind, *_ in (line.strip().rstrip(",").split() for line in columns.splitlines() if line.strip())
        )
        statements.append(f"CREATE OR REPLACE TEMP VIEW scores AS SELECT {typed} WHERE false")
    # every view, as this loopscope defines it (a temporary view hides the file's own of the same name)
    definitions = views(
        tool_columns=has_tool_columns(con), tool_totals=has_tool_totals(con), sorted_durations=has_sorted_durations(con),
    )
    from .views import EMPTY_SCORE_TARGETS, SCORE_VIEWS

    definitions = {**definitions, **SCORE_VIEWS}
    if not _has_tables(con, "scores"):
        definitions["score_targets"] = EMPTY_SCORE_TARGETS
    return [*statements, *(f"CREATE OR REPLACE TEMP VIEW {name} AS {sql.strip()}" for name, sql in definitions.items())]


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def has_tool_columns(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the ``events`` table of the open file (the connection's default database)
    has the tool columns of ``m004_tool_columns`` (a file of an older loopscope, read without
    migrating it, has not)."""
    row = con.execute(
        "SELECT count(*) FROM duckdb_columns() WHERE database_name = current_database() AND schema_name = 'main' "
        "AND table_name = 'events' AND column_name = 'tool_name'"
    ).fetchone()
    return bool(row and row[0])


def _has_tables(con: duckdb.DuckDBPyConnection, *names: str) -> bool:
    """Whether the open file (the connection's default database) has every table of ``names``."""
    row = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE database_name = current_database() AND schema_name = 'main' "
        "AND list_contains(?, table_name)", [list(names)]
    ).fetchone()
    return bool(row and row[0] == len(names))


def has_tool_totals(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the open file (the connection's default database) has the tables of
    ``m010_tool_totals`` (an older file, read without migrating it, has not)."""
    from .views import TOOL_DURATIONS, TOOL_TOTALS

    return _has_tables(con, TOOL_TOTALS, TOOL_DURATIONS)


def has_sorted_durations(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the open file (the connection's default database) has the table of
    ``m013_sorted_durations`` (an older file, read without migrating it, has not)."""
    from .views import SORTED_DURATIONS

    return _has_tables(con, SORTED_DURATIONS)


def has_model_calls(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the open file (the connection's default database) has the ``model_calls``
    table and the turns' cost columns of ``m009_model_calls`` (an older file, read without
    migrating it, has not)."""
    return _has_tables(con, "model_calls")
