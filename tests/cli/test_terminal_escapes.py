"""Stored text cannot drive the terminal (issue 30, "Doors": terminal escape injection).

A tool result, its arguments, a tool's name, a session id, an agent's or a model's name
or a message may hold raw control sequences: OSC 52 writes the clipboard, OSC 8 hides a
link, ``ESC[2J`` clears the screen, ``ESC[8m`` hides what follows, the C1 control
``\\x9b`` is CSI on an 8-bit terminal, a carriage return or backspaces overwrite what was
printed. They are recorded here through the real pipeline (the hand API, and the real
openai SDK against the fake model server for the model's text and name), and every
command that prints stored text runs as a separate process whose output is a real
terminal (a pty: ``isatty()`` is true) and then a pipe (``| less -R`` is a terminal
too). No raw control character may come out (but the line feeds, which the pty turns
into CR LF), and the values must be there, visibly escaped.
"""

from __future__ import annotations

import base64
import json
import os
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import loopscope
from fakes.model_server import FakeModelServer, Reply, ToolCall
from recorded import connect_when_free

ROOT = Path(__file__).resolve().parents[2]

OSC52 = "\x1b]52;c;aGFja2Vk\x07"  # writes "hacked" into the clipboard
OSC8 = "\x1b]8;;http://evil.example/\x1b\\"  # opens a hidden link
SESSION = f"sess{OSC52}ion"
AGENT = "agent\x1b[8mhidden"
HAND_MODEL = "model\x9b2J"  # C1 CSI: clears the screen where it is read as 8-bit
TOOL = f"look{OSC8}up"
ARGUMENTS = {"q": "clear\x1b[2J"}
RESULT = "ok\x1b]52;c;ZXZpbA==\x07\rOVERWRITTEN\x08\x08\x7f\u202eevil"
ERROR = "boom\x1b[31mred\x9b0m"
MODEL_TEXT = "Hi\x1b[2J\x1b[8mthere\x07"
SERVER_MODEL = "gpt-4o\x1b[2J"
INPUT = "question\x1b]8;;http://evil.example/\x07"


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One session of hostile values: a hand-API turn whose tools succeed and fail, with
    a model call of the real openai SDK inside it."""
    path = tmp_path_factory.mktemp("escapes") / "store.duckdb"
    loopscope.configure(path, flush_interval=0.05, capture_content=True, writer="thread")
    loopscope.instrument()
    try:
        with FakeModelServer() as server:
            client = server.openai_client()
            server.queue(Reply(tool_calls=[ToolCall(TOOL, ARGUMENTS, id="call_1")], model=SERVER_MODEL),
                         Reply(text=MODEL_TEXT, model=SERVER_MODEL))

            @loopscope.tool(TOOL)
            def lookup(q: str) -> str:
                return RESULT

            @loopscope.tool("fail\x1b[2J")
            def failing() -> str:
                raise RuntimeError(ERROR)

            with loopscope.turn(session_id=SESSION, agent=AGENT, model=HAND_MODEL, input=INPUT,
                                tools=[{"name": TOOL, "description": "find\x1b[2J"}]) as t:
                t.generation(f"Looking{OSC8}.", model=HAND_MODEL, usage={"input_tokens": 10, "output_tokens": 5},
                             tool_calls=[{"id": "h1", "name": TOOL, "arguments": ARGUMENTS}])
                lookup(**ARGUMENTS)
                with pytest.raises(RuntimeError):
                    failing()
                messages: list[Any] = [{"role": "user", "content": INPUT}]
                first = client.chat.completions.create(model=SERVER_MODEL, messages=messages)
                call = first.choices[0].message.tool_calls[0]
                lookup(**json.loads(call.function.arguments))
                messages += [first.choices[0].message.model_dump(exclude_none=True),
                             {"role": "tool", "tool_call_id": call.id, "content": RESULT}]
                client.chat.completions.create(model=SERVER_MODEL, messages=messages)
        assert loopscope.flush(timeout=120)
    finally:
        loopscope.uninstrument()
        loopscope.shutdown()
    with connect_when_free(path) as con:  # all of it, or the assertions below mean little
        assert con.execute("SELECT count(*) FROM events").fetchone() == (9,)
        assert con.execute("SELECT count(*) FROM model_calls").fetchone() == (3,)
    yield str(path)


# each command, and what of the hostile values it must show escaped (the visible form in a
# table: \x1b for ESC; in JSON: \u001b)
COMMANDS: dict[str, tuple[list[str], list[str]]] = {
    "sessions": (["sessions"], ["sess\\x1b]52;c;aGFja2Vk\\x07ion"]),
    "sessions --json": (["sessions", "--json"], ["sess\\u001b]52;c;aGFja2Vk\\u0007ion"]),
    "timeline": (["timeline", "--limit", "0"], [
        "sess\\x1b]52;c;aGFja2Vk\\x07ion", "question\\x1b]8;;http://evil.example/\\x07",
        "-> ok\\x1b]52;c;ZXZpbA==\\x07 OVERWRITTEN\\x08\\x08\\x7f\\u202eevil",  # the CR folded, as a line break is
        '{"q": "clear\\u001b[2J"}', "RuntimeError: boom\\x1b[31mred\\x9b0m", "Hi\\x1b[2J\\x1b[8mthere\\x07",
    ]),
    "timeline page": (["timeline", "--limit", "3", "--after", "2"],  # a hint to copy: the id quoted as one word
                      ["session sess\\x1b]52;c;aGFja2Vk\\x07ion: events 3-5",
                       "earlier: loopscope timeline 'sess\\x1b]52;c;aGFja2Vk\\x07ion' --db"]),
    "timeline --json": (["timeline", "--json"], ["\\u001b]52;c;ZXZpbA==", "red\\u009b0m", "\\u007f\\u202eevil"]),
    "turns": (["turns"], ["agent\\x1b[8mhid", "model\\x9b2J", "Hi\\x1b[2J\\x1b[8mthere\\x07"]),
    "turns --json": (["turns", "--json"], ["agent\\u001b[8mhidden"]),
    "tools": (["tools"], ["look\\x1b]8;;http://evil.example/\\x1b\\up", "fail\\x1b[2J"]),
    "tools --declared": (["tools", "--declared"], ["agent\\x1b[8mhidden", "look\\x1b]8;;"]),
    "tools --json": (["tools", "--json"], ["fail\\u001b[2J"]),
    "calls": (["calls"], ["gpt-4o\\x1b[2J"]),
    "calls --json": (["calls", "--json"], ["gpt-4o\\u001b[2J"]),
    "tail": (["tail", "-n", "50"], ["\\x1b]52;c;ZXZpbA==\\x07", "sess\\x1b]52;c"]),
    "tail --json": (["tail", "--json", "-n", "50"], ["red\\u009b0m"]),
    "stats": (["stats"], ["model\\x9b2J", "gpt-4o\\x1b[2J"]),
    "stats --json": (["stats", "--json"], ["model\\u009b2J"]),
    "sql": (["sql", "SELECT session_id, tool_name, content->>'result' FROM events"],
            ["sess\\x1b]52;c;aGFja2Vk\\x07ion", "ok\\x1b]52;c;ZXZpbA==\\x07 OVERWRITTEN\\x08\\x08\\x7f\\u202eevil"]),
    "sql --json": (["sql", "--json", "SELECT tool_name, content FROM events"], ["\\u007f\\u202eevil"]),
    "sql pivot": (["sql", "PIVOT (SELECT tool_name FROM events WHERE tool_name LIKE 'fail%') ON tool_name"],
                  ["fail\\x1b[2J"]),  # stored text as a column's name
    "sql error": (["sql", "SELECT CAST(tool_name AS INTEGER) FROM events WHERE tool_name LIKE 'fail%'"],
                  ["fail\\x1b[2J"]),  # DuckDB's message quotes the stored value
    "export --agui": (["export", "--agui", "sess"], ["\\u001b]52;c;ZXZpbA==", "red\\u009b0m"]),
    "status": (["status"], []),
}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LOOPSCOPE_DB", "LOOPSCOPE_STRICT")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["COLUMNS"] = "400"  # wide enough that no escaped value is cut
    env["PYTHONIOENCODING"] = "utf-8"
    return env


# Each command runs as a process of its own, its output a real pty or a pipe. A fresh
# interpreter per command (50 of them) spent a third of its CPU making loopscope's pydantic
# models: here one interpreter per module (and output encoding) makes them once, and forks each
# command's process from there. Nothing that prints is imported
# before the fork (the CLI, the store, the formatting are the child's): the child makes its
# standard streams as the interpreter makes them at start-up, for the terminal or
# the pipe it now has, runs ``python -m loopscope ARGS`` (runpy, as ``-m`` does) and exits as
# that would (its atexit hooks run, the exit code is the command's).
LAUNCHER = r"""
import base64, io, json, os, pty, select, signal, sys, time

# what every command imports and no command's output depends on, made once before the forks:
# loopscope's data models (pydantic classes: making them is half a command's start-up). Not
# DuckDB: a process forked after DuckDB 1.x was imported aborts at its exit (C++ terminate)
import pydantic, loopscope.models  # noqa: F401

DEADLINE = 120.0  # seconds a command may take


def stream(fd, mode, encoding, errors, line_buffering):
    # as the interpreter's create_stdio makes a standard stream
    raw = io.open(fd, mode + "b", closefd=False)
    return io.TextIOWrapper(raw, encoding=encoding, errors=errors, newline="\n", line_buffering=line_buffering)


def child(argv, out, err):
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(err, 2)
    os.closerange(3, 65536)  # as subprocess's close_fds
    encoding, out_errors, in_errors = sys.stdout.encoding, sys.stdout.errors, sys.stdin.errors
    sys.stdin = sys.__stdin__ = stream(0, "r", encoding, in_errors, False)
    sys.stdout = sys.__stdout__ = stream(1, "w", encoding, out_errors, os.isatty(1))
    sys.stderr = sys.__stderr__ = stream(2, "w", encoding, "backslashreplace", True)
    sys.argv = ["loopscope", *argv]
    import runpy
    runpy.run_module("loopscope", run_name="__main__", alter_sys=True)  # raises SystemExit: this process ends


def run(argv, how):
    if how == "pty":
        read_out, write_out = pty.openpty()
        read_err = write_err = None
    else:
        read_out, write_out = os.pipe()
        read_err, write_err = os.pipe() if how == "pipes" else (None, None)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        child(argv, write_out, write_out if write_err is None else write_err)
    os.close(write_out)
    if write_err is not None:
        os.close(write_err)
    got = {read_out: [], **({read_err: []} if read_err is not None else {})}
    open_fds = set(got)
    deadline = time.monotonic() + DEADLINE
    while open_fds and time.monotonic() < deadline:
        ready, _, _ = select.select(list(open_fds), [], [], 1.0)
        for fd in ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # EIO: every slave end of the pty is closed, the process is done
                chunk = b""
            if chunk:
                got[fd].append(chunk)
            else:
                open_fds.discard(fd)
    if open_fds:
        os.kill(pid, signal.SIGKILL)
    for fd in got:
        os.close(fd)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    out = b"".join(got[read_out])
    err = b"".join(got[read_err]) if read_err is not None else b""
    return {"code": code, "out": base64.b64encode(out).decode(), "err": base64.b64encode(err).decode(),
            "timed_out": bool(open_fds)}


for line in sys.stdin:
    request = json.loads(line)
    answer = run(request["argv"], request["how"])
    sys.stdout.write(json.dumps(answer) + "\n")
    sys.stdout.flush()
"""


class Launcher:
    """One launcher interpreter (:data:`LAUNCHER`): ``run(args, how)`` runs ``loopscope ARGS``
    in a process of its own whose stdout and stderr are a pty (``how="pty"``), one pipe
    (``"pipe"``) or two (``"pipes"``); returns (exit code, stdout, stderr)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=env)

    def run(self, args: list[str], how: str) -> tuple[int, bytes, bytes]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write((json.dumps({"argv": args, "how": how}) + "\n").encode())
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], 180)
        assert ready, f"loopscope {args} ({how}): no answer in 180 s"
        line = self.proc.stdout.readline()
        assert line, f"the launcher ended ({self.proc.poll()})"
        answer = json.loads(line)
        out, err = base64.b64decode(answer["out"]), base64.b64decode(answer["err"])
        assert not answer["timed_out"], f"loopscope {args} ({how}) did not finish\n{out!r}\n{err!r}"
        return answer["code"], out, err

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def launch() -> Iterator[Callable[..., tuple[int, bytes, bytes]]]:
    """``launch(args, how, encoding="utf-8")``: :meth:`Launcher.run`, with a launcher per output
    encoding (``PYTHONIOENCODING``), started once for the module."""
    launchers: dict[str, Launcher] = {}

    def run(args: list[str], how: str, encoding: str = "utf-8") -> tuple[int, bytes, bytes]:
        if encoding not in launchers:
            launchers[encoding] = Launcher({**_env(), "PYTHONIOENCODING": encoding})
        return launchers[encoding].run(args, how)

    try:
        yield run
    finally:
        for launcher in launchers.values():
            launcher.close()


def _raw_controls(text: str) -> list[str]:
    """The control characters in ``text`` but line feeds: C0, DEL, C1."""
    return sorted({repr(ch) for ch in text if ch != "\n" and (ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F)})


@pytest.mark.parametrize("how", ["pty", "pipe"])
@pytest.mark.parametrize("name", list(COMMANDS))
def test_no_raw_control_reaches_the_terminal(launch, db: str, name: str, how: str) -> None:
    args, shown = COMMANDS[name]
    code, raw, _ = launch(["--db", db, *args], how)
    text = raw.decode("utf-8")
    assert (code == 0) == (name != "sql error"), (code, text)
    if how == "pty":
        text = text.replace("\r\n", "\n")  # the terminal's own translation of each line feed
    assert not _raw_controls(text), text
    assert "\u202e" not in text  # nor a bidi override that reorders what follows
    for value in shown:
        assert value in text, text
    if name == "sql error":
        assert text.startswith("loopscope: error: SQL failed"), text


def test_json_stays_the_same_json(launch, db: str) -> None:
    """Escaping DEL, C1 and bidi controls in ``--json`` changes how the JSON is written,
    not what it holds: it reads back to the stored values."""
    code, out, err = launch(["--db", db, "sql", "--json", "SELECT tool_name, content FROM events WHERE type = 'tool_call_end'"],
                            "pipes")
    assert code == 0, err
    assert not _raw_controls(out.decode())
    rows = json.loads(out)
    results = [json.loads(r["content"]).get("result") for r in rows if r["tool_name"] == TOOL]
    assert RESULT in results
    errors = [json.loads(r["content"]).get("error") for r in rows if r["tool_name"] != TOOL]
    assert any(ERROR in (e or "") for e in errors)


def test_an_8bit_terminal_gets_no_c1_byte(launch, db: str) -> None:
    """A terminal that is not UTF-8 takes the byte 0x9b as CSI: none is written."""
    for args in (["stats"], ["timeline", "--limit", "0"], ["stats", "--json"]):
        code, out, err = launch(["--db", db, *args], "pipes", encoding="latin-1")
        assert code == 0, err
        assert not [b for b in out if b < 0x20 and b != 0x0A or 0x7F <= b <= 0x9F], out


@pytest.mark.parametrize("command", [["ui", "--port", "0"], ["collect", "--http-port", "0", "--no-grpc"]])
def test_a_request_line_cannot_drive_the_terminal_of_a_verbose_server(tmp_path: Path, command: list[str]) -> None:
    """``ui --verbose`` and ``collect --verbose`` log each request line, which is the
    client's text: a raw ESC in its path is logged as ``\\x1b``."""
    proc = subprocess.Popen([sys.executable, "-m", "loopscope", "--db", str(tmp_path / "s.duckdb"), *command, "--verbose"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().decode()  # "... http://127.0.0.1:PORT ...": listening
        port = int(first.split("http://127.0.0.1:", 1)[1].split("/")[0].split()[0])
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            conn.sendall(b"GET /\x1b]52;c;aGk=\x07\x1b[2J HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            while conn.recv(65536):  # the whole answer: its log line is written before it is sent
                pass
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    text = err.decode()
    assert "/\\x1b]52;c;aGk=\\x07\\x1b[2J" in text, text
    assert not _raw_controls(text), text
