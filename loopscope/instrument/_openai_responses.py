"""The openai SDK, Responses API: ``responses.create`` and ``responses.parse`` as rounds.

``responses.stream()`` calls ``create(stream=True)`` (sync and async), so it is recorded
once, through ``create``; its helper's ``close`` only closes the HTTP response, so it is
wrapped to end the round too. ``parse`` posts by itself and is wrapped on its own.
Part of the openai adapter: :func:`patch` takes that adapter's shared delivery.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..models import ToolCall
from ..recorder.adapter import (
    ModelCall,
    ModelRequest,
    ModelResponse,
    ToolResult,
    ToolResults,
    provider_at,
    request_parameters,
)
from ..recorder.adapter import usage as make_usage
from . import _history
from . import _read as r
from ._calls import async_call, sync_call
from ._patch import Patch, Registration, when_imported, wrap
from ._streams import closes_inner_stream

PROVIDER = "openai"
MESSAGE_SEPARATOR = "\n\n"
"""Joins the text of two message items of one response (the same in a stream and out of it)."""

_FUNCTION_TYPES = ("function", "custom")
_CALL_TYPES = ("function_call", "custom_tool_call")
_RESULT_TYPES = ("function_call_output", "custom_tool_call_output")


class ResponseError(Exception):
    """The response failed on the server: ``status: failed``, or an ``error`` event in its stream.

    The SDK hands these to the application as data, not as an exception; loopscope ends
    the round with this error so that the turn says why it stopped.
    """


def _given(value: Any) -> Any:
    """None for the SDK's ``omit`` / ``NOT_GIVEN`` sentinels (the ``stream()`` helper passes them)."""
    return None if type(value).__name__ in ("Omit", "NotGiven") else value


# -- the request ----------------------------------------------------------------------


def _request(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ModelRequest:
    items = _given(r.items(kwargs, "input"))
    input_text, results, messages = read_input(items)
    reasoning = _given(kwargs.get("reasoning"))
    server = r.stainless_server(instance)
    request = request_parameters(
        provider=PROVIDER,
        temperature=_given(kwargs.get("temperature")),
        top_p=_given(kwargs.get("top_p")),
        max_tokens=_given(kwargs.get("max_output_tokens")),
        reasoning_effort=r.get(reasoning, "effort"),
        service_tier=_given(kwargs.get("service_tier")),
        tool_choice=r.tool_choice(_given(kwargs.get("tool_choice"))),
        system_instructions=_given(kwargs.get("instructions")),
        reasoning=reasoning if isinstance(reasoning, dict) else None,
        include=_given(kwargs.get("include")),
        store=_given(kwargs.get("store")),
        parallel_tool_calls=_given(kwargs.get("parallel_tool_calls")),
        server=server,
    )
    # structured output: text.format (create), or the class parse() is given as text_format
    text_format = _given(kwargs.get("text_format"))
    if text_format is None:
        text_format = r.get(_given(kwargs.get("text")), "format")
    if text_format is not None:
        request["response_format"], request["output_type"] = r.output_format(text_format)
    model = _given(kwargs.get("model"))
    previous = _given(kwargs.get("previous_response_id"))  # the server keeps the conversation
    return ModelRequest(
        provider_at(PROVIDER, server),
        model if isinstance(model, str) else None,
        tools=_tools(_given(r.items(kwargs, "tools"))),
        tool_results=results,
        input_text=input_text,
        stream=_given(kwargs.get("stream")) is True,
        parameters=request,
        input_messages=messages,
        messages=items if isinstance(items, (list, tuple)) else None,
        previous_response_id=previous if isinstance(previous, str) else None,
    )


def read_input(items: Any) -> tuple[str | None, list[ToolResult], list[dict[str, Any]] | str | None]:
    """The last user text of ``input``, the tool results it carries, and its items as
    GenAI messages (one per message, call and result item; others are left out), for a
    long conversation as their JSON text, the items of an earlier request not converted
    again (:mod:`._history`: every item is then one message)."""
    if isinstance(items, str):
        return items, [], [{"role": "user", "parts": [{"type": "text", "content": items}]}]
    if not isinstance(items, (list, tuple)):
        return None, [], None
    text = None
    # results without a call id (an OpenAI-compatible server's calls may have none) answer
    # the last response's calls without one, by position (the kit pairs them)
    results = ToolResults()
    messages: list[dict[str, Any]] = []
    known, kept, found = _conversations.reuse(items)
    for index, item in enumerate(items):
        fresh = index >= known  # not one of an earlier request's items, whose JSON is kept
        kind = r.get(item, "type")
        if kind in _RESULT_TYPES:
            call_id = r.get(item, "call_id")
            output = r.get(item, "output")
            if fresh:
                messages.append({"role": "tool", "parts": [{"type": "tool_call_response", "id": call_id, "response": output}]})
            if results.wanted(call_id):  # results of calls still open only
                results.add(call_id, r.text_of(output) if isinstance(output, list) else output)
        elif kind in _CALL_TYPES:
            if fresh:
                arguments = r.get(item, "arguments") if kind == "function_call" else r.get(item, "input")
                part = {"type": "tool_call", "id": r.get(item, "call_id"), "name": r.get(item, "name"), "arguments": arguments}
                messages.append({"role": "assistant", "parts": [part]})
            results.model_spoke()  # a later response's calls: the results before answered an earlier one
        elif kind in (None, "message"):
            role, content = r.get(item, "role"), r.get(item, "content")
            if fresh:
                messages.append({"role": role, "parts": r.content_parts(content)})
            if role == "user":
                text = r.text_of(content)
            elif role == "assistant":
                results.model_spoke()
    return text, results.results, _conversations.join(items, messages, known, kept, found)


_conversations = _history.History()


def _tools(tools: Any) -> list[Any] | None:
    """The tools the model is offered: functions as written (flat, or wrapped by
    ``pydantic_function_tool``), built-in tools by their type."""
    if not tools or not isinstance(tools, (list, tuple)):
        return None
    out: list[Any] = []
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        kind = tool.get("type")
        if kind in _FUNCTION_TYPES:
            out.append(tool)
        elif kind == "namespace":
            out.extend(t for t in _tools(tool.get("tools")) or ())
        elif kind == "mcp":  # tools OpenAI runs: server tools (their type kept)
            out.append({"name": f"mcp:{tool.get('server_label') or tool.get('server_url') or 'server'}", "type": kind})
        elif isinstance(kind, str):
            out.append({"name": kind, "type": kind})
    return out


# -- the response ---------------------------------------------------------------------


def response_usage(usage: Any) -> dict[str, int]:
    if usage is None:
        return {}
    input_details = r.get(usage, "input_tokens_details")
    # the Responses API counts as Chat Completions does: cache in the input, reasoning in the output
    return make_usage(
        input=r.get(usage, "input_tokens"),
        output=r.get(usage, "output_tokens"),
        cache_read=r.get(input_details, "cached_tokens"),
        cache_write=r.get(input_details, "cache_write_tokens"),
        reasoning=r.get(r.get(usage, "output_tokens_details"), "reasoning_tokens"),
    )


def _error(source: Any, default: str) -> ResponseError:
    code, message = r.get(source, "code"), r.get(source, "message")
    text = ": ".join(str(x) for x in (code, message) if x) or default
    return ResponseError(text)


def read_output(items: Any) -> tuple[str | None, list[ToolCall], str | None, str | None]:
    """Text (message items joined), the tool calls, the reasoning summary and the refusal of an output list."""
    texts: list[str] = []
    refusals: list[str] = []
    calls: list[ToolCall] = []
    thinking: list[str] = []
    for item in items or ():
        kind = r.get(item, "type")
        if kind == "message":
            parts = r.get(item, "content") or ()
            text = "".join(r.get(p, "text") or "" for p in parts if r.get(p, "type") == "output_text")
            if text:
                texts.append(text)
            refusal = "".join(r.get(p, "refusal") or "" for p in parts if r.get(p, "type") == "refusal")
            if refusal:
                refusals.append(refusal)
        elif kind in _CALL_TYPES:
            arguments = r.arguments(r.get(item, "arguments")) if kind == "function_call" else r.get(item, "input")
            calls.append(ToolCall(id=str(r.get(item, "call_id") or ""), name=str(r.get(item, "name")), arguments=arguments))
        elif kind == "reasoning":
            parts = r.get(item, "summary") or r.get(item, "content") or ()
            text = "\n".join(t for t in (r.get(p, "text") for p in parts) if isinstance(t, str) and t)
            if text:
                thinking.append(text)
    refusal = MESSAGE_SEPARATOR.join(refusals) or None
    text = MESSAGE_SEPARATOR.join(texts) or refusal
    return text, calls, "\n".join(thinking) or None, refusal


def response_finish_reason(response: Any, calls: list[ToolCall]) -> str | None:
    status = r.get(response, "status")
    if status == "incomplete":
        return r.get(r.get(response, "incomplete_details"), "reason") or "incomplete"
    if status in (None, "completed"):
        return "tool_calls" if calls else "stop"
    return str(status)  # queued / in_progress (background): the answer comes later


def _finish(response: Any, model_call: ModelCall, *, text_streamed: bool = False, items: Any = None) -> None:
    status = r.get(response, "status")
    if status == "failed":
        model_call.fail(_error(r.get(response, "error"), "the response failed"))
        return
    output = r.get(response, "output")
    error = r.get(response, "error")
    if status is None and error and not output:  # an HTTP 200 whose body is an error (a gateway's)
        model_call.finish(
            ModelResponse(
                error=str(_error(error, r.json_text(error))),
                error_type=_text(r.get(error, "type") or r.get(error, "code")),
                response_id=r.get(response, "id"),
                model=r.get(response, "model"),
            )
        )
        return
    text, calls, thinking, refusal = read_output(output if output else items)
    reported = r.get(response, "usage")
    usage = response_usage(reported)
    model_call.finish(
        ModelResponse(
            text=None if text_streamed else text,
            tool_calls=calls,
            usage=usage,
            finish_reason=response_finish_reason(response, calls),
            response_id=r.get(response, "id"),
            model=r.get(response, "model"),
            thinking=thinking,
            refusal=refusal,
            provider_usage=r.reported_json(reported),
        )
    )


def _text(value: Any) -> str | None:
    return str(value) if value else None


def _finish_one(response: Any, model_call: ModelCall) -> None:
    _finish(response, model_call)


class _ResponseEvents:
    """Reads a Responses event stream: text deltas as they come; the rest from the final
    ``response.completed`` / ``response.incomplete`` event's response."""

    # the events that end the round (see _streams.BATCH): handed over the moment they are read
    final_events = frozenset({"response.completed", "response.incomplete", "response.failed", "error"})

    def __init__(self) -> None:
        self.items: dict[int, Any] = {}  # output_index -> finished item, should the final response omit them
        self.text_item: Any = None
        self.streamed = False
        self.last: Any = None  # the newest response snapshot (created / in_progress)

    def add(self, event: Any, model_call: ModelCall) -> None:
        kind = r.get(event, "type")
        if kind in ("response.output_text.delta", "response.refusal.delta"):
            delta = r.get(event, "delta")
            if delta:
                item = r.get(event, "item_id")
                if self.streamed and item != self.text_item:
                    model_call.delta(MESSAGE_SEPARATOR)
                model_call.delta(delta)
                self.streamed, self.text_item = True, item
        elif kind in ("response.completed", "response.incomplete"):
            _finish(r.get(event, "response"), model_call, text_streamed=self.streamed, items=self._items())
        elif kind == "response.failed":
            model_call.fail(_error(r.get(r.get(event, "response"), "error"), "the response failed"))
        elif kind == "error":
            model_call.fail(_error(event, "the stream reported an error"))
        elif kind == "response.output_item.done":
            index = r.get(event, "output_index")
            self.items[index if isinstance(index, int) else len(self.items)] = r.get(event, "item")
        elif kind in ("response.created", "response.in_progress", "response.queued"):
            self.last = r.get(event, "response")
        elif isinstance(kind, str) and (kind.endswith(".delta") or kind == "response.output_item.added"):
            model_call.first_chunk()  # tool call arguments, reasoning summaries

    def _items(self) -> list[Any]:
        return [item for _, item in sorted(self.items.items())]

    def finish(self, model_call: ModelCall) -> None:
        """The stream ended without a final event: what it carried is the response."""
        text, calls, thinking, refusal = read_output(self._items())
        model_call.finish(
            ModelResponse(
                text=None if self.streamed else text,
                tool_calls=calls,
                finish_reason="tool_calls" if calls else None,
                response_id=r.get(self.last, "id"),
                model=r.get(self.last, "model"),
                thinking=thinking,
                refusal=refusal,
            )
        )

    def partial(self) -> ModelResponse:
        """What the stream said before it was closed early: the response's id and model."""
        return ModelResponse(response_id=r.get(self.last, "id"), model=r.get(self.last, "model"))


# -- patching -------------------------------------------------------------------------


def patch(deliver: Callable[[Any, ModelCall, Any, Any], Any]) -> list[Registration]:
    """Wrap the Responses resource when the SDK imports it; ``deliver(result, model_call,
    finish_one, chunks)`` is the openai adapter's delivery (stream proxy, raw response, or a
    plain response)."""

    def deliver_response(result: Any, model_call: ModelCall) -> Any:
        return deliver(result, model_call, _finish_one, _ResponseEvents)

    def resource(responses: Any) -> list[Patch | None]:
        return [
            wrap(responses.Responses, "create", sync_call(_request, deliver_response, mark=False)),
            wrap(responses.Responses, "parse", sync_call(_request, deliver_response, mark=False)),
            wrap(responses.AsyncResponses, "create", async_call(_request, deliver_response, mark=False)),
            wrap(responses.AsyncResponses, "parse", async_call(_request, deliver_response, mark=False)),
        ]

    def helpers(module: Any) -> list[Patch | None]:  # an SDK without the stream() helper never imports it
        return [
            wrap(module.ResponseStream, "close", closes_inner_stream("_raw_stream")),
            wrap(module.AsyncResponseStream, "close", closes_inner_stream("_raw_stream", is_async=True)),
        ]

    return [
        when_imported("openai.resources.responses.responses", resource, "instrument openai"),
        when_imported("openai.lib.streaming.responses._responses", helpers, "instrument openai"),
    ]
