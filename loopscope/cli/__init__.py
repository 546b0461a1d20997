"""The ``loopscope`` command: thin commands over the store's query API.

``main(argv)`` returns the exit code: 0 on success, 2 when a command cannot do what was
asked (no store file, a locked store, bad SQL, conflicting flags). Such errors print one
line to stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from .._version import __version__
from . import _args, agui, analytics, calls, collect, commands, export, init, run, score, search, status, tail, ui
from . import diff as diff_cli  # its own line: other commands join the line above
from .commands import CommandError

EXIT_OK = 0
EXIT_ERROR = 2

_DESCRIPTION = """\
Look at what your agents did: the timeline of a session (text segments, tool starts
and ends), turn summaries (rounds, tool calls, tokens, why the loop stopped), sessions,
or any SQL over the store. Every command reads the DuckDB store given by --db, else
$LOOPSCOPE_DB, else ./loopscope.duckdb, and works while an agent keeps writing to it."""

_EPILOG = """\
examples:
  loopscope demo                         record an offline example agent and show it
  loopscope sessions                     sessions, most recently active first
  loopscope sessions --search support    sessions whose id, agent, model or content holds "support"
  loopscope search "timed out"           where a text is: messages, tool arguments, results, errors
  loopscope turns --reason max_rounds --since 2h   turns that hit the round limit in the last 2 hours
  loopscope calls --tool book_table --failed       the failed calls of one tool
  loopscope timeline                     the most recent session's timeline
  loopscope timeline SESSION --newest --limit 20
  loopscope timeline SESSION --after 40  the events after index 40 (next page)
  loopscope turns --json                 turn summaries as JSON
  loopscope calls --slowest              model calls, longest first: model, ms, tokens, cost, outcome
  loopscope calls --failed --session S   the calls of session S that ended in an error
  loopscope diff RUN-A RUN-B             two sessions (or turns) aligned step by step, and their deltas
  loopscope stats                        totals: sessions, turns, tool calls, failures, end reasons, tokens
  loopscope tools                        per tool: calls, outcomes, p50/p95/p99 duration
  loopscope tools --declared             per agent: tools offered in its turns vs tools called
  loopscope tail --follow                new events as they land (Ctrl-C to stop)
  loopscope export --parquet DIR         events, turns and tool calls as Parquet, partitioned by day
  loopscope import --agui run.sse        store an AG-UI event stream (messages, tools, state, turns)
  loopscope export --agui SESSION        a session as an AG-UI event stream (SSE) to replay
  loopscope sql "SELECT type, count(*) FROM events GROUP BY type"
  loopscope sql "SELECT * FROM tool_stats"
  loopscope ui                           the web dashboard on http://127.0.0.1:8765/
  loopscope collect                      receive OTLP on :4318/:4317 from many processes into one store
  loopscope run -- python app.py         run a program with every adapter on, no code change
  loopscope status                       the store, its writers, and what was dropped or failed to write
  loopscope score TURN helpful --label up   score a turn, a model call (response id) or a tool call
  loopscope init --db clickhouse://ch:8123/otel --ttl-days 30   a store's schema, no data (before the Collectors)
"""


# helpers kept under their old names
_common = _args.common
_non_negative_int = _args.non_negative_int
_non_negative_float = _args.non_negative_float

Register = Callable[[argparse._SubParsersAction, argparse.ArgumentParser], None]


def _demo(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    demo = sub.add_parser(
        "demo",
        parents=[common],
        help="record an offline example agent, then print its timeline and turns",
        description="Run a scripted concierge agent (no network, no API key) through loopscope's hand API: "
        "two turns, weather and booking tools, one booking that fails and is retried. It writes to the "
        "store, then prints the session's timeline and turn summaries.",
    )
    demo.add_argument("--session", metavar="ID", help="session id to record under (default: demo-<random>)")
    demo.add_argument("--json", action="store_true", help="print the session's events and turns as JSON")
    demo.set_defaults(handler=commands.demo)


def _timeline(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    timeline = sub.add_parser(
        "timeline",
        parents=[common],
        help="a session's events in order: text segments, tool starts and ends",
        description="A session's activity log, ascending by index. Without SESSION, the most recently "
        "active session. Pages hold --limit events: the first ones, the newest ones (--newest), "
        "or those after / before an index (--after / --before, for paging).",
    )
    timeline.add_argument(
        "session",
        nargs="?",
        metavar="SESSION",
        help="session id or a unique prefix of one (default: the most recent session)",
    )
    timeline.add_argument(
        "--newest", action="store_true", help="take the page from the newest end (still printed oldest first)"
    )
    timeline.add_argument(
        "--limit", type=_non_negative_int, default=100, metavar="N", help="events per page (default: 100; 0 = all)"
    )
    timeline.add_argument("--after", type=int, metavar="IDX", help="only events with index greater than IDX")
    timeline.add_argument(
        "--before", type=int, metavar="IDX", help="only events with index less than IDX (the page just before it)"
    )
    timeline.add_argument("--include-blocked", action="store_true", help="also show events a guardrail blocked")
    # filters (issue 35): each narrows the page's events, through the store's query API
    timeline.add_argument("--type", action="append", choices=_args.EVENT_TYPES, metavar="TYPE",
                          help=f"only events of this type (repeat for several): {', '.join(_args.EVENT_TYPES)}")
    timeline.add_argument("--tool", metavar="NAME", help="only the starts and ends of this tool's calls")
    timeline.add_argument("--failed", action="store_true", help="only the ends of tool calls that were not served")
    timeline.add_argument("--search", type=_args.search_text, metavar="TEXT",
                          help="only events whose text, tool name, arguments, result or error holds TEXT (any case)")
    timeline.add_argument("--json", action="store_true", help="print the events as a JSON array")
    timeline.set_defaults(handler=commands.timeline)


def _turns(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    turns = sub.add_parser(
        "turns",
        parents=[common],
        help="turn summaries: rounds, tool calls, tokens, latency, loop end reason",
        description="One summary per agent turn, oldest first: the most recent --limit turns of SESSION, "
        "or of every session when SESSION is not given.",
    )
    turns.add_argument(
        "session", nargs="?", metavar="SESSION", help="session id or a unique prefix of one (default: all sessions)"
    )
    turns.add_argument(
        "--limit",
        type=_non_negative_int,
        default=50,
        metavar="N",
        help="the most recent N turns (default: 50; 0 = all)",
    )
    # filters (issue 35)
    turns.add_argument("--reason", choices=_args.LOOP_END_REASONS, metavar="REASON",
                       help=f"only turns whose loop ended so: {', '.join(_args.LOOP_END_REASONS)}")
    turns.add_argument("--model", metavar="NAME", help="only turns of this model")
    turns.add_argument("--agent", metavar="NAME", help="only turns of this agent")
    turns.add_argument("--since", type=_args.since, metavar="WHEN",
                       help="only turns that ended since WHEN: a duration back from now (30m, 2h, 3d) or an ISO "
                       "date or time (UTC unless it names its zone)")
    turns.add_argument("--min-cost", type=_args.non_negative_float_usd, metavar="USD",
                       help="only turns that cost at least USD (turns without a price never match)")
    turns.add_argument("--search", type=_args.search_text, metavar="TEXT",
                       help="only turns one of whose messages, tool calls or model calls holds TEXT (any case)")
    turns.add_argument("--json", action="store_true", help="print the turns as a JSON array")
    turns.set_defaults(handler=commands.turns)


def _sessions(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    sessions = sub.add_parser(
        "sessions",
        parents=[common],
        help="sessions, most recently active first (--search to find some)",
        description="Every session in the store with its event and turn counts, most recently active first. "
        "--search keeps the sessions whose id, or one of whose agents or models, contains the text (any case), "
        "and those whose content holds it: a message, a tool's name, arguments, result or error, what a model "
        "call generated or failed with (`loopscope search TEXT` shows where).",
    )
    sessions.add_argument(
        "--search", "-s", type=_args.search_text, metavar="TEXT",
        help="only sessions whose id, agent or model, or whose content, holds TEXT (any case)",
    )
    sessions.add_argument(
        "--limit", type=_non_negative_int, default=0, metavar="N", help="at most N sessions (default: 0 = all)"
    )
    sessions.add_argument("--json", action="store_true", help="print the sessions as a JSON array")
    sessions.set_defaults(handler=commands.sessions)


def _sql(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    sql = sub.add_parser(
        "sql",
        parents=[common],
        help="run read-only SQL on the store (tables, and views such as tool_calls and tool_stats)",
        description="Run one read-only SQL query on the store. Tables: events, turns, sessions, model_calls, scores. "
        "Views: tool_calls, turn_summaries, tool_stats, loop_end_reasons, declared_vs_used, token_usage, "
        "slowest_turns, model_call_summaries, model_usage, session_costs, cost_totals, score_targets, scores_over_time "
        "(see docs/sql-views.md for their columns). The SQL reads the store and nothing else: "
        "other files (COPY TO, EXPORT, read_csv, glob), ATTACH, INSTALL, LOAD, SET and writes are "
        "refused, and the query must fit in memory. To write Parquet files, use `loopscope export --parquet`.",
    )
    sql.add_argument("query", metavar="QUERY", help='e.g. "SELECT loop_end_reason, count(*) FROM turns GROUP BY 1"')
    sql.add_argument("--json", action="store_true", help="print the rows as a JSON array of objects")
    sql.set_defaults(handler=commands.sql)


COMMANDS: list[Register] = [
    _demo,
    _sessions,
    _timeline,
    _turns,
    calls.register,
    diff_cli.register,
    search.register,
    analytics.register_stats,
    analytics.register_tools,
    tail.register,
    export.register,
    agui.register,
    _sql,
    ui.register,
    collect.register,
    run.register,
    status.register,
    score.register,  # (scores: docs/scores.md)
    init.register,
]
"""Every command, in the order ``--help`` lists them: a function that adds its parser
(``register(sub, common)``) and sets ``handler`` to the function that runs it. A new
command is one more entry."""


def build_parser() -> argparse.ArgumentParser:
    common = _common()
    parser = argparse.ArgumentParser(
        prog="loopscope",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common],
    )
    parser.add_argument("--version", action="version", version=f"loopscope {__version__}")
    # ``loopscope --json turns`` as ``loopscope turns --json``: a dest of its own, as a
    # command's parser sets its own ``json`` (False) over whatever came before it
    parser.add_argument(
        "--json", action="store_true", dest="json_first", help="machine-readable output (also after COMMAND)"
    )
    sub = parser.add_subparsers(dest="command_name", metavar="COMMAND")  # not `command`: run's own argument
    for register in COMMANDS:
        register(sub, common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``loopscope`` command line; returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:  # --help, --version, or a usage error argparse already printed
        return exc.code if isinstance(exc.code, int) else EXIT_ERROR
    if getattr(args, "handler", None) is None:
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    if args.json_first:
        if not hasattr(args, "json"):
            return _fail(f"`loopscope {args.command_name}` has no JSON output (--json goes with the commands that print)")
        args.json = True
    try:
        return args.handler(args)
    except CommandError as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (``loopscope timeline | head``): not an error of ours
        commands.silence_stdout()
        return EXIT_OK
    except Exception as exc:  # one line, not a traceback
        return _fail(commands.describe(exc))


def _fail(message: str) -> int:
    commands.warn(f"loopscope: error: {message}")
    return EXIT_ERROR


__all__ = ["build_parser", "main"]
