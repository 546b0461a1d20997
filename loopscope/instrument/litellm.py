"""LiteLLM through its own callback API: one ``CustomLogger`` sees every provider it routes to.

LiteLLM (1.109 on) reaches most providers with its own HTTP code, the openai SDK's
wrapped methods only on a few routes (Azure): its callbacks are the one place every call
passes. Ours is registered in LiteLLM's callback lists (never replacing the user's):

- ``log_pre_api_call`` (in the caller's thread or task, before the HTTP request) starts
  the call, with the provider and model as LiteLLM resolved them; it is an outer call
  (``open_outer_call``): an SDK adapter under it for the same request records nothing.
- ``log_success_event`` / ``async_log_success_event`` end it with LiteLLM's response (a
  stream's assembled one) and LiteLLM's own cost (``response_cost``), kept beside the
  provider's usage figures (``provider_usage``: ``litellm_response_cost``).
- ``log_failure_event`` / ``async_log_failure_event`` end it failed with LiteLLM's exception.

LiteLLM runs success callbacks after it returned the response: on a thread pool (sync) or
its logging worker task (async). A loop's next request may so come before the last
response is recorded, and its tool results would find no call waiting for them. So the
response is also taken where the caller has it: ``completion()`` and ``acompletion()`` are
wrapped to hand the response they return to its call, and a stream's is taken as LiteLLM
assembles it at the stream's end (``CustomStreamWrapper._build_complete_streaming_response``
and its async twin, which LiteLLM runs in the caller's thread or task whatever the
callbacks: no work of ours per chunk, none again). A new request in the same thread (sync:
in ``log_pre_api_call``) or task (async: in ``async_pre_call_deployment_hook``) that goes on
from the previous call of that thread or task (its answer, its tool results) ends that call
first with that response (LiteLLM's cost of it read from the response's ``_hidden_params``,
as LiteLLM's docs show; a stream's first chunk from LiteLLM's stamp of it), and does not
wait; only for a call not streamed made through a reference to ``completion`` taken before
``instrument()``, or a stream of a LiteLLM without that assembly, does it wait, bounded, for
LiteLLM's success callback to end it. One that starts a conversation afresh does neither.
(Reading a stream's chunks ourselves costs some microseconds a chunk; assembling it again
with ``stream_chunk_builder`` and ``completion_cost``, 1.8 ms and 0.35 ms of CPU for 7 chunks.)
LiteLLM tells no callback of a stream closed early: the call ends as abandoned when
LiteLLM's logging object for it is collected (with its assembled response, if it was read
to its end and no callback came). Per-chunk stream events come unordered on a thread pool
and are not read: the success event, or the assembled response, carries the whole stream,
its first chunk's time included.
"""

from __future__ import annotations

import asyncio
import datetime
import math
import sys
import threading
import time
import weakref
from contextvars import ContextVar, Token
from types import FrameType
from typing import Any

from .._guard import internal_error, warn_once
from ..recorder.adapter import (
    ModelCall,
    ModelRequest,
    ModelResponse,
    close_outer_call,
    open_outer_call,
    server_of,
    start_model_call,
)
from . import _read as r
from ._openai_compat import chat_request, completion_response
from ._patch import Patch, Registration, wrap

WAIT_S = 5.0
"""How long a request waits for the previous call of its thread or task to be recorded
(LiteLLM's success callbacks run after it returned): milliseconds, unless its thread pool
is starved; past it the request goes on and is recorded as LiteLLM's callbacks allow."""

_CHAT_CALLS = frozenset({"completion", "acompletion"})
_LISTS = ("input_callback", "success_callback", "failure_callback", "_async_success_callback", "_async_failure_callback")


class _Call:
    """One LiteLLM call being recorded."""

    __slots__ = ("__weakref__", "answer", "call_id", "done", "first", "model", "model_call", "owner", "stream", "token")

    def __init__(
        self, call_id: str, model_call: ModelCall, request: ModelRequest, owner: object, token: Token[Any] | None
    ) -> None:
        self.call_id = call_id
        self.model_call: ModelCall | None = model_call
        self.stream = request.stream
        self.model = request.model
        self.owner: object = owner  # the thread (sync) or task (async) that made it
        self.token: Token[Any] | None = token
        # LiteLLM's response: as completion() returned it, or as LiteLLM assembled a stream at its end
        self.answer: Any = None
        self.first: Any = None  # a stream's: LiteLLM's wall-clock time of its first chunk
        self.done = threading.Event()

    def ended(self) -> None:
        """Recorded: a request waiting for it goes on. What it holds is let go (it may stay
        its context's previous call for long)."""
        self.done.set()
        self.owner = self.token = self.model_call = self.answer = self.first = None


_open: dict[str, _Call] = {}  # litellm_call_id -> the call, until it ends
_lock = threading.Lock()
_previous: ContextVar[_Call | None] = ContextVar("loopscope_litellm_previous", default=None)


def _owner() -> object:
    try:
        task = asyncio.current_task()
    except RuntimeError:  # no running loop in this thread
        task = None
    return task if task is not None else threading.get_ident()


def _must_wait(previous: _Call | None, messages: Any) -> bool:
    """Whether a new request of this thread or task waits for ``previous`` to be recorded:
    a call it made that has not ended, and the request goes on from it. Only then does the
    order matter: tool results end the calls that asked for them, and a conversation's next
    request is found by the turn that ended (``find_conversations``). A request that starts
    a conversation afresh (no assistant message, no tool result) goes on at once: the wait
    would add LiteLLM's whole success handling to its latency. A stream may still be read
    while a new call is made, so one is waited for only when the request sends tool results."""
    if previous is None or previous.done.is_set() or previous.owner != _owner():
        return False
    wanted = ("tool",) if previous.stream else ("tool", "assistant")
    try:
        for message in reversed(messages or ()):  # what goes on from a call is at the end
            if (message.get("role") if type(message) is dict else r.get(message, "role")) in wanted:
                return True
    except TypeError:  # not a sequence: nothing to go on from
        return False
    return False


# -- the request ------------------------------------------------------------------------------

def _request(model: Any, messages: Any, kwargs: dict[str, Any]) -> ModelRequest:
    """LiteLLM's request in OpenAI's format (its messages and parameters whatever the provider),
    read by the kit's reader of that format; the provider and model as LiteLLM resolved them."""
    params = kwargs.get("litellm_params") or {}
    optional = kwargs.get("optional_params") or {}
    # a parameter the call passed, else the one LiteLLM mapped for the provider
    merged = {k: v for k, v in optional.items() if v is not None}
    merged.update((k, v) for k, v in kwargs.items() if v is not None)
    merged["messages"] = list(messages or ())
    merged["model"] = kwargs.get("model") or model
    provider = kwargs.get("custom_llm_provider") or params.get("custom_llm_provider") or "litellm"
    return chat_request(merged, provider=str(provider), server=server_of(params.get("api_base") or kwargs.get("api_base")))


# -- the response ------------------------------------------------------------------------------

def _response(response: Any, kwargs: dict[str, Any]) -> ModelResponse:
    """LiteLLM's response (OpenAI's format, whatever the provider: its usage too) read by the
    kit's reader of that format, with what is LiteLLM's own set on it: its cost of the call,
    a second figure beside ours in ``provider_usage``; the cache writes it keeps only as a
    top-level ``cache_creation_input_tokens`` (its Anthropic mapping, when the usage has no
    ``prompt_tokens_details`` to hold them); the model it was asked for when the provider
    named none."""
    record = completion_response(response)
    usage = record.usage
    if usage is not None and "cache_creation_input_tokens" not in usage:
        written = r.number(r.get(r.get(response, "usage"), "cache_creation_input_tokens"))
        if written is not None:
            record.usage = {**usage, "cache_creation_input_tokens": written}
    cost = kwargs.get("response_cost")
    if isinstance(cost, (int, float)) and not isinstance(cost, bool) and math.isfinite(cost):
        record.provider_usage = _with_cost(record.provider_usage, float(cost))
    if not record.model:
        record.model = kwargs.get("model")
    return record


def _with_cost(figures: Any, cost: float) -> Any:
    """The provider's figures (the reader's JSON text of its usage object, or None) with
    LiteLLM's cost added as ``litellm_response_cost``: spliced into the object's text, not
    decoded and encoded again (every call passes here)."""
    figure = '"litellm_response_cost":' + repr(cost)
    if figures is None:
        return "{" + figure + "}"
    if type(figures) is str and figures.startswith("{") and figures.endswith("}"):
        return "{" + figure + "}" if figures.strip() == "{}" else figures[:-1] + "," + figure + "}"
    return figures  # not an object's text: kept as the provider reported it


def _first_chunk(model_call: ModelCall, kwargs: dict[str, Any]) -> None:
    """A stream's time to first chunk, from LiteLLM's wall-clock stamp of it."""
    first = kwargs.get("completion_start_time")
    if isinstance(first, datetime.datetime):
        now = datetime.datetime.now(first.tzinfo)
        model_call.date_first_chunk(time.monotonic_ns() - int((now - first).total_seconds() * 1e9))


# -- the callbacks -----------------------------------------------------------------------------


def _pre(model: Any, messages: Any, kwargs: dict[str, Any], caller: FrameType) -> None:
    """``caller``: LiteLLM's frame that ran the callback, whose ``self`` is its logging
    object of the call (read for a stream only)."""
    if kwargs.get("call_type") not in _CHAT_CALLS:
        return
    call_id = kwargs.get("litellm_call_id")
    if not isinstance(call_id, str) or call_id in _open:  # a retry of a call already open
        return
    previous = _previous.get()
    owner = _owner()
    sync = owner == threading.get_ident()  # a sync caller waits: LiteLLM's thread pool ends the call
    waits = sync and _must_wait(previous, messages) and previous is not None and not _end_answered(previous)
    if waits and previous is not None and not previous.done.wait(WAIT_S):
        _late()
    request = _request(model, messages, kwargs)
    model_call = start_model_call(request)
    if model_call is None:
        return
    call = _Call(call_id, model_call, request, owner, open_outer_call(model_call, request))
    with _lock:
        _open[call_id] = call
    _previous.set(call)
    if request.stream:  # a stream may be let go unread: no event ends it, its logging object's end does
        logging_obj = caller.f_locals.get("self")
        if type(logging_obj).__name__ == "Logging":
            try:
                weakref.finalize(logging_obj, _collected, call_id)
            except TypeError:  # not weak-referenceable: a stream closed early ends at the idle reaper
                pass


def _collected(call_id: str) -> None:
    """LiteLLM's logging object of a call is gone and no event ended the call: a stream let go
    early (or, with the response LiteLLM assembled, one read to its end whose report never came)."""
    try:
        call = _open.get(call_id)
        if call is not None and call.answer is not None and _end_answered(call):
            return  # read to its end, and no callback came: ended with what LiteLLM assembled
        with _lock:
            call = _open.pop(call_id, None)
        if call is not None and call.model_call is not None:
            call.model_call.abandon()
            call.ended()
    except Exception:
        internal_error("litellm stream collected")


def _take(kwargs: dict[str, Any]) -> _Call | None:
    call_id = kwargs.get("litellm_call_id")
    with _lock:
        return _open.pop(call_id, None) if isinstance(call_id, str) else None


def _success(kwargs: dict[str, Any], response: Any) -> None:
    call = _take(kwargs)
    if call is not None:
        _end(call, response, kwargs)


def _end(call: _Call, response: Any, kwargs: dict[str, Any]) -> None:
    """End ``call`` (taken out of ``_open``) with LiteLLM's ``response``; ``kwargs``: its
    success callback's (LiteLLM's cost of the call, its model)."""
    try:
        model_call = call.model_call
        if model_call is None:  # ended already (never: a call leaves _open once)
            return
        response_record = _response(response, kwargs)
        if call.stream:
            _first_chunk(model_call, kwargs)
            if response_record.text:
                model_call.delta(response_record.text)  # the whole streamed text, as one piece
                response_record.text = None
        model_call.finish(response_record)
    finally:
        call.ended()


def _answered(response: Any) -> None:
    """``completion()`` / ``acompletion()`` returned ``response`` (in the caller's thread or
    task): kept on its call, which the caller's next request that goes on from it ends
    with it (:func:`_end_answered`) rather than wait for LiteLLM's success callback. A stream
    is kept by :func:`_stream_answered`, at its end."""
    hidden = getattr(response, "_hidden_params", None)  # LiteLLM's documented per-response figures
    call_id = hidden.get("litellm_call_id") if type(hidden) is dict else None
    call = _open.get(call_id) if isinstance(call_id, str) else None
    if call is not None and not call.stream:
        call.answer = response


def _stream_answered(stream: Any, response: Any) -> None:
    """LiteLLM assembled the response of ``stream`` (its ``CustomStreamWrapper``) at its end,
    in the caller's thread or task, as it does whatever the callbacks: kept on its call, as
    :func:`_answered` keeps a whole response (a failed assembly, a bare usage chunk, is not)."""
    logging_obj = getattr(stream, "logging_obj", None)
    call_id = getattr(logging_obj, "litellm_call_id", None)
    call = _open.get(call_id) if isinstance(call_id, str) else None
    if call is None or not call.stream:
        return
    choices = getattr(response, "choices", None)
    if choices and getattr(choices[0], "message", None) is not None:
        call.first = getattr(logging_obj, "completion_start_time", None)
        call.answer = response


def _end_answered(call: _Call) -> bool:
    """End ``call`` here with the response its ``completion()`` returned (a stream's: as
    LiteLLM assembled it), if it has one and LiteLLM's success callback has not taken it:
    the next request goes on at once (it waited for LiteLLM's whole success handling, on
    its thread pool, before). True when ended here or already."""
    if call.answer is None:
        return call.done.is_set()
    with _lock:
        mine = _open.get(call.call_id) is call and _open.pop(call.call_id) is call
    if not mine:  # the success callback has it: it ends it
        return call.done.is_set()
    response = call.answer
    hidden = getattr(response, "_hidden_params", None)
    _end(call, response, {"response_cost": hidden.get("response_cost") if type(hidden) is dict else None,
                          "model": call.model, "completion_start_time": call.first})
    return True


def _failure(kwargs: dict[str, Any]) -> None:
    call = _take(kwargs)
    if call is None:
        return
    try:
        exc = kwargs.get("exception")
        if call.model_call is not None:
            call.model_call.fail(exc if isinstance(exc, BaseException) else RuntimeError(str(exc or "LiteLLM call failed")))
    finally:
        call.ended()


def _post(kwargs: dict[str, Any]) -> None:
    """The HTTP response came (in the caller's context): SDK calls after it are not this call's."""
    call_id = kwargs.get("litellm_call_id")
    call = _open.get(call_id) if isinstance(call_id, str) else None
    if call is not None and call.token is not None and close_outer_call(call.token):
        call.token = None


async def _wait_previous(kwargs: dict[str, Any]) -> None:
    """An async caller's new request waits (yielding to LiteLLM's logging worker) for its task's previous call."""
    previous = _previous.get()
    if not _must_wait(previous, kwargs.get("messages")) or previous is None or _end_answered(previous):
        return
    deadline = time.monotonic() + WAIT_S
    spins = 0
    while not previous.done.is_set():
        if time.monotonic() >= deadline:
            _late()
            return
        await asyncio.sleep(0 if spins < 50 else 0.001)
        spins += 1


def _late() -> None:
    warn_once(
        "litellm late",
        "loopscope: LiteLLM had not reported a call %.0f s after it returned (its success callbacks are held up, "
        "or loopscope's logger was taken out of litellm.success_callback): the next call was recorded without waiting",
        WAIT_S,
    )


def _logger_class() -> type:
    from litellm.integrations.custom_logger import CustomLogger

    class LoopscopeLogger(CustomLogger):
        """loopscope's recording of LiteLLM's calls (``loopscope.instrument()``)."""

        def log_pre_api_call(self, model: Any, messages: Any, kwargs: Any) -> None:
            try:
                _keep_in_callbacks(self)
                _pre(model, messages, kwargs, sys._getframe(1))
            except Exception:
                internal_error("litellm pre-call")

        def log_post_api_call(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
            try:
                _post(kwargs)
            except Exception:
                internal_error("litellm post-call")

        def log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
            try:
                _success(kwargs, response_obj)
            except Exception:
                internal_error("litellm success")

        async def async_log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
            try:
                _success(kwargs, response_obj)
            except Exception:
                internal_error("litellm success")

        def log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
            try:
                _failure(kwargs)
            except Exception:
                internal_error("litellm failure")

        async def async_log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
            try:
                _failure(kwargs)
            except Exception:
                internal_error("litellm failure")

        async def async_pre_call_deployment_hook(self, kwargs: dict[str, Any], call_type: Any) -> dict[str, Any] | None:
            try:
                await _wait_previous(kwargs)
            except Exception:
                internal_error("litellm wait")
            return None

    return LoopscopeLogger


def _keep_in_callbacks(logger: Any) -> None:
    """Ours stays in ``litellm.callbacks`` (its async hooks read only that list) and in the
    lists LiteLLM dispatches from when the application set lists of its own after
    ``instrument()``: appended, nothing else touched."""
    import litellm

    for name in ("callbacks", *_LISTS):
        found = getattr(litellm, name, None)
        if isinstance(found, list) and not any(c is logger for c in found):
            found.append(logger)


# -- patching ------------------------------------------------------------------------------------


def patch() -> list[Patch | Registration]:
    import litellm

    logger = _logger_class()()
    # ours in each list LiteLLM dispatches from (so a ``litellm.callbacks`` the application
    # sets later cannot drop it), and in ``litellm.callbacks``: appended, the lists' other
    # entries left as they are
    _keep_in_callbacks(logger)
    # completion() and acompletion() only hand their response over (_answered): what the
    # caller's next request needs before it goes on. Calls not streamed made through
    # references taken before instrument() (``from litellm import completion``) are ended by
    # the callbacks alone, the next request waiting for them as before.
    wrapped = [wrap(litellm, "completion", _returned), wrap(litellm, "acompletion", _returned_async)]  # type: ignore[arg-type]
    # a stream's response as LiteLLM assembles it at the stream's end, in the caller's thread
    # or task, before it hands it to its callbacks: kept too (_stream_answered). Absent (another
    # LiteLLM), a stream's next request waits for the callback, as a reference taken early does.
    streams = _stream_class()
    if streams is not None:
        wrapped += [wrap(streams, "_build_complete_streaming_response", _assembled),
                    wrap(streams, "_async_build_complete_streaming_response", _assembled_async)]

    def undo() -> None:
        for name in ("callbacks", *_LISTS):
            found = getattr(litellm, name, None)
            if isinstance(found, list):
                found[:] = [c for c in found if c is not logger]
        with _lock:
            pending = list(_open.values())
            _open.clear()
        for call in pending:  # what was open when recording stopped ends now, once
            if call.model_call is not None:
                call.model_call.abandon()
            call.ended()

    return [*(p for p in wrapped if p is not None), Registration(undo)]


def _returned(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    response = wrapped(*args, **kwargs)
    try:
        _answered(response)
    except Exception:
        internal_error("litellm answered")
    return response


def _returned_async(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    async def run() -> Any:
        response = await wrapped(*args, **kwargs)
        try:
            _answered(response)
        except Exception:
            internal_error("litellm answered")
        return response

    return run()


def _stream_class() -> type | None:
    """LiteLLM's ``CustomStreamWrapper``, every stream it returns (None where it is not found)."""
    try:
        from litellm.litellm_core_utils.streaming_handler import CustomStreamWrapper
    except ImportError:
        return None
    return CustomStreamWrapper if isinstance(CustomStreamWrapper, type) else None


def _assembled(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    response = wrapped(*args, **kwargs)
    try:
        _stream_answered(instance, response)
    except Exception:
        internal_error("litellm stream answered")
    return response


def _assembled_async(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    async def run() -> Any:
        response = await wrapped(*args, **kwargs)
        try:
            _stream_answered(instance, response)
        except Exception:
            internal_error("litellm stream answered")
        return response

    return run()
