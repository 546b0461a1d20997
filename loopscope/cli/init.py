"""``loopscope init``: make the store ``--db`` names ready to be written, writing no data.

For a deployment whose schema step runs once before anything writes: the Collectors'
``clickhouseexporter`` writes ``otel_traces`` only, so loopscope's tables and the materialized
views that fill them must exist before the first span lands (docs/clickhouse.md,
docs/scale/docker-compose.yml's ``loopscope-schema`` service). On a ClickHouse URL it runs the
engine's DDL (``otel_traces`` as the exporter makes it, loopscope's tables and views; each
statement ``IF NOT EXISTS``: running it again changes nothing); on a DuckDB path it creates the
file, or migrates an older one to this loopscope's schema. It prints what it did."""

from __future__ import annotations

import argparse
import os
from typing import Any

from ..storage.errors import StoreError
from . import _args
from .commands import CommandError, db_path, emit, emit_json


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    init = sub.add_parser(
        "init",
        parents=[common],
        help="make the store --db names ready to be written (its schema), writing no data",
        description="Make the store --db names ready to be written, without writing data: on a ClickHouse URL "
        "(clickhouse://host:8123/db, chdb:///dir) the otel_traces table as the Collector's clickhouseexporter makes it "
        "and loopscope's tables and the materialized views that fill them, each IF NOT EXISTS (run it once before the "
        "Collectors start; again, it changes nothing); on a DuckDB path the file created, or migrated to this "
        "loopscope's schema.",
    )
    init.add_argument(
        "--ttl-days", type=_args.non_negative_int, default=0, metavar="N",
        help="ClickHouse: keep N days (every table it makes drops whole days past it; give the exporter's ttl "
        "the same); 0, the default: keep everything. A table that exists keeps its own",
    )
    _args.add_json(init, "what was done")
    init.set_defaults(handler=init_command)


def init_command(args: argparse.Namespace) -> int:
    from ..storage.queries import engine_of, open_reader, prepare

    db = db_path(args)
    wait = getattr(args, "wait", 10.0)
    engine = engine_of(db)
    if engine == "duckdb" and args.ttl_days:
        raise CommandError("--ttl-days is for a ClickHouse store: a DuckDB file keeps every row")
    reader = open_reader(db, lock_timeout=wait)
    try:
        before = _state(reader, engine, db)
        try:
            name = prepare(db, timeout=wait, ttl_days=args.ttl_days)
        except StoreError as exc:
            raise CommandError(f"cannot prepare {db}: {exc}") from None
        after = open_reader(name, lock_timeout=wait).status() if engine == "duckdb" else reader.status()
    finally:
        close = getattr(reader, "close", None)  # a ClickHouse reader keeps its connection (a chDB directory) until closed
        if close is not None:
            close()
    done: dict[str, Any] = {"store": name, "engine": engine, "schema_version": after.schema_version,
                            "ttl_days": args.ttl_days if engine == "clickhouse" else None}
    if engine == "clickhouse":
        done["action"] = "unchanged" if before else "created"
        done["sessions"], done["events"] = after.sessions, after.events
    else:
        done["action"] = "created" if before is None else "unchanged" if before == after.schema_version else "migrated"
        done["from_version"] = before
    if args.json:
        emit_json(done)
        return 0
    emit(_said(done))
    return 0


def _state(reader: Any, engine: str, db: str) -> Any:
    """What the store was before: ClickHouse, whether loopscope's tables were there; a DuckDB
    file, its schema version (None: no file, or one nothing was written to yet)."""
    if engine == "clickhouse":
        return reader.ready()
    if not os.path.exists(db):
        return None
    try:
        return reader.status().schema_version
    except StoreError as exc:
        if "holds no loopscope data yet" in str(exc):
            return None
        raise CommandError(f"{db}: {exc}") from None


def _said(done: dict[str, Any]) -> str:
    store, action = done["store"], done["action"]
    if done["engine"] == "clickhouse":
        keep = f"rows kept {done['ttl_days']} days" if done["ttl_days"] else "every row kept"
        if action == "created":
            return (f"made loopscope's schema on {store}: otel_traces (as the Collector's clickhouseexporter makes it), "
                    f"loopscope's tables and the materialized views that fill them ({keep}); ready for the Collectors")
        return (f"{store} already had loopscope's tables ({done['sessions']} sessions, {done['events']} events): "
                "each statement ran IF NOT EXISTS, nothing changed (a table keeps the retention it was made with)")
    version = done["schema_version"]
    if action == "created":
        return f"created {store}: an empty loopscope store, schema version {version}"
    if action == "migrated":
        return f"migrated {store} from schema version {done['from_version']} to {version}"
    return f"{store} is ready: schema version {version}, nothing to change"


__all__ = ["init_command", "register"]
