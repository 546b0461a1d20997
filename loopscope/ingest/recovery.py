"""Closing the turns a dead process left open, at the next open of the store for writing.

The store keeps which writer opened which turn and tells whether a writer's process is
gone (:mod:`loopscope.storage.duckdb.recovery`); this module makes the rows a live shutdown
would have written for each such turn: a ``tool_call_end`` row with outcome ``unserved``
for each call whose start row has no end, then the turn summary, with loop end reason
``unfinished`` and :data:`~loopscope.storage.duckdb.recovery.RECOVERED_NOTE` as its error. They
go through the same span-to-row mapping as everything else (:mod:`.mapping`, fed plain
span records as the collector feeds it). All of it, and the removal of the dead writers'
open turns, is one transaction while the file is held, so two processes opening the
store at once do not both close a turn.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import duckdb

from .. import _json
from .. import semconv as a
from .._guard import logger
from .._segments import RESPONSE_SEGMENT_SEPARATOR
from ..storage.duckdb import values, writer
from ..storage.duckdb.recovery import NOTHING_TO_REPORT, OPEN_TURNS, RECOVERED_NOTE, WRITERS, owner_gone, sql_text
from ..storage.rows import END
from .mapping import facts_of
from .spans import Ctx, SpanRecord, Status


def recover(con: duckdb.DuckDBPyConnection) -> int:
    """Close the open turns of every writer whose process has provably ended; returns how
    many turns were closed. ``con`` holds the file for writing (migrated)."""

    # only the writers with open turns: the others' rows stay as they are (health.py reads
    # their counters), and are not looked up at every open
    writers = con.execute(
        f"SELECT writer_id, host, boot_id, pid_namespace, pid, process_start, writer_mode, app_pid, epoch_us(last_seen) "
        f"FROM {WRITERS} w WHERE EXISTS (SELECT 1 FROM {OPEN_TURNS} o WHERE o.writer_id = w.writer_id)"
    ).fetchall()
    dead = [row[0] for row in writers if owner_gone(*row[1:8])]
    if not dead:
        return 0
    # when each dead writer last wrote: its process was alive then, its open turns and calls
    # were still waiting (the latest time the file proves; a row's own time may be far older)
    last_seen = {row[0]: row[8] for row in writers}
    opened = con.execute(
        f"SELECT o.correlation_id, o.session_id, o.trace_id, epoch_us(o.started_at), o.writer_id FROM {OPEN_TURNS} o "
        "WHERE list_contains(?, o.writer_id) AND NOT EXISTS "
        "(SELECT 1 FROM turns t WHERE t.correlation_id = o.correlation_id AND t.session_id = o.session_id) "
        "ORDER BY o.started_at, o.correlation_id",
        [dead],
    ).fetchall()
    spans: list[tuple[int, Any]] = []
    closed: list[str] = []
    if opened:
        # the time bound (a second before the first open turn's first row) lets DuckDB
        # skip the row groups written before, by their created_at ranges
        rows = con.execute(
            "SELECT session_id, correlation_id, type, epoch_us(created_at), source_channel_id, source_provider, "
            "source_framework, content::VARCHAR, trace_id, span_id, id FROM events "
            "WHERE list_contains(?, session_id) AND list_contains(?, correlation_id) AND created_at >= to_timestamp(?) "
            "ORDER BY session_id, idx",
            [sorted({o[1] for o in opened}), sorted({o[0] for o in opened}), min(o[3] for o in opened) / 1e6 - 1.0],
        ).fetchall()
        rows = values.fill(con, rows, 10, 7)  # large contents whole (storage/duckdb/values.py)
        by_turn: dict[tuple[str, str], list[tuple[Any, ...]]] = {}
        for row in rows:
            by_turn.setdefault((row[1], row[0]), []).append(row)
        for correlation_id, session_id, trace_id, started_us, writer_id in opened:
            turn_rows = by_turn.get((correlation_id, session_id))
            if turn_rows:
                ended, span_id = _closing_spans(
                    correlation_id, session_id, trace_id, started_us, turn_rows, last_seen.get(writer_id)
                )
                spans += ended
                closed.append(span_id)
    facts = facts_of(spans)
    extra = [
        f"DELETE FROM {OPEN_TURNS} WHERE writer_id IN ({', '.join(map(sql_text, dead))})",
        # a dead writer's row stays while it has drops or failures to report (loopscope status), and a
        # writer process's always: its application's record of what it sent is set against what it wrote
        (f"DELETE FROM {WRITERS} WHERE writer_id IN ({', '.join(map(sql_text, dead))}) AND {NOTHING_TO_REPORT} "
         "AND coalesce(writer_mode, '') <> 'process'"),
    ]
    if closed:
        extra.append(
            f"UPDATE turns SET error = {sql_text(RECOVERED_NOTE)} WHERE loop_end_reason = 'unfinished' AND error IS NULL "
            f"AND span_id IN ({', '.join(map(sql_text, closed))})"
        )
    writer.write_batch(con, facts, extra=extra)
    if closed:
        logger.warning("loopscope: closed %d turn(s) left open by a process that ended (loop end reason unfinished)", len(closed))
    return len(closed)


def _ns(us: int) -> int:
    return int(us) * 1000


def _closing_spans(
    correlation_id: str,
    session_id: str,
    trace_id: str | None,
    started_us: int,
    rows: Sequence[tuple[Any, ...]],
    seen_us: int | None = None,
) -> tuple[list[tuple[int, Any]], str]:
    """The ended spans a live shutdown would have written for this turn, from its stored
    rows (in index order): its pending tool calls ended unserved, then its summary.

    They end when the writer last wrote (``seen_us``, its ``last_seen``), or at the turn's
    last row if that is later: the process was alive and the calls still waiting until
    then, and nothing in the file says how much longer (a call started in the writer's
    last batch gets the time that batch took to reach the file, not a guess)."""
    last_us = max(r[3] for r in rows)
    if seen_us is not None and seen_us > last_us:
        last_us = seen_us
    end = _ns(last_us)
    common: dict[str, Any] = {a.CONVERSATION_ID: session_id, a.TURN_ID: correlation_id}
    for key, column in ((a.AGENT_NAME, 4), (a.PROVIDER, 5), (a.FRAMEWORK, 6)):
        value = next((r[column] for r in rows if r[column]), None)
        if value:
            common[key] = value
    segments: list[str] = []
    current = ""
    rounds = tool_calls = 0
    in_tools = False
    starts: dict[str, tuple[Any, ...]] = {}
    ended: set[str] = set()
    turn_span: str | None = None
    for row in rows:
        kind, content = row[2], _content(row[7])
        if kind == "message":
            if content.get("role") == "assistant":
                current += str(content.get("body") or "")
                in_tools = False
            elif row[10].endswith("i"):  # the turn's input: written under the turn's own span
                turn_span = row[9]
        elif kind == "tool_call_start":
            # a tool call is a segment boundary (as Turn._close_segment); a run of tool rows is a round
            if current.strip():
                segments.append(current)
            current = ""
            if not in_tools:
                rounds += 1
                in_tools = True
            starts[row[9]] = row
        elif kind == "tool_call_end":
            ended.add(row[9])
            if content.get("outcome") != "unserved":
                tool_calls += 1
    if current.strip():
        segments.append(current)
    spans: list[tuple[int, Any]] = []
    for span_id, row in starts.items():
        if span_id in ended:
            continue
        content = _content(row[7])
        attributes = {
            a.OPERATION: a.OP_EXECUTE_TOOL, a.CONVERSATION_ID: session_id, a.TURN_ID: correlation_id,
            # the call's own agent, provider and framework, as its start row says
            **{key: row[column] for key, column in ((a.AGENT_NAME, 4), (a.PROVIDER, 5), (a.FRAMEWORK, 6)) if row[column]},
            a.TOOL_NAME: str(content.get("tool_name") or ""), a.TOOL_CALL_ID: str(content.get("tool_id") or ""),
            a.TOOL_OUTCOME: "unserved", a.TOOL_STATUS: "failed", a.TOOL_ERROR: RECOVERED_NOTE, a.ERROR_TYPE: "unserved",
        }
        if content.get("arguments") is not None:
            attributes[a.TOOL_CALL_ARGUMENTS] = _json.dumps(content["arguments"])
        context = Ctx(int(row[8], 16), int(span_id, 16))
        spans.append((END, SpanRecord(f"{a.OP_EXECUTE_TOOL} {attributes[a.TOOL_NAME]}", context, None,
                                               _ns(row[3]), max(end, _ns(row[3])), attributes, status=Status(2, RECOVERED_NOTE))))
    trace = trace_id or rows[0][8]
    if turn_span is None:  # no input row: an id of its own, the same every time
        turn_span = hashlib.sha256(f"{session_id}\x00{correlation_id}".encode()).hexdigest()[:16]
    response = RESPONSE_SEGMENT_SEPARATOR.join(segments)
    attributes = {
        a.OPERATION: a.OP_INVOKE_AGENT, **common,
        **a.turn_attributes("unfinished", _json.dumps(segments), rounds, tool_calls, False, "[]", None, response, "", None,
                            common.get(a.PROVIDER), {}),
    }
    agent = common.get(a.AGENT_NAME)
    name = f"{a.OP_INVOKE_AGENT} {agent}" if agent else a.OP_INVOKE_AGENT
    spans.append((END, SpanRecord(name, Ctx(int(trace, 16), int(turn_span, 16)), None,
                                           _ns(min(started_us, last_us)), end, attributes)))
    return spans, turn_span


def _content(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
