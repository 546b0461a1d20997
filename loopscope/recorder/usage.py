"""One usage builder: a provider's token figures -> the usage loopscope records, whatever they include.

The recorded usage (``ModelResponse.usage``, ``gen_ai.usage.*``, the store's columns) always
means the same on every provider:

- ``input_tokens``: every token of the prompt, **including** the cached ones, read
  (``cache_read_input_tokens``) and written (``cache_creation_input_tokens``), as the GenAI
  conventions and OpenAI count them;
- ``output_tokens``: every token generated, **including** the reasoning (thinking) tokens
  (``reasoning_tokens``), as OpenAI and Anthropic count them.

Providers differ: Anthropic's ``input_tokens`` leave the cache out, Gemini counts its thoughts
apart from ``candidates_token_count``. The adapter says which way its figures are
(``input_includes_cache``, ``output_includes_reasoning``) and :func:`usage` adds what is
apart; the provider's own figures go beside, as they came (``ModelResponse.provider_usage``).
"""

from __future__ import annotations

from typing import Any

USAGE_KEYS = (
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "reasoning_tokens",
)
"""The token counts a recorded usage has (any of them may be missing: not reported)."""


def _count(value: Any) -> int | None:
    return value if type(value) is int or (isinstance(value, int) and not isinstance(value, bool)) else None


def usage(
    *,
    input: Any = None,
    output: Any = None,
    cache_read: Any = None,
    cache_write: Any = None,
    reasoning: Any = None,
    input_includes_cache: bool = True,
    output_includes_reasoning: bool = True,
    **more: Any,
) -> dict[str, int]:
    """The recorded usage of a provider's figures (values that are not token counts are left out).

    ``input_includes_cache``: the provider's ``input`` already counts the cached tokens
    (OpenAI's ``prompt_tokens``); False: they are apart (Anthropic's ``input_tokens``) and
    are added. ``output_includes_reasoning``: ``output`` already counts the reasoning tokens
    (OpenAI, Anthropic); False: they are apart (Gemini's thoughts) and are added. ``more``:
    other counts kept by their name (``web_search_requests``: a server tool's requests).
    """
    # the common values (ints) are taken without a function call each: this runs on every model call
    out: dict[str, int] = {}
    read = cache_read if type(cache_read) is int else _count(cache_read)
    write = cache_write if type(cache_write) is int else _count(cache_write)
    thought = reasoning if type(reasoning) is int else _count(reasoning)
    count = input if type(input) is int else _count(input)
    if count is not None:
        if not input_includes_cache:
            count += (read or 0) + (write or 0)
        out["input_tokens"] = count
    count = output if type(output) is int else _count(output)
    if count is not None:
        if not output_includes_reasoning:
            count += thought or 0
        out["output_tokens"] = count
    elif not output_includes_reasoning and thought is not None:
        out["output_tokens"] = thought  # the thoughts alone (no answer text): still generated
    if read is not None:
        out["cache_read_input_tokens"] = read
    if write is not None:
        out["cache_creation_input_tokens"] = write
    if thought is not None:
        out["reasoning_tokens"] = thought
    if not more:
        return out
    for key, value in more.items():
        count = _count(value)
        if count is not None:
            out[key] = count
    return out


__all__ = ["USAGE_KEYS", "usage"]
