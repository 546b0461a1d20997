"""Bare instrumented SDK loops: other instrumentations' model calls with no agent run
around them, stitched into turns as loopscope stitches SDK calls in-process
(:mod:`loopscope.recorder.stitch`).

The official GenAI openai instrumentation, OpenLLMetry's and OpenInference's record each
model call as a span of its own, usually a trace of its own: nothing names the loop.
What ties the calls of a loop together is what they say:

* by call id (content capture on): a response that asks for tools opens (or continues) a
  turn and starts those tool calls; a later request that carries results for those ids
  ends them (their arguments from the response, their results from the request) and joins
  that turn, whatever else arrives in between;
* by conversation (content capture on): a turn whose first request continues an ended
  turn's conversation (that turn's last request and answer are where it starts) joins that
  turn's session; only the boundary is compared, as in-process
  (:mod:`loopscope.recorder.conversations`); remembered at most ``max_conversations``, each
  for ``conversation_seconds`` after its last use;
* by position (content capture off: no messages, no ids): a call that finished asking for
  tools (its finish reason) waits in its process (the resource: ``service.instance.id``, else
  service, host and pid); the next call of that process that started after it ended joins
  it, when it is the only one waiting there (two loops at once in one process cannot be
  told apart: the next call then starts a turn of its own).

A turn ends with a response that asks for no tools (``completed``, or ``truncated`` at the
token limit), a failed call (``error``), or ``idle_seconds`` without a call (or the
collector's close: ``unfinished``, its unanswered tool calls ``unserved``). Memory is
bounded: past ``max_turns`` open turns the oldest ends as unfinished.

Rows are made as loopscope's own spans would give them: a synthetic ``invoke_agent``
(started with the first call: the user's input message; ended with the turn: its
summary), each call a ``chat`` (its model-call row, position in the turn, and the
assistant's text), each tool call an ``execute_tool`` started at the response that asked
for it and ended at the request that carried its result. Ids of the synthetic spans are
derived from the received ones, so a payload received twice gives the same rows. With
content off, the input message and each answer (a response that asked for no tools) are
kept as rows without text (:data:`loopscope.semconv.CONTENT_WITHHELD`).
"""

from __future__ import annotations

import collections
import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import semconv as a
from ..storage.rows import END, START
from .foreign import (
    ASKED_TOOLS,
    AgentRun,
    Chat,
    ToolCall,
    _failed,  # pyright: ignore[reportPrivateUsage]
    _indexed,  # pyright: ignore[reportPrivateUsage]
    _loads,  # pyright: ignore[reportPrivateUsage]
    _text,  # pyright: ignore[reportPrivateUsage]
    agent_attributes,
    chat_attributes,
    read_chat,
    session_of,
    tool_attributes,
)
from .spans import STATUS_ERROR, Ctx, Scope, SpanRecord, Status

DEFAULT_IDLE_SECONDS = 300.0
"""How long a stitched turn waits for its next model call (as in-process: recorder/stitch.py)."""
DEFAULT_MAX_TURNS = 10_000
DEFAULT_MAX_CONVERSATIONS = 10_000
DEFAULT_CONVERSATION_SECONDS = 3600.0

# finish reasons that say the model asked for tools (providers' and the GenAI conventions' spellings)
_ASKED_TOOLS = ASKED_TOOLS


def read_tool_results(span: Any) -> list[tuple[str, str | None]]:
    """The tool results a model call's request carries: ``(call id, result text)``, in order
    (the GenAI conventions' ``tool_call_response`` parts, OpenInference's and OpenLLMetry's
    flattened ``tool`` messages, the older ``gen_ai.tool.message`` events)."""
    attrs = span.attributes or {}
    out: list[tuple[str, str | None]] = []
    if a.INPUT_MESSAGES in attrs:
        for message in _loads(attrs[a.INPUT_MESSAGES]) or ():
            if not isinstance(message, dict):
                continue
            for part in message.get("parts") or ():
                if isinstance(part, dict) and part.get("type") == "tool_call_response" and part.get("id"):
                    out.append((str(part["id"]), _response_text(part.get("response", part.get("result")))))
    elif "llm.input_messages.0.message.role" in attrs:
        for message in _indexed(attrs, "llm.input_messages"):
            if message.get("message.role") == "tool" and message.get("message.tool_call_id"):
                out.append((str(message["message.tool_call_id"]), _text(message.get("message.content"))))
    elif "gen_ai.prompt.0.role" in attrs:
        for message in _indexed(attrs, "gen_ai.prompt"):
            if message.get("role") == "tool" and message.get("tool_call_id"):
                out.append((str(message["tool_call_id"]), _text(message.get("content"))))
    else:
        for event in getattr(span, "events", None) or ():
            if event.name == "gen_ai.tool.message":
                body = event.attributes or {}
                call_id = body.get("id") or body.get("tool_call_id")
                if call_id:
                    out.append((str(call_id), _text(body.get("content"))))
    return out


def _response_text(value: Any) -> str | None:
    """A tool result as text: a list of content blocks (the anthropic SDK's own spans give a
    ``tool_call_response`` the ``tool_result`` blocks sent, ``[{"type": "text", "text": ...}]``)
    as the text of its text blocks, anything else as :func:`_text` makes it."""
    if isinstance(value, list) and value and all(isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
                                                 for b in value):
        return "".join(b["text"] for b in value)
    return _text(value)


Message = tuple[str, str, str]  # (role, text, the call id a tool result answers)


def read_request(span: Any) -> list[Message]:
    """A model call's request messages, as (role, text, call id): what a conversation is
    recognised by (the GenAI conventions' ``gen_ai.input.messages``, OpenInference's
    ``llm.input_messages.N``, OpenLLMetry's older ``gen_ai.prompt.N``)."""
    attrs = span.attributes or {}
    out: list[Message] = []
    if a.INPUT_MESSAGES in attrs:
        for message in _loads(attrs[a.INPUT_MESSAGES]) or ():
            if isinstance(message, dict):
                parts = [p for p in message.get("parts") or () if isinstance(p, dict)]
                text = "".join(str(p.get("content") or _response_text(p.get("response")) or "") for p in parts)
                call = next((str(p.get("id")) for p in parts if p.get("type") == "tool_call_response"), "")
                out.append((str(message.get("role") or ""), text, call))
    elif "llm.input_messages.0.message.role" in attrs:
        for message in _indexed(attrs, "llm.input_messages"):
            out.append((str(message.get("message.role") or ""), str(message.get("message.content") or ""),
                        str(message.get("message.tool_call_id") or "")))
    elif "gen_ai.prompt.0.role" in attrs:
        for message in _indexed(attrs, "gen_ai.prompt"):
            out.append((str(message.get("role") or ""), str(message.get("content") or ""), str(message.get("tool_call_id") or "")))
    return out


def _flat(text: str) -> str:
    """An answer's text as the model sent it or as the loop sends it back (whitespace aside)."""
    return "".join(text.split())


def _ended_key(request: list[Message], answer: str) -> tuple[Any, ...] | None:
    """The key a turn leaves when it ends: where a request that continues it has its boundary."""
    if not request:
        return None
    return (len(request) + 1, request[0], request[-1], _flat(answer))


def _continued_key(request: list[Message]) -> tuple[Any, ...] | None:
    """The key of the ended turn a request continues: at its last assistant message."""
    for j in range(len(request) - 1, 0, -1):
        role, text, _ = request[j]
        if role == "assistant":
            return (j + 1, request[0], request[j - 1], _flat(text))
    return None


def _says_anything(span: Any, chat: Chat, results: list[tuple[str, str | None]]) -> bool:
    """Whether the call's messages were captured (else it can only be placed by position)."""
    return bool(chat.text or chat.tool_calls or chat.user_text or results or a.INPUT_MESSAGES in (span.attributes or {}))


def _process_of(resource: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """Which process sent a span, as far as its resource tells (None: it does not)."""
    instance = resource.get("service.instance.id")
    if instance:
        return ("instance", instance)
    pid = resource.get("process.pid")
    if pid is None:
        return None
    return ("pid", resource.get("service.name"), resource.get("host.name") or resource.get("host.id"), pid)


def _derived_id(*parts: Any) -> int:
    """A span id made from received ids (stable: a payload received again gives the same rows)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") or 1


@dataclass
class _Pending:
    name: str
    arguments: str | None
    span_id: int
    started: int  # ns: the end of the response that asked for it


@dataclass
class _Turn:
    trace_id: int
    span_id: int
    session: str
    framework: str | None
    started: int  # ns
    user_input: str | None
    content: bool
    process: tuple[Any, ...] | None
    chats: list[Chat] = field(default_factory=list)
    tools: list[ToolCall] = field(default_factory=list)
    rounds_with_tools: int = 0
    pending: dict[str, _Pending] = field(default_factory=dict)  # call id -> the call not answered yet
    waiting: bool = False  # the last response asked for tools without ids (content off)
    last_end: int = 0  # ns: the end of its latest model call
    touched: float = 0.0  # the clock's time of its latest model call

    @property
    def turn_id(self) -> str:
        return f"{self.span_id:016x}"


class Stitcher:
    """Stitches lone foreign model-call spans into turns; :meth:`add` returns the
    ``(kind, span)`` rows to write, in order (see the module's docstring)."""

    def __init__(self, *, idle_seconds: float = DEFAULT_IDLE_SECONDS, max_turns: int = DEFAULT_MAX_TURNS,
                 clock: Any = time.monotonic) -> None:
        self.idle_seconds = idle_seconds
        self.max_turns = max_turns
        self._clock = clock
        self._turns: collections.OrderedDict[int, _Turn] = collections.OrderedDict()  # by span id, least recent first
        self._calls: dict[str, _Turn] = {}  # pending call id -> its open turn
        self._waiting: dict[tuple[Any, ...], list[_Turn]] = {}  # process -> turns waiting by position
        # ended turns' boundaries -> (their session, when last used): a turn that continues a
        # conversation joins its session (as recorder/conversations.py does in-process)
        self._conversations: collections.OrderedDict[tuple[Any, ...], tuple[str, float]] = collections.OrderedDict()
        self.max_conversations = DEFAULT_MAX_CONVERSATIONS
        self.conversation_seconds = DEFAULT_CONVERSATION_SECONDS

    @property
    def open_turns(self) -> int:
        return len(self._turns)

    def add(self, record: SpanRecord, framework: str | None) -> list[tuple[int, Any]]:
        """One model-call span that belongs to no agent run: the rows it gives."""
        chat = read_chat(record)
        results = read_tool_results(record)
        content = _says_anything(record, chat, results)
        out: list[tuple[int, Any]] = []
        turn: _Turn | None = None
        for call_id, _ in results:
            owner = self._calls.get(call_id)
            if owner is not None:
                turn = owner
                break
        process = _process_of(record.resource)
        if turn is None and not content and process is not None:
            waiting = self._waiting.get(process)
            if waiting is not None and len(waiting) == 1 and waiting[0].last_end <= record.start_time:
                turn = waiting[0]
        if turn is None:
            turn = self._open(record, chat, framework, content, process, out)
        self._turns.move_to_end(turn.span_id)
        if turn.waiting:
            self._unwait(turn)
        # the results this request carries end their calls, at its start
        for call_id, result in results:
            pending = turn.pending.pop(call_id, None)
            if pending is None:
                continue
            self._calls.pop(call_id, None)
            out.append((END, self._tool_span(turn, call_id, pending, record.start_time, result, "served")))
        turn.chats.append(chat)
        turn.last_end = record.end_time
        turn.touched = self._clock()
        attrs = chat_attributes(record, chat, turn.session, turn.turn_id, None, turn.framework)
        attrs[a.CALL_POSITION] = len(turn.chats)
        attrs[a.REQUEST_STREAM] = chat.streaming
        source = record.attributes
        for key in (a.RESPONSE_ID, a.INPUT_MESSAGES, a.OUTPUT_MESSAGES):  # the model-call row's, as sent
            if key in source:
                attrs[key] = source[key]
        asked = bool(chat.tool_calls) or bool(set(chat.finish_reasons) & _ASKED_TOOLS)
        if not content and not asked and not chat.said:
            attrs[a.CONTENT_WITHHELD] = True  # the answer: a row without its text
        out.append((END, record.replace(attributes=attrs)))
        if _failed(record):
            out += self._close(turn, record.end_time, error=record)
            return out
        if chat.tool_calls:
            turn.rounds_with_tools += 1
            for call_id, name, arguments in chat.tool_calls:
                call_id = call_id or f"{_derived_id(record.context.span_id, name, len(turn.pending)):016x}"
                pending = _Pending(name, arguments, _derived_id(turn.trace_id, turn.span_id, call_id), record.end_time)
                turn.pending[call_id] = pending
                self._calls[call_id] = turn
                out.append((START, self._tool_span(turn, call_id, pending, None, None, None)))
        elif asked and not content and process is not None:
            turn.rounds_with_tools += 1
            turn.waiting = True
            self._waiting.setdefault(process, []).append(turn)
        else:  # an answer: the turn ends (calls it never answered: unserved, as in-process)
            if content and not session_of(record.attributes):
                self._remember(_ended_key(read_request(record), chat.text), turn.session)
            out += self._close(turn, record.end_time)
        while len(self._turns) > self.max_turns:
            oldest = next(iter(self._turns.values()))
            out += self._close(oldest, oldest.last_end, reason="unfinished")
        return out

    def expire(self) -> list[tuple[int, Any]]:
        """End the turns without a model call for ``idle_seconds``, as unfinished."""
        out: list[tuple[int, Any]] = []
        now = self._clock()
        for turn in [t for t in self._turns.values() if now - t.touched >= self.idle_seconds]:
            out += self._close(turn, turn.last_end, reason="unfinished")
        return out

    def drain(self) -> list[tuple[int, Any]]:
        """End every open turn, as unfinished (at the collector's close)."""
        out: list[tuple[int, Any]] = []
        for turn in list(self._turns.values()):
            out += self._close(turn, turn.last_end, reason="unfinished")
        return out

    # -- inside ------------------------------------------------------------------------------------

    def _open(self, record: SpanRecord, chat: Chat, framework: str | None, content: bool,
              process: tuple[Any, ...] | None, out: list[tuple[int, Any]]) -> _Turn:
        tid = record.context.trace_id
        session = session_of(record.attributes)
        if session is None and content:
            session = self._continues(_continued_key(read_request(record)))
        turn = _Turn(
            trace_id=tid,
            span_id=_derived_id(tid, record.context.span_id, "turn"),
            session=session or f"{tid:032x}",
            framework=framework,
            started=record.start_time,
            user_input=chat.user_text,
            content=content,
            process=process,
        )
        self._turns[turn.span_id] = turn
        attrs: dict[str, Any] = {a.OPERATION: a.OP_INVOKE_AGENT, a.CONVERSATION_ID: turn.session, a.TURN_ID: turn.turn_id}
        if framework:
            attrs[a.FRAMEWORK] = framework
        if chat.provider:
            attrs[a.PROVIDER] = str(chat.provider)
        if chat.user_text is not None:
            attrs[a.TURN_INPUT] = chat.user_text
        elif not content:
            attrs[a.CONTENT_WITHHELD] = True  # the user's input: a row without its text
        out.append((START, self._turn_span(turn, record.start_time, attrs)))
        return turn

    def _remember(self, key: tuple[Any, ...] | None, session: str) -> None:
        if key is None:
            return
        now = self._clock()
        keys = self._conversations
        keys[key] = (session, now)
        keys.move_to_end(key)
        while keys:
            _, (_, used) = next(iter(keys.items()))
            if len(keys) <= self.max_conversations and now - used <= self.conversation_seconds:
                break
            keys.popitem(last=False)

    def _continues(self, key: tuple[Any, ...] | None) -> str | None:
        if key is None:
            return None
        found = self._conversations.get(key)
        if found is None:
            return None
        now = self._clock()
        if now - found[1] > self.conversation_seconds:
            del self._conversations[key]
            return None
        self._conversations[key] = (found[0], now)
        self._conversations.move_to_end(key)
        return found[0]

    def _unwait(self, turn: _Turn) -> None:
        turn.waiting = False
        if turn.process is None:
            return
        waiting = self._waiting.get(turn.process)
        if waiting is not None:
            if turn in waiting:
                waiting.remove(turn)
            if not waiting:
                del self._waiting[turn.process]

    def _turn_span(self, turn: _Turn, end: int, attrs: dict[str, Any], status: Status | None = None) -> SpanRecord:
        return SpanRecord("invoke_agent", Ctx(turn.trace_id, turn.span_id), None, turn.started, max(end, turn.started), attrs,
                          status=status, instrumentation_scope=Scope("loopscope.stitched"))

    def _tool_span(self, turn: _Turn, call_id: str, pending: _Pending, end: int | None, result: str | None,
                   outcome: str | None) -> SpanRecord:
        tool = ToolCall(name=pending.name, call_id=call_id, arguments=pending.arguments, result=result,
                        outcome=outcome or "served", error="not executed before the turn ended" if outcome == "unserved" else None)
        attrs = tool_attributes(tool, call_id, turn.session, turn.turn_id, None, turn.framework)
        if outcome is not None:
            turn.tools.append(tool)
        if outcome == "unserved":
            attrs[a.TOOL_STATUS] = "failed"
        ended = pending.started if end is None else max(end, pending.started)
        return SpanRecord(f"execute_tool {pending.name}", Ctx(turn.trace_id, pending.span_id), Ctx(turn.trace_id, turn.span_id),
                          pending.started, ended, attrs, instrumentation_scope=Scope("loopscope.stitched"))

    def _close(self, turn: _Turn, end: int, reason: str | None = None, error: SpanRecord | None = None) -> list[tuple[int, Any]]:
        if self._turns.pop(turn.span_id, None) is None:
            return []
        if turn.waiting:
            self._unwait(turn)
        out: list[tuple[int, Any]] = []
        for call_id, pending in list(turn.pending.items()):
            self._calls.pop(call_id, None)
            out.append((END, self._tool_span(turn, call_id, pending, end, None, "unserved")))
        turn.pending.clear()
        status = None
        if error is not None:
            status = Status(STATUS_ERROR, getattr(error.status, "description", None))
        run = AgentRun(name=None, input=turn.user_input, output=None, session=turn.session, usage={}, model=None, provider=None)
        span = self._turn_span(turn, end, {}, status)
        if error is not None and a.ERROR_TYPE in (error.attributes or {}):
            span.attributes[a.ERROR_TYPE] = error.attributes[a.ERROR_TYPE]
        attrs = agent_attributes(span, run, turn.session, turn.turn_id, turn.framework, turn.chats, turn.tools, turn.rounds_with_tools)
        if reason is not None:
            attrs[a.LOOP_END_REASON] = reason
        out.append((END, span.replace(attributes=attrs)))
        return out


__all__ = ["DEFAULT_IDLE_SECONDS", "Stitcher", "read_tool_results"]
