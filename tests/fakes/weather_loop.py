"""The two-round tool loop the wire tests drive each provider's SDK through: a question about
the weather, a round that calls ``get_weather``, an answer. One copy, so that every wire is
checked on the same conversation."""

from __future__ import annotations

from typing import Any

from .script import Reply, ToolCall, Usage

TOOLS = [{"type": "function", "function": {  # OpenAI's tool format, which these SDKs take as it is
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}}]
QUESTION = {"role": "user", "content": "Weather in Paris?"}
WEATHER = {"type": "function", "function": {  # the adapters' tests' tool, in OpenAI's format too
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}}
ANSWER = "21 °C and dry in Paris."


def queue_tool_loop(server: object, text: str = "Let me look.", cached_tokens: int | None = None) -> None:
    """Queue the loop's two replies on the fake model server: ``text`` and a ``get_weather``
    call (100 tokens in, 20 out, ``cached_tokens`` of them cached), then the answer (140, 9)."""
    first_usage = Usage(100, 20) if cached_tokens is None else Usage(100, 20, cached_tokens=cached_tokens)
    server.queue(  # type: ignore[attr-defined]
        Reply(text=text, tool_calls=[ToolCall("get_weather", {"city": "Paris"})], usage=first_usage),
        Reply(text=ANSWER, usage=Usage(140, 9)),
    )


def queue_tool_round(server: object, tag: str = "", *, call_id: str | None = None, city: str = "Paris",
                     text: str = "Let me check the weather.", usage: Usage | None = None, **first: Any) -> None:
    """Queue a round that says ``text`` and calls ``get_weather`` for ``city`` with the provider's
    id ``call_id`` (the wire's own when None; ``usage``: 100 tokens in, 20 out, 30 cached unless
    given; ``first``: more of the first reply's fields), then its answer (150, 10), for the
    requests whose text holds ``tag`` (any, when empty)."""
    server.queue(  # type: ignore[attr-defined]
        Reply(text=text, tool_calls=[ToolCall("get_weather", {"city": city}, id=call_id)],
              usage=usage or Usage(100, 20, cached_tokens=30), **first),
        Reply(text=f"It is 21 °C and sunny in {city}.", usage=Usage(150, 10)),
        match=tag or None,
    )


def queue_long_reply(server: object) -> None:
    """Queue an answer streamed in many chunks: a stream to let go before its end."""
    server.queue(Reply(text="one two three four five six seven eight nine ten eleven twelve", chunk_size=4))  # type: ignore[attr-defined]
