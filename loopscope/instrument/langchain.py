"""LangChain: chat model runs as rounds, tool runs as tool calls, agent runs as turns.

LangChain reports every run (chain, chat model, tool, retriever) to its callback
handlers. This adapter adds one handler globally, through langchain-core's configure hook
(:func:`langchain_core.tracers.context.register_configure_hook` with a context variable
whose default is our handler), so every run of every runnable reaches it with no change to
the application; removing the hook entry takes it away again.

How runs become turns:

- A chat model run is a round. Its turn is the one of the root run above it, once that
  root has one; else it is placed as the SDK adapters place a raw call
  (:func:`~loopscope.recorder.adapter.start_model_call`): inside ``loopscope.turn(...)``
  it joins that turn; a request carrying ``ToolMessage`` results joins the turn that
  asked for those calls; anything else starts a turn. So a hand-written loop
  (``model.bind_tools(...).invoke`` -> tools -> ``ToolMessage`` -> model) is one turn,
  like the same loop over the openai SDK.
- A root chain run (an agent, a graph, ``prompt | model``) holds the turn its first model
  call opens or joins, and ends it when it ends: the loop end reason is the hand API's
  (completed, unfinished, truncated, error, cancelled...). A root run that calls no model
  (a prompt template, a retriever) is no turn. If the run ends while the model's last
  tool calls are still pending, the turn stays open, as a stitched turn does, for the
  request that brings their results (a loop that calls ``chain.invoke`` per step).
- A tool run is a tool call: it serves the call the model asked for (by
  ``tool_call_id``, else the oldest pending call of that name), with its arguments,
  result, duration; an exception, or a ``ToolMessage`` with status ``error``
  (``handle_tool_error``), is outcome ``failed``.

One model call, one span: while a chat model run is open, its round is the current round,
so an SDK adapter underneath (ChatOpenAI calls the openai SDK) fills that round instead of
recording the call again, with what the SDK sees (usage, response id, server). The
handler reads LangChain's own result only when no SDK adapter did.

Nothing here enables LangSmith tracing or counts tokens (no tiktoken).
"""

from __future__ import annotations

import os
from contextvars import ContextVar, Token
from typing import Any
from uuid import UUID

from langchain_core.callbacks.base import BaseCallbackHandler

from .. import _guard
from .._guard import guard
from ..models import LoopEndReason, ToolCall
from ..recorder.adapter import (
    ModelCall,
    ModelRequest,
    ModelResponse,
    Round,
    ToolExecution,
    ToolResult,
    Turn,
    call_owner,
    current_round,
    current_turn,
    end_tool,
    end_turn,
    last_stitched,
    result_value,
    start_model_call,
    start_tool,
    tool_turn,
    wants_result,
)
from ._patch import Registration, when_imported

FRAMEWORK = "langchain"

# names LangChain gives runs of its building blocks: not the name of an agent
_GENERIC_NAMES = ("Runnable", "LangGraph")


class _Run:
    """What the handler keeps about one LangChain run until it ends."""

    __slots__ = (
        "agent",
        "execution",
        "generation",
        "holds_turn",
        "kind",
        "last_round",
        "root",
        "round_token",
        "streamed",
        "turn",
    )

    def __init__(self, kind: str, parent: _Run | None) -> None:
        self.kind = kind
        self.root: _Run = parent.root if parent is not None else self
        self.agent: str | None = None
        self.turn: Turn | None = None  # a root run's turn, once a model call or a tool placed it
        self.holds_turn = False  # the root run ends its turn (it did not find it open)
        self.last_round: Round | None = None  # a root run's latest model call
        self.generation: ModelCall | None = None
        self.round_token: Token[Round | None] | None = None
        self.streamed = False
        self.execution: ToolExecution | None = None


def _text(content: Any) -> str | None:
    """A message content's text: the string, or the text blocks of a list."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict) and block.get("type") in ("text", "output_text"):
                text = block.get("text")
                if isinstance(text, str):
                    parts.append(text)
        return "".join(parts) or None
    return None


def _thinking(content: Any) -> str | None:
    if not isinstance(content, list):
        return None
    parts = []
    for block in content:
        if isinstance(block, dict) and block.get("type") in ("thinking", "reasoning"):
            value = block.get(block["type"])  # Anthropic's ``thinking`` blocks, LangChain's ``reasoning`` ones
            if isinstance(value, str):
                parts.append(value)
    return "".join(parts) or None


def _number(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _usage(message: Any, llm_output: Any) -> dict[str, int]:
    """Token counts from LangChain's ``usage_metadata`` (or an OpenAI-style ``token_usage``)."""
    out: dict[str, int] = {}
    usage = getattr(message, "usage_metadata", None)
    if isinstance(usage, dict):
        inputs = usage.get("input_token_details") or {}
        outputs = usage.get("output_token_details") or {}
        pairs = (
            ("input_tokens", usage.get("input_tokens")),
            ("output_tokens", usage.get("output_tokens")),
            ("cache_read_input_tokens", inputs.get("cache_read")),
            ("cache_creation_input_tokens", inputs.get("cache_creation")),
            ("reasoning_tokens", outputs.get("reasoning")),
        )
    else:
        usage = llm_output.get("token_usage") if isinstance(llm_output, dict) else None
        if not isinstance(usage, dict):
            return out
        prompt = usage.get("prompt_tokens_details") or {}
        completion = usage.get("completion_tokens_details") or {}
        pairs = (
            ("input_tokens", usage.get("prompt_tokens")),
            ("output_tokens", usage.get("completion_tokens")),
            ("cache_read_input_tokens", prompt.get("cached_tokens")),
            ("cache_creation_input_tokens", prompt.get("cache_write_tokens")),
            ("reasoning_tokens", completion.get("reasoning_tokens")),
        )
    for key, value in pairs:
        number = _number(value)
        if number is not None:
            out[key] = number
    return out


def _request(params: dict[str, Any], metadata: dict[str, Any]) -> dict[str, Any]:
    stop = params.get("stop") or metadata.get("ls_stop")
    return {
        "temperature": params.get("temperature", metadata.get("ls_temperature")),
        "top_p": params.get("top_p"),
        "top_k": params.get("top_k"),
        "max_tokens": params.get("max_completion_tokens") or params.get("max_tokens") or metadata.get("ls_max_tokens"),
        "frequency_penalty": params.get("frequency_penalty"),
        "presence_penalty": params.get("presence_penalty"),
        "seed": params.get("seed"),
        "stop": [stop] if isinstance(stop, str) else stop,
        "choice_count": params.get("n"),
        "reasoning_effort": params.get("reasoning_effort"),
        "service_tier": params.get("service_tier"),
    }


def _tool_results(messages: list[Any]) -> tuple[list[ToolResult], str | None]:
    """The results of open tool calls a request carries, and its last human message."""
    results = []
    input_text = None
    for message in messages:
        kind = getattr(message, "type", None)
        if kind == "tool":
            call_id = getattr(message, "tool_call_id", None)
            if call_id and wants_result(str(call_id)):
                content = getattr(message, "content", None)
                text = _text(content)
                value = result_value(text if text is not None else content)
                results.append(ToolResult(str(call_id), value, getattr(message, "status", None) == "error"))
        elif kind == "human":
            input_text = _text(getattr(message, "content", None))
    return results, input_text


def _agent_name(serialized: Any, kwargs: dict[str, Any]) -> str | None:
    name = kwargs.get("name") or (serialized.get("name") if isinstance(serialized, dict) else None)
    if not isinstance(name, str) or not name or name.startswith(_GENERIC_NAMES):
        return None
    return name


def _end_holding(run: _Run, exc: BaseException | None) -> None:
    """A root run ended: end the turn it holds, or leave it open for the results of the
    calls the model asked for last (a loop of runs, one per model call)."""
    turn = run.turn
    if turn is None or not run.holds_turn or turn.ended:
        return
    if exc is None:
        last = run.last_round
        if last is not None and any(turn.has_call(call.id) for call in last.tool_calls):
            last_stitched.set(turn)  # a tool run next, by hand or decorated, serves those calls
            return
        end_turn(turn)
    elif isinstance(exc, GeneratorExit):
        end_turn(turn, LoopEndReason.CANCELLED)
    else:
        end_turn(turn, None, exc)


class LoopscopeCallbackHandler(BaseCallbackHandler):
    """The callback handler loopscope adds to every LangChain run (see the module doc)."""

    run_inline = True  # called in the run's own context, so the round it opens is current for the SDK below

    def __init__(self) -> None:
        super().__init__()
        self.enabled = True
        self._runs: dict[UUID, _Run] = {}

    @property  # type: ignore[override]
    def raise_error(self) -> bool:
        # LangChain logs and swallows a handler's exception unless it asks to raise: tests
        # (strict mode) must see loopscope's own errors
        return _guard.is_strict()

    # -- bookkeeping ----------------------------------------------------------------------

    def _open(self, kind: str, run_id: UUID, parent_run_id: UUID | None) -> _Run:
        run = _Run(kind, self._runs.get(parent_run_id) if parent_run_id is not None else None)
        self._runs[run_id] = run
        return run

    # -- chains and retrievers: only where the root is ------------------------------------

    def on_chain_start(
        self, serialized: Any, inputs: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        if not self.enabled:
            return
        with guard("langchain chain start"):
            run = self._open("chain", run_id, parent_run_id)
            if run.root is run:
                run.agent = _agent_name(serialized, kwargs)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._chain_done(run_id, None)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._chain_done(run_id, error)

    def _chain_done(self, run_id: UUID, exc: BaseException | None) -> None:
        with guard("langchain chain end"):
            run = self._runs.pop(run_id, None)
            if run is not None and run.root is run:
                _end_holding(run, exc)

    def on_retriever_start(
        self, serialized: Any, query: str, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        if self.enabled:
            self._open("retriever", run_id, parent_run_id)

    def on_retriever_end(self, documents: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._runs.pop(run_id, None)

    def on_retriever_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._runs.pop(run_id, None)

    # -- model runs: rounds ---------------------------------------------------------------

    def on_chat_model_start(
        self,
        serialized: Any,
        messages: list[list[Any]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        if not self.enabled:
            return
        with guard("langchain model start"):
            flat = messages[0] if messages else []
            results, input_text = _tool_results(flat)
            self._model_start(run_id, parent_run_id, kwargs, results, input_text)

    def on_llm_start(
        self, serialized: Any, prompts: list[str], *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any
    ) -> None:
        if not self.enabled:
            return
        with guard("langchain model start"):
            self._model_start(run_id, parent_run_id, kwargs, [], prompts[0] if prompts else None)

    def _model_start(
        self,
        run_id: UUID,
        parent_run_id: UUID | None,
        kwargs: dict[str, Any],
        results: list[ToolResult],
        input_text: str | None,
    ) -> None:
        run = self._open("model", run_id, parent_run_id)
        root = run.root
        params = kwargs.get("invocation_params") or {}
        metadata = kwargs.get("metadata") or {}
        tools = params.get("tools") or params.get("functions")
        in_chain = root is not run and root.kind == "chain"
        joined = root.turn if in_chain and root.turn is not None and not root.turn.ended else None
        hand = current_turn.get()
        token = current_turn.set(joined) if joined is not None else None
        try:
            generation = start_model_call(
                ModelRequest(
                    provider=str(metadata.get("ls_provider") or params.get("_type") or FRAMEWORK),
                    model=params.get("model") or params.get("model_name") or metadata.get("ls_model_name"),
                    tools=tools if isinstance(tools, list) and tools else None,
                    tool_results=results,
                    input_text=input_text,
                    stream=bool(params.get("stream")),
                    parameters=_request(params, metadata),
                    framework=FRAMEWORK,
                    agent=root.agent,
                    caller_ends_turn=in_chain,
                )
            )
        finally:
            if token is not None:
                current_turn.reset(token)
        if generation is None:
            return
        if in_chain:
            if root.turn is None or root.turn.ended:
                root.turn = generation.turn
            if hand is None and generation.turn is root.turn:
                root.holds_turn = True  # a run that calls the model ends its turn (not a hand turn)
        run.generation = generation
        root.last_round = generation.round
        # An SDK adapter that fills this round sets ``eager`` (start_model_call marks every
        # round it fills so): unset now, it tells at the end who read the response.
        generation.round.eager = False
        if params.get("stream"):
            generation.round.mark_streaming()
            run.streamed = True
        if kwargs.get("batch_size", 1) == 1:
            # ``generate()`` with several prompts calls the model once per prompt after all
            # the starts: which SDK call is whose cannot be told, so none fills a round then
            run.round_token = current_round.set(generation.round)

    def on_llm_new_token(self, token: str, *, run_id: UUID, **kwargs: Any) -> None:
        with guard("langchain model chunk"):
            run = self._runs.get(run_id)
            generation = run.generation if run is not None else None
            if generation is None:
                return
            if not run.streamed:  # type: ignore[union-attr]
                run.streamed = True  # type: ignore[union-attr]
                generation.round.mark_streaming()
            if not generation.round.eager:
                generation.first_chunk()

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        with guard("langchain model end"):
            run = self._model_done(run_id)
            generation = run.generation if run is not None else None
            if generation is None:
                return
            rnd = generation.round
            if rnd.eager:  # an SDK adapter read the response already
                generation.finish()
                return
            rnd.eager = True  # the calls it asks for start now, as an SDK adapter's would
            _finish(generation, response)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        with guard("langchain model error"):
            run = self._model_done(run_id)
            generation = run.generation if run is not None else None
            if generation is None:
                return
            generation.round.eager = True
            if isinstance(error, GeneratorExit):  # the application stopped reading the stream
                generation.abandon()
            else:
                generation.fail(error)

    def _model_done(self, run_id: UUID) -> _Run | None:
        run = self._runs.pop(run_id, None)
        if run is not None and run.round_token is not None:
            token, run.round_token = run.round_token, None
            try:
                current_round.reset(token)
            except (ValueError, RuntimeError):  # ended in another context (a stream closed elsewhere)
                pass
        return run

    # -- tool runs: tool calls ------------------------------------------------------------

    def on_tool_start(
        self,
        serialized: Any,
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if not self.enabled:
            return
        with guard("langchain tool start"):
            run = self._open("tool", run_id, parent_run_id)
            root = run.root
            spec = serialized if isinstance(serialized, dict) else {}
            name = str(spec.get("name") or kwargs.get("name") or "")
            call_id = kwargs.get("tool_call_id")
            call_id = str(call_id) if call_id else None
            turn = call_owner(call_id) if call_id is not None else None
            if turn is None and root is not run and root.turn is not None and not root.turn.ended:
                turn = root.turn
            arguments = inputs if inputs is not None else result_value(input_str)
            execution = start_tool(name, arguments, call_id, spec.get("description"), turn=turn)
            run.execution = execution
            if root is not run and root.turn is None and tool_turn(execution) is not None:
                root.turn = tool_turn(execution)  # a model call later in this run joins it

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        with guard("langchain tool end"):
            run = self._runs.pop(run_id, None)
            execution = run.execution if run is not None else None
            if execution is None:
                return
            if hasattr(output, "tool_call_id") and hasattr(output, "content"):  # a ToolMessage
                text = _text(output.content)
                execution.result = result_value(text if text is not None else output.content)
                if getattr(output, "status", None) == "error":
                    execution.fail(text or "the tool reported an error")
            else:
                execution.result = output
            end_tool(execution)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        with guard("langchain tool error"):
            run = self._runs.pop(run_id, None)
            if run is not None and run.execution is not None:
                end_tool(run.execution, error)


def _finish(generation: ModelCall, response: Any) -> None:
    """Finish a round from LangChain's result (no SDK adapter read the response)."""
    generations = getattr(response, "generations", None) or []
    first = generations[0][0] if generations and generations[0] else None
    message = getattr(first, "message", None)
    llm_output = getattr(response, "llm_output", None)
    info = getattr(first, "generation_info", None) or {}
    if message is None:  # a completion model: text only
        text = getattr(first, "text", None)
        generation.finish(ModelResponse(text=text, usage=_usage(None, llm_output), finish_reason=info.get("finish_reason")))
        return
    content = getattr(message, "content", None)
    meta = getattr(message, "response_metadata", None) or {}
    calls = [
        ToolCall(id=str(call.get("id") or os.urandom(16).hex()), name=str(call.get("name")), arguments=call.get("args"))
        for call in getattr(message, "tool_calls", None) or ()
        if isinstance(call, dict)
    ]
    generation.finish(
        ModelResponse(
            text=_text(content),
            tool_calls=calls,
            usage=_usage(message, llm_output),
            finish_reason=meta.get("finish_reason") or meta.get("stop_reason") or info.get("finish_reason"),
            response_id=meta.get("id") or (llm_output.get("id") if isinstance(llm_output, dict) else None),
            model=meta.get("model_name") or meta.get("model"),
            thinking=_thinking(content),
        )
    )


def patch() -> list[Registration]:
    # LangChain imports its tracers' context (and LangSmith with it, ~0.5 s) at its first
    # run, not at import: the handler is registered then, just before that run reads it.
    return [when_imported("langchain_core.tracers.context", _register, "instrument langchain")]


def _register(lc_context: Any) -> list[Registration]:
    handler = LoopscopeCallbackHandler()
    # a context variable whose default is the handler: every run in every thread and task
    # gets it, and it is inheritable, so child runs keep it
    var: ContextVar[BaseCallbackHandler | None] = ContextVar("loopscope_langchain_handler", default=handler)
    lc_context.register_configure_hook(var, True)

    def undo() -> None:
        handler.enabled = False  # runs already under way finish; no new run is recorded
        hooks = lc_context._configure_hooks
        for i, entry in enumerate(hooks):
            if entry[0] is var:
                del hooks[i]
                break

    return [Registration(undo)]
