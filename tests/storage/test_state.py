"""State as events of the log: ``state_snapshot`` / ``state_delta`` rows and ``Store.derive_state``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider

import loopscope
from loopscope import EventType, PersistencePolicy
from loopscope import semconv as a
from loopscope.ingest.otlp.collector import Collector
from loopscope.storage.duckdb.state import StatePatchError, apply_patch


def state_rows(store: loopscope.Store, session: str) -> list[tuple[int, str, dict]]:
    return [
        (e.index, e.type, e.content)
        for e in store.get_timeline(session)
        if e.type in (EventType.STATE_SNAPSHOT.value, EventType.STATE_DELTA.value)
    ]


def test_the_last_snapshot_is_the_state(recording) -> None:
    store = recording.store
    assert store.derive_state("cart") is None  # no session at all
    with loopscope.turn(session_id="cart", input="add milk") as t:
        assert store.derive_state("cart") is None  # a session without state
        cart = {"items": ["milk"], "total": 1.5}
        t.state(cart)
        cart["items"].append("changed after")  # recorded as it was when given
        t.generation("Added milk.", finish_reason="stop")
    loopscope.state_snapshot({"items": ["milk", "eggs"], "total": 4.0}, session_id="cart")
    assert store.derive_state("cart") == {"items": ["milk", "eggs"], "total": 4.0}
    assert store.derive_state("cart", at_index=3) == {"items": ["milk"], "total": 1.5}
    assert store.derive_state("cart", at_index=1) is None
    assert asyncio.run(loopscope.AsyncStore(store.path).derive_state("cart")) == {"items": ["milk", "eggs"], "total": 4.0}
    rows = state_rows(store, "cart")
    assert rows == [
        (2, "state_snapshot", {"snapshot": {"items": ["milk"], "total": 1.5}}),
        (4, "state_snapshot", {"snapshot": {"items": ["milk", "eggs"], "total": 4.0}}),
    ]
    # the first belongs to its turn, the second to no turn
    events = {e.index: e for e in store.get_timeline("cart")}
    assert events[2].correlation_id == t.correlation_id and events[4].correlation_id is None


def test_deltas_after_the_last_snapshot_are_applied_in_order(recording) -> None:
    store = recording.store
    with loopscope.session("plan"):
        loopscope.state_delta([{"op": "add", "path": "/early", "value": True}])  # before any snapshot: on {}
        assert store.derive_state("plan") == {"early": True}
        with loopscope.turn(input="plan a trip") as t:
            t.state({"steps": [], "status": "planning"})
            t.state_delta([{"op": "add", "path": "/steps/-", "value": "flight"}])
            t.state_delta([
                {"op": "add", "path": "/steps/-", "value": "hotel"},
                {"op": "replace", "path": "/status", "value": "booked"},
            ])
            t.generation("Booked.", finish_reason="stop")
    assert store.derive_state("plan") == {"steps": ["flight", "hotel"], "status": "booked"}
    assert store.derive_state("plan", at_index=4) == {"steps": ["flight"], "status": "planning"}
    assert [r[1] for r in state_rows(store, "plan")] == ["state_delta", "state_snapshot", "state_delta", "state_delta"]
    assert state_rows(store, "plan")[2][2] == {"delta": [{"op": "add", "path": "/steps/-", "value": "flight"}]}
    # a delta that does not fit the state is reported with its index
    loopscope.state_delta([{"op": "remove", "path": "/nothing"}], session_id="plan")
    with pytest.raises(StatePatchError, match="index 7"):
        store.derive_state("plan")
    loopscope.state_snapshot({"fresh": 1}, session_id="plan")  # a snapshot starts over
    assert store.derive_state("plan") == {"fresh": 1}


def test_state_spans_go_through_the_span_pipeline(recording) -> None:
    with loopscope.turn(session_id="s", agent="planner", input="go") as t:
        t.state({"k": "v"})
        t.generation("ok", finish_reason="stop")
    spans = {s.name: s for s in recording.spans()}
    state, turn = spans["state_snapshot"], spans["invoke_agent planner"]
    assert state.parent.span_id == turn.context.span_id  # under the turn in the trace
    assert state.start_time == state.end_time
    assert a.OPERATION not in state.attributes  # not a GenAI operation for a backend to count
    assert json.loads(state.attributes[a.STATE_VALUE]) == {"k": "v"}
    assert state.attributes[a.STATE_KIND] == "snapshot" and state.attributes[a.TURN_ID] == t.correlation_id
    [row] = [e for e in recording.store.get_timeline("s") if e.type == "state_snapshot"]
    assert row.span_id == format(state.context.span_id, "016x") and row.source.channel_id == "planner"


def test_bad_state_calls_raise() -> None:
    with pytest.raises(ValueError, match="session"):
        loopscope.state_snapshot({"x": 1})  # whose?
    with pytest.raises(TypeError):
        loopscope.state_delta({"op": "add"}, session_id="s")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        loopscope.state_delta([{"op": "frobnicate", "path": "/x"}], session_id="s")


def test_a_policy_can_leave_state_out(tmp_path: Path) -> None:
    db = tmp_path / "p.duckdb"
    loopscope.configure(db, tracer_provider=TracerProvider(), flush_interval=0.05,
                        policy=PersistencePolicy(exclude_types=[EventType.STATE_SNAPSHOT]))
    try:
        with loopscope.turn(session_id="s", input="hi") as t:
            t.state({"a": 1})
            t.state_delta([{"op": "add", "path": "/b", "value": 2}])
            t.generation("ok", finish_reason="stop")
        store = loopscope.Store(str(db))
        assert [e.type for e in store.get_timeline("s")] == ["message", "state_delta", "message"]
        assert [e.index for e in store.get_timeline("s")] == [1, 2, 3]  # no index used up
        assert store.derive_state("s") == {"b": 2}
    finally:
        loopscope.shutdown()


def test_state_survives_a_restart(tmp_path: Path) -> None:
    db = tmp_path / "r.duckdb"
    loopscope.configure(db, tracer_provider=TracerProvider(), flush_interval=0.05)
    loopscope.state_snapshot({"approval": {"pending": True, "ask": "refund 30 EUR?"}}, session_id="hitl")
    loopscope.shutdown()
    # another process reads it back, and one more resumes from it
    code = (
        "import sys, json, loopscope\n"
        "store = loopscope.Store(sys.argv[1])\n"
        "state = store.derive_state('hitl')\n"
        "loopscope.configure(sys.argv[1], flush_interval=0.05)\n"
        "loopscope.state_delta([{'op': 'replace', 'path': '/approval/pending', 'value': False}], session_id='hitl')\n"
        "loopscope.shutdown()\n"
        "print(json.dumps(state))\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(db)], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(out.stdout) == {"approval": {"pending": True, "ask": "refund 30 EUR?"}}
    assert loopscope.Store(str(db)).derive_state("hitl") == {"approval": {"pending": False, "ask": "refund 30 EUR?"}}


@pytest.mark.parametrize("capture", [True, False])
def test_state_through_a_collector(tmp_path: Path, capture: bool) -> None:
    local = tmp_path / "local.duckdb"
    with Collector(str(tmp_path / "c.duckdb"), http_port=0, grpc_port=None, flush_interval=0.05) as collector:
        loopscope.configure(local, tracer_provider=TracerProvider(), otlp_endpoint=collector.http_endpoint,
                            capture_content=capture, flush_interval=0.05)
        with loopscope.turn(session_id="c", input="hi") as t:
            t.state({"n": 1})
            t.generation("one", tool_calls=[{"id": "x", "name": "noop", "arguments": {}}])
            t.state_delta([{"op": "replace", "path": "/n", "value": 2}])
            t.generation("two", finish_reason="stop")
        loopscope.shutdown()
    mine, theirs = loopscope.Store(str(local)), loopscope.Store(collector.db)
    assert mine.derive_state("c") == {"n": 2}
    if capture:  # the same rows, the same ids and indices, the same state
        assert [(e.id, e.index, e.type, e.content) for e in theirs.get_timeline("c")] == [
            (e.id, e.index, e.type, e.content) for e in mine.get_timeline("c")
        ]
        assert theirs.derive_state("c") == {"n": 2}
    else:  # state is content: it stays in the process unless content capture is on
        assert "state_snapshot" not in {e.type for e in theirs.get_timeline("c")}
        assert theirs.derive_state("c") is None


@pytest.mark.parametrize(
    ("doc", "patch", "result"),
    [
        ({"a": 1}, [{"op": "add", "path": "/b", "value": [1]}], {"a": 1, "b": [1]}),
        ([1, 3], [{"op": "add", "path": "/1", "value": 2}], [1, 2, 3]),
        ({"a": [1]}, [{"op": "add", "path": "/a/-", "value": 2}], {"a": [1, 2]}),
        ({"a": 1, "b": 2}, [{"op": "remove", "path": "/a"}], {"b": 2}),
        ({"a": [1, 2, 3]}, [{"op": "remove", "path": "/a/0"}], {"a": [2, 3]}),
        ({"a": 1}, [{"op": "replace", "path": "/a", "value": {"x": 1}}], {"a": {"x": 1}}),
        ({"a": {"b": 1}}, [{"op": "move", "from": "/a/b", "path": "/c"}], {"a": {}, "c": 1}),
        ({"a": [1]}, [{"op": "copy", "from": "/a", "path": "/b"}], {"a": [1], "b": [1]}),
        ({"a/b": 1, "m~n": 2}, [{"op": "replace", "path": "/a~1b", "value": 3}, {"op": "remove", "path": "/m~0n"}], {"a/b": 3}),
        ({"a": 1}, [{"op": "test", "path": "/a", "value": 1}, {"op": "replace", "path": "", "value": [0]}], [0]),
    ],
)
def test_json_patch(doc, patch, result) -> None:
    before = json.dumps(doc)
    assert apply_patch(doc, patch) == result
    assert json.dumps(doc) == before  # a new object: the input is left alone


@pytest.mark.parametrize(
    "patch",
    [
        [{"op": "test", "path": "/a", "value": 2}],
        [{"op": "replace", "path": "/missing", "value": 1}],
        [{"op": "add", "path": "/list/5", "value": 1}],
        [{"op": "add", "path": "/list/01", "value": 1}],
        [{"op": "add", "path": "no-slash", "value": 1}],
        [{"op": "move", "from": "/list", "path": "/list/0"}],
        [{"op": "nope", "path": "/a"}],
    ],
)
def test_json_patch_refuses(patch) -> None:
    with pytest.raises(StatePatchError):
        apply_patch({"a": 1, "list": [0]}, patch)
