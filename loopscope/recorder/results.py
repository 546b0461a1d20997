"""The tool results a request carries, gathered as an adapter walks the request's messages.

Results with an id are kept when the recorder waits for that id (:func:`wants_result`: a
long history holds many results already paired). Results without one (Gemini's OpenAI
endpoint, Ollama, Cohere's v1) answer the calls without an id of the *last* response, by
position: so only those after the last assistant message count, and the recorder pairs
them (:func:`~loopscope.recorder.stitch.start_model_call`). The adapter says where the
model spoke (:meth:`ToolResults.model_spoke`); the pairing rule is kept here, once.

:class:`RequestMessages` is the walk itself, which every provider adapter makes over its
request's messages: the typed messages, their tool results and the last user text, and the
:class:`~loopscope.recorder.records.ModelRequest` they go in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .._json import result_value
from .parts import InputMessage, MessagePart, ToolCallResponse
from .records import ModelRequest, ToolResult
from .stitch import wants_result


class ToolResults:
    """Collects a request's tool results: ``wanted(id)``, ``add(id, content)`` per result
    message, ``model_spoke()`` at each assistant message, :attr:`results` at the end."""

    __slots__ = ("_named", "_unnamed")

    def __init__(self) -> None:
        self._named: list[ToolResult] = []
        # None: no call without an id waits, so results without one are not read at all
        self._unnamed: list[ToolResult] | None = [] if wants_result("") else None

    def wanted(self, call_id: Any) -> bool:
        """Whether a result for ``call_id`` (empty or None: a result without an id) would be
        kept: read (and convert) its content only then."""
        if call_id:
            return wants_result(call_id if type(call_id) is str else str(call_id))
        return self._unnamed is not None

    def add(self, call_id: Any, content: Any, is_error: bool = False) -> None:
        """One result the request sends back (its content as the model is sent it)."""
        if call_id:
            key = call_id if type(call_id) is str else str(call_id)
            if wants_result(key):
                self._named.append(ToolResult(key, result_value(content), bool(is_error)))
        elif self._unnamed is not None:
            self._unnamed.append(ToolResult("", result_value(content), bool(is_error)))

    def model_spoke(self) -> None:
        """An assistant message: results without an id before it answered an earlier response."""
        if self._unnamed:
            self._unnamed = []

    @property
    def results(self) -> list[ToolResult]:
        """For ``ModelRequest.tool_results``."""
        return self._named + self._unnamed if self._unnamed else self._named


_SAME: Any = object()


class RequestMessages:
    """A request's messages as an adapter walks them, in order: for each tool result a
    message sends back, :meth:`result` (the part it makes), then :meth:`add` for the message;
    in the end :meth:`request`, the :class:`ModelRequest` with the typed messages
    (``input_messages``), the tool results (``tool_results``, paired by :class:`ToolResults`'
    rule) and the last user text (``input_text``)."""

    __slots__ = ("_held", "input_text", "messages", "results")

    def __init__(self) -> None:
        self.messages: list[InputMessage] = []
        self.results = ToolResults()
        self.input_text: str | None = None
        # the results of the message being read, kept once its role is known: an assistant
        # message's start is where the results before it stop answering the last response
        self._held: list[tuple[Any, Any, bool]] = []

    def result(self, call_id: Any, response: Any, content: Any = _SAME, is_error: bool = False) -> ToolCallResponse:
        """A tool result of the message about to be added: its part (``response`` as the model
        is sent it), and the result kept when a call waits for it (:meth:`ToolResults.wanted`):
        ``content``, what the tool gave (by default ``response``), failed with ``is_error``."""
        if self.results.wanted(call_id):
            self._held.append((call_id, response if content is _SAME else content, is_error))
        return ToolCallResponse(response, call_id)

    def add(self, role: str, parts: Sequence[MessagePart], text: str | None = None) -> None:
        """The message of ``role`` with ``parts`` (its tool results' made by :meth:`result`). An
        ``assistant`` message is where the model spoke (:meth:`ToolResults.model_spoke`); a
        ``user`` message's ``text`` (None: it said none) is the input text, the last one's."""
        if role == "assistant":
            self.results.model_spoke()
        elif role == "user" and text is not None:
            self.input_text = text
        held = self._held
        if held:
            for call_id, content, is_error in held:
                self.results.add(call_id, content, is_error)
            held.clear()
        self.messages.append(InputMessage(role, parts))

    def request(
        self,
        provider: str,
        model: str | None,
        *,
        tools: Iterable[Any] | None = None,
        stream: bool = False,
        parameters: Mapping[str, Any] | None = None,
        messages: Sequence[Any] | None = None,
    ) -> ModelRequest:
        """The request of these messages (``messages``: as the SDK was given them, for the
        conversation finder; the other fields as :class:`ModelRequest` has them)."""
        return ModelRequest(
            provider,
            model,
            tools=tools,
            tool_results=self.results.results,
            input_text=self.input_text,
            stream=stream,
            parameters=parameters,
            input_messages=self.messages,
            messages=messages,
        )


__all__ = ["RequestMessages", "ToolResults"]
