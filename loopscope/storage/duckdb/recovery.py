"""Turns left open by a process that died, closed the next time the store is opened for writing.

A process killed in the middle of a turn (SIGKILL, the OOM killer, a power cut) leaves
the turn's rows up to its last batch, and no summary. DuckDB lets processes take turns
writing one file, so a turn without a summary may just as well belong to a process that
is still in the middle of it. The in-process writer therefore keeps two small tables in
the same transaction as the rows (schema migration ``m006_open_turns``):

* ``loopscope_writers``: each writer with what tells its process apart from any later one
  (host, boot id, pid namespace, pid, and the process's start time in clock ticks from
  ``/proc/<pid>/stat``, so a reused pid is not taken for the writer);
* ``loopscope_open_turns``: each turn whose first row it wrote and whose summary it has
  not (inserted with the first row, deleted with the summary).

:func:`loopscope.ingest.recovery.recover` closes the open turns of writers whose process
is provably gone (:func:`is_gone`): on the same machine (boot and pid namespace), and
either no such pid, or one started at another time, or a zombie. Anything it cannot
prove (another host, another pid namespace, a platform without ``/proc`` where the pid
exists) is left open. A writer process of an application (``writer_mode`` ``process``)
counts as gone only once its application is too (:func:`owner_gone`): the application
starts another writer process when one dies, and its turns go on, their real ends still
to come to the new one. The closing rows go through the same span-to-row mapping as
everything else, which is why they are made in ingest: a ``tool_call_end`` row with
outcome ``unserved`` for each call whose start row has no end, then the turn summary,
with loop end reason ``unfinished`` and :data:`RECOVERED_NOTE` as its error. A dead
writer's row goes with them, unless it has drops or failures to report
(storage/duckdb/health.py keeps each writer's counters in its row).

Turns written by ``loopscope collect`` are never tracked: their writer is remote.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass
from typing import Any

from .. import rows

RECOVERED_NOTE = "the process ended before the turn did (recovered at next open)"
"""The ``error`` of a turn summary (and of its ``unserved`` tool calls) written by :func:`recover`."""

WRITERS, OPEN_TURNS = "loopscope_writers", "loopscope_open_turns"


# -- which process is this ---------------------------------------------------------------------


@dataclass(frozen=True)
class Process:
    """What identifies a process beyond its pid."""

    host: str
    boot_id: str | None
    pid_namespace: str | None
    pid: int
    start: str | None  # the start time in clock ticks since boot (Linux), else None


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _stat(pid: int) -> tuple[str, str] | None:
    """The state letter and the start time (clock ticks since boot) of ``pid``, from
    ``/proc/<pid>/stat``; None where it cannot be read."""
    text = _read(f"/proc/{pid}/stat")
    if text is None:
        return None
    fields = text[text.rfind(")") + 2:].split()  # the command name may hold spaces and parentheses
    return (fields[0], fields[19]) if len(fields) > 19 else None


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


_this: Process | None = None


def this_process() -> Process:
    """This process's identity (made again after a fork)."""
    global _this
    current = _this
    pid = os.getpid()
    if current is None or current.pid != pid:
        stat = _stat(pid)
        current = _this = Process(
            socket.gethostname(), _read("/proc/sys/kernel/random/boot_id"), _pid_namespace(), pid, stat[1] if stat else None
        )
    return current


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


def is_gone(host: str | None, boot_id: str | None, pid_namespace: str | None, pid: int | None, start: str | None) -> bool:
    """Whether the process a writer row names has provably ended."""
    me = this_process()
    if pid is None or host != me.host or sys.platform == "win32":  # os.kill(pid, 0) would end it there
        return False
    if boot_id and me.boot_id and boot_id != me.boot_id:
        return True  # the machine started again since
    if pid_namespace != me.pid_namespace:
        return False  # another container's pids: not ours to look up
    if pid == me.pid:
        return start is not None and me.start is not None and start != me.start
    if not _exists(pid):
        return True
    if start is None:
        return False  # the pid is taken, and nothing tells whether by the writer
    stat = _stat(pid)
    if stat is None:
        return False
    state, started = stat
    return started != start or state in ("Z", "X")  # another process with the pid, or a zombie


def owner_gone(
    host: str | None, boot_id: str | None, pid_namespace: str | None, pid: int | None, start: str | None,
    mode: str | None, app_pid: int | None,
) -> bool:
    """Whether the turns a writer row lists are provably abandoned: the writer's process is
    gone and, for a writer process of an application (``mode`` ``process``), the
    application too. Such a writer dies alone at times (the OOM killer): the application
    starts another and its turns go on, their real ends still to come. The application's
    start time is not kept, so a pid that is taken again leaves them open (unproven)."""
    if not is_gone(host, boot_id, pid_namespace, pid, start):
        return False
    if mode != "process" or app_pid is None:
        return True
    return is_gone(host, boot_id, pid_namespace, int(app_pid), None)


# -- the bookkeeping, in the writer's transaction -----------------------------------------------


def sql_text(value: str | None) -> str:
    """``value`` as an SQL string literal (NULL for None)."""
    return "NULL" if value is None else "'" + value.replace("'", "''") + "'"


_OPEN_SQL = f"""
INSERT INTO {OPEN_TURNS}
SELECT g.correlation_id, g.session_id, {{writer}}, g.trace_id, g.started_at, g.agent
FROM (
  SELECT correlation_id, session_id, any_value(lower(hex(trace_id))) AS trace_id, min(created_us) AS started_at,
    any_value(source_channel_id) AS agent
  FROM {rows.EVENTS_TABLE} WHERE correlation_id IS NOT NULL GROUP BY correlation_id, session_id
) g
WHERE NOT EXISTS (SELECT 1 FROM {OPEN_TURNS} o WHERE o.correlation_id = g.correlation_id AND o.session_id = g.session_id)
"""

_CLOSE_SQL = f"""
DELETE FROM {OPEN_TURNS} o USING {rows.TURNS_TABLE} t
WHERE o.correlation_id = coalesce(t.correlation_id, lower(hex(t.span_id))) AND o.session_id = t.session_id
"""


# The same statements over tables made here: the batch's turns to list, with their values,
# and the turns it ends. The statements above cost DuckDB 2-3 ms each to bind (a group by,
# any_value, hex, coalesce over the facts); these bind a plain anti join and a plain join.
_OPENED, _ENDED = "_loopscope_opened_turns", "_loopscope_ended_turns"
_OPEN_TABLE_SQL = (
    f"INSERT INTO {OPEN_TURNS} SELECT v.* FROM {_OPENED} v"
    f" ANTI JOIN {OPEN_TURNS} o ON o.correlation_id = v.correlation_id AND o.session_id = v.session_id"
)
_CLOSE_TABLE_SQL = (
    f"DELETE FROM {OPEN_TURNS} o USING {_ENDED} t WHERE o.correlation_id = t.correlation_id AND o.session_id = t.session_id"
)


def _opened_table(facts: rows.Facts, writer_id: str) -> Any:
    """The rows :data:`_OPEN_SQL` would list for ``facts`` (before its anti join): one per
    turn with event rows, with the first row's trace and agent where the SQL takes any
    row's (DuckDB's any_value is the first it reads), and the earliest time."""
    import pyarrow as pa

    groups: dict[tuple[Any, Any], list[Any]] = {}
    at = 0
    for batch in facts.events:
        sessions = facts.sessions[at:at + batch.num_rows]
        at += batch.num_rows
        for correlation, session, trace, created, agent in zip(
            batch.column("correlation_id").to_pylist(), sessions, batch.column("trace_id").to_pylist(),
            batch.column("created_us").cast(pa.int64()).to_pylist(), batch.column("source_channel_id").to_pylist(),
            strict=True,
        ):
            if correlation is None:
                continue
            group = groups.get((correlation, session))
            if group is None:
                groups[(correlation, session)] = [trace, created, agent]
                continue
            if group[0] is None:
                group[0] = trace
            if created is not None and (group[1] is None or created < group[1]):
                group[1] = created
            if group[2] is None:
                group[2] = agent
    keys, values = list(groups), list(groups.values())
    return pa.table({
        "correlation_id": pa.array([k[0] for k in keys], pa.string()),
        "session_id": pa.array([k[1] for k in keys], pa.string()),
        "writer_id": pa.array([writer_id] * len(keys), pa.string()),
        "trace_id": pa.array([None if v[0] is None else v[0].hex() for v in values], pa.string()),
        "started_at": pa.array([v[1] for v in values], pa.timestamp("us", tz="UTC")),
        "agent": pa.array([v[2] for v in values], pa.string()),
    })


def _ended_table(ended: set[tuple[Any, Any]]) -> Any:
    import pyarrow as pa

    pairs = list(ended)
    return pa.table({
        "correlation_id": pa.array([p[0] for p in pairs], pa.string()),
        "session_id": pa.array([p[1] for p in pairs], pa.string()),
    })


class Tracker:
    """The open-turn bookkeeping of one in-process writer.

    It knows which turns its rows in ``loopscope_open_turns`` are (it alone writes them), so
    a batch runs the insert only when it opens a turn that it does not also end, and the
    delete only when it ends a turn left open there: most turns start and end within one
    batch, and each statement costs a batch 2-3 ms (DuckDB plans it afresh every time)."""

    def __init__(self) -> None:
        self._process: Process | None = None
        self.writer_id: str | None = None  # its row in loopscope_writers, which health.Report keeps
        self._open = ""
        self._opened: set[tuple[Any, Any]] = set()  # (correlation id, session id) of its open rows, committed
        self._after: set[tuple[Any, Any]] | None = None  # what they are once the pending batch commits

    def statements(self, facts: rows.Facts, tables: Any = None) -> list[str]:
        """SQL for :func:`writer.write_batch`'s ``extra``: note the turns these facts open
        and end. With ``tables`` (what has ``register(name, table)``: the batch's
        :class:`writer.Tables`, or its connection) the statements read tables of those
        turns made and registered here; without, the facts' tables, which write_batch
        registers. The writer's
        own row (host, pid, start, last seen) comes from :meth:`health.Report.statements`
        in the same transaction, under :attr:`writer_id`, which is made here. Call
        :meth:`committed` once the batch is written."""
        process = this_process()
        if process is not self._process:  # first use, or a fork: the child is another writer
            self._process = process
            self.writer_id = os.urandom(16).hex()
            self._open = _OPEN_SQL.format(writer=sql_text(self.writer_id))
            self._opened = set()
        opened = self._opened
        started = _started(facts)
        ended = _ended(facts)
        inserting = not started <= opened | ended
        # the insert lists every started turn not listed yet, the ended ones too: the
        # delete then has those to remove as well
        listed = opened | started if inserting else opened
        out = []
        if inserting:
            if tables is not None:
                tables.register(_OPENED, _opened_table(facts, str(self.writer_id)))
            out.append(self._open if tables is None else _OPEN_TABLE_SQL)
        if not ended.isdisjoint(listed):
            if tables is not None:
                tables.register(_ENDED, _ended_table(ended))
            out.append(_CLOSE_SQL if tables is None else _CLOSE_TABLE_SQL)
        self._after = (opened | started) - ended
        return out

    def committed(self) -> None:
        """The batch of the last :meth:`statements` was written."""
        if self._after is not None:
            self._opened, self._after = self._after, None


def _started(facts: rows.Facts) -> set[tuple[Any, Any]]:
    """The (correlation id, session id) of the turns with event rows in ``facts``."""
    correlations: list[Any] = []
    for batch in facts.events:
        correlations += batch.column("correlation_id").to_pylist()
    # facts.sessions holds each event row's session id, in the same order
    return {key for key in zip(correlations, facts.sessions) if key[0] is not None}


def _ended(facts: rows.Facts) -> set[tuple[Any, Any]]:
    """The (correlation id, session id) of the turns whose summaries are in ``facts``, as
    :data:`_CLOSE_SQL` matches them (a turn without a correlation id goes by its span id)."""
    out: set[tuple[Any, Any]] = set()
    for batch in facts.turns:
        spans = batch.column("span_id").to_pylist()
        correlations = batch.column("correlation_id").to_pylist()
        sessions = batch.column("session_id").to_pylist()
        out.update(
            (correlation if correlation is not None else span.hex(), session)
            for correlation, span, session in zip(correlations, spans, sessions)
        )
    return out


# -- closing the turns of dead writers ----------------------------------------------------------


NOTHING_TO_REPORT = (  # a writer row without drops or failures to report (health.py)
    "coalesce(dropped_queue_full, 0) + coalesce(dropped_unwritable, 0) + coalesce(failed_writes, 0) "
    "+ coalesce(turns_dropped_queue_full, 0) + coalesce(turns_dropped_unwritable, 0) "
    "+ coalesce(otlp_dropped, 0) + coalesce(otlp_failed, 0) = 0"
)
