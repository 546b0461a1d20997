"""Stitching: model calls seen one at a time become whole turns.

An adapter sees a hand-written loop only as a series of model calls. Each call is a
round; a response that asks for tools starts those calls (pending); a later request
that carries their results ends them and joins that turn, matched by call id so that
interleaved conversations stay apart; a response without tool calls ends the turn.
Inside ``with loopscope.turn(...)`` the calls join that turn instead, and inside
``with turn.round()`` they fill that round.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import _json

# Placing a model call and finishing it run on every recorded call: they keep a plain
# ``try`` and ``internal_error`` rather than ``with guard(...)``, because a try costs
# nothing until it fails while a with block makes two Python method calls every time (about
# 0.3 us a block measured, several per call: a tenth of a hand tool call's cost, see
# benchmarks/bench_tool_call.py).
from .._guard import guard, internal_error, warn_once
from .._json import result_value  # noqa: F401 - adapters import it from here
from .._otel_sdk import attach_span
from ..models import LoopEndReason
from ..semconv import UNSERVED_CUT
from . import settings
from .chunks import ChunkGaps
from .context import current_round, current_session, current_turn, last_stitched
from .conversations import Boundary, boundary, conversations
from .declared import tool_set
from .finish import finish_of
from .parts import genai_messages
from .records import ModelRequest, ModelResponse, ToolResult
from .turn import Round, Turn, anonymous_owners, call_owners, served_owners

if TYPE_CHECKING:
    from opentelemetry.trace import SpanContext

DEFAULT_IDLE_TIMEOUT = 300.0
MAX_OPEN_TURNS = 1_000
"""Stitched turns waiting for the results of their tool calls, at most. A program that never
answers a response's tool calls (a benchmark that scores the first answer, a crash between
calls) leaves each such turn open until the idle timeout: past this many, the one idle the
longest ends at once as unfinished, its calls unserved, and is counted (``cut``). Each open
turn holds its spans and its last call's request and answer (~10-20 KB with a small
conversation), so this bounds that memory to ~10-20 MB, whatever the timeout."""


class StreamClosed(Exception):
    """The application stopped reading a stream before it ended."""


@contextlib.contextmanager
def session(session_id: str) -> Iterator[str]:
    """Group the turns recorded inside the block under one conversation id (as text:
    ``session(12345)`` is the session ``"12345"``)."""
    if type(session_id) is not str:
        session_id = _json.to_text(session_id)
    token = current_session.set(session_id)
    try:
        yield session_id
    finally:
        current_session.reset(token)


class _Stitched:
    """The turns adapters opened that no ``with`` block owns, and their idle reaper."""

    def __init__(self) -> None:
        self.turns: weakref.WeakSet[Turn] = weakref.WeakSet()
        # an open turn is kept alive until it ends; in order of last activity, the oldest first
        self.strong: dict[Turn, None] = {}
        self.lock = threading.Lock()
        self.idle_timeout = DEFAULT_IDLE_TIMEOUT
        self.max_open = MAX_OPEN_TURNS
        self.cut = 0  # turns ended early because more than max_open waited
        self._reaper: threading.Thread | None = None
        self._wake = threading.Event()

    def add(self, turn: Turn) -> None:
        with self.lock:
            strong = self.strong
            strong[turn] = None
            if self._reaper is None:  # started once; a forked child starts its own (see below)
                self._reaper = threading.Thread(target=self._reap_loop, name="loopscope-stitch-reaper", daemon=True)
                self._reaper.start()
            if len(strong) <= self.max_open:
                return
            over: list[Turn] = []
            for oldest in strong:
                if len(strong) - len(over) <= self.max_open:
                    break
                over.append(oldest)
        self._cut(over)

    def touch(self, turn: Turn) -> None:
        """A call joined ``turn``: it is the most recently active now (the last to be cut)."""
        with self.lock:
            strong = self.strong
            if strong.pop(turn, 0) is None:
                strong[turn] = None

    def _cut(self, turns: list[Turn]) -> None:
        """End turns beyond :attr:`max_open`, counted; said once in the log."""
        if not turns:
            return
        for turn in turns:
            if not turn.ended:
                self.cut += 1
                turn._unserved_error = UNSERVED_CUT
            close_turn(turn, LoopEndReason.UNFINISHED)
        warn_once(
            "stitch-max-open",
            "loopscope: more than %d stitched turns waited for the results of their tool calls; the longest "
            "idle ended as unfinished, their calls unserved (counted in `loopscope status`)",
            self.max_open,
        )

    def _forked(self) -> None:
        """In a forked child: no thread came along, and the lock may be held by one that did not."""
        self.lock = threading.Lock()
        self._reaper = None

    def discard(self, turn: Turn) -> None:
        with self.lock:
            self.strong.pop(turn, None)

    def _reap_loop(self) -> None:
        while True:
            self._wake.wait(min(max(self.idle_timeout / 4, 0.05), 5.0))
            self._wake.clear()
            with guard("stitch reaper"):
                self.reap(time.monotonic() - self.idle_timeout)

    def reap(self, older_than: float | None = None) -> int:
        """End open turns idle since before ``older_than`` (all of them when None)."""
        with self.lock:
            stale = [t for t in self.strong if older_than is None or t.last_activity < older_than]
        for turn in stale:
            close_turn(turn, LoopEndReason.UNFINISHED)
        return len(stale)


stitched = _Stitched()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=stitched._forked)


def set_idle_timeout(seconds: float) -> None:
    """How long a turn may wait for the results of its tool calls before it ends unfinished."""
    stitched.idle_timeout = seconds
    stitched._wake.set()


def set_max_open(turns: int) -> None:
    """How many stitched turns may wait for the results of their tool calls at once (see
    :data:`MAX_OPEN_TURNS`); past it the one idle the longest ends as unfinished."""
    stitched.max_open = max(1, int(turns))
    with stitched.lock:
        over = list(stitched.strong)[: max(0, len(stitched.strong) - stitched.max_open)]
    stitched._cut(over)


def cut_turns() -> int:
    """Stitched turns ended before their idle timeout because more than the bound waited."""
    return stitched.cut


def close_turn(turn: Turn, reason: LoopEndReason | None = None, exc: BaseException | None = None) -> None:
    """End a stitched turn now: its unanswered calls as unserved."""
    if turn.ended:
        return
    if reason is not None:
        turn.end(reason)
    turn._finish(exc)
    stitched.discard(turn)


def close_all() -> None:
    """End every open stitched turn as unfinished (at flush and at exit)."""
    stitched.reap(None)


# at shutdown() and at exit (the pipeline's exit hook calls shutdown(), before anything closes the store)
settings.on_shutdown(close_all)


_NO_RESPONSE = ModelResponse()  # read only: a response that reports nothing


class ModelCall:
    """One model call as an adapter reports it: delta text, then finish, fail or abandon (once)."""

    __slots__ = ("_boundary", "_done", "_finding", "_owns_round", "_stitched", "round", "turn")

    def __init__(self, turn: Turn, rnd: Round, owns_round: bool, stitched_turn: bool) -> None:
        self.turn = turn
        self.round = rnd
        self._owns_round = owns_round
        self._stitched = stitched_turn
        self._done = False
        self._finding = False  # conversations are looked for: remember this call's turn when it ends it
        self._boundary: Boundary | None = None  # the request's, then

    def attach(self) -> object | None:
        """Make the call's ``chat`` span the current span (the SDK's own spans and HTTP
        spans nest under it); the token for :func:`~loopscope.recorder.adapter.detach`,
        or None when there is no span to attach."""
        span = self.round._span
        return attach_span(span) if span is not None else None

    def span_context(self) -> SpanContext | None:
        """The span context of the call's ``chat`` span (None if it has none): an SDK
        span the call stands in for takes it."""
        span = self.round._span
        return span.get_span_context() if span is not None else None

    def delta(self, text: str) -> None:
        """A chunk of streamed text."""
        if text:
            self.round.text_delta(text)

    def first_chunk(self) -> None:
        """A streamed chunk with no text (a tool call fragment): it still counts as the first."""
        rnd = self.round
        if rnd._first_chunk_ns is None:
            rnd._first_chunk_ns = time.monotonic_ns()

    def chunk_seen(self) -> bool:
        """Whether a streamed chunk has been reported (the time to first chunk is set)."""
        return self.round._first_chunk_ns is not None

    def date_first_chunk(self, monotonic_ns: int) -> None:
        """The first chunk reached the application at ``monotonic_ns`` (``time.monotonic_ns``),
        not when the adapter read it: a stream proxy that reads chunks in batches says so."""
        self.round._first_chunk_ns = monotonic_ns

    def chunk_times(self, stamps: Sequence[int], start: int = 0) -> None:
        """``stamps[start:]`` (``time.monotonic_ns``) are when the next streamed chunks reached the
        application, from the first output chunk on (the one that set the time to first
        chunk): a stream proxy says so a batch at a time. Kept, bounded, only while metrics
        record the gaps between them (:mod:`loopscope.recorder.chunks`)."""
        if settings.chunk_gaps is None:
            return
        rnd = self.round
        gaps = rnd._chunk_gaps
        if gaps is None:
            gaps = rnd._chunk_gaps = ChunkGaps()
        gaps.add(stamps, start)

    def finish(self, response: ModelResponse = _NO_RESPONSE) -> None:
        """The response is complete: end the round, start the calls it asked for, or end the turn."""
        if self._done:
            return
        self._done = True
        try:
            rnd = self.round
            rnd._adapter_response(
                response.provider_usage,
                response.text,
                response.tool_calls,
                response.usage,
                response.finish_reason,
                thinking=response.thinking,
                response_id=response.response_id,
                model=response.model,
                refusal=response.refusal,
                error=response.error,
                error_type=response.error_type,
                choices=response.choices,
            )
            if response.finish is not None:
                rnd.finish = finish_of(response.finish)
            if not self._owns_round:
                return  # the user's ``with turn.round()`` ends it
            rnd._finish(None)
            if not self._stitched:
                return
            if rnd.tool_calls:
                last_stitched.set(self.turn)
            else:
                close_turn(self.turn)
                if self._finding:  # a request that continues this answer joins its session
                    conversations.remember(self._boundary, rnd.text, self.turn.session_id, rnd.response_id)
        except Exception:
            internal_error("generation finish")

    def fail(self, exc: BaseException, response: ModelResponse = _NO_RESPONSE) -> None:
        """The call raised (or the stream broke): the round fails, a stitched turn ends.
        ``response``: what a stream said before it broke, as for :meth:`abandon`."""
        if self._done:
            return
        self._done = True
        with guard("generation fail"):
            if response is not _NO_RESPONSE:
                self._partial(response)
            if self._owns_round:
                self.round._finish(exc)
            if self._stitched:
                close_turn(self.turn, None, exc)

    def _partial(self, response: ModelResponse) -> None:
        """What a stream said before it ended early: its text came by :meth:`delta` already,
        and tool calls half read are no requests (none start)."""
        self.round._adapter_response(
            response.provider_usage,
            None,
            None,
            response.usage,
            response.finish_reason,
            thinking=response.thinking,
            response_id=response.response_id,
            model=response.model,
            choices=response.choices,
        )
        if response.finish is not None:
            self.round.finish = finish_of(response.finish)

    def abandon(self, response: ModelResponse = _NO_RESPONSE) -> None:
        """The stream was closed or dropped before its end: the turn was cut off.

        ``response``: what the stream said before it was let go (its id, model, usage so
        far, finish reasons seen): kept on the call, whose outcome is ``cancelled``."""
        if self._done:
            return
        self._done = True
        with guard("generation abandon"):
            rnd = self.round
            if response is not _NO_RESPONSE:
                self._partial(response)
            if self._owns_round:
                rnd.outcome = "cancelled"
                rnd._finish(StreamClosed("the stream was closed before it ended"))
            if self._stitched:
                close_turn(self.turn, LoopEndReason.CANCELLED)


def _anonymous_ids(results: Sequence[ToolResult]) -> list[str | None]:
    """The keys of the calls a request's results without an id answer, by position: the
    first such result answers the first call without an id of the response before it, and
    so on. That response is the latest one of this context's stitched turn, else the
    latest one of any turn, that asked for calls without an id."""
    turn = last_stitched.get()
    ids = anonymous_owners.get(turn) if turn is not None else None
    if not ids:
        # a copy (made at once, in C): another thread may add or end such a turn meanwhile
        waiting = [(t, ids) for t, ids in list(anonymous_owners.items()) if ids]
        ids = waiting[-1][1] if waiting else []
    out: list[str | None] = []
    for result in results:
        if result.call_id:
            out.append(result.call_id)
        else:
            out.append(ids.pop(0) if ids else None)
    return out


_RESULT_ITEMS = frozenset(("function_call_output", "custom_tool_call_output"))
"""OpenAI Responses input items that carry a tool's result."""


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


def _carries_results(message: Any) -> bool | None:
    """True for a message that carries tool results (a chat ``tool`` message, a Responses
    output item, an Anthropic user message with ``tool_result`` blocks), False for one
    the user wrote, None for any other."""
    role = _field(message, "role")
    if role == "tool" or _field(message, "type") in _RESULT_ITEMS:
        return True
    if role != "user":
        return None
    content = _field(message, "content")
    if isinstance(content, (list, tuple)):
        for block in content:  # Anthropic's results are a user message's blocks
            if _field(block, "type") == "tool_result":
                return True
    return False


def _spoke_after(messages: Sequence[Any]) -> bool:
    """Whether the request's last messages are the user's, right after tool results: the
    application sent those results along with a new question, not on their own, so the
    loop that asked for them had stopped (a round cap) and a new turn begins. Only the
    tail is read. A user message that also carries results (Anthropic's text blocks
    beside ``tool_result`` ones) continues the loop."""
    try:
        user = False
        for index in range(len(messages) - 1, -1, -1):
            said = _carries_results(messages[index])
            if said is False:
                user = True
                continue
            return user and said is True
    except Exception:
        internal_error("stitch boundary")
    return False


def start_model_call(request: ModelRequest) -> ModelCall | None:
    """Place one model call: end the tool calls whose results it carries, find its turn,
    open its round. Returns None only if loopscope itself failed (the call goes on).

    Inside an open round (``with turn.round()``, or a framework's model call that an
    adapter recorded as a round), the call fills that round. With
    ``request.caller_ends_turn`` a turn this call opens or joins is ended by the caller
    (a framework run that holds several model calls), not by this call's response."""
    try:
        owner: Turn | None = None
        results = request.tool_results
        if results:
            ids = _anonymous_ids(results) if anonymous_owners else [result.call_id for result in results]
            for result, call_id in zip(results, ids):
                if not call_id:
                    continue  # a result without an id, and no call without one waiting for it
                turn = call_owners.get(call_id)
                if turn is not None and turn.end_call(call_id, result.content, result.is_error):
                    owner = turn
                    continue
                served = served_owners.get(call_id)  # served by a decorated tool already
                if served is not None:
                    if result.is_error:
                        served.correct_call(call_id, result.content)  # its span ended served: a correction
                    if owner is None:
                        owner = served
        tools = request.tools
        if tools is not None:
            tools = tool_set(tools)  # normalised once for the turn and its round
        stream, parameters = request.stream, request.parameters
        # the kit's typed messages become the schema's dicts; dicts and JSON text stay as they are
        input_messages = genai_messages(request.input_messages)
        hand = current_turn.get()
        mine = current_round.get()
        if mine is not None and not mine.ended and not mine._turn.ended and (hand is None or mine._turn is hand):
            mine.eager = True
            if stream:
                mine._stream = True
            if parameters:
                mine.add_request(parameters)  # what the SDK sends, on the round it fills
            if input_messages is not None:
                mine.add_input_messages(input_messages)
            return ModelCall(mine._turn, mine, False, False)
        stitched_turn = False
        model, provider = request.model, request.provider
        if (
            owner is not None
            and hand is None
            and not owner.ended
            and request.messages
            and _spoke_after(request.messages)
        ):
            # the loop stopped with these results unsent and the user spoke again: the turn
            # was cut off there, and this request starts the next one, in its conversation
            close_turn(owner, LoopEndReason.CUT_OFF)
            session_id: str | None = owner.session_id
            owner = None
        else:
            session_id = None
        if hand is not None:
            turn = hand
        elif owner is not None and not owner.ended:
            turn = owner
            stitched_turn = True
            stitched.touch(turn)
        else:
            if session_id is None and current_session.get() is None:  # a ``loopscope.session()`` block wins
                session_id = settings.session
                if session_id is None and settings.find_conversations:
                    session_id = conversations.find(request.messages, request.previous_response_id)
            turn = Turn(
                settings.tracer(),
                session_id=session_id,
                agent=request.agent,
                tools=tools,
                input=request.input_text,
                input_blocked=False,
                model=model,
                provider=provider,
                framework=request.framework,
                correlation_id=None,
                streaming=stream,
            )
            turn._start(attach=False)
            stitched.add(turn)
            stitched_turn = True
        rnd = Round(turn, model, provider, tools, stream, parameters)
        if input_messages is not None:
            rnd.input_messages = input_messages
        rnd.eager = True
        rnd._start(attach=False)
        call = ModelCall(turn, rnd, True, stitched_turn and not request.caller_ends_turn)
        if settings.find_conversations and call._stitched:
            call._finding = True
            if request.messages:
                call._boundary = boundary(request.messages)
        return call
    except Exception:
        internal_error("begin generation")
        return None


def wants_result(call_id: str) -> bool:
    """Whether a tool result for ``call_id`` in a request would end or join anything: the
    call is open, or a decorated tool served it in a turn that is still open. Adapters read
    (and parse) only those results; :func:`start_model_call` ignores all others anyway.
    An empty ``call_id`` is wanted while a response's calls without an id wait: such a
    result is matched by its position among the request's results without an id."""
    if not call_id:
        return any(anonymous_owners.values())
    return call_id in call_owners or call_id in served_owners


def requested_call_span(call_id: str) -> Any:
    """The open ``execute_tool`` span of a call an adapter started that nothing has ended
    yet, or None: an SDK that runs the tool itself (a tool runner) runs it under this span."""
    from .tool import ToolExecution

    turn = call_owners.get(call_id)
    entry = turn._pending.get(call_id) if turn is not None else None
    call = entry[0] if entry is not None else None
    return call._span if isinstance(call, ToolExecution) else None
