"""A child process for the live-timeline tests: one turn whose tool runs until told to stop.

    python slow_agent.py DB SESSION RELEASE_FILE

The model asks for ``slow_lookup``; the tool's start row reaches the store at once, and
the tool then waits until RELEASE_FILE exists (at most 60 s) before it returns and the
turn ends ``completed``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import loopscope


def main(db: str, session: str, release: str) -> None:
    loopscope.configure(db, flush_interval=0.05)
    tools = [{"name": "slow_lookup", "description": "Looks something up, slowly."}]
    with loopscope.turn(
        session_id=session, agent="live-agent", tools=tools, input="Look it up, please.", model="m-live"
    ) as turn:
        with turn.round() as rnd:
            rnd.response(
                "Looking that up; it takes a while.",
                tool_calls=[{"id": "slow_1", "name": "slow_lookup", "arguments": {"key": "answer"}}],
                usage={"input_tokens": 50, "output_tokens": 12},
            )
        with loopscope.tool("slow_lookup", call_id="slow_1") as call:
            deadline = time.monotonic() + 60
            while not Path(release).exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            call.set_result({"answer": 42})
        turn.generation("The answer is 42.", usage={"input_tokens": 70, "output_tokens": 8})
    loopscope.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:4])
