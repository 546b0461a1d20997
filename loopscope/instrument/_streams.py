"""Stream proxies: the user sees the SDK's chunks untouched; the round ends exactly once.

A stream ends its round when it is read to the end, raises, is closed (or left by a
``with`` block) before its end, or is garbage-collected unread. The proxy passes every
chunk and every exception through unchanged; an accumulator reads the chunks.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import wrapt

from .._guard import internal_error
from ..recorder.stitch import Generation


class Accumulator(Protocol):
    def add(self, item: Any, generation: Generation) -> None: ...
    def finish(self, generation: Generation) -> None: ...


class _Recording:
    """What a stream proxy reports to; shared with the finalizer, so it holds no proxy."""

    __slots__ = ("generation", "accumulator", "__weakref__")

    def __init__(self, generation: Generation, accumulator: Accumulator) -> None:
        self.generation = generation
        self.accumulator = accumulator

    def add(self, item: Any) -> None:
        try:
            self.accumulator.add(item, self.generation)
        except Exception:
            internal_error("stream chunk")

    def done(self) -> None:
        try:
            self.accumulator.finish(self.generation)
        except Exception:
            internal_error("stream end")

    def fail(self, exc: BaseException) -> None:
        self.generation.fail(exc)

    def abandon(self) -> None:
        self.generation.abandon()


def _abandon(recording: _Recording) -> None:
    recording.abandon()


class SyncStream(wrapt.ObjectProxy):  # type: ignore[misc]
    """Wraps an SDK's sync stream; iteration, ``close`` and ``with`` behave as the SDK's."""

    def __init__(self, wrapped: Any, generation: Generation, accumulator: Accumulator) -> None:
        super().__init__(wrapped)
        recording = _Recording(generation, accumulator)
        self._self_recording = recording
        self._self_iterator: Any = None
        weakref.finalize(self, _abandon, recording)

    def __iter__(self) -> Iterator[Any]:
        return self._self_chunks()

    def _self_chunks(self) -> Iterator[Any]:
        """What a ``for`` loop reads: :meth:`__next__` as a generator, which resumes for less
        than a method call costs per chunk. Both read the same SDK iterator."""
        if self._self_iterator is None:
            self._self_iterator = iter(self.__wrapped__)
        iterator = self._self_iterator
        recording = self._self_recording
        add, generation = recording.accumulator.add, recording.generation
        while True:
            try:
                item = next(iterator)
            except StopIteration:
                recording.done()
                return
            except BaseException as exc:
                recording.fail(exc)
                raise
            try:
                add(item, generation)
            except Exception:
                internal_error("stream chunk")
            yield item

    def __next__(self) -> Any:
        if self._self_iterator is None:
            self._self_iterator = iter(self.__wrapped__)
        try:
            item = next(self._self_iterator)
        except StopIteration:
            self._self_recording.done()
            raise
        except BaseException as exc:
            self._self_recording.fail(exc)
            raise
        recording = self._self_recording
        try:  # _Recording.add, inline: this runs for every chunk
            recording.accumulator.add(item, recording.generation)
        except Exception:
            internal_error("stream chunk")
        return item

    def close(self) -> Any:
        try:
            return self.__wrapped__.close()
        finally:
            self._self_recording.abandon()

    def __enter__(self) -> SyncStream:
        self.__wrapped__.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> Any:
        try:
            return self.__wrapped__.__exit__(*exc_info)
        finally:
            self._self_recording.abandon()


class AsyncStream(wrapt.ObjectProxy):  # type: ignore[misc]
    """Wraps an SDK's async stream; ``async for``, ``close`` and ``async with`` as the SDK's."""

    def __init__(self, wrapped: Any, generation: Generation, accumulator: Accumulator) -> None:
        super().__init__(wrapped)
        recording = _Recording(generation, accumulator)
        self._self_recording = recording
        self._self_iterator: Any = None
        weakref.finalize(self, _abandon, recording)

    def __aiter__(self) -> AsyncStream:
        return self

    async def __anext__(self) -> Any:
        if self._self_iterator is None:
            self._self_iterator = self.__wrapped__.__aiter__()
        try:
            item = await self._self_iterator.__anext__()
        except StopAsyncIteration:
            self._self_recording.done()
            raise
        except BaseException as exc:
            self._self_recording.fail(exc)
            raise
        recording = self._self_recording
        try:  # _Recording.add, inline: this runs for every chunk
            recording.accumulator.add(item, recording.generation)
        except Exception:
            internal_error("stream chunk")
        return item

    async def close(self) -> Any:
        try:
            return await self.__wrapped__.close()
        finally:
            self._self_recording.abandon()

    async def aclose(self) -> Any:
        return await self.close()

    async def __aenter__(self) -> AsyncStream:
        await self.__wrapped__.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> Any:
        try:
            return await self.__wrapped__.__aexit__(*exc_info)
        finally:
            self._self_recording.abandon()


StreamFactory = Callable[[Any, Generation], Any]


def closes_inner_stream(attribute: str, *, is_async: bool = False) -> Callable[..., Any]:
    """A wrapt wrapper for an SDK stream helper's ``close``.

    Helpers such as openai's ``ResponseStream`` read one of our stream proxies (kept in
    ``attribute``) but close the HTTP response directly, so the proxy never hears of it:
    after the helper's ``close`` (or its ``with`` block) the proxy's round ends as well.
    """

    def abandon(helper: Any) -> None:
        inner = getattr(helper, attribute, None)
        if isinstance(inner, (SyncStream, AsyncStream)):
            inner._self_recording.abandon()

    if is_async:

        def async_wrapper(
            wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> Any:
            async def run() -> Any:
                try:
                    return await wrapped(*args, **kwargs)
                finally:
                    abandon(instance)

            return run()

        return async_wrapper

    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        try:
            return wrapped(*args, **kwargs)
        finally:
            abandon(instance)

    return wrapper
