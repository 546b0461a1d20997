"""The one helper that guards loopscope's internal code.

Instrumentation must never break the user's call. Every internal code path that runs
inside a user's call is wrapped by :func:`guarded` or reports through
:func:`internal_error`, which logs each failing place once and carries on. Tests set
``LOOPSCOPE_STRICT=1`` (or call :func:`set_strict`) so that the same errors fail loudly
instead of hiding bugs.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

logger = logging.getLogger("loopscope")

_F = TypeVar("_F", bound=Callable[..., Any])
_strict = os.environ.get("LOOPSCOPE_STRICT", "") not in ("", "0")
_seen: set[str] = set()
_seen_lock = threading.Lock()
error_count = 0


def set_strict(value: bool) -> None:
    """Make internal errors raise (tests) or log once and continue (production)."""
    global _strict
    _strict = value


def is_strict() -> bool:
    return _strict


def internal_error(where: str, exc: BaseException | None = None) -> None:
    """Report an internal failure at ``where``; raise it again in strict mode.

    Call it from an ``except Exception`` block: in strict mode the active exception is
    re-raised, otherwise it is logged with its traceback the first time ``where`` fails.
    """
    global error_count
    error_count += 1
    if _strict:
        raise  # noqa: PLE0704 - re-raises the exception being handled
    with _seen_lock:
        first = where not in _seen
        _seen.add(where)
    if first:
        logger.warning("loopscope internal error in %s (recording continues without it)", where, exc_info=exc or True)


def guarded(where: str, default: Any = None) -> Callable[[_F], _F]:
    """Decorate an internal function so that its failure is reported, not raised."""

    def decorate(fn: _F) -> _F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception:
                internal_error(where)
                return default

        return wrapper  # type: ignore[return-value]

    return decorate


def warn_once(key: str, message: str, *args: Any) -> None:
    """Log a user-facing problem (a locked file, a full disk) once per key."""
    with _seen_lock:
        if key in _seen:
            return
        _seen.add(key)
    logger.warning(message, *args)


def clear_warning(key: str) -> None:
    """Forget that ``key`` was reported, so that a recurrence after recovery is said again."""
    with _seen_lock:
        _seen.discard(key)
