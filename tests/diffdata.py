"""Pairs of runs that differ as runs of one agent do, recorded through the hand API into a real
store, for ``loopscope diff`` and the dashboard's diff page (each pair: session ``NAME-a``, the
baseline, and ``NAME-b``; one turn each):

- ``retry``: B's ``lookup`` fails once and the model asks for it again (two steps more);
- ``extra``: B's first model call asks for ``fetch`` besides ``search``, and ``fetch`` runs;
- ``args``: ``weather`` is asked for Lyon in B, Paris in A (its result differs too, B's holding an
  escape sequence);
- ``reason``: A answers and completes; B stops after the tool at ``max_rounds``;
- ``moved``: A runs ``alpha`` then ``beta``, B ``beta`` then ``alpha``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import loopscope
import recorded

MODEL = "gpt-4o-mini"
PAIRS = ("retry", "extra", "args", "reason", "moved")
CLEAR = "\x1b[2Jcleared"


def _gen(turn: Any, text: str, calls: list[tuple[str, str, dict[str, Any]]] = (), tokens: int = 100) -> None:  # type: ignore[assignment]
    time.sleep(0.002)  # steps a clock tick apart: their order is their start times'
    turn.generation(
        text, tool_calls=[{"id": i, "name": n, "arguments": a} for i, n, a in calls] or None,
        finish_reason=None if calls else "stop", usage={"input_tokens": tokens, "output_tokens": 10},
        model=MODEL, provider="openai",
    )


def _tool(name: str, call_id: str, arguments: dict[str, Any], result: Any = None, fail: str | None = None) -> None:
    time.sleep(0.002)
    try:
        with loopscope.tool(name, arguments=arguments, call_id=call_id) as call:
            if fail:
                raise TimeoutError(fail)
            call.set_result(result)
    except TimeoutError:
        pass


def _turn(session: str) -> Any:
    return loopscope.turn(session_id=session, agent="concierge", input="help", model=MODEL, provider="openai")


def _record() -> None:
    order = {"order": 7}
    for side in ("a", "b"):
        with _turn(f"retry-{side}") as t:
            _gen(t, "Looking it up.", [("r1", "lookup", order)])
            if side == "b":
                _tool("lookup", "r1", order, fail="orders service timed out")
                _gen(t, "Trying again.", [("r2", "lookup", order)], tokens=140)
                _tool("lookup", "r2", order, {"status": "shipped"})
            else:
                _tool("lookup", "r1", order, {"status": "shipped"})
            _gen(t, "Order 7 has shipped.", tokens=180)

        with _turn(f"extra-{side}") as t:
            calls = [("e1", "search", {"q": "hotels"})] + ([("e2", "fetch", {"url": "https://example.com/h"})] if side == "b" else [])
            _gen(t, "Searching.", calls)
            _tool("search", "e1", {"q": "hotels"}, ["Hotel A"])
            if side == "b":
                _tool("fetch", "e2", {"url": "https://example.com/h"}, "<html>Hotel A</html>")
            _gen(t, "Hotel A it is.", tokens=200 if side == "b" else 150)

        with _turn(f"args-{side}") as t:
            city = "Paris" if side == "a" else "Lyon"
            _gen(t, "Checking the weather.", [("w1", "weather", {"city": city})])
            # B's result holds what a terminal would act on (clear the screen): shown as an escape
            _tool("weather", "w1", {"city": city}, {"city": city, "temp_c": 21} if side == "a" else {"city": city, "note": CLEAR})
            _gen(t, "Nice weather.")

        with _turn(f"reason-{side}") as t:
            _gen(t, "Booking.", [("b1", "book", {"time": "19:00"})])
            _tool("book", "b1", {"time": "19:00"}, {"ok": True})
            if side == "a":
                _gen(t, "Booked for 19:00.")
            else:
                t.end("max_rounds")

        with _turn(f"moved-{side}") as t:
            first, second = ("alpha", "beta") if side == "a" else ("beta", "alpha")
            _gen(t, "Both.", [("m1", first, {"n": 1 if first == "alpha" else 2}), ("m2", second, {"n": 1 if second == "alpha" else 2})])
            _tool(first, "m1", {"n": 1 if first == "alpha" else 2}, "ok")
            _tool(second, "m2", {"n": 1 if second == "alpha" else 2}, "ok")
            _gen(t, "Done.")


def record(db: str | Path) -> None:
    """Record the pairs into ``db`` and return once no writer process holds the file."""
    loopscope.configure(db, flush_interval=0.05, capture_content=True)
    try:
        _record()
        assert loopscope.flush(60)
    finally:
        loopscope.shutdown()
    recorded.connect_when_free(Path(db)).close()
