"""The anthropic SDK: Messages calls (and their beta twins) as rounds of stitched turns.

Wrapped, on the stable and the beta ``Messages`` / ``AsyncMessages`` resources:
``create`` (JSON and ``stream=True``), ``parse`` and the ``stream()`` helper. The helper
does not go through ``create``: it hands its ``MessageStreamManager`` a deferred request,
which we wrap so that the model call starts when the manager is entered and its raw
event stream is read through our proxy; ``MessageStream`` (``text_stream``,
``get_final_message()``, ``until_done()``) works on top of it unchanged.

The SDK's own spans. The anthropic SDK starts one OpenTelemetry ``CLIENT`` span per API
call by default (``gen_ai.operation.name=chat``, from the global tracer provider or its
``open_telemetry={"tracer_provider": ...}`` option). Next to our round it would be a
second model-call span for the same call, and our store would count a foreign GenAI span
as another round. The SDK has no per-call switch (``open_telemetry=False`` is per client,
and ``with_options`` would mean calling through another client), and it honours no
context flag. So for the calls we record we adopt its call span as our round: while the
SDK method we wrap runs, its ``start_api_call_span`` returns a non-recording span that
carries our round's span context. The SDK then exports nothing of its own for that call,
and what it does with its span still holds: the trace context it propagates in the request
headers (unless its ``propagation`` is off) is our ``chat`` span's, and HTTP client spans
nest under that round. A client whose SDK tracing is off is left alone; calls we do not
record (``count_tokens``, batches, ...) keep the SDK's spans. The beta tool runner's own
``invoke_agent`` / ``execute_tool`` spans give way the same way (see below).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from .. import _json
from ..models import ToolCall
from ..recorder.adapter import (
    COMMON_FINISH,
    ModelCall,
    ModelRequest,
    ModelResponse,
    ToolResults,
    provider_at,
    recorded_elsewhere,
    request_parameters,
    requested_call_span,
)
from ..recorder.adapter import usage as make_usage
from . import _history
from . import _read as r
from ._calls import async_call, calling, sync_call
from ._patch import Patch, wrap
from ._streams import proxy_stream

PROVIDER = "anthropic"
FINISH = COMMON_FINISH
"""Anthropic's stop reasons (``end_turn``, ``tool_use``, ``max_tokens``, ``stop_sequence``,
``pause_turn``, ``refusal``, ``model_context_window_exceeded``) in the kit's vocabulary."""


# -- the request ------------------------------------------------------------------------


def _sequence(value: Any) -> list[Any] | tuple[Any, ...] | None:
    """A list the request holds; a one-shot iterable is left for the SDK to consume."""
    return value if isinstance(value, (list, tuple)) else None


def _blocks_text(blocks: Any) -> str | None:
    texts = [r.get(block, "text") for block in blocks if r.get(block, "type") == "text"]
    return "".join(t for t in texts if isinstance(t, str)) or None


def _result_content(content: Any) -> Any:
    """A ``tool_result`` block's content: its string, the text of its blocks, or what kinds of blocks it holds."""
    if content is None or isinstance(content, str):
        return content
    blocks = _sequence(content)
    if blocks is None:
        return None
    text = _blocks_text(blocks)
    if text is not None:
        return text
    return [{"type": r.get(block, "type")} for block in blocks] or None


def _tools(tools: Any) -> list[Any] | None:
    """The tools offered: custom tools as written, server tools (run at Anthropic, never
    here: ``web_search_20250305``, ...) by their name and type."""
    tools = _sequence(tools)
    if not tools:
        return None
    out = []
    for tool in tools:
        if not isinstance(tool, dict) and callable(getattr(tool, "to_dict", None)):
            tool = tool.to_dict()  # a beta ``@beta_tool`` function tool
        if not isinstance(tool, dict) or not tool.get("name"):
            continue
        kind = tool.get("type", "custom")
        if kind in ("custom", None):
            out.append(
                {"name": tool["name"], "description": tool.get("description"), "input_schema": tool.get("input_schema")}
            )
        else:
            out.append({"name": tool["name"], "type": kind})
    return out


def _request(
    instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any], stream: bool | None = None
) -> ModelRequest:
    results = ToolResults()
    input_text = None
    given = _sequence(kwargs.get("messages"))
    source = given or ()
    # a long conversation's messages of an earlier request are not converted again (_history)
    known, kept, found = _conversations.reuse(source)
    messages: list[dict[str, Any]] = []
    for index, message in enumerate(source):
        fresh = index >= known  # not one of an earlier request's messages, whose JSON is kept
        role, content = r.get(message, "role"), r.get(message, "content")
        if isinstance(content, str):
            if fresh:
                messages.append({"role": role, "parts": [{"type": "text", "content": content}]})
            if role == "user":
                input_text = content
            continue
        blocks = _sequence(content) or ()
        if fresh:
            messages.append({"role": role, "parts": _parts(blocks)})
        if role != "user":
            continue
        for block in blocks:
            # only the results of calls still open are read (a long history holds many)
            call_id = r.get(block, "tool_use_id")
            if r.get(block, "type") == "tool_result" and call_id and results.wanted(call_id):
                results.add(call_id, _result_content(r.get(block, "content")), bool(r.get(block, "is_error")))
        text = _blocks_text(blocks)
        if text is not None:  # a message of tool results alone is not the user speaking
            input_text = text
    # newer SDKs take sampling parameters only through ``extra_body``, whose values win
    extra = kwargs.get("extra_body")
    params = {**kwargs, **extra} if isinstance(extra, dict) else kwargs
    stop = params.get("stop_sequences")
    server = r.stainless_server(instance)
    request = request_parameters(
        provider=PROVIDER,
        temperature=params.get("temperature"),
        top_p=params.get("top_p"),
        top_k=params.get("top_k"),
        max_tokens=params.get("max_tokens"),
        stop=stop if isinstance(stop, (list, tuple)) else None,
        service_tier=params.get("service_tier"),
        tool_choice=r.tool_choice(params.get("tool_choice")),
        system_instructions=_system(kwargs.get("system")),  # gen_ai.system_instructions: apart from the messages
        thinking=params.get("thinking"),  # extended thinking: {"type": "enabled", "budget_tokens": N}
        server=server,
    )
    return ModelRequest(
        provider_at(PROVIDER, server),
        kwargs.get("model"),
        tools=_tools(kwargs.get("tools")),
        tool_results=results.results,
        input_text=input_text,
        stream=kwargs.get("stream") is True if stream is None else stream,
        parameters=request,
        input_messages=_conversations.join(source, messages, known, kept, found),
        messages=given,
    )


_conversations = _history.History()


def _system(system: Any) -> Any:
    """The system prompt as recorded: a text or a list of blocks (an iterable the SDK consumes is left alone)."""
    return system if isinstance(system, (str, list, dict)) else None


def _parts(blocks: Any) -> list[dict[str, Any]]:
    """A message's content blocks as GenAI message parts (images and documents by their type only)."""
    parts: list[dict[str, Any]] = []
    for block in blocks:
        kind = r.get(block, "type")
        if kind == "text":
            parts.append({"type": "text", "content": r.get(block, "text")})
        elif kind == "tool_use":
            parts.append({"type": "tool_call", "id": r.get(block, "id"), "name": r.get(block, "name"), "arguments": r.get(block, "input")})
        elif kind == "tool_result":
            parts.append({"type": "tool_call_response", "id": r.get(block, "tool_use_id"), "response": _result_content(r.get(block, "content"))})
        elif isinstance(kind, str):
            parts.append({"type": kind})
    return parts


# -- the response -----------------------------------------------------------------------


def _usage(usage: Any) -> dict[str, int]:
    """The figures as Anthropic gives them (its ``input_tokens`` leave the cached ones
    out), by loopscope's names; :func:`_normalized` makes the usage recorded of them (a
    stream's message_delta replaces some of message_start's: they are merged raw first)."""
    if usage is None:
        return {}
    out = {
        "input_tokens": r.number(r.get(usage, "input_tokens")),
        "output_tokens": r.number(r.get(usage, "output_tokens")),
        "cache_read_input_tokens": r.number(r.get(usage, "cache_read_input_tokens")),
        "cache_creation_input_tokens": r.number(r.get(usage, "cache_creation_input_tokens")),
        "reasoning_tokens": r.number(r.get(r.get(usage, "output_tokens_details"), "thinking_tokens")),
        # server tools' requests, which cost a fee each (priced with the tokens)
        "web_search_requests": r.number(r.get(r.get(usage, "server_tool_use"), "web_search_requests")),
    }
    return {k: v for k, v in out.items() if v is not None}


def _normalized(raw: dict[str, int]) -> dict[str, int]:
    """The usage recorded, by the kit's builder: Anthropic's input tokens leave the cache
    (read and written) out, its output tokens count the thinking (Anthropic's own figures
    go whole in provider_usage)."""
    if not raw:
        return raw
    return make_usage(
        input=raw.get("input_tokens"),
        output=raw.get("output_tokens"),
        cache_read=raw.get("cache_read_input_tokens"),
        cache_write=raw.get("cache_creation_input_tokens"),
        reasoning=raw.get("reasoning_tokens"),
        input_includes_cache=False,
        web_search_requests=raw.get("web_search_requests"),
    )


def _reported(usages: list[Any]) -> str | None:
    """A stream's usage as Anthropic reported it: message_start's, each message_delta's
    figures (totals) replacing it where they say one, as JSON text."""
    if len(usages) == 1:
        return r.reported_json(usages[0])
    merged: dict[str, Any] = {}
    for usage in usages:
        found = _json.parse(r.reported_json(usage) or "null")
        if isinstance(found, dict):
            merged.update((key, value) for key, value in found.items() if value is not None)
    return _json.dumps(merged) if merged else None


def _error_body(message: Any) -> ModelResponse | None:
    """An HTTP 200 whose body is an error (``{"type": "error", "error": {...}}``: a gateway's), else None."""
    error = r.get(message, "error")
    if r.get(message, "type") != "error" and not (error and not r.get(message, "content")):
        return None
    text, kind = r.get(error, "message"), r.get(error, "type")
    return ModelResponse(
        error=text if isinstance(text, str) and text else r.json_text(error),
        error_type=kind if isinstance(kind, str) else None,
        response_id=r.get(message, "id"),
        model=r.get(message, "model"),
    )


def _finish_message(message: Any, model_call: ModelCall) -> None:
    texts: list[str] = []
    thinking: list[str] = []
    calls = []
    for block in r.get(message, "content") or []:
        kind = r.get(block, "type")
        if kind == "text":
            texts.append(r.get(block, "text") or "")
        elif kind == "tool_use":
            arguments = r.arguments(r.get(block, "input"))
            calls.append(ToolCall(id=str(r.get(block, "id")), name=str(r.get(block, "name")), arguments=arguments))
        elif kind == "thinking":
            thinking.append(r.get(block, "thinking") or "")
    if not texts and not calls:
        error = _error_body(message)
        if error is not None:
            return model_call.finish(error)
    text = "".join(texts) or None
    stop_reason = r.get(message, "stop_reason")
    refusal = _refusal(stop_reason, r.get(message, "stop_details"))
    reported = r.get(message, "usage")
    usage = _normalized(_usage(reported))
    model_call.finish(
        ModelResponse(
            text=text,
            tool_calls=calls,
            usage=usage,
            finish_reason=stop_reason,
            finish=FINISH(stop_reason),
            response_id=r.get(message, "id"),
            model=r.get(message, "model"),
            thinking="\n".join(t for t in thinking if t) or None,
            refusal=refusal,
            provider_usage=r.reported_json(reported),
        )
    )


def _refusal(stop_reason: Any, stop_details: Any) -> str | bool | None:
    """A refusal's record: the explanation Anthropic gives in ``stop_details`` (a
    ``RefusalStopDetails``: ``category``, ``explanation``), else True (the message's text
    then stands for it); None when the model did not refuse."""
    if stop_reason != "refusal":
        return None
    explanation = r.get(stop_details, "explanation")
    return explanation if isinstance(explanation, str) and explanation else True


class _Events:
    """Accumulates raw ``message_*`` / ``content_block_*`` stream events into one response."""

    final_events = frozenset({"message_stop"})  # see _streams.BATCH: handed over at once

    def __init__(self) -> None:
        self.blocks: dict[int, dict[str, Any]] = {}
        self.usage: dict[str, int] = {}
        self.reported: list[Any] = []  # the usage objects of message_start and message_delta, as sent
        self.stop_reason: str | None = None
        self.stop_details: Any = None  # a refusal's (message_delta's delta.stop_details)
        self.response_id: str | None = None
        self.model: str | None = None

    def add(self, event: Any, model_call: ModelCall) -> None:
        kind = r.get(event, "type")
        if kind == "content_block_delta":
            delta = r.get(event, "delta")
            delta_kind = r.get(delta, "type")
            if delta_kind == "text_delta":
                model_call.delta(r.get(delta, "text") or "")
                return
            model_call.first_chunk()
            slot = self.blocks.get(r.get(event, "index"))
            if slot is None:
                return
            if delta_kind == "input_json_delta":
                slot["json"].append(r.get(delta, "partial_json") or "")
            elif delta_kind == "thinking_delta":
                slot["thinking"].append(r.get(delta, "thinking") or "")
        elif kind == "content_block_start":
            block = r.get(event, "content_block")
            block_kind = r.get(block, "type")
            self.blocks[r.get(event, "index")] = {
                "type": block_kind,
                "id": r.get(block, "id"),
                "name": r.get(block, "name"),
                "input": r.get(block, "input"),
                "json": [],
                "thinking": [r.get(block, "thinking") or ""],
            }
            if block_kind == "text" and r.get(block, "text"):
                model_call.delta(r.get(block, "text"))
            elif block_kind != "text":
                model_call.first_chunk()
        elif kind == "message_start":
            # the first event is the first chunk: a stream with no content block (a refusal's
            # message_start, message_delta, message_stop) has a time to first chunk too
            model_call.first_chunk()
            message = r.get(event, "message")
            self.response_id = r.get(message, "id")
            self.model = r.get(message, "model")
            reported = r.get(message, "usage")
            self.usage = _usage(reported)
            if reported is not None:
                self.reported.append(reported)
        elif kind == "message_delta":
            delta = r.get(event, "delta")
            self.stop_reason = r.get(delta, "stop_reason") or self.stop_reason
            self.stop_details = r.get(delta, "stop_details") or self.stop_details
            # the counts of message_delta are totals: they replace those of message_start
            reported = r.get(event, "usage")
            self.usage.update(_usage(reported))
            if reported is not None:
                self.reported.append(reported)
        elif kind == "message_stop":
            self.finish(model_call)  # complete now, even if the reader stops before the stream's end

    def finish(self, model_call: ModelCall) -> None:
        calls = []
        thinking = []
        for _, slot in sorted(self.blocks.items(), key=lambda item: item[0] if isinstance(item[0], int) else 0):
            if slot["type"] == "tool_use":
                raw = "".join(slot["json"])
                arguments = r.arguments(raw) if raw.strip() else (slot["input"] if slot["input"] is not None else {})
                calls.append(ToolCall(id=str(slot["id"]), name=str(slot["name"]), arguments=arguments))
            elif slot["type"] == "thinking":
                thinking.append("".join(slot["thinking"]))
        response = self.partial()
        response.tool_calls = calls
        response.thinking = "\n".join(t for t in thinking if t) or None
        response.refusal = _refusal(self.stop_reason, self.stop_details)
        model_call.finish(response)

    def partial(self) -> ModelResponse:
        """What the events said (all of it at the end; so far, for a stream closed early)."""
        return ModelResponse(
            usage=_normalized(self.usage),
            finish_reason=self.stop_reason,
            finish=FINISH(self.stop_reason),
            response_id=self.response_id,
            model=self.model,
            provider_usage=_reported(self.reported) if self.reported else None,
        )


def _deliver(result: Any, model_call: ModelCall) -> Any:
    if r.is_model(result):  # a parsed message (``hasattr`` on a model is slow)
        _finish_message(result, model_call)
        return result
    import anthropic

    if isinstance(result, (anthropic.Stream, anthropic.AsyncStream)):
        return proxy_stream(result, model_call, _Events())
    if hasattr(result, "http_response") and hasattr(result, "parse"):
        from ._raw import RawResponse

        # ``with_raw_response`` / ``with_streaming_response``: read when the user parses it
        return RawResponse(result, model_call, lambda parsed: _deliver(parsed, model_call))
    _finish_message(result, model_call)
    return result


# -- the stream() helper ----------------------------------------------------------------


def _deferred_request(manager: Any) -> str | None:
    """The attribute of a ``MessageStreamManager`` that holds its request (name-mangled)."""
    for cls in type(manager).__mro__:
        name = f"_{cls.__name__.lstrip('_')}__api_request"
        if name in vars(manager):
            return name
    return None


def _stream_helper(is_async: bool) -> Any:
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        manager = wrapped(*args, **kwargs)
        name = _deferred_request(manager)
        if name is None:  # an SDK whose manager we do not know: its calls go unrecorded
            return manager
        original = getattr(manager, name)
        describe = functools.partial(_stream_request, instance, args, kwargs)
        if is_async:
            # an awaitable the manager awaits on ``__aenter__``: ours begins the call there
            setattr(manager, name, _Awaited(lambda: async_call(describe, _deliver)(lambda: original, None, (), {})))
        else:
            setattr(manager, name, functools.partial(sync_call(describe, _deliver), original, None, (), {}))
        return manager

    return wrapper


class _Awaited:
    """An awaitable that makes its coroutine only when awaited (a manager never entered makes none)."""

    __slots__ = ("_make",)

    def __init__(self, make: Any) -> None:
        self._make = make

    def __await__(self) -> Any:
        return self._make().__await__()


def _stream_request(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any], *_: Any) -> ModelRequest:
    return _request(instance, args, kwargs, stream=True)


# -- the SDK's own call span --------------------------------------------------------------


def _adopt_call_span(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``anthropic._base_client.start_api_call_span``: our round stands in for the SDK's span."""
    model_call = calling.get()
    context = model_call.span_context() if model_call is not None else None
    if context is None:
        if recorded_elsewhere():
            # a framework's model-call span (pydantic-ai's) records this call: it stands in
            from opentelemetry.trace import NonRecordingSpan, get_current_span

            return NonRecordingSpan(get_current_span().get_span_context())
        return wrapped(*args, **kwargs)
    from opentelemetry.trace import NonRecordingSpan

    return NonRecordingSpan(context)


# -- the beta tool runner's own spans ----------------------------------------------------------
#
# ``client.beta.messages.tool_runner()`` loops over ``beta.messages.create``/``stream``, so
# its model calls are recorded above and stitch into one turn by their tool call ids. With
# its SDK tracing on it would also start an ``invoke_agent`` span per loop and an
# ``execute_tool`` span per tool run: a second turn and second tool calls for our store.
# Our stitched turn stands for its loop, and each tool runs under the ``execute_tool`` span
# that our round started for that call when the response asked for it.


def _no_runner_span(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``start_tool_runner_span``: the runner's loop is the turn loopscope stitches."""
    return None


def _tool_use_span(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``tool_use_span``: the tool runs under our pending call's span, not a second one."""
    call_id = kwargs.get("tool_use_id")
    span = requested_call_span(call_id) if isinstance(call_id, str) else None
    if span is None:
        return wrapped(*args, **kwargs)
    return _run_under(span)


@contextlib.contextmanager
def _run_under(span: Any) -> Iterator[Any]:
    from anthropic.lib._tracing import ToolRun
    from opentelemetry import trace

    with trace.use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False):
        yield ToolRun()


# -- patching ---------------------------------------------------------------------------


def patch() -> list[Patch]:
    from anthropic import _base_client
    from anthropic.resources.beta.messages import messages as beta
    from anthropic.resources.messages import messages as stable

    patches: list[Patch | None] = []
    for module in (stable, beta):
        patches += [
            wrap(module.Messages, "create", sync_call(_request, _deliver)),
            wrap(module.Messages, "parse", sync_call(_request, _deliver)),
            wrap(module.Messages, "stream", _stream_helper(False)),
            wrap(module.AsyncMessages, "create", async_call(_request, _deliver)),
            wrap(module.AsyncMessages, "parse", async_call(_request, _deliver)),
            wrap(module.AsyncMessages, "stream", _stream_helper(True)),
        ]
    patches.append(wrap(_base_client, "start_api_call_span", _adopt_call_span))  # type: ignore[arg-type]
    try:
        from anthropic.lib.tools import _beta_runner
    except ImportError:  # an SDK without the tool runner
        pass
    else:
        patches.append(wrap(_beta_runner, "start_tool_runner_span", _no_runner_span))  # type: ignore[arg-type]
        patches.append(wrap(_beta_runner, "tool_use_span", _tool_use_span))  # type: ignore[arg-type]
    return [p for p in patches if p is not None]
