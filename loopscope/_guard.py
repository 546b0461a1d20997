"""The one helper that guards loopscope's internal code.

Instrumentation must never break the user's call. Every internal code path that runs
inside a user's call runs under :class:`guard` (``with guard("where"):``) or
:func:`guarded` (a decorator, with a ``default`` returned on failure), which report the
failure and carry on: each failing place is logged once, with its traceback. Tests set
``LOOPSCOPE_STRICT=1`` (or call :func:`set_strict`) so that the same errors raise instead
of hiding bugs.

Only :class:`Exception` is caught: ``KeyboardInterrupt``, ``SystemExit``,
``GeneratorExit`` and ``asyncio.CancelledError`` belong to the user and always pass.

:func:`internal_error` remains for the few ``except`` blocks that must do more than
report (undo a half-done step, fall back to a value computed in the block), and for the
hottest loops, where a plain ``try`` costs nothing until it fails but a ``with`` costs
two method calls each time.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from types import TracebackType
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


def _report(where: str, exc: BaseException | None) -> bool:
    """Count a failure at ``where`` and log it the first time; False in strict mode (the
    caller then lets it raise)."""
    global error_count
    error_count += 1
    if _strict:
        return False
    with _seen_lock:
        first = where not in _seen
        _seen.add(where)
    if first:
        logger.warning("loopscope internal error in %s (recording continues without it)", where, exc_info=exc or True)
    return True


def internal_error(where: str, exc: BaseException | None = None) -> None:
    """Report an internal failure at ``where``; raise it again in strict mode.

    Call it from an ``except Exception`` block: in strict mode the active exception is
    re-raised, otherwise it is logged with its traceback the first time ``where`` fails.
    Prefer :class:`guard` or :func:`guarded` where the block only reports.
    """
    if not _report(where, exc):
        raise  # noqa: PLE0704 - re-raises the exception being handled


class guard:
    """``with guard("where"):`` runs its block; an :class:`Exception` raised in it is
    reported as :func:`internal_error` does (logged once per place, raised in strict mode)
    and the code after the block goes on.

    It holds nothing but ``where``, so one instance may be made once at module level and
    entered from any number of threads at once (no allocation per use).
    """

    __slots__ = ("where",)

    def __init__(self, where: str) -> None:
        self.where = where

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> bool:
        if exc_type is None or not issubclass(exc_type, Exception):
            return False  # nothing failed, or the user's BaseException: let it go
        return _report(self.where, exc)

    def __repr__(self) -> str:
        return f"guard({self.where!r})"


def guarded(where: str, default: Any = None) -> Callable[[_F], _F]:
    """Decorate an internal function so that its failure is reported, not raised: the
    call then returns ``default`` (in strict mode, the exception raises).

    Works on plain and ``async`` functions. On a generator function (sync or async) a
    failure ends the iteration there: the items yielded so far stay delivered.
    """
    place = guard(where)

    def decorate(fn: _F) -> _F:
        if inspect.isasyncgenfunction(fn):

            @functools.wraps(fn)
            async def agen_wrapper(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
                with place:
                    async for item in fn(*args, **kwargs):
                        yield item

            return agen_wrapper  # type: ignore[return-value]
        if inspect.isgeneratorfunction(fn):

            @functools.wraps(fn)
            def gen_wrapper(*args: Any, **kwargs: Any) -> Iterator[Any]:
                with place:
                    return (yield from fn(*args, **kwargs))
                return default

            return gen_wrapper  # type: ignore[return-value]
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with place:
                    return await fn(*args, **kwargs)
                return default

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with place:
                return fn(*args, **kwargs)
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
