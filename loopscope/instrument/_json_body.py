"""A streamed request answered by a JSON body (an HTTP 200 error, no event stream).

Some gateways answer ``stream=True`` with HTTP 200, ``application/json`` and an error
object. The SDKs' event-stream decoders find no event in it and the application sees an
empty stream, raising nothing. For such a response only, the SDK stream's decoder is
wrapped so the bytes it reads are also copied (bounded) into a :class:`JsonBody`: the SDK
reads the very same bytes, unchanged and in the same order. When the stream ends having
decoded no event, the call is an error with the body's own message.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

from ..recorder.adapter import ModelResponse

LIMIT = 64 * 1024
"""Bytes of the body kept: an error object is far smaller; a large body is not kept whole."""

NO_EVENT_STREAM = "HTTP 200 with a JSON body, not an event stream"


class JsonBody:
    """The copied bytes of a JSON answer to a streamed request, and the events decoded from it."""

    __slots__ = ("data", "events")

    def __init__(self) -> None:
        self.data = bytearray()
        self.events = 0

    def keep(self, chunk: Any) -> None:
        room = LIMIT - len(self.data)
        if room > 0 and isinstance(chunk, (bytes, bytearray, memoryview)):
            self.data += bytes(chunk[:room])

    def response(self) -> ModelResponse:
        """The call's error: the body's error message and type when it has them."""
        text, kind = NO_EVENT_STREAM, "json_body"
        try:
            body = json.loads(bytes(self.data))
        except ValueError:
            return ModelResponse(error=text, error_type=kind)
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, str) and error:
            text = error
        elif isinstance(error, dict):
            message = error.get("message")
            if isinstance(message, str) and message:
                text = message
            found = error.get("type") or error.get("code")
            if found:
                kind = str(found)
        return ModelResponse(error=text, error_type=kind)


class _TeeDecoder:
    """Stands in for the SDK's SSE decoder: its own decoder decodes, we copy and count."""

    def __init__(self, decoder: Any, body: JsonBody) -> None:
        self._decoder = decoder
        self._body = body

    def __getattr__(self, name: str) -> Any:
        return getattr(self._decoder, name)

    def iter_bytes(self, iterator: Iterator[bytes]) -> Iterator[Any]:
        body = self._body

        def copied() -> Iterator[bytes]:
            for chunk in iterator:
                try:
                    body.keep(chunk)
                except Exception:  # noqa: S110 - the copy is ours; the SDK gets its bytes regardless
                    pass
                yield chunk

        for event in self._decoder.iter_bytes(copied()):
            body.events += 1
            yield event

    async def aiter_bytes(self, iterator: AsyncIterator[bytes]) -> AsyncIterator[Any]:
        body = self._body

        async def copied() -> AsyncIterator[bytes]:
            async for chunk in iterator:
                try:
                    body.keep(chunk)
                except Exception:  # noqa: S110 - as above
                    pass
                yield chunk

        async for event in self._decoder.aiter_bytes(copied()):
            body.events += 1
            yield event


def _is_json(stream: Any) -> bool:
    response = getattr(stream, "response", None)
    headers = getattr(response, "headers", None)
    if headers is None:
        return False
    kind = str(headers.get("content-type") or "").split(";")[0].strip().lower()
    return kind == "application/json" or kind.endswith("+json")


def watch(stream: Any) -> JsonBody | None:
    """A :class:`JsonBody` for an SDK stream whose response is JSON rather than an event
    stream (None for an event stream, the usual case: then nothing is wrapped). The SDK's
    decoder is wrapped only before the stream is read, so no byte is missed or read twice."""
    if not _is_json(stream):
        return None
    body = JsonBody()
    decoder = getattr(stream, "_decoder", None)
    if decoder is not None and hasattr(decoder, "iter_bytes"):
        stream._decoder = _TeeDecoder(decoder, body)
    return body


__all__ = ["JsonBody", "watch"]
