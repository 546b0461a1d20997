"""The files loopscope keeps beside the store are never written through a link (issue 30,
"Doors"). With the store in a folder others may write (a sticky, world-writable one, as
/tmp), a second user planted a symbolic link at ``<db>.loopscope-lost.json.<pid>.tmp``: the
exiting application overwrote the link's target (a file of its user's) with its loss count,
and ``lost.json`` became a link too. Likewise a link at the lost file's lock or at a writer's
marker made loopscope create a file wherever it pointed.

The links are planted by a second user (``nobody``, through ``subprocess``'s ``user=``) when
the tests run as root, as CI does; otherwise by the same user, and the tests still check that
the link's target is untouched. The shared folder belongs to that user: Linux's
``fs.protected_symlinks`` lets a link in a sticky folder be followed by others when the link's
owner owns the folder, so the attack is the same wherever the tests run."""

from __future__ import annotations

import logging
import os
import stat
import subprocess
from pathlib import Path

import duckdb
import pytest
from opentelemetry.sdk.trace import TracerProvider

import loopscope
from children import hold
from loopscope.storage.duckdb import health
from loopscope.storage.duckdb.connection import open_store, writer_marker
from loopscope.storage.errors import StoreLockedError
from store_files import newer_store

NOBODY = 65534
AS_ROOT = os.geteuid() == 0


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    """A sticky, world-writable folder (as /tmp), another user's when the tests run as root."""
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o1777)
    if AS_ROOT:
        os.chown(folder, NOBODY, NOBODY)
    return folder


def plant(link: Path, target: Path) -> None:
    """A symbolic link at ``link`` to ``target``, made by the second user where there is one."""
    if AS_ROOT:  # `ln` run as nobody, in the folder (it cannot reach the test's tmp_path above it)
        subprocess.run(["ln", "-s", str(target), link.name], cwd=link.parent, user=NOBODY, group=NOBODY,
                       extra_groups=[], check=True, timeout=30)
        assert link.lstat().st_uid == NOBODY
    else:
        link.symlink_to(target)
    assert link.is_symlink()


def _victim(tmp_path: Path, name: str = "victim.txt") -> Path:
    """A file of the user's that loopscope has no business writing."""
    victim = tmp_path / name
    victim.write_text("my own file\n")
    return victim


def test_a_link_planted_at_the_lost_files_temporary_is_not_written_through(tmp_path: Path, shared: Path) -> None:
    db = shared / "app.duckdb"
    newer_store(db)
    victim = _victim(tmp_path)
    lost = Path(health.beside_path(str(db)))
    # the name the exiting application wrote its count to, then renamed over lost.json
    plant(Path(f"{lost}.{os.getpid()}.tmp"), victim)
    loopscope.configure(db, writer="process", tracer_provider=TracerProvider())
    for i in range(5):
        with loopscope.turn(session_id=f"s{i}", input="q") as t:
            t.generation("a", finish_reason="stop")
    assert loopscope.flush(60) is False  # refused: a newer loopscope's store
    loopscope.shutdown()
    assert victim.read_text() == "my own file\n"
    assert not lost.is_symlink() and stat.S_ISREG(lost.lstat().st_mode)
    assert stat.S_IMODE(lost.lstat().st_mode) == 0o600
    [entry] = health.read_beside(str(db)).values()  # still counted, in a file of its own
    # in the store's rows: a turn's input and its answer, and its summary
    events = entry["dropped_unwritable"] + entry["dropped_queue_full"]
    turns = entry.get("turns_dropped_unwritable", 0) + entry.get("turns_dropped_queue_full", 0)
    assert (events, turns) == (10, 5)


def test_a_link_planted_at_the_lost_file_is_refused_not_followed(tmp_path: Path, shared: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    db = str(shared / "app.duckdb")
    victim = _victim(tmp_path)
    lost = Path(health.beside_path(db))
    plant(lost, victim)
    with caplog.at_level(logging.WARNING, logger="loopscope"):
        assert health.record_beside(db, "w1", health.Counters(dropped_unwritable=3)) is False  # only logged
    assert f"{lost}: a symbolic link, not written through" in caplog.text
    assert victim.read_text() == "my own file\n"
    assert lost.is_symlink() and os.readlink(lost) == str(victim)  # left as planted
    assert health.read_beside(db) == {}  # nor read through


def test_a_link_planted_at_the_lost_files_lock_creates_nothing(tmp_path: Path, shared: Path) -> None:
    db = str(shared / "app.duckdb")
    target = tmp_path / "made-by-loopscope"
    plant(Path(health.beside_path(db) + ".lock"), target)
    assert health.record_beside(db, "w1", health.Counters(dropped_unwritable=3)) is False
    assert not target.exists()
    assert not Path(health.beside_path(db)).exists()


def test_a_link_planted_at_a_writers_marker_creates_nothing(tmp_path: Path, shared: Path, spawn) -> None:
    """A writer that finds the store held leaves a marker beside it for the readers: never
    through a link (the marker is then left out, and the writer waits as before)."""
    db = shared / "app.duckdb"
    duckdb.connect(str(db)).close()
    target = tmp_path / "made-by-loopscope"
    plant(Path(writer_marker(str(db))), target)
    with hold(spawn, db, tmp_path), pytest.raises(StoreLockedError), open_store(str(db), read_only=False, timeout=0.3):
        pass
    assert not target.exists()


def test_a_link_planted_at_the_stores_wal_is_refused_before_a_write(tmp_path: Path, shared: Path) -> None:
    """DuckDB writes the WAL beside the store itself (through any link there): a store whose
    WAL is a link is not written."""
    db = shared / "app.duckdb"
    duckdb.connect(str(db)).close()
    victim = _victim(tmp_path)
    plant(Path(f"{db}.wal"), victim)
    with pytest.raises(loopscope.StoreError, match="is a symbolic link"):
        loopscope.configure(db, writer="thread", tracer_provider=TracerProvider())
    assert victim.read_text() == "my own file\n"
