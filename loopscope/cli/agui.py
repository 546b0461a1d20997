"""``loopscope import --agui FILE`` and ``loopscope export --agui SESSION``: AG-UI event
streams into and out of the store (:mod:`loopscope.ingest.agui`)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..dashboards.tables import json_visible, one_line
from . import _args
from .commands import CommandError, db_path, emit, emit_json, open_store, resolve_session, warn

if TYPE_CHECKING:
    from ..storage.queries import Reader


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    parser = sub.add_parser(
        "import",
        parents=[common],
        help="store an AG-UI event stream (SSE or JSON lines): messages, tool calls, state, turns",
        description="Read an AG-UI event stream (SSE as an AG-UI server sends it, JSON lines, or a JSON array) "
        "into the store: text messages, tool call starts and ends, state snapshots and deltas as the "
        "session's timeline, one turn summary per run (session = the thread id), and every event verbatim "
        "(table agui_events), so that `loopscope export --agui` gives the stream back. The whole stream "
        "is checked first: a malformed event (named by its line) stores nothing. Runs already stored "
        "are skipped, so importing a file twice adds nothing.",
    )
    parser.add_argument("--agui", metavar="FILE", required=True, help="the stream file ('-' reads stdin)")
    parser.add_argument(
        "--session", metavar="ID", help="store every run under this session id instead of its thread id"
    )
    _args.add_json(parser, "what was stored")
    parser.set_defaults(handler=run_import)


def _require_agui() -> None:
    try:
        import ag_ui.core  # noqa: F401 - only whether it imports
    except ImportError:
        raise CommandError("AG-UI streams need the ag-ui-protocol package: pip install 'loopscope[agui]'") from None


def run_import(args: argparse.Namespace) -> int:
    from ..ingest.agui import import_stream

    _require_agui()
    source: bytes | Path
    if args.agui == "-":
        source = sys.stdin.buffer.read()
    else:
        path = Path(os.path.expanduser(args.agui))
        if not path.is_file():
            raise CommandError(f"no file {path} to import")
        source = path
    wait = getattr(args, "wait", 10.0)
    result = import_stream(source, db_path(args), session=args.session, lock_timeout=wait)
    if args.json:
        emit_json({
            "db": result.path, "sessions": result.sessions, "received": result.received,
            "stored_events": result.raw_events, "rows": result.events, "turns": result.turns, "runs": result.runs,
            "skipped_runs": result.skipped_runs, "unmatched_results": result.unmatched_results,
        })
        return 0
    sessions = ", ".join(result.sessions) or "-"
    emit(
        f"imported {result.raw_events} of {result.received} AG-UI events into {result.path}: "
        f"{result.runs} runs, {result.events} timeline rows, {result.turns} turns (session {sessions})"
    )
    if result.skipped_runs:
        emit(f"skipped {len(result.skipped_runs)} runs stored already: {', '.join(map(one_line, result.skipped_runs))}")
    if result.unmatched_results:
        emit(f"{result.unmatched_results} tool results answered calls this store has no start of (kept raw only)")
    return 0


def add_export_arguments(export: argparse.ArgumentParser, mode: argparse._MutuallyExclusiveGroup) -> None:
    """``--agui SESSION`` (in the export mode group) and ``--output``."""
    mode.add_argument(
        "--agui", metavar="SESSION",
        help="write the session as an AG-UI event stream (SSE) instead: imported runs verbatim, "
        "recorded turns as RUN_STARTED .. TEXT_MESSAGE_* / TOOL_CALL_* / STATE_* .. RUN_FINISHED",
    )
    export.add_argument("--run", metavar="RUN_ID", help="with --agui: only this run (a turn's correlation id)")
    export.add_argument("--output", "-o", metavar="FILE", help="with --agui: write to FILE instead of stdout")


def refuse_agui_flags(args: argparse.Namespace) -> None:
    """``--run`` / ``--output`` belong to ``--agui``: with ``--parquet`` they are an error."""
    given = [flag for flag, value in (("--run", args.run), ("--output", args.output)) if value is not None]
    if given:
        verb = "go" if len(given) > 1 else "goes"
        raise CommandError(f"{' and '.join(given)} {verb} with --agui, not --parquet")


def run_export(args: argparse.Namespace) -> int:
    from ..ingest.agui import iter_session

    _require_agui()
    store = open_store(args)
    session = _session(store, args.agui)
    chunks = iter_session(session, store.path, run_id=args.run, lock_timeout=store.lock_timeout)
    if args.output:
        target = Path(os.path.expanduser(args.output))
        count = 0
        with target.open("w", encoding="utf-8", newline="") as out:
            for chunk in chunks:
                out.write(chunk)
                count += 1
        warn(f"wrote {count} AG-UI events of session {session} to {target}")
        return 0
    out = sys.stdout
    for chunk in chunks:  # a terminal's or a pipe's: DEL, C1 and bidi controls as JSON escapes (the same events once read)
        out.write(json_visible(chunk))
    out.flush()
    return 0


def _session(store: Reader, requested: str) -> str:
    """The session named (or uniquely prefixed); one that only has imported events counts too."""
    try:
        return resolve_session(store, requested)
    except CommandError:
        if store.has_agui_events(requested):
            return requested
        raise
