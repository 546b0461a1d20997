"""The two-round tool loop the wire tests drive each provider's SDK through: a question about
the weather, a round that calls ``get_weather``, an answer. One copy, so that every wire is
checked on the same conversation."""

from __future__ import annotations

from .script import Reply, ToolCall, Usage

TOOLS = [{"type": "function", "function": {  # OpenAI's tool format, which these SDKs take as it is
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}}]
QUESTION = {"role": "user", "content": "Weather in Paris?"}
ANSWER = "21 °C and dry in Paris."


def queue_tool_loop(server: object, text: str = "Let me look.", cached_tokens: int | None = None) -> None:
    """Queue the loop's two replies on the fake model server: ``text`` and a ``get_weather``
    call (100 tokens in, 20 out, ``cached_tokens`` of them cached), then the answer (140, 9)."""
    first_usage = Usage(100, 20) if cached_tokens is None else Usage(100, 20, cached_tokens=cached_tokens)
    server.queue(  # type: ignore[attr-defined]
        Reply(text=text, tool_calls=[ToolCall("get_weather", {"city": "Paris"})], usage=first_usage),
        Reply(text=ANSWER, usage=Usage(140, 9)),
    )
