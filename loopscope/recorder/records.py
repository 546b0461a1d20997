"""What an adapter reads off an SDK call: the typed records it hands the recorder.

A model call is a :class:`ModelRequest` (read before the call, carrying the
:class:`ToolResult` s the request sends back) and a :class:`ModelResponse` (read from
what came back). Both are plain records with slots: built once per call, read once by
the recorder, cheap on the hot path. Values of other types than the hints say are
recorded as text, as the hand API does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .finish import Finish
from .parts import InputMessage


@dataclass(frozen=True)
class ToolResult:
    """A tool result an application sends back to the model in a request."""

    call_id: str
    content: Any
    is_error: bool = False


@dataclass(slots=True)
class ModelRequest:
    """One model call as the SDK is asked to make it.

    ``tools`` are the tools offered, in any provider's format; ``tool_results`` the
    results of earlier calls the request carries (an adapter reads only those
    :func:`~loopscope.recorder.adapter.wants_result` asks for); ``input_text`` the last
    user text; ``parameters`` the request's parameters and server (``temperature``,
    ``max_tokens``, ``server_address``..., as :func:`loopscope.semconv.request_attributes`
    names them). ``caller_ends_turn``: a turn this call opens or joins is ended by the
    caller (a framework run that holds several model calls), not by this call's response.
    ``messages``: the request's messages as the SDK was given them (the same list, not a
    copy); the recorder looks at a few of them only, to find the conversation a new
    stitched turn continues (:mod:`loopscope.recorder.conversations`);
    ``previous_response_id``: the response a request continues where the server keeps the
    conversation (OpenAI Responses), for the same purpose.
    """

    provider: str
    model: str | None = None
    tools: Iterable[Any] | None = None
    tool_results: Sequence[ToolResult] = ()
    input_text: str | None = None
    stream: bool = False
    parameters: Mapping[str, Any] | None = None
    framework: str | None = None
    agent: str | None = None
    caller_ends_turn: bool = False
    input_messages: list[dict[str, Any]] | list[InputMessage] | str | None = None
    """The request's messages: the kit's :class:`~loopscope.recorder.parts.InputMessage` s, or
    in the GenAI message schema (``{"role", "parts": [...]}``,
    parts ``{"type": "text", "content"}``, ``{"type": "tool_call", "id", "name",
    "arguments"}``, ``{"type": "tool_call_response", "id", "response"}``), or that list's
    JSON text already made (an adapter on the hot path): recorded as
    ``gen_ai.input.messages`` (content: exported only with content capture on)."""
    messages: Sequence[Any] | None = None
    previous_response_id: str | None = None


@dataclass(frozen=True, slots=True)
class Choice:
    """One more answer of a call that asked for several (``n > 1``): choice 0 is the
    response itself; these are the others, in order."""

    text: str | None = None
    finish_reason: str | None = None
    tool_calls: Sequence[Any] | None = None
    refusal: str | None = None


@dataclass(slots=True)
class ModelResponse:
    """What a model call returned: streamed text comes by ``ModelCall.delta`` and is not repeated here.

    ``tool_calls`` are :class:`~loopscope.models.ToolCall` s (or mappings / objects with
    ``id``, ``name``, ``arguments``); ``usage`` token counts by loopscope's names
    (``input_tokens``, ``output_tokens``, ``cache_read_input_tokens``, ...), normalized:
    ``input_tokens`` include the cached ones (read and written) on every provider;
    ``provider_usage`` the provider's own figures as it reported them (or their JSON text,
    when the adapter made it: no dict to build and encode on every call).

    ``refusal``: the model's refusal text (a structured-output refusal), or True for a
    refusal without text (Anthropic's ``refusal`` stop reason); ``error`` /
    ``error_type``: an error the response carried as data (an HTTP 200 whose body is an
    error). ``choices``: the answers after the first when the call asked for several
    (``n > 1``): each is recorded on the call (its finish reason and its text as an output
    message); the turn's text, segments and tool calls stay the first answer's.
    """

    text: str | None = None
    tool_calls: Iterable[Any] | None = None
    usage: Mapping[str, int] | None = None
    finish_reason: str | None = None
    response_id: str | None = None
    model: str | None = None
    thinking: str | None = None
    refusal: str | bool | None = None
    error: str | None = None
    error_type: str | None = None
    provider_usage: Mapping[str, Any] | str | None = None
    choices: Sequence[Choice] = ()
    finish: Finish | None = None
    """``finish_reason`` mapped into the kit's vocabulary (a :class:`~loopscope.recorder.finish.FinishMap`
    gives it): the call's outcome follows it. None: ``finish_reason`` is read by the common map
    (OpenAI's and Anthropic's words)."""


__all__ = ["Choice", "ModelRequest", "ModelResponse", "ToolResult"]
