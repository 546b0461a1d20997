"""MCP: every ``ClientSession.call_tool`` as a tool call.

Each call is an ``execute_tool`` span with its arguments, the result's content and its
duration. MCP reports a tool's failure inside the result (``isError``), not as an
exception: such a result is outcome ``failed`` with the result's text as the error. An
exception (a protocol error, a timeout) is ``failed`` too and reaches the caller
unchanged.

Inside a turn (``loopscope.turn(...)``, or a turn stitched from SDK calls in this
context) the call joins that turn, and when the model asked for a tool of that name that
has not run yet, the MCP call serves that call, as a ``@loopscope.tool`` function would:
one tool call, with the id the model gave it. A call made inside a tool that is recorded
already under the same name (an MCP-backed LangChain tool) is that tool's call, and is
not recorded twice.

``list_tools`` is not recorded as declared tools: a server listing its tools does not
offer them to the model (the application picks which to send), and the model request
that does offer them declares them already.
"""

from __future__ import annotations

from typing import Any

from .._guard import guarded
from ..recorder.adapter import ToolExecution, end_tool, result_value, running_tool, start_tool
from ._calls import async_tool
from ._patch import Patch, wrap


def _call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, Any]:
    """The tool name and arguments of ``call_tool(name, arguments=None, ...)``."""
    name = args[0] if args else kwargs.get("name")
    arguments = args[1] if len(args) > 1 else kwargs.get("arguments")
    return str(name), arguments


def _content(result: Any) -> tuple[Any, str | None]:
    """What a ``CallToolResult`` holds, as a value, and its text (for an error)."""
    blocks = getattr(result, "content", None) or []
    texts = [getattr(b, "text", None) for b in blocks if getattr(b, "type", None) == "text"]
    texts = [t for t in texts if isinstance(t, str)]
    text = "\n".join(texts) if texts else None
    if blocks and len(texts) == len(blocks):
        return result_value(text), text
    if blocks:  # images, audio, resources: what they are, not their bytes
        value = []
        for block in blocks:
            kind = getattr(block, "type", None)
            if kind == "text":
                value.append({"type": "text", "text": getattr(block, "text", None)})
            else:
                entry = {"type": kind}
                for key in ("mimeType", "uri", "name"):
                    found = getattr(block, key, None) or getattr(getattr(block, "resource", None), key, None)
                    if isinstance(found, str):
                        entry[key] = found
                value.append(entry)
        return value, text
    return getattr(result, "structuredContent", None), text


@guarded("mcp tool result")
def _deliver(execution: ToolExecution, result: Any) -> None:
    value, text = _content(result)
    execution.set_result(value)
    if getattr(result, "isError", False):
        execution.fail(text or "the tool returned an error")


def _end(execution: ToolExecution, exc: BaseException | None, result: Any) -> None:
    if exc is None:
        _deliver(execution, result)
    end_tool(execution, exc)


@guarded("mcp tool start")
def _start(args: tuple[Any, ...], kwargs: dict[str, Any]) -> ToolExecution | None:
    name, arguments = _call(args, kwargs)
    if running_tool() == name:
        return None  # the tool being recorded is this call
    return start_tool(name, arguments)


def patch() -> list[Patch]:
    from mcp.client.session import ClientSession

    patches = [wrap(ClientSession, "call_tool", async_tool(_start, _end))]
    return [p for p in patches if p is not None]
