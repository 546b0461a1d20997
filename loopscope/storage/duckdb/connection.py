"""Short-lived connections to a store file, shared fairly between one writer and many readers.

DuckDB lets one process hold a file open for writing, and while it does no other
process can open it, not even read-only. So nobody keeps the file open: the writer
opens it for each batch and closes it again, readers open it for each query. A lock
met on the way is waited out briefly and retried; inside one process a lock per path
keeps our own writer and readers from colliding (DuckDB refuses two configurations of
one file in one process).

Readers do not start a DuckDB database of their own for each query: starting one costs
~15 ms (its catalog of built-in functions), more than a whole timeline page. They share
one in-memory database per process and ``ATTACH`` the store file read-only to it for the
query, ``DETACH`` after it (~1 ms): the file is still held only for the query.

A reader that reads often (``Store(keep_open=True)``, the dashboard) keeps the
attachment for the next read, for 50 ms idle at most, which saves the attach, the detach
and reading the blocks again. A writer that meets a held file leaves a marker beside it
(:func:`writer_marker`) while it retries; readers in every process see it before they
attach or reuse an attachment and let the writer go first, so a reader that never
pauses does not keep a writer out (before, a writer could wait out its whole lock
timeout against readers that read back to back).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import random
import re
import shlex
import stat
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from ..errors import StoreError, StoreLockedError
from ..recording import resolve  # noqa: F401  # re-exported: defined where configure() reads it without DuckDB
from . import store_file, values, wakeup
from .engine import duckdb

_gates: dict[str, threading.Lock] = {}
_gates_lock = threading.Lock()
_LOCK_MESSAGE = re.compile(r"(Could not set lock|Conflicting lock|database is locked)", re.IGNORECASE)
_PID = re.compile(r"PID (\d+)")


def gate(path: str) -> threading.Lock:
    """The in-process lock for one store file."""
    with _gates_lock:
        lock = _gates.get(path)
        if lock is None:
            lock = _gates[path] = threading.Lock()
        return lock


class Cancelled(StoreError):
    """A write block's owner gave up on it (``open_store(cancelled=)`` says so): no further
    DuckDB call is started for it. A store writer that ``close()`` left behind at exit must
    not be inside DuckDB when the interpreter finalises (see ``writer.StoreWriter._abandon``)."""


def is_lock_error(exc: BaseException) -> bool:
    return isinstance(exc, duckdb.Error) and bool(_LOCK_MESSAGE.search(str(exc)))


def _holder(exc: BaseException) -> tuple[str, str | None]:
    """Who holds the file, as DuckDB's lock error says (``process PID (its command
    line)`` where the command line can be read, else ``process PID`` or ``another
    process``), and the command line alone (None if unknown)."""
    match = _PID.search(str(exc))
    if match is None:
        return "another process", None
    command = command_line(int(match.group(1)))
    return f"process {match.group(1)}" + (f" ({command})" if command else ""), command


_COMMAND_CHARS = 200


def command_line(pid: int) -> str | None:
    """The command line process ``pid`` was started with (shell-quoted, cut to 200
    characters), or None where it cannot be read (not Linux, the process is gone, or
    not ours to read). DuckDB's lock error names only the holder's executable
    (``python3.12``), which does not tell a notebook from ``loopscope tail``."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    args = [a.decode(errors="replace") for a in raw.split(b"\0") if a]
    if not args:  # a kernel thread, or a zombie
        return None
    text = shlex.join(args)
    return text if len(text) <= _COMMAND_CHARS else text[: _COMMAND_CHARS - 3] + "..."


def _locked(path: str, exc: BaseException, timeout: float) -> StoreLockedError:
    holder, command = _holder(exc)
    # a holder named by its command line speaks for itself (it may be loopscope's own
    # tail or ui, mid-read); one we cannot name is most likely a program that keeps the
    # file open
    keeper = "a program that keeps the file open" if command else "a program that keeps the file open (a duckdb shell, a notebook)"
    return StoreLockedError(
        f"the loopscope store {path} is held by {holder} and was not released within "
        f"{timeout:g}s. loopscope's own writers and readers let go between batches; {keeper} "
        "blocks everyone else until it closes it."
    )


_aliases = itertools.count(1)
_T = TypeVar("_T")


# DuckDB draws a progress bar on stdout for a query that runs over two seconds, into the
# application's output (or a command's JSON): never for our connections
_NO_PROGRESS_BAR = "SET enable_progress_bar = false"


# Every DuckDB database loopscope opens (the shared ones store files are attached to, the
# isolated ones): no extension is loaded or installed by itself. DuckDB would otherwise fetch
# one over the network for a file it cannot read alone: a store path that is a SQLite file
# made the writer and every read command try to download ``sqlite_scanner`` (5-9 s, and a
# ~/.duckdb/extensions folder). What the store needs (json, parquet, icu) is built in.
_NO_EXTENSIONS: dict[str, str | bool | int | float | list[str]] = {
    "autoload_known_extensions": False,
    "autoinstall_known_extensions": False,
    "allow_community_extensions": False,
}


def scratch_database() -> duckdb.DuckDBPyConnection:
    """A new in-memory DuckDB database (that loads and installs no extension by itself)."""
    return duckdb.connect(":memory:", config=_NO_EXTENSIONS)


# What SQL that is not ours runs under (``open_store(isolated=True)``): DuckDB's own
# settings, locked, so that the SQL reads the store and nothing else. With external access
# off DuckDB opens no file but the database's own (the store, its WAL; DuckDB allows these
# paths itself) and its temporary folder, here none: COPY TO, EXPORT, read_text / read_csv /
# glob, ATTACH of another file, INSTALL and LOAD all fail with a PermissionException. The database itself is read-only, so nothing
# in it can be written and no in-memory database can be attached. There is no temporary
# folder: it would be a folder the SQL may write, where it could make a read-write
# database, USE it, DETACH the store and ATTACH the store again read-write (a query must
# fit in memory instead). The settings are locked once set (lock_configuration, after the
# session's own progress bar setting), so SET and RESET cannot undo them.
_SEALED_CONFIG: dict[str, str | bool | int | float | list[str]] = {  # duckdb.connect's config type
    "enable_external_access": False,
    **_NO_EXTENSIONS,
    "allow_persistent_secrets": False,
    "python_enable_replacements": False,  # a table name is never the caller's Python variable
    "temp_directory": "",
}
_SEAL = (_NO_PROGRESS_BAR, "SET lock_configuration = true")


class _Home:
    """An in-memory DuckDB that store files are attached to (a new one after a fork).

    Opening a DuckDB database costs 15-25 ms (its buffer manager, thread pool and catalog
    of functions), attaching a file to one that is open about 2 ms: readers and writers
    attach the file for a block and detach it after, so the file is held only meanwhile.

    ``settings`` are the database's own (run once, when it is made). Every statement run
    for a block costs the block twice: DuckDB's Python client takes the GIL back at each
    step of a statement, and while the application's threads run Python each of those
    waits out the switch interval (5 ms). So what is the same for every block is set once
    here, and a block's attach and detach are one call each (:func:`_attach_to`,
    :func:`_detach`)."""

    def __init__(self, settings: tuple[str, ...] = ()) -> None:
        self._lock = threading.Lock()
        self._settings = settings
        self._database: tuple[int, duckdb.DuckDBPyConnection] | None = None
        self.quiet: tuple[str, ...] = ()  # what a block's cursor needs to draw no progress bar
        # whether writes leave their rows in the WAL now (open_store's checkpoint); None
        # after a block whose attach failed midway: unknown, set again by the next
        self.keeps_wal: bool | None = False
        self.blocks = 0  # write blocks run on this database (renew_after)

    def database(self) -> duckdb.DuckDBPyConnection:
        with self._lock:
            if self._database is None or self._database[0] != os.getpid():
                database = scratch_database()
                for statement in self._settings:
                    if statement in _ALLOCATOR:
                        try:  # (newer DuckDB releases' settings: an older one runs without them)
                            database.execute(statement)
                        except duckdb.Error:
                            pass
                        continue
                    database.execute(statement)
                # the cursors of a Python database draw no progress bar (see _NO_PROGRESS_BAR);
                # should a version differ, every block turns it off
                probe = database.cursor()
                drawn = probe.execute("SELECT current_setting('enable_progress_bar')").fetchone()
                probe.close()
                self.quiet = (_NO_PROGRESS_BAR,) if drawn and drawn[0] else ()
                self.keeps_wal = False
                self._database = (os.getpid(), database)
            return self._database[1]

    def cursor(self) -> duckdb.DuckDBPyConnection:
        try:
            return self.database().cursor()
        except duckdb.ConnectionException:  # closed under us somehow: start a new one
            self.forget()
            return self.database().cursor()

    def forget(self) -> None:
        """Start a new database next time (this one closes with its last cursor)."""
        with self._lock:
            self._database = None
            self.blocks = 0

    def renew_after(self, blocks: int) -> None:
        """Count a write block that has ended (its file detached, its cursor closed); after
        ``blocks`` of them, close this database and start a new one at the next block.

        A DuckDB database keeps a little C++ memory for every file attached to it and
        written (outside its buffer manager and its allocator, so neither a purge nor
        ``memory_limit`` reaches it): ~10 KB a batch of the store's writer, ~35 KB in the
        writer process, where its glibc heap grew 16 -> 26 MB over 280 batches. Only closing
        the database gives it back. A new one costs ~17 ms CPU (see :data:`RENEW_AFTER`)."""
        with self._lock:
            self.blocks += 1
            if self.blocks < blocks or self._database is None:
                return
            database, self._database, self.blocks = self._database[1], None, 0
        try:
            database.close()  # no cursor of it is open: the caller's gate keeps other blocks out
        except duckdb.Error:
            pass


_readers = _Home()
"""Where reads attach store files (one for the process: reads attach read-only)."""
_page_readers = _Home(("SET threads = 1",))
"""Where reads of a few row groups attach them (``open_store(page=True)``): a timeline page.

On one DuckDB thread: a page reads one or two row groups, and a second thread only costs
its wake-ups and hand-offs. Measured (``bench_views.py``, 10M events, 2 shared cores): a
plain ``Store`` page 12.9 -> 11.5 ms CPU, 14.2 -> 12.3 ms wall, the attach and detach
alone 3.0 -> 2.4 ms. Reads that scan the file (the views, the dashboard's totals) keep
every thread (the dashboard's first page took 1.2x the wall time on one), unless they
reuse a page's kept attachment (:func:`_reusable`)."""
_writers: dict[str, _Home] = {}
_writers_lock = threading.Lock()
RENEW_AFTER = 100
"""Write blocks a writer's database (:func:`_writer_home`) runs before it is closed and a new
one made (:meth:`_Home.renew_after`): what DuckDB kept of each attach and write (C++ memory,
~10-35 KB a batch) is given back with it. Measured (2026-12-07, load ~28 on 2 shared cores,
one batch a flushed turn, the thread writer): glibc's heap in use 17.5 -> 19.7 MB over 200
batches kept, flat at 17.2-17.5 MB renewed every 64. A new database costs ~17 ms CPU: ~0.2 ms a
batch at 100, where a batch of the writer process costs several ms."""


# a commit checkpoints: its rows reach the file proper at once (a large batch skips the
# WAL), and a reader that attaches the file has no WAL to replay
_CHECKPOINT_AT_COMMIT = "SET checkpoint_threshold = '0b'"
_ALLOCATOR = ("SET allocator_flush_threshold = '8MiB'", "SET allocator_bulk_deallocation_flush_threshold = '8MiB'")
_WRITE_SETTINGS = (
    # DuckDB runs a write on one thread: a background writer leaves the other cores to the
    # application (beside a busy Python thread a second DuckDB thread made the statements
    # slower, not faster)
    "SET threads = 1",
    _CHECKPOINT_AT_COMMIT,
    # memory DuckDB's allocator keeps for reuse once a batch is done, per thread (128 MiB by
    # default) and after bulk frees (512 MiB): a writer's memory between its batches was mostly
    # this (benchmarks/bench_memory.py: the writer process 238-268 MB after 8,000 calls, growing,
    # against ~200 MB, flat, with these and Arrow's system allocator, see writer_process.CHILD_ENV).
    # Global settings: they hold for the process's other DuckDB databases too. No memory_limit:
    # a limit below a batch fails its commit ("failed to pin block"), and a batch is bounded by
    # queue_bytes already, which the application may raise
    *_ALLOCATOR,
)
# what open_store(checkpoint=False) switches to, and back
_KEEP_WAL = ("RESET checkpoint_threshold", "PRAGMA disable_checkpoint_on_shutdown")
_CHECKPOINT = (_CHECKPOINT_AT_COMMIT, "PRAGMA enable_checkpoint_on_shutdown")


def _writer_home(path: str) -> _Home:
    """Where writes attach ``path``: one per file, so that a schema query sees that file's
    tables alone, and the write settings touch no other file's writes."""
    with _writers_lock:
        home = _writers.get(path)
        if home is None:
            home = _writers[path] = _Home(_WRITE_SETTINGS)
        return home


def _sql_text(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


HOLD_IDLE = 0.05
"""Seconds a read's attachment stays for the next read of the same file (detached by a
background thread once idle this long)."""
HOLD_MAX = 0.5
"""Seconds an attachment is kept at most, however often it is read through."""
WRITER_YIELD = 0.25
"""Seconds a reader lets a waiting writer go first before attaching the file anyway."""
WRITER_SEEN = 0.01
"""Seconds at most before an attachment kept idle is let go for a writer that waits for the
file (the reaper looks for its marker this often while it keeps one)."""
_MARKER_FRESH = 2.0  # a writer refreshes its marker at every retry; an older one is stale


def file_identity(path: str) -> tuple[int, ...]:
    """What any write to the store changes: the device, inode, size and modification time
    of the file and of its WAL (-1 for a WAL that is not there). A reader that saw the
    same identity before reads the same file: the schema it checked then still holds. (A
    file system keeps mtimes to its clock's tick, a few ms on Linux: a write of the same
    size in the same tick as the one before it, between two reads, would go unseen until
    the next write.)"""
    identity: list[int] = []
    for name in (path, path + ".wal"):
        try:
            st = os.stat(name)
        except OSError:
            identity += (-1, -1, -1, -1)
        else:
            identity += (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    return tuple(identity)


def writer_marker(path: str) -> str:
    """The file a writer keeps beside the store while the file's lock keeps it waiting:
    readers (in any process) see it and let go of the file for the writer."""
    return path + ".loopscope-writer-waiting"


def writer_waiting(path: str) -> bool:
    """Whether a writer is waiting for ``path`` (a fresh marker; one left by a writer that
    died is ignored after a few seconds)."""
    try:
        st = os.lstat(writer_marker(path))
    except OSError:
        return False
    return not stat.S_ISLNK(st.st_mode) and time.time() - st.st_mtime < _MARKER_FRESH


def _mark_waiting(path: str) -> bool:
    """Create or refresh the writer's marker; False where it cannot be written."""
    try:
        store_file.touch_side(writer_marker(path))  # never through a link planted at the name
    except OSError:
        return False
    return True


class _Held:
    """A store file attached to a shared reader database (``home``), with its cursor."""

    __slots__ = ("alias", "attached_at", "cursor", "home", "pid", "used_at")

    def __init__(self, cursor: duckdb.DuckDBPyConnection, alias: str, home: _Home) -> None:
        self.cursor = cursor
        self.alias = alias
        self.home = home
        self.attached_at = self.used_at = time.monotonic()
        self.pid = os.getpid()


# Attachments kept between reads, by path. Each is used and changed only under the path's
# gate; a reaper thread detaches those idle for HOLD_IDLE.
_held: dict[str, _Held] = {}
_reaper_wake = threading.Condition()
_reaper_pid = 0
_reaper: threading.Thread | None = None
_closing = False
REAPER_STOP = 2.0
"""Seconds the exit waits for the reaper to finish a detach it is in."""


@atexit.register
def _release_all() -> None:
    # before the interpreter stops its threads: a daemon thread stopped inside DuckDB
    # aborts the process. The reaper may be inside a detach of an attachment it already took
    # out of _held: woken and waited for, within a bound
    global _closing
    _closing = True
    reaper = _reaper
    if reaper is not None and _reaper_pid == os.getpid():
        with _reaper_wake:
            _reaper_wake.notify_all()
        reaper.join(REAPER_STOP)
    for path in list(_held):
        with gate(path):
            release(path)


def _keep(path: str, held: _Held) -> None:
    global _reaper_pid, _reaper
    held.used_at = time.monotonic()
    _held[path] = held
    with _reaper_wake:
        if _reaper_pid != os.getpid():  # none yet, or it stayed behind in the parent of a fork
            _reaper_pid = os.getpid()
            _reaper = threading.Thread(target=_reap, name="loopscope-reader-reaper", daemon=True)
            _reaper.start()
        _reaper_wake.notify()


def _reap() -> None:
    """Detach the attachments idle for HOLD_IDLE, forever (a daemon thread)."""
    while not _closing:
        with _reaper_wake:
            while not _held and not _closing:
                _reaper_wake.wait(1.0)
            now = time.monotonic()
            due = min((h.used_at + HOLD_IDLE for h in list(_held.values())), default=now)
            if due > now and not any(writer_waiting(path) for path in list(_held)):
                # a writer of another process that finds the file held leaves its marker: seen
                # within WRITER_SEEN, not only once the attachment is idle
                _reaper_wake.wait(min(due - now, WRITER_SEEN))
                continue
        busy = False
        for path in list(_held):
            lock = gate(path)
            if _closing or not lock.acquire(blocking=False):
                busy = True  # a read of it is running: it keeps or drops the attachment itself
                continue
            try:
                held = _held.get(path)
                if held is not None and (time.monotonic() - held.used_at >= HOLD_IDLE or writer_waiting(path)):
                    release(path)
            finally:
                lock.release()
        if busy and not _closing:
            time.sleep(HOLD_IDLE / 5)


def release(path: str) -> None:
    """Detach the attachment kept for ``path``, if any. The caller holds ``gate(path)``."""
    held = _held.pop(path, None)
    if held is None or held.pid != os.getpid():  # a fork's copy belongs to the parent's database
        return
    _detach(held.cursor, held.alias, held.home)
    try:
        held.cursor.close()
    except duckdb.Error:
        pass


def _reusable(path: str) -> _Held | None:
    """The attachment kept for ``path`` if it may serve this read, else None (and it is
    let go: too old, or a writer is waiting for the file). Whichever database it is
    attached to: attaching again would cost more than a page's thread or a view's second
    one saves, and it is let go within :data:`HOLD_MAX` anyway."""
    held = _held.get(path)
    if held is None:
        return None
    if held.pid == os.getpid() and time.monotonic() - held.attached_at < HOLD_MAX and not writer_waiting(path):
        del _held[path]
        return held
    release(path)
    return None


def _yield_to_writer(path: str) -> None:
    """Let a writer that waits for the file go first: wait (briefly) for it to take the
    lock, which it marks by removing its marker."""
    deadline = time.monotonic() + WRITER_YIELD
    while writer_waiting(path) and time.monotonic() < deadline:
        time.sleep(0.002)


def _retrying(
    path: str, timeout: float, open_once: Callable[[], _T], *, writer: bool = False, cancelled: Callable[[], bool] | None = None
) -> _T:
    """``open_once()``, again while another process holds the file, for up to ``timeout``
    seconds; then :class:`StoreLockedError` naming who holds it. A ``writer`` keeps its
    marker (:func:`writer_marker`) beside the file meanwhile, so that readers let go. Once
    ``cancelled()`` is true, no further try: :class:`Cancelled`."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    marked = False
    try:
        while True:
            if cancelled is not None and cancelled():
                raise Cancelled(f"the write to {path} was given up")
            try:
                return open_once()
            except duckdb.Error as exc:
                if not is_lock_error(exc):
                    raise StoreError(_not_a_store(path) or f"cannot open the loopscope store {path}: {exc}") from exc
                if time.monotonic() >= deadline:
                    raise _locked(path, exc, timeout) from None
                if writer:
                    marked = _mark_waiting(path) or marked
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 0.1)
    finally:
        if marked:
            with contextlib.suppress(OSError):
                os.unlink(writer_marker(path))


ROW_GROUP_SIZE = 2048
"""Rows a row group holds in what a write appends (DuckDB's least; 122,880 by default),
in a store that holds large values in parts (storage/duckdb/values.py). DuckDB rewrites a table's
last row group whole at each checkpoint and holds its values meanwhile, so a writer's
memory grows with the bytes one row group holds: 2,048 parts are 8 MiB at most. An option
of the attach, not kept in the file, for every table of it: a store without parts (most)
keeps DuckDB's default, as its reads are 1.2-1.7x as slow in row groups of 2,048 rows
(``benchmarks/bench_row_groups.py``)."""

_parted: set[str] = set()
"""Store files this process knows to hold values in parts (:func:`mark_parted`): every
writing attach of them gives :data:`ROW_GROUP_SIZE`."""


def mark_parted(path: str) -> None:
    """From now on, attach ``path`` for writing with :data:`ROW_GROUP_SIZE`: the store holds
    (or its next batch writes) values in parts. Parts written by an attach without it (the
    batch that found them first, another process's WAL replayed) are a WAL's worth at most
    (DuckDB's 16 MiB ``checkpoint_threshold``)."""
    _parted.add(path)


def _attach_to(
    home: _Home, path: str, alias: str, timeout: float, *, read_only: bool, checkpoint: bool = True,
    cancelled: Callable[[], bool] | None = None,
) -> duckdb.DuckDBPyConnection:
    """A cursor of ``home`` with ``path`` attached as ``alias`` and in use (detach it with
    :func:`_detach`, then close it); waits for the file as :func:`_retrying` does. For a
    write, ``checkpoint=False`` leaves the block's rows in the WAL (see :func:`open_store`)."""
    con = home.cursor()
    options = " (READ_ONLY)" if read_only else f" (ROW_GROUP_SIZE {ROW_GROUP_SIZE})" if path in _parted else ""
    statements = [f"ATTACH {_sql_text(path)} AS {alias}{options}", f"USE {alias}", *home.quiet]
    keep_wal = not checkpoint
    if not read_only and home.keeps_wal is not keep_wal:  # the mode changes with this block
        statements += _KEEP_WAL if keep_wal else _CHECKPOINT
    script = ";\n".join(statements)  # one call: see _Home
    try:
        try:
            _retrying(path, timeout, lambda: con.execute(script), writer=not read_only, cancelled=cancelled)
        except Cancelled:
            raise  # before an attempt: nothing was attached (no DuckDB call to undo one)
        except BaseException:
            _detach(con, alias, home)  # when a statement after the ATTACH failed
            if not read_only:
                home.keeps_wal = None
            raise
    except BaseException:
        con.close()
        raise
    if not read_only:
        home.keeps_wal = keep_wal
    return con


def _attach(path: str, timeout: float, home: _Home) -> _Held:
    alias = f"loopscope_store_{next(_aliases)}"
    return _Held(_attach_to(home, path, alias, timeout, read_only=True), alias, home)


@contextlib.contextmanager
def _attached(path: str, timeout: float, keep: bool = False, home: _Home = _readers) -> Iterator[duckdb.DuckDBPyConnection]:
    """A cursor of a shared reader database (``home``) with ``path`` attached read-only and in use.

    With ``keep`` the attachment stays for the next read for up to :data:`HOLD_IDLE`
    seconds idle (:data:`HOLD_MAX` at most): attaching and detaching cost ~2 ms, and a
    fresh attachment reads and decompresses the blocks again. Nothing can change the file
    while it is attached (a writer needs it alone), so a kept attachment is never stale.
    A writer in another process that finds the file held says so with its marker
    (:func:`writer_marker`): the next read lets go of the file and waits for the writer
    first, as does the reaper once the attachment is idle. Our own writer detaches it
    before opening the file (:func:`open_store`). A read without ``keep`` uses a kept
    attachment too, and detaches it at its end.
    """
    with gate(path):
        held = _reusable(path)
        if held is None:
            if writer_waiting(path):
                _yield_to_writer(path)
            held = _attach(path, timeout, home)
        try:
            yield held.cursor
        except BaseException:
            # whatever the block left behind (an open transaction, a changed default
            # database) goes with the attachment
            _detach(held.cursor, held.alias, held.home, rollback=True)
            try:
                held.cursor.close()
            except duckdb.Error:
                pass
            raise
        if keep and not _closing and not writer_waiting(path):  # (a writer waits: let go now)
            _keep(path, held)
        else:
            _detach(held.cursor, held.alias, held.home)
            try:
                held.cursor.close()
            except duckdb.Error:
                pass


def _detach(
    con: duckdb.DuckDBPyConnection, alias: str, home: _Home = _readers, *, rollback: bool = False, checkpoint: bool = True
) -> None:
    """Let go of the file: detach it from ``home``, whatever state the block left the
    cursor in (a written file is checkpointed, as closing a connection would, unless the
    block turned that off, or ``checkpoint=False``: a block given up on leaves the WAL as
    it is, as a detach's checkpoint cannot be interrupted).

    ``rollback`` first ends a transaction the block may have left open (a ROLLBACK with
    none open fails, at ~1 ms: only after a block that failed)."""
    if rollback:
        try:
            con.execute("ROLLBACK")
        except duckdb.Error:
            pass
    script = f"USE memory;\nDETACH {alias}"
    if not checkpoint and home.keeps_wal is not True:
        script = f"{_KEEP_WAL[1]};\n{script}"
        home.keeps_wal = None  # the next block sets its mode again
    try:
        con.execute(script)  # one call: see _Home
        return
    except duckdb.Error:
        pass
    # the block closed or broke its cursor: the attachment belongs to the database, so a
    # fresh cursor can still detach it
    try:
        other = home.database().cursor()
        try:
            other.execute(f"DETACH DATABASE IF EXISTS {alias}")
        finally:
            other.close()
    except duckdb.Error:
        # never keep holding the file: forget the database (it closes with its last
        # cursor) and start a fresh one for the next block
        home.forget()


_reading: dict[int, str] = {}
"""The file each read-only block's connection reads (by the connection's id), while the
block runs: :func:`read_path`."""


@contextlib.contextmanager
def _reading_of(con: duckdb.DuckDBPyConnection, path: str) -> Iterator[None]:
    _reading[id(con)] = path
    try:
        yield
    finally:
        _reading.pop(id(con), None)


def read_path(con: duckdb.DuckDBPyConnection) -> str | None:
    """The store file ``con`` reads, when it is a read-only :func:`open_store` block's
    connection and the block runs (the file is held meanwhile: nothing writes it); else
    None. What the schema check keys what it found by
    (:func:`~loopscope.storage.duckdb.schema.check_readable`)."""
    return _reading.get(id(con))


def _check_path(path: str, *, read_only: bool) -> None:
    """Refuse at once a path that is no regular file (a FIFO would hold DuckDB's open until
    someone writes to it) or, for a write, whose WAL is a symbolic link (DuckDB would write
    through it: see :mod:`.store_file`). One ``stat`` (and an ``lstat``), no open."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        if read_only:
            raise StoreError(f"no loopscope store at {path} (run an instrumented agent, or `loopscope demo`, first)") from None
        mode = None
    if mode is not None and not stat.S_ISREG(mode):
        raise StoreError(store_file.kind_problem(path) or f"loopscope store path {path} is not a regular file")
    if not read_only:
        try:
            store_file.refuse_link(path + ".wal")
        except OSError as exc:
            raise StoreError(f"cannot write the loopscope store {path}: its WAL {path}.wal is {exc.strerror}") from None


def _not_a_store(path: str) -> str | None:
    """Why DuckDB could not open ``path``, when its header tells (no DuckDB database: a SQLite
    file, say, which DuckDB reads only with an extension it does not load here)."""
    try:
        return store_file.header_problem(path)
    except OSError:
        return None


@contextlib.contextmanager
def open_store(
    path: str,
    *,
    read_only: bool,
    timeout: float = 10.0,
    isolated: bool = False,
    sealed: bool = True,
    keep: bool = False,
    page: bool = False,
    checkpoint: bool = True,
    cancelled: Callable[[], bool] | None = None,
) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection to ``path`` held only for the ``with`` block.

    Waits up to ``timeout`` seconds for another process to let go of the file, then
    raises :class:`StoreLockedError` naming who holds it. A read-only connection is the
    store file attached to the process's shared reader database (and made its default,
    so plain table names work); it is detached when the block ends. ``isolated=True``
    gives a read-only database of its own instead, for SQL that is not ours: sealed
    (:data:`_SEALED_CONFIG`), it can read the store and nothing else, and cannot write,
    attach, install or load anything, spill to disk, or change its settings.
    ``sealed=False`` leaves DuckDB's defaults, for our own statements that write files
    (``loopscope export --parquet``). ``keep=True`` leaves a shared read-only attachment
    for the next read, briefly (see :func:`_attached`). ``page=True`` is for a read of a
    few row groups (a session's page): it runs on one DuckDB thread (:data:`_page_readers`).

    A read-write block attaches the file to a database kept for that file
    (:func:`_writer_home`): its statements run on one DuckDB thread, and each commit
    checkpoints (the rows reach the file proper, and no WAL is left beside it).
    ``checkpoint=False`` leaves the block's rows in the WAL instead (on disk too, and a
    reader replays it): the store's writer does so until the WAL passes
    :data:`~loopscope.storage.duckdb.writer.WAL_LIMIT`. A block must not change the database's
    settings: they are the next block's too. ``cancelled``, for a read-write block: once it
    is true, the block's owner has given up on it (a store writer left behind by its close):
    the file is not attached any more (:class:`Cancelled`), and the detach that ends the
    block does not checkpoint.
    """
    _check_path(path, read_only=read_only)
    if read_only:
        asked = wakeup.ask(path)  # writers holding rows write them first (wakeup.py)
        if asked:
            with gate(path):
                release(path)  # our kept attachment would keep them out of the file
            wakeup.wait_written(asked, timeout)  # as long as the read would wait for the file
    if read_only and not isolated:
        with _attached(path, timeout, keep, _page_readers if page else _readers) as con, _reading_of(con, path):
            yield con
        return
    with gate(path):
        if read_only:  # isolated: a database of its own
            if writer_waiting(path):
                _yield_to_writer(path)
            config = _SEALED_CONFIG if sealed else _NO_EXTENSIONS
            con = _retrying(path, timeout, lambda: duckdb.connect(path, read_only=True, config=config))
            try:
                con.execute(";\n".join(_SEAL) if sealed else _NO_PROGRESS_BAR)
                values.shadow(con)  # `events` with its large values whole (values.py)
                with _reading_of(con, path):
                    yield con
            finally:
                con.close()
            return
        release(path)  # our readers' kept attachment: DuckDB refuses to open the file beside it
        home, alias = _writer_home(path), f"loopscope_write_{next(_aliases)}"
        con = _attach_to(home, path, alias, timeout, read_only=False, checkpoint=checkpoint, cancelled=cancelled)
        try:
            yield con
        except BaseException:
            _detach(con, alias, home, rollback=True, checkpoint=not (cancelled is not None and cancelled()))
            raise
        else:
            _detach(con, alias, home, checkpoint=not (cancelled is not None and cancelled()))
        finally:
            con.close()
            home.renew_after(RENEW_AFTER)
