import loopscope


def test_turn_lands_in_store(recording):
    @loopscope.tool
    def add(a: int, b: int) -> int:
        return a + b

    with loopscope.turn(session_id="s", agent="calc", tools=[add]) as t:
        t.generation("adding", tool_calls=[{"id": "c1", "name": "add", "arguments": {"a": 1, "b": 2}}])
        add(1, 2)
        t.generation("3")
    events = recording.store.get_timeline("s")
    assert [e.type for e in events] == ["message", "tool_call_start", "tool_call_end", "message"]
    assert events[2].content.result == 3
    assert t.response.loop_end_reason == loopscope.LoopEndReason.COMPLETED
