"""Stores for the web dashboard's tests: a few sessions recorded through the hand API.

``record_sample(db)`` writes:

- ``demo-concierge``: the offline demo (two turns, a failed booking that is retried);
- ``research-7f3a``: a researcher agent offered five tools, two of which it never calls;
  one call refused, one result blocked by a guardrail, a blocked user message, and a
  turn that stops at ``max_rounds``;
- ``XSS_SESSION``: markup everywhere (session id, agent, text, arguments, result) that
  must show as text, never run.

``slow_agent.py`` (run in a child process) records a turn whose tool waits for a file.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import loopscope
from loopscope import demo
from loopscope.dashboards.web.server import DashboardServer, serve_in_thread

XSS_SESSION = "xss-<b>session</b>"
XSS_AGENT = "<img src=x onerror=window.__pwned=4>"
XSS_RESULT = "<script>window.__pwned=1</script>"
XSS_ARGUMENT = "<img src=x onerror=window.__pwned=2>"
XSS_TEXT = "<b>not bold</b><script>window.__pwned=3</script>"

RESEARCH_TOOLS = [
    {
        "name": "web_search",
        "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
    {
        "name": "fetch_page",
        "description": "Fetch a page as text.",
        "parameters": {"type": "object", "properties": {"url": {"type": "string"}}},
    },
    {
        "name": "summarize",
        "description": "Summarize a text.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
    },
    {
        "name": "send_email",
        "description": "Send an email.",
        "parameters": {"type": "object", "properties": {"to": {"type": "string"}}},
    },
    {
        "name": "translate",
        "description": "Translate a text.",
        "parameters": {"type": "object", "properties": {"lang": {"type": "string"}}},
    },
]


def _call(call_id: str, name: str, arguments: dict) -> dict:
    return {"id": call_id, "name": name, "arguments": arguments}


def _research(session: str) -> None:
    with loopscope.turn(
        session_id=session,
        agent="researcher",
        tools=RESEARCH_TOOLS,
        model="gpt-4o",
        provider="openai",
        input="What changed in DuckDB's write-ahead log handling this year? Cite sources.",
    ) as turn:
        with turn.round() as rnd:
            rnd.response(
                "I'll search for recent DuckDB release notes first.",
                tool_calls=[_call("r1", "web_search", {"q": "duckdb write-ahead log 2025 release notes"})],
                usage={"input_tokens": 812, "output_tokens": 41},
            )
        with loopscope.tool("web_search", call_id="r1") as call:
            time.sleep(0.12)
            call.set_result(
                [
                    {"title": "DuckDB 1.2 release notes", "url": "https://duckdb.org/2025/02/05/announcing-duckdb-120"},
                    {"title": "Checkpointing and the WAL", "url": "https://duckdb.org/docs/internals/storage"},
                ]
            )
        with turn.round() as rnd:
            rnd.response(
                "Two promising sources; fetching both pages.",
                tool_calls=[
                    _call("r2", "fetch_page", {"url": "https://duckdb.org/2025/02/05/announcing-duckdb-120"}),
                    _call("r3", "fetch_page", {"url": "https://internal.example/wiki/duckdb"}),
                ],
                usage={"input_tokens": 1240, "output_tokens": 63},
            )
        with loopscope.tool("fetch_page", call_id="r2") as call:
            time.sleep(0.2)
            call.set_result(
                {"status": 200, "chars": 18422, "text": "DuckDB 1.2 brings faster checkpoints, WAL replay on open ..."}
            )
        with loopscope.tool("fetch_page", call_id="r3") as call:
            call.refuse("url outside the allowed domains")
        with turn.round() as rnd:
            rnd.response(
                "Summarizing the release notes.",
                tool_calls=[
                    _call("r4", "summarize", {"text": "DuckDB 1.2 brings faster checkpoints, WAL replay on open ..."})
                ],
                usage={"input_tokens": 2210, "output_tokens": 58},
            )
        with loopscope.tool("summarize", call_id="r4") as call:
            time.sleep(0.06)
            call.set_result("Checkpoints no longer block readers; the WAL is replayed lazily on open.")
        turn.generation(
            "DuckDB 1.2 made checkpoints non-blocking for readers and replays the WAL lazily when a file is "
            "opened (source: the 1.2 release notes). An internal wiki page was out of reach.",
            usage={"input_tokens": 2480, "output_tokens": 96},
        )
    with loopscope.turn(
        session_id=session,
        agent="researcher",
        tools=RESEARCH_TOOLS,
        model="gpt-4o",
        provider="openai",
        input="Send the summary to my manager's personal address.",
        input_blocked=True,
    ) as turn:
        turn.generation("I can't send email to personal addresses.", usage={"input_tokens": 640, "output_tokens": 14})
    with loopscope.turn(
        session_id=session,
        agent="researcher",
        tools=RESEARCH_TOOLS[:3],
        model="gpt-4o-mini",
        provider="openai",
        input="Keep digging until you find the exact commit.",
    ) as turn:
        for n in range(3):
            with turn.round() as rnd:
                rnd.response(
                    f"Searching the commit log, attempt {n + 1}.",
                    tool_calls=[_call(f"m{n}", "web_search", {"q": f"duckdb wal commit page {n + 1}"})],
                    usage={"input_tokens": 900 + 300 * n, "output_tokens": 30},
                )
            with loopscope.tool("web_search", call_id=f"m{n}") as call:
                time.sleep(0.03 * (n + 1))
                if n == 1:
                    call.block("result contained a leaked credential")
                call.set_result({"results": [], "page": n + 1})
            if n == 2:
                try:
                    with loopscope.tool("fetch_page", arguments={"url": "https://github.com/duckdb/duckdb/commits"}):
                        raise TimeoutError("fetch timed out after 10 s")
                except TimeoutError:
                    pass
        turn.end("max_rounds")


def _xss(session: str) -> None:
    with loopscope.turn(
        session_id=session,
        agent=XSS_AGENT,
        tools=[{"name": "render", "description": "<script>x</script>"}],
        input=XSS_TEXT,
    ) as turn:
        with turn.round() as rnd:
            rnd.response(
                XSS_TEXT,
                tool_calls=[_call("x1", "render", {"html": XSS_ARGUMENT})],
                usage={"input_tokens": 10, "output_tokens": 5},
            )
        with loopscope.tool("render", call_id="x1") as call:
            call.set_result(XSS_RESULT)
        turn.generation(XSS_TEXT, usage={"input_tokens": 12, "output_tokens": 6})


def record_sample(db: Path) -> dict[str, str]:
    """Record the sample sessions into ``db``; returns their ids by name."""
    demo.run(db, session_id="demo-concierge")
    loopscope.configure(db, flush_interval=0.05)
    try:
        _research("research-7f3a")
        _xss(XSS_SESSION)
    finally:
        loopscope.shutdown()
    return {"demo": "demo-concierge", "research": "research-7f3a", "xss": XSS_SESSION}


def running(server: DashboardServer) -> Iterator[DashboardServer]:
    """Serve ``server`` in a thread for as long as the generator is open."""
    serve_in_thread(server)
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
