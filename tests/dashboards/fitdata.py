"""A store with the long names real agents have, for the dashboard's fit-the-screen tests.

Recorded through the real openai SDK against the fake model server: a fine-tuned model's
long name, a session id of a request id and a tenant, a long agent and tool name (and an MCP tool's), a turn that
ends at ``budget_exceeded`` (the longest end reason), and five tool calls in one turn (so the
charts' maximum is 5: halves between its gridlines).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import loopscope
from fakes.model_server import STANDS_FOR, FakeModelServer, Reply, ToolCall, Usage

LONG_SESSION = "support-escalation-2026-12-07T16:50:12.345Z-7b1f9c2e-4d5a-4c3b-9e8f-0a1b2c3d4e5f-tenant-acme-eu-west-1"
LONG_AGENT = "customer-support-escalation-orchestrator-agent"
LONG_MODEL = "ft:gpt-4o-mini-2024-07-18:acme-corporation:support-escalation-v3:9xYzAbCdEfGh"
LONG_TOOL = "lookup_customer_order_history_by_email_address"
# an MCP server's tool as agent frameworks name it: server and tool, 63 characters (OpenAI's limit is 64)
MCP_TOOL = "mcp__github__list_pull_request_review_comments_for_a_repository"
SHORT_SESSION = "fit-short"
TOOL_CALLS = 5  # all in one turn, so one bucket of the charts holds 5

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": LONG_TOOL,
            "description": "Orders of a customer",
            "parameters": {"type": "object", "properties": {"email": {"type": "string"}}, "required": ["email"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": MCP_TOOL,
            "description": "Review comments of a pull request",
            "parameters": {"type": "object", "properties": {"pr": {"type": "integer"}}, "required": ["pr"]},
        },
    },
]


@loopscope.tool(LONG_TOOL)
def lookup(email: str) -> dict[str, Any]:
    return {"email": email, "orders": [{"id": "A-1", "status": "shipped"}]}


@loopscope.tool(MCP_TOOL)
def review_comments(pr: int) -> list[dict[str, Any]]:
    return [{"pr": pr, "body": "Please add a test."}]


def record(db: Path) -> None:
    loopscope.configure(db, flush_interval=0.05, prices=STANDS_FOR)
    loopscope.instrument(anthropic=False)
    try:
        with FakeModelServer() as server:
            client = server.openai_client()
            asks = [
                Reply(
                    text=f"Looking up order history, page {n + 1}.",
                    tool_calls=[ToolCall(LONG_TOOL, {"email": f"customer{n}@example.com"}, id=f"call_{n}")],
                    usage=Usage(1100 + 137 * n, 23),
                )
                for n in range(TOOL_CALLS - 1)
            ]
            asks.append(
                Reply(
                    text="And the review comments.",
                    tool_calls=[ToolCall(MCP_TOOL, {"pr": 4821}, id=f"call_{TOOL_CALLS - 1}")],
                    usage=Usage(1648, 19),
                )
            )
            server.queue(*asks, match="[budget]")
            server.queue(Reply(text="Hello.", usage=Usage(12, 3)), match="[short]")
            with (
                loopscope.session(LONG_SESSION),
                loopscope.turn(
                    agent=LONG_AGENT, model=LONG_MODEL, provider="openai", input="[budget] Where are my orders?"
                ) as turn,
            ):
                messages: list[dict[str, Any]] = [{"role": "user", "content": "[budget] Where are my orders?"}]
                for _ in range(TOOL_CALLS):
                    message = (
                        client.chat.completions.create(model=LONG_MODEL, messages=messages, tools=TOOLS)
                        .choices[0]
                        .message
                    )
                    messages.append(message.model_dump(exclude_none=True))
                    for call in message.tool_calls or []:
                        run = lookup if call.function.name == LONG_TOOL else review_comments
                        result = run(**json.loads(call.function.arguments))
                        messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
                turn.end("budget_exceeded")
            with loopscope.session(SHORT_SESSION):
                client.chat.completions.create(
                    model="gpt-4o-mini", messages=[{"role": "user", "content": "[short] Hi"}]
                )
        # written before the close: the writer process started at configure() may still be
        # starting on a loaded machine (CI's four workers), and a close does not wait past its bound
        assert loopscope.flush(60)
    finally:
        loopscope.uninstrument()
        loopscope.shutdown()
