"""``loopscope calls``: every model call, with its model, timing, tokens, cost and outcome."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..dashboards import tables
from . import _args
from .commands import ellipsis, emit, emit_json, open_store, resolve_session

if TYPE_CHECKING:
    from ..storage.queries import Reader


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    calls = sub.add_parser(
        "calls",
        parents=[common],
        help="model calls: model, duration, time to first chunk, tokens, cost, outcome (--slowest, --failed)",
        description="One line per model call (one per chat span), oldest first: the most recent --limit calls, "
        "of every session or of --session. POS is the call's place in its turn; TTFC the time to the first "
        "chunk of a stream; COST is in USD from genai-prices' database or your overrides (configure(prices=...), "
        "LOOPSCOPE_PRICES), - when no price is known for the model. --slowest orders by duration instead.",
    )
    calls.add_argument("--session", "-s", metavar="SESSION", help="only this session (its id or a unique prefix)")
    calls.add_argument("--model", metavar="NAME", help="only calls of this model (as requested or as answered)")
    calls.add_argument("--provider", metavar="NAME", help="only calls to this provider (openai, anthropic, ...)")
    calls.add_argument("--slowest", action="store_true", help="the longest calls first")
    calls.add_argument("--failed", action="store_true", help="only calls that ended in an error")
    # filters (issue 35)
    calls.add_argument("--since", type=_args.since, metavar="WHEN",
                       help="only calls started since WHEN: a duration back from now (30m, 2h, 3d) or an ISO date or time")
    calls.add_argument("--search", type=_args.search_text, metavar="TEXT",
                       help="only calls whose output (what they generated) or error holds TEXT "
                       "(with --tool: arguments, result or error)")
    calls.add_argument("--tool", metavar="NAME",
                       help="list this tool's calls instead of model calls (with --failed, --slowest, --since, ...)")
    calls.add_argument("--limit", type=_args.non_negative_int, default=50, metavar="N",
                       help="the most recent (or, with --slowest, the longest) N calls (default: 50; 0 = all)")
    _args.add_json(calls, "the calls (with their parameters and the provider's usage figures)")
    calls.set_defaults(handler=calls_command)


def calls_command(args: argparse.Namespace) -> int:
    store = open_store(args)
    session = _session(store, args.session)
    if args.tool is not None:
        from .search import tool_calls_command

        return tool_calls_command(args, session)
    if args.json:  # the public models' JSON
        found = store.model_calls(
            session, model=args.model, provider=args.provider, failed=args.failed, slowest=args.slowest,
            limit=args.limit or None, since=args.since, search=args.search,
        )
        emit_json([c.model_dump(mode="json", exclude={"input_messages", "output_messages"}) for c in found])
        return 0
    # the table from plain rows: no pydantic, no models
    rows = store.calls(
        session, model=args.model, provider=args.provider, failed=args.failed, slowest=args.slowest,
        limit=args.limit or None, since=args.since, search=args.search,
    )
    if not rows:
        narrowed = any((session, args.model, args.provider, args.failed, args.since, args.search))
        emit("no model calls match" if narrowed else "no model calls yet")
        return 0
    emit(tables.calls_table(rows, show_session=session is None, ellipsis=ellipsis()))
    unpriced = sum(1 for c in rows if c.cost_usd is None and c.usage)
    priced = [c.cost_usd for c in rows if c.cost_usd is not None]
    summary = f"{len(rows)} call{'s' if len(rows) != 1 else ''}"
    if priced:
        summary += f", {tables.usd(sum(priced))}"
    if unpriced:
        summary += f"; {unpriced} without a price"
    emit(f"({summary}; durations in ms)")
    return 0


def _session(store: Reader, requested: str | None) -> str | None:
    """The session asked for: one of model calls alone (no events) is taken as named; else
    an id or a unique prefix (None: every session)."""
    if requested is None:
        return None
    if store.calls(requested, limit=1):
        return requested
    return resolve_session(store, requested)
