"""The commands behind ``loopscope``: each reads the store and prints a table or JSON."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import TYPE_CHECKING, Any

from ..dashboards import tables
from ..storage.errors import StoreError
from ..storage.recording import default_db_path

if TYPE_CHECKING:
    from ..storage.queries import Reader

# The store's engine (DuckDB, or ClickHouse by URL) and pydantic (the public models) are
# imported by the commands that read the store, through the query API
# (loopscope.storage.queries), not here: ``loopscope --help`` and ``loopscope run`` need none of them.


class CommandError(Exception):
    """A command cannot do what was asked; the message is shown as one line."""


# -- output ----------------------------------------------------------------------------------


def _encodable(text: str) -> bool:
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    try:
        text.encode(encoding)
        return True
    except (UnicodeEncodeError, LookupError):
        return False


def emit(text: str = "", *, flush: bool = False) -> None:
    """Print to stdout: control characters as visible escapes (:func:`tables.visible`:
    stored text is not the terminal's to act on), characters the terminal cannot show as
    ``?`` instead of failing. Every line a command prints to stdout comes through here or
    :func:`emit_json`, to a terminal or a pipe alike (``| less -R`` is a terminal too)."""
    text = tables.visible(text)
    if not _encodable(text):
        encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
        text = text.encode(encoding, "replace").decode(encoding)
    print(text, flush=flush)


def warn(text: str) -> None:
    """One line to stderr (an error, a note), its control characters shown as escapes:
    a message may quote a stored value (DuckDB's errors do) or a path."""
    print(tables.visible(text), file=sys.stderr, flush=True)


def ellipsis() -> str:
    return tables.ELLIPSIS if _encodable(tables.ELLIPSIS) else "..."


def emit_json(value: Any) -> None:
    """Valid JSON on stdout; non-ASCII text escaped when the terminal cannot show it."""
    print(json_text(value, indent=2))


def json_text(value: Any, indent: int | None = None) -> str:
    """``value`` as JSON text a terminal only shows: ``json.dumps`` escapes C0 controls,
    :func:`tables.json_visible` the DEL, C1 and bidi controls it leaves raw (the same
    JSON once read); all non-ASCII escaped when stdout's encoding cannot hold it."""
    text = json.dumps(value, indent=indent, ensure_ascii=False, allow_nan=False)
    if not _encodable(text):
        text = json.dumps(value, indent=indent, ensure_ascii=True, allow_nan=False)
    return tables.json_visible(text)


def silence_stdout() -> None:
    """After a broken pipe, point stdout at /dev/null so the interpreter's final flush stays quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def describe(exc: BaseException) -> str:
    """One line that says what went wrong."""
    text = str(exc).strip()
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    if isinstance(exc, (StoreError, ValueError, CommandError)) and first:
        return first
    # the engine the store's connections use (``_duckdb``: storage/duckdb/engine.py), or the package;
    # neither imported: the error is not DuckDB's
    for name in ("_duckdb", "duckdb"):
        duckdb = sys.modules.get(name)
        if duckdb is not None and isinstance(exc, duckdb.Error):
            return f"SQL failed: {first}" if first else f"SQL failed: {type(exc).__name__}"
    if isinstance(exc, OSError) and first:
        return first
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


# -- shared steps ----------------------------------------------------------------------------


def db_path(args: argparse.Namespace) -> str:
    """``--db``, else ``LOOPSCOPE_DB``, else ``./loopscope.duckdb``."""
    return os.path.expanduser(getattr(args, "db", None) or default_db_path())


def open_store(args: argparse.Namespace) -> Reader:
    """The query API of the store ``--db`` names (a DuckDB file, or a ``clickhouse://`` URL)."""
    from ..storage.queries import open_reader

    return open_reader(db_path(args), lock_timeout=getattr(args, "wait", 10.0))


def resolve_session(store: Reader, requested: str | None) -> str:
    """The session a command is about: the one named (or uniquely prefixed), else the most recent."""
    found = store.session(requested)
    if found.session_id is not None:
        return found.session_id
    if requested is None:
        raise CommandError(f"the store {store.path} holds no sessions yet (run an instrumented agent, or `loopscope demo`)")
    if not found.candidates:
        raise CommandError(f"no session {requested!r} in {store.path} (list them with `loopscope sessions`)")
    shown = ", ".join(found.candidates[:5]) + (", ..." if len(found.candidates) > 5 else "")
    raise CommandError(f"{requested!r} matches several sessions ({shown}); give more of the id")


def _running_ids(events: list[Any]) -> set[str]:
    """Tool calls whose start is on the page and whose end is not (yet) anywhere."""
    from ..models import ToolCallContent

    started: dict[str, None] = {}
    for e in events:
        if isinstance(e.content, ToolCallContent):
            key = e.content.tool_id or e.span_id or ""  # a call without an id: by its span
            if e.type == "tool_call_start":
                started[key] = None
            elif e.type == "tool_call_end":
                started.pop(key, None)
    return set(started)


# -- commands --------------------------------------------------------------------------------


def demo(args: argparse.Namespace) -> int:
    from .. import demo as demo_module
    from ..storage.queries import open_reader

    result = demo_module.run(db_path(args), session_id=args.session)
    store = open_reader(result.db_path, lock_timeout=getattr(args, "wait", 10.0))
    events = store.timeline(result.session_id)
    turns = store.turns(result.session_id, limit=None)
    costs = store.turn_costs([t.correlation_id for t in turns])
    if args.json:
        emit_json(
            {
                "session_id": result.session_id,
                "db": result.db_path,
                "events": [e.model_dump(mode="json") for e in events],
                "turns": turns_json(turns, costs),
            }
        )
        return 0
    cut = ellipsis()
    emit(f"Recorded session {result.session_id}: {len(turns)} turns, {len(events)} events in {result.db_path}")
    emit()
    emit("Timeline")
    emit(tables.events_table(events, ellipsis=cut))
    emit()
    emit("Turns")
    emit(tables.turns_table(turns, costs=costs, ellipsis=cut))
    db_flag = f" --db {shlex.quote(result.db_path)}" if getattr(args, "db", None) else ""
    query = (
        "SELECT tool_name AS tool, tool_outcome AS outcome, count(*) AS n "
        "FROM events WHERE type = 'tool_call_end' GROUP BY ALL ORDER BY ALL"
    )
    emit()
    emit("Next:")
    emit(f"  loopscope timeline {shlex.quote(result.session_id)}{db_flag} --json")
    emit(f"  loopscope turns{db_flag}")
    emit(f'  loopscope sql{db_flag} "{query}"')
    return 0


def timeline(args: argparse.Namespace) -> int:
    if args.after is not None and args.before is not None:
        raise CommandError(
            "--after and --before cannot be used together (page forwards with --after, backwards with --before)"
        )
    from ..storage.policy import EventFilter

    store = open_store(args)
    session = resolve_session(store, args.session)
    event_filter = EventFilter(
        include_blocked=args.include_blocked, event_types=args.type, tool_name=args.tool, failed=args.failed,
        text=args.search,
    )
    narrowed = bool(args.type or args.tool or args.failed or args.search)
    events = store.timeline(
        session,
        limit=args.limit or None,
        after_index=args.after,
        before_index=args.before,
        event_filter=event_filter,
        newest_first=args.newest,
    )
    if args.json:
        emit_json([e.model_dump(mode="json") for e in events])
        return 0
    total = store.event_count(session, event_filter)
    db_flag = f" --db {shlex.quote(store.path)}" if getattr(args, "db", None) else ""
    if not events:
        where = (
            f" after index {args.after}"
            if args.after is not None
            else f" before index {args.before}"
            if args.before is not None
            else ""
        )
        emit(f"session {tables.one_line(session)}: no events{' match' if narrowed else ''}{where} ({total} in all)")
        return 0
    first, last = events[0].index, events[-1].index
    later = bool(store.timeline(session, limit=1, after_index=last, event_filter=event_filter))
    earlier = bool(store.timeline(session, limit=1, before_index=first, event_filter=event_filter))
    matching = " matching" if narrowed else ""
    emit(f"session {tables.one_line(session)}: events {first}-{last} ({len(events)} of {total}{matching})")
    running = set() if later or narrowed else _running_ids(events)
    emit(tables.events_table(events, running=running, ellipsis=ellipsis()))
    hints = []
    quoted = shlex.quote(session)  # a command to copy: the id is one word of it, whatever it holds
    if earlier:
        hints.append(f"earlier: loopscope timeline {quoted}{db_flag} --before {first}")
    if later:
        hints.append(f"later: loopscope timeline {quoted}{db_flag} --after {last}")
    for hint in hints:
        emit(hint)
    return 0


def turns(args: argparse.Namespace) -> int:
    from ..storage.policy import TurnFilter

    store = open_store(args)
    session = resolve_session(store, args.session) if args.session is not None else None
    turn_filter = TurnFilter(
        agent=args.agent, reason=args.reason, model=args.model, since=args.since, min_cost=args.min_cost,
        text=args.search,
    )
    if turn_filter == TurnFilter():
        turn_filter = None
    if args.json:  # the public models' JSON, with the cost the table shows
        found = store.turns(session, limit=args.limit or None, newest_first=True, turn_filter=turn_filter)
        emit_json(turns_json(found, store.turn_costs([t.correlation_id for t in found])))
        return 0
    # the table from plain rows: no pydantic, no models (``loopscope turns`` starts in a third of the time)
    rows = store.turn_rows(session, args.limit or None, newest_first=True, turn_filter=turn_filter)
    if not rows:
        where = f" in session {tables.one_line(session)}" if session else ""
        emit(f"no turns{where} match" if turn_filter else f"no turns{where} yet")
        return 0
    costs = store.turn_costs([t.correlation_id for t in rows])
    emit(tables.turns_table(rows, show_session=session is None, costs=costs, ellipsis=ellipsis()))
    return 0


def turns_json(turns: list[Any], costs: dict[tuple[str | None, str | None], float | None]) -> list[dict[str, Any]]:
    """Turns as the public models' JSON, each with ``cost_usd`` (the COST the table shows;
    null without a price)."""
    return [{**t.model_dump(mode="json"), "cost_usd": costs.get((t.session_id, t.correlation_id))} for t in turns]


def sessions(args: argparse.Namespace) -> int:
    store = open_store(args)
    search = getattr(args, "search", None)
    found = store.sessions(limit=args.limit or None, search=search)
    costs = store.session_costs([s.session_id for s in found])
    if args.json:  # the public models' JSON, with the cost the table shows
        emit_json([{**s.model_dump(mode="json"), "cost_usd": costs.get(s.session_id)} for s in found])
        return 0
    if not found:
        emit(f"no sessions match {search!r}" if search else "no sessions yet")
        return 0
    emit(tables.sessions_table(found, costs=costs, ellipsis=ellipsis()))
    return 0


def _record_keys(names: list[str]) -> list[str]:
    """Column names as JSON keys; a repeated name gets a suffix so that no value is lost."""
    seen: dict[str, int] = {}
    keys = []
    for name in names:
        count = seen.get(name, 0)
        seen[name] = count + 1
        keys.append(name if count == 0 else f"{name}_{count}")
    return keys


def sql(args: argparse.Namespace) -> int:
    store = open_store(args)
    names, rows = store.sql(args.query)
    if args.json:
        keys = _record_keys(names)
        emit_json([{k: _json_value(v) for k, v in zip(keys, row)} for row in rows])
        return 0
    if not names:
        emit("OK")
        return 0
    emit(tables.sql_table(names, rows, ellipsis=ellipsis()))
    emit(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return 0


def _json_value(value: Any) -> Any:
    """A SQL value as JSON: timestamps as ISO text, decimals and UUIDs as text, NaN as "nan"."""
    from .._json import to_jsonable

    return to_jsonable(value)
