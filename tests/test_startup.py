"""Start-up stays light (issue 19): what a fresh process imports, not how long it takes
(the times are benchmarks/bench_startup.py's business). Each check runs in a child
interpreter and asserts on its ``sys.modules``. And lazy start-up leaves nothing out (issue
29): every public entry point, and every reading command, works in a fresh process with
nothing configured."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

HEAVY = ["duckdb", "pydantic", "pyarrow", "wrapt", "opentelemetry.sdk.trace", "opentelemetry.sdk.metrics"]
RECORDING = ["loopscope.recorder", "loopscope.pipeline", "loopscope.export", "loopscope.pricing", "loopscope._otel_sdk"]

CLI = "from loopscope.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"


def loaded(code: str, names: list[str], cwd: Path | None = None, env_extra: dict[str, str] | None = None) -> dict[str, bool]:
    """Run ``code`` in a fresh interpreter; which of ``names`` it imported."""
    report = f"\nimport json as _j, sys as _s\nprint(_j.dumps({{n: n in _s.modules for n in {names!r}}}))\n"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **(env_extra or {})}
    done = subprocess.run(
        [sys.executable, "-c", code + report], cwd=cwd or ROOT, env=env, capture_output=True, text=True, timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_loopscope_imports_no_store_no_pydantic_no_otel_sdk():
    found = loaded("import loopscope", HEAVY + RECORDING + ["loopscope.models", "asyncio"])
    assert not any(found.values()), [name for name, is_in in found.items() if is_in]


def test_every_public_name_is_there_when_asked_for():
    code = (
        "import loopscope\n"
        "missing = [n for n in loopscope.__all__ if getattr(loopscope, n, None) is None]\n"
        "assert not missing, missing\n"
        "assert set(loopscope.__all__) <= set(dir(loopscope))\n"
        "import loopscope.instrument.openai  # a submodule import must not hide the function\n"
        "assert callable(loopscope.instrument) and loopscope.instrument.__module__ == 'loopscope.instrument'\n"
        "from loopscope import *  # noqa: F403\n"
        "assert Store is loopscope.storage.duckdb.store.Store and turn is loopscope.recorder.turn\n"
        "try:\n"
        "    loopscope.no_such_name\n"
        "except AttributeError as exc:\n"
        "    assert 'no_such_name' in str(exc)\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')\n"
    )
    loaded(code, [])


def test_help_imports_no_store_no_models_no_otel_sdk():
    found = loaded(CLI.format(argv=["--help"]), HEAVY + RECORDING + ["loopscope.models", "asyncio", "opentelemetry"])
    assert not any(found.values()), [name for name, is_in in found.items() if is_in]


def test_turns_reads_the_store_without_the_recorder_or_exporters(tmp_path):
    db = str(tmp_path / "demo.duckdb")
    loaded(CLI.format(argv=["--db", db, "demo"]), [])
    found = loaded(CLI.format(argv=["--db", db, "turns"]), [*RECORDING, "pyarrow", "opentelemetry.sdk.trace"])
    assert not any(found.values()), [name for name, is_in in found.items() if is_in]


@pytest.mark.parametrize(("command", "shown"), [
    ("turns", "concierge"), ("calls", "scripted-concierge"), ("stats", "loop end reasons"), ("tools", "get_weather"),
    ("status", "schema"),
])
def test_terminal_reads_print_plain_rows_without_pydantic_or_opentelemetry(tmp_path, command, shown):
    """The common terminal reads (``turns``, ``calls``, ``stats``, ``tools``, ``status``) print plain
    rows: no pydantic, no public models, no OpenTelemetry, and of DuckDB the engine alone
    where it is a module of its own (the ``duckdb`` package's Python layer costs ~4x a
    bare interpreter's start)."""
    db = str(tmp_path / "demo.duckdb")
    loaded(CLI.format(argv=["--db", db, "demo"]), [])
    code = "import io, contextlib\nout = io.StringIO()\nwith contextlib.redirect_stdout(out):\n" + "".join(
        "    " + line + "\n" for line in CLI.format(argv=["--db", db, command]).splitlines()
    ) + f"assert {shown!r} in out.getvalue().lower(), out.getvalue()\n"
    heavy = ["pydantic", "pydantic_core", "loopscope.models", "loopscope.storage.duckdb.store", "opentelemetry", "pyarrow"]
    found = loaded(code, [*heavy, "duckdb", "_duckdb"])
    engine_alone = importlib.util.find_spec("_duckdb") is not None
    assert found.pop("_duckdb" if engine_alone else "duckdb")  # it did read the store
    if not engine_alone:
        found.pop("_duckdb")
    assert not any(found.values()), [name for name, is_in in found.items() if is_in]


def test_with_the_engine_switch_off_terminal_reads_use_the_duckdb_package(tmp_path):
    """``LOOPSCOPE_DUCKDB_ENGINE=0`` turns off the one use of DuckDB's private engine module:
    the reads then go through the public ``duckdb`` package and print the same table."""
    db = str(tmp_path / "demo.duckdb")
    loaded(CLI.format(argv=["--db", db, "demo"]), [])
    code = "import io, contextlib\nout = io.StringIO()\nwith contextlib.redirect_stdout(out):\n" + "".join(
        "    " + line + "\n" for line in CLI.format(argv=["--db", db, "turns"]).splitlines()
    ) + "assert 'concierge' in out.getvalue().lower(), out.getvalue()\n"
    code += "import loopscope.storage.duckdb.engine as _e, duckdb as _d\nassert _e.duckdb is _d, _e.duckdb\n"
    found = loaded(code, ["duckdb"], env_extra={"LOOPSCOPE_DUCKDB_ENGINE": "0"})
    assert found["duckdb"]


def test_after_uninstrument_a_later_import_is_left_alone():
    code = (
        "import openai\n"
        "import loopscope\n"
        "loopscope.configure(False)\n"
        "loopscope.instrument()\n"
        "loopscope.uninstrument()\n"
        "import wrapt\n"
        "from openai.resources.chat.completions import completions\n"
        "assert not isinstance(completions.Completions.__dict__['create'], wrapt.FunctionWrapper)\n"
    )
    loaded(code, [])


# -- every public entry point on the defaults (issue 29) ---------------------------------------------
#
# Each case runs in a fresh interpreter, in an empty folder, with nothing configured (no
# LOOPSCOPE_DB, no configure()): its first loopscope call is the entry point itself, and it
# checks what that call says it does, in ./loopscope.duckdb where it records. Each case names
# the public names it covers; together they cover loopscope.__all__, so a new public name
# needs a case here.

_PRELUDE = """
import asyncio, os, sys
from pathlib import Path
import loopscope
STORE = Path("loopscope.duckdb").resolve()
assert not STORE.exists() and "LOOPSCOPE_DB" not in os.environ
"""

_DEFAULT_CASES: dict[str, tuple[tuple[str, ...], str]] = {
    "turn": (
        ("turn", "Turn", "Round", "AIResponseEvent", "LoopEndReason", "DeclaredTool", "flush"),
        """
        with loopscope.turn(session_id="s", agent="helper", input="hello", tools=[{"name": "lookup"}]) as t:
            assert isinstance(t, loopscope.Turn)
            with t.round(model="m") as r:
                assert isinstance(r, loopscope.Round)
                r.response("hi there", finish_reason="stop")
        assert isinstance(t.response, loopscope.AIResponseEvent)
        assert loopscope.flush() and STORE.exists()
        (turn,) = loopscope.Store().list_turns("s")
        assert (turn.response_content, turn.loop_end_reason) == ("hi there", loopscope.LoopEndReason.COMPLETED), turn
        assert turn.declared_tools == [loopscope.DeclaredTool(name="lookup")], turn.declared_tools
    """,
    ),
    "tool (decorator)": (
        ("tool", "ToolCallContent", "ActivityEvent", "EventType", "EventStatus"),
        """
        @loopscope.tool
        def lookup(city):
            return "sunny in " + city

        assert lookup("Paris") == "sunny in Paris"
        assert loopscope.flush() and STORE.exists()
        (end,) = [e for e in loopscope.Store().list_recent_events(10) if e.type == loopscope.EventType.TOOL_CALL_END]
        assert isinstance(end, loopscope.ActivityEvent) and end.status == loopscope.EventStatus.DELIVERED
        assert isinstance(end.content, loopscope.ToolCallContent), end.content
        assert (end.content.tool_name, end.content.result, end.content.outcome) == ("lookup", "sunny in Paris", "served")
    """,
    ),
    "tool (block) in a turn": (
        ("ToolExecution", "ToolCall"),
        """
        with loopscope.turn(session_id="s", input="find x") as t:
            t.generation(tool_calls=[loopscope.ToolCall(id="c1", name="search", arguments={"q": "x"})])
            with loopscope.tool("search", arguments={"q": "x"}, call_id="c1") as call:
                assert isinstance(call, loopscope.ToolExecution)
                call.set_result("found")
            t.generation("done")
        assert loopscope.flush()
        ends = [e.content for e in loopscope.Store().get_timeline("s") if e.type == "tool_call_end"]
        assert [(c.tool_id, c.result) for c in ends] == [("c1", "found")], ends
    """,
    ),
    "session": (
        ("session", "SessionInfo", "TextContent"),
        """
        with loopscope.session("chat-1"), loopscope.turn(input="hi") as t:
            t.generation("hello")
        assert loopscope.flush()
        (info,) = loopscope.Store().list_sessions()
        assert isinstance(info, loopscope.SessionInfo) and (info.session_id, info.turn_count) == ("chat-1", 1), info
        texts = [e.content for e in loopscope.Store().get_timeline("chat-1")]
        assert all(isinstance(c, loopscope.TextContent) for c in texts), texts
        assert [c.body for c in texts] == ["hi", "hello"], texts
    """,
    ),
    "state": (
        ("state_snapshot", "state_delta"),
        """
        loopscope.state_snapshot({"n": 1}, session_id="s")
        loopscope.state_delta([{"op": "replace", "path": "/n", "value": 2}], session_id="s")
        assert loopscope.flush()
        assert loopscope.Store().derive_state("s") == {"n": 2}
    """,
    ),
    "score": (
        ("score",),
        """
        with loopscope.turn(session_id="s", input="hi") as t:
            t.generation("hello")
            loopscope.score(name="polite", label="yes", source="model")  # the turn running here
        loopscope.score(t, "helpful", value=1, explanation="said hello")
        assert loopscope.flush()
        names, rows = loopscope.Store().sql("SELECT name, value, label, target, turn_id FROM score_targets ORDER BY name")
        assert rows == [("helpful", 1.0, None, "turn", t.correlation_id), ("polite", None, "yes", "turn", t.correlation_id)], rows
    """,
    ),
    "instrument": (
        ("instrument", "uninstrument", "ModelCall"),
        """
        loopscope.instrument()
        import openai
        client = openai.OpenAI(base_url=sys.argv[1], api_key="test-key", max_retries=0)
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        loopscope.uninstrument()
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi again"}])
        assert loopscope.flush()
        calls = loopscope.Store().model_calls()
        assert [type(c) for c in calls] == [loopscope.ModelCall] and calls[0].request_model == "m", calls
    """,
    ),
    "configure": (
        ("configure", "Pipeline", "PersistencePolicy", "shutdown"),
        """
        pipeline = loopscope.configure(policy=loopscope.PersistencePolicy(exclude_types=["state_snapshot"]))
        assert isinstance(pipeline, loopscope.Pipeline) and pipeline.db_path == str(STORE), pipeline.db_path
        loopscope.state_snapshot({"n": 1}, session_id="s")  # not stored: the policy
        loopscope.state_delta([{"op": "add", "path": "/n", "value": 1}], session_id="s")
        loopscope.shutdown()
        assert [e.type for e in loopscope.Store().list_events("s")] == ["state_delta"]
    """,
    ),
    "flush and shutdown alone": (
        (),
        """
        assert loopscope.flush() is True
        loopscope.shutdown()
        assert not STORE.exists()  # nothing recorded, nothing made
    """,
    ),
    "Store": (
        (
            "Store",
            "StoreError",
            "StoreLockedError",
            "SQLRefusedError",
            "EventFilter",
            "RESPONSE_SEGMENT_SEPARATOR",
            "EventSource",
        ),
        """
        store = loopscope.Store()
        assert store.path == str(STORE)
        try:
            store.list_sessions()
        except loopscope.StoreError as exc:
            assert str(STORE) in str(exc) and not isinstance(exc, loopscope.StoreLockedError)
        else:
            raise AssertionError("an empty folder has a store")
        with loopscope.turn(session_id="s", input="hi", framework="mine") as t:
            t.generation("a", tool_calls=[{"id": "c1", "name": "search"}])
            with loopscope.tool("search", call_id="c1") as call:
                call.set_result("found")
            t.generation("b")
        assert loopscope.flush()
        messages = store.list_events("s", event_filter=loopscope.EventFilter(event_types=["message"]))
        assert [m.content.body for m in messages] == ["hi", "a", "b"], messages
        (turn,) = store.list_turns("s")
        assert turn.response_content == "a" + loopscope.RESPONSE_SEGMENT_SEPARATOR + "b", turn
        assert isinstance(messages[0].source, loopscope.EventSource) and messages[0].source.framework == "mine"
        assert store.sql("SELECT count(*) FROM turns")[1] == [(1,)]
        try:
            store.sql("COPY turns TO 'out.csv'")
        except loopscope.SQLRefusedError:
            pass
        else:
            raise AssertionError("a write was run")
    """,
    ),
    "AsyncStore": (
        ("AsyncStore",),
        """
        store = loopscope.AsyncStore()
        assert store.path == str(STORE)
        with loopscope.turn(session_id="s", input="hi") as t:
            t.generation("hello")
        assert loopscope.flush()
        (turn,) = asyncio.run(store.list_turns("s"))
        assert turn.response_content == "hello"
    """,
    ),
    "conversation stores": (
        ("ConversationStore", "DuckDBConversationStore", "InMemoryConversationStore"),
        """
        history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
        for store in (loopscope.InMemoryConversationStore(), loopscope.DuckDBConversationStore()):
            assert isinstance(store, loopscope.ConversationStore)
            store.save_sync("c", history)
            assert store.get_sync("c") == history
        assert STORE.exists() and loopscope.DuckDBConversationStore().list_sync() == ["c"]
    """,
    ),
    "__version__": (
        ("__version__",),
        """
        from importlib.metadata import version
        assert loopscope.__version__ == version("loopscope")
    """,
    ),
}


def test_the_default_cases_cover_every_public_name():
    covered = {name for names, _ in _DEFAULT_CASES.values() for name in names}
    assert covered == set(loopscope_all()), sorted(covered ^ set(loopscope_all()))


def loopscope_all() -> list[str]:
    import loopscope

    return list(loopscope.__all__)


@pytest.mark.parametrize("case", list(_DEFAULT_CASES))
def test_every_public_entry_point_works_on_the_defaults_in_a_fresh_process(spawn, model_server, case):
    """Nothing configured, in an empty folder: the hand API, ``instrument()``, the stores each
    do what they say, recording in ``./loopscope.duckdb`` (the hand API raised here once:
    ``loopscope.pipeline is not imported``)."""
    from fakes.model_server import Reply

    model_server.queue(Reply(text="hello"))
    child = spawn("entry", _PRELUDE + textwrap.dedent(_DEFAULT_CASES[case][1]), model_server.openai_base_url)
    child.finish_ok(60)
    assert "Traceback" not in child.err.read_text(), child.output()


_READS = [
    ["sessions"],
    ["timeline"],
    ["turns"],
    ["calls"],
    ["stats"],
    ["tools"],
    ["tail"],
    ["status"],
    ["sql", "SELECT 1"],
    ["export", "--parquet", "out"],
    ["export", "--agui", "s"],
]
"""The commands that read the store (``ui`` and ``collect`` serve until stopped: their own tests)."""


def test_the_commands_work_on_the_defaults_in_an_empty_folder(tmp_path):
    """In an empty folder with nothing set, each reading command says in one line that there is
    no store at ``./loopscope.duckdb`` (and makes none); a program using the hand API with
    nothing configured records there, and every read then answers."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "LOOPSCOPE_"))}
    env.update({"PYTHONPATH": str(ROOT), "LOOPSCOPE_STRICT": "1"})
    store = tmp_path / "loopscope.duckdb"

    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "loopscope", *argv],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    for argv in _READS:
        done = cli(*argv)
        assert (done.returncode, done.stdout) == (2, ""), (argv, done.stderr)
        assert done.stderr.count("\n") == 1 and "no loopscope store" in done.stderr, (argv, done.stderr)
    assert not store.exists()
    program = tmp_path / "agent.py"
    program.write_text(
        "import loopscope\n"
        "@loopscope.tool\n"
        "def lookup(city):\n"
        "    return 'sunny'\n"
        "with loopscope.turn(session_id='s', input='weather?') as t:\n"
        "    t.generation(tool_calls=[{'id': 'c1', 'name': 'lookup', 'arguments': {'city': 'Oslo'}}])\n"
        "    lookup('Oslo')\n"
        "    t.generation('It is sunny.')\n"
        # the close at exit is bounded (5 s), and a loaded machine may take longer to start the
        # writer process and make the store: what it then loses is counted, not what this tests
        "assert loopscope.flush()\n"
    )
    done = subprocess.run(
        [sys.executable, str(program)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    for argv in _READS:
        done = cli(*argv)
        assert done.returncode == 0 and "Traceback" not in done.stderr, (argv, done.stderr)
    assert "It is sunny." in cli("turns").stdout and "lookup" in cli("tools").stdout
