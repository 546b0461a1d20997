"""An offline example agent, recorded with loopscope's hand API.

A concierge agent answers two user messages. Its model is scripted (no network, the
same replies every run) but it reacts to tool results the way a real one does: it asks
for the weather, books a table, and when the booking service fails it says so and tries
again in the next round. Each turn is one ``loopscope.turn``, each model call one
``turn.round()``, and each tool one ``@loopscope.tool`` function, so the store ends up
with a timeline of text segments and tool starts and ends, and one summary per turn.

Run it with ``loopscope demo`` (or ``python -m loopscope demo``).
"""

from __future__ import annotations

import itertools
import json
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import loopscope

AGENT = "concierge"
MODEL = "scripted-concierge-1"
PROVIDER = "scripted"
MAX_ROUNDS = 6

# -- the tools, as the model is offered them (OpenAI format, JSON-schema parameters) --------

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Forecast for a city on a given day.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name, e.g. Lisbon"},
                    "day": {"type": "string", "description": "'today', 'tomorrow' or a weekday"},
                },
                "required": ["city", "day"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "book_table",
            "description": "Reserve a restaurant table.",
            "parameters": {
                "type": "object",
                "properties": {
                    "restaurant": {"type": "string"},
                    "party_size": {"type": "integer", "minimum": 1, "maximum": 12},
                    "day": {"type": "string"},
                    "time": {"type": "string", "pattern": "^[0-2][0-9]:[0-5][0-9]$"},
                    "seating": {"type": "string", "enum": ["indoor", "terrace"]},
                },
                "required": ["restaurant", "party_size", "day", "time"],
            },
        },
    },
]

# -- the tool implementations -----------------------------------------------------------------

FORECASTS = {
    ("lisbon", "tomorrow"): {"summary": "clear skies", "evening_temp_c": 22, "rain_chance": 0.05},
    ("porto", "saturday"): {"summary": "showers until 11:00, then dry", "midday_temp_c": 19, "rain_chance": 0.2},
}


class BookingServiceError(RuntimeError):
    """The restaurant booking service did not answer."""


@dataclass
class BookingService:
    """A pretend reservation system whose first request times out."""

    failures_left: int = 1
    codes: itertools.count = field(default_factory=lambda: itertools.count(4821))

    def reserve(self, restaurant: str, party_size: int, day: str, time_: str, seating: str) -> dict[str, Any]:
        if self.failures_left > 0:
            self.failures_left -= 1
            time.sleep(0.05)
            raise BookingServiceError("booking service timed out after 50 ms (HTTP 503)")
        time.sleep(0.12)
        return {
            "confirmation": f"LS-{next(self.codes)}",
            "restaurant": restaurant,
            "party_size": party_size,
            "day": day,
            "time": time_,
            "seating": seating,
        }


_service = BookingService()


@loopscope.tool
def get_weather(city: str, day: str) -> dict[str, Any]:
    """Forecast for a city on a given day."""
    time.sleep(0.08)
    forecast = FORECASTS.get((city.lower(), day.lower()), {"summary": "mild", "temp_c": 18, "rain_chance": 0.1})
    return {"city": city, "day": day, **forecast}


@loopscope.tool
def book_table(restaurant: str, party_size: int, day: str, time: str, seating: str = "indoor") -> dict[str, Any]:
    """Reserve a restaurant table."""
    return _service.reserve(restaurant, party_size, day, time, seating)


TOOL_FUNCTIONS = {"get_weather": get_weather, "book_table": book_table}

# -- the scripted model -----------------------------------------------------------------------


@dataclass
class Reply:
    """What one model call returns."""

    text: str
    tool_calls: list[dict[str, Any]]
    usage: dict[str, int]
    finish_reason: str


# Per user message: the replies the model gives, one per round. A string is a final
# answer; a (text, tool, arguments) triple asks for a tool. ``{confirmation}`` is filled
# from the last booking. A failed tool call is retried before the script moves on.
SCRIPT: list[tuple[str, list[Any]]] = [
    (
        (
            "I'm in Lisbon tomorrow evening. What's the weather like, and can you book a table "
            "for two at 20:00, outside if it's nice?"
        ),
        [
            (
                "Let me check tomorrow's forecast for Lisbon first.",
                "get_weather",
                {"city": "Lisbon", "day": "tomorrow"},
            ),
            (
                "Clear skies and 22 °C in the evening, so a terrace works. Booking Páteo for two at 20:00.",
                "book_table",
                {"restaurant": "Páteo", "party_size": 2, "day": "tomorrow", "time": "20:00", "seating": "terrace"},
            ),
            (
                "You're booked: a terrace table for two at Páteo tomorrow at 20:00 (confirmation {confirmation}). "
                "Expect clear skies around 22 °C; bring a light jacket for later."
            ),
        ],
    ),
    (
        "Perfect. Could you also check Porto for Saturday? If it's dry, book lunch for four at 13:00.",
        [
            ("Checking Saturday's forecast for Porto.", "get_weather", {"city": "Porto", "day": "saturday"}),
            (
                "Showers clear by 11:00 and it stays dry after, 19 °C. Booking Cantinho for four at 13:00.",
                "book_table",
                {"restaurant": "Cantinho", "party_size": 4, "day": "saturday", "time": "13:00", "seating": "indoor"},
            ),
            (
                "Lunch is booked at Cantinho in Porto on Saturday at 13:00 for four (confirmation {confirmation}). "
                "The morning showers will be gone by then."
            ),
        ],
    ),
]


def _tokens(text: str) -> int:
    return max(1, len(text) // 4)


class ScriptedModel:
    """Stands in for an LLM: deterministic replies, no network, a little latency."""

    name = MODEL

    def __init__(self) -> None:
        self._turn = -1
        self._step = 0
        self._call_ids = (f"call_{n:03d}" for n in itertools.count(1))

    def start_turn(self) -> str:
        """The next scripted user message."""
        self._turn += 1
        self._step = 0
        return SCRIPT[self._turn][0]

    def complete(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> Reply:
        time.sleep(0.04)
        prompt = sum(_tokens(json.dumps(m, ensure_ascii=False)) for m in messages) + _tokens(json.dumps(tools))
        last = messages[-1]
        if last["role"] == "tool" and "error" in last:
            # the tool failed: say so and ask for the same call again
            failed = next(c for c in messages[-2]["tool_calls"] if c["id"] == last["tool_call_id"])
            text = "The booking service timed out; trying once more."
            call = {"id": next(self._call_ids), "name": failed["name"], "arguments": failed["arguments"]}
            return Reply(text, [call], {"input_tokens": prompt, "output_tokens": _tokens(text) + 20}, "tool_calls")
        step = SCRIPT[self._turn][1][self._step]
        self._step += 1
        if isinstance(step, str):
            booking = next(
                (
                    m["content"]
                    for m in reversed(messages)
                    if m["role"] == "tool" and m.get("name") == "book_table" and "content" in m
                ),
                {},
            )
            text = step.format(confirmation=booking.get("confirmation", "n/a"))
            return Reply(text, [], {"input_tokens": prompt, "output_tokens": _tokens(text)}, "stop")
        text, tool_name, arguments = step
        call = {"id": next(self._call_ids), "name": tool_name, "arguments": arguments}
        return Reply(text, [call], {"input_tokens": prompt, "output_tokens": _tokens(text) + 20}, "tool_calls")


# -- the agent loop, recorded -----------------------------------------------------------------


def _run_tool(call: dict[str, Any]) -> dict[str, Any]:
    """Run one requested tool; a failure goes back to the model as the tool's answer."""
    message: dict[str, Any] = {"role": "tool", "tool_call_id": call["id"], "name": call["name"]}
    try:
        message["content"] = TOOL_FUNCTIONS[call["name"]](**call["arguments"])
    except BookingServiceError as exc:
        message["error"] = str(exc)
    return message


def run_turn(model: ScriptedModel, session_id: str, history: list[dict[str, Any]]) -> loopscope.AIResponseEvent:
    """One user message answered: model rounds and tool calls until a final answer."""
    user_text = model.start_turn()
    history.append({"role": "user", "content": user_text})
    with loopscope.turn(
        session_id=session_id, agent=AGENT, tools=TOOLS, input=user_text, model=model.name, provider=PROVIDER
    ) as turn:
        for _ in range(MAX_ROUNDS):
            with turn.round() as rnd:
                reply = model.complete(history, TOOLS)
                rnd.response(reply.text, reply.tool_calls, reply.usage, reply.finish_reason)
            history.append({"role": "assistant", "content": reply.text, "tool_calls": reply.tool_calls})
            if not reply.tool_calls:
                break
            for call in reply.tool_calls:
                history.append(_run_tool(call))
        else:
            turn.end(loopscope.LoopEndReason.MAX_ROUNDS)
    response = turn.response
    assert response is not None  # the turn has ended
    return response


@dataclass
class DemoResult:
    """Where the demo wrote, and the turn summaries it recorded."""

    session_id: str
    db_path: str
    turns: list[loopscope.AIResponseEvent]


def run(db: str | os.PathLike[str] | None = None, *, session_id: str | None = None) -> DemoResult:
    """Record the demo conversation into ``db`` (default ``LOOPSCOPE_DB`` or ``./loopscope.duckdb``).

    Configures loopscope for that file, runs two turns, and shuts the pipeline down so
    every event is on disk when it returns.
    """
    global _service
    pipeline = loopscope.configure(db, service_name="loopscope-demo")
    try:
        _service = BookingService()
        session = session_id or f"demo-{uuid.uuid4().hex[:8]}"
        model = ScriptedModel()
        history: list[dict[str, Any]] = [{"role": "system", "content": "You are a concise restaurant concierge."}]
        turns = [run_turn(model, session, history) for _ in SCRIPT]
    finally:
        loopscope.shutdown()
    return DemoResult(session, pipeline.db_path or "", turns)
