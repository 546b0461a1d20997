"""AG-UI event streams in and out of a loopscope store.

:func:`import_stream` reads an AG-UI stream (SSE, JSON lines, a JSON array, or
``ag_ui.core`` events) into the store: messages, tool calls, state and one turn summary
per run, and every event verbatim in the ``agui_events`` table, so that nothing of the
stream is lost (ACTIVITY_*, CUSTOM, RAW, MESSAGES_SNAPSHOT, STEP_*, REASONING_* too).
:func:`export_session` writes a session back as an AG-UI SSE stream: imported runs
verbatim, turns loopscope recorded synthesized from the log.

Needs the ``ag-ui-protocol`` package (``pip install 'loopscope[agui]'``); importing
this module does not import it, using it does.
"""

from __future__ import annotations

from .export import export_session, iter_session, session_events
from .importer import ImportResult, import_stream
from .read import AguiFormatError, read_events

__all__ = [
    "AguiFormatError",
    "ImportResult",
    "export_session",
    "import_stream",
    "iter_session",
    "read_events",
    "session_events",
]
