"""loopscope: observability for agent loops.

Every model generation and tool call of an agent becomes an OpenTelemetry GenAI span,
an event in an embedded DuckDB activity log, and one summary per turn that says why the
loop stopped and which tools the model was offered.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__
from .instrument import instrument, uninstrument  # light: it imports no SDK, no store, no OTel SDK

if TYPE_CHECKING:
    from .models import (
        RESPONSE_SEGMENT_SEPARATOR,
        ActivityEvent,
        AIResponseEvent,
        DeclaredTool,
        EventSource,
        EventStatus,
        EventType,
        LoopEndReason,
        ModelCall,
        SessionInfo,
        TextContent,
        ToolCall,
        ToolCallContent,
    )
    from .pipeline import Pipeline, configure, flush, shutdown
    from .recorder import Round, ToolExecution, Turn, score, session, state_delta, state_snapshot, tool, turn
    from .storage.duckdb.conversations import ConversationStore, DuckDBConversationStore, InMemoryConversationStore
    from .storage.duckdb.store import AsyncStore, Store
    from .storage.errors import SQLRefusedError, StoreError, StoreLockedError
    from .storage.policy import EventFilter, PersistencePolicy

# The rest of the public API is imported at its first use, so that ``import loopscope``
# costs next to nothing (no pydantic, DuckDB or OpenTelemetry SDK until they are needed):
# each name -> the module that defines it.
_LAZY: dict[str, str] = {
    **dict.fromkeys(
        [
            "RESPONSE_SEGMENT_SEPARATOR",
            "AIResponseEvent",
            "ActivityEvent",
            "DeclaredTool",
            "EventSource",
            "EventStatus",
            "EventType",
            "LoopEndReason",
            "ModelCall",
            "SessionInfo",
            "TextContent",
            "ToolCall",
            "ToolCallContent",
        ],
        ".models",
    ),
    **dict.fromkeys(["Pipeline", "configure", "flush", "shutdown"], ".pipeline"),
    **dict.fromkeys(
        ["Round", "ToolExecution", "Turn", "score", "session", "state_delta", "state_snapshot", "tool", "turn"],
        ".recorder",
    ),
    **dict.fromkeys(["ConversationStore", "DuckDBConversationStore", "InMemoryConversationStore"], ".storage.duckdb.conversations"),
    **dict.fromkeys(["SQLRefusedError", "StoreError", "StoreLockedError"], ".storage.errors"),
    **dict.fromkeys(["EventFilter", "PersistencePolicy"], ".storage.policy"),
    **dict.fromkeys(["AsyncStore", "Store"], ".storage.duckdb.store"),
}


def _pipeline_tracer() -> Any:
    """The recorder's tracer before anything imported the pipeline: importing it installs
    its own (``pipeline.tracer``, which configures the defaults at first use)."""
    from . import pipeline

    return pipeline.tracer()


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    if module == ".recorder":
        # the hand API records on the defaults without configure(): its first span imports
        # the pipeline (here, not at this lookup: ``@loopscope.tool`` at import stays cheap)
        from .recorder import settings

        settings.use_pipeline(_pipeline_tracer)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "RESPONSE_SEGMENT_SEPARATOR",
    "AIResponseEvent",
    "ActivityEvent",
    "AsyncStore",
    "ConversationStore",
    "DeclaredTool",
    "DuckDBConversationStore",
    "EventFilter",
    "EventSource",
    "EventStatus",
    "EventType",
    "InMemoryConversationStore",
    "LoopEndReason",
    "ModelCall",
    "PersistencePolicy",
    "Pipeline",
    "Round",
    "SQLRefusedError",
    "SessionInfo",
    "Store",
    "StoreError",
    "StoreLockedError",
    "TextContent",
    "ToolCall",
    "ToolCallContent",
    "ToolExecution",
    "Turn",
    "__version__",
    "configure",
    "flush",
    "instrument",
    "score",
    "session",
    "shutdown",
    "state_delta",
    "state_snapshot",
    "tool",
    "turn",
    "uninstrument",
]
