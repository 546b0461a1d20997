"""Added wall time and whole-process CPU per call of a provider SDK: loopscope vs OpenInference.

Issue 32's acceptance: for **litellm** and **google-genai**, side by side in one run with
OpenInference's instrumentation of the same SDK, loopscope adds less. The same hand-written
two-round tool loop (a user question; the model asks for ``get_weather``; the app runs it and
sends the result back; the model answers) runs under each variant of each SDK:

* ``uninstrumented`` -- the plain SDK: the baseline, timed in the same run;
* ``loopscope``      -- ``loopscope.configure(<tmp duckdb>)`` + ``loopscope.instrument()``, the
  store on (its writer process stores the rows while the loop runs);
* ``loopscope-spans`` -- ``loopscope.configure(False, tracer_provider=...)`` + ``instrument()``:
  no store; its spans go to the same ``BatchSpanProcessor`` and counting null exporter as
  OpenInference's below (like for like: the instrumentation and its spans, nothing stored);
* ``openinference``  -- Arize's ``openinference-instrumentation-litellm`` /
  ``-google-genai`` with its defaults, under an SDK ``TracerProvider`` with a
  ``BatchSpanProcessor`` into an exporter that counts and drops the spans (as
  ``bench_openai_overhead.py`` sets its peers up): it pays for its span processing.

SDK calls:

* litellm: ``litellm.completion(model="openai/gpt-4.1-mini", api_base=<fake server>)``, LiteLLM's
  own HTTP code (1.109 on), non-streamed and streamed (``stream_options.include_usage``);
* google-genai: ``client.models.generate_content`` / ``generate_content_stream`` with a
  ``FunctionDeclaration`` tool (a manual loop: the app runs the function), on the Gemini
  Developer API wire.

Every variant runs in its own process (each patches its SDK), all three of an SDK from the
same venv, a stack of tests/stacks.toml (``peers-litellm``, ``peers-gemini``: the SDK in
loopscope's tested range, ``-e .``, the OpenInference package), so the SDK and its HTTP stack
are the very same code under each; the script builds them when missing or stale. One fake
model server (``tests/fakes/model_server.py``, in this script's process) answers every call.

How it is timed (``bench_openai_overhead.py``'s method): the processes start once and warm up,
then are driven over a pipe. In each of ``--rounds`` rounds and each series (``nonstream``,
``stream``), every worker of every SDK takes turns ``--slice`` calls at a time (the order
rotating from sweep to sweep) until each has made ``--block`` calls, so load that comes and
goes hits all alike. Each variant's background work (span batches, the store's writer,
LiteLLM's own logging threads) runs meanwhile, wherever it falls. At the end of a block every
process sits idle for ``--idle`` seconds (default 5.5: longer than loopscope's writer waits
between batches and than the SDK's ``BatchSpanProcessor`` waits between exports, 5 s), so that
what it does in the background runs on its own schedule, as in an application; then what is
left is flushed, untimed, and the CPU the whole process spent since the last block counted (all
its threads, and loopscope's writer process), per call. (A flush straight after each block
would add a batch of the store's per 60 calls that no application pays: ~20 ms of the writer's,
~330 us a call.) Each call is timed with ``perf_counter_ns``
from the call until the response is in hand (a stream: until its last chunk was read).

Reported per SDK and series, against that SDK's uninstrumented baseline in the same run: the
median per-call latency, the added microseconds (the median over the rounds of the variant's
block median minus the baseline's) with their [min..max] over the rounds, the ratio, and the
whole-process CPU per call over the baseline's (median over the rounds). The goal line: loopscope's
added wall time and CPU both below OpenInference's. A variant whose instrumentation recorded
nothing (loopscope without an adapter for that SDK in this tree) is reported as such, not
compared.

    .venv/bin/python benchmarks/bench_provider_overhead.py            # ~5 min (+ the stacks the first time)
    .venv/bin/python benchmarks/bench_provider_overhead.py --smoke    # tiny: that it runs (CI)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_openai_overhead import (
    Venv,
    WorkerProcess,
    _fake_server,
    _process_cpu_ns,
    counting_null_exporter,
    ensure_venv,
    versions,
)


@dataclass(frozen=True)
class Sdk:
    name: str
    venv: Venv
    dist: str  # the SDK's distribution
    peer_module: str  # OpenInference's instrumentation of it
    peer_class: str
    peer_dist: str


SDKS = {
    "litellm": Sdk("litellm", Venv("peers-litellm", "peers-litellm"), "litellm", "openinference.instrumentation.litellm",
                   "LiteLLMInstrumentor", "openinference-instrumentation-litellm"),
    "google-genai": Sdk("google-genai", Venv("peers-gemini", "peers-gemini"), "google-genai",
                        "openinference.instrumentation.google_genai", "GoogleGenAIInstrumentor",
                        "openinference-instrumentation-google-genai"),
}
VARIANTS = ("uninstrumented", "loopscope", "loopscope-spans", "openinference")
LABELS = {"uninstrumented": "uninstrumented", "loopscope": "loopscope (store on)",
          "loopscope-spans": "loopscope (spans only)", "openinference": "OpenInference"}
SERIES = ("nonstream", "stream")
SYSTEM = "You are a helpful assistant. Use the tools when they help; answer in one sentence."
CITIES = ("Paris", "Lyon", "Oslo", "Lima", "Quito", "Porto", "Turin", "Graz")
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city"],
}
OPENAI_MODEL = "gpt-4.1-mini"
GEMINI_MODEL = "gemini-2.5-flash"
# a worker's environment: LiteLLM fetches its price map from the network at import (retrying
# for seconds) unless told to read the copy it ships; nobody's settings leak in
WORKER_ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def get_weather(city: str, unit: str = "celsius") -> dict:
    return {"city": city, "temperature": 21, "unit": unit, "conditions": "dry, light breeze"}


# ----------------------------------------------------------------------------------------------------------------------
# The tool loops: one per SDK, each call timed
# ----------------------------------------------------------------------------------------------------------------------


def _litellm_loop(base_url: str):  # type: ignore[no-untyped-def]
    import litellm

    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city.",
                                               "parameters": WEATHER_SCHEMA}}]
    route = {"model": f"openai/{OPENAI_MODEL}", "api_base": base_url + "/v1", "api_key": "bench-key", "num_retries": 0}

    def loop(calls: int, stream: bool, tag: str) -> list[int]:
        clock = time.perf_counter_ns
        samples: list[int] = []
        turn = 0
        while len(samples) < calls:
            turn += 1
            city = CITIES[turn % len(CITIES)]
            messages: list[dict] = [{"role": "system", "content": SYSTEM},
                                    {"role": "user", "content": f"[{tag}-{turn}] What's the weather like in {city} now?"}]
            for _ in range(4):  # rounds: the fake model asks for one tool, then answers
                t0 = clock()
                if stream:
                    chunks = litellm.completion(messages=messages, tools=tools, temperature=0.2, stream=True,
                                                stream_options={"include_usage": True}, **route)
                    slots: dict[int, dict] = {}
                    for chunk in chunks:
                        for choice in chunk.choices:
                            for part in choice.delta.tool_calls or ():
                                slot = slots.setdefault(part.index, {"id": None, "name": "", "arguments": ""})
                                slot["id"] = slot["id"] or part.id
                                if part.function is not None:
                                    slot["name"] = slot["name"] or (part.function.name or "")
                                    slot["arguments"] += part.function.arguments or ""
                    samples.append(clock() - t0)
                    calls_made = [slots[i] for i in sorted(slots)]
                else:
                    response = litellm.completion(messages=messages, tools=tools, temperature=0.2, **route)
                    samples.append(clock() - t0)
                    calls_made = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                                  for c in response.choices[0].message.tool_calls or ()]
                if not calls_made:
                    break
                messages.append({"role": "assistant", "content": None, "tool_calls": [
                    {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                    for c in calls_made]})
                for c in calls_made:
                    result = get_weather(**json.loads(c["arguments"] or "{}"))
                    messages.append({"role": "tool", "tool_call_id": c["id"], "content": json.dumps(result)})
        return samples

    return loop


def _genai_loop(base_url: str):  # type: ignore[no-untyped-def]
    from google import genai
    from google.genai import types

    client = genai.Client(api_key="bench-key", http_options={"base_url": base_url})
    weather = types.Tool(function_declarations=[types.FunctionDeclaration(
        name="get_weather", description="Current weather for a city.", parameters_json_schema=WEATHER_SCHEMA)])
    config = types.GenerateContentConfig(tools=[weather], temperature=0.2, system_instruction=SYSTEM)

    def loop(calls: int, stream: bool, tag: str) -> list[int]:
        clock = time.perf_counter_ns
        samples: list[int] = []
        turn = 0
        while len(samples) < calls:
            turn += 1
            city = CITIES[turn % len(CITIES)]
            contents: list = [types.Content(role="user", parts=[
                types.Part(text=f"[{tag}-{turn}] What's the weather like in {city} now?")])]
            for _ in range(4):
                t0 = clock()
                if stream:
                    parts: list = []
                    for chunk in client.models.generate_content_stream(model=GEMINI_MODEL, contents=contents, config=config):
                        if chunk.candidates and chunk.candidates[0].content and chunk.candidates[0].content.parts:
                            parts.extend(chunk.candidates[0].content.parts)
                    samples.append(clock() - t0)
                    model_turn = types.Content(role="model", parts=parts)
                else:
                    response = client.models.generate_content(model=GEMINI_MODEL, contents=contents, config=config)
                    samples.append(clock() - t0)
                    model_turn = response.candidates[0].content
                asked = [p.function_call for p in model_turn.parts or () if p.function_call is not None]
                if not asked:
                    break
                contents.append(model_turn)
                contents.append(types.Content(role="user", parts=[
                    types.Part.from_function_response(name=call.name, response=get_weather(**(call.args or {})))
                    for call in asked]))
        return samples

    return loop


LOOPS = {"litellm": _litellm_loop, "google-genai": _genai_loop}


# ----------------------------------------------------------------------------------------------------------------------
# The worker: one variant of one SDK in its own process
# ----------------------------------------------------------------------------------------------------------------------


def _null_provider():  # type: ignore[no-untyped-def]
    """An SDK ``TracerProvider`` with a ``BatchSpanProcessor`` into a counting null exporter:
    where OpenInference's spans go, and loopscope's with no store."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    exporter = counting_null_exporter()
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider, exporter


def _setup_openinference(sdk: Sdk):  # type: ignore[no-untyped-def]
    import importlib

    provider, exporter = _null_provider()
    getattr(importlib.import_module(sdk.peer_module), sdk.peer_class)().instrument(tracer_provider=provider)
    return provider, exporter


def _versions(sdk: Sdk, variant: str) -> dict[str, str]:
    return versions((sdk.dist, "httpx", "opentelemetry-sdk", sdk.peer_dist if variant == "openinference" else None,
                     "loopscope" if variant == "loopscope" else None))


def worker(args: argparse.Namespace) -> int:
    """Serve the orchestrator over stdin/stdout, one JSON line each way per command:
    ``{"series", "calls", "tag"}`` -> ``{"samples": [ns, ...]}``; ``{"settle": true}`` -> the
    background work flushed, then ``{"cpu_ns_per_call", "calls"}`` since the last settle;
    ``{"finish": true}`` -> ``{"check", "recorded"}``."""
    import gc

    proto = os.fdopen(os.dup(1), "w")  # the protocol's stdout; anything a library prints goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(obj: dict) -> None:
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    sdk_name, variant = args.worker.split(":")
    sdk = SDKS[sdk_name]
    tmp = tempfile.mkdtemp(prefix="loopscope-bench-provider-")
    db = os.path.join(tmp, "bench.duckdb")
    settle = lambda: None
    writer_cpu = lambda: 0  # the CPU of loopscope's writer process, ns
    peer = None
    if variant == "loopscope":
        import loopscope
        import loopscope.pipeline

        loopscope.configure(db)
        loopscope.instrument()
        settle = loopscope.flush
        writer_cpu = lambda: _process_cpu_ns(getattr(getattr(loopscope.pipeline.active(), "writer", None),
                                                     "child_pid", lambda: None)())
    elif variant == "loopscope-spans":
        import loopscope

        peer = _null_provider()
        loopscope.configure(False, tracer_provider=peer[0])  # no store: its spans to OpenInference's exporter
        loopscope.instrument()
        settle = peer[0].force_flush
    elif variant == "openinference":
        peer = _setup_openinference(sdk)
        settle = peer[0].force_flush
    loop = LOOPS[sdk_name](args.base_url)
    total = 0
    for mode in SERIES:  # warm-up: imports, the first connection, caches
        total += len(loop(args.warmup, mode == "stream", f"warm-{mode}"))
    settle()
    gc.collect()
    send({"ready": True, "versions": _versions(sdk, variant)})

    period_cpu, period_child, period_calls = time.process_time_ns(), writer_cpu(), 0
    for line in sys.stdin:
        command = json.loads(line)
        if command.get("finish"):
            break
        if command.get("settle"):
            settle()  # untimed: this variant's background work is done before the next block
            now, child = time.process_time_ns(), writer_cpu()
            send({"cpu_ns_per_call": (now - period_cpu + child - period_child) / max(period_calls, 1),
                  "app_cpu_ns_per_call": (now - period_cpu) / max(period_calls, 1), "calls": period_calls})
            period_cpu, period_child, period_calls = now, child, 0
            continue
        samples = loop(command["calls"], command["series"] == "stream", command["tag"])
        total += len(samples)
        period_calls += len(samples)
        send({"samples": samples})

    check, recorded = "", True
    if variant == "loopscope":
        import duckdb

        import loopscope

        loopscope.shutdown()  # ends open turns, flushes the store, stops the writer
        con = duckdb.connect(db, read_only=True)
        calls = con.execute("select count(*) from model_calls").fetchone()[0]
        turns, tools = con.execute("select count(*), coalesce(sum(tool_calls_count), 0) from turns").fetchone()
        con.close()
        recorded = calls > 0
        check = f"stored {calls} model calls, {turns} turns, {tools} tool calls (for {total} calls)"
        if not recorded:
            check += f": no {sdk.name} adapter in this tree (adapters on: {', '.join(sys.modules['loopscope.instrument'].active()) or '-'})"
    elif peer is not None:
        provider, exporter = peer
        provider.force_flush()
        recorded = exporter.spans > 0
        check = f"{exporter.spans} spans exported for {total} calls"
        provider.shutdown()
    shutil.rmtree(tmp, ignore_errors=True)
    send({"check": check, "recorded": recorded})
    return 0


# ----------------------------------------------------------------------------------------------------------------------
# The orchestrator
# ----------------------------------------------------------------------------------------------------------------------


def _say(msg: str) -> None:
    print(msg, flush=True)


class Worker(WorkerProcess):
    """One variant's process, driven block by block."""

    def __init__(self, sdk: Sdk, variant: str, base_url: str, warmup: int, folder: Path) -> None:
        self.sdk = sdk
        self.variant = variant
        self.key = f"{sdk.name}:{variant}"
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("OTEL_", "OPENINFERENCE_", "LOOPSCOPE_", "LITELLM_", "PYTHONPATH"))}
        env.update(WORKER_ENV)
        cmd = [str(sdk.venv.python), str(Path(__file__).resolve()), "--worker", self.key, "--base-url", base_url,
               "--warmup", str(warmup)]
        super().__init__(cmd, env, folder / f"{sdk.name}-{variant}.stderr.log")


def orchestrate(args: argparse.Namespace) -> int:
    started = time.monotonic()
    chosen = [SDKS[name] for name in args.sdks]
    _say(f"provider overhead: {', '.join(s.name for s in chosen)} x {', '.join(VARIANTS)}; {args.rounds} interleaved "
         f"rounds of {args.block} calls per variant per series ({', '.join(SERIES)}), {args.slice} at a time, every "
         f"worker taking turns (+{args.warmup} warm-up calls per series)")
    _say("stacks:")
    unavailable: dict[str, str] = {}
    for sdk in chosen:
        why = ensure_venv(sdk.venv, setup=not args.no_setup)
        if why:
            _say(f"  {sdk.venv.name}: UNAVAILABLE: {why}")
            unavailable[sdk.name] = why
    server, rescript = _fake_server()
    _say(f"fake model server: {server.url} (tests/fakes/model_server.py, in this process)")
    starting: list[Worker] = []
    workers: list[Worker] = []  # those that started
    failed: dict[str, str] = {}
    versions: dict[str, dict[str, str]] = {}
    checks: dict[str, dict] = {}
    samples: dict[str, dict[str, list[int]]] = {}
    per_round: dict[str, dict[str, list[float]]] = {}
    cpu: dict[str, dict[str, list[float]]] = {}
    app_cpu: dict[str, dict[str, list[float]]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="loopscope-bench-provider-") as tmp:
            # every process starts at once (their imports and warm-ups overlap: LiteLLM's import
            # alone takes seconds), the server scripted for all their warm-up calls
            _say("starting one process per variant (imports, instrumentation, warm-up), all at once:")
            starting.extend(Worker(sdk, variant, server.url, args.warmup, Path(tmp))
                            for sdk in chosen if sdk.name not in unavailable for variant in VARIANTS)
            rescript(server, len(starting) * (2 * args.warmup + 10))
            t0 = time.monotonic()
            for w in starting:
                try:
                    versions[w.key] = w.ask({})["versions"]
                except RuntimeError as exc:
                    failed[w.key] = str(exc)
                    w.stop()
                    _say(f"  {w.key:<28} FAILED: {exc}")
                    continue
                workers.append(w)
                samples[w.key] = {s: [] for s in SERIES}
                per_round[w.key] = {s: [] for s in SERIES}
                cpu[w.key] = {s: [] for s in SERIES}
                app_cpu[w.key] = {s: [] for s in SERIES}
                _say(f"  {w.key:<28} ready after {time.monotonic() - t0:.1f}s")
            live = list(workers)
            sweeps = 0
            t_run = time.monotonic()
            for r in range(args.rounds):
                for series in SERIES if r % 2 == 0 else SERIES[::-1]:
                    got: dict[str, list[int]] = {w.key: [] for w in live}
                    while True:
                        pending = [w for w in live if w.key not in failed and len(got[w.key]) < args.block]
                        if not pending:
                            break
                        sweeps += 1  # every worker a slice of calls, the order rotating
                        for w in pending[sweeps % len(pending):] + pending[: sweeps % len(pending)]:
                            rescript(server, args.slice + 10)
                            answer = _ask(w, {"series": series, "calls": args.slice, "tag": f"{r}-{sweeps}"}, failed)
                            if answer is not None:
                                got[w.key].extend(answer["samples"])
                    time.sleep(args.idle)  # every process idle: its background work runs on its own schedule
                    for w in live:  # what is left of each one's background work flushed, untimed; its CPU per call counted
                        if w.key in failed:
                            continue
                        answer = _ask(w, {"settle": True}, failed)
                        if answer is not None and answer["calls"] and got[w.key]:
                            cpu[w.key][series].append(answer["cpu_ns_per_call"] / 1000)
                            app_cpu[w.key][series].append(answer["app_cpu_ns_per_call"] / 1000)
                            samples[w.key][series].extend(got[w.key])
                            per_round[w.key][series].append(statistics.median(got[w.key]) / 1000)
                _say(f"  round {r + 1}/{args.rounds} done ({time.monotonic() - t_run:.0f}s)")
            for w in live:
                if w.key not in failed:
                    try:
                        checks[w.key] = w.ask({"finish": True})
                    except RuntimeError as exc:
                        checks[w.key] = {"check": f"finish failed: {exc}", "recorded": False}
                w.stop()
    finally:
        for w in starting:
            w.stop()
        server.stop()
    return _report(args, chosen, unavailable, failed, versions, checks, samples, per_round, cpu, app_cpu, started)


def _ask(w: Worker, command: dict, failed: dict[str, str]) -> dict | None:
    try:
        return w.ask(command)
    except RuntimeError as exc:
        failed[w.key] = str(exc)
        _say(f"  {w.key} FAILED: {exc}")
        return None


def _report(args, chosen, unavailable, failed, versions, checks, samples, per_round, cpu, app_cpu, started) -> int:  # type: ignore[no-untyped-def]
    _say("")
    _say("what each variant recorded, and its versions:")
    for key, check in checks.items():
        _say(f"  {key:<28} {check['check'] or '-'}")
        _say(f"  {'':<28} [{', '.join(f'{k} {v}' for k, v in versions[key].items())}]")
    _say("")
    _say(f"added = the median over the {args.rounds} rounds of (the variant's block median - the baseline's), "
         "[min..max] over the rounds; ratio = the variant's median per-call latency over the baseline's; cpu = the "
         "whole process's CPU per call (all threads, loopscope's writer process too, its background work after "
         "each block included: an idle wait, then an untimed flush), median over the rounds, minus the baseline's; app cpu = the same for the application's "
         "process alone (without loopscope's writer process)")
    verdicts: dict[str, str] = {}
    for sdk in chosen:
        if sdk.name in unavailable:
            verdicts[sdk.name] = f"not measured: {unavailable[sdk.name].splitlines()[0]}"
            continue
        base = f"{sdk.name}:uninstrumented"
        if base in failed or base not in checks:
            verdicts[sdk.name] = f"not measured: the baseline failed ({failed.get(base, '?')})"
            continue
        added: dict[str, dict[str, float]] = {}
        extra_cpu: dict[str, dict[str, float]] = {}
        extra_app: dict[str, dict[str, float]] = {}
        for series in SERIES:
            _say("")
            _say(f"{sdk.name}, {'streamed' if series == 'stream' else 'not streamed'} "
                 f"({args.rounds * args.block} calls per variant):")
            _say(f"{'variant':<24} {'median ms/call':>14} {'added us/call':>24} {'ratio':>7} {'cpu us/call':>12} "
                 f"{'app cpu':>9}")
            base_med = statistics.median(samples[base][series]) / 1000
            base_cpu = statistics.median(cpu[base][series])
            base_app = statistics.median(app_cpu[base][series])
            for variant in VARIANTS:
                key = f"{sdk.name}:{variant}"
                if key in failed or key not in checks or not samples[key][series]:
                    _say(f"{LABELS[variant]:<24} FAILED: {failed.get(key, 'no samples')}")
                    continue
                med = statistics.median(samples[key][series]) / 1000
                if variant == "uninstrumented":
                    _say(f"{LABELS[variant]:<24} {med / 1000:>14.3f} {'-':>24} {1:>6.2f}x {'-':>12}")
                    continue
                diffs = [x - y for x, y in zip(per_round[key][series], per_round[base][series])]
                add = statistics.median(diffs)
                more = statistics.median(cpu[key][series]) - base_cpu
                more_app = statistics.median(app_cpu[key][series]) - base_app
                added.setdefault(variant, {})[series] = add
                extra_cpu.setdefault(variant, {})[series] = more
                extra_app.setdefault(variant, {})[series] = more_app
                spread = f"{add:.0f} [{min(diffs):.0f}..{max(diffs):.0f}]"
                _say(f"{LABELS[variant]:<24} {med / 1000:>14.3f} {spread:>24} {med / base_med:>6.2f}x {more:>+12.0f} "
                     f"{more_app:>+9.0f}")
        mine, theirs = f"{sdk.name}:loopscope", f"{sdk.name}:openinference"
        if mine not in checks or not checks[mine].get("recorded"):
            verdicts[sdk.name] = ("pending the adapter: loopscope recorded no call of this SDK in this tree"
                                  if mine in checks else f"loopscope not measured ({failed.get(mine, '?')})")
            continue
        if theirs not in checks or "openinference" not in added:
            verdicts[sdk.name] = f"OpenInference not measured ({failed.get(theirs, '?')})"
            continue
        peer = "openinference"
        lines = []
        for ours in ("loopscope-spans", "loopscope"):
            if ours not in added:
                continue
            figures = "; ".join(
                f"{s}: added {added[ours][s]:.0f} vs {added[peer][s]:.0f} us, cpu {extra_cpu[ours][s]:+.0f} vs "
                f"{extra_cpu[peer][s]:+.0f} us (app {extra_app[ours][s]:+.0f} vs {extra_app[peer][s]:+.0f})" for s in SERIES)
            parts = {
                "wall": all(added[ours][s] < added[peer][s] for s in SERIES),
                "whole-process cpu": all(extra_cpu[ours][s] < extra_cpu[peer][s] for s in SERIES),
                "app-process cpu": all(extra_app[ours][s] < extra_app[peer][s] for s in SERIES),
            }
            met = parts["wall"] and parts["whole-process cpu"]
            lines.append(f"{LABELS[ours]}: {figures} -> {'MET' if met else 'NOT MET'} ("
                         + ", ".join(f"{k} {'lower' if v else 'NOT lower'}" for k, v in parts.items()) + ")")
        verdicts[sdk.name] = "\n                 ".join(lines)
    _say("")
    _say("goal (issue 32: loopscope's added wall time and whole-process CPU per call below OpenInference's, each "
         "series; like for like, loopscope's spans into OpenInference's null exporter, then loopscope with its store):")
    for name, verdict in verdicts.items():
        _say(f"  {name:<14} {verdict}")
    _say(f"total {time.monotonic() - started:.0f}s")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: that it runs (CI's smoke run)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 8, smoke 1)")
    parser.add_argument("--block", type=int, default=None, help="calls per variant per series per round (default 60, smoke 4)")
    parser.add_argument("--slice", type=int, default=None, help="calls per worker per sweep (default 4, smoke 2): two turns")
    parser.add_argument("--warmup", type=int, default=None, help="unmeasured calls per series at start (default 30, smoke 2)")
    parser.add_argument("--sdks", nargs="+", choices=list(SDKS), default=list(SDKS), help="the SDKs to measure (default both)")
    parser.add_argument("--idle", type=float, default=None,
                        help="seconds every process sits idle after a block, before its CPU is counted (default 5.5, smoke 0)")
    parser.add_argument("--no-setup", action="store_true", help="do not build or update the stacks' venvs")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # internal: one variant's process, "sdk:variant"
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    defaults = ({"rounds": 1, "block": 4, "slice": 2, "warmup": 2, "idle": 0.0} if args.smoke
                else {"rounds": 8, "block": 60, "slice": 4, "warmup": 30, "idle": 5.5})
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.worker:
        return worker(args)
    return orchestrate(args)


if __name__ == "__main__":
    raise SystemExit(main())
