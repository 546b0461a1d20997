"""``loopscope ui``: serve the web dashboard on this machine."""

from __future__ import annotations

import argparse
import os

from ..dashboards.web import DEFAULT_HOST, DEFAULT_PORT
from .commands import CommandError, db_path, emit, warn


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0..65535, got {value}")
    return value


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    ui = sub.add_parser(
        "ui",
        parents=[common],
        help="serve the web dashboard (sessions, live timelines, tool and turn analytics) on 127.0.0.1",
        description="Serve a local web dashboard over the store: sessions with search, each session's "
        "timeline (text segments, tool cards, turn summaries) updated live while an agent runs, tool "
        "analytics, turn analytics and declared-vs-used tools. It reads the store read-only, opening the "
        "file only for each request, and listens on 127.0.0.1 unless --host names another address.",
    )
    ui.add_argument(
        "--host",
        default=DEFAULT_HOST,
        metavar="ADDR",
        help=f"address to listen on (default: {DEFAULT_HOST}; another address opens your agents' data to its network)",
    )
    ui.add_argument(
        "--port",
        type=_port,
        default=DEFAULT_PORT,
        metavar="N",
        help=f"port (default: {DEFAULT_PORT}; 0 = any free port)",
    )
    ui.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also answer requests addressed to NAME (a proxy's or DNS name for a --host beyond loopback; "
        "requests for any other name are refused, against DNS rebinding); repeatable",
    )
    ui.add_argument("--open", action="store_true", help="open the dashboard in a web browser")
    ui.add_argument("--verbose", action="store_true", help="log every request to stderr")
    ui.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from ..dashboards.web.server import make_server  # the store and DuckDB: not for ``--help``
    from ..storage.queries import open_reader

    # a dashboard reads often and never writes: the engine may keep the store open between reads
    store = open_reader(db_path(args), lock_timeout=getattr(args, "wait", 10.0), keep_open=True)
    try:
        server = make_server(store, args.host, args.port, verbose=args.verbose, allow_hosts=args.allow_host)
    except OSError as exc:
        raise CommandError(
            f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc} (try --port 0, or another --port)"
        ) from None
    try:
        emit(f"loopscope dashboard: {server.url}  (store: {store.path}; Ctrl-C to stop)", flush=True)
        if not os.path.exists(store.path):
            warn(f"loopscope: note: no store at {store.path} yet; the dashboard shows it once an agent writes it")
        if args.host not in (DEFAULT_HOST, "localhost", "::1"):
            warn(f"loopscope: warning: listening on {args.host}: anyone who can reach it can read this store")
        if args.open:
            import webbrowser

            webbrowser.open(server.url)
        server.serve_forever(poll_interval=0.25)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        server.wait_served(STOP_WAIT)  # no request thread left inside DuckDB as the interpreter ends
    return 0


STOP_WAIT = 5.0
"""Seconds the dashboard waits at its end for the requests being served (each a short read)."""
