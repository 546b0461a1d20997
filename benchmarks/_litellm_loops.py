"""What the LiteLLM benchmarks share: the two-round weather loop's tool and the fake model server
that answers it, in a child process (its threads then take no GIL from the caller being timed)."""

from __future__ import annotations

import multiprocessing
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the fake model server

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
WARMUP = 10
"""Loops run before the measured ones."""


def _serve(found: Any, loops: int) -> None:
    from fakes.model_server import FakeModelServer
    from fakes.script import Reply, ToolCall, Usage

    server = FakeModelServer().start()
    for i in range(loops):
        server.queue(Reply(text="Let me check.", tool_calls=[ToolCall("get_weather", {"city": "Paris"}, id=f"c{i}")],
                           usage=Usage(100, 20)),
                     Reply(text="Sunny.", usage=Usage(120, 5)), match=f"q{i} ")
    found.put(server.openai_base_url)
    threading.Event().wait()


def route(loops: int) -> dict[str, Any]:
    """LiteLLM's arguments for a fake server, in a forked child, that answers ``loops`` loops
    (each: a tool call for the user message ``q<i> ...``, then the answer)."""
    spawn = multiprocessing.get_context("fork")
    found = spawn.Queue()
    spawn.Process(target=_serve, args=(found, loops), daemon=True).start()
    return {"model": "openai/gpt-4.1-mini", "api_base": found.get(timeout=60), "api_key": "sk-bench", "num_retries": 0}
