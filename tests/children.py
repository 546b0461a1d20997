"""Child processes for tests that need a second interpreter (a writer, a reader, a crash):
each runs a small script with its own loopscope, is bounded in time, and is killed at
teardown if it is still running. Use the ``spawn`` fixture
(tests/conftest.py makes it available to every test), or :func:`collect_child` for a
``loopscope collect`` command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, final

import pytest

ROOT = Path(__file__).resolve().parents[1]


HOLDER = """
    import pathlib, sys, time
    import duckdb

    con = duckdb.connect(sys.argv[1])  # read-write: nobody else can open the file now
    pathlib.Path(sys.argv[2]).write_text("holding")
    release = pathlib.Path(sys.argv[3])
    deadline = time.monotonic() + (float(sys.argv[4]) if len(sys.argv) > 4 else 30)
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    con.close()
"""
"""A script that holds a store file open for writing (as a ``duckdb`` shell or a notebook
would) until the file named by its third argument exists: ``HOLDER db holding release
[give-up seconds]``; it writes the file named by its second argument once it holds. The tests
start it through :func:`hold`."""


class Child:
    def __init__(self, proc: subprocess.Popen, out: Path, err: Path) -> None:
        self.proc, self.out, self.err = proc, out, err

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        return f"--- stdout ---\n{self.out.read_text()}\n--- stderr ---\n{self.err.read_text()}"

    def kill(self) -> None:
        """SIGKILL, and check that is how it ended."""
        os.kill(self.pid, signal.SIGKILL)
        assert self.proc.wait(10) == -signal.SIGKILL

    def wait(self, timeout: float = 20.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            pytest.fail(f"child {self.pid} did not finish within {timeout}s\n{self.output()}")

    def finish_ok(self, timeout: float = 30.0) -> str:
        code = self.wait(timeout)
        assert code == 0, f"child exited with {code}\n{self.output()}"
        return self.out.read_text()


@final
class Held:
    """A store held by :data:`HOLDER` (from :func:`hold`): ``holder``, its process, and
    ``release_file``, which lets go of the store once it exists (a child the test starts may
    write it). As a context manager it lets go at the end of the block."""

    def __init__(self, holder: Child, release_file: Path) -> None:
        self.holder, self.release_file = holder, release_file

    def release(self, timeout: float = 60.0) -> None:
        """Let go of the store and wait for the holder, which must end cleanly."""
        if not self.release_file.exists():
            self.release_file.write_text("go")
        self.holder.finish_ok(timeout)

    def __enter__(self) -> Held:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is None:
            self.release()
        elif self.holder.running():  # the test failed: its own error is the one to see
            self.release_file.write_text("go")
            self.holder.wait(60)


def hold(spawn: Callable[..., Child], db: str | Path, folder: Path, give_up: float = 120.0, timeout: float = 60.0) -> Held:
    """Start :data:`HOLDER` on ``db`` (its files in ``folder``) and return once it holds the
    store: it lets go at :meth:`Held.release`, or after ``give_up`` seconds. A holder that ends
    first, or does not hold within ``timeout`` seconds, fails the test with its output."""
    holding, release = folder / "holding", folder / "release"
    holder = spawn("holder", HOLDER, db, holding, release, give_up)
    deadline = time.monotonic() + timeout
    while not holding.exists():
        assert holder.running() and time.monotonic() < deadline, f"the holder never held {db}\n{holder.output()}"
        time.sleep(0.02)
    return Held(holder, release)


FELL_BACK = "loopscope: the store's writer runs in a thread: "
"""What a child whose default writer (``auto``) fell back to the thread says on stderr."""


@pytest.fixture
def spawn(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Child]]:
    """``spawn(name, code, *args)`` runs ``code`` as a script in a fresh interpreter
    (LOOPSCOPE_STRICT=1, no OTEL_* or LOOPSCOPE_DB from the test's environment). A child whose
    default writer fell back to the thread (:data:`FELL_BACK` on its stderr) fails the test,
    unless it is marked ``writer_fallback``, as the conftest does for the test's own process."""
    children: list[Child] = []

    def start(name: str, code: str, *args: Any) -> Child:
        script = tmp_path / f"{name}.py"
        script.write_text(textwrap.dedent(code))
        env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        env.update({"LOOPSCOPE_STRICT": "1", "PYTHONPATH": str(ROOT)})
        env.pop("LOOPSCOPE_DB", None)
        out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
        with out.open("w") as stdout, err.open("w") as stderr:
            proc = subprocess.Popen([sys.executable, str(script), *map(str, args)], cwd=tmp_path, env=env, stdout=stdout, stderr=stderr)
        child = Child(proc, out, err)
        children.append(child)
        return child

    try:
        yield start
    finally:
        for child in children:
            if child.running():
                child.proc.kill()
            child.proc.wait(10)
    if not request.node.get_closest_marker("writer_fallback"):
        fell = [c for c in children if FELL_BACK in c.err.read_text(errors="replace")]
        assert not fell, f"a child's writer fell back to the thread\n{fell[0].output()}"


@final
class Collect:
    """A ``loopscope collect`` child, ready (from :func:`collect_child`): ``http``, its OTLP/HTTP
    endpoint (``http://127.0.0.1:PORT``), ``port``, ``grpc``, its gRPC target (``127.0.0.1:PORT``,
    None with ``--no-grpc``), ``proc``. As a context manager it is killed at the end of the block
    if it is still running (a test that failed before it stopped it)."""

    def __init__(self, proc: subprocess.Popen[str], line: str) -> None:
        self.proc, self.line = proc, line
        self.http = line.split("OTLP/HTTP on ")[1].split(",")[0].split()[0]
        self.port = int(self.http.rsplit(":", 1)[1])
        self.grpc = line.split("OTLP/gRPC on http://")[1].split()[0] if "OTLP/gRPC on " in line else None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = 120.0) -> tuple[str, str]:
        """SIGTERM (it writes what it holds, then says what it took) and wait; its (stdout,
        stderr). One that does not end within ``timeout`` is killed and fails the test."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            pytest.fail(f"loopscope collect did not stop within {timeout}s\n--- stdout ---\n{out}\n--- stderr ---\n{err}")

    def stop_ok(self, timeout: float = 120.0) -> str:
        """:meth:`stop`, which must end it cleanly (exit code 0); its stdout."""
        out, err = self.stop(timeout)
        assert self.proc.returncode == 0, err
        return out

    def kill(self) -> None:
        """SIGKILL, and check that is how it ended."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=60)
        assert self.proc.returncode == -signal.SIGKILL

    def __enter__(self) -> Collect:
        return self

    def __exit__(self, *_: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=60)


def collect_child(db: str | Path, *args: str, env: dict[str, str] | None = None) -> Collect:
    """``loopscope --db DB collect --http-port 0 ARGS`` in a fresh interpreter (this checkout's
    loopscope; ``env``: its environment, else the test's), returned once it listens (its first
    line names its endpoints). gRPC on a free port too unless ``args`` say ``--no-grpc`` or a
    ``--grpc-port``. A child that ends or says something else first fails the test."""
    grpc = [] if "--no-grpc" in args or "--grpc-port" in args else ["--grpc-port", "0"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "loopscope", "--db", str(db), "collect", "--http-port", "0", *grpc, *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**(os.environ if env is None else env), "PYTHONPATH": str(ROOT)},
    )
    stdout: IO[str] = proc.stdout  # type: ignore[assignment]
    line = stdout.readline()
    if not line.startswith("loopscope collect: OTLP/HTTP on http://127.0.0.1:"):
        proc.kill()
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"loopscope collect did not start: {line}{out}\n{err}")
    return Collect(proc, line)
