"""``mapping.row_counts``: the rows a span makes, counted without mapping it (what a writer
counts as lost when it loses the span before its mapping), agrees with the mapping itself
(``collect``) on every span a real openai tool loop, a failed call, a hand-made turn and
state rows record, with and without the policy's exclusions; and their sum is what the
store holds."""

from __future__ import annotations

import openai
import pytest

import loopscope
from fakes.model_server import FakeModelServer, Reply, ToolCall
from loopscope.ingest.mapping import collect, row_counts
from loopscope.storage.rows import END, START

SKIPS = [frozenset(), frozenset({"message"}), frozenset({"tool_call_start", "tool_call_end"}),
         frozenset({"model_error", "state_snapshot", "state_delta"})]


def _record(server: FakeModelServer) -> None:
    client = openai.OpenAI(base_url=server.openai_base_url, api_key="sk-test", max_retries=0)
    server.queue(Reply(tool_calls=[ToolCall("weather", {"city": "Oslo"}, id="call_1")]), Reply(text="Sunny in Oslo."))
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    first = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=tools)  # type: ignore[arg-type]
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]

    @loopscope.tool
    def weather(city: str) -> str:
        return f"sunny in {city}"

    result = weather(city="Oslo")
    messages += [first.choices[0].message.model_dump(), {"role": "tool", "tool_call_id": call.id, "content": result}]  # type: ignore[list-item]
    client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=tools)  # type: ignore[arg-type]
    server.queue(Reply.error(500, "overloaded"))
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "again?"}])
    with loopscope.turn(session_id="hand", input="a question") as t:
        with t.round() as rnd:
            rnd.response("calling", tool_calls=[{"id": "c1", "name": "weather", "arguments": {"city": "Rome"}}])
        weather(city="Rome")
        t.generation("done", finish_reason="stop")
        t.state_delta([{"op": "add", "path": "/x", "value": 1}])
    loopscope.state_snapshot({"step": 2}, session_id="hand")


def test_row_counts_agree_with_the_mapping_and_the_store(instrumented, server: FakeModelServer) -> None:
    _record(server)
    assert loopscope.flush(30)
    spans = instrumented.spans()
    assert len(spans) > 8
    for skip in SKIPS:
        for span in spans:
            for kind in (START, END):
                events: list = []
                turns: list = []
                collect([(kind, span)], events, turns, skip, [])
                assert row_counts(kind, span.attributes, skip) == (len(events), len(turns)), (span.name, kind, skip)
    total = [row_counts(kind, span.attributes) for span in spans for kind in (START, END)]
    _, rows = instrumented.store.sql("SELECT (SELECT count(*) FROM events), (SELECT count(*) FROM turns)")
    assert rows[0] == (sum(e for e, _ in total), sum(t for _, t in total))
