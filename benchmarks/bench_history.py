"""What reading a request's messages costs per call as a conversation grows, for each adapter.

Every call of a tool loop sends the whole conversation so far, and loopscope records it
(``gen_ai.input.messages``). Each adapter reads the request (its tool results, the user's
text) and makes the messages' JSON in the GenAI schema; for a long conversation the JSON of
the messages an earlier request sent is kept and reused, each checked unchanged
(loopscope/instrument/_history.py). This times, per call, the adapter's reading of the
request through its real SDK resource (no HTTP) plus the encoding the recorder does with it,
for the OpenAI Chat Completions, Anthropic Messages and OpenAI Responses shapes, at
conversations of 10, 100 and 500 messages: each conversation's next calls, each two messages
longer than the one before (a tool call and its result, or a question and its answer):

* ``kept``  -- as loopscope runs (the default);
* ``whole`` -- every request encoded whole (``_history.KEEP`` off): the baseline, measured
  in the same run, interleaved.

Prints the median over repeats of the CPU (``time.process_time``) per call, the kept/whole
ratio, and 500/10 for each.

    .venv/bin/python benchmarks/bench_history.py [--calls N] [--repeats R] [--smoke]
"""

from __future__ import annotations

import gc
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import anthropic
import openai
from _args import calls_and_repeats  # benchmarks/: the script's own folder is on sys.path

from loopscope import _json
from loopscope.instrument import _history, _openai_responses
from loopscope.instrument import anthropic as anthropic_adapter
from loopscope.instrument import openai as openai_adapter

SIZES = (10, 100, 500)
ROUNDS = 8  # calls timed per conversation, after its first


def _pair(api: str, k: int, i: int) -> list[Any]:
    """Two messages of conversation ``k``'s ``i``-th round: a tool call and its result, or a
    question and its answer, ~100-200 characters each, in the API's shape."""
    text = f"{k}/{i}: " + "lorem ipsum dolor sit amet " * 5
    if i % 2:
        if api == "chat":
            return [{"role": "user", "content": text}, {"role": "assistant", "content": text}]
        if api == "messages":
            return [{"role": "user", "content": text}, {"role": "assistant", "content": [{"type": "text", "text": text}]}]
        return [{"role": "user", "content": text}, {"role": "assistant", "content": [{"type": "output_text", "text": text}]}]
    call_id, arguments = f"c{k}_{i}", json.dumps({"q": text[:60]})
    if api == "chat":
        return [{"role": "assistant", "content": None, "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": "search", "arguments": arguments}}]},
                {"role": "tool", "tool_call_id": call_id, "content": text}]
    if api == "messages":
        return [{"role": "assistant", "content": [{"type": "tool_use", "id": call_id, "name": "search", "input": {"q": text[:60]}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id, "content": text}]}]
    return [{"type": "function_call", "call_id": call_id, "name": "search", "arguments": arguments},
            {"type": "function_call_output", "call_id": call_id, "output": text}]


def _conversations(api: str, n: int, calls: int) -> list[list[list[Any]]]:
    """Conversations of ``n`` messages, each with the requests of its next :data:`ROUNDS`
    calls (a pair of messages more each time): ``calls`` requests in all, after each
    conversation's first (``n`` messages)."""
    out = []
    k = 0
    while len(out) * ROUNDS < calls:
        messages: list[Any] = [{"role": "user", "content": f"conversation {k}: " + "sit amet " * 20}]
        i = 0
        while len(messages) < n:
            i += 1
            messages += _pair(api, k, i)
        requests = [messages[:n]]
        for j in range(ROUNDS):
            requests.append(requests[-1] + _pair(api, k, 1000 + j))
        out.append(requests)
        k += 1
    return out


def _describe(api: str) -> Callable[[list[Any]], Any]:
    """The adapter's reading of a request, and the encoding the recorder adds (Round._start)."""
    if api == "chat":
        resource: Any = openai.OpenAI(api_key="x", base_url="http://127.0.0.1:9/v1").chat.completions
        read, key = openai_adapter._chat_request, "messages"
    elif api == "messages":
        resource = anthropic.Anthropic(api_key="x", base_url="http://127.0.0.1:9").messages
        read, key = anthropic_adapter._request, "messages"
    else:
        resource = openai.OpenAI(api_key="x", base_url="http://127.0.0.1:9/v1").responses
        read, key = _openai_responses._request, "input"

    def describe(messages: list[Any]) -> Any:
        request = read(resource, (), {"model": "m", key: messages, "max_tokens": 10})
        given = request.input_messages
        return given if type(given) is str else _json.dumps(given)

    return describe


def run(api: str, n: int, calls: int, whole: bool) -> float:
    """CPU ns per call."""
    describe = _describe(api)
    conversations = _conversations(api, n, calls)
    _history.KEEP = not whole
    clock = time.process_time_ns
    spent = timed = 0
    try:
        gc.collect()
        for first, *later in conversations:
            describe(first)  # the call that brought it to n messages (untimed)
            for request in later:
                start = clock()
                describe(request)
                spent += clock() - start
                timed += 1
        return spent / timed
    finally:
        _history.KEEP = True


def main() -> int:
    args = calls_and_repeats(__doc__, 400, 8)
    results: dict[tuple[str, int, bool], list[float]] = {}
    for _ in range(args.repeats):
        for api in ("chat", "messages", "responses"):
            for n in SIZES:  # interleaved: the machine's drift falls on both variants alike
                for whole in (False, True):
                    results.setdefault((api, n, whole), []).append(run(api, n, args.calls, whole))
    print(f"reading a request's messages, CPU us per call (median of {args.repeats} repeats of {args.calls} calls)")
    print(f"{'api':<11}{'variant':<8}" + "".join(f"{f'{n} msgs':>12}" for n in SIZES) + f"{'500/10':>9}")
    for api in ("chat", "messages", "responses"):
        med = {(n, whole): statistics.median(results[(api, n, whole)]) / 1000 for n in SIZES for whole in (False, True)}
        for whole, name in ((False, "kept"), (True, "whole")):
            cells = "".join(f"{med[(n, whole)]:>9.1f} us" for n in SIZES)
            print(f"{api:<11}{name:<8}{cells}{med[(SIZES[-1], whole)] / med[(SIZES[0], whole)]:>8.1f}x")
        print(f"{api:<11}{'ratio':<8}" + "".join(f"{med[(n, False)] / med[(n, True)]:>11.2f}x" for n in SIZES))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
