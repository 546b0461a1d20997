"""CPU of the calling thread per openai call, the SDK's HTTP work stubbed out.

``chat.completions.create`` is replaced (before any instrumentation wraps it) by a stub that
returns a parsed response (non-streaming) or an ``openai.Stream`` over the fake model server's
own bytes (streaming), captured once at start. The same tool loop as
``bench_openai_overhead.py`` runs in blocks, instrumentation switched on and off between
blocks in one process; reported: the median over block pairs of the added CPU time per
call (``time.thread_time``), and the garbage collector's time per call in the "on" blocks.

    .venv/bin/python benchmarks/stub_openai_cpu.py --store              # loopscope, store on
    .stacks/peers-otel-v2/bin/python benchmarks/stub_openai_cpu.py \
        --peer opentelemetry.instrumentation.openai_v2                  # a peer (its venv)

``--profile FILE`` writes a cProfile of the "on" blocks; ``--only-on`` skips the "off" ones
(for py-spy or ``perf record -X perf``; it reports the median and the fastest block, ``lo``,
the steadier of the two on a shared machine); ``--nogc`` turns the collector off inside the
blocks. ``STUB_FLUSH=SECONDS`` sets the store's flush interval (default 3600: the store is
flushed between blocks only).
"""

import argparse
import gc
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

p = argparse.ArgumentParser()
p.add_argument("--store", action="store_true")
p.add_argument("--blocks", type=int, default=12)
p.add_argument("--calls", type=int, default=400)
p.add_argument("--mode", default="both")
p.add_argument("--profile", default=None, help="cProfile the 'on' blocks into this file")
p.add_argument("--only-on", action="store_true")
p.add_argument("--nogc", action="store_true")
p.add_argument("--peer", default=None, help="instrumentor module of a peer instead of loopscope")
args = p.parse_args()

import httpx2
import openai
from openai.resources.chat.completions import completions as chat
from openai.types.chat import ChatCompletion, ChatCompletionChunk

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_openai_overhead as bench


def _templates() -> dict:
    """The fake server's bodies: json/stream x tool call/final answer."""
    import urllib.request

    server, rescript = bench._fake_server()
    rescript(server, 100)
    user = [{"role": "system", "content": bench.SYSTEM}, {"role": "user", "content": "[template] weather in Paris?"}]
    with_result = user + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_0", "content": "{}"}]
    out = {}
    try:
        for stream in (False, True):
            extra = {"stream": True, "stream_options": {"include_usage": True}} if stream else {}
            for name, msgs in (("tool", user), ("final", with_result)):
                body = json.dumps({"model": "gpt-4.1-mini", "messages": msgs, "tools": bench.TOOLS, **extra}).encode()
                request = urllib.request.Request(server.openai_base_url + "/chat/completions", data=body,
                                                 headers={"content-type": "application/json", "authorization": "Bearer k"})
                with urllib.request.urlopen(request, timeout=30) as response:
                    out[f"{'stream' if stream else 'json'}-{name}"] = (response.read(), response.headers["content-type"])
    finally:
        server.stop()
    return out


T = _templates()
client = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="k", max_retries=0)
ID = re.compile(rb'"id": ?"(call_[A-Za-z0-9_]+)"')

def fresh(body, n):
    for i, cid in enumerate(sorted(set(ID.findall(body)))):
        body = body.replace(cid, b"call_stub_%d_%d" % (n, i))
    return body

POOL = 4096
tool_json = [ChatCompletion.model_validate_json(fresh(T["json-tool"][0], n)) for n in range(POOL)]
final_json = ChatCompletion.model_validate_json(T["json-final"][0])
tool_stream = [fresh(T["stream-tool"][0], n) for n in range(POOL)]
counter = [0]

def stub(self, **kwargs):
    has_result = kwargs["messages"][-1].get("role") == "tool"
    if kwargs.get("stream"):
        if has_result:
            body, kind = T["stream-final"]
        else:
            counter[0] += 1
            body, kind = tool_stream[counter[0] % POOL], T["stream-tool"][1]
        return openai.Stream(cast_to=ChatCompletionChunk, response=httpx2.Response(200, content=body, headers={"content-type": kind}), client=client)
    if has_result:
        return final_json
    counter[0] += 1
    return tool_json[counter[0] % POOL]

chat.Completions.create = stub

TOOLS, SYSTEM, CITIES, get_weather, _streamed = bench.TOOLS, bench.SYSTEM, bench.CITIES, bench.get_weather, bench._streamed

def loop(calls, stream):
    create = client.chat.completions.create
    n = 0; turn = 0
    while n < calls:
        turn += 1
        messages = [{"role": "system", "content": SYSTEM},
                    {"role": "user", "content": f"[t-{turn}] What's the weather like in {CITIES[turn % 8]} right now?"}]
        for _ in range(4):
            if stream:
                chunks = create(model="gpt-4.1-mini", messages=messages, tools=TOOLS, temperature=0.2,
                                stream=True, stream_options={"include_usage": True})
                tool_calls, _ = _streamed(chunks)
            else:
                response = create(model="gpt-4.1-mini", messages=messages, tools=TOOLS, temperature=0.2)
                m = response.choices[0].message
                tool_calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments} for c in m.tool_calls or ()]
            n += 1
            if not tool_calls:
                break
            messages.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}} for c in tool_calls]})
            for c in tool_calls:
                messages.append({"role": "tool", "tool_call_id": c["id"], "content": json.dumps(get_weather(**json.loads(c["arguments"] or "{}")))})
    return n

tmp = tempfile.mkdtemp(prefix="stub-")
if args.peer:
    import importlib

    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
    class Null(SpanExporter):
        def export(self, spans): return SpanExportResult.SUCCESS
        def shutdown(self): pass
    provider = TracerProvider(); provider.add_span_processor(BatchSpanProcessor(Null())); trace.set_tracer_provider(provider)
    inst = importlib.import_module(args.peer).OpenAIInstrumentor()
    class L:
        instrument = staticmethod(lambda: inst.instrument(tracer_provider=provider))
        uninstrument = staticmethod(inst.uninstrument)
        flush = staticmethod(provider.force_flush)
        shutdown = staticmethod(provider.shutdown)
    loopscope = L
else:
    import loopscope
    loopscope.configure(os.path.join(tmp, "s.duckdb") if args.store else False, flush_interval=float(os.environ.get("STUB_FLUSH", "3600")))
prof = None
if args.profile:
    import cProfile
    prof = cProfile.Profile()

modes = ["nonstream", "stream"] if args.mode == "both" else [args.mode]
# warm-up
for on in (True, False, True):
    if on: loopscope.instrument()
    for m in modes: loop(300, m == "stream")
    loopscope.uninstrument()
loopscope.flush()
res = {m: {"on": [], "off": []} for m in modes}
gcs = {"t": 0, "n": [0, 0, 0], "t0": 0}
def _gccb(phase, info):
    if phase == "start": gcs["t0"] = time.perf_counter_ns()
    else:
        gcs["t"] += time.perf_counter_ns() - gcs["t0"]; gcs["n"][info["generation"]] += 1
gc.callbacks.append(_gccb)
gcon = {m: [0, 0, [0, 0, 0]] for m in modes}
clk = time.thread_time_ns
for b in range(args.blocks):
    for m in modes:
        order = (True,) if args.only_on else ((True, False) if b % 2 else (False, True))
        for on in order:
            if on: loopscope.instrument()
            gc.collect()
            if args.nogc: gc.disable()
            if prof and on: prof.enable()
            g0, gn0 = gcs["t"], list(gcs["n"])
            t0 = clk(); n = loop(args.calls, m == "stream"); dt = clk() - t0
            if on:
                gcon[m][0] += gcs["t"] - g0; gcon[m][1] += n
                for i in range(3): gcon[m][2][i] += gcs["n"][i] - gn0[i]
            if prof and on: prof.disable()
            gc.enable()
            if on: loopscope.uninstrument()
            loopscope.flush()
            res[m]["on" if on else "off"].append(dt / n / 1000)
out = {}
for m in modes:
    on, off = res[m]["on"], res[m]["off"]
    if off:
        diffs = [a - b for a, b in zip(on, off)]
        out[m] = {"added": round(statistics.median(diffs), 1), "lo": round(min(diffs), 1), "hi": round(max(diffs), 1), "off": round(statistics.median(off), 1)}
    else:
        out[m] = {"on": round(statistics.median(on), 1), "lo": round(min(on), 1)}
for m in modes:
    out[m]["gc_us_per_call_on"] = round(gcon[m][0] / max(gcon[m][1], 1) / 1000, 2); out[m]["gc_collections_on"] = gcon[m][2]
print(json.dumps(out))
if prof:
    prof.dump_stats(args.profile)
loopscope.shutdown()
