"""The wrapper factories adapters use for one model call (and for one tool a library runs).

An adapter supplies two functions: ``describe(instance, args, kwargs)`` reads the request
into a :class:`~loopscope.recorder.adapter.ModelRequest` (or None to leave the call
alone), and ``deliver(result, call)`` reads the response, finishing the
:class:`~loopscope.recorder.adapter.ModelCall` with a ``ModelResponse``, and returns what
the user gets (the same object, or a stream proxy). Both are guarded: if
either fails, the user's call goes on as if loopscope were not there.

An SDK method can raise after the provider answered (openai's ``parse()`` raises
``LengthFinishReasonError`` for a completion cut at the token limit): ``answered(exc)``
gives the response such an exception carries, which is then delivered as any response
would be (its id, model, usage, finish reason), and the exception raised on unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

# Both guarded blocks here run on every recorded call: they keep a plain ``try`` and
# ``internal_error`` rather than ``with guard(...)``, because a try costs nothing until it
# fails while a with block makes two Python method calls every time (about 0.3 us a block
# measured, several per call: a tenth of a hand tool call's cost, see
# benchmarks/bench_tool_call.py).
from .._guard import internal_error
from ..recorder.adapter import (
    ModelCall,
    ModelRequest,
    ToolExecution,
    detach,
    note_request_elsewhere,
    recorded_elsewhere,
    start_model_call,
)

calling: ContextVar[ModelCall | None] = ContextVar("loopscope_sdk_call", default=None)
"""The model call whose SDK method runs in this context right now (from the request until
the method returns): an adapter whose SDK emits spans of its own finds the call it records."""

Describe = Callable[[Any, tuple[Any, ...], dict[str, Any]], "ModelRequest | None"]
Deliver = Callable[[Any, ModelCall], Any]
Answered = Callable[[BaseException], Any]
"""The response an exception carries (the provider answered; the SDK raised on reading
it), or None: the call failed."""


def streamed(describe: Callable[..., ModelRequest | None]) -> Callable[..., ModelRequest | None]:
    """The ``describe`` of a method that streams, of an adapter whose ``describe`` reads both:
    ``describe(instance, args, kwargs, stream=True)`` (more arguments, as a stream helper that
    begins the call itself passes them, are left out)."""

    def describe_stream(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any], *_: Any) -> ModelRequest | None:
        return describe(instance, args, kwargs, stream=True)

    return describe_stream


def _begin(describe: Describe, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[ModelCall | None, object | None]:
    try:
        if recorded_elsewhere():  # a framework's own model-call span records this call,
            request = describe(instance, args, kwargs)
            note_request_elsewhere(request.parameters if request is not None else None)  # with what it sends
            return None, None
        request = describe(instance, args, kwargs)
        if request is None:
            return None, None
        model_call = start_model_call(request)
        if model_call is None:
            return None, None
        return model_call, model_call.attach()
    except Exception:
        internal_error("model call start")
        return None, None


def _raised(model_call: ModelCall, exc: BaseException, deliver: Deliver, answered: Answered | None) -> None:
    """End the call an SDK method raised out of: with the response the exception carries
    (see :data:`Answered`), else as failed."""
    if answered is not None:
        try:
            response = answered(exc)
        except Exception:
            internal_error("model call answer in an exception")
            response = None
        if response is not None:
            _deliver(deliver, response, model_call)
            model_call.fail(exc)  # nothing if the response ended the call, as it should have
            return
    model_call.fail(exc)


def _deliver(deliver: Deliver, result: Any, model_call: ModelCall) -> Any:
    try:
        return deliver(result, model_call)
    except Exception:
        internal_error("model call result")
        model_call.fail(RuntimeError("loopscope could not read this response"))
        return result


def sync_call(
    describe: Describe, deliver: Deliver, *, mark: bool = True, answered: Answered | None = None
) -> Callable[..., Any]:
    """A wrapt wrapper for a synchronous SDK method that makes one model call; ``mark=False``
    for an SDK that emits no spans of its own (nothing reads :data:`calling` then);
    ``answered`` for a method that can raise with the provider's response (see :data:`Answered`)."""

    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        model_call, token = _begin(describe, instance, args, kwargs)
        if model_call is None:
            return wrapped(*args, **kwargs)
        marked = calling.set(model_call) if mark else None
        try:
            result = wrapped(*args, **kwargs)
        except BaseException as exc:
            _raised(model_call, exc, deliver, answered)
            raise
        finally:
            if marked is not None:
                calling.reset(marked)
            if token is not None:
                detach(token)
        return _deliver(deliver, result, model_call)

    return wrapper


def async_call(
    describe: Describe, deliver: Deliver, *, mark: bool = True, answered: Answered | None = None
) -> Callable[..., Any]:
    """A wrapt wrapper for an async SDK method: decided by the class, since some SDK
    methods are not coroutine functions by ``inspect`` but still return awaitables.
    ``mark`` and ``answered`` as for :func:`sync_call`."""

    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        async def run() -> Any:
            model_call, token = _begin(describe, instance, args, kwargs)
            if model_call is None:
                return await wrapped(*args, **kwargs)
            marked = calling.set(model_call) if mark else None
            try:
                result = await wrapped(*args, **kwargs)
            except BaseException as exc:
                _raised(model_call, exc, deliver, answered)
                raise
            finally:
                if marked is not None:
                    calling.reset(marked)
                if token is not None:
                    detach(token)
            return _deliver(deliver, result, model_call)

        return run()

    return wrapper


# -- a tool the library runs: one tool call ------------------------------------------------------------

StartTool = Callable[[tuple[Any, ...], dict[str, Any]], "ToolExecution | None"]
"""``start(args, kwargs)``: the tool call the library's method is about to run (``start_tool``),
or None to leave it alone. Guarded by the adapter (``@guarded``)."""
EndTool = Callable[["ToolExecution", "BaseException | None", Any], None]
"""``end(execution, exc, result)``: the tool call ended with what the method returned, or
with the exception it raised (``end_tool``). Guarded by the adapter."""


def sync_tool(start: StartTool, end: EndTool) -> Callable[..., Any]:
    """A wrapt wrapper for a library's method that runs one tool (google-genai's function
    calling, an MCP client's ``call_tool``): a tool call from its start to what it returned
    or raised, which the user gets unchanged."""

    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        execution = start(args, kwargs)
        if execution is None:
            return wrapped(*args, **kwargs)
        try:
            result = wrapped(*args, **kwargs)
        except BaseException as exc:
            end(execution, exc, None)
            raise
        end(execution, None, result)
        return result

    return wrapper


def async_tool(start: StartTool, end: EndTool) -> Callable[..., Any]:
    """:func:`sync_tool` for a method that returns an awaitable."""

    def wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        async def run() -> Any:
            execution = start(args, kwargs)
            if execution is None:
                return await wrapped(*args, **kwargs)
            try:
                result = await wrapped(*args, **kwargs)
            except BaseException as exc:
                end(execution, exc, None)
                raise
            end(execution, None, result)
            return result

        return run()

    return wrapper
