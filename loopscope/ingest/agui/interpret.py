"""What an AG-UI event stream says, as loopscope rows: messages, tool calls, state, turns.

A pure function of the events (and of what the store already holds, asked through two
callbacks), so a re-import of the same stream yields the same rows with the same ids.

* A text message (``TEXT_MESSAGE_START/CONTENT/END``, or a run of ``TEXT_MESSAGE_CHUNK``)
  becomes one ``message`` row when it ends.
* A tool call becomes a ``tool_call_start`` row at its ``TOOL_CALL_END`` (its arguments
  are complete then, and the tool runs from there) and a ``tool_call_end`` row at its
  ``TOOL_CALL_RESULT``, or at the tool message of a later run's input that answers it;
  a call never answered stays pending.
* ``STATE_SNAPSHOT`` / ``STATE_DELTA`` become ``state_snapshot`` / ``state_delta`` rows.
* A run (``RUN_STARTED`` .. ``RUN_FINISHED`` / ``RUN_ERROR``) becomes a turn summary:
  session = thread id (or the session asked for), correlation id = run id.

Chunk events are expanded as the TypeScript client's ``transformChunks`` does: a chunk
run stays open until an event of another kind (other than RAW, ACTIVITY_*,
REASONING_ENCRYPTED_VALUE, SUBAGENT_*) or a chunk of another id arrives.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ... import _json
from ...models import RESPONSE_SEGMENT_SEPARATOR, LoopEndReason
from ...storage import rows
from ..mapping import text_content
from .read import AguiFormatError, Received

__all__ = ["FRAMEWORK", "Interpretation", "PendingCall", "Segment", "interpret", "span_bytes", "trace_bytes"]

FRAMEWORK = "ag-ui"
"""The ``source.framework`` of every imported row."""

_NOT_CLOSING = frozenset({
    "RAW", "ACTIVITY_SNAPSHOT", "ACTIVITY_DELTA", "REASONING_ENCRYPTED_VALUE",
    "SUBAGENT_STARTED", "SUBAGENT_FINISHED", "SUBAGENT_ERROR",
})
"""Events that leave an open chunk run open (transformChunks passes them through)."""


def trace_bytes(session: str, run: str | None) -> bytes:
    """The trace id of a run's rows: derived, since no span ever existed."""
    return hashlib.blake2b(f"agui\0{session}\0{run or ''}".encode(), digest_size=16).digest()


def span_bytes(session: str, kind: str, key: str) -> bytes:
    """The span id of one row (a message, a tool call, a state event, a run)."""
    return hashlib.blake2b(f"agui\0{session}\0{kind}\0{key}".encode(), digest_size=8).digest()


@dataclass
class PendingCall:
    """A tool call whose start row exists (or will) and whose end row does not."""

    trace: bytes
    span: bytes
    name: str
    arguments: str | None
    started_us: int
    correlation_id: str | None


@dataclass
class Segment:
    """One run of the stream (with the events after its end, before the next run), the
    unit a re-import recognises as already stored."""

    session: str
    run_id: str | None
    items: list[Received] = field(default_factory=list)
    times: list[int | None] = field(default_factory=list)  # each event's own timestamp, µs


@dataclass
class Interpretation:
    """The rows of a stream, each tagged with the number of its segment."""

    segments: list[Segment]
    events: list[tuple[int, dict[str, Any]]]
    turns: list[tuple[int, dict[str, Any]]]
    unmatched_results: int = 0


@dataclass
class _Text:
    role: str
    parts: list[str]


@dataclass
class _Call:
    name: str
    parts: list[str]
    started: bool = False  # its start row was made


@dataclass
class _Run:
    session: str
    run_id: str | None
    parent: str | None
    started_us: int
    trace: bytes
    segments: list[str] = field(default_factory=list)
    thinking: list[str] = field(default_factory=list)
    tool_calls: int = 0
    rounds: int = 0
    in_round: bool = False
    unanswered: set[str] = field(default_factory=set)
    declared: list[dict[str, Any]] = field(default_factory=list)
    state_count: int = 0
    closed: bool = False


_REASONS = frozenset(r.value for r in LoopEndReason)

_RUN: Any = object()  # "the current run" for _Interpreter._row

LookupPending = Callable[[str, str], "PendingCall | None"]
SeenMessage = Callable[[str, bytes], bool]


def interpret(
    received: list[Received],
    session: str | None = None,
    *,
    lookup_pending: LookupPending | None = None,
    seen_message: SeenMessage | None = None,
    now_us: int | None = None,
) -> Interpretation:
    """The rows of a stream. ``lookup_pending(session, tool_call_id)`` finds a call started
    by an earlier import; ``seen_message(session, span_id)`` says whether a message row of
    that id is stored already (an input message seen before)."""
    return _Interpreter(session, lookup_pending, seen_message, now_us).walk(received)


def _times(received: list[Received], now_us: int | None) -> list[int]:
    """Every event's time in µs: its own timestamp (ms), else the one before it, else the
    first one of the stream, else the time of the import."""
    own = [r.event.timestamp * 1000 if r.event.timestamp is not None else None for r in received]
    first = next((t for t in own if t is not None), None)
    last = first if first is not None else (now_us if now_us is not None else time.time_ns() // 1000)
    out = []
    for t in own:
        if t is not None:
            last = t
        out.append(last)
    return out


class _Interpreter:
    def __init__(
        self, session: str | None, lookup: LookupPending | None, seen: SeenMessage | None, now_us: int | None
    ) -> None:
        self.override = session
        self.lookup = lookup
        self.seen = seen
        self.now_us = now_us
        self.segments: list[Segment] = []
        self.events: list[tuple[int, dict[str, Any]]] = []
        self.turns: list[tuple[int, dict[str, Any]]] = []
        self.pending: dict[tuple[str, str], PendingCall] = {}
        self.messages_made: set[tuple[str, bytes]] = set()
        self.unmatched = 0
        self.run_ids: set[tuple[str, str]] = set()
        self.ts = 0  # the time of the event at hand, µs
        self.where = ""  # and where it was in the input
        # per run
        self.run: _Run | None = None
        self.texts: dict[str, _Text] = {}
        self.calls: dict[str, _Call] = {}
        self.reasoning: dict[str, list[str]] = {}
        self.mode: tuple[str, str] | None = None  # the open chunk run: ("text" | "tool" | "reasoning", id)

    # -- the walk ------------------------------------------------------------------------

    def walk(self, received: list[Received]) -> Interpretation:
        times = _times(received, self.now_us)
        first_thread = next((r.event.thread_id for r in received if r.data["type"] == "RUN_STARTED"), None)
        for r, ts in zip(received, times):
            kind = r.data["type"]
            self.ts = ts
            self.where = r.where
            if kind == "RUN_STARTED":
                self._close_chunks()
                if self.run is not None and not self.run.closed:
                    self._end_run(None, ts)  # a run that never said how it ended
                self._start_segment(r)
            elif not self.segments:
                session = self.override or first_thread
                if session is None:
                    raise AguiFormatError(
                        r.where, f"{kind} before any RUN_STARTED, and no session was given to store it under"
                    )
                self.segments.append(Segment(session, None))
                self.run = _Run(session, None, None, ts, trace_bytes(session, None), closed=True)
            segment = self.segments[-1]
            segment.items.append(r)
            segment.times.append(r.event.timestamp * 1000 if r.event.timestamp is not None else None)
            if kind != "RUN_STARTED":
                if kind not in _NOT_CLOSING and not kind.endswith("_CHUNK"):
                    self._close_chunks()
                getattr(self, "_on_" + kind.lower(), _ignore)(r.event)
        self._close_chunks()
        if self.run is not None and not self.run.closed:
            self._end_run(None, times[-1])
        return Interpretation(self.segments, self.events, self.turns, self.unmatched)

    @property
    def number(self) -> int:
        return len(self.segments) - 1

    def _start_segment(self, r: Received) -> None:
        e = r.event
        session = self.override or e.thread_id
        if (session, e.run_id) in self.run_ids:
            raise AguiFormatError(
                r.where, f"run {e.run_id!r} of session {session!r} starts a second time in this stream"
            )
        self.run_ids.add((session, e.run_id))
        self.segments.append(Segment(session, e.run_id))
        self.run = _Run(session, e.run_id, e.parent_run_id, self.ts, trace_bytes(session, e.run_id))
        self.texts, self.calls, self.reasoning, self.mode = {}, {}, {}, None
        if e.input is not None:
            self._input(e.input)

    # -- rows ---------------------------------------------------------------------------

    def _row(self, code: int, span: bytes, trace: bytes | None = None, correlation: Any = _RUN, **values: Any) -> None:
        """Add an event fact; ``correlation`` defaults to the current run."""
        run = self.run
        assert run is not None
        row: dict[str, Any] = dict.fromkeys(rows.EVENT_FIELDS)
        row.update(
            code=code, trace_id=trace or run.trace, span_id=span, created_us=self.ts, session_id=run.session,
            correlation_id=run.run_id if correlation is _RUN else correlation, source_framework=FRAMEWORK, blocked=False,
        )
        row.update(values)
        self.events.append((self.number, row))

    def _message(self, message_id: str, role: str, body: str) -> None:
        run = self.run
        assert run is not None
        span = span_bytes(run.session, "message", message_id)
        self.messages_made.add((run.session, span))
        if role == "user":
            self._row(rows.INPUT_MESSAGE, span, body=body)
        elif role == "assistant":
            self._row(rows.ROUND_MESSAGE, span, body=body)
        else:  # system, developer: the content says who
            self._row(rows.ROUND_MESSAGE, span, body=body, content=text_content(body, role))

    def _tool_start(self, call_id: str, call: _Call) -> None:
        run = self.run
        assert run is not None
        call.started = True
        arguments = "".join(call.parts) or None
        span = span_bytes(run.session, "tool", call_id)
        self._row(rows.TOOL_START, span, tool_name=call.name, tool_id=call_id, arguments=arguments)
        self.pending[(run.session, call_id)] = PendingCall(run.trace, span, call.name, arguments, self.ts, run.run_id)
        run.unanswered.add(call_id)

    def _tool_end(self, call_id: str, result: Any, error: str | None = None) -> bool:
        run = self.run
        assert run is not None
        call = self.calls.get(call_id)
        if call is not None and not call.started:  # a result before TOOL_CALL_END: the arguments are all there is
            self._tool_start(call_id, call)
        pending = self.pending.pop((run.session, call_id), None)
        if pending is None and self.lookup is not None:
            pending = self.lookup(run.session, call_id)
        if pending is None:
            self.unmatched += 1
            return False
        run.unanswered.discard(call_id)
        failed = error is not None
        self._row(
            rows.TOOL_END, pending.span, pending.trace, pending.correlation_id,
            tool_name=pending.name, tool_id=call_id, arguments=pending.arguments, result=_result_text(result),
            tool_status="failed" if failed else "completed", outcome="failed" if failed else "served", error=error,
            duration_ms=round(max(0, self.ts - pending.started_us) / 1000, 3),
        )
        run.in_round = False  # the model's next output is a new round
        return True

    def _output(self) -> None:
        run = self.run
        assert run is not None
        if not run.in_round:
            run.rounds += 1
            run.in_round = True

    # -- the run's input and end ---------------------------------------------------------

    def _input(self, agent_input: Any) -> None:
        run = self.run
        assert run is not None
        run.declared = [
            {"name": t.name, "description": t.description, "parameters": t.parameters, "origin": "always"}
            for t in agent_input.tools or []
        ]
        for message in agent_input.messages or []:
            role = getattr(message, "role", None)
            if role == "tool":
                key = (run.session, message.tool_call_id)
                if key in self.pending or (self.lookup is not None and self.lookup(*key) is not None):
                    self._tool_end(message.tool_call_id, message.content, message.error)
            elif role == "user":
                span = span_bytes(run.session, "message", message.id)
                seen = (run.session, span) in self.messages_made or (self.seen is not None and self.seen(run.session, span))
                if seen:
                    continue
                body = _content_text(message.content)
                if body:
                    self._message(message.id, "user", body)

    def _end_run(self, event: Any, ts: int) -> None:
        run = self.run
        assert run is not None
        for message_id in list(self.texts):
            self._finish_text(message_id)
        for call_id, call in list(self.calls.items()):
            if not call.started:
                self._tool_start(call_id, call)
        for message_id in list(self.reasoning):
            self._finish_reasoning(message_id)
        run.closed = True
        kind = event.type.value if event is not None else None
        error = None
        outcome = getattr(getattr(event, "outcome", None), "type", None)
        pending_named = getattr(getattr(event, "outcome", None), "pending_tool_call_ids", None)
        if kind == "RUN_ERROR":
            assert event is not None  # kind is its type
            reason = "error"
            error = f"{event.code}: {event.message}" if event.code else event.message
        elif kind is None:
            reason = "unfinished"  # the stream ends inside the run
        elif outcome == "cancelled":
            reason = "cancelled"
        elif outcome == "interrupt" or run.unanswered or pending_named:
            reason = "unfinished"  # waiting for a person, or for tool results from the application
        elif not run.segments and not run.tool_calls:
            reason = "empty_response"
        else:
            reason = "completed"
        said = (getattr(event, "metadata", None) or {}).get("loopscope")
        if isinstance(said, dict) and said.get("loop_end_reason") in _REASONS:
            # a stream loopscope exported: the turn's own reason (a failed turn followed by
            # other runs ends in RUN_FINISHED there, as nothing may follow a RUN_ERROR)
            reason = said["loop_end_reason"]
            error = said.get("error") if isinstance(said.get("error"), str) else error
        usage, model, provider = _usage(getattr(event, "usage", None))
        turn: dict[str, Any] = dict.fromkeys(rows.TURN_FIELDS)
        turn.update(
            trace_id=run.trace,
            span_id=span_bytes(run.session, "run", run.run_id or ""),
            correlation_id=run.run_id,
            session_id=run.session,
            parent_correlation_id=run.parent,
            response_content=RESPONSE_SEGMENT_SEPARATOR.join(run.segments),
            segments=_json.dumps(run.segments),
            tool_calls_count=run.tool_calls,
            round_count=run.rounds,
            thinking=RESPONSE_SEGMENT_SEPARATOR.join(run.thinking),
            loop_end_reason=reason,
            latency_ms=round(max(0, ts - run.started_us) / 1000, 3),
            streaming=True,
            timestamp_us=ts,
            declared_tools=_json.dumps(run.declared),
            model=model,
            provider=provider,
            error=error,
            **usage,
        )
        self.turns.append((self.number, turn))

    def _on_run_finished(self, e: Any) -> None:
        if self.run is not None and not self.run.closed and self.run.run_id is not None:
            self._end_run(e, self.ts)

    _on_run_error = _on_run_finished

    # -- text messages ------------------------------------------------------------------------

    def _on_text_message_start(self, e: Any) -> None:
        role = e.role or "assistant"
        self.texts[e.message_id] = _Text(role, [])
        if role == "assistant":
            self._output()

    def _on_text_message_content(self, e: Any) -> None:
        if e.message_id not in self.texts:
            self._on_text_message_start(_Start(e.message_id))
        self.texts[e.message_id].parts.append(e.delta)

    def _on_text_message_end(self, e: Any) -> None:
        if e.message_id in self.texts:
            self._finish_text(e.message_id)

    def _finish_text(self, message_id: str) -> None:
        text = self.texts.pop(message_id)
        body = "".join(text.parts)
        if not body:
            return
        self._message(message_id, text.role, body)
        if text.role == "assistant":
            assert self.run is not None
            self.run.segments.append(body)

    def _on_text_message_chunk(self, e: Any) -> None:
        if self.mode is None or self.mode[0] != "text" or (e.message_id is not None and e.message_id != self.mode[1]):
            self._close_chunks()
        if self.mode is None:
            if e.message_id is None:
                raise AguiFormatError(self.where, "the first TEXT_MESSAGE_CHUNK of a message needs a messageId")
            self._on_text_message_start(_Start(e.message_id, e.role))
            self.mode = ("text", e.message_id)
        if e.delta is not None:
            self.texts[self.mode[1]].parts.append(e.delta)

    # -- tool calls ---------------------------------------------------------------------------

    def _on_tool_call_start(self, e: Any) -> None:
        assert self.run is not None
        self.calls[e.tool_call_id] = _Call(e.tool_call_name, [])
        self.run.tool_calls += 1
        self._output()

    def _on_tool_call_args(self, e: Any) -> None:
        call = self.calls.get(e.tool_call_id)
        if call is not None and not call.started:
            call.parts.append(e.delta)

    def _on_tool_call_end(self, e: Any) -> None:
        call = self.calls.get(e.tool_call_id)
        if call is not None and not call.started:
            self._tool_start(e.tool_call_id, call)

    def _on_tool_call_chunk(self, e: Any) -> None:
        other = e.tool_call_id is not None and self.mode is not None and e.tool_call_id != self.mode[1]
        if self.mode is None or self.mode[0] != "tool" or other:
            self._close_chunks()
        if self.mode is None:
            if e.tool_call_id is None or e.tool_call_name is None:
                raise AguiFormatError(
                    self.where, "the first TOOL_CALL_CHUNK of a call needs a toolCallId and a toolCallName"
                )
            self._on_tool_call_start(_Start(e.tool_call_id, name=e.tool_call_name))
            self.mode = ("tool", e.tool_call_id)
        if e.delta is not None:
            self.calls[self.mode[1]].parts.append(e.delta)

    def _on_tool_call_result(self, e: Any) -> None:
        self._tool_end(e.tool_call_id, e.content)

    # -- reasoning ------------------------------------------------------------------------------

    def _on_reasoning_message_start(self, e: Any) -> None:
        self.reasoning[e.message_id] = []
        self._output()

    def _on_reasoning_message_content(self, e: Any) -> None:
        self.reasoning.setdefault(e.message_id, []).append(e.delta)

    def _on_reasoning_message_end(self, e: Any) -> None:
        if e.message_id in self.reasoning:
            self._finish_reasoning(e.message_id)

    def _finish_reasoning(self, message_id: str) -> None:
        text = "".join(self.reasoning.pop(message_id))
        if text and self.run is not None:
            self.run.thinking.append(text)

    def _on_reasoning_message_chunk(self, e: Any) -> None:
        if self.mode is None or self.mode[0] != "reasoning" or (e.message_id and e.message_id != self.mode[1]):
            self._close_chunks()
        if self.mode is None:
            if e.message_id is None:
                raise AguiFormatError(self.where, "the first REASONING_MESSAGE_CHUNK of a message needs a messageId")
            self.reasoning[e.message_id] = []
            self._output()
            self.mode = ("reasoning", e.message_id)
        if e.delta is not None:
            self.reasoning[self.mode[1]].append(e.delta)

    def _close_chunks(self) -> None:
        mode, self.mode = self.mode, None
        if mode is None:
            return
        kind, key = mode
        if kind == "text" and key in self.texts:
            self._finish_text(key)
        elif kind == "tool" and key in self.calls and not self.calls[key].started:
            self._tool_start(key, self.calls[key])
        elif kind == "reasoning" and key in self.reasoning:
            self._finish_reasoning(key)

    # -- state ----------------------------------------------------------------------------------

    def _state(self, code: int, key: str, value: Any) -> None:
        run = self.run
        assert run is not None
        run.state_count += 1
        span = span_bytes(run.session, "state", f"{run.run_id or ''}\0{run.state_count}")
        content = ('{"snapshot":' if key == "snapshot" else '{"delta":') + _json.dumps(value) + "}"
        self._row(code, span, content=content)

    def _on_state_snapshot(self, e: Any) -> None:
        self._state(rows.STATE_SNAPSHOT, "snapshot", self._raw_field("snapshot"))

    def _on_state_delta(self, e: Any) -> None:
        self._state(rows.STATE_DELTA, "delta", self._raw_field("delta"))

    def _raw_field(self, name: str) -> Any:
        """A field as it arrived (not as the model re-serializes it)."""
        return self.segments[-1].items[-1].data.get(name)


@dataclass
class _Start:
    message_id: str
    role: str | None = None
    name: str | None = None

    @property
    def tool_call_id(self) -> str:
        return self.message_id

    @property
    def tool_call_name(self) -> str | None:
        return self.name


def _ignore(event: Any) -> None:
    """Events that make no row of their own (kept raw all the same)."""


def _content_text(content: Any) -> str:
    """A message's text: a string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    texts = [getattr(part, "text", None) for part in content or []]
    return "\n".join(t for t in texts if t)


def _result_text(content: Any) -> str | None:
    """A tool result as attribute text: a string as it is (JSON text stays JSON), content
    parts as their JSON."""
    if content is None or isinstance(content, str):
        return content
    return json.dumps([p.model_dump(mode="json", by_alias=True) for p in content], ensure_ascii=False)


_USAGE_KEYS = {
    "input_tokens": "input_tokens",
    "output_tokens": "output_tokens",
    "cached_input_tokens": "cache_read_input_tokens",
    "cache_write_input_tokens": "cache_creation_input_tokens",
    "reasoning_tokens": "reasoning_tokens",
}


def _usage(entries: Any) -> tuple[dict[str, int | None], str | None, str | None]:
    """A run's TokenUsage entries summed into loopscope's usage keys; the model and
    provider when the entries name one each."""
    totals: dict[str, int | None] = dict.fromkeys(_USAGE_KEYS.values())
    models: list[str] = []
    providers: list[str] = []
    for entry in entries or []:
        for theirs, ours in _USAGE_KEYS.items():
            value = getattr(entry, theirs, None)
            if value is not None:
                totals[ours] = (totals[ours] or 0) + value
        if entry.model and entry.model not in models:
            models.append(entry.model)
        if entry.provider and entry.provider not in providers:
            providers.append(entry.provider)
    return totals, ", ".join(models) or None, ", ".join(providers) or None
