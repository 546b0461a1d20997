"""The provider kit (loopscope.recorder.adapter): what a new provider adapter is made of.

Pure functions are tested as functions (finish-reason maps, the usage builder, tool
normalisation, servers of base URLs, typed parameters and messages); what they drive is
tested through the recorder into a real DuckDB store (a call's outcome, the loop end
reason, the parameters kept, the declared tools, id-less results paired), as an adapter of
a provider the kit was made for (Gemini's words) would report them.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
from typing import Any

import pydantic
import pytest

import loopscope
from loopscope import semconv as a
from loopscope.models import ToolCall
from loopscope.recorder import declared
from loopscope.recorder.adapter import (
    FINISH_OUTCOMES,
    Finish,
    FinishMap,
    InputMessage,
    ModelRequest,
    ModelResponse,
    Part,
    Reasoning,
    RequestMessages,
    Text,
    ToolCallRequest,
    ToolCallResponse,
    ToolResults,
    provider_at,
    request_parameters,
    server_of,
    start_model_call,
    usage,
)
from loopscope.recorder.declared import declared_tools, tool_set
from recorded import only_turn, spans_of

# Gemini's finish reasons (google-genai's types.FinishReason), as its adapter will map them
GEMINI = FinishMap(
    {
        "STOP": Finish.STOP,
        "MAX_TOKENS": Finish.LENGTH,
        "SAFETY": Finish.CONTENT_FILTER,
        "RECITATION": Finish.CONTENT_FILTER,
        "BLOCKLIST": Finish.CONTENT_FILTER,
        "PROHIBITED_CONTENT": Finish.CONTENT_FILTER,
        "SPII": Finish.CONTENT_FILTER,
        "MALFORMED_FUNCTION_CALL": Finish.ERROR,
    }
)


# -- the finish-reason vocabulary ------------------------------------------------------------


def test_a_finish_map_reads_a_providers_words_as_given_or_in_lower_case():
    assert GEMINI("MAX_TOKENS") is Finish.LENGTH
    assert GEMINI("max_tokens") is Finish.LENGTH
    assert GEMINI("SAFETY") is Finish.CONTENT_FILTER
    assert GEMINI("LENGTH") is Finish.LENGTH  # the vocabulary's own word
    assert GEMINI("FINISH_REASON_UNSPECIFIED") is Finish.STOP  # unknown: the model answered
    assert GEMINI(None) is None

    class SdkEnum:  # an SDK's enum member (google-genai gives types.FinishReason)
        value = "SAFETY"

    assert GEMINI(SdkEnum()) is Finish.CONTENT_FILTER
    bedrock = GEMINI.extended({"guardrail_intervened": "content_filter"})
    assert bedrock("guardrail_intervened") is Finish.CONTENT_FILTER and bedrock("MAX_TOKENS") is Finish.LENGTH


def test_every_finish_reason_has_its_outcome():
    assert set(FINISH_OUTCOMES) == set(Finish)
    assert set(FINISH_OUTCOMES.values()) <= set(a.CALL_OUTCOMES)
    assert FINISH_OUTCOMES[Finish.LENGTH] == "truncated"
    assert FINISH_OUTCOMES[Finish.CONTENT_FILTER] == "content_filter"
    assert FINISH_OUTCOMES[Finish.TOOL_CALL] == "completed"


def _one_call(response: ModelResponse, **request: Any) -> None:
    call = start_model_call(ModelRequest("gemini", "gemini-test", input_text="hi", **request))
    assert call is not None
    call.finish(response)


@pytest.mark.parametrize(
    ("reason", "outcome", "loop_end"),
    [
        ("MAX_TOKENS", "truncated", "truncated"),
        ("SAFETY", "content_filter", "content_filter"),
        ("RECITATION", "content_filter", "content_filter"),
        ("MALFORMED_FUNCTION_CALL", "error", "error"),
        ("STOP", "completed", "completed"),
    ],
)
def test_a_mapped_finish_reason_is_the_calls_outcome_and_its_turns_end(reason, outcome, loop_end, recording):
    """Gemini's MAX_TOKENS and SAFETY were stored as completed: the provider's word is kept,
    the kit's reason makes the outcome."""
    _one_call(ModelResponse(text="Partly", finish_reason=reason, finish=GEMINI(reason)))
    assert loopscope.flush()
    [call] = recording.store.model_calls()
    assert (call.finish_reasons, call.outcome) == ([reason], outcome)
    if loop_end is not None:
        assert only_turn(recording.store).loop_end_reason == loop_end


def test_without_a_mapped_reason_the_common_words_decide_as_before(recording):
    _one_call(ModelResponse(text="Cut", finish_reason="max_tokens"))
    _one_call(ModelResponse(text="Fine", finish_reason="MAX_TOKENS_UNKNOWN"))
    assert loopscope.flush()
    assert sorted(c.outcome for c in recording.store.model_calls()) == ["completed", "truncated"]


def test_a_finish_reason_in_a_str_subclass_is_its_text(recording):
    """An SDK's open enum (mistralai's ``UnrecognizedStr`` for a reason it does not know) is
    a ``str`` subclass: stored as its text, not as the JSON of it, and mapped as that word."""

    class Unrecognized(str):
        pass

    _one_call(ModelResponse(text="Cut", finish_reason=Unrecognized("model_length")))
    assert loopscope.flush()
    [call] = recording.store.model_calls()
    assert (call.finish_reasons, call.outcome) == (["model_length"], "truncated")


# -- the usage builder --------------------------------------------------------------------------


def test_usage_already_inclusive_is_kept():
    assert usage(input=100, output=20, cache_read=60, reasoning=5) == {
        "input_tokens": 100, "output_tokens": 20, "cache_read_input_tokens": 60, "reasoning_tokens": 5,
    }


def test_usage_with_the_cache_apart_adds_it_to_the_input():
    # Anthropic: input_tokens leave out the cache read and written
    assert usage(input=3, output=9, cache_read=1000, cache_write=200, input_includes_cache=False) == {
        "input_tokens": 1203, "output_tokens": 9, "cache_read_input_tokens": 1000, "cache_creation_input_tokens": 200,
    }


def test_usage_with_the_reasoning_apart_adds_it_to_the_output():
    # Gemini: candidates_token_count leaves out thoughts_token_count
    assert usage(input=10, output=7, reasoning=30, output_includes_reasoning=False) == {
        "input_tokens": 10, "output_tokens": 37, "reasoning_tokens": 30,
    }
    assert usage(input=10, reasoning=30, output_includes_reasoning=False)["output_tokens"] == 30  # thoughts only


def test_usage_leaves_out_what_is_no_count_and_keeps_named_extras():
    assert usage(input=True, output="12", cache_read=None, web_search_requests=2) == {"web_search_requests": 2}
    assert usage() == {}


# -- declared tools in a provider's own objects ------------------------------------------------


class Schema(pydantic.BaseModel):
    type: str = "OBJECT"
    properties: dict[str, Any] = {}


class FunctionDeclaration(pydantic.BaseModel):  # google-genai's types.FunctionDeclaration, in short
    name: str
    description: str | None = None
    parameters: Schema | None = None
    parameters_json_schema: dict[str, Any] | None = None


class GoogleSearch(pydantic.BaseModel):
    pass


class GeminiTool(pydantic.BaseModel):  # google-genai's types.Tool, in short
    function_declarations: list[FunctionDeclaration] | None = None
    google_search: GoogleSearch | None = None


@dataclasses.dataclass
class DataclassTool:
    name: str
    description: str
    parameters: dict[str, Any]


class AttributeTool:
    """A tool as an object with attributes (no model, no dataclass)."""

    def __init__(self) -> None:
        self.name = "lookup"
        self.description = "Look a word up."
        self.input_schema = {"type": "object", "properties": {"word": {"type": "string"}}}


CITY = {"type": "object", "properties": {"city": {"type": "string"}}}


def test_tools_in_provider_objects_are_declared():
    tools = [
        GeminiTool(
            function_declarations=[
                FunctionDeclaration(name="weather", description="Weather of a city.", parameters_json_schema=CITY),
                FunctionDeclaration(name="time", parameters=Schema(properties={"zone": {"type": "STRING"}})),
            ],
            google_search=GoogleSearch(),
        ),
        DataclassTool("convert", "Convert units.", {"type": "object"}),
        AttributeTool(),
        {"function_declarations": [{"name": "news", "description": "Headlines."}]},  # the same Tool as a dict
    ]
    found = [(t.name, t.description, t.parameters, t.type) for t in declared_tools(tools)]
    assert found == [
        ("weather", "Weather of a city.", CITY, None),
        ("time", None, {"type": "OBJECT", "properties": {"zone": {"type": "STRING"}}}, None),
        ("google_search", None, None, "google_search"),
        ("convert", "Convert units.", {"type": "object"}, None),
        ("lookup", "Look a word up.", AttributeTool().input_schema, None),
        ("news", "Headlines.", None, None),
    ]


def test_tools_in_provider_objects_reach_the_store(recording):
    tool = GeminiTool(function_declarations=[FunctionDeclaration(name="weather", parameters_json_schema=CITY)])
    _one_call(ModelResponse(text="Sunny.", finish_reason="STOP", finish=GEMINI("STOP")), tools=[tool])
    assert loopscope.flush()
    [declared] = only_turn(recording.store).declared_tools
    assert (declared.name, declared.parameters) == ("weather", CITY)


def test_tool_objects_are_normalised_once_and_copies_equal_to_them_too():
    """An SDK may hand the same tool objects call after call, or copies of them (google-genai
    deep-copies its config each round): one ToolSet, its JSON made once; a changed copy is new."""

    def weather(city: str) -> str:
        """Weather of a city."""
        return "sunny"

    tool = GeminiTool(function_declarations=[FunctionDeclaration(name="weather", parameters_json_schema=CITY)])
    first = tool_set([tool, weather])
    assert [t.name for t in first.tools] == ["weather", "weather"]
    assert tool_set([tool, weather]) is first
    assert tool_set([tool.model_copy(deep=True), weather]) is first  # a copy equal to it
    changed = tool.model_copy(deep=True)
    changed.function_declarations[0].description = "Now with a description."
    other = tool_set([changed, weather])
    assert other is not first and other.tools[0].description == "Now with a description."
    tool.function_declarations.append(FunctionDeclaration(name="time"))  # changed in place: read again
    assert [t.name for t in tool_set([tool]).tools] == ["weather", "time"]
    assert [t.name for t in tool_set([AttributeTool()]).tools] == ["lookup"]  # compares by identity: not cached


def test_copies_of_the_same_tool_dicts_are_normalised_once():
    """LiteLLM deep-copies its request: the tool dicts it hands are copies of the application's,
    new every call. A copy equal to a dict seen is that tool (one ToolSet, its JSON made once);
    a changed copy is read again."""
    weather = {"type": "function", "function": {"name": "weather", "description": "Weather.", "parameters": CITY}}
    first = tool_set([copy.deepcopy(weather)])
    assert tool_set([copy.deepcopy(weather)]) is first
    changed = copy.deepcopy(weather)
    changed["function"]["description"] = "Weather, hourly."
    assert [t.description for t in tool_set([changed]).tools] == ["Weather, hourly."]
    assert [t.description for t in tool_set([copy.deepcopy(weather)]).tools] == ["Weather."]


def test_the_tool_object_cache_is_bounded():
    for i in range(declared._CACHE_SIZE + 50):
        tool_set([FunctionDeclaration(name=f"tool_{i}")])
    assert len(declared._by_object) <= declared._CACHE_SIZE


# -- typed request parameters, the server -----------------------------------------------------


def test_request_parameters_are_typed_and_keep_what_has_no_name(recording, caplog):
    """Gemini's max_output_tokens is max_tokens; its candidate_count has no name here: kept
    under other (stored), said once in the log, however many calls set it."""
    caplog.set_level(logging.WARNING, logger="loopscope")
    for _ in range(2):
        parameters = request_parameters(
            provider="gemini",
            temperature=0.2,
            max_tokens=256,
            stop="END",
            system_instructions="Be brief.",
            server=server_of("https://generativelanguage.googleapis.com/v1beta"),
            other={"candidate_count": 1, "safety_settings": [{"category": "HARM", "threshold": "BLOCK"}], "unset": None},
        )
        _one_call(ModelResponse(text="Ok.", finish_reason="STOP"), parameters=parameters)
    assert loopscope.flush()
    calls = recording.store.model_calls()
    assert len(calls) == 2
    stored = calls[0].parameters
    assert stored["temperature"] == 0.2 and stored["max_tokens"] == 256 and stored["stop"] == ["END"]
    assert stored["server_address"] == "generativelanguage.googleapis.com"
    assert stored["other"] == {"candidate_count": 1, "safety_settings": [{"category": "HARM", "threshold": "BLOCK"}]}
    said = [r.getMessage() for r in caplog.records if "has no name of its own" in r.getMessage()]
    assert len(said) == 2 and "candidate_count" in said[0] and "safety_settings" in said[1]
    [chat, _] = spans_of(recording, a.OP_CHAT)
    assert json.loads(chat.attributes[a.SYSTEM_INSTRUCTIONS]) == [{"type": "text", "content": "Be brief."}]


def test_request_parameters_are_keyword_only():
    with pytest.raises(TypeError):
        request_parameters("gemini")  # type: ignore[misc]


@pytest.mark.parametrize(
    ("url", "server"),
    [
        ("https://api.groq.com/openai/v1", {"server_address": "api.groq.com", "server_port": None}),
        ("http://127.0.0.1:11434", {"server_address": "127.0.0.1", "server_port": 11434}),
        ("bedrock-runtime.us-east-1.amazonaws.com", {"server_address": "bedrock-runtime.us-east-1.amazonaws.com", "server_port": None}),
        ("http://[::1]:8080/v1", {"server_address": "::1", "server_port": 8080}),
        ("http://host:notaport", {}),
        ("", {}),
        (None, {}),
    ],
)
def test_the_server_of_a_base_url(url, server):
    assert server_of(url) == server


def test_the_server_of_an_url_object_and_its_provider():
    class URL:  # an HTTP client's URL object (host and port attributes)
        host, port = "api.mistral.ai", 8443

    assert server_of(URL()) == {"server_address": "api.mistral.ai", "server_port": 8443}
    assert provider_at("openai", server_of("https://api.groq.com/openai/v1")) == "groq"
    assert provider_at("openai", {}) == "openai"


# -- typed messages -------------------------------------------------------------------------------


def test_typed_messages_are_recorded_in_the_genai_schema(recording):
    messages = [
        InputMessage("user", [Text("Weather in Paris?"), Part("image")]),
        InputMessage("assistant", [Reasoning("Need the tool."), ToolCallRequest("weather", {"city": "Paris"}, id="c1")]),
        InputMessage("tool", [ToolCallResponse({"temp_c": 21}, id="c1")]),
    ]
    _one_call(ModelResponse(text="21 °C.", finish_reason="STOP"), input_messages=messages)
    assert loopscope.flush()
    [chat] = spans_of(recording, a.OP_CHAT)
    assert json.loads(chat.attributes[a.INPUT_MESSAGES]) == [
        {"role": "user", "parts": [{"type": "text", "content": "Weather in Paris?"}, {"type": "image"}]},
        {"role": "assistant", "parts": [
            {"type": "reasoning", "content": "Need the tool."},
            {"type": "tool_call", "id": "c1", "name": "weather", "arguments": {"city": "Paris"}},
        ]},
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c1", "response": {"temp_c": 21}}]},
    ]


# -- tool results without ids, paired in the recorder -------------------------------------------------


def _results(messages: list[tuple[str, Any, Any]]) -> list[Any]:
    """What an adapter does with ToolResults as it walks a request's messages."""
    results = ToolResults()
    for role, call_id, content in messages:
        if role == "tool" and results.wanted(call_id):
            results.add(call_id, content)
        elif role == "assistant":
            results.model_spoke()
    return results.results


def test_results_without_ids_answer_the_last_responses_calls_by_position(recording):
    """Ollama and Gemini's OpenAI endpoint send calls with no id and results with none back."""
    call = start_model_call(ModelRequest("ollama", "llama-test", input_text="Paris?"))
    call.finish(ModelResponse(tool_calls=[ToolCall(id="", name="weather", arguments={}), ToolCall(id="", name="time", arguments={})],
                              finish_reason="tool_calls"))
    # an earlier exchange's result without an id (before the last assistant message) is no answer
    results = _results([("tool", None, "stale"), ("assistant", None, None), ("tool", "", "21 °C"), ("tool", None, "19:30")])
    assert [(r.call_id, r.content) for r in results] == [("", "21 °C"), ("", "19:30")]
    second = start_model_call(ModelRequest("ollama", "llama-test", tool_results=results))
    second.finish(ModelResponse(text="21 °C at 19:30.", finish_reason="stop"))
    assert loopscope.flush()
    turn = only_turn(recording.store)
    assert turn.loop_end_reason == "completed"
    ends = [e.content for e in recording.store.get_timeline(turn.session_id) if e.type == "tool_call_end"]
    assert [(c.tool_name, c.result, c.outcome) for c in ends] == [("weather", "21 °C", "served"), ("time", "19:30", "served")]


def test_results_are_read_only_while_a_call_waits_for_them(recording):
    assert _results([("tool", "call_gone", "x"), ("tool", "", "y")]) == []
    assert not ToolResults().wanted("call_gone") and not ToolResults().wanted("")


# -- a request's messages walked once (RequestMessages) ------------------------------------------------


def test_a_request_walked_with_request_messages_pairs_its_results_and_reaches_the_store(recording):
    """What the google-genai, cohere and ollama adapters do: a part per tool result, a message
    after its parts; the request made of them carries the results, the messages and the
    last user text."""
    call = start_model_call(ModelRequest("ollama", "llama-test", input_text="Paris?"))
    call.finish(ModelResponse(tool_calls=[ToolCall(id="", name="weather", arguments={})], finish_reason="tool_calls"))
    messages = RequestMessages()
    messages.add("user", [Text("Paris?")], "Paris?")
    messages.add("tool", [messages.result(None, "stale")])  # answers no call: an assistant message follows
    # an assistant message whose own parts send a result back (no provider does; the order is kept
    # all the same): the model spoke at its start, so the result counts
    messages.add("assistant", [messages.result(None, "21 °C")])
    messages.add("user", [Text("")], None)  # no text: the input text stays the last one said
    request = messages.request("ollama", "llama-test", stream=True, parameters={"temperature": 0.2})
    assert request.input_text == "Paris?" and request.stream and request.parameters == {"temperature": 0.2}
    assert [(r.call_id, r.content) for r in request.tool_results] == [("", "21 °C")]
    assert [m.role for m in request.input_messages] == ["user", "tool", "assistant", "user"]
    assert request.input_messages[1].parts == [ToolCallResponse("stale", None)]
    second = start_model_call(request)
    second.finish(ModelResponse(text="21 °C.", finish_reason="stop"))
    assert loopscope.flush()
    turn = only_turn(recording.store)
    ends = [e.content for e in recording.store.get_timeline(turn.session_id) if e.type == "tool_call_end"]
    assert [(c.tool_name, c.result, c.outcome) for c in ends] == [("weather", "21 °C", "served")]


def test_request_messages_keep_a_result_apart_from_the_part_and_its_error(recording):
    call = start_model_call(ModelRequest("gcp.gemini", "gemini-test", input_text="Paris?"))
    call.finish(ModelResponse(tool_calls=[ToolCall(id="c1", name="weather", arguments={})], finish_reason="STOP"))
    messages = RequestMessages()
    part = messages.result("c1", {"error": "no such city"}, "no such city", is_error=True)
    assert part == ToolCallResponse({"error": "no such city"}, "c1")  # the part: what the model is sent
    messages.add("tool", [part])
    assert [(r.call_id, r.content, r.is_error) for r in messages.results.results] == [("c1", "no such city", True)]
    assert RequestMessages().result("c_nobody_waits_for", "x") == ToolCallResponse("x", "c_nobody_waits_for")


def test_a_stop_with_tool_calls_is_a_tool_call():
    """Gemini and Ollama say stop for an answer that asks for tools too."""
    assert GEMINI.with_calls("STOP", [ToolCall(id="", name="weather", arguments={})]) is Finish.TOOL_CALL
    assert GEMINI.with_calls("STOP", []) is Finish.STOP
    assert GEMINI.with_calls("MAX_TOKENS", [ToolCall(id="", name="weather", arguments={})]) is Finish.LENGTH
    assert GEMINI.with_calls(None, []) is None
