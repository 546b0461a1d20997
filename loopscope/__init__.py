"""loopscope: observability for agent loops.

Every model generation and tool call of an agent becomes an OpenTelemetry GenAI span,
an event in an embedded DuckDB activity log, and one summary per turn that says why the
loop stopped and which tools the model was offered.
"""

from __future__ import annotations

from ._version import __version__
from .instrument import instrument, uninstrument
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
from .recorder import Round, ToolExecution, Turn, session, state_delta, state_snapshot, tool, turn
from .storage.conversations import ConversationStore, DuckDBConversationStore, InMemoryConversationStore
from .storage.errors import SQLRefusedError, StoreError, StoreLockedError
from .storage.policy import EventFilter, PersistencePolicy
from .storage.store import AsyncStore, Store

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
    "session",
    "shutdown",
    "state_delta",
    "state_snapshot",
    "tool",
    "turn",
    "uninstrument",
]
