"""toolnexus: each ``Client.run`` / ``ask`` / ``stream`` as one turn, through its hooks.

toolnexus runs the whole tool loop itself and offers ``before_llm`` / ``after_llm`` /
``before_tool`` / ``after_tool`` hooks per client, but no global registration. The
adapter adds its own hooks to every client, existing or new, at the one place the
client looks them up (``toolnexus.client._get_hook``): while a run is being recorded,
that lookup returns a hook that calls the application's hook (if any) and ours; outside
a recorded run it returns exactly what it always did. ``run`` and ``stream`` are wrapped
to open and close the turn; ``ask`` and ``Conversation.send`` name the session.

toolnexus talks to models with ``urllib`` (or an in-process ``generate``), not through
the openai / anthropic SDKs. If an SDK call happens under a round anyway (an
``http_transport`` or a ``generate`` that calls the SDK), it fills that round: the turn
is current, so the SDK adapter joins it instead of stitching a second one.
"""

from __future__ import annotations

import asyncio
import inspect
import weakref
from collections.abc import AsyncIterator, Callable, Mapping
from contextvars import ContextVar, Token
from typing import Any

from .._guard import guard, guarded
from ..models import LoopEndReason, ToolCall
from ..recorder.adapter import (
    Entered,
    Round,
    StreamClosed,
    ToolExecution,
    Turn,
    current_session,
    end_round,
    end_tool,
    end_turn,
    enter,
    leave,
    new_id,
    open_round,
    open_turn,
    result_value,
    start_tool,
)
from ._patch import Patch, wrap

FRAMEWORK = "toolnexus"

_HOOKS = ("before_llm", "after_llm", "before_tool", "after_tool")


class _Run:
    """What the adapter keeps about one recorded run while it goes."""

    __slots__ = ("calls", "provider", "round", "round_awaits_finish", "stream", "style", "turn", "usage_seen")

    def __init__(self, turn: Turn, provider: str, style: str, stream: bool) -> None:
        self.turn = turn
        self.provider = provider
        self.style = style  # the wire format of responses: "openai" or "anthropic"
        self.stream = stream
        self.round: Round | None = None
        self.round_awaits_finish = False  # a streamed round: its tool calls come after after_llm
        self.calls: dict[str, ToolExecution] = {}  # call id -> the execution still running
        self.usage_seen = {"prompt_tokens": 0, "completion_tokens": 0}  # streamed usage is cumulative

    # -- context: set only while toolnexus's own code runs ---------------------------------

    def enter(self) -> tuple[Token[_Run | None], Entered | None]:
        return _active.set(self), enter(self.turn)

    @staticmethod
    def exit(tokens: tuple[Token[_Run | None], Entered | None]) -> None:
        leave(tokens[1])
        _active.reset(tokens[0])

    # -- rounds ------------------------------------------------------------------------------

    def open_round(self, model: Any, tools: Any) -> None:
        self.finish_round()  # a streamed round not finished yet
        # a run's hooks run in its own task: the round can be current for the model call
        # (an SDK call under it fills it); a stream's rounds end wherever the next event is
        self.round = open_round(
            self.turn,
            model=model if isinstance(model, str) else None,
            provider=self.provider,
            tools=tools or None,
            stream=self.stream,
            current=not self.stream,
        )

    def finish_round(self, exc: BaseException | None = None) -> None:
        rnd, self.round = self.round, None
        self.round_awaits_finish = False
        if rnd is not None:
            end_round(rnd, exc)

    def close(self, result: Any, exc: BaseException | None) -> None:
        """End what is still open, then the turn (a stream closed early: cancelled)."""
        closed = isinstance(exc, GeneratorExit)
        self.finish_round(StreamClosed("the stream was closed before it ended") if closed else exc)
        calls, self.calls = self.calls, {}
        for execution in calls.values():
            end_tool(
                execution,
                asyncio.CancelledError() if closed else exc,
                outcome="unserved" if exc is None else None,
                error="the run ended before the tool returned (suspended)" if exc is None else None,
                context_gone=True,  # attached in the tool's task, which is gone
            )
        turn = self.turn
        if exc is not None:
            if closed or (_RunCancelled is not None and isinstance(exc, _RunCancelled)):
                turn.end(LoopEndReason.CANCELLED)
        elif getattr(result, "status", None) == "incomplete" and getattr(result, "limit", None) == "maxTurns":
            turn.end(LoopEndReason.MAX_ROUNDS)
        end_turn(turn, None, None if closed else exc)


_active: ContextVar[_Run | None] = ContextVar("loopscope_toolnexus_run", default=None)
_in_tool: ContextVar[str | None] = ContextVar("loopscope_toolnexus_tool", default=None)
_RunCancelled: type[BaseException] | None = None
_conversations: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


# -- reading toolnexus's events ---------------------------------------------------------------


def _text_of(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [text for p in content if isinstance(p, Mapping) and isinstance(text := p.get("text"), str)]
        return "".join(texts) if texts else None
    return None


def _arguments(value: Any) -> Any:
    if isinstance(value, str):
        return result_value(value) if value.strip() else {}
    return value


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _openai_round(data: Mapping[str, Any], rnd: Round) -> None:
    choices = data.get("choices") or [{}]
    choice = choices[0] if isinstance(choices[0], Mapping) else {}
    message = choice.get("message") or {}
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        calls.append(ToolCall(id=str(call.get("id")), name=str(function.get("name")), arguments=_arguments(function.get("arguments"))))
    raw = data.get("usage") or {}
    usage = {
        "input_tokens": _int(raw.get("prompt_tokens")),
        "output_tokens": _int(raw.get("completion_tokens")),
        "cache_read_input_tokens": _int((raw.get("prompt_tokens_details") or {}).get("cached_tokens")),
        "reasoning_tokens": _int((raw.get("completion_tokens_details") or {}).get("reasoning_tokens")),
    }
    content = message.get("content")
    rnd.response(
        _text_of(content) or (message.get("refusal") if isinstance(message.get("refusal"), str) else None),
        calls,
        {k: v for k, v in usage.items() if v is not None},
        choice.get("finish_reason"),
        response_id=data.get("id") if isinstance(data.get("id"), str) else None,
        model=data.get("model") if isinstance(data.get("model"), str) else None,
    )


def _anthropic_round(data: Mapping[str, Any], rnd: Round) -> None:
    texts, thinking, calls = [], [], []
    for block in data.get("content") or []:
        if not isinstance(block, Mapping):
            continue
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            thinking.append(block["thinking"])
        elif kind == "tool_use":
            calls.append(ToolCall(id=str(block.get("id")), name=str(block.get("name")), arguments=block.get("input")))
    raw = data.get("usage") or {}
    given = {
        key: _int(raw.get(key))
        for key in ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    }
    given = {k: v for k, v in given.items() if v is not None}
    usage = dict(given)
    if "input_tokens" in usage:  # Anthropic's leave the cached ones out: recorded, they are in (as OpenAI counts)
        usage["input_tokens"] += usage.get("cache_read_input_tokens", 0) + usage.get("cache_creation_input_tokens", 0)
    stop_reason = data.get("stop_reason")
    rnd.response(
        "".join(texts) or None,
        calls,
        usage,
        stop_reason,
        thinking="\n".join(thinking) or None,
        response_id=data.get("id") if isinstance(data.get("id"), str) else None,
        model=data.get("model") if isinstance(data.get("model"), str) else None,
        provider_usage=given or None,
        refusal=stop_reason == "refusal" or None,
    )


def _streamed_usage(run: _Run, usage: Any) -> dict[str, int]:
    """A stream's usage is the run's running total: the round's share is what it added."""
    if not isinstance(usage, Mapping):
        return {}
    out = {}
    for key, name in (("prompt_tokens", "input_tokens"), ("completion_tokens", "output_tokens")):
        value = _int(usage.get(key))
        if value is not None:
            out[name] = value - run.usage_seen[key]
            run.usage_seen[key] = value
    return out


def _result_of(result: Any) -> tuple[Any, bool]:
    output = getattr(result, "output", result)
    return (result_value(output) if isinstance(output, str) else output), bool(getattr(result, "is_error", False))


# -- our side of each hook --------------------------------------------------------------------


def _before_llm(run: _Run, event: Mapping[str, Any], override: Any) -> None:
    if run.calls:
        _settle(run, event.get("messages"))
    tools, model = event.get("tools"), event.get("model")
    if isinstance(override, Mapping):  # the application's hook changed what is sent
        tools = override.get("tools") if override.get("tools") is not None else tools
        model = override.get("model") or model
    run.open_round(model, list(tools) if isinstance(tools, (list, tuple)) else None)


def _after_llm(run: _Run, event: Mapping[str, Any]) -> None:
    rnd = run.round
    if rnd is None:
        return
    response = event.get("response")
    if not isinstance(response, Mapping):
        run.finish_round()
        return
    if response.get("streamed"):
        # text came as events, tool calls come next: the round ends at the next step
        rnd.response(usage=_streamed_usage(run, response.get("usage")))
        run.round_awaits_finish = True
        return
    if not rnd.eager:  # eager: an SDK adapter under this round reported the response already
        (_anthropic_round if run.style == "anthropic" else _openai_round)(response, rnd)
    run.finish_round()


def _before_tool(run: _Run, event: Mapping[str, Any], override: Any) -> None:
    if run.round_awaits_finish:
        run.finish_round()
    name, call_id, arguments = str(event.get("name") or ""), event.get("id"), event.get("args")
    if isinstance(override, Mapping) and override.get("args") is not None:
        arguments = override["args"]
    execution = start_tool(name, arguments, str(call_id) if call_id is not None else None)
    _in_tool.set(execution.call_id)  # this task runs the tool (see _end_tool)
    if isinstance(override, Mapping) and override.get("result") is not None:
        # the application's hook answered for the tool: that is the call's result
        _end_tool(execution, override["result"])
        return
    if execution.call_id is not None:
        run.calls[execution.call_id] = execution


def _after_tool(run: _Run, event: Mapping[str, Any], override: Any) -> None:
    call_id = event.get("id")
    execution = run.calls.pop(str(call_id), None) if call_id is not None else None
    if execution is None:
        return
    result = override["result"] if isinstance(override, Mapping) and override.get("result") is not None else event.get("result")
    _end_tool(execution, result)


def _end_tool(execution: ToolExecution, result: Any, outcome: str = "failed") -> None:
    # ended elsewhere than in the task that ran the tool (a suspension resolved by the run
    # itself): the span's context stays with that task, which is gone
    context_gone = _in_tool.get() != execution.call_id
    value, is_error = _result_of(result)
    if is_error:
        text = value if isinstance(value, str) else str(value)
        error = text if len(text) <= 500 else text[:500] + "…"
        end_tool(execution, result=value, outcome=outcome, error=error, context_gone=context_gone)
    else:
        end_tool(execution, result=value, context_gone=context_gone)


def _settle(run: _Run, messages: Any) -> None:
    """End the calls still open whose results the next request carries: toolnexus sends a
    suspension the human declined without calling ``after_tool``."""
    for message in messages if isinstance(messages, list) else ():
        if not isinstance(message, Mapping):
            continue
        if message.get("role") == "tool":
            found = [(message.get("tool_call_id"), message.get("content"), True)]
        elif isinstance(message.get("content"), list):
            found = [
                (b.get("tool_use_id"), b.get("content"), bool(b.get("is_error")))
                for b in message["content"] if isinstance(b, Mapping) and b.get("type") == "tool_result"
            ]
        else:
            continue
        for call_id, content, is_error in found:
            execution = run.calls.pop(str(call_id), None)
            if execution is not None:
                _end_tool(execution, _Answered(_text_of(content) or "", is_error), outcome="refused")


class _Answered:
    """A tool result read back from the transcript."""

    def __init__(self, output: str, is_error: bool) -> None:
        self.output, self.is_error = output, is_error


def _observe(run: _Run, event: Any) -> None:
    """A streamed event: text into the open round, tool calls into the round that asked."""
    if not isinstance(event, Mapping):
        return
    kind = event.get("type")
    rnd = run.round
    if kind == "text":
        if rnd is not None and isinstance(event.get("delta"), str):
            rnd.text_delta(event["delta"])
    elif kind == "tool_call":
        if rnd is not None:
            rnd.response(tool_calls=[ToolCall(id=str(event.get("id")), name=str(event.get("name")), arguments=event.get("args"))])
    elif run.round_awaits_finish:
        run.finish_round()


# -- composing the application's hooks with ours ----------------------------------------------


def _compose(name: str, user: Callable[[Any], Any] | None, run: _Run) -> Callable[[Any], Any]:
    async def hook(event: Any) -> Any:
        # before_*: the application's hook first (its changes are what is sent, or run);
        # after_tool: it may replace the result, which is what the model gets
        if name == "after_llm":
            _guarded(_after_llm, run, event)
            return await _call(user, event) if user is not None else None
        override = await _call(user, event) if user is not None else None
        if name == "before_llm":
            _guarded(_before_llm, run, event, override)
        elif name == "before_tool":
            _guarded(_before_tool, run, event, override)
        else:
            _guarded(_after_tool, run, event, override)
        return override

    return hook


async def _call(fn: Callable[[Any], Any], event: Any) -> Any:
    value = fn(event)
    if inspect.isawaitable(value):
        value = await value
    return value


def _guarded(fn: Callable[..., None], run: _Run, event: Any, *rest: Any) -> None:
    with guard(f"toolnexus {fn.__name__.strip('_')}"):
        if isinstance(event, Mapping):
            fn(run, event, *rest)


def _get_hook_wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    hook = wrapped(*args, **kwargs)
    run = _active.get()
    if run is None:
        return hook
    with guard("toolnexus hooks"):
        name = args[1] if len(args) > 1 else kwargs.get("name")
        if name not in _HOOKS:
            return hook
        return _compose(name, hook, run)
    return hook


# -- turns --------------------------------------------------------------------------------------


def _provider(client: Any) -> str:
    if _InProcess is not None and isinstance(getattr(client, "_transport", None), _InProcess):
        return "in_process"
    style = getattr(client, "style", None)
    return style if isinstance(style, str) else "openai"


@guarded("toolnexus run start")
def _begin(client: Any, args: tuple[Any, ...], kwargs: dict[str, Any], stream: bool) -> _Run | None:
    prompt = args[0] if args else kwargs.get("prompt")
    # a stream with an id is a stored conversation, as ask's is (see _ask_wrapper)
    session = str(kwargs["id"]) if stream and kwargs.get("id") else None
    model = getattr(client, "model", None)
    turn = open_turn(
        framework=FRAMEWORK,
        input=_text_of(prompt),
        model=model if isinstance(model, str) else None,
        provider=_provider(client),
        session_id=session,
        streaming=stream,
    )
    style = getattr(client, "style", None)
    return _Run(turn, turn.provider or "openai", style if isinstance(style, str) else "openai", stream)


@guarded("toolnexus run end")
def _close(run: _Run, result: Any, exc: BaseException | None) -> None:
    run.close(result, exc)


@guarded("toolnexus context")
def _enter(run: _Run) -> Any:
    return run.enter()


def _exit(tokens: Any) -> None:
    if tokens is None:
        return
    with guard("toolnexus context"):
        _Run.exit(tokens)


def _run_wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    async def run() -> Any:
        state = _begin(instance, args, kwargs, stream=False)
        if state is None:
            return await wrapped(*args, **kwargs)
        tokens = _enter(state)
        try:
            result = await wrapped(*args, **kwargs)
        except BaseException as exc:
            _guarded_finish_round(state, exc)  # the round is current in this context: end it first
            _exit(tokens)
            _close(state, None, exc)
            raise
        _exit(tokens)
        _close(state, result, None)
        return result

    return run()


@guarded("toolnexus round end")
def _guarded_finish_round(state: _Run, exc: BaseException) -> None:
    state.finish_round(exc)


def _stream_wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return _recorded_stream(wrapped(*args, **kwargs), instance, args, kwargs)


async def _recorded_stream(inner: AsyncIterator[Any], client: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> AsyncIterator[Any]:
    # the turn starts with the first step (a stream never read is no turn), and the run's
    # context is set only while toolnexus's generator runs, so the tokens are always reset
    # in the context that set them, whoever drives the stream
    state = _begin(client, args, kwargs, stream=True)
    if state is None:
        async for event in inner:
            yield event
        return
    result = None
    try:
        while True:
            tokens = _enter(state)
            try:
                event = await inner.__anext__()
            except StopAsyncIteration:
                break
            finally:
                _exit(tokens)
            with guard("toolnexus stream event"):
                _observe(state, event)
                if isinstance(event, Mapping) and event.get("type") == "done":
                    result = event.get("result")
            yield event
    except BaseException as exc:
        _close(state, None, exc)
        aclose = getattr(inner, "aclose", None)
        if isinstance(exc, GeneratorExit) and aclose is not None:
            await aclose()
        raise
    _close(state, result, None)


def _ask_wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    conversation = kwargs.get("id")
    if not conversation:
        return wrapped(*args, **kwargs)
    return _in_session(str(conversation), wrapped(*args, **kwargs))


def _send_wrapper(wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # a Conversation keeps its transcript in memory: its turns share one session
    session: str | None = None
    with guard("toolnexus conversation"):
        found = _conversations.get(instance)
        if found is None:
            found = _conversations[instance] = new_id()
        session = found
    if session is None:  # loopscope could not name it: the call goes on outside a session
        return wrapped(*args, **kwargs)
    return _in_session(session, wrapped(*args, **kwargs))


async def _in_session(session: str, awaitable: Any) -> Any:
    token = current_session.set(session)
    try:
        return await awaitable
    finally:
        current_session.reset(token)


_InProcess: type | None = None


def patch() -> list[Patch]:
    """Add loopscope's hooks to every toolnexus client and wrap its runs."""
    global _RunCancelled, _InProcess
    from toolnexus import client as module

    _RunCancelled = getattr(module, "RunCancelled", None)
    _InProcess = getattr(module, "InProcessTransport", None)
    patches = [
        wrap(module, "_get_hook", _get_hook_wrapper),  # type: ignore[arg-type]
        wrap(module.Client, "run", _run_wrapper),
        wrap(module.Client, "stream", _stream_wrapper),
        wrap(module.Client, "ask", _ask_wrapper),
        wrap(module.Conversation, "send", _send_wrapper),
    ]
    return [p for p in patches if p is not None]


__all__ = ["FRAMEWORK", "patch"]
