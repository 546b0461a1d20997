"""Conversation stores: a provider-ready message history per conversation id.

A *conversation store* keeps the transcript an agent sends back to its model (the
``messages`` list of OpenAI or Anthropic calls), by conversation id, so that a later
request, or another process, continues it. The shape follows toolnexus's
``ConversationStore`` (``get`` / ``save`` / ``list`` / ``delete``, async), so either store
here plugs into ``toolnexus.create_client(store=...)`` as it is.

:class:`DuckDBConversationStore` keeps the history *in loopscope's event log*: ``save``
appends each new message as the rows every loopscope view shows (``message``,
``tool_call_start``, ``tool_call_end``, in session = the conversation id), each row
carrying the message as it was saved; ``get`` rebuilds the list from those rows. The log
stays append-only: a history that was rewritten (not just extended) and a deleted
conversation are recorded as marker rows of type :data:`CONVERSATION_EVENT`, and so is a
message whose rows the agent's recording wrote already (the row points at them).
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol, runtime_checkable

from ... import _json
from ..._json import result_value
from ...models import ActivityEvent
from ..recording import flush_own
from . import tool_totals, values
from .connection import open_store, resolve
from .events import EVENT_COLUMNS as _EVENT_COLUMNS
from .events import event_of as _event
from .schema import migrate
from .store import Store
from .views import tool_rows

__all__ = [
    "CONVERSATION_EVENT",
    "ConversationStore",
    "DuckDBConversationStore",
    "InMemoryConversationStore",
]

CONVERSATION_EVENT = "conversation"
"""The event type of the store's marker rows: ``{"action": "rewrite", "kept": N}`` (the
history was replaced; its first N messages stay), ``{"action": "delete"}`` (a tombstone)
and ``{"action": "message", "recorded": [...], "message": {...}}`` (a message whose rows
were recorded by an instrumentation: their indices)."""

ID_PREFIX = "conv-"
"""Every row a :class:`DuckDBConversationStore` writes has an id starting with this: the
store finds its own rows by id, without reading the content of anyone else's."""

Message = dict[str, Any]


@runtime_checkable
class ConversationStore(Protocol):
    """Where conversation histories are kept, by conversation id (all methods async).

    The same two required methods as toolnexus's ``ConversationStore`` (``get``,
    ``save``) plus ``list`` and ``delete``.
    """

    async def get(self, conversation_id: str) -> list[Message] | None:
        """The stored messages of ``conversation_id``, or None if there is none."""
        ...

    async def save(self, conversation_id: str, messages: Sequence[Any]) -> None:
        """Store ``messages`` as the whole history of ``conversation_id``."""
        ...

    async def list(self) -> list[str]:
        """The ids of the stored conversations."""
        ...

    async def delete(self, conversation_id: str) -> None:
        """Forget ``conversation_id`` (a missing id is not an error)."""
        ...


def _plain(messages: Sequence[Any]) -> list[Any]:
    """The messages as plain JSON values (SDK objects, tuples, ... become dicts and lists)."""
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise TypeError(f"messages must be a list of messages, not {type(messages).__name__}")
    return [_json.to_jsonable(m) for m in messages]


class InMemoryConversationStore:
    """The default store: histories in this process's memory, gone when it exits.

    Thread-safe; ``get`` and ``save`` copy, so nobody changes a stored history by
    changing the list they passed or got. Every method has a synchronous twin
    (``get_sync``, ...).
    """

    def __init__(self) -> None:
        self._histories: dict[str, list[Any]] = {}
        self._lock = threading.Lock()

    def get_sync(self, conversation_id: str) -> list[Message] | None:
        with self._lock:
            history = self._histories.get(conversation_id)
            return copy.deepcopy(history) if history is not None else None

    def save_sync(self, conversation_id: str, messages: Sequence[Any]) -> None:
        history = _plain(messages)
        with self._lock:
            self._histories[conversation_id] = history

    def list_sync(self) -> list[str]:
        with self._lock:
            return list(self._histories)

    def delete_sync(self, conversation_id: str) -> None:
        with self._lock:
            self._histories.pop(conversation_id, None)

    async def get(self, conversation_id: str) -> list[Message] | None:
        return self.get_sync(conversation_id)

    async def save(self, conversation_id: str, messages: Sequence[Any]) -> None:
        self.save_sync(conversation_id, messages)

    async def list(self) -> list[str]:
        return self.list_sync()

    async def delete(self, conversation_id: str) -> None:
        self.delete_sync(conversation_id)


# -- the history as the log holds it ------------------------------------------------------------


@dataclass
class _History:
    """A conversation replayed from its rows: the live messages and the rows of each."""

    exists: bool = False
    deleted: bool = False
    messages: list[Any] = field(default_factory=list)
    rows: list[list[tuple[Any, ...]]] = field(default_factory=list)  # per message, its event rows
    linked: list[list[int]] = field(default_factory=list)  # per message, the recorded rows it points at
    correlation_id: str | None = None  # the exchange the last row belongs to
    last_index: int = 0  # of the store's last row in the session

    @property
    def live(self) -> bool:
        return self.exists and not self.deleted


_ROWS_SQL = (
    f"SELECT {_EVENT_COLUMNS} FROM events WHERE session_id = ? AND starts_with(id, '{ID_PREFIX}'){{span}} ORDER BY idx"
)
_IDX, _TYPE, _CORRELATION, _CONTENT = 2, 3, 5, 10


def _rows(con: Any, conversation_id: str) -> list[tuple[Any, ...]]:
    """The store's rows of one conversation, on a connection the caller holds (a writer's):
    read from the session's stretch of the file, as :class:`Store` reads a session."""
    span = con.execute("SELECT first_at, last_at FROM sessions WHERE session_id = ?", [conversation_id]).fetchone()
    if span is not None and span[0] is not None and span[1] is not None:
        sql, params = _ROWS_SQL.replace("{span}", " AND created_at BETWEEN ? AND ?"), [conversation_id, span[0], span[1]]
    else:
        sql, params = _ROWS_SQL.replace("{span}", ""), [conversation_id]
    return values.fill(con, con.execute(sql, params).fetchall(), 0, _CONTENT)  # large messages whole (values.py)


def _replay(rows: Sequence[tuple[Any, ...]]) -> _History:
    history = _History()
    for row in rows:
        content = json.loads(row[_CONTENT]) if row[_CONTENT] else {}
        if not isinstance(content, dict):
            continue
        history.exists = True
        history.last_index = row[_IDX]
        if row[_CORRELATION]:
            history.correlation_id = row[_CORRELATION]
        if row[_TYPE] == CONVERSATION_EVENT:
            action = content.get("action")
            if action == "delete":
                history.deleted, history.messages, history.rows, history.linked = True, [], [], []
            elif action == "rewrite":
                kept = int(content.get("kept") or 0)
                history.deleted = False
                del history.messages[kept:]
                del history.rows[kept:]
                del history.linked[kept:]
            elif action == "message":  # a message whose rows an instrumentation recorded
                history.deleted = False
                history.messages.append(content.get("message"))
                history.rows.append([])
                history.linked.append([int(i) for i in content.get("recorded") or ()])
            continue
        if "message" in content:  # the first row of a message carries it
            history.deleted = False
            history.messages.append(content["message"])
            history.rows.append([row])
            history.linked.append([])
        elif history.rows:
            history.rows[-1].append(row)
    return history


_RECORDED_SQL = (
    f"SELECT idx, type, correlation_id, content, id FROM events WHERE session_id = ? AND idx > ? "
    f"AND NOT starts_with(id, '{ID_PREFIX}') AND type IN ('message', 'tool_call_start', 'tool_call_end') ORDER BY idx"
)


def _row_key(kind: str, content: Mapping[str, Any]) -> tuple[Any, ...]:
    """What makes a row the same row whoever wrote it: a message's role and text, a tool
    row's kind and call id."""
    if kind == "message":
        return (kind, content.get("role"), content.get("body"))
    return (kind, content.get("tool_id"))


class _Recorded:
    """The rows an instrumentation recorded in the session since the store last wrote to
    it (the agent's own turn, recorded while it ran): messages found among them are
    pointed at, not written again."""

    def __init__(self, con: Any, conversation_id: str, after: int) -> None:
        self.rows: list[tuple[int, tuple[Any, ...], str | None]] = []
        found = values.fill(con, con.execute(_RECORDED_SQL, [conversation_id, after]).fetchall(), 4, 3)
        for idx, kind, correlation, text, _ in found:
            content = json.loads(text) if text else None
            if isinstance(content, dict):
                self.rows.append((idx, _row_key(kind, content), correlation))
        self.used: set[int] = set()

    def find(self, keys: Sequence[tuple[Any, ...]]) -> tuple[list[int], str | None] | None:
        """The recorded rows of every key (each row used once), or None if one is missing."""
        found: list[int] = []
        correlation = None
        taken = set(self.used)
        for key in keys:
            match = next((r for r in self.rows if r[1] == key and r[0] not in taken), None)
            if match is None:
                return None
            taken.add(match[0])
            found.append(match[0])
            correlation = correlation or match[2]
        self.used = taken
        return found, correlation


# -- messages to rows ------------------------------------------------------------------------


def _text(content: Any) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [b.get("text") for b in content if isinstance(b, dict) and b.get("type") in (None, "text", "input_text", "output_text")]
        texts = [t for t in texts if isinstance(t, str)]
        return "".join(texts) if texts else None
    return None


def _tool_calls(message: Mapping[str, Any]) -> list[tuple[str, str, Any]]:
    """(id, name, arguments) of every call an assistant message asks for (OpenAI or Anthropic)."""
    calls = []
    for call in message.get("tool_calls") or []:
        if isinstance(call, dict):
            function = call.get("function")
            if not isinstance(function, dict):
                function = call
            arguments = function.get("arguments")
            calls.append((str(call.get("id") or ""), str(function.get("name") or ""), result_value(arguments) if isinstance(arguments, str) else arguments))
    content = message.get("content")
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_use":
                calls.append((str(block.get("id") or ""), str(block.get("name") or ""), block.get("input")))
    return calls


def _tool_results(message: Mapping[str, Any]) -> list[tuple[str, Any, bool]]:
    """(call id, result, is_error) of every tool result a message carries."""
    if message.get("role") == "tool":
        content = message.get("content")
        text = _text(content)
        return [(str(message.get("tool_call_id") or ""), result_value(text) if text is not None else content, bool(message.get("is_error")))]
    results = []
    content = message.get("content")
    if isinstance(content, list):
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                inner = block.get("content")
                text = _text(inner)
                results.append((str(block.get("tool_use_id") or ""), result_value(text) if text is not None else inner, bool(block.get("is_error"))))
    return results


def _tool_content(call_id: str, name: str, arguments: Any, **end: Any) -> dict[str, Any]:
    content: dict[str, Any] = {
        "type": "tool_call", "tool_name": name, "tool_id": call_id, "arguments": arguments,
        "result": None, "status": "pending", "outcome": None, "duration_ms": None, "error": None,
    }
    content.update(end)
    return content


def _message_rows(message: Any, calls: Mapping[str, tuple[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """The rows of one message: (event type, content without the bookkeeping keys)."""
    if not isinstance(message, dict):
        return [("message", {"type": "text", "body": _json.dumps(message), "role": "unknown"})]
    role = str(message.get("role") or "unknown")
    rows: list[tuple[str, dict[str, Any]]] = []
    text = _text(message.get("content")) if role != "tool" else None  # a tool's text is its result
    if text:
        rows.append(("message", {"type": "text", "body": text, "role": role}))
    for call_id, name, arguments in _tool_calls(message) if role == "assistant" else ():
        rows.append(("tool_call_start", _tool_content(call_id, name, arguments)))
    for call_id, result, is_error in _tool_results(message):
        name, arguments = calls.get(call_id, (str(message.get("name") or ""), None))
        error = (result if isinstance(result, str) else _json.dumps(result)) if is_error else None
        rows.append(("tool_call_end", _tool_content(
            call_id, name, arguments, result=result, status="failed" if is_error else "completed",
            outcome="failed" if is_error else "served", error=error,
        )))
    if not rows:  # no text, no tools (an empty reply, an image): the message still needs its row
        rows.append(("message", {"type": "text", "body": "", "role": role}))
    return rows


def _starts_exchange(message: Any) -> bool:
    """A user's own message (not one that only carries tool results) starts a new exchange."""
    return isinstance(message, dict) and message.get("role") == "user" and not _tool_results(message)


def _new_id() -> str:
    return os.urandom(16).hex()


_COLUMNS = (
    "id", "session_id", "idx", "type", "created_at", "correlation_id", "source_channel_id", "source_provider",
    "source_framework", "status", "content", "trace_id", "span_id",
)
_TOOL_COLUMNS = ("tool_name", "tool_call_id", "tool_status", "tool_outcome", "tool_duration_ms")


def _has_tool_columns(con: Any) -> bool:
    """Whether ``events`` has the tool fields as columns too (newer schemas): then they are
    filled, as the writer fills them; else the views read them from ``content``."""
    row = con.execute(
        "SELECT count(*) FROM duckdb_columns() WHERE database_name = current_database() AND schema_name = 'main' "
        "AND table_name = 'events' AND column_name = 'tool_outcome'"
    ).fetchone()
    return bool(row and row[0])


# -- the DuckDB store ------------------------------------------------------------------------


class DuckDBConversationStore:
    """Conversation histories kept in a loopscope store file, as part of its event log.

    ``path`` is the store file (default: the one loopscope is configured to write, else
    ``LOOPSCOPE_DB`` or ``./loopscope.duckdb``); it may be the very file the agent's
    recording goes to, and other processes can continue a conversation from it.

    ``save(id, messages)`` appends only what is new: when the stored history is a prefix
    of ``messages``, the messages after it. A history that was *rewritten* (compacted,
    edited, cut) is stored as a ``conversation`` marker row that keeps the common prefix,
    followed by the messages after that prefix, so ``get`` returns exactly the new list
    and the rows already in the log stay as they were. ``delete`` appends a tombstone
    marker: ``get`` returns None and ``list`` leaves the id out, until it is saved again.

    Each message becomes the rows loopscope's views show, in session = the conversation id:
    text as a ``message`` event (its role kept), each tool call an assistant message asks
    for as a ``tool_call_start`` event, each tool result (an OpenAI ``tool`` message, an
    Anthropic ``tool_result`` block) as a ``tool_call_end`` event. The first row of each
    message also carries the message itself, as JSON, so ``get`` gives back the list in
    the format it was saved in. Rows are written directly to the file (not as spans): the
    persistence policy does not filter them and they are not exported over OTLP.

    When the agent's turn was *recorded* in the same session already (an instrumented
    toolnexus client, or any adapter, writing to this file), a new message whose rows are
    all there (the same role and text, the same tool call ids) is not written a second
    time: one ``conversation`` row (``{"action": "message", "recorded": [indices]}``)
    carries the message and points at those rows, so timelines show each message once
    and tool statistics count each call once.

    Every method has a synchronous twin (``get_sync``, ...); the async ones run it in a
    worker thread.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        agent: str | None = None,
        framework: str | None = "conversation_store",
        lock_timeout: float = 10.0,
    ) -> None:
        self._reader = Store(str(path) if path is not None else None, lock_timeout=lock_timeout)
        self.path = self._reader.path
        self.agent = agent
        self.framework = framework
        self.lock_timeout = lock_timeout

    # -- reads -------------------------------------------------------------------------------

    def _history(self, conversation_id: str) -> _History:
        if not os.path.exists(self.path):
            return _History()
        return _replay(self._reader._session_query(conversation_id, _ROWS_SQL, [conversation_id]))

    def get_sync(self, conversation_id: str) -> list[Message] | None:
        """The history of ``conversation_id`` rebuilt from the log, or None."""
        history = self._history(conversation_id)
        return history.messages if history.live else None

    def list_sync(self) -> list[str]:
        """The stored, not deleted conversations, in the order they were first saved."""
        if not os.path.exists(self.path):
            return []
        _, rows = self._reader.sql(
            f"""
            SELECT session_id FROM (
                SELECT session_id, min(created_at) AS first_at, max(idx) AS last_idx,
                       max(idx) FILTER (WHERE type = '{CONVERSATION_EVENT}' AND (content->>'$.action') = 'delete') AS deleted_idx
                FROM events WHERE starts_with(id, '{ID_PREFIX}') GROUP BY session_id
            ) WHERE deleted_idx IS NULL OR last_idx > deleted_idx
            ORDER BY first_at, session_id"""
        )
        return [r[0] for r in rows]

    def get_conversation_sync(self, conversation_id: str, limit: int = 50, after_index: int | None = None) -> list[ActivityEvent]:
        """RoomKit's ``get_conversation`` over the live history: its ``message`` events,
        the most recent ``limit`` in ascending order, or with ``after_index`` the first
        ``limit`` after that index. Rows of a rewritten or deleted past are left out."""
        if limit < 0:
            raise ValueError("limit must not be negative")
        history = self._history(conversation_id)
        pointed = sorted({i for indices in history.linked for i in indices})
        recorded: dict[int, tuple[Any, ...]] = {}
        if pointed:
            sql = f"SELECT {_EVENT_COLUMNS} FROM events WHERE session_id = ? AND list_contains(?, idx){{span}} ORDER BY idx"
            recorded = {r[_IDX]: r for r in self._reader._session_query(conversation_id, sql, [conversation_id, pointed])}
        events = []
        for rows, indices in zip(history.rows, history.linked):
            for row in rows + [recorded[i] for i in indices if i in recorded]:
                if row[_TYPE] == "message":
                    events.append(_event(row))
        if after_index is not None:
            return [e for e in events if e.index > after_index][:limit]
        return events[-limit:] if limit else []

    # -- writes ------------------------------------------------------------------------------

    def save_sync(self, conversation_id: str, messages: Sequence[Any]) -> None:
        """Make ``messages`` the history of ``conversation_id``, appending only what is new."""
        plain = _plain(messages)
        self._flush_recording()  # what the agent recorded so far comes first in the log
        with open_store(self.path, read_only=False, timeout=self.lock_timeout) as con:
            migrate(con)
            con.execute("BEGIN TRANSACTION")
            try:
                history = _replay(_rows(con, conversation_id))
                stored = history.messages if history.live else []
                kept = 0
                while kept < min(len(stored), len(plain)) and stored[kept] == plain[kept]:
                    kept += 1
                records: list[tuple[str, dict[str, Any], str | None]] = []
                correlation = history.correlation_id if history.live else None
                if history.live and kept < len(stored):
                    # rewritten, not extended: keep the common prefix, then the new rest
                    records.append((CONVERSATION_EVENT, {"type": CONVERSATION_EVENT, "action": "rewrite", "kept": kept}, correlation))
                elif not history.live and not plain:
                    # an empty history is still a stored one (get gives [], not None)
                    records.append((CONVERSATION_EVENT, {"type": CONVERSATION_EVENT, "action": "rewrite", "kept": 0}, None))
                calls = {cid: (name, args) for m in plain if isinstance(m, dict) for cid, name, args in _tool_calls(m)}
                recorded = _Recorded(con, conversation_id, history.last_index) if kept < len(plain) else None
                for position in range(kept, len(plain)):
                    message = plain[position]
                    if correlation is None or _starts_exchange(message):
                        correlation = _new_id()
                    message_rows = _message_rows(message, calls)
                    link = recorded.find([_row_key(kind, content) for kind, content in message_rows]) if recorded else None
                    if link is not None:
                        # the agent's recording has this message's rows already: point at them
                        indices, correlation = link[0], link[1] or correlation
                        marker = {"type": CONVERSATION_EVENT, "action": "message", "recorded": indices,
                                  "conversation": {"position": position}, "message": message}
                        records.append((CONVERSATION_EVENT, marker, correlation))
                        continue
                    for number, (kind, content) in enumerate(message_rows):
                        content["conversation"] = {"position": position}
                        if number == 0:
                            content["message"] = message
                        records.append((kind, content, correlation))
                self._append(con, conversation_id, records)
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise

    def delete_sync(self, conversation_id: str) -> None:
        """Hide ``conversation_id`` from ``get`` and ``list`` with a tombstone row."""
        if not os.path.exists(self.path):
            return
        self._flush_recording()
        with open_store(self.path, read_only=False, timeout=self.lock_timeout) as con:
            migrate(con)
            con.execute("BEGIN TRANSACTION")
            try:
                history = _replay(_rows(con, conversation_id))
                if history.live:
                    marker = {"type": CONVERSATION_EVENT, "action": "delete"}
                    self._append(con, conversation_id, [(CONVERSATION_EVENT, marker, history.correlation_id)])
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise

    def _append(self, con: Any, conversation_id: str, records: Sequence[tuple[str, dict[str, Any], str | None]]) -> None:
        """Append rows to the session inside the caller's transaction, numbering them after
        its last index as the writer does (and keeping the session's counters)."""
        if not records:
            return
        row = con.execute("SELECT last_index FROM sessions WHERE session_id = ?", [conversation_id]).fetchone()
        last = int(row[0]) if row else 0
        now = datetime.now(timezone.utc)
        columns: list[str] = list(_COLUMNS)
        tool_columns = _has_tool_columns(con)
        if tool_columns:
            columns += _TOOL_COLUMNS
        values = []
        for number, (kind, content, correlation) in enumerate(records, start=1):
            value = [
                f"{ID_PREFIX}{_new_id()}", conversation_id, last + number, kind, now, correlation,
                self.agent, None, self.framework, "delivered", _json.dumps(content), None, None,
            ]
            if tool_columns:
                tool = kind in ("tool_call_start", "tool_call_end")
                value += [
                    content.get(key) if tool else None for key in ("tool_name", "tool_id", "status", "outcome", "duration_ms")
                ]
            values.append(value)
        con.executemany(f"INSERT INTO events ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})", values)
        if any(kind in ("tool_call_start", "tool_call_end") for kind, _, _ in records):
            # tool_stats's totals, as the writer keeps them (see tool_totals): from the rows
            # just inserted (their time bounds the scan to the row groups that hold them)
            inserted = f"SELECT * FROM ({tool_rows(tool_columns)}) WHERE session_id = ? AND idx > ? AND created_at = ?"
            for statement in tool_totals.batch_statements(inserted):
                con.execute(statement, [conversation_id, last, now])
        con.execute(
            """INSERT INTO sessions VALUES (?, ?, ?, ?)
               ON CONFLICT (session_id) DO UPDATE SET last_index = excluded.last_index,
                 first_at = least(sessions.first_at, excluded.first_at),
                 last_at = greatest(sessions.last_at, excluded.last_at)""",
            [conversation_id, last + len(values), now, now],
        )

    def _flush_recording(self) -> None:
        flush_own(resolve(self.path))

    # -- async -------------------------------------------------------------------------------

    async def get(self, conversation_id: str) -> list[Message] | None:
        """The history of ``conversation_id`` rebuilt from the log, or None."""
        return await asyncio.to_thread(self.get_sync, conversation_id)

    async def save(self, conversation_id: str, messages: Sequence[Any]) -> None:
        """Make ``messages`` the history of ``conversation_id``, appending only what is new."""
        await asyncio.to_thread(self.save_sync, conversation_id, messages)

    async def list(self) -> list[str]:
        """The stored, not deleted conversations, in the order they were first saved."""
        return await asyncio.to_thread(self.list_sync)

    async def delete(self, conversation_id: str) -> None:
        """Hide ``conversation_id`` from ``get`` and ``list`` with a tombstone row."""
        await asyncio.to_thread(self.delete_sync, conversation_id)

    async def get_conversation(self, conversation_id: str, limit: int = 50, after_index: int | None = None) -> list[ActivityEvent]:
        """RoomKit's ``get_conversation`` over the live history (see :meth:`get_conversation_sync`)."""
        return await asyncio.to_thread(self.get_conversation_sync, conversation_id, limit, after_index)
