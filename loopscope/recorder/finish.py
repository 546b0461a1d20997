"""The finish-reason vocabulary every adapter maps its provider's reasons into, and the outcome rules.

A provider says why a response ended in words of its own (OpenAI ``length``, Anthropic
``max_tokens``, Gemini ``MAX_TOKENS``, Bedrock ``guardrail_intervened``...). The span keeps
that word as the provider sent it (``gen_ai.response.finish_reasons``); what the call's
outcome (``loopscope.call.outcome``) and its turn's loop end reason are made of is the
word mapped into :class:`Finish`, by the adapter, with a :class:`FinishMap`:

============== ================= =========================================================
``Finish``     call outcome      meaning
============== ================= =========================================================
``stop``       ``completed``     the model ended its answer (natural end, stop sequence)
``tool_call``  ``completed``     the model asked for tool calls (the loop goes on)
``length``     ``truncated``     cut at a token limit (output or context window)
``content_filter`` ``content_filter`` the provider's filter withheld or cut the answer (safety, recitation, blocklist, guardrail)
``refusal``    ``refusal``       the model refused (a structured-output refusal, Anthropic's ``refusal``)
``error``      ``error``         the provider ended the answer with an error (malformed call, internal)
============== ================= =========================================================

Beyond the finish reason: a call that raised is ``error`` (or ``cancelled``, for a
cancellation), a response that carried an error body ``error``, a stream let go before its
end ``cancelled``, and a response with a refusal ``refusal`` whatever its reason. A reason
the map does not know is ``stop`` (``completed``), never a failure: the answer came. The
turn's loop end reason follows its last call: ``truncated`` -> ``TRUNCATED``,
``content_filter`` -> ``CONTENT_FILTER``, ``refusal`` -> ``REFUSAL``.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any


class Finish(str, Enum):
    """Why a response ended, in loopscope's words (the GenAI conventions' ``FinishReason``
    values, and ``refusal``). A ``str``: ``Finish.LENGTH == "length"``."""

    STOP = "stop"
    TOOL_CALL = "tool_call"
    LENGTH = "length"
    CONTENT_FILTER = "content_filter"
    REFUSAL = "refusal"
    ERROR = "error"


OUTCOMES: Mapping[Finish, str] = {
    Finish.STOP: "completed",
    Finish.TOOL_CALL: "completed",
    Finish.LENGTH: "truncated",
    Finish.CONTENT_FILTER: "content_filter",
    Finish.REFUSAL: "refusal",
    Finish.ERROR: "error",
}
"""The call outcome (:data:`loopscope.semconv.CALL_OUTCOMES`) each finish reason gives."""

_BY_VALUE = {member.value: member for member in Finish}


class FinishMap:
    """A provider's finish reasons -> :class:`Finish`; ``FinishMap({"MAX_TOKENS": Finish.LENGTH})``.

    Looked up as given, then lower-cased (``MAX_TOKENS`` and ``max_tokens`` alike); a reason
    missing from the map that is one of :class:`Finish`'s own words is that; any other is
    ``default`` (``stop``: the model answered). None stays None (the provider gave none).
    """

    __slots__ = ("_map", "default")

    def __init__(self, reasons: Mapping[str, Finish | str], default: Finish = Finish.STOP) -> None:
        made: dict[str, Finish] = {}
        for raw, finish in reasons.items():
            value = finish if isinstance(finish, Finish) else Finish(finish)
            made[raw] = value
            made.setdefault(raw.lower(), value)
        self._map = made
        self.default = default

    def __call__(self, reason: Any) -> Finish | None:
        if reason is None:
            return None
        if type(reason) is not str:
            reason = getattr(reason, "value", None) or getattr(reason, "name", None) or str(reason)  # an SDK's enum
            if type(reason) is not str:
                return self.default
        found = self._map.get(reason)
        if found is not None:
            return found
        lowered = reason.lower()
        return self._map.get(lowered) or _BY_VALUE.get(lowered) or self.default

    def with_calls(self, reason: Any, calls: Any) -> Finish | None:
        """For a provider that says its ``stop`` word for an answer that asks for tool calls
        too (Gemini's ``STOP``, Ollama's ``stop``): ``tool_call`` when the answer has ``calls``
        and ``reason`` is a stop, else what ``reason`` maps to."""
        finish = self(reason)
        return Finish.TOOL_CALL if calls and finish is Finish.STOP else finish

    def extended(self, reasons: Mapping[str, Finish | str]) -> FinishMap:
        """This map with more (or other) reasons, for a provider that adds a few to another's."""
        both: dict[str, Finish | str] = dict(self._map)
        both.update(reasons)
        return FinishMap(both, self.default)


COMMON = FinishMap(
    {
        # OpenAI Chat Completions (and the providers that answer in its format)
        "stop": Finish.STOP,
        "tool_calls": Finish.TOOL_CALL,
        "function_call": Finish.TOOL_CALL,
        "length": Finish.LENGTH,
        "content_filter": Finish.CONTENT_FILTER,
        # OpenAI Responses (the incomplete details' reason)
        "max_output_tokens": Finish.LENGTH,
        # Anthropic Messages
        "end_turn": Finish.STOP,
        "stop_sequence": Finish.STOP,
        "pause_turn": Finish.STOP,
        "tool_use": Finish.TOOL_CALL,
        "max_tokens": Finish.LENGTH,
        "model_context_window_exceeded": Finish.LENGTH,
        "refusal": Finish.REFUSAL,
        # vLLM and others
        "model_length": Finish.LENGTH,
    }
)
"""The reasons of the providers recorded before the kit (OpenAI, Anthropic, the OpenAI
format's servers): what a round reported without a :class:`Finish` is read by."""


def finish_of(reason: Any) -> Finish | None:
    """A value an adapter gives as its :class:`Finish`: a member, or one of its words."""
    if reason is None or isinstance(reason, Finish):
        return reason
    return _BY_VALUE.get(reason) if type(reason) is str else None


__all__ = ["COMMON", "OUTCOMES", "Finish", "FinishMap", "finish_of"]
