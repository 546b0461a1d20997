"""``loopscope tail``: the newest events, and with ``--follow`` every new one as it lands.

Following works from another process while an agent writes the store: every
``--interval`` it reads each session's last index (the small ``sessions`` table) and,
for the sessions that moved, the events after the index it printed last, in the same
read (the query API's ``follow``; on DuckDB :class:`loopscope.storage.duckdb.replay.Follower`,
the after-index query that ``Store.replay`` and the web dashboard's live timeline use too). Each read holds the file
for a moment only, so the agent's writer is never kept waiting for long. Ctrl-C stops it
(exit status 0).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from ..dashboards import tables
from ..storage.errors import StoreLockedError
from . import _args
from .commands import CommandError, ellipsis, emit, json_text, open_store, resolve_session, warn

if TYPE_CHECKING:
    from ..models import ActivityEvent
    from ..storage.policy import EventFilter
    from ..storage.queries import Reader


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    tail = sub.add_parser(
        "tail",
        parents=[common],
        help="the newest events of all sessions (or one); --follow prints new ones as they land",
        description="Print the newest -n events, of every session or of SESSION, oldest first. With --follow, "
        "keep printing events as the agent writes them, from any process (Ctrl-C stops it, exit status 0). "
        "A store or session that does not exist yet is waited for when following.",
    )
    tail.add_argument(
        "session", nargs="?", metavar="SESSION", help="only this session (an id or a unique prefix of one)"
    )
    tail.add_argument(
        "-n", "--lines", type=_args.non_negative_int, default=10, metavar="N",
        help="how many of the newest events to print first (default: 10)",
    )
    tail.add_argument("-f", "--follow", action="store_true", help="keep printing new events as they land")
    tail.add_argument(
        "--interval", type=_args.positive_float, default=0.5, metavar="SECONDS",
        help="with --follow: how often to look for new events (default: 0.5)",
    )
    tail.add_argument("--include-blocked", action="store_true", help="also show events a guardrail blocked")
    tail.add_argument("--json", action="store_true", help="print each event as one line of JSON (JSON Lines)")
    tail.set_defaults(handler=run)


class _Printer:
    def __init__(self, as_json: bool, show_session: bool) -> None:
        self.as_json = as_json
        self.show_session = show_session
        self.header_done = as_json
        self.cut = ellipsis()

    def __call__(self, events: list[ActivityEvent]) -> None:
        if not events:
            return
        if not self.header_done:
            emit(tables.stream_header(show_session=self.show_session, ellipsis=self.cut))
            self.header_done = True
        for event in events:
            if self.as_json:
                emit(json_text(event.model_dump(mode="json")))  # one line: JSON Lines
            else:
                emit(tables.stream_line(event, show_session=self.show_session, ellipsis=self.cut))
        sys.stdout.flush()


def _session(store: Reader, requested: str | None, follow: bool) -> str | None:
    if requested is None:
        return None
    try:
        return resolve_session(store, requested)
    except CommandError as exc:
        if follow and str(exc).startswith("no session"):
            return requested  # not there yet: wait for exactly this id
        raise


def _ready(store: Reader) -> bool:
    """Whether the store exists and holds loopscope data (else a follower waits)."""
    return store.ready()


def run(args: argparse.Namespace) -> int:
    from ..storage.policy import EventFilter

    store = open_store(args)
    event_filter = EventFilter(include_blocked=True) if args.include_blocked else EventFilter()
    printer = _Printer(args.json, show_session=args.session is None)
    if not args.follow:
        session = _session(store, args.session, follow=False)
        printer(_newest(store, session, args.lines, event_filter))
        return 0
    try:
        return _follow(store, args, event_filter, printer)
    except KeyboardInterrupt:
        return 0
    except Exception as exc:
        if store.interrupted(exc):
            return 0
        raise


def _newest(store: Reader, session: str | None, lines: int, event_filter: EventFilter) -> list[ActivityEvent]:
    if lines == 0:
        return []
    if session is None:
        return store.recent_events(lines, event_filter=event_filter)
    return store.timeline(session, limit=lines, newest_first=True, event_filter=event_filter)


def _follow(store: Reader, args: argparse.Namespace, event_filter: EventFilter, printer: _Printer) -> int:
    if not _ready(store):
        warn(f"loopscope: waiting for a store at {store.path}")
        while not _ready(store):
            time.sleep(args.interval)
    session = _session(store, args.session, follow=True)
    # the newest lines and the cursors come from one read of the file: the first poll
    # goes on right after what was printed, with nothing repeated or skipped between
    follower = store.follow(session, event_filter=event_filter)
    printer(follower.start(args.lines))
    where = f" (session {session})" if session else ""
    warn(f"loopscope: following {store.path}{where}; Ctrl-C to stop")
    locked_warned = False
    while True:
        time.sleep(args.interval)
        try:
            printer(follower.poll())  # each session's events in index order, never back
            locked_warned = False
        except StoreLockedError as exc:
            if not locked_warned:  # someone holds the file for long: keep trying
                warn(f"loopscope: {str(exc).splitlines()[0]}; still trying")
                locked_warned = True
