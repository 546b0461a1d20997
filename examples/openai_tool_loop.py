"""An ordinary agent: a hand-written tool loop over the openai SDK, with no loopscope in it.

Run it recorded, without changing a line:

    loopscope run -- python examples/openai_tool_loop.py "Weather in Paris?"
    opentelemetry-instrument python examples/openai_tool_loop.py "Weather in Paris?"

It talks to whatever ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` say (the tests point it at
a local fake model server).
"""

from __future__ import annotations

import json
import sys

import openai

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Local time in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    },
]


def run_tool(name: str, arguments: dict) -> dict:
    if name == "get_weather":
        return {"city": arguments.get("city"), "temp_c": 21, "sky": "clear"}
    if name == "get_time":
        return {"city": arguments.get("city"), "time": "19:30"}
    raise ValueError(f"unknown tool {name}")


def main(question: str) -> str:
    client = openai.OpenAI(max_retries=0)
    messages: list = [{"role": "user", "content": question}]
    for _ in range(8):
        reply = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS).choices[0].message
        messages.append(reply)
        if not reply.tool_calls:
            return reply.content or ""
        for call in reply.tool_calls:
            result = run_tool(call.function.name, json.loads(call.function.arguments or "{}"))
            messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
    return ""


if __name__ == "__main__":
    print(main(sys.argv[1] if len(sys.argv) > 1 else "Weather in Paris?"))
