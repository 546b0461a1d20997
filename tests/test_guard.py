"""The guard around loopscope's internal code (loopscope/_guard.py): a failure inside it is
counted and logged once per place and the program goes on; in strict mode (the tests') it
raises; the user's own BaseExceptions always pass."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from loopscope import _guard
from loopscope._guard import guard, guarded


class Bug(RuntimeError):
    """A fault in loopscope's own code."""




def _warnings(caplog: pytest.LogCaptureFixture, where: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "loopscope" and where in r.getMessage()]


def test_a_failing_block_is_reported_once_per_place_and_the_code_after_it_runs(quiet, caplog):
    caplog.set_level(logging.WARNING, logger="loopscope")
    before = _guard.error_count
    after: list[int] = []
    for i in range(3):
        with guard("test place once"):
            raise Bug(f"bug {i}")
        after.append(i)
    with guard("test other place"):
        raise Bug("elsewhere")
    assert after == [0, 1, 2]
    assert _guard.error_count == before + 4  # every failure counted
    logged = _warnings(caplog, "test place once")
    assert len(logged) == 1  # but each place logged once, with its traceback
    assert logged[0].exc_info is not None and str(logged[0].exc_info[1]) == "bug 0"
    assert len(_warnings(caplog, "test other place")) == 1


def test_a_block_that_does_not_fail_reports_nothing(quiet):
    before = _guard.error_count
    with guard("test quiet place"):
        value = 1 + 1
    assert value == 2 and _guard.error_count == before


def test_strict_mode_raises_the_same_exception():
    before = _guard.error_count
    bug = Bug("strict")
    with pytest.raises(Bug) as caught, guard("test strict place"):
        raise bug
    assert caught.value is bug
    assert _guard.error_count == before + 1  # still counted, as internal_error counts


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(3), GeneratorExit(), asyncio.CancelledError()], ids=lambda e: type(e).__name__)
def test_the_users_base_exceptions_pass_through(quiet, exc):
    before = _guard.error_count
    with pytest.raises(type(exc)) as caught, guard("test base exception"):
        raise exc
    assert caught.value is exc
    assert _guard.error_count == before  # not ours: not reported


def test_one_instance_serves_every_use():
    place = guard("test shared")
    for _ in range(2):
        with place:
            pass
    with pytest.raises(Bug), place:
        raise Bug("strict")


def test_decorator_returns_the_value_or_the_default_on_failure(quiet):
    @guarded("test decorated", default=("fallback",))
    def parse(text: str) -> tuple[str, ...]:
        if not text:
            raise Bug("empty")
        return tuple(text)

    before = _guard.error_count
    assert parse("ab") == ("a", "b")
    assert parse("") == ("fallback",)
    assert _guard.error_count == before + 1
    assert parse.__name__ == "parse"  # functools.wraps


def test_decorator_raises_in_strict_mode_and_lets_base_exceptions_pass(quiet):
    @guarded("test decorated strict")
    def fail(exc: BaseException) -> None:
        raise exc

    with pytest.raises(KeyboardInterrupt):
        fail(KeyboardInterrupt())
    _guard.set_strict(True)
    with pytest.raises(Bug):
        fail(Bug("strict"))


def test_decorator_on_an_async_function(quiet):
    @guarded("test async", default=-1)
    async def half(n: int) -> int:
        await asyncio.sleep(0)
        if n % 2:
            raise Bug("odd")
        return n // 2

    @guarded("test async cancelled")
    async def cancelled() -> None:
        raise asyncio.CancelledError

    assert asyncio.run(half(4)) == 2
    assert asyncio.run(half(3)) == -1
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(cancelled())


def test_decorator_on_a_generator_keeps_what_was_yielded(quiet):
    @guarded("test generator")
    def items(n: int) -> Iterator[int]:
        for i in range(n):
            if i == 2:
                raise Bug("at 2")
            yield i

    before = _guard.error_count
    assert list(items(5)) == [0, 1]
    assert list(items(2)) == [0, 1]
    assert _guard.error_count == before + 1
    gen = items(5)
    next(gen)
    gen.close()  # GeneratorExit passes through the guard: a plain close, nothing reported
    assert _guard.error_count == before + 1


def test_decorator_on_an_async_generator(quiet):
    @guarded("test async generator")
    async def items(n: int) -> AsyncIterator[int]:
        for i in range(n):
            if i == 2:
                raise Bug("at 2")
            yield i

    async def collect() -> list[int]:
        return [i async for i in items(5)]

    before = _guard.error_count
    assert asyncio.run(collect()) == [0, 1]
    assert _guard.error_count == before + 1


def test_internal_error_reports_through_the_same_path(quiet, caplog):
    caplog.set_level(logging.WARNING, logger="loopscope")
    before = _guard.error_count
    for _ in range(2):
        try:
            raise Bug("in an except block")
        except Exception:  # the way internal_error is called
            _guard.internal_error("test internal_error place")
    with guard("test internal_error place"):
        raise Bug("same place, through the guard")
    assert _guard.error_count == before + 3
    assert len(_warnings(caplog, "test internal_error place")) == 1
    _guard.set_strict(True)
    with pytest.raises(Bug, match="strict"):
        try:
            raise Bug("strict")
        except Exception:  # the way internal_error is called
            _guard.internal_error("test internal_error place")


def test_decorated_values_are_untouched(quiet):
    sentinel: Any = object()

    @guarded("test passthrough", default=None)
    def ident(x: Any) -> Any:
        return x

    assert ident(sentinel) is sentinel
