"""``loopscope stats`` and ``loopscope tools``: the store's analytics views as terminal tables."""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ..dashboards import tables
from ..dashboards.tables import Column
from . import _args
from .commands import ellipsis, emit, emit_json, open_store

if TYPE_CHECKING:
    from ..storage.queries import Reader

# -- registration ------------------------------------------------------------------------------


def register_stats(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    stats = sub.add_parser(
        "stats",
        parents=[common],
        help="totals: sessions, turns, events, tool calls and their failure share, loop end reasons, tokens, cost",
        description="An overview of the store: how many sessions, turns, events and tool calls it holds, "
        "how the finished tool calls went (served, failed, refused, ...), why turns ended, and the tokens "
        "spent per model, model calls and their cost in USD (with how many calls have no known price). Reads the "
        "views tool_stats, turn_summaries, loop_end_reasons, model_usage and cost_totals.",
    )
    _args.add_json(stats, "the overview")
    stats.set_defaults(handler=stats_command)


def register_tools(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    tools = sub.add_parser(
        "tools",
        parents=[common],
        help="per tool: calls, running, outcomes, failure share, p50/p95/p99 duration (--declared: offered vs used)",
        description="One line per tool from the tool_stats view: calls, calls still running, the outcomes of "
        "the finished ones, the share that did not succeed, duration percentiles and when it was last seen. "
        "With --declared, the declared_vs_used view instead: per agent, each tool its turns offered the "
        "model, in how many turns, and how often it was called (tools offered but never called make every "
        "prompt longer).",
    )
    tools.add_argument(
        "--sort",
        choices=("calls", "failures", "p95", "name"),
        default="calls",
        help="order of the lines (default: calls, most first; failures: highest failure share first)",
    )
    tools.add_argument("--declared", action="store_true", help="per agent: tools declared in its turns vs tools called")
    tools.add_argument("--agent", metavar="NAME", help="with --declared: only this agent")
    tools.add_argument("--limit", type=_args.non_negative_int, default=0, metavar="N", help="at most N lines (default: 0 = all)")
    _args.add_json(tools, "the rows")
    tools.set_defaults(handler=tools_command)


# -- helpers ------------------------------------------------------------------------------------


def _outcomes() -> tuple[str, ...]:
    from ..storage.results import TOOL_OUTCOMES  # the outcomes' order, as the views count them

    return TOOL_OUTCOMES


def _jsonable(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from .._json import to_jsonable

    return [{k: to_jsonable(v) for k, v in r.items()} for r in records]


def count(value: Any) -> str:
    return "" if value is None else f"{int(value):,}"


def share(value: Any) -> str:
    return "" if value is None else f"{float(value) * 100:.1f}%"


def ms(value: Any) -> str:
    if value is None:
        return ""
    value = float(value)
    return f"{value:.2f}" if value < 1 else f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def ago(when: datetime | None, now: datetime) -> str:
    """How long ago, in the largest whole unit: ``40s ago``, ``5m ago``, ``3h ago``, ``2d ago``."""
    if when is None:
        return ""
    seconds = max(0, int((now - when).total_seconds()))
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


# -- stats --------------------------------------------------------------------------------------


def overview(store: Reader) -> dict[str, Any]:
    """Everything ``loopscope stats`` shows, as plain values."""
    return store.stats().as_dict()


def stats_command(args: argparse.Namespace) -> int:
    store = open_store(args)
    data = overview(store)
    if args.json:
        from .._json import to_jsonable

        emit_json({"db": store.path, **to_jsonable(data)})
        return 0
    cut = ellipsis()
    calls = data["tool_calls"]
    tokens = data["tokens"]
    costs = data["costs"]
    span = ""
    if data["first_at"] is not None:
        span = f"{tables.stamp(data['first_at'])} .. {tables.stamp(data['last_at'])}"
    tool_line = f"finished {count(calls['finished'])}, running {count(calls['pending'])}"
    if calls["failure_share"] is not None:
        tool_line += f"; not served {share(calls['failure_share'])}"
    token_parts = [
        (label, tokens[key])
        for label, key in (
            ("in", "input_tokens"), ("out", "output_tokens"), ("cache read", "cache_read_input_tokens"),
            ("cache write", "cache_creation_input_tokens"), ("reasoning", "reasoning_tokens"),
        )
        if tokens[key]
    ]
    rows = [
        ["sessions", count(data["sessions"]), span],
        ["turns", count(data["turns"]), f"agents {count(data['agents'])}" if data["agents"] else ""],
        ["events", count(data["events"]), ""],
        ["tool calls", count(calls["calls"]), tool_line if calls["calls"] else ""],
        ["tokens", count(tokens["total_tokens"] or 0), "  ".join(f"{label} {count(v)}" for label, v in token_parts)],
        ["model calls", count(costs["model_calls"]), ""],
        ["cost", tables.usd(costs["cost_usd"]) or "-", _unpriced(costs["unpriced_calls"])],
    ]
    emit(f"Store {store.path}")
    emit(tables.render([Column(""), Column("", "right"), Column("", shrink=1, min_width=20)], rows, ellipsis=cut).split("\n", 2)[2])
    if calls["finished"]:
        emit()
        emit("Tool call outcomes")
        finished = calls["finished"]
        emit(tables.render(
            [Column("OUTCOME"), Column("CALLS", "right"), Column("SHARE", "right")],
            [[o, count(calls[o]), share(calls[o] / finished)] for o in _outcomes() if calls[o]],
            ellipsis=cut,
        ))
    if data["loop_end_reasons"]:
        emit()
        emit("Loop end reasons")
        emit(tables.render(
            [Column("REASON"), Column("TURNS", "right"), Column("SHARE", "right"), Column("AVG MS", "right")],
            [[r["loop_end_reason"] or "(none)", count(r["turns"]), share(r["share"]), ms(r["avg_latency_ms"])]
             for r in data["loop_end_reasons"]],
            ellipsis=cut,
        ))
    if data["models"]:
        emit()
        emit("Models")
        emit(tables.render(
            [Column("MODEL", max_width=40, shrink=1), Column("PROVIDER"), Column("TURNS", "right"),
             Column("TOKENS", "right"), Column("AVG MS", "right")],
            [[r["model"] or "(none)", r["provider"] or "", count(r["turns"]), count(r["total_tokens"] or 0),
              ms(r["avg_latency_ms"])] for r in data["models"]],
            ellipsis=cut,
        ))
    if data["model_calls"]:
        emit()
        emit("Model calls")
        emit(tables.render(
            [Column("MODEL", max_width=40, shrink=1), Column("PROVIDER"), Column("CALLS", "right"),
             Column("FAILED", "right"), Column("COST", "right"), Column("NO PRICE", "right"), Column("AVG MS", "right"),
             Column("P95 MS", "right"), Column("AVG TTFC", "right")],
            [[r["model"] or "(none)", r["provider"] or "", count(r["calls"]), count(r["failed"]) if r["failed"] else "",
              tables.cost(r["cost_usd"]), count(r["unpriced_calls"]) if r["unpriced_calls"] else "", ms(r["avg_ms"]),
              ms(r["p95_ms"]), ms(r["avg_ttfc_ms"])] for r in data["model_calls"]],
            ellipsis=cut,
        ))
    return 0


def _unpriced(calls: Any) -> str:
    """What the cost leaves out: calls (or turns without call rows) whose model has no price."""
    if not calls:
        return ""
    return f"{count(calls)} call{'s' if calls != 1 else ''} without a price (see `loopscope calls`; prices: LOOPSCOPE_PRICES)"


# -- tools --------------------------------------------------------------------------------------

def tools_command(args: argparse.Namespace) -> int:
    if args.declared:
        return _declared(args)
    if args.agent:
        from .commands import CommandError

        raise CommandError("--agent goes with --declared (tool_stats counts every agent's calls together)")
    records = open_store(args).tools(args.sort, args.limit or None)
    if args.json:
        emit_json(_jsonable(records))
        return 0
    if not records:
        emit("no tool calls yet")
        return 0
    # the same columns whatever the tools' calls did (a script reads them by position); calls
    # still running are said below the table, which stays within 120 columns
    columns = [Column("TOOL", shrink=1, min_width=12), Column("CALLS", "right")]
    columns += [Column(o.upper(), "right") for o in _outcomes()]
    columns += [
        Column("NOT SERVED", "right"), Column("P50", "right"), Column("P95", "right"), Column("P99", "right"),
        Column("LAST SEEN", "right"),
    ]
    rows = []
    now = datetime.now(timezone.utc)
    for r in records:
        row = [r["tool"] or "", count(r["calls"])]
        row += [count(r[o]) for o in _outcomes()]
        row += [share(r["failure_share"]), ms(r["p50_ms"]), ms(r["p95_ms"]), ms(r["p99_ms"]), ago(r["last_seen"], now)]
        rows.append(row)
    emit(tables.render(columns, rows, ellipsis=ellipsis()))
    emit("(durations in ms; NOT SERVED: share of finished calls with another outcome than served)")
    running = [r for r in records if r["pending"]]
    if running:
        now_running = ", ".join(f"{tables.one_line(r['tool'])} {count(r['pending'])}" for r in running)
        emit(f"(running now: {now_running})")
    return 0


def _declared(args: argparse.Namespace) -> int:
    store = open_store(args)
    records = store.declared_tools(args.agent or None, args.limit or None)
    if args.json:
        emit_json(_jsonable(records))
        return 0
    if not records:
        turns = store.turn_count(args.agent or None)
        whose = f" of agent {args.agent!r}" if args.agent else ""
        if not turns:
            emit(f"no turns{whose} yet")
        else:  # turns without a tool: say so, not that there are none
            emit(f"no tools offered or called in {count(turns)} turn{'s' if turns != 1 else ''}{whose}")
        return 0
    columns = [
        Column("AGENT", shrink=1, min_width=8), Column("TOOL", shrink=1, min_width=10), Column("KIND"),
        Column("OFFERED", "right"), Column("USED", "right"), Column("USE", "right"), Column("CALLS", "right"),
        Column("UNDECLARED", "right"), Column("LAST CALLED", "right"),
    ]
    now = datetime.now(timezone.utc)
    rows = [
        [r["agent"] or "(none)", r["tool"] or "", r["kind"], count(r["turns_offered"]), count(r["turns_used"]),
         share(r["use_share"]), count(r["calls"]), count(r["undeclared_calls"]) if r["undeclared_calls"] else "",
         ago(r["last_called"], now)]
        for r in records
    ]
    emit(tables.render(columns, rows, ellipsis=ellipsis()))
    unused = [r for r in records if r["turns_offered"] and not r["calls"] and r["kind"] != "server"]
    if unused:
        names = ", ".join(tables.one_line(f"{r['tool']} ({r['agent'] or 'no agent'})" if not args.agent else r["tool"])
                          for r in unused)
        emit()
        emit(f"offered but never called ({len(unused)}): {names}")
    if any(r["kind"] == "server" for r in records):
        emit("(KIND server: a tool the provider runs, such as Anthropic's web search; its uses are not tool calls here)")
    return 0
