"""The openai SDK: Chat Completions and Responses calls as rounds of stitched turns.

Chat Completions are read by the kit's OpenAI-format reader (:mod:`._openai_compat`, shared
with every provider of that format); the Responses API by :mod:`._openai_responses`. What
is the openai SDK's own is here: which methods are wrapped, its stream and raw-response
classes, its chunk classes for the reader's fast path, and the errors ``parse()`` raises
with an answer in them. Importing this module imports no SDK: :func:`patch` runs once
``openai`` is imported.
"""

from __future__ import annotations

from typing import Any

from ..recorder.adapter import ModelCall, ModelRequest
from . import _read as r
from ._calls import async_call, sync_call
from ._openai_compat import ChatChunks, chat_request, conversations, finish_completion
from ._patch import Patch, Registration, when_imported, wrap
from ._streams import closes_inner_stream, proxy_stream

PROVIDER = "openai"


def _chat_request(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ModelRequest:
    return chat_request(kwargs, provider=PROVIDER, server=r.stainless_server(instance))


_conversations = conversations  # the reader's kept conversations (tests look at them here)


class _ChatChunks(ChatChunks):
    """The reader's chunk accumulator with the openai SDK's chunk classes for its fast path
    (found once ``openai`` is imported: see :func:`_sdk_chunk_types`)."""

    def __init__(self) -> None:
        super().__init__(_sdk_chunk_types())


_chunk_types: tuple[Any, Any] | None = None


def _sdk_chunk_types() -> tuple[Any, Any]:
    """The SDK's ``ChatCompletionChunk`` and its ``Choice``, imported at the first stream (the
    SDK is imported by then); (None, None) for an SDK without them: every chunk the general way."""
    global _chunk_types
    if _chunk_types is None:
        try:
            from openai.types.chat import ChatCompletionChunk
            from openai.types.chat.chat_completion_chunk import Choice

            _chunk_types = (ChatCompletionChunk, Choice)
        except ImportError:  # pragma: no cover - an SDK without them
            _chunk_types = (None, None)
    return _chunk_types


def _deliver_chat(result: Any, model_call: ModelCall) -> Any:
    return _deliver(result, model_call, finish_completion, _ChatChunks)


def _parse_answered(exc: BaseException) -> Any:
    """The completion ``parse()`` raises with when it cannot parse what the model answered
    (``LengthFinishReasonError``: cut at the token limit; ``ContentFilterFinishReasonError``:
    the provider's filter stopped it): the call was answered and billed, so the completion
    is recorded (its finish reason makes the outcome ``truncated`` / ``content_filter``)."""
    import openai

    if isinstance(exc, (openai.LengthFinishReasonError, openai.ContentFilterFinishReasonError)):
        return exc.completion  # None for a content filter error raised without one
    return None


# -- shared delivery ------------------------------------------------------------------


def _deliver(result: Any, model_call: ModelCall, finish_one: Any, chunks: Any) -> Any:
    if r.is_model(result):  # a parsed response: by far the most common (and
        finish_one(result, model_call)  # ``hasattr`` on a model for what it lacks is slow)
        return result
    import openai

    if isinstance(result, (openai.Stream, openai.AsyncStream)):
        return proxy_stream(result, model_call, chunks())
    if hasattr(result, "http_response") and hasattr(result, "parse"):
        return _raw_response(result, model_call, finish_one, chunks)
    finish_one(result, model_call)
    return result


def _raw_response(result: Any, model_call: ModelCall, finish_one: Any, chunks: Any) -> Any:
    """``with_raw_response`` calls: the body is read when the user parses it."""
    from ._raw import RawResponse

    return RawResponse(result, model_call, lambda parsed: _deliver(parsed, model_call, finish_one, chunks))


# -- patching -------------------------------------------------------------------------


def patch() -> list[Registration]:
    # The SDK imports a resource at its first use (``client.chat``, ``client.responses``),
    # some at a cost (~0.3 s for the Responses stream events): each is wrapped then.
    registrations = [
        when_imported("openai.resources.chat.completions.completions", _patch_chat, "instrument openai"),
        # the stream() helpers read our stream proxy but close the HTTP response directly
        when_imported("openai.lib.streaming.chat._completions", _patch_chat_helpers, "instrument openai"),
    ]
    try:
        from . import _openai_responses
    except ImportError:  # the Responses adapter is optional
        pass
    else:
        registrations += _openai_responses.patch(_deliver)
    return registrations


def _patch_chat(chat: Any) -> list[Patch | None]:
    return [
        # the openai SDK emits no spans of its own: nothing needs the call marked
        wrap(chat.Completions, "create", sync_call(_chat_request, _deliver_chat, mark=False)),
        wrap(chat.Completions, "parse", sync_call(_chat_request, _deliver_chat, mark=False, answered=_parse_answered)),
        wrap(chat.AsyncCompletions, "create", async_call(_chat_request, _deliver_chat, mark=False)),
        wrap(chat.AsyncCompletions, "parse", async_call(_chat_request, _deliver_chat, mark=False, answered=_parse_answered)),
    ]


def _patch_chat_helpers(helpers: Any) -> list[Patch | None]:
    # the helper raises parse()'s errors as it reads the chunk that finishes the answer
    return [
        wrap(helpers.ChatCompletionStream, "close", closes_inner_stream("_raw_stream", answered=_parse_answered)),
        wrap(
            helpers.AsyncChatCompletionStream,
            "close",
            closes_inner_stream("_raw_stream", is_async=True, answered=_parse_answered),
        ),
    ]
