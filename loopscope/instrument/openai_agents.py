"""The OpenAI Agents SDK: agent runs as turns, model calls as rounds, function tools as tool calls.

The SDK traces itself: every run is a trace of spans (agent, response or generation,
function, handoff, ...) handed to the registered ``TracingProcessor`` objects. loopscope
adds one processor (``agents.add_trace_processor``) that turns those spans into the
recorder's calls while they happen:

- an ``agent`` span is a turn (``invoke_agent``), the current turn of the context it runs
  in, so anything recorded inside it (the openai adapter's model calls, a decorated tool, a
  nested agent run) joins it or nests under it;
- a ``response`` / ``generation`` span is a round (``chat``), the current round while the
  SDK calls the model. With the openai adapter on, the SDK's ``responses.create`` /
  ``chat.completions.create`` call fills that very round (request parameters, usage,
  finish reason, text, tool calls), so each model call is one ``chat`` span; with it off,
  the round is filled from the span's data when the span ends;
- a ``function`` span is the execution of the call the model asked for (``execute_tool``):
  it starts when the SDK runs the tool and ends with its output, or failed with the
  error the SDK put on the span (a tool that raises is reported to the model as an error
  message by default; the span carries it);
- a ``handoff`` span serves the handoff call of the agent that hands off; that agent's
  turn ends ``completed`` and the next agent's turn follows in the same session.

Small wraps give what the spans do not carry: ``AgentRunner.run`` /
``run_streamed`` (the user's input and the SDK session, read when the first agent span
starts), ``AgentBase.get_all_tools`` (the tools offered to the agent, with their
schemas) and ``OpenAIResponsesModel.get_response`` / ``stream_response`` (the model a
Responses call asks for: its ``response`` span names none, and an agent that names no
model gets the provider's default, which nothing else tells). The loop end reason comes from how the agent span ends: the exception in
flight (``MaxTurnsExceeded`` is ``max_rounds``, a cancellation ``cancelled``, any other
``error``), or the span's ``Max turns exceeded`` error when a streamed run stops there.

Nothing is removed from the SDK's tracing: its default processor still exports to
OpenAI's tracing backend unless the application turns that off (see docs/frameworks/openai-agents.md).
"""

from __future__ import annotations

import asyncio
import sys
import weakref
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from agents.tracing import TracingProcessor

from .._guard import guard, guarded
from ..models import LoopEndReason, ToolCall
from ..recorder.adapter import (
    Entered,
    Round,
    ToolExecution,
    Turn,
    current_session,
    current_turn,
    end_round,
    end_tool,
    end_turn,
    enter,
    leave,
    open_round,
    open_turn,
    serve_call,
    start_tool,
)
from . import _read as r
from ._openai_responses import read_input, read_output, response_finish_reason, response_usage
from ._patch import Patch, Registration, wrap

FRAMEWORK = "openai_agents"
PROVIDER = "openai"
FAKE_RESPONSES_ID = "__fake_id__"
"""The id the SDK gives a response it assembles itself (``agents.models.fake_id``)."""
MAX_TURNS_MESSAGE = "Max turns exceeded"
"""The error the SDK puts on the agent span when a run reaches ``max_turns``."""


# -- what the Runner was called with --------------------------------------------------


@dataclass
class _RunStart:
    """One ``Runner`` call, until its first agent span has taken the input."""

    input: str | None
    agent_name: str | None
    model: str | None
    session: str | None
    streaming: bool
    used: bool = False


_run_start: ContextVar[_RunStart | None] = ContextVar("loopscope_agents_run", default=None)


def _model_name(model: Any) -> str | None:
    """A model as a name: the string itself, or the name a ``Model`` object holds."""
    if isinstance(model, str):
        return model or None
    name = getattr(model, "model", None)
    return name if isinstance(name, str) and name else None


def _input_text(value: Any) -> str | None:
    """The user's text of a run's input: a string, or the last user message of an item list."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return read_input(list(value))[0]
    return None  # a RunState: a resumed run, no new input


@guarded("agents run start")
def _describe_run(args: tuple[Any, ...], kwargs: dict[str, Any], streaming: bool) -> _RunStart | None:
    agent = args[0] if args else kwargs.get("starting_agent")
    value = args[1] if len(args) > 1 else kwargs.get("input")
    config = kwargs.get("run_config")
    model = _model_name(r.get(config, "model")) or _model_name(getattr(agent, "model", None))
    session = getattr(kwargs.get("session"), "session_id", None)
    session = session if isinstance(session, str) else None
    return _RunStart(_input_text(value), getattr(agent, "name", None), model, session, streaming)


Wrapped = Callable[..., Any]


def _run_wrapper(wrapped: Wrapped, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    start = _describe_run(args, kwargs, False)

    async def run() -> Any:
        token = _run_start.set(start)  # inside the coroutine: the context of the task that awaits it
        try:
            return await wrapped(*args, **kwargs)
        finally:
            _run_start.reset(token)

    return run()


def _run_streamed_wrapper(wrapped: Wrapped, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # the SDK starts the run loop as a task here: the task's context is a copy of this one
    token = _run_start.set(_describe_run(args, kwargs, True))
    try:
        return wrapped(*args, **kwargs)
    finally:
        _run_start.reset(token)


# -- the model a Responses call asks for ------------------------------------------------


_asked_model: ContextVar[str | None] = ContextVar("loopscope_agents_model", default=None)
"""The model of the ``OpenAIResponsesModel`` call about to start its ``response`` span,
taken (and cleared) by that span's round. A ``generation`` span names its model itself."""


@guarded("agents model asked")
def _note_asked_model(model: Any) -> None:
    # set in the caller's context, which the call (a coroutine, or an async generator
    # iterated there) starts its span in: nothing to reset, the span's round clears it
    _asked_model.set(_model_name(getattr(model, "model", None)))


def _responses_call_wrapper(wrapped: Wrapped, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    _note_asked_model(instance)
    return wrapped(*args, **kwargs)


# -- the tools an agent is offered ----------------------------------------------------


_handoff_tools: weakref.WeakKeyDictionary[Turn, set[str]] = weakref.WeakKeyDictionary()
"""The names of the handoff tools each turn's agent was offered."""


def _tool_spec(tool: Any) -> Any:
    """A tool as the recorder declares it: a function tool with its schema, others by name."""
    schema = getattr(tool, "params_json_schema", None)
    name = getattr(tool, "name", None)
    if not isinstance(name, str) or not name:
        return None
    if isinstance(schema, Mapping):
        description = getattr(tool, "description", None) or None
        return {"type": "function", "name": name, "description": description, "parameters": dict(schema)}
    return name


def _handoff_specs(agent: Any) -> list[dict[str, Any]]:
    """The handoffs an agent may make, as the function tools the model is offered for them."""
    from agents.handoffs import Handoff

    specs = []
    for item in getattr(agent, "handoffs", None) or ():
        if isinstance(item, Handoff):
            specs.append({"type": "function", "name": item.tool_name, "description": item.tool_description or None,
                          "parameters": dict(item.input_json_schema or {})})
        elif getattr(item, "name", None):
            specs.append({"type": "function", "name": Handoff.default_tool_name(item),
                          "description": Handoff.default_tool_description(item) or None})
    return specs


@guarded("agents tools")
def _declare(agent: Any, tools: Any) -> None:
    turn = current_turn.get()
    if turn is None or turn.framework != FRAMEWORK or turn.ended or turn.agent != getattr(agent, "name", None):
        return
    specs = [spec for spec in (_tool_spec(t) for t in tools or ()) if spec is not None]
    handoffs = _handoff_specs(agent)
    if handoffs:
        _handoff_tools.setdefault(turn, set()).update(h["name"] for h in handoffs)
    if specs or handoffs:
        turn.declare_tools(specs + handoffs, origin="always")
    if not turn.model:
        turn.model = _model_name(getattr(agent, "model", None))


def _all_tools_wrapper(wrapped: Wrapped, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    async def run() -> Any:
        tools = await wrapped(*args, **kwargs)
        _declare(instance, tools)
        return tools

    return run()


# -- the tracing processor -------------------------------------------------------------


class _Open:
    """An SDK span that is running, and what loopscope opened for it."""

    __slots__ = ("agent", "ambient", "handed_off", "last_round", "record", "tokens")

    def __init__(self, agent: _Open | None, record: Turn | Round | ToolExecution | None = None,
                 tokens: Entered | None = None, ambient: BaseException | None = None) -> None:
        self.agent = agent if agent is not None else self  # the entry of the agent span it runs under
        self.record = record
        self.tokens = tokens  # what the span set in its context
        self.ambient = ambient  # the exception already in flight when it started
        self.last_round: Round | None = None  # agent spans: the turn's latest round
        self.handed_off = False

    @property
    def turn(self) -> Turn:
        return self.agent.record  # type: ignore[return-value]


def _in_flight(ambient: BaseException | None) -> BaseException | None:
    """The exception propagating through the SDK code that ends a span now, if it is a new one.

    The SDK ends its spans in ``finally`` blocks, so an exception that stops the run is
    the one being handled there; one that was already in flight when the span started
    (a run inside an ``except`` block) is not the run's.
    """
    exc = sys.exc_info()[1]
    return None if exc is None or exc is ambient else exc


class AgentSpanError(Exception):
    """An error the SDK put on a span, with no exception reaching loopscope."""


def _span_error_text(error: Any) -> str:
    message = r.get(error, "message") or "error"
    detail = r.get(r.get(error, "data"), "error")
    return f"{message}: {detail}" if detail else str(message)


class LoopscopeProcessor(TracingProcessor):
    """The ``TracingProcessor`` that records the SDK's spans as loopscope turns, rounds and tool calls."""

    def __init__(self) -> None:
        self.active = True
        self._open: dict[str, _Open] = {}
        self._groups: dict[str, str | None] = {}  # trace id -> group id

    # -- traces ------------------------------------------------------------------------

    def on_trace_start(self, trace: Any) -> None:
        if self.active:
            self._groups[str(trace.trace_id)] = getattr(trace, "group_id", None)

    def on_trace_end(self, trace: Any) -> None:
        self._groups.pop(str(trace.trace_id), None)

    # -- spans -------------------------------------------------------------------------

    def on_span_start(self, span: Any) -> None:
        if not self.active:
            return
        with guard("agents span start"):
            kind = span.span_data.type
            owner = self._open.get(span.parent_id) if span.parent_id else None
            if kind == "agent":
                self._open[span.span_id] = self._start_turn(span, owner)
            elif owner is None or owner.turn.ended:
                return  # a span outside the agent runs recorded here
            elif kind in ("response", "generation"):
                self._open[span.span_id] = self._start_round(span, owner)
            elif kind == "function":
                self._open[span.span_id] = self._start_tool(span, owner)
            else:  # task, turn, handoff, guardrail, custom...: their children still find their turn
                self._open[span.span_id] = _Open(owner.agent)

    def on_span_end(self, span: Any) -> None:
        entry = self._open.pop(span.span_id, None)
        if entry is None:
            return
        with guard("agents span end"):
            kind = span.span_data.type
            if kind == "agent":
                self._end_turn(span, entry)
            elif kind in ("response", "generation"):
                self._end_round(span, entry)
            elif kind == "function":
                self._end_tool(span, entry)
            elif kind == "handoff":
                self._end_handoff(span, entry)

    def shutdown(self, timeout: float | None = None) -> None:
        """Nothing to let go of: loopscope's own pipeline flushes at its shutdown."""

    def force_flush(self) -> None:
        """The rows are written by loopscope's pipeline, flushed with ``loopscope.flush()``."""

    # -- agent spans: turns ------------------------------------------------------------

    def _start_turn(self, span: Any, owner: _Open | None) -> _Open:
        data = span.span_data
        start = _run_start.get()
        text = model = None
        streaming = False
        if start is not None:
            streaming = start.streaming
            if not start.used:  # the run's first agent answers the input; a handoff's target continues
                start.used = True
                text = start.input
                model = start.model if start.agent_name == data.name else None
        parent = current_turn.get() or (owner.turn if owner is not None else None)
        session = (
            current_session.get()
            or (parent.session_id if parent is not None else None)
            or self._groups.get(str(span.trace_id))
            or (start.session if start is not None else None)
            or str(span.trace_id)
        )
        turn = open_turn(
            framework=FRAMEWORK,
            agent=data.name or None,
            input=text,
            model=model,
            session_id=session,
            streaming=streaming,
            parent=parent,
        )
        entry = _Open(None, turn, None, sys.exc_info()[1])
        # the current turn of the context the agent runs in: model calls, tools and nested runs join it
        entry.tokens = enter(turn)
        return entry

    def _end_turn(self, span: Any, entry: _Open) -> None:
        from agents.exceptions import MaxTurnsExceeded

        turn = entry.turn
        exc = _in_flight(entry.ambient)
        leave(entry.tokens)  # False: it ended in another context (a generator closed elsewhere)
        if isinstance(exc, MaxTurnsExceeded) or (exc is None and r.get(span.error, "message") == MAX_TURNS_MESSAGE):
            turn.end(LoopEndReason.MAX_ROUNDS)
        elif exc is None and entry.handed_off:
            turn.end(LoopEndReason.COMPLETED)  # its part is done: the next agent answers
        end_turn(turn, None, exc)

    # -- response / generation spans: rounds -------------------------------------------

    def _start_round(self, span: Any, owner: _Open) -> _Open:
        data = span.span_data
        turn = owner.turn
        if data.type == "generation":
            model = getattr(data, "model", None)
        else:
            model = _asked_model.get()
            _asked_model.set(None)  # the next response span's call says its own
        config = getattr(data, "model_config", None) or {}
        # Responses and the SDK's Chat Completions model talk to OpenAI's API; LiteLLM and
        # any-llm name their implementation (and any-llm its provider) in the model config
        provider = r.get(config, "provider") if r.get(config, "model_impl") else PROVIDER
        rnd = open_round(turn, model=model if isinstance(model, str) else None, provider=provider, stream=turn.streaming)
        owner.agent.last_round = rnd
        # the current round while the SDK calls the model: the openai adapter fills it
        return _Open(owner.agent, rnd, enter(rnd), sys.exc_info()[1])

    def _end_round(self, span: Any, entry: _Open) -> None:
        rnd = entry.record
        assert isinstance(rnd, Round)
        exc = _in_flight(entry.ambient)
        leave(entry.tokens)
        if not rnd.eager:  # no model call adapter reported this call: read the span's data
            _fill_round(rnd, span.span_data)
        rnd.eager = False  # the SDK runs the tools itself: each call starts when its function span does
        if exc is None and span.error:
            exc = AgentSpanError(_span_error_text(span.error))
        end_round(rnd, exc)

    # -- function spans: tool calls ----------------------------------------------------

    def _start_tool(self, span: Any, owner: _Open) -> _Open:
        # serve the call of this agent's turn, whatever the context holds
        execution = start_tool(str(span.span_data.name), turn=owner.turn)
        return _Open(owner.agent, execution, None, sys.exc_info()[1])

    def _end_tool(self, span: Any, entry: _Open) -> None:
        execution = entry.record
        assert isinstance(execution, ToolExecution)
        exc = _in_flight(entry.ambient)
        output = span.span_data.output
        if output is not None:
            execution.set_result(output)
        if span.error:
            execution.fail(_span_error_text(span.error))
            if not isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt)):
                exc = None  # the span's error says what failed (the exception is the SDK's wrapper of it)
        end_tool(execution, exc)

    # -- handoff spans -----------------------------------------------------------------

    def _end_handoff(self, span: Any, entry: _Open) -> None:
        """Serve the handoff call of the agent's last round, with what the SDK sends back."""
        agent = entry.agent
        turn = agent.turn
        agent.handed_off = True
        rnd = agent.last_round
        names = _handoff_tools.get(turn, set())
        target = getattr(span.span_data, "to_agent", None)
        for call in rnd.tool_calls if rnd is not None else ():
            if call.name in names and turn.has_call(call.id):
                serve_call(turn, call.id, {"assistant": target})
                return


# -- a round from the span's data (no model call adapter saw the call) -----------------


def _fill_round(rnd: Round, data: Any) -> None:
    usage = _span_usage(getattr(data, "usage", None))
    if data.type == "response":
        response = getattr(data, "response", None)
        if response is None:
            rnd.response(usage=usage)
            return
        text, calls, thinking, refusal = read_output(r.get(response, "output"))
        rnd.response(text, calls, usage or response_usage(r.get(response, "usage")), response_finish_reason(response, calls),
                     thinking=thinking, response_id=r.get(response, "id"), model=r.get(response, "model"), refusal=refusal)
        return
    text, calls, finish, response_id, model = _read_generation(getattr(data, "output", None))
    rnd.response(text, calls, usage, finish, response_id=response_id, model=model)


def _span_usage(usage: Any) -> dict[str, int]:
    """The SDK's usage dict (the same for every model span) in the recorder's keys."""
    if not isinstance(usage, Mapping):
        return {}
    inputs = usage.get("input_tokens_details") or {}
    outputs = usage.get("output_tokens_details") or {}
    out = {
        "input_tokens": r.number(usage.get("input_tokens")),
        "output_tokens": r.number(usage.get("output_tokens")),
        "cache_read_input_tokens": r.number(r.get(inputs, "cached_tokens")),
        "cache_creation_input_tokens": r.number(r.get(inputs, "cache_write_tokens")),
        "reasoning_tokens": r.number(r.get(outputs, "reasoning_tokens")),
    }
    if not out["input_tokens"] and not out["output_tokens"]:
        return {}  # a stream without usage: the SDK reports zeros rather than nothing
    return {k: v for k, v in out.items() if v is not None}


def _read_generation(output: Any) -> tuple[str | None, list[ToolCall], str | None, str | None, str | None]:
    """A generation span's output: a Chat Completions message, or (streamed) a Responses response."""
    if not isinstance(output, (list, tuple)) or not output:
        return None, [], None, None, None
    first = output[0]
    if r.get(first, "output") is not None:  # a response the SDK assembled from the chunks
        text, calls, _, _ = read_output(r.get(first, "output"))
        if r.get(first, "id") == FAKE_RESPONSES_ID:  # the SDK's own: its id a placeholder, its model the one asked for
            return text, calls, response_finish_reason(first, calls), None, None
        return text, calls, response_finish_reason(first, calls), r.get(first, "id"), r.get(first, "model")
    calls = []
    for call in r.get(first, "tool_calls") or ():
        function = r.get(call, "function")
        arguments = r.arguments(r.get(function, "arguments"))
        calls.append(ToolCall(id=str(r.get(call, "id")), name=str(r.get(function, "name")), arguments=arguments))
    text = r.get(first, "content") or r.get(first, "refusal")
    return text if isinstance(text, str) else None, calls, "tool_calls" if calls else "stop", None, None


# -- patching -------------------------------------------------------------------------


def patch() -> list[Patch | Registration]:
    from agents.agent import AgentBase
    from agents.models.openai_responses import OpenAIResponsesModel
    from agents.run import AgentRunner
    from agents.tracing import setup

    patches: list[Patch | Registration | None] = [
        wrap(AgentRunner, "run", _run_wrapper),
        wrap(AgentRunner, "run_streamed", _run_streamed_wrapper),
        wrap(AgentBase, "get_all_tools", _all_tools_wrapper),
        wrap(OpenAIResponsesModel, "get_response", _responses_call_wrapper),
        wrap(OpenAIResponsesModel, "stream_response", _responses_call_wrapper),
    ]
    processor = LoopscopeProcessor()
    patches.append(_join_provider(setup, processor))

    def unregister() -> None:
        processor.active = False  # inert even if the provider below is not the SDK's own
        provider = setup.GLOBAL_TRACE_PROVIDER  # none yet: there is nothing to leave
        registered = getattr(getattr(provider, "_multi_processor", None), "_processors", None)
        if provider is not None and registered is not None and processor in registered:
            provider.set_processors([p for p in registered if p is not processor])

    patches.append(Registration(unregister))
    return [p for p in patches if p is not None]


def _join_provider(setup: Any, processor: LoopscopeProcessor) -> Patch | None:
    """Register the processor with the SDK's trace provider. The SDK makes its default
    provider at its first trace (with its exporter's HTTP client: certificates read, ~10
    ms), so when there is none yet, the processor joins the provider as it is made."""
    if setup.GLOBAL_TRACE_PROVIDER is not None:
        setup.get_trace_provider().register_processor(processor)
        return None
    from agents.tracing.provider import DefaultTraceProvider

    def joined(wrapped: Wrapped, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        wrapped(*args, **kwargs)
        if processor.active:
            instance.register_processor(processor)

    patched = wrap(DefaultTraceProvider, "__init__", joined)
    if patched is None:  # a provider without an ``__init__`` of its own: join it now
        setup.get_trace_provider().register_processor(processor)
    return patched
