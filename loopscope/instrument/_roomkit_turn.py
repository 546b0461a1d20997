"""One RoomKit AI turn, assembled from what RoomKit reports of it, as a loopscope turn.

RoomKit tells a turn in three voices, each at its own time:

- its telemetry, as the turn runs: the ``llm.generate`` span (the turn), each
  generation's token counts (``roomkit.llm.*`` metrics), each tool's ``tool.<name>``
  span (when it ran);
- the rows it commits, a little later (``AFTER_BROADCAST``): each text segment, each
  tool call's start and end with its status, outcome and duration;
- ``ON_AI_RESPONSE``, once the loop ended: the turn's own summary.

:class:`RoomKitTurn` keeps what each voice said and makes the recorder's turn out of
it: the turn opens with the telemetry span, rounds and tool calls follow the rows
(timed by the telemetry), and the summary is RoomKit's. It ends once RoomKit's summary
and the turn's rows are in, or a short while after the loop ended if some never come.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from .._guard import guard
from ..models import LoopEndReason, ToolCall
from ..recorder.adapter import (
    ToolExecution,
    Turn,
    claim_call,
    current_turn,
    end_turn,
    open_turn,
    rounds_done,
    start_requested_call,
)

FRAMEWORK = "roomkit"
GRACE_SECONDS = 2.0
"""How long a turn whose loop ended waits for RoomKit's summary and its last rows."""

_REASONS = frozenset(r.value for r in LoopEndReason)


class LoopFailed(Exception):
    """RoomKit's loop ended on an error and reported no summary; the message is its telemetry's."""


@dataclass
class Generation:
    """One model call of the turn as the telemetry timed it."""

    start: int
    end: int
    usage: dict[str, int] | None = None
    tools: bool = False  # tool calls ran after it
    used: bool = False  # a round was made of it


class RoomKitTurn:
    """The facts of one RoomKit turn, and the recorder turn made of them."""

    def __init__(self, room_id: str, channel_id: str, correlation_id: str | None, input_text: str | None = None) -> None:
        self.room_id = room_id
        self.channel_id = channel_id
        self.correlation_id = correlation_id
        self.turn: Turn = open_turn(
            framework=FRAMEWORK,
            agent=channel_id,
            input=input_text,
            session_id=room_id,
            correlation_id=correlation_id,
            streaming=True,
        )
        self._turn_token: Any = None
        self.context_token: Any = None  # the adapter's own note of the turn in this context
        # generations, from the telemetry
        self.gens: list[Generation] = []
        self._boundary = time.time_ns()  # where the next generation may have started
        self._phase = "gen"  # "gen": one may be running; "done": one just ended; "tools"
        self._tool_spans: dict[str, str] = {}  # telemetry span id -> call id
        self._tool_started: dict[str, int] = {}  # call id -> when it began to run
        self._tool_names: dict[str, str] = {}  # call id -> the tool's name
        self._claimed: dict[str, ToolExecution] = {}  # calls an SDK adapter started
        # rows
        self._calls: dict[str, ToolExecution] = {}
        self._pending_text: str | None = None
        self._round_open = False  # a tool round's start rows are coming in
        self._round_saw_end = False
        self._rounds_made = 0
        self._sdk_rounds = False
        self.starts = self.ends = self.messages = 0
        self._seen: set[str] = set()  # the ids of the rows taken, from whichever path
        self.final_row = False
        # the end
        self.response: Any = None
        self.loop_status: str | None = None  # the llm.generate span's status once it ended
        self.loop_error: str | None = None
        self.finished = False
        self._timer: Any = None

    # -- the telemetry ---------------------------------------------------------------------

    def enter(self) -> None:
        """Inside the turn's loop: model calls an SDK adapter sees become its rounds."""
        self._turn_token = current_turn.set(self.turn)

    def leave(self) -> None:
        token, self._turn_token = self._turn_token, None
        if token is None:
            return
        try:
            current_turn.reset(token)
        except ValueError:  # left in another context than entered: clear it there
            if current_turn.get() is self.turn:
                current_turn.set(self.turn.parent)

    def usage_metric(self, counter: str, value: float) -> None:
        """A generation ended with these token counts (input first, then output)."""
        now = time.time_ns()
        if counter == "input_tokens" or not self.gens or self._phase != "done":
            start = self.gens[-1].end if self._phase == "done" and self.gens else self._boundary
            self.gens.append(Generation(start, now, {}))
            self._phase = "done"
        usage = self.gens[-1].usage
        if usage is not None:
            usage[counter] = int(value)

    def tool_started(self, span_id: str, name: str, call_id: str) -> None:
        now = time.time_ns()
        if self._phase == "gen":  # a generation that reported no usage ended here
            self.gens.append(Generation(self._boundary, now))
        if self._phase != "tools" and self.gens:
            self.gens[-1].tools = True
        self._phase = "tools"
        self._tool_spans[span_id] = call_id
        self._tool_started[call_id] = now  # a provider may use an id again in a later round
        self._tool_names[call_id] = name
        self._claim(name, call_id)

    def tool_name(self, call_id: str) -> str | None:
        """The name of the tool RoomKit runs (or ran) for ``call_id`` in this turn, if any."""
        return self._tool_names.get(call_id)

    def _claim(self, name: str, call_id: str) -> None:
        """Serve here a call an SDK adapter under the provider started with the model's
        response, before the next request could end it with less than RoomKit knows."""
        turn = self.turn
        if call_id not in self._claimed and turn.has_call(call_id):
            claimed = claim_call(turn, name, call_id)
            if isinstance(claimed, ToolExecution):
                self._claimed[call_id] = claimed

    def tool_ended(self, span_id: str) -> bool:
        if self._tool_spans.pop(span_id, None) is None:
            return False
        self._boundary = time.time_ns()
        return True

    def loop_ended(self, status: str, error_message: str | None = None) -> None:
        """The ``llm.generate`` span ended: the loop is over (ON_AI_RESPONSE may follow)."""
        now = time.time_ns()
        if self._phase == "tools" and status == "ok" or self._phase == "gen" and not self.gens:
            self.gens.append(Generation(self._boundary, now))  # a last generation without usage
        self._phase = "done"
        self.loop_status = status
        self.loop_error = error_message

    # -- the rows --------------------------------------------------------------------------

    def feed(self, row: Any) -> None:
        """Take one of the turn's rows (each once, in the order RoomKit committed them)."""
        if row.id in self._seen or self.finished:
            return
        self._seen.add(row.id)
        kind = str(row.type)
        if kind == "message":
            body = getattr(row.content, "body", None)
            if isinstance(body, str):
                self.message_row(body, "loop_end_reason" in (row.metadata or {}))
        elif kind == "tool_call_start":
            self.start_row(row.content)
        elif kind == "tool_call_end":
            self.end_row(row.content)

    def ran(self, call_ids: set[str]) -> bool:
        """Whether calls with these ids ran in this turn (telemetry saw one start; a call
        refused at its gate never runs)."""
        return not call_ids.isdisjoint(self._tool_started)

    def correlate(self, correlation_id: str) -> None:
        """RoomKit's id for the turn, learned from its first row when not before."""
        if correlation_id == self.correlation_id:
            return
        self.correlation_id = correlation_id
        self.turn.set_correlation_id(correlation_id)

    def message_row(self, body: str, final: bool) -> None:
        self.messages += 1
        self._close_tool_round()
        if self._pending_text is not None:  # text no call followed: a round of its own
            self._text_round(self._pending_text, last=False)
        self._pending_text = None
        if final:
            self.final_row = True
            self._text_round(body, last=True)
        else:
            self._pending_text = body

    def start_row(self, content: Any) -> None:
        self.starts += 1
        if not self._round_open or self._round_saw_end:
            self._close_tool_round()
            self._round(self._pending_text, self._next_gen(tools=True))
            self._pending_text = None
            self._round_open = True
        call_id = str(content.tool_id)
        self._claim(str(content.tool_name), call_id)  # one that never ran (refused at its gate)
        if call_id in self._claimed or call_id in self._calls:
            return
        call = ToolCall(id=call_id, name=str(content.tool_name), arguments=content.arguments)
        self._calls[call_id] = start_requested_call(self.turn, call, self._tool_started.get(call_id))

    def end_row(self, content: Any) -> None:
        self.ends += 1
        self._round_saw_end = True
        call_id = str(content.tool_id)
        execution = self._claimed.pop(call_id, None) or self._calls.pop(call_id, None)
        if execution is None:  # its start row never reached us (refused by a hook, say)
            call = ToolCall(id=call_id, name=str(content.tool_name), arguments=content.arguments)
            execution = start_requested_call(self.turn, call, self._tool_started.get(call_id))
        duration = content.duration_ms
        execution.report(
            arguments=content.arguments,  # as it ran: a BEFORE_TOOL_USE hook may have rewritten them
            outcome=content.outcome or ("served" if content.status == "completed" else "failed"),
            result=content.result,
            status=content.status,
            error=content.error,
            duration_ms=float(duration) if isinstance(duration, (int, float)) else None,
        )

    # -- rounds ----------------------------------------------------------------------------

    def _close_tool_round(self) -> None:
        self._round_open = self._round_saw_end = False

    def _next_gen(self, tools: bool) -> Generation | None:
        """The first generation no round was made of that fits: one tool calls followed
        (a tool round), or any (a text round); generations passed over become rounds of
        their own (a retried empty answer says nothing, and commits no row)."""
        for gen in self.gens:
            if gen.used:
                continue
            if tools and not gen.tools:
                gen.used = True
                self._round(None, gen)
                continue
            gen.used = True
            return gen
        return None

    def _text_round(self, text: str, last: bool) -> None:
        gen: Generation | None = None
        if last:
            unused = [g for g in self.gens if not g.used]
            for skipped in unused[:-1]:
                skipped.used = True
                self._round(None, skipped)
            if unused:
                gen = unused[-1]
                gen.used = True
        else:
            gen = self._next_gen(tools=False)
        self._round(text, gen)

    def _round(self, text: str | None, gen: Generation | None) -> None:
        turn = self.turn
        if self._sdk_rounds or rounds_done(turn) > self._rounds_made:
            # an SDK adapter under the provider recorded the model calls: they are the rounds
            self._sdk_rounds = True
            return
        self._rounds_made += 1
        if gen is None:
            now = time.time_ns()
            gen = Generation(now, now)
        turn.generation(text or None, usage=gen.usage or None, start_time=gen.start, end_time=gen.end)

    # -- the end ---------------------------------------------------------------------------

    def take_response(self, event: Any) -> None:
        self.response = event

    def rows_complete(self) -> bool:
        if self.final_row:
            return True
        response = self.response
        if response is None:
            return False
        return (
            self.messages >= len(response.segments)
            and self.ends >= self.starts
            and self.starts >= (response.tool_calls_count or 0)
        )

    def ready(self) -> bool:
        """Whether everything RoomKit will say of the turn has been said."""
        return self.response is not None and self.rows_complete()

    def finish(self) -> None:
        """End the recorder turn: rounds not made yet, calls without an end row, the summary."""
        if self.finished:
            return
        self.finished = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        with guard("roomkit turn end"):
            self.leave()
            if self._pending_text is not None:
                self._text_round(self._pending_text, last=True)
                self._pending_text = None
            for gen in self.gens:
                if not gen.used:
                    gen.used = True
                    self._round(None, gen)
            for execution in [*self._claimed.values(), *self._calls.values()]:
                execution.report(outcome="unserved", error="RoomKit recorded no end of this call")
            self._claimed.clear()
            self._calls.clear()
            response = self.response
            turn = self.turn
            if response is not None:
                reason = response.loop_end_reason
                turn.set_summary(
                    segments=list(response.segments),
                    tool_calls_count=response.tool_calls_count,
                    round_count=response.round_count,
                    usage=dict(response.usage),
                    loop_end_reason=reason if reason in _REASONS else None,
                    declared_tools=[_declared(t) for t in response.declared_tools],
                    thinking=response.thinking or "",
                    streaming=response.streaming,
                )
            elif self.loop_status in ("error", "cancelled"):
                # RoomKit reports no summary of a loop cut short: its span says how it ended
                turn.end(self.loop_status)
                if self.loop_status == "error":
                    end_turn(turn, None, LoopFailed(self.loop_error or "the loop raised"))
                    return
            end_turn(turn)

    def schedule(self, loop: Any, callback: Any) -> None:
        """Finish after the grace period unless done before."""
        if self._timer is None and not self.finished:
            self._timer = loop.call_later(GRACE_SECONDS, callback)


def _declared(tool: Any) -> dict[str, Any]:
    return {
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.parameters,
        "origin": getattr(tool, "origin", "always"),
    }

