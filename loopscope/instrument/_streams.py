"""Stream proxies: the user sees the SDK's chunks untouched; the round ends exactly once.

A stream ends its round when it is read to the end, raises, is closed (or left by a
``with`` block) before its end, is garbage-collected unread, or is still open at exit.
The proxy passes every chunk and every exception through unchanged; the adapter's
accumulator reads the chunks, a batch at a time (see :data:`BATCH`), and an event that
ends the round at once. A chunk read after the application has had it may have been
changed by then (an app that merges tool-call deltas into the first chunk's objects, as
LlamaIndex's OpenAI LLM does): an accumulator with a ``capture`` keeps, as each chunk is
handed on, the values it will read (see :class:`Accumulator`).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterator
from time import monotonic_ns
from typing import TYPE_CHECKING, Any, Protocol

import wrapt

# The per-chunk reading and the stream's end run on every recorded call: they keep a plain
# ``try`` and ``internal_error`` rather than ``with guard(...)``, because a try costs
# nothing until it fails while a with block makes two Python method calls every time (about
# 0.3 us a block measured, several per call: a tenth of a hand tool call's cost, see
# benchmarks/bench_tool_call.py).
from .._guard import guard, internal_error
from ..models import ToolCall
from ..recorder.adapter import ModelCall, ModelResponse, on_exit
from . import _read as r
from ._json_body import JsonBody, watch

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self from 3.11; only read by type checkers here


class Accumulator(Protocol):
    """Reads a stream's chunks into one response. It may also have:

    - ``final_events``: the event types after which it ends its round (see :func:`_final_events`);
    - ``capture(chunk)``: what of a chunk to keep, taken the moment the chunk is handed to
      the application (its strings and numbers, which nobody can change in place): ``add``
      is then given that instead of the chunk, when the batch is read. Without it, ``add``
      reads the chunk objects themselves, as the application may have left them.
    """

    # positional-only: each adapter names the item for what it is (a chunk, an event)
    def add(self, item: Any, model_call: ModelCall, /) -> None: ...
    def finish(self, model_call: ModelCall, /) -> None: ...
    def partial(self) -> ModelResponse:
        """What the stream has said so far (id, model, usage, finish reasons): kept on a
        call whose stream is closed early or breaks."""
        ...


def _final_events(accumulator: Accumulator) -> frozenset[str]:
    """The event types after which an accumulator ends its round (``final_events``): the
    proxy hands those over at once, so the round ends when the user has read it, even if
    the stream is never read to its end."""
    return getattr(accumulator, "final_events", frozenset())


def _is_final(item: Any, finals: frozenset[str]) -> bool:
    """Whether ``item`` is an event of ``finals``: by its ``type``, or a dict's one key (botocore's
    event streams name each event so: ``{"metadata": {...}}``)."""
    if type(item) is dict:
        return item.get("type") in finals or (len(item) == 1 and next(iter(item)) in finals)
    return getattr(item, "type", None) in finals


BATCH = 32
"""Chunks a proxy keeps before its accumulator reads them. Read one at a time, between
the SDK's parsing of one chunk and the next, the accumulator's code and data are cold
every time (2-3 us a chunk); read a few dozen at once, they stay warm (under 1 us)."""


class _Recording:
    """What a stream proxy reports to, and the chunks it has not read yet. Kept apart from
    the proxy (which holds it), so the registry of open streams keeps no proxy alive."""

    __slots__ = ("accumulator", "body", "capture", "finals", "model_call", "pending", "stamps")

    def __init__(self, model_call: ModelCall, accumulator: Accumulator) -> None:
        self.model_call = model_call
        self.accumulator = accumulator
        self.finals = _final_events(accumulator)
        # what of each chunk to keep as it passes (None: the chunk itself), see Accumulator
        self.capture: Callable[[Any], Any] | None = getattr(accumulator, "capture", None)
        self.pending: list[Any] = []  # the chunks not read yet, or what ``capture`` kept of them
        self.stamps: list[int] = []  # when each pending chunk reached the user (monotonic ns)
        self.body: JsonBody | None = None  # set for a JSON answer to a streamed request only

    def feed(self, final: bool = False) -> None:
        """Hand the pending chunks to the accumulator. A round's time to first chunk is the
        arrival of the chunk that set it, not the moment the batch was read. ``final``: the
        last pending chunk is an event that ends the round (see :func:`_final_events`)."""
        pending, stamps = self.pending, self.stamps
        if not pending:
            return
        model_call = self.model_call
        add = self.accumulator.add
        # an event that ends the round (Anthropic's message_stop, the Responses API's completed)
        # is the batch's last (the proxy feeds at once after it): it is added after the batch's
        # chunk times reach the round, which hands them over as it ends
        last = pending.pop() if final else None
        first_unset = not model_call.chunk_seen()
        start = -1 if first_unset else 0  # the first of these chunks from the first output chunk on
        for item, stamp in zip(pending, stamps):
            # a plain try (see the note at the imports): this runs once per chunk
            try:
                add(item, model_call)
            except Exception:
                internal_error("stream chunk")
            if first_unset and model_call.chunk_seen():
                model_call.date_first_chunk(stamp)
                first_unset = False
                start = stamps.index(stamp)  # once a call
        if start >= 0:
            # the gaps between chunks (time_per_output_chunk), a batch at a time: the recorder
            # keeps them, bounded, only while metrics want them, and computes nothing here
            try:
                model_call.chunk_times(stamps, start)
            except Exception:
                internal_error("stream chunk times")
        if last is not None:
            try:
                add(last, model_call)
            except Exception:
                internal_error("stream chunk")
            if first_unset and model_call.chunk_seen():
                model_call.date_first_chunk(stamps[-1])
        pending.clear()
        stamps.clear()

    def done(self) -> None:
        if _unfinished.pop(id(self), None) is None:
            return
        self.feed()
        try:
            body = self.body
            if body is not None and not body.events:
                # a JSON body (an HTTP 200 error) where events were asked for: the SDK read
                # it as an empty stream; the call is the body's error
                self.model_call.finish(body.response())
            else:
                self.accumulator.finish(self.model_call)
        except Exception:
            internal_error("stream end")

    def fail(self, exc: BaseException) -> None:
        if _unfinished.pop(id(self), None) is not None:
            self.feed()
            self.model_call.fail(exc, self._partial())

    def abandon(self) -> None:
        if _unfinished.pop(id(self), None) is not None:
            self.feed()  # what was read before the stream was let go is part of the round
            self.model_call.abandon(self._partial())

    def _partial(self) -> ModelResponse:
        try:
            return self.accumulator.partial()
        except Exception:
            internal_error("stream partial")
            return ModelResponse()


_unfinished: dict[int, _Recording] = {}
"""The recordings of the streams that have not ended yet: a proxy's ``__del__`` ends its
round if nothing else did, and at exit the ones still open end too (a stream held by a
global is never collected before the store's last flush)."""


def _end_unfinished() -> None:
    for recording in list(_unfinished.values()):
        with guard("stream end at exit"):
            recording.abandon()


# run by the pipeline's exit hook before it ends the stitched turns and closes the store:
# these rounds end, and their turns with them, while the store still takes rows
on_exit(_end_unfinished)


class _Proxy(wrapt.ObjectProxy):  # type: ignore[misc]
    """What both stream proxies share: the recording, and ending the round once.

    ``__del__``, not ``weakref.finalize``: a finalizer costs a registry entry, a weak
    reference with a callback and an exit hook per stream, several microseconds a call;
    the proxy is in no cycle, so it is collected the moment the user lets go of it.
    """

    def __init__(self, wrapped: Any, model_call: ModelCall, accumulator: Accumulator) -> None:
        super().__init__(wrapped)
        recording = _Recording(model_call, accumulator)
        self._self_recording = recording
        self._self_iterator: Any = None
        _unfinished[id(recording)] = recording
        try:  # a plain try (see the note at the imports): this runs once per streamed call
            recording.body = watch(wrapped)
        except Exception:
            internal_error("stream body type")

    def _self_take(self, item: Any) -> None:
        recording = self._self_recording
        capture = recording.capture
        try:  # a plain try (see the note at the imports): this runs once per chunk
            recording.pending.append(item if capture is None else capture(item))
        except Exception:
            internal_error("stream chunk capture")
            return
        recording.stamps.append(monotonic_ns())
        final = bool(recording.finals) and _is_final(item, recording.finals)
        if final or len(recording.pending) >= BATCH:
            recording.feed(final)

    def _self_abandon(self) -> None:
        self._self_recording.abandon()

    def __del__(self) -> None:
        try:
            self._self_recording.abandon()
        except Exception:  # noqa: S110 - a finalizer must not raise; there is nobody to tell
            pass


class SyncStream(_Proxy):
    """Wraps an SDK's sync stream; iteration, ``close`` and ``with`` behave as the SDK's."""

    def __iter__(self) -> Iterator[Any]:
        return self._self_chunks()

    def _self_chunks(self) -> Iterator[Any]:
        """What a ``for`` loop reads: the SDK's iterator under a ``for`` of its own, which
        costs less per chunk than :meth:`__next__`'s method call. Both read the same
        iterator, so a stream read partly each way goes on where it was."""
        if self._self_iterator is None:
            self._self_iterator = iter(self.__wrapped__)
        recording = self._self_recording
        pending, stamps, clock, finals = recording.pending, recording.stamps, monotonic_ns, recording.finals
        keep, capture = pending.append, recording.capture
        try:
            for item in self._self_iterator:
                # _self_take, inline: this runs for every chunk
                if capture is None:
                    keep(item)
                else:
                    try:  # what the provider sent, before the application can change the objects
                        keep(capture(item))
                    except Exception:
                        internal_error("stream chunk capture")
                        yield item
                        continue
                stamps.append(clock())
                if finals and _is_final(item, finals):
                    recording.feed(True)
                elif len(pending) >= BATCH:
                    recording.feed()
                yield item
        except GeneratorExit:  # the reader stopped early: close, ``with`` or __del__ ends it
            raise
        except BaseException as exc:
            recording.fail(exc)
            raise
        recording.done()

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
        self._self_take(item)
        return item

    def close(self) -> Any:
        try:
            return self.__wrapped__.close()
        finally:
            self._self_abandon()

    def __enter__(self) -> Self:
        self.__wrapped__.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> Any:
        try:
            return self.__wrapped__.__exit__(*exc_info)
        finally:
            self._self_abandon()


class AsyncStream(_Proxy):
    """Wraps an SDK's async stream; ``async for``, ``close`` and ``async with`` as the SDK's."""

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
        self._self_take(item)
        return item

    async def close(self) -> Any:
        """The source's ``close`` (a Stainless stream's), else its ``aclose`` (an async generator's)."""
        return await self._self_close("close", "aclose")

    async def aclose(self) -> Any:
        """The source's ``aclose`` (an async generator's: google-genai's streams), else its ``close``."""
        return await self._self_close("aclose", "close")

    async def _self_close(self, first: str, second: str) -> Any:
        wrapped = self.__wrapped__
        closer = getattr(wrapped, first, None)
        if closer is None:
            closer = getattr(wrapped, second)  # neither: the AttributeError the source itself gives
        try:
            result = closer()
            return await result if inspect.isawaitable(result) else result
        finally:
            self._self_abandon()

    async def __aenter__(self) -> Self:
        await self.__wrapped__.__aenter__()
        return self

    async def __aexit__(self, *exc_info: object) -> Any:
        try:
            return await self.__wrapped__.__aexit__(*exc_info)
        finally:
            self._self_abandon()


StreamFactory = Callable[[Any, ModelCall], Any]


# -- what accumulators share ---------------------------------------------------------------------


class Gathered:
    """What an answer has said so far, gathered by an adapter's accumulator from a whole
    response or from a stream's chunks: its text (:meth:`said`), reasoning (``thinking``),
    tool calls (``calls``), the provider's finish reason (``reason``), the response id and
    the model. ``call``: the streamed call the text is handed to as it comes (None: a whole
    response, whose text is kept in ``texts``). The adapter's :meth:`partial` makes the
    ``ModelResponse`` of them; :meth:`finish` ends the call with it."""

    def __init__(self, call: ModelCall | None = None) -> None:
        self.call = call
        self.texts: list[str] = []
        self.thinking: list[str] = []
        self.calls: list[ToolCall] = []
        self.reason: Any = None
        self.response_id: str | None = None
        self.model: str | None = None

    def said(self, text: str) -> None:
        """Text of the answer: a stream's is handed to its call as it comes, a whole response's kept."""
        if self.call is None:
            self.texts.append(text)
        else:
            self.call.delta(text)

    def chunk(self) -> None:
        """A stream's chunk that said something other than text (its first one dates the output)."""
        if self.call is not None:
            self.call.first_chunk()

    def finish(self, model_call: ModelCall, /) -> None:
        model_call.finish(self.partial())

    def partial(self) -> ModelResponse:
        """What the answer said so far, as the adapter reports it."""
        raise NotImplementedError


class StreamedCalls:
    """Tool calls a stream sends in pieces, by their index (Cohere's ``tool-call-start`` and
    ``-delta`` events, Bedrock's content blocks): :meth:`start` at a call's first event,
    :meth:`more` with each later fragment of its arguments, :meth:`calls` in the end."""

    __slots__ = ("started",)

    def __init__(self) -> None:
        self.started: dict[Any, list[Any]] = {}  # index -> [id, name, argument fragments]

    def start(self, index: Any, call_id: Any, name: Any, arguments: Any = None) -> None:
        self.started[index] = [call_id, name, [arguments or ""]]

    def __contains__(self, index: Any) -> bool:
        return index in self.started

    def more(self, index: Any, arguments: Any) -> None:
        """A fragment of the arguments of the call at ``index`` (one never started: left out)."""
        slot = self.started.get(index)
        if slot is not None:
            slot[2].append(arguments or "")

    def calls(self) -> list[ToolCall]:
        """The calls in their order, their arguments the JSON the model wrote, decoded
        (none: ``{}``); a call without an id has ``""``."""
        return [
            ToolCall(id=str(call_id or ""), name=str(name), arguments=r.arguments("".join(parts)))
            for _, (call_id, name, parts) in sorted(self.started.items(), key=lambda item: item[0] if isinstance(item[0], int) else 0)
        ]


def answer_or_stream(finish: Callable[[Any, ModelCall], None], accumulator: Callable[[ModelCall], Accumulator]) -> StreamFactory:
    """``deliver`` for an SDK method that returns its answer as a pydantic model, or else a
    stream (a generator, an SDK stream): ``finish(answer, call)`` reads the answer, a stream is
    proxied with a new ``accumulator(call)``."""

    def deliver(result: Any, model_call: ModelCall) -> Any:
        if r.is_model(result):
            finish(result, model_call)
            return result
        return proxy_stream(result, model_call, accumulator(model_call))

    return deliver


def proxy_stream(source: Any, model_call: ModelCall, accumulator: Accumulator) -> Any:
    """The proxy for a streamed answer, whatever the SDK streams with: an async iterable (a
    Stainless ``AsyncStream``, an async generator) gets an :class:`AsyncStream`, anything else
    iterable (a Stainless ``Stream``, a generator) a :class:`SyncStream`. The user gets the
    source's chunks and methods as they are; the round ends once either way."""
    if hasattr(type(source), "__aiter__"):
        return AsyncStream(source, model_call, accumulator)
    return SyncStream(source, model_call, accumulator)


def closes_inner_stream(
    attribute: str, *, is_async: bool = False, answered: Callable[[BaseException], Any] | None = None
) -> Callable[..., Any]:
    """A wrapt wrapper for an SDK stream helper's ``close``.

    Helpers such as openai's ``ResponseStream`` read one of our stream proxies (kept in
    ``attribute``) but close the HTTP response directly, so the proxy never hears of it:
    after the helper's ``close`` (or its ``with`` block) the proxy's round ends as well.

    ``answered(exc)``: whether an exception the helper raised (its ``with`` block closes it
    while the exception is in flight) says the answer was complete (openai's chat helper
    raises ``LengthFinishReasonError`` on the chunk with the finish reason ``length``):
    then the round ends with what the stream said (``truncated``), not ``cancelled``.
    """

    def abandon(helper: Any) -> None:
        inner = getattr(helper, attribute, None)
        if isinstance(inner, (SyncStream, AsyncStream)):
            recording = inner._self_recording
            if answered is not None:
                with guard("stream helper close"):
                    raised = sys.exc_info()[1]
                    if raised is not None and answered(raised) is not None:
                        recording.done()  # the chunks read so far are the answer
                        return
            recording.abandon()

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
