"""What a writer had to drop or failed to write, kept in the store for ``loopscope status``.

Drops and failed writes happen in a process's memory; counted there only, they would be
gone with the process, and another process (``loopscope status``, a dashboard) could not
tell that the store misses rows. So each writer keeps its counters in its row of
``loopscope_writers`` (the table of storage/duckdb/recovery.py; migration ``m007_writer_counters`` adds the columns),
updated in the same transaction as a batch it writes (every batch that a flush waits for
or that follows a new loss or failure, else at most every
:data:`~loopscope.storage.duckdb.writer.REPORT_EVERY` seconds), and once more when it stops:
events and turns written, events dropped because the queue was full or because the file
stayed unwritable longer than the queue could hold, failed write attempts with the last
error and when, and what the OTLP exporter of the same process dropped or failed to send.

A failed write cannot be recorded in the file it failed to reach: it shows with the next
batch that gets through, or with the writer's last word when it stops. When even that
cannot be written (another process holds the file as the process exits, the disk is
full, a write that never ends at exit), the writer counts what the store's row lacks in a
small JSON file beside the store, :func:`beside_path` (``<store>.loopscope-lost.json``),
one entry per writer; ``loopscope status`` reads it and adds it to the store's counts
(:func:`read_beside`). Nothing ever folds it back or deletes it: delete it to forget.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..._guard import warn_once
from ..results import LOSS_COUNTERS
from . import store_file

if TYPE_CHECKING:
    import duckdb

WRITERS = "loopscope_writers"

COUNTER_COLUMNS = {
    "events_written": "BIGINT",
    "turns_written": "BIGINT",
    "dropped_queue_full": "BIGINT",
    "dropped_unwritable": "BIGINT",
    "excluded": "BIGINT",
    "failed_writes": "BIGINT",
    "last_error": "VARCHAR",
    "last_error_at": "TIMESTAMPTZ",
    "otlp_dropped": "BIGINT",
    "otlp_failed": "BIGINT",
    "queue_size": "BIGINT",
    "stopped_at": "TIMESTAMPTZ",
}
"""The columns migration ``m007_writer_counters`` adds to ``loopscope_writers``."""

NOTICE_COLUMNS = {
    "notices_sent": "BIGINT",
    "notices_refused": "BIGINT",
    "notices_failed": "BIGINT",
    "notices_off": "VARCHAR",
}
"""The columns migration ``m011_notice_counters`` adds: the start notices (OTLP log records,
loopscope/export/notices.py) the process's exporter sent, had refused or failed to send,
and why they were turned off for good (the endpoint takes no OTLP logs). No loss: the spans
carry all of it; they say why a collector saw turns and tools only when they ended."""

MODE_COLUMNS = {
    "writer_mode": "VARCHAR",
    "app_pid": "BIGINT",
}
"""The columns migration ``m012_writer_mode`` adds: where the writer runs (``thread``: in the
process that records, whose pid the row has; ``process``: a writer process of its own, the row's
pid, for the application ``app_pid``), so ``loopscope status`` says which writer a process ran."""


LOST_TURN_COLUMNS = {
    "turns_dropped_queue_full": "BIGINT",
    "turns_dropped_unwritable": "BIGINT",
}
"""The columns migration ``m015_lost_turns`` adds: the turn summaries (rows of ``turns``) a
writer dropped because its queue was full, or did not write, beside the events
(``dropped_queue_full``, ``dropped_unwritable``). Every loss is counted in the store's own
rows, events and turns, as a span lost before its mapping would have made them; before
m015 the two columns counted spans and rows of every table alike."""


REFUSED_COLUMNS = {
    "refused_requests": "BIGINT",
    "refused_spans": "BIGINT",
    "last_refused": "VARCHAR",
}
"""The columns migration ``m016_collector_refusals`` adds: the traces requests ``loopscope
collect`` refused whole (a bad payload, a body over ``--max-bytes``, more spans than
``--max-spans``), the spans of those whose spans were counted (over ``--max-spans``: a
refused request is not read further, so its rows are not known), and the last refusal's
status and reason. The sender was told (HTTP 4xx, gRPC ``INVALID_ARGUMENT``) and does not
send them again: what they carried is not in the store."""


def migration() -> list[str]:
    """The statements of ``m007_writer_counters``: the counters of each writer (see the module's docstring)."""
    return [f"ALTER TABLE {WRITERS} ADD COLUMN IF NOT EXISTS {name} {kind}" for name, kind in COUNTER_COLUMNS.items()]


def _add_columns(columns: dict[str, str]) -> list[str]:
    """The statements adding ``columns`` (name: SQL type) to the writers' table, each once."""
    return [f"ALTER TABLE {WRITERS} ADD COLUMN IF NOT EXISTS {name} {kind}" for name, kind in columns.items()]


def notice_migration() -> list[str]:
    """The statements of ``m011_notice_counters`` (:data:`NOTICE_COLUMNS`)."""
    return _add_columns(NOTICE_COLUMNS)


def mode_migration() -> list[str]:
    """The statements of ``m012_writer_mode`` (:data:`MODE_COLUMNS`)."""
    return _add_columns(MODE_COLUMNS)


def refused_migration() -> list[str]:
    """The statements of ``m016_collector_refusals`` (:data:`REFUSED_COLUMNS`)."""
    return _add_columns(REFUSED_COLUMNS)


def lost_turns_migration() -> list[str]:
    """The statements of ``m015_lost_turns`` (:data:`LOST_TURN_COLUMNS`)."""
    return _add_columns(LOST_TURN_COLUMNS)


def _text(value: str | None) -> str:
    return "NULL" if value is None else "'" + value.replace("'", "''") + "'"


def _time(seconds: float | None) -> str:
    return "NULL" if seconds is None else f"make_timestamptz({int(seconds * 1e6)})"


@dataclass
class Counters:
    """A writer's counters at one moment: what became of the rows given to it (written,
    dropped, failed to write) and what the OTLP exporter of its process lost.

    These count *rows*, at the store, and are kept in it (``loopscope_writers``) because
    a loss must outlive the process that saw it; and a collector's traces requests refused
    whole (:data:`REFUSED_COLUMNS`), in spans, as they were never read into rows. Its other
    counts of the requests it received (:class:`loopscope.ingest.otlp.routing.CollectorStats`)
    are only printed."""

    events_written: int = 0
    turns_written: int = 0
    dropped_queue_full: int = 0  # events
    dropped_unwritable: int = 0  # events
    excluded: int = 0
    failed_writes: int = 0
    last_error: str | None = None
    last_error_at: float | None = None  # seconds since the epoch
    otlp_dropped: int = 0
    otlp_failed: int = 0
    queue_size: int = 0
    notices_sent: int = 0
    notices_refused: int = 0
    notices_failed: int = 0
    notices_off: str | None = None  # why start notices were turned off for good
    turns_dropped_queue_full: int = 0
    turns_dropped_unwritable: int = 0
    refused_requests: int = 0  # a collector's traces requests refused whole (REFUSED_COLUMNS)
    refused_spans: int = 0  # the spans of those whose spans were counted
    last_refused: str | None = None

    def since(self, before: Counters | None) -> Counters:
        """What these counters add to ``before`` (the losses and failures; the written
        counts are left at 0): what a store row that holds ``before`` lacks."""
        base = before or Counters()
        return Counters(
            dropped_queue_full=self.dropped_queue_full - base.dropped_queue_full,
            dropped_unwritable=self.dropped_unwritable - base.dropped_unwritable,
            turns_dropped_queue_full=self.turns_dropped_queue_full - base.turns_dropped_queue_full,
            turns_dropped_unwritable=self.turns_dropped_unwritable - base.turns_dropped_unwritable,
            failed_writes=self.failed_writes - base.failed_writes,
            last_error=self.last_error,
            last_error_at=self.last_error_at,
            otlp_dropped=self.otlp_dropped - base.otlp_dropped,
            otlp_failed=self.otlp_failed - base.otlp_failed,
            queue_size=self.queue_size,
            refused_requests=self.refused_requests - base.refused_requests,
            refused_spans=self.refused_spans - base.refused_spans,
            last_refused=self.last_refused,
        )


def losses(counters: Counters) -> Counters:
    """``counters`` without what grows with every batch (rows written or excluded by the
    policy): two of them differ in what a writer's row must not leave behind."""
    return replace(counters, events_written=0, turns_written=0, excluded=0)


OtlpCounts = Callable[[], tuple[int, int]]
"""What the process's OTLP exporter dropped (its queue was full) and failed to send."""
NoticeCounts = Callable[[], tuple[int, int, int, str | None]]
"""The start notices the process's exporter sent, had refused, failed to send, and why they
are off for good (None while they are on)."""


class Report:
    """One writer's row in ``loopscope_writers``: made at its first batch, updated with each."""

    def __init__(self) -> None:
        self.writer_id = os.urandom(16).hex()
        self.started = time.time()
        self.otlp: OtlpCounts | None = None
        self.notices: NoticeCounts | None = None
        self.before_stop: Callable[[float | None], None] | None = None
        """Run (with the seconds left) before the writer's last counters are written: the
        pipeline lets its exporters finish their last sends there, so that what they
        count at exit is in the store."""
        self.persisted: Counters | None = None
        self.mode = "thread"
        """Where the writer runs: ``thread`` (in the process that records) or ``process``
        (a writer process of its own, for the application whose pid is :attr:`app_pid`)."""
        self.app_pid: int | None = None
        self._stored: set[str] = set()  # the ids whose row a committed batch made

    def stored(self, writer_id: str | None = None) -> None:
        """Note that a batch with :meth:`statements` for ``writer_id`` committed: the row is
        in the file, and later batches only update it (a statement fewer for each)."""
        self._stored.add(writer_id or self.writer_id)

    def has_row(self, writer_id: str | None = None) -> bool:
        """Whether a committed batch made the row ``writer_id`` (and it was not forgotten since)."""
        return (writer_id or self.writer_id) in self._stored

    def forget(self, writer_id: str | None = None) -> None:
        """The row ``writer_id`` may be gone from the file (its WAL was removed): the next
        :meth:`statements` make it again if so."""
        self._stored.discard(writer_id or self.writer_id)

    def statements(self, counters: Counters, writer_id: str | None = None, *, stopped: bool = False) -> list[str]:
        """SQL for the batch's transaction: upsert the row ``writer_id`` (this report's own,
        unless the writer's recovery tracker gave its row another id)."""
        wid = _text(writer_id or self.writer_id)
        update_only = (writer_id or self.writer_id) in self._stored
        values = {
            **_counts(counters),
            "stopped_at": "now()" if stopped else "NULL",
            "last_seen": "now()",
        }
        if update_only and self.persisted is not None:
            # the row holds what the last committed batch wrote (persisted), started_at
            # included: only what changed since is set (DuckDB binds each assignment
            # afresh at every batch: all of them cost ~1.2 ms, the two or three that
            # change ~0.5)
            before = _counts(self.persisted)
            assignments = ", ".join(f"{k} = {v}" for k, v in values.items() if before.get(k) != v)
            return [f"UPDATE {WRITERS} SET {assignments} WHERE writer_id = {wid}"]
        started = _time(self.started)
        # the recovery tracker's row says when the first batch was written: the writer started earlier
        assignments = ", ".join([f"{k} = {v}" for k, v in values.items()] + [f"started_at = least(coalesce(started_at, {started}), {started})"])
        update = f"UPDATE {WRITERS} SET {assignments} WHERE writer_id = {wid}"
        if update_only:
            return [update]
        from .recovery import this_process  # what tells this process from a later one with its pid

        me = this_process()
        columns = ["writer_id", "host", "boot_id", "pid_namespace", "pid", "process_start", "started_at", *values,
                   *MODE_COLUMNS]
        row = [wid, _text(me.host), _text(me.boot_id), _text(me.pid_namespace), str(me.pid), _text(me.start), started,
               *values.values(), _text(self.mode), "NULL" if self.app_pid is None else str(int(self.app_pid))]
        return [
            update,
            (
                f"INSERT INTO {WRITERS} ({', '.join(columns)}) SELECT {', '.join(row)} "
                f"WHERE NOT EXISTS (SELECT 1 FROM {WRITERS} WHERE writer_id = {wid})"
            ),
        ]


def _counts(counters: Counters) -> dict[str, str]:
    """The columns of a writer's row that hold ``counters``, as SQL values."""
    return {
        **{name: str(int(getattr(counters, name))) for name in (
            "events_written", "turns_written", "dropped_queue_full", "dropped_unwritable", "excluded",
            "failed_writes", "otlp_dropped", "otlp_failed", "queue_size",
            "notices_sent", "notices_refused", "notices_failed", *LOST_TURN_COLUMNS, "refused_requests",
            "refused_spans")},
        "last_error": _text(counters.last_error),
        "last_refused": _text(counters.last_refused),
        "notices_off": _text(counters.notices_off),
        "last_error_at": _time(counters.last_error_at),
    }


# -- reading it back -----------------------------------------------------------------------------


def has_counters(con: duckdb.DuckDBPyConnection, column: str = "dropped_queue_full") -> bool:
    """Whether the open file's ``loopscope_writers`` has the counters (``m007_writer_counters``;
    with ``column="notices_sent"``, the notice counters of ``m011_notice_counters``)."""
    row = con.execute(
        "SELECT count(*) FROM duckdb_columns() WHERE database_name = current_database() AND schema_name = 'main' "
        f"AND table_name = '{WRITERS}' AND column_name = ?", [column],
    ).fetchone()
    return bool(row and row[0])


def writers(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Every writer row with its counters and whether its process still runs
    (``alive``: ``"yes"``, ``"stopped"`` (it closed the store), ``"gone"`` (it ended
    without closing: killed), or ``"unknown"`` (another machine or pid namespace))."""
    if not has_counters(con):
        return []
    from .recovery import is_gone

    columns = {**COUNTER_COLUMNS, **NOTICE_COLUMNS, **MODE_COLUMNS, **LOST_TURN_COLUMNS, **REFUSED_COLUMNS}
    # a file from before m011_notice_counters (m012_writer_mode), read, never migrated, here,
    # has no notice counters (no writer modes): NULL
    selected = [*COUNTER_COLUMNS]
    for added, probe in ((NOTICE_COLUMNS, "notices_sent"), (MODE_COLUMNS, "writer_mode"),
                         (LOST_TURN_COLUMNS, "turns_dropped_queue_full"), (REFUSED_COLUMNS, "refused_requests")):
        present = has_counters(con, probe)
        selected += [name if present else f"NULL AS {name}" for name in added]
    fixed = ["writer_id", "host", "boot_id", "pid_namespace", "pid", "process_start", "started_at", "last_seen"]
    names = [*fixed, *columns]
    rows = con.execute(f"SELECT {', '.join([*fixed, *selected])} FROM {WRITERS} ORDER BY started_at, writer_id").fetchall()
    out = []
    for row in rows:
        record = dict(zip(names, row))
        for name, kind in columns.items():
            if kind == "BIGINT" and record[name] is None and name != "app_pid":
                record[name] = 0
        if record["stopped_at"] is not None:
            alive = "stopped"
        elif is_gone(record["host"], record["boot_id"], record["pid_namespace"], record["pid"], record["process_start"]):
            alive = "gone"
        elif record["host"] == socket.gethostname() and record["pid"] is not None and _exists(int(record["pid"])):
            alive = "yes"
        else:
            alive = "unknown"
        record["alive"] = alive
        out.append(record)
    return out


def _exists(pid: int) -> bool:
    if sys.platform == "win32":  # os.kill(pid, 0) would end the process there
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


# -- beside the store: what its own row could not take --------------------------------------------



def beside_path(store: str) -> str:
    """The JSON file beside ``store`` that counts what its writers lost and could not say in it."""
    return store + ".loopscope-lost.json"


LOCK_WAIT = 1.0
"""Seconds a writer waits for the lock of the file beside the store before giving up."""


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    """The beside file's lock, between the processes that write it (POSIX; elsewhere none)."""
    try:
        import fcntl
    except ImportError:  # Windows: writers of one store rarely end at the same moment
        yield
        return
    # never through a link planted at the name (see store_file)
    with os.fdopen(store_file.open_side(path + ".lock", os.O_WRONLY | os.O_CREAT | os.O_APPEND), "a") as handle:
        # each holder holds it for one small read and write; a holder that is stopped must
        # not hold the exit of this process hostage, so the wait is bounded (an OSError:
        # the entry is then not written, and the loss only logged)
        deadline = time.monotonic() + LOCK_WAIT
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def record_beside(store: str, writer_id: str, counters: Counters, *, note: str | None = None,
                  children: list[dict[str, Any]] | None = None) -> bool:
    """Set ``writer_id``'s entry in the file beside ``store`` to ``counters`` (what the
    writer's row in the store lacks; an entry with nothing in it is removed). ``note``
    says why (e.g. that recording to the store was off). ``children``: the writer processes
    of an application that ended unasked, each with the rows (events, turns) it was sent
    (``sent_events``, ``sent_turns``) and of this side's drops it was told to count
    (``forwarded_events``, ``forwarded_turns``): ``loopscope status`` sets them against
    that child's row in the store. False when it cannot be written either (a missing folder,
    a read-only disk, a full one that even the spare could not make room in): the loss is
    then only logged, and ``status`` shows the writer's row as one that ended without
    saying what it had not written."""
    path = beside_path(store)
    try:
        with _locked(path):
            entries = _read(path)
            entry: dict[str, Any] = {name: int(getattr(counters, name)) for name in LOSS_COUNTERS}
            if any(entry.values()) or note or children:
                me = _me()
                entry.update(host=me[0], pid=me[1], at=time.time(), queue_size=counters.queue_size,
                             last_error=counters.last_error, last_error_at=counters.last_error_at, note=note)
                if children:
                    entry["children"] = children
                entries[writer_id] = entry
            elif entries.pop(writer_id, None) is None:
                return True
            # readers see the old file or the new one, never half of one; a link planted at the
            # name (or at a temporary's) is refused, not written through: the loss is then logged
            write_side_file(path, json.dumps({"version": 2, "writers": entries}, separators=(",", ":")).encode())
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EEXIST, errno.EINVAL):  # a link (or other file) put at a name of ours
            warn_once(f"beside-link:{path}", "loopscope: %s: %s; the count of lost events beside the store is not "
                      "written (keep the store in a folder of your own)", exc.filename or path, exc.strerror)
        return False
    return True


SPARE_BYTES = 64 << 10
"""Bytes of the spare file kept beside the store (:func:`reserve_room`): what a writer frees
to write its record of a loss on a full disk (a record of a few writers takes ~1-2 KB)."""


def spare_path(store: str) -> str:
    """The spare file beside ``store`` (see :data:`SPARE_BYTES`)."""
    return beside_path(store) + ".spare"


def reserve_room(store: str) -> None:
    """Make the spare file beside ``store`` if it is not there (a writer does so once the
    store took its first batch: the disk had room then). Never raises: without a spare, a
    record on a full disk may fail, and ``status`` then says the writer ended unrecorded."""
    path = spare_path(store)
    try:
        if os.path.getsize(path) >= SPARE_BYTES:
            return
    except OSError:
        pass
    try:
        store_file.write_side(path, "\0" * SPARE_BYTES)  # written, not a sparse file: its blocks are the room kept
    except OSError:
        pass


def write_side_file(path: str, data: bytes) -> None:
    """Replace the file ``path`` with ``data`` atomically: readers see the old file or the new
    one, never half of one. On a full disk the spare beside it (:func:`reserve_room`) is
    removed to make room, and the write tried once more; a temporary file that could not be
    written whole is removed (an empty one must never stand for a record). The one place
    that writes the side files: the opening of the temporary file is what to harden."""
    for attempt in range(2):
        try:
            store_file.write_side(path, data.decode("utf-8"))  # never through a link (O_NOFOLLOW, O_EXCL)
            return
        except OSError as exc:
            spare = path + ".spare"
            if attempt or exc.errno in (errno.ELOOP, errno.EEXIST, errno.EINVAL) or not os.path.exists(spare):
                raise
            try:
                store_file.refuse_link(spare)
                os.unlink(spare)  # its room, for this record
            except OSError:
                raise exc from None


def read_beside(store: str) -> dict[str, dict[str, Any]]:
    """The entries of the file beside ``store``, by writer id (none when there is no file)."""
    return _read(beside_path(store))


def _read(path: str) -> dict[str, dict[str, Any]]:
    try:
        text = store_file.read_side(path)  # a link there is not followed (OSError)
        if text is None:
            return {}
        data = json.loads(text)
    except (OSError, ValueError):
        return {}  # unreadable or torn: os.replace never leaves it so; another tool may have
    writers = data.get("writers") if isinstance(data, dict) else None
    return {str(k): v for k, v in writers.items() if isinstance(v, dict)} if isinstance(writers, dict) else {}


def _me() -> tuple[str, int]:
    return socket.gethostname(), os.getpid()

