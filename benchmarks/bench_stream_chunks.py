"""CPU per streamed chat call of what a stream proxy does per chunk: hand each chunk on, keep
what the recording needs of it, and fold those into one response (loopscope/instrument/_streams.py
with openai.py's _ChatChunks), on real openai SDK chunk objects and real ModelCalls, without the
call's start and end (``bench_openai_overhead.py`` times whole calls; its noise on this machine,
tens of microseconds a call, hides a change of a few).

    python benchmarks/bench_stream_chunks.py                        # this checkout against plain iteration
    python benchmarks/bench_stream_chunks.py --against /tmp/old     # and another checkout's loopscope/
    python benchmarks/bench_stream_chunks.py --smoke

Each variant runs in a process of its own, the variants taking turns repeat by repeat; the figure
is the median over repeats of process CPU per call: the chunks handed on and read (the stream's
end left out), and the same to the stream's end. The baseline, measured in the same processes,
is iterating the same chunks without loopscope; the ratio is against it. Issue 29's goal: keeping what the provider sent
(an application may change the chunk objects once it has them) costs at most 10 us a streamed call.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _args import calls_and_repeats

ROOT = Path(__file__).resolve().parents[1]
GOAL_US = 10.0


def measure(source: str, calls: int) -> dict[str, float]:
    """In a child: CPU per call of the proxy and its accumulator, and of plain iteration."""
    sys.path.insert(0, source)
    sys.path.insert(0, str(ROOT / "tests"))
    import loopscope
    from fakes.model_server import FakeModelServer, Reply, ToolCall, Usage
    from loopscope.instrument import _streams
    from loopscope.instrument._streams import SyncStream
    from loopscope.instrument.openai import _ChatChunks
    from loopscope.recorder.adapter import ModelRequest, start_model_call

    assert loopscope.__file__.startswith(source), loopscope.__file__
    server = FakeModelServer().start()
    server.queue(
        Reply(tool_calls=[ToolCall("get_weather", {"city": "Paris", "unit": "celsius"})], usage=Usage(120, 20)),
        Reply(text="It is 21 degrees and dry in Paris, with a light breeze from the west.", usage=Usage(160, 18)),
    )
    client = server.openai_client()
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}]
    replies = [
        list(client.chat.completions.create(model="gpt-4.1-mini", messages=[{"role": "user", "content": "q"}], tools=tools,
                                            stream=True, stream_options={"include_usage": True}))
        for _ in range(2)
    ]
    server.stop()
    loopscope.configure(False)
    unfinished = _streams._unfinished
    model_calls = [start_model_call(ModelRequest("openai", "gpt-4.1-mini", tools, stream=True)) for _ in range(3 * calls)]

    def proxied(batch: list) -> float:
        """Every chunk handed on and read, the call not ended (its end is the same code
        before and after issue 29's change, but for what other changes did to it)."""
        start = time.process_time_ns()
        for i, call in enumerate(batch):
            chunks = replies[i % 2]
            proxy = SyncStream(chunks, call, _ChatChunks())
            it = iter(proxy)
            for _ in range(len(chunks)):
                next(it)
            recording = proxy._self_recording
            recording.feed()  # what the stream's end does first: the last batch read
            unfinished.pop(id(recording), None)
        return (time.process_time_ns() - start) / len(batch) / 1000

    def ended(batch: list) -> float:
        """The same, to the stream's end: the response made and the call ended."""
        start = time.process_time_ns()
        for i, call in enumerate(batch):
            for _ in SyncStream(replies[i % 2], call, _ChatChunks()):
                pass
        return (time.process_time_ns() - start) / len(batch) / 1000

    def plain(n: int) -> float:
        start = time.process_time_ns()
        for i in range(n):
            for _ in replies[i % 2]:
                pass
        return (time.process_time_ns() - start) / n / 1000

    proxied(model_calls[:calls])  # warm-up
    return {"proxy_us": proxied(model_calls[calls : 2 * calls]), "ended_us": ended(model_calls[2 * calls :]),
            "plain_us": plain(calls), "chunks": sum(map(len, replies)) / 2}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(measure(sys.argv[2], int(sys.argv[3]))))
        return
    against = None
    if "--against" in sys.argv:
        at = sys.argv.index("--against")
        against = sys.argv[at + 1]
        del sys.argv[at : at + 2]
    args = calls_and_repeats(__doc__ or "", calls=1000, smoke_calls=20)
    variants = {"loopscope": str(ROOT)}
    if against:
        variants["against"] = str(Path(against).resolve())
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, source in variants.items():
            done = subprocess.run([sys.executable, __file__, "--child", source, str(args.calls)],
                                  capture_output=True, text=True, check=True, cwd=ROOT)
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"stream chunks: {args.calls} streamed calls per variant per repeat, {args.repeats} repeats, "
          f"{runs['loopscope'][0]['chunks']:.0f} chunks a call; CPU us per call, median over repeats")
    print(f"{'variant':<12} {'chunks us':>9} {'ended us':>9} {'plain us':>9} {'ratio':>7}")
    medians = {}
    for name, results in runs.items():
        proxy = statistics.median(r["proxy_us"] for r in results)
        whole = statistics.median(r["ended_us"] for r in results)
        plain = statistics.median(r["plain_us"] for r in results)
        medians[name] = proxy
        print(f"{name:<12} {proxy:9.2f} {whole:9.2f} {plain:9.2f} {proxy / plain:6.1f}x")
    if against:
        added = medians["loopscope"] - medians["against"]
        verdict = "met" if added <= GOAL_US else "NOT met"
        print(f"chunks handed on and read, this checkout minus --against: {added:+.2f} us a streamed call "
              f"(goal <= {GOAL_US:.0f}: {verdict}); 'ended' adds the call's end, where other changes show")


if __name__ == "__main__":
    main()
