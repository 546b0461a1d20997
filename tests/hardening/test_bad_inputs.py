"""Bad input from every side: odd Python values from the application (property-based),
huge values, thousands of tools, garbage from a provider. Each is stored readably or
refused with a clear reason, the user's call sees what it would see without loopscope,
and nothing else is lost."""

from __future__ import annotations

import datetime as dt
import decimal
import json
from typing import Any

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import loopscope
from fakes.model_server import Reply
from loopscope import LoopEndReason, _json

SURROGATES = st.sampled_from(["\ud800", "\udfff", "a\udc80b"])
TEXT = st.one_of(st.text(max_size=40), SURROGATES, st.just("nul\x00inside"), st.just("\u2028line\u2029sep"))
LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**80), max_value=2**80),  # past int64 too
    st.floats(allow_nan=True, allow_infinity=True),
    TEXT,
    st.binary(max_size=20),  # invalid UTF-8 among them
    st.datetimes(timezones=st.sampled_from([None, dt.timezone.utc])),
    st.decimals(allow_nan=False, allow_infinity=False, places=3),
    st.frozensets(st.integers(0, 9), max_size=4),
)
VALUES = st.recursive(
    LEAVES,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.tuples(children, children),
        st.dictionaries(st.one_of(TEXT, st.integers(0, 5)), children, max_size=4),
    ),
    max_leaves=12,
)


class Unprintable:
    def __repr__(self) -> str:
        raise ValueError("no repr for you")

    __str__ = __repr__


def test_any_value_as_arguments_result_and_text_is_stored_readably(recording) -> None:
    written: list[tuple[str, Any, str]] = []

    @loopscope.tool
    def echo(value: Any) -> Any:
        return value

    @settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(value=VALUES, text=TEXT)
    def record(value: Any, text: str) -> None:
        session = f"prop-{len(written)}"
        with loopscope.turn(session_id=session, input=text) as t:
            t.generation(text, tool_calls=[{"id": "c1", "name": "echo", "arguments": {"value": value}}])
            assert echo(value) is value  # the user's value comes back untouched
            t.generation(text, finish_reason="stop")
        written.append((session, value, text))

    record()
    assert loopscope.flush()
    store = recording.store
    for session, value, text in written:
        events = store.get_timeline(session)
        # the text: the input, and each round's (a round without text makes no row)
        readable_text = json.loads(_json.dumps(text))
        assert [e.content.body for e in events if e.type == "message" and e.content.role == "user"] == [readable_text]
        assistant = [e.content.body for e in events if e.type == "message" and e.content.role == "assistant"]
        assert assistant == ([readable_text] * 2 if text else [])
        tools = [e for e in events if e.type.startswith("tool_call")]
        assert [e.type for e in tools] == ["tool_call_start", "tool_call_end"]
        end = tools[1].content
        # what was stored is exactly the readable JSON form of the value, nothing lost beside it
        readable = json.loads(_json.dumps(value))
        # compared as JSON text: a NaN is stored as NaN, and NaN != NaN
        assert json.dumps(end.result) == json.dumps(readable)
        assert json.dumps(end.arguments) == json.dumps({"value": readable})
        assert end.outcome == "served"


def test_values_that_refuse_to_print_or_loop_are_stored_readably(recording) -> None:
    cyclic: list[Any] = [1]
    cyclic.append(cyclic)

    @loopscope.tool
    def odd(a: Any, b: Any) -> Any:
        return {"a": a, "b": b}

    with loopscope.turn(session_id="odd") as t:
        t.generation(tool_calls=[{"id": "o1", "name": "odd", "arguments": None}])
        odd(Unprintable(), cyclic)
        t.generation("done", finish_reason="stop")
    end = next(e for e in recording.store.get_timeline("odd") if e.type == "tool_call_end").content
    assert end.result["a"].startswith("<unrepresentable Unprintable")
    assert end.result["b"] == [1, "<cycle>"]


def test_a_fifty_megabyte_result_is_stored_capped_with_its_size(recording) -> None:
    huge = "y" * 50_000_000

    @loopscope.tool
    def dump() -> str:
        return huge

    with loopscope.turn(session_id="huge") as t:
        t.generation(tool_calls=[{"id": "h1", "name": "dump", "arguments": {}}])
        assert dump() is huge
        t.generation("ok", finish_reason="stop")
    assert loopscope.flush(timeout=60)
    events = recording.store.get_timeline("huge")
    assert [e.type for e in events] == ["tool_call_start", "tool_call_end", "message"]
    result = events[1].content.result
    assert isinstance(result, str) and result.startswith("yyyy")
    assert len(result) < 2_000_000  # capped, with a marker that says how big it was
    assert "50000000" in result.replace(",", "").replace("_", "")
    assert events[2].content.body == "ok"  # the rest of the turn is all there


def test_thousands_of_tools_are_declared_in_order(recording) -> None:
    tools = [{"name": f"tool_{i:04d}", "description": f"tool number {i}", "parameters": {"type": "object"}} for i in range(5000)]
    with loopscope.turn(session_id="many", tools=tools) as t:
        t.generation("thinking", tool_calls=[{"id": "m1", "name": "tool_0042", "arguments": {}}])  # the turn's 5000
        t.generation("picked none", finish_reason="stop", tools=tools[:10] + [{"name": "late_tool"}])
    response = t.response
    assert [d.name for d in response.declared_tools] == [f"tool_{i:04d}" for i in range(5000)] + ["late_tool"]
    (stored,) = recording.store.list_turns("many")
    assert len(stored.declared_tools) == 5001
    assert stored.declared_tools[4999].description == "tool number 4999"


def _chat(server: Any, stream: bool) -> Any:
    client = openai.OpenAI(base_url=server.openai_base_url, api_key="sk-x", max_retries=0)
    result = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=stream)
    return list(result) if stream else result


GARBAGE = [
    ("json", False, b'{"id": "x", "choices": [{"message": '),  # cut short
    ("json", False, b"<html>502 Bad Gateway</html>"),
    ("sse", True, b"data: {not json at all\n\n"),
    ("sse", True, b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"par"}}]}\n\ndata: {"id":\n\n'),
]


@pytest.mark.parametrize(("kind", "stream", "body"), GARBAGE, ids=[f"{g[0]}-{i}" for i, g in enumerate(GARBAGE)])
def test_garbage_from_the_provider_reaches_the_user_as_it_would_without_loopscope(recording, model_server, kind, stream, body) -> None:
    model_server.queue(Reply(raw_body=body))
    with pytest.raises(Exception) as plain:  # whatever the SDK raises, the same must come
        _chat(model_server, stream)
    loopscope.instrument(anthropic=False)
    try:
        model_server.queue(Reply(raw_body=body))
        with pytest.raises(Exception) as instrumented:
            _chat(model_server, stream)
    finally:
        loopscope.uninstrument()
    assert type(instrumented.value) is type(plain.value)
    assert str(instrumented.value) == str(plain.value)
    assert loopscope.flush()
    (session,) = recording.store.list_sessions()
    (turn,) = recording.store.list_turns(session.session_id)
    assert turn.loop_end_reason is LoopEndReason.ERROR
    assert turn.error.startswith(type(plain.value).__qualname__)
    chats = [s for s in recording.spans() if s.attributes.get("gen_ai.operation.name") == "chat"]
    assert len(chats) == 1 and chats[0].end_time is not None  # the round ended, once


def _chat_spans(recording) -> list[Any]:
    return [s for s in recording.spans() if s.attributes.get("gen_ai.operation.name") == "chat"]


def test_decimal_and_datetime_keys_and_nan_in_usage_do_not_break_a_turn(recording, caplog) -> None:
    when = dt.datetime(2026, 1, 2, 3, 4, 5)
    usage = {"input_tokens": decimal.Decimal(3), when: 7, "output_tokens": float("nan"), "nan_usage_tokens": float("nan")}
    with loopscope.turn(session_id="usage") as t:
        t.generation("x", finish_reason="stop", usage=usage)  # type: ignore[arg-type]
    response = t.response  # built from the summary: it must validate
    assert response.loop_end_reason is LoopEndReason.COMPLETED and response.response_content == "x"
    # the Decimal is a count, the datetime key is its text, the NaN is no count: left out...
    assert response.usage == {"input_tokens": 3, "2026-01-02T03:04:05": 7}
    assert loopscope.flush()
    (stored,) = recording.store.list_turns("usage")
    assert stored.usage == {"input_tokens": 3} and stored.response_content == "x"
    # ...said in the log, and kept as text on the round's span
    assert "usage nan_usage_tokens=nan is not a token count" in caplog.text
    (chat,) = _chat_spans(recording)
    assert json.loads(chat.attributes["loopscope.usage.invalid"]) == {"output_tokens": "nan", "nan_usage_tokens": "nan"}
    assert "gen_ai.usage.output_tokens" not in chat.attributes


NOT_COUNTS = [
    ("nan", float("nan"), "nan"),
    ("inf", float("inf"), "inf"),
    ("minus-inf", float("-inf"), "-inf"),
    ("text", "n/a", "n/a"),
    ("negative", -1, "-1"),
    ("fraction", 12.5, "12.5"),
    ("bool", True, "true"),
    ("past-int64", 2**63, str(2**63)),
    ("past-the-digit-limit", 10**5000, hex(10**5000)),
    ("bytes", b"\xff", "{\"$bytes_base64\": \"/w==\"}"),
    ("unprintable", Unprintable(), "<unrepresentable Unprintable: ValueError>"),
]


@pytest.mark.parametrize(("label", "value", "kept"), NOT_COUNTS, ids=[n[0] for n in NOT_COUNTS])
def test_a_usage_value_that_is_not_a_token_count_is_left_out_said_and_kept(recording, caplog, label, value, kept) -> None:
    key = f"{label}_tokens"  # a key of its own: each is said once per process
    with loopscope.turn(session_id=label) as t:
        t.generation("ok", finish_reason="stop", usage={"input_tokens": value, "output_tokens": 5, key: value})
    assert t.response.usage == {"output_tokens": 5}  # no exception, and the good value is kept
    assert loopscope.flush()
    (stored,) = recording.store.list_turns(label)
    assert stored.usage == {"output_tokens": 5} and stored.response_content == "ok"
    assert f"usage {key}=" in caplog.text and "is not a token count" in caplog.text
    (chat,) = _chat_spans(recording)
    assert json.loads(chat.attributes["loopscope.usage.invalid"]) == {"input_tokens": kept, key: kept}


@pytest.mark.parametrize("value", ["12", " 12 ", 12.0, decimal.Decimal(12), decimal.Decimal("12.000")], ids=repr)
def test_a_usage_value_that_is_unambiguously_a_count_is_taken(recording, value) -> None:
    with loopscope.turn(session_id="counts") as t:
        t.generation("ok", finish_reason="stop", usage={"input_tokens": value})
    assert t.response.usage == {"input_tokens": 12}
    assert loopscope.flush()
    (stored,) = recording.store.list_turns("counts")
    assert stored.usage == {"input_tokens": 12}
    (chat,) = _chat_spans(recording)
    assert chat.attributes["gen_ai.usage.input_tokens"] == 12 and "loopscope.usage.invalid" not in chat.attributes


def test_ids_and_names_given_as_numbers_are_recorded_as_text(recording) -> None:
    with loopscope.session(777), loopscope.turn(agent=7, model=3.5, provider=9, correlation_id=99) as t:
        t.generation("calling", tool_calls=[{"id": 42, "name": "lookup", "arguments": {"q": 1}}], response_id=5, finish_reason=1)
        with loopscope.tool("lookup", call_id=42, description=8) as call:  # serves the model's call 42
            call.set_result("found")
        t.generation("done", finish_reason="stop")
        loopscope.state_snapshot({"step": 2}, session_id=12345)
    response = t.response  # a pydantic model: an int session id made it fail validation
    assert (response.session_id, response.channel_id, response.model, response.provider) == ("777", "7", "3.5", "9")
    assert response.correlation_id == "99" and response.round_count == 1 and response.tool_calls_count == 1
    assert loopscope.flush()
    (stored,) = recording.store.list_turns("777")
    assert stored.correlation_id == "99" and stored.channel_id == "7"
    tools = [e for e in recording.store.get_timeline("777") if e.type.startswith("tool_call")]
    assert [(e.type, e.content.tool_id, e.content.outcome) for e in tools] == [
        ("tool_call_start", "42", None), ("tool_call_end", "42", "served")
    ]
    assert [e.type for e in recording.store.get_timeline("12345")] == ["state_snapshot"]


def test_an_integer_too_long_to_write_in_decimal_keeps_the_round_text_and_the_tool_rows(recording) -> None:
    huge = 10**5000  # past sys.get_int_max_str_digits(): str(huge) raises ValueError

    @loopscope.tool
    def count(n: int) -> int:
        return n + 1

    with loopscope.turn(session_id="huge-int") as t:
        t.generation("counting", tool_calls=[{"id": "n1", "name": "count", "arguments": {"n": huge}}])
        assert count(huge) == huge + 1
        t.generation("counted", finish_reason="stop")
    assert t.response.response_content == "counting\n\ncounted" and t.response.tool_calls_count == 1
    assert loopscope.flush()
    events = recording.store.get_timeline("huge-int")
    assert [e.type for e in events] == ["message", "tool_call_start", "tool_call_end", "message"]
    assert [e.content.body for e in events if e.type == "message"] == ["counting", "counted"]
    end = events[2].content
    # kept exactly, as hex text: int(text, 16) gives the number back
    assert int(end.arguments["n"], 16) == huge and int(end.result, 16) == huge + 1
    assert int(json.loads(_json.dumps(huge)), 16) == huge


BAD = st.sampled_from([
    float("nan"), float("inf"), -1, "n/a", None, "", 10**5000, 2**64, 12345, 12.5, True, b"\xff\xfe", b"id",
    Unprintable(), dt.datetime(2026, 1, 2), decimal.Decimal("NaN"), ["a", 1], {"k": float("nan")},
])


def test_bad_values_through_every_hand_api_entry_point_never_raise_and_lose_nothing_else(recording) -> None:
    turns: list[tuple[loopscope.Turn, Any]] = []

    @settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(v=BAD, w=BAD)
    def record(v: Any, w: Any) -> None:
        with loopscope.session(v if v not in (None, "") else f"s-{len(turns)}"):
            tools = [{"name": v, "description": w, "parameters": {"type": "object", "x": w}, "origin": w}]
            with loopscope.turn(agent=w, model=v, provider=w, framework=v, correlation_id=w, input=v, streaming=w, tools=tools) as t:
                t.declare_tools([{"name": w, "description": v}], origin=v)
                t.generation(
                    v, tool_calls=[{"id": w, "name": v, "arguments": {"x": w}}], usage={"input_tokens": v, "output_tokens": 3},
                    finish_reason=w, model=v, thinking=w, response_id=v, start_time=w, end_time=v, blocked=w,
                )
                with loopscope.tool(v, arguments=w, call_id=w, description=v) as call:
                    call.set_result(v)
                    call.refuse(w)
                with t.round(model=w, provider=v, stream=v) as rnd:
                    rnd.text_delta(v)
                    rnd.response("good text", usage=w)
                t.set_correlation_id(w)
                t.end_call(v, w, outcome=w)
                t.state({"v": v})
        turns.append((t, v))

    record()
    assert loopscope.flush()
    store = recording.store
    for t, v in turns:
        response = t.response  # a valid AIResponseEvent, whatever went in
        assert isinstance(response.session_id, str) and response.session_id
        assert response.usage.get("output_tokens") == 3  # the good count is kept beside a bad one
        assert response.response_content.endswith("good text")  # the round after the bad values too
        # stored as it was answered (an id given twice is two turns of one id: any of them)
        stored = [s for s in store.list_turns(response.session_id) if s.correlation_id == response.correlation_id]
        assert any(s.response_content == response.response_content and s.usage == response.usage for s in stored)
        kinds = [e.type for e in store.get_timeline(response.session_id)]
        assert "tool_call_end" in kinds and "state_snapshot" in kinds
    assert len(turns) == 80
