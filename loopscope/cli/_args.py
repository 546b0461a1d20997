"""Argument helpers shared by every command's parser."""

from __future__ import annotations

import argparse

from ..storage.recording import DEFAULT_DB


def common() -> argparse.ArgumentParser:
    """The flags every command takes: ``--db`` and ``--wait``."""
    # default=SUPPRESS so a flag given before the command is not reset by the command's parser
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument(
        "--db",
        metavar="PATH",
        default=argparse.SUPPRESS,
        help=f"the store file (default: $LOOPSCOPE_DB, else ./{DEFAULT_DB})",
    )
    parser.add_argument(
        "--wait",
        metavar="SECONDS",
        type=non_negative_float,
        default=argparse.SUPPRESS,
        help="how long to wait for a writer holding the store (default: 10)",
    )
    return parser


def add_json(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--json", action="store_true", help=f"print {what} as JSON")


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
    return value


def positive_float(text: str) -> float:
    value = non_negative_float(text)
    if value <= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value
