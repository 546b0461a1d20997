"""Raw-response calls: the parsed body (or stream) is recorded when the user parses it."""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable
from typing import Any

import wrapt

from .._guard import guard
from ..recorder.adapter import ModelCall


class RawResponse(wrapt.ObjectProxy):  # type: ignore[misc]
    def __init__(self, wrapped: Any, model_call: ModelCall, deliver: Callable[[Any], Any]) -> None:
        super().__init__(wrapped)
        self._self_model_call = model_call
        self._self_deliver = deliver
        self._self_delivered: Any = None
        self._self_done = False
        self._self_unread = weakref.finalize(self, model_call.abandon)

    def _self_take(self, parsed: Any) -> Any:
        if self._self_done:
            return self._self_delivered
        self._self_done = True
        self._self_unread.detach()  # the body (or the stream proxy it became) owns the round now
        self._self_delivered = parsed  # what the user gets if loopscope cannot read it
        with guard("raw response"):
            self._self_delivered = self._self_deliver(parsed)
        return self._self_delivered

    def parse(self, *args: Any, **kwargs: Any) -> Any:
        parsed = self.__wrapped__.parse(*args, **kwargs)
        if inspect.isawaitable(parsed):

            async def later() -> Any:
                return self._self_take(await parsed)

            return later()
        return self._self_take(parsed)
