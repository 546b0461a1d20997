"""The tool results a request carries, gathered as an adapter walks the request's messages.

Results with an id are kept when the recorder waits for that id (:func:`wants_result`: a
long history holds many results already paired). Results without one (Gemini's OpenAI
endpoint, Ollama, Cohere's v1) answer the calls without an id of the *last* response, by
position: so only those after the last assistant message count, and the recorder pairs
them (:func:`~loopscope.recorder.stitch.start_model_call`). The adapter says where the
model spoke (:meth:`ToolResults.model_spoke`); the pairing rule is kept here, once.
"""

from __future__ import annotations

from typing import Any

from .._json import result_value
from .records import ToolResult
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


__all__ = ["ToolResults"]
