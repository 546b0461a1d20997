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

import json
import os
import pty
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import pytest

import loopscope
from fakes.model_server import FakeModelServer, Reply, ToolCall

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
    with duckdb.connect(str(path), read_only=True) as con:  # all of it, or the assertions below mean little
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


def _through_pty(argv: list[str]) -> bytes:
    """What the command writes to a terminal: stdout and stderr are a pty's slave."""
    master, slave = pty.openpty()
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=_env())
    finally:
        os.close(slave)
    chunks = []
    try:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every slave end is closed, the process is done
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(master)
        proc.wait(timeout=60)
    return b"".join(chunks)


def _through_pipe(argv: list[str]) -> bytes:
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          env=_env(), timeout=120, check=False)
    return done.stdout


def _raw_controls(text: str) -> list[str]:
    """The control characters in ``text`` but line feeds: C0, DEL, C1."""
    return sorted({repr(ch) for ch in text if ch != "\n" and (ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F)})


@pytest.mark.parametrize("how", ["pty", "pipe"])
@pytest.mark.parametrize("name", list(COMMANDS))
def test_no_raw_control_reaches_the_terminal(db: str, name: str, how: str) -> None:
    args, shown = COMMANDS[name]
    argv = [sys.executable, "-m", "loopscope", "--db", db, *args]
    raw = _through_pty(argv) if how == "pty" else _through_pipe(argv)
    text = raw.decode("utf-8")
    if how == "pty":
        text = text.replace("\r\n", "\n")  # the terminal's own translation of each line feed
    assert not _raw_controls(text), text
    assert "\u202e" not in text  # nor a bidi override that reorders what follows
    for value in shown:
        assert value in text, text
    if name == "sql error":
        assert text.startswith("loopscope: error: SQL failed"), text


def test_json_stays_the_same_json(db: str) -> None:
    """Escaping DEL, C1 and bidi controls in ``--json`` changes how the JSON is written,
    not what it holds: it reads back to the stored values."""
    done = subprocess.run([sys.executable, "-m", "loopscope", "--db", db, "sql", "--json",
                           "SELECT tool_name, content FROM events WHERE type = 'tool_call_end'"],
                          capture_output=True, env=_env(), timeout=120, check=True)
    assert not _raw_controls(done.stdout.decode())
    rows = json.loads(done.stdout)
    results = [json.loads(r["content"]).get("result") for r in rows if r["tool_name"] == TOOL]
    assert RESULT in results
    errors = [json.loads(r["content"]).get("error") for r in rows if r["tool_name"] != TOOL]
    assert any(ERROR in (e or "") for e in errors)


def test_an_8bit_terminal_gets_no_c1_byte(db: str) -> None:
    """A terminal that is not UTF-8 takes the byte 0x9b as CSI: none is written."""
    env = _env()
    env["PYTHONIOENCODING"] = "latin-1"
    for args in (["stats"], ["timeline", "--limit", "0"], ["stats", "--json"]):
        done = subprocess.run([sys.executable, "-m", "loopscope", "--db", db, *args],
                              capture_output=True, env=env, timeout=120, check=True)
        assert not [b for b in done.stdout if b < 0x20 and b != 0x0A or 0x7F <= b <= 0x9F], done.stdout


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
