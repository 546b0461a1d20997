"""The command line the per-call micro-benchmarks share: ``--calls``, ``--repeats``, ``--smoke``."""

from __future__ import annotations

import argparse


def calls_and_repeats(doc: str, calls: int, smoke_calls: int) -> argparse.Namespace:
    """Parse ``--calls N`` (default ``calls``), ``--repeats R`` (7) and ``--smoke`` (one repeat
    of ``smoke_calls`` calls: checks that the script runs, measures nothing)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--calls", type=int, default=calls, help=f"calls per variant per repeat (default {calls})")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks that it runs, measures nothing")
    args = parser.parse_args()
    if args.smoke:
        args.calls, args.repeats = smoke_calls, 1
    return args
