"""The groq SDK: ``chat.completions.create`` (sync, async, streamed) as rounds of stitched turns.

Groq answers in OpenAI's Chat Completions format, read by the kit's reader
(:mod:`._openai_compat`). What is Groq's own is here: the wrapped methods, its stream
classes, and ``x_groq``: the request id Groq support knows a call by, and in a stream the
call's usage (the final chunk's ``x_groq.usage``, sent whatever ``stream_options`` says).
A parsed reasoning format's ``reasoning`` text is the round's thinking.
Groq's usage adds its timings (``queue_time``, ``prompt_time``, ``completion_time``,
``total_time``, seconds): they are kept whole in the call's provider usage, with
``x_groq_id`` and ``x_groq``'s hardware cache counts.

Only the kit is imported, never the openai adapter: importing that one from here once
fired the openai import hook while it was half made, and the openai adapter was off for the
process. Importing this module imports no SDK: :func:`patch` runs once ``groq`` is imported.
"""

from __future__ import annotations

from typing import Any

from ..recorder.adapter import ModelCall, ModelRequest, ModelResponse, server_of
from ._calls import async_call, sync_call
from ._openai_compat import ChatChunks, chat_request, chat_usage, finish_completion
from ._patch import Patch, Registration, when_imported, wrap
from ._raw import RawResponse
from ._streams import proxy_stream

PROVIDER = "groq"

_OWN_PARAMETERS = ("reasoning_format", "include_reasoning", "citation_options", "search_settings", "compound_custom")
"""Groq's request parameters with no name of their own in loopscope: kept under ``other``."""


def _request(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ModelRequest:
    client = getattr(instance, "_client", None)
    request = chat_request(kwargs, provider=PROVIDER, server=server_of(getattr(client, "base_url", None)))
    own = {key: kwargs[key] for key in _OWN_PARAMETERS if kwargs.get(key) is not None}
    if own and isinstance(request.parameters, dict):
        request.parameters["other"] = own
    return request


def _fields(value: Any) -> dict[str, Any]:
    """An SDK model's fields the response set (a dict as it is)."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return dict(value)
    dump = getattr(value, "model_dump", None)
    return dump(exclude_unset=True, warnings=False) if dump is not None else {}


def _provider_usage(usage: Any, x_groq: Any) -> dict[str, Any] | None:
    """Groq's figures: its usage with the timings, ``x_groq``'s request id and cache counts."""
    if x_groq is None:
        return None  # the usage alone: the reader's own JSON of it
    out = _fields(usage)
    extra = _fields(x_groq)
    if extra.get("id"):
        out["x_groq_id"] = extra["id"]
    cache = extra.get("usage")
    if isinstance(cache, dict) and "prompt_tokens" not in cache:  # a completion's hardware cache counts
        out.update({key: value for key, value in cache.items() if value is not None})
    return out or None


class _GroqChunks(ChatChunks):
    """The reader's chunk accumulator, with ``x_groq``: the usage of the final chunk, the
    request id of the first, and the error a stream was stopped with."""

    def __init__(self) -> None:
        super().__init__()
        self.x_groq_id: str | None = None
        self.x_groq_error: str | None = None
        self.reasoning: list[str] = []

    def capture(self, chunk: Any) -> Any:
        captured = super().capture(chunk)
        choices = getattr(chunk, "choices", None)
        if choices:  # the reasoning of a parsed reasoning format, in pieces
            reasoning = getattr(getattr(choices[0], "delta", None), "reasoning", None)
            if isinstance(reasoning, str) and reasoning:
                self.reasoning.append(reasoning)
        x_groq = getattr(chunk, "x_groq", None)
        if x_groq is None:
            return captured
        if not self.x_groq_id:
            self.x_groq_id = getattr(x_groq, "id", None)
        error = getattr(x_groq, "error", None)
        if error:
            self.x_groq_error = str(error)
        usage = getattr(x_groq, "usage", None)
        if usage is not None and captured[2] is None:
            captured = (captured[0], captured[1], (chat_usage(usage), usage), captured[3])
        return captured

    def partial(self) -> ModelResponse:
        response = super().partial()
        if self.x_groq_id and self.reported_usage is not None:
            response.provider_usage = {**_fields(self.reported_usage), "x_groq_id": self.x_groq_id}
        if self.x_groq_error:
            response.error = self.x_groq_error
        if self.reasoning:
            response.thinking = "".join(self.reasoning)
        return response


def _deliver(result: Any, model_call: ModelCall) -> Any:
    import groq

    if isinstance(result, (groq.Stream, groq.AsyncStream)):
        return proxy_stream(result, model_call, _GroqChunks())
    if hasattr(result, "http_response") and hasattr(result, "parse"):  # with_raw_response: read when parsed
        return RawResponse(result, model_call, lambda parsed: _deliver(parsed, model_call))
    choices = getattr(result, "choices", None)
    reasoning = getattr(getattr(choices[0], "message", None), "reasoning", None) if choices else None
    finish_completion(
        result,
        model_call,
        provider_usage=_provider_usage(getattr(result, "usage", None), getattr(result, "x_groq", None)),
        thinking=reasoning if isinstance(reasoning, str) and reasoning else None,
    )
    return result


def patch() -> list[Registration]:
    return [when_imported("groq.resources.chat.completions", _patch_chat, "instrument groq")]


def _patch_chat(chat: Any) -> list[Patch | None]:
    # the groq SDK emits no spans of its own: nothing needs the call marked
    return [
        wrap(chat.Completions, "create", sync_call(_request, _deliver, mark=False)),
        wrap(chat.AsyncCompletions, "create", async_call(_request, _deliver, mark=False)),
    ]
