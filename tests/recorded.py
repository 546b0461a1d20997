"""Reading back what a test recorded, in the shapes the adapter tests compare."""

from __future__ import annotations

import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loopscope import semconv as a


def rows(store: Any, session_id: str) -> list[tuple[Any, ...]]:
    """A session's timeline as plain tuples: messages ``(type, role, body)``, tool rows
    ``(type, name, id, arguments, result, status, outcome, error)``."""
    out = []
    for e in store.get_timeline(session_id):
        c = e.content
        if e.type == "message":
            out.append((e.type, c.role, c.body))
        else:
            out.append((e.type, c.tool_name, c.tool_id, c.arguments, c.result, c.status, c.outcome, c.error))
    return out


SUMMARY_FIELDS = {"response_content", "segments", "tool_calls_count", "round_count", "usage", "thinking",
                  "loop_end_reason", "streaming", "declared_tools", "model", "provider", "error"}
"""A turn summary's fields an adapter's recording must share with the hand API's, for the same conversation."""


def hand_tool_loop(session_id: str, *, model: str, provider: str, streaming: bool, tools: list[Any], question: str,
                   texts: tuple[str, str], usages: tuple[dict[str, int], dict[str, int]], stops: tuple[str, str],
                   result: Any, call_id: str = "", response_model: str | None = None) -> Any:
    """A two-round conversation through the hand API (``loopscope.turn``, ``Turn.round``,
    ``@loopscope.tool``), as an adapter should record it: the first round says ``texts[0]``
    and calls ``get_weather`` for Paris (id ``call_id``), the tool returns ``result``, the
    second round answers ``texts[1]``; each round with its usage, its stop reason and, when
    given, the model the response named. Returns the ``loopscope.Turn``."""
    import loopscope
    from loopscope.models import ToolCall

    @loopscope.tool("get_weather")
    def get_weather(city: str) -> Any:
        return result

    response = {} if response_model is None else {"model": response_model}
    with loopscope.turn(session_id=session_id, tools=tools, input=question, model=model, provider=provider) as t:
        with t.round(model, provider=provider, stream=streaming) as rnd:
            rnd.response(texts[0], [ToolCall(id=call_id, name="get_weather", arguments={"city": "Paris"})], usages[0],
                         stops[0], **response)
        get_weather("Paris")
        with t.round(model, provider=provider, stream=streaming) as rnd:
            rnd.response(texts[1], None, usages[1], stops[1], **response)
    return t


def only_turn(source: Any) -> Any:
    """The one turn summary of a store that should hold exactly one; given a test's
    recording (``recording``, ``instrumented``), of its store once flushed."""
    store = source
    if hasattr(source, "store"):
        import loopscope

        loopscope.flush()
        store = source.store
    turns = store.list_turns()
    assert len(turns) == 1, turns
    return turns[0]


def spans_of(recording: Any, operation: str) -> list[Any]:
    """The finished spans of one GenAI operation (``chat``, ``execute_tool``, ...)."""
    return [s for s in recording.spans() if s.attributes.get(a.OPERATION) == operation]


def assert_one_cancelled_call(recording: Any, then: Callable[[], object] | None = None) -> None:
    """One model call, its stream let go before its end: the call is ``StreamClosed`` and
    its turn ended ``cancelled``. ``then``: a later call, which must be a call and a turn of
    its own (nothing ends the first one again)."""
    import loopscope
    from loopscope import LoopEndReason

    loopscope.flush()
    [chat] = recording.spans(a.OP_CHAT)
    assert chat.attributes[a.ERROR_TYPE] == "StreamClosed"
    assert only_turn(recording.store).loop_end_reason == LoopEndReason.CANCELLED
    assert _model_calls(recording.store) == 1
    if then is not None:
        then()
        loopscope.flush()
        assert len(recording.spans(a.OP_CHAT)) == 2 and len(recording.store.list_turns(limit=None)) == 2
        assert _model_calls(recording.store) == 2


def assert_one_failed_call(recording: Any, error_type: str) -> Any:
    """One model call that failed with ``error_type`` (an HTTP error, a stream broken midway):
    its span is an error of that type, and its turn ended ``error``, saying so first. Returns
    the span, for a test's own checks."""
    from opentelemetry.trace import StatusCode

    import loopscope
    from loopscope import LoopEndReason

    loopscope.flush()
    [chat] = recording.spans(a.OP_CHAT)
    assert chat.status.status_code is StatusCode.ERROR and chat.attributes[a.ERROR_TYPE] == error_type
    turn = only_turn(recording.store)
    assert turn.loop_end_reason == LoopEndReason.ERROR and turn.error.startswith(error_type), turn.error
    return chat


WEATHER_SEGMENTS = ["Let me check the weather.", "It is 21 °C and sunny in Paris."]


def assert_hand_turn(recording: Any, response: Any, *, tool_spans: int | None = None) -> list[Any]:
    """The weather loop's two rounds (``fakes.weather_loop.queue_tool_round``'s replies) made
    inside ``loopscope.turn(session_id="hand", ...)``: ``response`` (the turn's) is one round,
    one tool call, completed, with both texts; both calls' spans are children of the turn's
    agent span (and ``tool_spans`` tool spans, when given); the session's timeline is the
    question, the first text, the tool call and the answer. Returns the timeline."""
    from loopscope import LoopEndReason

    assert (response.round_count, response.tool_calls_count, response.loop_end_reason) == (1, 1, LoopEndReason.COMPLETED)
    assert response.segments == WEATHER_SEGMENTS
    [agent] = recording.spans(a.OP_INVOKE_AGENT)
    chats = recording.spans(a.OP_CHAT)
    assert len(chats) == 2 and all(s.parent.span_id == agent.context.span_id for s in chats)
    if tool_spans is not None:
        assert len(recording.spans(a.OP_EXECUTE_TOOL)) == tool_spans
    events = recording.store.get_timeline("hand")
    assert [e.type for e in events] == ["message", "message", "tool_call_start", "tool_call_end", "message"]
    return events


def _model_calls(store: Any) -> int:
    _, [(count,)] = store.sql("SELECT count(*) FROM model_calls")
    return count


def everything_recorded(recording: Any) -> str:
    """All a recording kept, as text to search for what must not be there (a key, a header):
    every span's name, attributes, resource and events, and every row of every table of
    its store."""
    texts = []
    for span in recording.spans():
        texts += [span.name, repr(dict(span.attributes)), repr(span.resource.attributes)]
        texts += [repr((e.name, dict(e.attributes))) for e in span.events]
    store = recording.store
    _, tables = store.sql("SELECT table_name FROM information_schema.tables")
    assert tables
    for (table,) in tables:
        _, rows = store.sql(f'SELECT * FROM "{table}"')
        texts += [repr(row) for row in rows]
    return "\n".join(texts)


def assert_never_recorded(recording: Any, *secrets: str, present: tuple[str, ...] = ("get_weather",)) -> None:
    """What a test's calls sent and must not keep (keys, tokens, signatures, the names of the
    headers that carried them) is nowhere in what was recorded, in any case: no span, no row
    (:func:`everything_recorded`), and not in the store's file. ``present``: what must be
    there, so that the search searched something."""
    import loopscope

    loopscope.flush()
    everything = everything_recorded(recording)
    for text in present:
        assert text in everything, text
    found = (everything + recording.db.read_bytes().decode("latin-1")).lower()
    for secret in secrets:
        assert secret.lower() not in found, secret


def store_bytes(db: Path) -> bytes:
    """Every byte of the store's files (the WAL too, if one is left), once no writer holds rows
    for it: a writer process that outlived its application's close bound (a loaded machine)
    writes on, its holding FIFO beside the store until then. A FIFO is not read (opening one
    waits for a writer), nor a file that went meanwhile."""
    deadline = time.monotonic() + 60
    while any(".loopscope-holding." in p.name for p in db.parent.glob(db.name + "*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    found = []
    for path in sorted(db.parent.glob(db.name + "*")):
        try:
            if stat.S_ISREG(path.lstat().st_mode):
                found.append(path.read_bytes())
        except FileNotFoundError:
            continue
    return b"".join(found)


def connect_when_free(db: Path) -> Any:
    """A read-only DuckDB connection to ``db`` once no process holds it (60 s at most): a writer
    process left writing by its application's close bound (a loaded machine) may hold the file
    a moment after the application ended, and loopscope's own readers wait for it too."""
    import duckdb

    deadline = time.monotonic() + 60
    while True:
        try:
            return duckdb.connect(str(db), read_only=True)
        except duckdb.IOException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
