"""``loopscope search TEXT``: where a text is in the store's content (messages, tool names,
arguments, results, errors, model calls' output), and the tool call list ``loopscope
calls --tool NAME`` prints (issue 35)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from ..dashboards import tables
from . import _args
from .commands import CommandError, ellipsis, emit, emit_json, open_store, resolve_session

if TYPE_CHECKING:
    from ..storage.results import SearchHit, ToolCallRow


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    search = sub.add_parser(
        "search",
        parents=[common],
        help="where a text is in the store: messages, tool names, arguments, results, errors",
        description="Search the store's content for TEXT (any case): the messages of the timeline, tool calls' "
        "names, arguments, results and errors, and what model calls generated or failed with. One line per place "
        "found, newest first: the session, the turn, the event's index, what matched (FIELD) and the text around "
        "it. A plain scan of the stored text (no index): see docs/cli.md.",
    )
    search.add_argument("text", type=_args.search_text, metavar="TEXT", help="the text to look for (any case)")
    search.add_argument("--session", "-s", metavar="SESSION", help="only this session (its id or a unique prefix)")
    search.add_argument("--limit", type=_args.non_negative_int, default=50, metavar="N",
                        help="at most N places (default: 50; 0 = 1,000)")
    _args.add_json(search, "the places found")
    search.set_defaults(handler=search_command)


def search_command(args: argparse.Namespace) -> int:
    store = open_store(args)
    session = resolve_session(store, args.session) if args.session is not None else None
    hits = store.search(args.text, session_id=session, limit=args.limit or 1000)
    if args.json:
        emit_json([hit_json(h) for h in hits])
        return 0
    if not hits:
        emit(f"nothing in the store holds {args.text!r}")
        return 0
    emit(hits_table(hits, show_session=session is None))
    emit(f"({len(hits)} place{'s' if len(hits) != 1 else ''}, newest first)")
    return 0


def hit_json(hit: SearchHit) -> dict[str, Any]:
    """A search hit as JSON (its fields by name, the time as ISO text)."""
    data = hit._asdict()
    data["at"] = hit.at.isoformat() if hit.at else None
    return data


def hits_table(hits: list[SearchHit], *, show_session: bool = True) -> str:
    names = ["TIME", *(["SESSION"] if show_session else []), "TURN", "IDX", "KIND", "TOOL", "FIELD", "MATCH"]
    rows = [
        [tables.stamp(h.at), *([h.session_id] if show_session else []), (h.turn_id or "-")[:12],
         h.index if h.index is not None else "-", h.kind, h.tool or "", h.field, h.snippet]
        for h in hits
    ]
    return tables.sql_table(names, rows, ellipsis=ellipsis())


# -- tool calls (``loopscope calls --tool NAME``) ----------------------------------------------------


def tool_calls_command(args: argparse.Namespace, session: str | None) -> int:
    """``loopscope calls --tool NAME``: that tool's calls (``--failed``, ``--slowest``,
    ``--since``, ``--search``, ``--session`` narrow or order them)."""
    if args.model or args.provider:
        raise CommandError("--tool lists tool calls; --model and --provider narrow model calls (use one or the other)")
    store = open_store(args)
    rows = store.tool_calls(
        session, tool=args.tool, failed=args.failed, slowest=args.slowest, since=args.since, search=args.search,
        limit=args.limit or None,
    )
    if not args.slowest:
        rows.reverse()  # the most recent, oldest first (as the model calls are)
    if args.json:
        emit_json([tool_call_json(r) for r in rows])
        return 0
    if not rows:
        emit(f"no calls of the tool {args.tool!r} match")
        return 0
    names = ["STARTED", *(["SESSION"] if session is None else []), "TURN", "IDX", "TOOL", "CALL ID", "OUTCOME", "MS",
             "ERROR / ARGUMENTS"]
    cells = [
        [tables.stamp(r.started_at or r.ended_at), *([r.session_id] if session is None else []), (r.turn_id or "-")[:12],
         r.start_index if r.start_index is not None else r.end_index, r.tool, r.call_id,
         r.outcome or ("running" if r.end_index is None else r.status), tables.millis(r.duration_ms),
         r.error or tables.compact_json(r.arguments)]
        for r in rows
    ]
    emit(tables.sql_table(names, cells, ellipsis=ellipsis()))
    emit(f"({len(rows)} call{'s' if len(rows) != 1 else ''}; durations in ms)")
    return 0


def tool_call_json(row: ToolCallRow) -> dict[str, Any]:
    """A tool call as JSON (its fields by name, the times as ISO text)."""
    data = row._asdict()
    for key in ("started_at", "ended_at"):
        data[key] = data[key].isoformat() if data[key] else None
    return data
