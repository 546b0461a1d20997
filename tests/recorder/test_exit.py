"""Stitched turns end as README promises when the process ends, however it ends.

Each test runs a script with the real openai SDK against the fake model server in a child
interpreter: the model asks for a tool, and the script ends without answering (normal
end, ``sys.exit``, an uncaught exception, KeyboardInterrupt, SIGTERM). The call must be
stored ``unserved`` and the turn ``unfinished``, each with its time until the exit, not 0.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

import loopscope
from fakes.model_server import FakeModelServer, Reply, ToolCall

WAIT = 0.3  # seconds the script waits after the response: the durations must cover them

CALL = """
    import os, sys, time
    import loopscope, openai

    loopscope.configure(db=sys.argv[2])
    loopscope.instrument()
    client = openai.OpenAI(base_url=sys.argv[1], api_key="sk-test")
    client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=[{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}],
    )
    time.sleep(%(wait)s)
"""

ENDINGS = {
    "end": ("", 0),
    "sys_exit": ("sys.exit(3)", 3),
    "exception": ("raise RuntimeError('the loop broke')", 1),
    "keyboard_interrupt": ("raise KeyboardInterrupt", None),  # Python dies by SIGINT, or 1 where it cannot
}


def _check_closed(db: Path) -> None:
    store = loopscope.Store(str(db))
    (session,) = store.list_sessions()
    (turn,) = store.list_turns(session.session_id)
    assert turn.loop_end_reason is loopscope.LoopEndReason.UNFINISHED
    assert turn.latency_ms is not None and turn.latency_ms >= WAIT * 1000  # its real length, until the exit
    ends = [e.content for e in store.get_timeline(session.session_id) if e.type == "tool_call_end"]
    assert [(c.tool_id, c.outcome) for c in ends] == [("call_x1", "unserved")]
    assert ends[0].duration_ms is not None and ends[0].duration_ms >= WAIT * 1000  # not 0 ms


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_a_turn_waiting_for_a_tool_is_closed_when_the_script_ends(ending, spawn, model_server: FakeModelServer, tmp_path):
    model_server.queue(Reply(tool_calls=[ToolCall("weather", {"city": "Oslo"}, id="call_x1")]))
    code, status = ENDINGS[ending]
    db = tmp_path / "exit.duckdb"
    child = spawn(ending, CALL % {"wait": WAIT} + f"    {code}\n", model_server.openai_base_url, db)
    returned = child.wait(60)
    if status is not None:
        assert returned == status, child.output()
    _check_closed(db)


def _wait_for(child, text: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in child.out.read_text():
        assert child.running(), child.output()
        assert time.monotonic() < deadline, child.output()
        time.sleep(0.02)


def test_sigterm_closes_the_turn_and_still_ends_the_process_by_sigterm(spawn, model_server: FakeModelServer, tmp_path):
    model_server.queue(Reply(tool_calls=[ToolCall("weather", {"city": "Oslo"}, id="call_x1")]))
    db = tmp_path / "term.duckdb"
    child = spawn("term", CALL % {"wait": WAIT} + "    print('waiting', flush=True)\n    time.sleep(60)\n",
                  model_server.openai_base_url, db)
    _wait_for(child, "waiting")
    os.kill(child.pid, signal.SIGTERM)
    assert child.wait(30) == -signal.SIGTERM  # the default action's exit status, as before
    _check_closed(db)


def test_an_applications_own_sigterm_handler_is_kept(spawn, model_server: FakeModelServer, tmp_path):
    model_server.queue(Reply(tool_calls=[ToolCall("weather", {"city": "Oslo"}, id="call_x1")]))
    db = tmp_path / "own.duckdb"
    own = (
        "\n    import signal, sys\n"
        "    signal.signal(signal.SIGTERM, lambda *_: (print('own handler', flush=True), sys.exit(5)))\n"
    )
    child = spawn("own", own + CALL % {"wait": WAIT} + "    print('waiting', flush=True)\n    time.sleep(60)\n",
                  model_server.openai_base_url, db)
    _wait_for(child, "waiting")
    os.kill(child.pid, signal.SIGTERM)
    assert child.wait(30) == 5  # the application's handler ran, and decided the status
    assert "own handler" in child.out.read_text()
    _check_closed(db)  # its sys.exit ran the exit hooks


STREAM = """
    import sys, time
    import loopscope, openai

    loopscope.configure(db=sys.argv[2])
    loopscope.instrument()
    client = openai.OpenAI(base_url=sys.argv[1], api_key="sk-test")
    stream = client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "Tell me"}], stream=True
    )
    first = next(iter(stream))  # one chunk read; the stream is held by a global until the end
    time.sleep(%(wait)s)
"""


def test_a_stream_left_open_is_stored_cut_off_at_exit(spawn, model_server: FakeModelServer, tmp_path):
    model_server.queue(Reply(text="one two three four five six", chunk_size=4))
    db = tmp_path / "stream.duckdb"
    child = spawn("stream", STREAM % {"wait": WAIT}, model_server.openai_base_url, db)
    assert child.wait(60) == 0, child.output()
    store = loopscope.Store(str(db))
    (session,) = store.list_sessions()
    (turn,) = store.list_turns(session.session_id)
    assert turn.loop_end_reason is loopscope.LoopEndReason.CANCELLED
