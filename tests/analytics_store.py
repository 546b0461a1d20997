"""A varied store for the analytics views and commands, recorded through the hand API.

Three agents over four sessions, every tool outcome and several loop end reasons:

- ``support`` (tools lookup_order, refund, escalate, translate; translate is never called):
  ``sup-1`` turn 1 serves lookup_order, refund fails, then answers (completed, cache and
  reasoning tokens); turn 2 has escalate refused and ends at ``max_rounds``.
  ``sup-2`` turn 3 calls lookup_order twelve times; turn 4 asks for lookup_order and
  refund, serves only lookup_order, so refund ends ``unserved`` and the turn ``unfinished``.
- ``research`` (search, fetch, summarize; summarize never called), session ``res-1``:
  turn 5 serves search and has fetch's result blocked (completed); turn 6 raises (error).
- ``scheduler`` (book, cancel; cancel never called), session ``sch-1``: turn 7 serves book
  once and has it cancelled once, and ends at ``timeout``.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path
from typing import Any

import loopscope
import recorded
from recorded import connect_when_free

SUPPORT_TOOLS = ["lookup_order", "refund", "escalate", "translate"]
RESEARCH_TOOLS = ["search", "fetch", "summarize"]
SCHEDULER_TOOLS = ["book", "cancel"]
NEVER_CALLED = {("support", "translate"), ("research", "summarize"), ("scheduler", "cancel")}
TURNS = 7
REASONS = {"completed": 3, "max_rounds": 1, "unfinished": 1, "error": 1, "timeout": 1}


def _tools(names: list[str]) -> list[dict[str, Any]]:
    return [
        {"name": n, "description": f"{n} for the user", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}
        for n in names
    ]


def _serve(name: str, call_id: str, result: Any, pause: float = 0.0) -> None:
    with loopscope.tool(name, arguments={"q": call_id}, call_id=call_id) as call:
        if pause:
            time.sleep(pause)
        call.set_result(result)


def record(db: str | Path) -> None:
    """Record the workload into ``db`` (configures loopscope for it and shuts it down), and
    return once no writer process holds the file: on a loaded machine the close's bound can
    leave the writer process finishing its last batch, and the tests read with plain DuckDB."""
    loopscope.configure(db, flush_interval=0.05)
    try:
        _record()
    finally:
        loopscope.shutdown()
    recorded.connect_when_free(Path(db)).close()


def _record() -> None:
    support, research, scheduler = _tools(SUPPORT_TOOLS), _tools(RESEARCH_TOOLS), _tools(SCHEDULER_TOOLS)

    # turn 1: served, failed, completed; cache and reasoning tokens
    with loopscope.turn(session_id="sup-1", agent="support", tools=support, input="Where is order 7?",
                        model="gpt-4o", provider="openai") as turn:
        turn.generation("Looking it up.", tool_calls=[{"id": "c1", "name": "lookup_order", "arguments": {"q": "c1"}}],
                        usage={"input_tokens": 100, "output_tokens": 10, "cache_read_input_tokens": 40})
        _serve("lookup_order", "c1", {"status": "shipped"}, 0.002)
        turn.generation("Refunding.", tool_calls=[{"id": "c2", "name": "refund", "arguments": {"q": "c2"}}],
                        usage={"input_tokens": 150, "output_tokens": 12, "reasoning_tokens": 5})
        try:
            with loopscope.tool("refund", arguments={"q": "c2"}, call_id="c2"):
                raise ConnectionError("payments down")
        except ConnectionError:
            pass
        turn.generation("The refund failed; order 7 has shipped.", finish_reason="stop",
                        usage={"input_tokens": 200, "output_tokens": 20})

    # turn 2: refused, max_rounds
    with loopscope.turn(session_id="sup-1", agent="support", tools=support, input="Escalate it",
                        model="gpt-4o", provider="openai") as turn:
        turn.generation("Escalating.", tool_calls=[{"id": "c3", "name": "escalate", "arguments": {"q": "c3"}}],
                        usage={"input_tokens": 300, "output_tokens": 8})
        with loopscope.tool("escalate", arguments={"q": "c3"}, call_id="c3") as call:
            call.refuse("not allowed for this plan")
        turn.generation("I cannot escalate.", usage={"input_tokens": 320, "output_tokens": 9})
        turn.end("max_rounds")

    # turn 3: twelve served lookups, completed
    with loopscope.turn(session_id="sup-2", agent="support", tools=support, input="Check my orders",
                        model="gpt-4o-mini", provider="openai") as turn:
        calls = [{"id": f"b{i}", "name": "lookup_order", "arguments": {"q": f"b{i}"}} for i in range(12)]
        turn.generation("Checking all of them.", tool_calls=calls, usage={"input_tokens": 50, "output_tokens": 30})
        for i in range(12):
            _serve("lookup_order", f"b{i}", {"order": i}, 0.001 * (i % 4))
        turn.generation("All twelve are fine.", usage={"input_tokens": 90, "output_tokens": 6})

    # turn 4: one served, one never run (unserved); the turn ends unfinished
    with loopscope.turn(session_id="sup-2", agent="support", tools=support, input="Refund order 9",
                        model="gpt-4o-mini", provider="openai") as turn:
        turn.generation("Both.", tool_calls=[{"id": "c4", "name": "lookup_order", "arguments": {"q": "c4"}},
                                             {"id": "c5", "name": "refund", "arguments": {"q": "c5"}}],
                        usage={"input_tokens": 60, "output_tokens": 7})
        _serve("lookup_order", "c4", {"status": "delivered"})

    # turn 5: served, blocked, completed
    with loopscope.turn(session_id="res-1", agent="research", tools=research, input="Find papers",
                        model="claude-x", provider="anthropic") as turn:
        turn.generation("Searching.", tool_calls=[{"id": "c6", "name": "search", "arguments": {"q": "c6"}},
                                                  {"id": "c7", "name": "fetch", "arguments": {"q": "c7"}}],
                        usage={"input_tokens": 500, "output_tokens": 40, "cache_creation_input_tokens": 200})
        _serve("search", "c6", ["paper a", "paper b"], 0.003)
        with loopscope.tool("fetch", arguments={"q": "c7"}, call_id="c7") as call:
            call.set_result("<html>secret</html>")
            call.block("guardrail: private page")
        turn.generation("Found two papers.", usage={"input_tokens": 700, "output_tokens": 50})

    # turn 6: the agent's code raises: error
    try:
        with loopscope.turn(session_id="res-1", agent="research", tools=research, input="Summarize them",
                            model="claude-x", provider="anthropic") as turn:
            turn.generation("Summarizing.", usage={"input_tokens": 800, "output_tokens": 5})
            raise RuntimeError("context window exceeded")
    except RuntimeError:
        pass

    # turn 7: served, cancelled, timeout
    with loopscope.turn(session_id="sch-1", agent="scheduler", tools=scheduler, input="Book 2 rooms",
                        model="gpt-4o", provider="openai") as turn:
        turn.generation("Booking.", tool_calls=[{"id": "c8", "name": "book", "arguments": {"q": "c8"}},
                                                {"id": "c9", "name": "book", "arguments": {"q": "c9"}}],
                        usage={"input_tokens": 40, "output_tokens": 4})
        _serve("book", "c8", {"room": 1}, 0.004)
        try:
            with loopscope.tool("book", arguments={"q": "c9"}, call_id="c9"):
                raise asyncio.CancelledError()
        except asyncio.CancelledError:
            pass
        turn.generation("One room booked, the other timed out.", usage={"input_tokens": 60, "output_tokens": 9})
        turn.end("timeout")


# -- expected values, computed in Python from the base tables ------------------------------------


def tool_rows(db: str | Path) -> list[dict[str, Any]]:
    """Every tool row of the store, its content parsed: what the views are checked against."""
    con = connect_when_free(db)
    try:
        rows = con.execute(
            "SELECT session_id, correlation_id, type, created_at, source_channel_id, content FROM events "
            "WHERE type IN ('tool_call_start', 'tool_call_end') ORDER BY session_id, idx"
        ).fetchall()
    finally:
        con.close()
    return [
        {**json.loads(r[5]), "session_id": r[0], "turn_id": r[1], "type": r[2], "created_at": r[3], "agent": r[4]}
        for r in rows
    ]


def percentile(values: list[float], q: float) -> float:
    """The continuous (linear) percentile, as numpy and DuckDB's quantile_cont compute it."""
    xs = sorted(values)
    h = (len(xs) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (h - lo) * (xs[hi] - xs[lo])
