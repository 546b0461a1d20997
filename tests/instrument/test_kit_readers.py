"""The instrument side of the provider kit, as functions: the readers of ``_read.py`` and what
stream accumulators share (``_streams.py``). What they drive is tested through each SDK's
adapter in its stack (tool calls streamed in pieces: test_cohere.py, test_bedrock.py)."""

from __future__ import annotations

import pydantic

from loopscope.instrument import _read as r
from loopscope.instrument._streams import StreamedCalls
from loopscope.models import ToolCall


class _Blob(pydantic.BaseModel):
    inline_data: dict[str, str] | None = None
    text: str | None = None


def test_a_field_is_read_from_an_sdk_object_or_a_dict_in_either_spelling():
    assert r.field({"function_call": 1}, "function_call", "functionCall") == 1
    assert r.field({"functionCall": 2}, "function_call", "functionCall") == 2
    assert r.field({"functionCall": 2}, "function_call") is None
    assert r.field(_Blob(text="hi"), "text", "Text") == "hi"
    assert r.field(None, "text") is None


def test_a_part_nobody_reads_is_its_first_field():
    assert r.kind({"image": {"format": "png"}}) == "image"
    assert r.kind(_Blob(inline_data={"mime_type": "image/png"})) == "inline_data"
    assert r.kind(object()) == "unknown" and r.kind({}) == "unknown"


def test_enum_values_and_counts():
    class Reason:
        value = "STOP"

    assert r.enum_value(Reason()) == "STOP" and r.enum_value("STOP") == "STOP" and r.enum_value(None) is None
    assert r.count(100.0) == 100 and r.count(7) == 7 and r.count(True) is None and r.count("7") is None


def test_tool_calls_streamed_in_pieces_come_whole_in_their_order():
    calls = StreamedCalls()
    calls.start(1, "c2", "time")
    calls.start(0, "c1", "weather", '{"ci')
    calls.more(0, 'ty": "Paris"}')
    calls.more(5, '{"never": "started"}')  # no call at that index: left out
    assert 0 in calls and 5 not in calls
    assert calls.calls() == [
        ToolCall(id="c1", name="weather", arguments={"city": "Paris"}),
        ToolCall(id="c2", name="time", arguments={}),
    ]
    broken = StreamedCalls()
    broken.start(0, None, "weather", '{"city": ')
    assert broken.calls() == [ToolCall(id="", name="weather", arguments='{"city": ')]  # the model's text, kept
