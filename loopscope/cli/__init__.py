"""The ``loopscope`` command: thin commands over the store's query API.

``main(argv)`` returns the exit code: 0 on success, 2 when a command cannot do what was
asked (no store file, a locked store, bad SQL, conflicting flags). Such errors print one
line to stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .. import __version__
from ..pipeline import DEFAULT_DB
from . import commands
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
  loopscope timeline                     the most recent session's timeline
  loopscope timeline SESSION --newest --limit 20
  loopscope timeline SESSION --after 40  the events after index 40 (next page)
  loopscope turns --json                 turn summaries as JSON
  loopscope sql "SELECT type, count(*) FROM events GROUP BY type"
"""


def _common() -> argparse.ArgumentParser:
    # default=SUPPRESS so a flag given before the command is not reset by the command's parser
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--db",
        metavar="PATH",
        default=argparse.SUPPRESS,
        help=f"the store file (default: $LOOPSCOPE_DB, else ./{DEFAULT_DB})",
    )
    common.add_argument(
        "--wait",
        metavar="SECONDS",
        type=_non_negative_float,
        default=argparse.SUPPRESS,
        help="how long to wait for a writer holding the store (default: 10)",
    )
    return common


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
    return value


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
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

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
    timeline.add_argument("--json", action="store_true", help="print the events as a JSON array")
    timeline.set_defaults(handler=commands.timeline)

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
    turns.add_argument("--json", action="store_true", help="print the turns as a JSON array")
    turns.set_defaults(handler=commands.turns)

    sessions = sub.add_parser(
        "sessions",
        parents=[common],
        help="sessions, most recently active first",
        description="Every session in the store with its event and turn counts, most recently active first.",
    )
    sessions.add_argument(
        "--limit", type=_non_negative_int, default=0, metavar="N", help="at most N sessions (default: 0 = all)"
    )
    sessions.add_argument("--json", action="store_true", help="print the sessions as a JSON array")
    sessions.set_defaults(handler=commands.sessions)

    sql = sub.add_parser(
        "sql",
        parents=[common],
        help="run read-only SQL on the store (tables: events, turns, sessions)",
        description="Run one read-only SQL query on the store. Tables: events, turns, sessions.",
    )
    sql.add_argument("query", metavar="QUERY", help='e.g. "SELECT loop_end_reason, count(*) FROM turns GROUP BY 1"')
    sql.add_argument("--json", action="store_true", help="print the rows as a JSON array of objects")
    sql.set_defaults(handler=commands.sql)
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
    except Exception as exc:  # noqa: BLE001 - one line, not a traceback
        return _fail(commands.describe(exc))


def _fail(message: str) -> int:
    print(f"loopscope: error: {message}", file=sys.stderr)
    return EXIT_ERROR


__all__ = ["build_parser", "main"]
