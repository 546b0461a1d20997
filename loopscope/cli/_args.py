"""Argument helpers shared by every command's parser."""

from __future__ import annotations

import argparse
import re
from datetime import datetime, timedelta, timezone

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


# -- filters (issue 35) ------------------------------------------------------------------------

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}

EVENT_TYPES = ("message", "tool_call_start", "tool_call_end", "state_snapshot", "state_delta", "model_error")
"""The timeline's event types (``loopscope timeline --type``; ``models.EventType``'s values)."""

LOOP_END_REASONS = (
    "completed", "max_rounds", "timeout", "budget_exceeded", "truncated", "empty_response", "unfinished",
    "force_stopped", "cancelled", "error", "refusal", "content_filter", "cut_off",
)
"""Why a loop stopped (``loopscope turns --reason``; ``models.LoopEndReason``'s values)."""


def since(text: str, *, now: datetime | None = None) -> datetime:
    """``--since``: a duration back from now (``90s``, ``30m``, ``2h``, ``3d``, ``1w``) or an
    ISO date or time (``2026-12-01``, ``2026-12-01T09:30``; UTC unless it names its zone)."""
    value = text.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhdw])", value.lower())
    if match:
        amount, unit = float(match.group(1)), match.group(2)
        return (now or datetime.now(timezone.utc)) - timedelta(seconds=amount * _UNITS[unit])
    try:
        moment = datetime.fromisoformat(value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a duration such as 2h or 3d, or an ISO date or time such as 2026-12-01T09:30, got {text!r}"
        ) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def search_text(text: str) -> str:
    """``--search``: the text to look for, not empty."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the search text is empty")
    return text.strip()


def non_negative_float_usd(text: str) -> float:
    """``--min-cost``: a number of US dollars, not negative."""
    try:
        value = float(text.strip().lstrip("$"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an amount in USD such as 0.05, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a non-negative amount, got {text}")
    return value
