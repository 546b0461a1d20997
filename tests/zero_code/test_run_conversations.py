"""Conversations found on their own under ``loopscope run``: an unmodified chat loop of
several turns is one session, not one per turn; ``--session`` / ``LOOPSCOPE_SESSION`` put
every turn of the process in one named session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import loopscope
from fakes.model_server import FakeModelServer, Reply, ToolCall

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]  # this checkout's loopscope, in the command and in the program

CHAT = """
import json, sys
import openai

client = openai.OpenAI()
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]


def chat(questions, stream):
    messages = [{"role": "system", "content": "You are terse."}]
    for question in questions:
        messages.append({"role": "user", "content": question})
        while True:
            if stream:
                text, calls = "", {}
                for chunk in client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS, stream=True):
                    for choice in chunk.choices:
                        text += choice.delta.content or ""
                        for part in choice.delta.tool_calls or []:
                            slot = calls.setdefault(part.index, {"id": part.id, "name": "", "arguments": ""})
                            slot["name"] += part.function.name or ""
                            slot["arguments"] += part.function.arguments or ""
                message = {"role": "assistant", "content": text or None}
                if calls:
                    message["tool_calls"] = [{"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                                             for c in calls.values()]
                messages.append(message)
                tool_calls = message.get("tool_calls") or []
                ids = [c["id"] for c in tool_calls]
            else:
                answer = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS).choices[0].message
                messages.append(answer)  # the SDK's own message object, as many loops do
                ids = [c.id for c in answer.tool_calls or []]
            if not ids:
                break
            for call_id in ids:
                messages.append({"role": "tool", "tool_call_id": call_id, "content": json.dumps({"temp_c": 21})})
    print(messages[-1]["content"] if isinstance(messages[-1], dict) else messages[-1].content)


chat(["Weather in Paris?", "And tomorrow?", "Thanks!"], stream=False)
chat(["Hello [other]", "Bye"], stream=True)  # another conversation in the same process
"""


def _env(server: FakeModelServer, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "LOOPSCOPE_"))}
    env.update(OPENAI_BASE_URL=server.openai_base_url, OPENAI_API_KEY="sk-test", PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
               PYTHONPATH=str(ROOT), **extra)
    return env


def _script(server: FakeModelServer) -> None:
    server.queue(
        Reply(tool_calls=[ToolCall("weather", {"city": "Paris"})]),
        Reply(text="21 °C."),
        Reply(text="Sunny tomorrow."),
        Reply(text="You are welcome."),
    )
    server.queue(Reply(text="Hi."), Reply(text="Bye."), match="[other]")


def _run(tmp_path: Path, server: FakeModelServer, *options: str, **env: str) -> loopscope.Store:
    app = tmp_path / "chat.py"
    app.write_text(CHAT)
    db = tmp_path / "chat.duckdb"
    proc = subprocess.run(
        [sys.executable, "-m", "loopscope", "--db", str(db), "run", *options, "--", sys.executable, str(app)],
        check=False, env=_env(server, **env), cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["You are welcome.", "Bye."]
    return loopscope.Store(str(db))


def _turns_by_session(store: loopscope.Store) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for session in store.list_sessions():
        turns = sorted(store.list_turns(session.session_id), key=lambda t: t.timestamp)
        out[session.session_id] = [t.response_content for t in turns]
    return out


def test_a_conversation_of_three_turns_is_one_session(tmp_path: Path, model_server: FakeModelServer) -> None:
    _script(model_server)
    sessions = _turns_by_session(_run(tmp_path, model_server))
    assert sorted(sessions.values()) == [["21 °C.", "Sunny tomorrow.", "You are welcome."], ["Hi.", "Bye."]]


def test_run_session_puts_every_turn_in_one_named_session(tmp_path: Path, model_server: FakeModelServer) -> None:
    _script(model_server)
    sessions = _turns_by_session(_run(tmp_path, model_server, "--session", "support-42"))
    assert list(sessions) == ["support-42"]
    assert sorted(sessions["support-42"]) == sorted(["21 °C.", "Sunny tomorrow.", "You are welcome.", "Hi.", "Bye."])


def test_the_session_variable_does_the_same(tmp_path: Path, model_server: FakeModelServer) -> None:
    _script(model_server)
    sessions = _turns_by_session(_run(tmp_path, model_server, LOOPSCOPE_SESSION="from-env"))
    assert list(sessions) == ["from-env"] and len(sessions["from-env"]) == 5


def test_with_the_switch_off_each_turn_is_a_session_of_its_own(tmp_path: Path, model_server: FakeModelServer) -> None:
    _script(model_server)
    sessions = _turns_by_session(_run(tmp_path, model_server, LOOPSCOPE_FIND_CONVERSATIONS="0"))
    assert sorted(sessions.values()) == [["21 °C."], ["Bye."], ["Hi."], ["Sunny tomorrow."], ["You are welcome."]]
