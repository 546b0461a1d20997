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


# The main thread waits for a lock nobody will release (as a pool worker waits for the task
# queue's lock that a sibling killed by ``terminate()`` held) while the SIGTERM lands on
# another thread: sent to that thread here, which is how it lands when it comes just before
# the main thread sleeps (the kernel has it run Python's C handler on a thread that then
# sleeps without noticing). Python's handler runs only on the main thread, between bytecodes:
# the process would wait for ever where the default action would have ended it.
TRIPPED_ELSEWHERE = """
    import multiprocessing, signal, threading
    held = multiprocessing.Lock()
    held.acquire()
    waiting = threading.Event()

    def trip():
        waiting.wait()  # returns with the GIL, which the main thread gives up only inside the lock's wait
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

    threading.Thread(target=trip, daemon=True).start()
    waiting.set()
    held.acquire()
"""


def test_a_sigterm_the_main_thread_sleeps_through_still_closes_the_turn_and_ends_the_process(
        spawn, model_server: FakeModelServer, tmp_path):
    """Today the process never ends: Python's handler waits for the main thread."""
    model_server.queue(Reply(tool_calls=[ToolCall("weather", {"city": "Oslo"}, id="call_x1")]))
    db = tmp_path / "tripped.duckdb"
    child = spawn("tripped", CALL % {"wait": WAIT} + TRIPPED_ELSEWHERE, model_server.openai_base_url, db)
    assert child.wait(30) == -signal.SIGTERM, child.output()  # ended by it, as the default action would
    _check_closed(db)


# The main thread blocks SIGTERM and waits for ever: the kernel gives the signal to another
# thread, and no signal sent to the main thread reaches it.
MASKED = """
    import multiprocessing, signal
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    held = multiprocessing.Lock()
    held.acquire()
    print("waiting", flush=True)
    held.acquire()
"""


def test_a_sigterm_the_main_thread_never_takes_still_closes_the_turn_and_ends_the_process(
        spawn, model_server: FakeModelServer, tmp_path):
    """The main thread cannot run loopscope's handler at all: the turn is closed without it,
    and the process ends with the status a shell gives a SIGTERM (128 + 15). Today it never
    ends."""
    model_server.queue(Reply(tool_calls=[ToolCall("weather", {"city": "Oslo"}, id="call_x1")]))
    db = tmp_path / "masked.duckdb"
    child = spawn("masked", CALL % {"wait": WAIT} + MASKED, model_server.openai_base_url, db)
    _wait_for(child, "waiting")
    os.kill(child.pid, signal.SIGTERM)
    assert child.wait(30) == 128 + signal.SIGTERM, child.output()
    _check_closed(db)


FORKED = """
    import os, sys, time
    import loopscope, openai

    loopscope.configure(db=sys.argv[2])
    loopscope.instrument()
    pid = os.fork()
    if pid == 0:  # the child records, and sleeps through the SIGTERM as above
        client = openai.OpenAI(base_url=sys.argv[1], api_key="sk-test")
        client.chat.completions.create(
            model="gpt-4o-mini",
            messages=[{"role": "user", "content": "Weather in Oslo?"}],
            tools=[{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}],
        )
        time.sleep(%(wait)s)
%(tripped)s
    _, status = os.waitpid(pid, 0)
    print("child", os.waitstatus_to_exitcode(status), flush=True)
"""


def test_a_fork_child_sees_to_its_own_sigterm_and_its_parent_lives_on(spawn, model_server: FakeModelServer, tmp_path):
    """The signals a fork's child notes are its own to see to: the child ends by SIGTERM with
    its turn closed (through a watch of its own), and the parent, whose watch would otherwise
    read them and have it end by SIGTERM too, goes on to its normal end."""
    model_server.queue(Reply(tool_calls=[ToolCall("weather", {"city": "Oslo"}, id="call_x1")]))
    db = tmp_path / "forked.duckdb"
    tripped = "\n".join("    " + line if line.strip() else line for line in TRIPPED_ELSEWHERE.splitlines())
    parent = spawn("forked", FORKED % {"wait": WAIT, "tripped": tripped}, model_server.openai_base_url, db)
    assert parent.finish_ok(60).split() == ["child", str(-signal.SIGTERM)], parent.output()
    _check_closed(db)


# The script's end waits for a thread that never ends (Python joins non-daemon threads before
# its exit hooks run), and the SIGTERM comes meanwhile, when Python starts no thread any more.
ENDING = """
    import threading

    def linger():
        while threading.main_thread().is_alive():  # until the interpreter's end has begun
            time.sleep(0.01)
        print("ending", flush=True)
        threading.Event().wait()

    threading.Thread(target=linger).start()
"""


def test_a_sigterm_while_the_interpreter_ends_closes_the_turn_and_ends_the_process_by_it(
        spawn, model_server: FakeModelServer, tmp_path):
    """Today the handler's thread cannot start: a traceback on stderr, and the process ends
    with status 0 (seen when a pool's terminate() met a worker ending)."""
    model_server.queue(Reply(tool_calls=[ToolCall("weather", {"city": "Oslo"}, id="call_x1")]))
    db = tmp_path / "ending.duckdb"
    child = spawn("ending", CALL % {"wait": WAIT} + ENDING, model_server.openai_base_url, db)
    _wait_for(child, "ending")
    os.kill(child.pid, signal.SIGTERM)
    assert child.wait(30) == -signal.SIGTERM, child.output()
    assert "Traceback" not in child.err.read_text(), child.output()
    _check_closed(db)
