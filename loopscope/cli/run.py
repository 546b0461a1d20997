"""``loopscope run -- COMMAND ...``: run a program with loopscope on, no code change.

The program's Python interpreter imports ``sitecustomize`` at start-up; this command puts
loopscope's (``loopscope/_autostart/boot``) first on ``PYTHONPATH`` and replaces itself
with the program, so the exit status, signals and standard streams are the program's own.
Every setting travels as an environment variable the child's loopscope reads.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from .._autostart import DISABLED_ENV
from ..instrument import ADAPTERS
from ..storage.recording import DEFAULT_DB
from .commands import CommandError

BOOT = Path(__file__).resolve().parent.parent / "_autostart" / "boot"


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    run = sub.add_parser(
        "run",
        parents=[common],
        help="run a Python program with loopscope recording it (no code change)",
        description="Run COMMAND (a Python program, e.g. `python app.py`) with every loopscope adapter on, "
        "as if it called loopscope.instrument() first: its SDK and framework calls are recorded into the "
        f"store (--db, else $LOOPSCOPE_DB, else ./{DEFAULT_DB}) and exported over OTLP when OTEL_* "
        "variables say so. The program's exit status is this command's.",
        epilog="example: loopscope --db agent.duckdb run -- python app.py --port 8000",
    )
    run.add_argument(
        "--disable",
        metavar="NAMES",
        default="",
        help=f"comma-separated adapters to leave alone (known: {', '.join(ADAPTERS)})",
    )
    run.add_argument(
        "--otlp-endpoint", metavar="URL", help="also export spans and metrics over OTLP to URL (OTEL_EXPORTER_OTLP_ENDPOINT)"
    )
    run.add_argument(
        "--capture-content",
        action="store_true",
        help="export message text, tool arguments and results over OTLP too (they are always stored locally): "
        "sets OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=SPAN_ONLY, which the official GenAI "
        "instrumentations in the program read as content on spans too",
    )
    run.add_argument(
        "--session",
        metavar="NAME",
        help="record every turn of the program in session NAME (LOOPSCOPE_SESSION); by default a turn "
        "that continues an earlier one's conversation joins its session, any other starts one",
    )
    run.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...", help="the program to run")
    run.set_defaults(handler=run_command)


def child_environment(args: argparse.Namespace, base: dict[str, str] | None = None) -> dict[str, str]:
    """The program's environment: ours, plus what turns loopscope on in it."""
    env = dict(os.environ if base is None else base)
    env["LOOPSCOPE_AUTOSTART"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(BOOT), *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)])
    db = getattr(args, "db", None)
    if db:
        env["LOOPSCOPE_DB"] = str(Path(db).resolve())  # the program may change its directory
    disabled = [n.strip() for n in (args.disable or "").split(",") if n.strip()]
    unknown = [n for n in disabled if n.replace("-", "_") not in ADAPTERS]
    if unknown:
        raise CommandError(f"--disable: unknown adapters {', '.join(unknown)} (known: {', '.join(ADAPTERS)})")
    if disabled:
        env[DISABLED_ENV] = ",".join(disabled)
    if args.otlp_endpoint:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = args.otlp_endpoint
    session = getattr(args, "session", None)
    if session:
        from ..pipeline import SESSION_ENV

        env[SESSION_ENV] = session
    from ..content import capture  # here: --help needs none of it

    if args.capture_content and not capture.on_spans_for_all(env.get(capture.VARIABLE)):
        # SPAN_ONLY, not "true": opentelemetry-util-genai's instrumentations read "true" as no
        # content; a value that already puts content on spans for both (SPAN_AND_EVENT) stays
        env[capture.VARIABLE] = capture.BOTH_ON
    return env


def run_command(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise CommandError("nothing to run: give a command after --, e.g. loopscope run -- python app.py")
    env = child_environment(args)
    program = shutil.which(command[0], path=env.get("PATH"))
    if program is None:
        raise CommandError(f"command not found: {command[0]}")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(program, command, env)  # replaces this process: the program's status is ours
    return 0  # not reached
