"""What loopscope costs in memory: the whole process's RSS, side by side with the plain SDK.

Three cases, each in child processes of its own (RSS is a process's), driven by the real
openai SDK against the fake model server (``tests/fakes/model_server.py``, started here,
in this process, recording nothing):

* ``loop``: ``--calls`` calls of a two-call tool loop (the model asks for ``get_weather``,
  the program answers, the model answers), uninstrumented and instrumented
  (``loopscope.configure(<tmp duckdb>)`` + ``loopscope.instrument()``), with the store's
  writer a thread and a process of its own (``writer="process"``: the application's
  process and the two together), and as the default sets it up (no ``writer=``), the four
  children at once. Printed: RSS after the calls (the store flushed), its ratio to the plain SDK's
  (issue 19's goal: at most 1.5x), and the same split into anonymous memory (what the
  process allocated) and file-backed pages (the code of the libraries it loaded: DuckDB's
  and Arrow's alone are ~130 MB in the writer process); and the RSS before the first call
  (imports, ``configure``). The writer process alone, after its start and after the calls:
  its anonymous memory (what issue 29's fixed cost, under 64 MB, is read against) and its
  file-backed pages, those shared with other processes and its own, and its PSS split the same way,
  and its CPU over the calls. A ``GOAL`` line says whether issue 29's goal is met: the
  application and its writer process together, in anonymous memory after the calls, at most
  1.5x the plain SDK's plus a fixed cost (the tree before the calls, less plain) under 64 MB.
* ``unanswered``: every call a new conversation whose tool call the program never answers
  (a benchmark scoring first answers, a crash between calls): each leaves a stitched turn
  open, waiting for the idle timeout (300 s). Printed: RSS growth per call over the second
  half of the calls, instrumented and plain (goal: bounded; ``MAX_OPEN_TURNS`` open turns at
  most, ~1,000, the rest end as unfinished and are counted).
* ``flood``: loopscope's hand API records turns flat out (~1 KB of content each) while
  another process holds the store file (the writer cannot write; it keeps what it mapped
  and queues the rest, up to ``queue_bytes`` each, and drops and counts the rest). Printed:
  the peak RSS (``VmHWM``) over the RSS before the flood, against the default bound
  (``QUEUE_BYTES``; the queue and the rows held are each bounded by it).

    .venv/bin/python benchmarks/bench_memory.py                 # 20,000 calls a case (~15 min on a quiet machine)
    .venv/bin/python benchmarks/bench_memory.py --calls 4000    # shorter
    .venv/bin/python benchmarks/bench_memory.py --smoke         # 200 calls, 1,000 turns of flood: seconds
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


# -- measuring ----------------------------------------------------------------------------------


ROLLUP = ("Pss", "Pss_Anon", "Pss_File", "Shared_Clean", "Private_Clean")
"""What ``smaps_rollup`` adds to the status's figures: the PSS (a process's share of the pages
other processes map too) and its anonymous and file-backed parts; the clean pages (file-backed,
read from a library or the store and never written) shared with other processes and its own."""


def memory(pid: int | str = "self") -> dict[str, int]:
    """A process's (this one's by default) RSS, its anonymous and file-backed parts, its peak,
    its PSS and the rest of :data:`ROLLUP`, in KB (Linux).

    Anonymous memory (``RssAnon``) is what the process allocated: it stays until the process
    frees it, and only swap can take it away. File-backed pages (``RssFile``: the code of
    the libraries it loaded, DuckDB's and Arrow's ~130 MB in the writer process) are clean
    page cache: shared with every process that maps the same files (PSS splits them), and
    the kernel drops them under memory pressure (a container's limit included) and reads
    them again when they are run."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                out[key] = int(value.split()[0])
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                key, _, value = line.partition(":")
                if key in ROLLUP:
                    out[key] = int(value.split()[0])
    except OSError:  # before Linux 4.14: the RSS stands for it
        out["Pss"] = out.get("VmRSS", 0)
    for key in ROLLUP:  # Pss_Anon / Pss_File since Linux 5.9
        out.setdefault(key, 0)
    out["cpu_ms"] = cpu_ms(pid)
    return out


def cpu_ms(pid: int | str = "self") -> int:
    """A process's CPU so far (user + system), in ms: the writer process's cost of its memory
    settings, read beside its memory."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) * 1000 // os.sysconf("SC_CLK_TCK")


def tree(app: dict[str, int], writer: dict[str, int]) -> dict[str, int]:
    """The application and its writer process together: what a container's memory limit counts."""
    return {key: app.get(key, 0) + writer.get(key, 0) for key in app}


# -- the fake model server (this process) --------------------------------------------------------


def start_server() -> Any:
    sys.path.insert(0, str(ROOT / "tests"))
    from fakes.model_server import FakeModelServer, RecordedRequest, Reply, ToolCall, Usage

    tool_reply = Reply(tool_calls=[ToolCall("get_weather", {"city": "Paris", "unit": "celsius"})], usage=Usage(182, 24, cached_tokens=64))
    final_reply = Reply(text="It is 21 °C and dry in Paris right now, with a light breeze from the west.", usage=Usage(231, 19))

    class Server(FakeModelServer):
        """Answers a request with a tool result with text, any other with a tool call, and
        keeps no request (the fake's own record would grow with every call)."""

        def _record(self, api, method, path, query, headers, body, raw):  # type: ignore[no-untyped-def]
            return RecordedRequest(0, api, method, path, query, headers, body, raw)

        def _next_reply(self, req):  # type: ignore[no-untyped-def]
            return (final_reply if req.tool_results else tool_reply), "bench"

    return Server().start()


# -- the children -------------------------------------------------------------------------------


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]


def child(case: str, mode: str, calls: int, base_url: str) -> dict[str, Any]:
    """``mode``: ``off`` (plain), ``on`` (loopscope, its writer a thread), ``process``
    (loopscope, its writer a process of its own: measured too, as ``writer``) or ``default``
    (loopscope as ``configure()`` sets it up with no ``writer=``). One call first, then
    ``before`` (the writer process started, its imports and the store's check done)."""
    import openai

    folder = tempfile.mkdtemp(prefix="bench-memory-")
    instrumented = mode != "off"
    if instrumented:
        import loopscope

        writer = {"process": "process", "default": None}.get(mode, "thread")
        loopscope.configure(os.path.join(folder, "memory.duckdb"), writer=writer)
        loopscope.instrument()
    client = openai.OpenAI(base_url=base_url, api_key="bench", max_retries=0)

    def writer_memory() -> dict[str, int]:
        if not instrumented:
            return {}
        import loopscope
        import loopscope.pipeline

        loopscope.flush()
        pid = getattr(loopscope.pipeline.active().writer, "child_pid", lambda: None)()
        return memory(pid) if pid is not None else {}

    client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "warm"}], tools=TOOLS)  # type: ignore[arg-type]
    before, writer_before = memory(), writer_memory()
    half: dict[str, int] = {}
    done = 0
    i = 0
    while done < calls:
        messages: list[Any] = [{"role": "user", "content": f"What is the weather in Paris? ({i}) " + "Answer briefly. " * 8}]
        first = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
        done += 1
        if case == "loop":
            call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
            messages += [first.choices[0].message.model_dump(exclude_none=True),
                         {"role": "tool", "tool_call_id": call.id, "content": "21 °C, dry, light breeze from the west."}]
            client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
            done += 1
        i += 1
        if not half and done >= calls // 2:
            half = memory()
    writer = writer_memory()
    return {"before": before, "writer_before": writer_before, "half": half, "after": memory(), "writer": writer,
            "calls": done}


def flood_child(turns: int) -> dict[str, Any]:
    import loopscope
    import loopscope.pipeline
    from loopscope.storage.limits import QUEUE_BYTES  # (not storage.duckdb.writer: DuckDB stays out of this process)

    path = os.path.join(tempfile.mkdtemp(prefix="bench-memory-"), "flood.duckdb")
    pipeline = loopscope.configure(path)
    with loopscope.turn(input="warm") as t:
        t.generation("warm", finish_reason="stop")
    loopscope.flush()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import duckdb, sys; c = duckdb.connect(sys.argv[1]); print('held', flush=True); sys.stdin.read()", path],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    content = "lorem ipsum dolor sit amet " * 12  # ~320 characters, three times a turn
    pid = getattr(pipeline.writer, "child_pid", lambda: None)()
    before, writer_before = memory(), (memory(pid) if pid is not None else {})
    try:
        for i in range(turns):
            with loopscope.turn(session_id=f"flood-{i % 500}", input=f"{i}: {content}") as t:
                t.generation(content, finish_reason="stop", usage={"input_tokens": 100, "output_tokens": 20})
                t.generation(content, finish_reason="stop")
        time.sleep(1.0)  # the writer's next try (it keeps the rows it mapped, bounded too)
        stats = pipeline.stats()
        peak = memory()
        writer_peak = memory(pid) if pid is not None else {}
    finally:
        holder.stdin.close()  # type: ignore[union-attr]
        holder.wait()
    loopscope.shutdown()
    return {"before": before, "after": peak, "writer_before": writer_before, "writer": writer_peak, "turns": turns, "dropped": stats.dropped if stats else 0,
            "queued_bytes": stats.queued_bytes if stats else 0, "bound": QUEUE_BYTES}


def run_children(specs: list[list[str]]) -> list[dict[str, Any]]:
    """Start the children at once (load that comes and goes hits them alike); their results."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("LOOPSCOPE_STRICT", None)
    procs = [subprocess.Popen([sys.executable, __file__, "--child", *spec], stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
             for spec in specs]
    out = []
    for proc in procs:
        stdout, _ = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"a child failed ({proc.returncode}): {stdout[-2000:]}")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def mb(kb: float) -> str:
    return f"{kb / 1024:7.1f} MB"


FIXED_GOAL = 64 * 1024
"""KB: the fixed cost the whole tree may add (issue 29's goal: at most 1.5x plus this)."""
FLOOD_GOAL = 4
"""Times ``queue_bytes`` the application and its writer process may grow by together under a
flood: the application's queue, and the child's queue and rows held, each bounded by it."""


def loop_report(off: dict[str, Any], on: dict[str, Any], proc: dict[str, Any], default: dict[str, Any]) -> None:
    print(f"loop: {on['calls']} calls of a two-call tool loop, memory after the calls (the store flushed); "
          "loopscope's writer a thread, and a process of its own (writer=\"process\")")
    for name, key in (("RSS", "VmRSS"), ("  anonymous", "RssAnon"), ("  file-backed (code)", "RssFile"), ("PSS", "Pss")):
        a, b, c = off["after"][key], on["after"][key], proc["after"][key]
        print(f"  {name:<22} plain {mb(a)}  thread writer {mb(b)} {b / a:.2f}x   writer process: app alone {mb(c)} {c / a:.2f}x")
    a, b, c = off["before"]["VmRSS"], on["before"]["VmRSS"], proc["before"]["VmRSS"]
    print(f"  {'before (one call made)':<22} plain {mb(a)}  thread writer {mb(b)} {b / a:.2f}x   "
          f"writer process: app alone {mb(c)} {c / a:.2f}x")
    if proc["writer"]:
        # the whole tree, what a container's limit counts: the application and its writer process
        print("  app + writer process (the whole tree):")
        for name, key in (("RSS", "VmRSS"), ("  anonymous", "RssAnon"), ("  file-backed (code)", "RssFile"), ("PSS", "Pss")):
            a = off["after"][key]
            whole, start = tree(proc["after"], proc["writer"])[key], tree(proc["before"], proc["writer_before"])[key]
            fixed = start - off["before"][key]  # what the tree adds before the calls: imports, the child's start
            grown = whole - fixed  # the rest, against the plain process's
            goal = "met" if whole <= 1.5 * a + FIXED_GOAL and fixed <= FIXED_GOAL else "NOT met"
            print(f"    {name:<20} {mb(whole)} (writer {mb(proc['writer'][key])})  {whole / a:.2f}x plain; fixed "
                  f"{mb(fixed)}, the rest {grown / a:.2f}x plain (goal: 1.5x + {mb(FIXED_GOAL)} fixed: {goal})")
    if proc["writer"]:
        writer_report(proc["writer_before"], proc["writer"], on["calls"])
        goal_report(off, proc)
    a, d = off["after"]["VmRSS"], default["after"]["VmRSS"]
    dw = default["writer"].get("VmRSS", 0)
    print(f"  {'default (no writer=)':<22} app {mb(d)} + writer {mb(dw)}  {(d + dw) / a:.2f}x "
          f"({'a writer process' if default['writer'] else 'the thread writer'})")


def goal_report(off: dict[str, Any], proc: dict[str, Any]) -> bool:
    """Issue 29's goal, on one line: the application and its writer process together, their
    anonymous memory after the calls, at most 1.5x the plain SDK's plus a fixed cost (what the
    tree adds before the calls: imports, the writer process's start) under 64 MB. Anonymous
    memory is what the processes allocated; their file-backed pages are the libraries' code,
    shared and reclaimable (see :func:`memory`). Returns whether it is met."""
    plain = off["after"]["RssAnon"]
    whole = tree(proc["after"], proc["writer"])["RssAnon"]
    fixed = tree(proc["before"], proc["writer_before"])["RssAnon"] - off["before"]["RssAnon"]
    bound = 1.5 * plain + FIXED_GOAL
    met = whole <= bound and fixed <= FIXED_GOAL
    print(f"  GOAL (issue 29, anonymous memory after {proc['calls']} calls): app + writer {mb(whole)} "
          f"(app {mb(proc['after']['RssAnon'])}, writer {mb(proc['writer']['RssAnon'])}) against 1.5 x plain {mb(plain)} "
          f"+ {mb(FIXED_GOAL)} = {mb(bound)}; fixed {mb(fixed)} (under {mb(FIXED_GOAL)}): "
          f"{'goal met' if met else 'goal NOT met'}")
    return met


def writer_report(idle: dict[str, int], after: dict[str, int], calls: int) -> None:
    """The writer process alone, after its start (one call written) and after the calls: the
    fixed cost's goal (under 64 MB) is read against its anonymous memory, what the process
    costs the machine; its file-backed pages are the libraries' clean pages, counted in its
    RSS but shared and reclaimable (see :func:`memory`)."""
    print(f"  the writer process alone, after its start (one call) -> after {calls} calls:")
    rows = (("RSS", "VmRSS"), ("  anonymous", "RssAnon"), ("  file-backed", "RssFile"),
            ("    shared with others", "Shared_Clean"), ("    its own (clean)", "Private_Clean"),
            ("PSS", "Pss"), ("  anonymous", "Pss_Anon"), ("  file-backed", "Pss_File"))
    for name, key in rows:
        print(f"    {name:<24} {mb(idle[key])} -> {mb(after[key])}")
    fixed, grown = idle["RssAnon"], after["RssAnon"]
    print(f"    anonymous after its start {mb(fixed)} (goal: under {mb(FIXED_GOAL)}: "
          f"{'met' if fixed <= FIXED_GOAL else 'NOT met'}); after the calls {mb(grown)}")
    print(f"    CPU over the calls {(after['cpu_ms'] - idle['cpu_ms']) / 1000:.2f} s "
          f"({(after['cpu_ms'] - idle['cpu_ms']) * 1000 / max(1, calls):.0f} us a call)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20_000, help="model calls a child makes (loop and unanswered)")
    parser.add_argument("--flood-turns", type=int, default=60_000, help="turns recorded in the flood case")
    parser.add_argument("--cases", default="loop,unanswered,flood")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks that the benchmark runs")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        case, *rest = args.child
        if case == "flood":
            result = flood_child(int(rest[0]))
        else:
            result = child(case, rest[0], int(rest[1]), rest[2])
        print(json.dumps(result))
        return
    if args.smoke:
        args.calls, args.flood_turns = 200, 1_000
    cases = args.cases.split(",")
    server = start_server()
    try:
        if "loop" in cases:
            off, on, proc, default = run_children([["loop", mode, str(args.calls), server.openai_base_url]
                                                   for mode in ("off", "on", "process", "default")])
            loop_report(off, on, proc, default)
        if "unanswered" in cases:
            off, on = run_children([["unanswered", "off", str(args.calls), server.openai_base_url],
                                    ["unanswered", "on", str(args.calls), server.openai_base_url]])
            print(f"unanswered: {on['calls']} calls whose tool call is never answered, RSS growth over the second half")
            for name, r in (("plain", off), ("loopscope", on)):
                grown = r["after"]["VmRSS"] - r["half"]["VmRSS"]
                per = grown * 1024 / max(1, r["calls"] - r["calls"] // 2)
                print(f"  {name:<10} {mb(r['half']['VmRSS'])} -> {mb(r['after']['VmRSS'])}  {per:8.0f} bytes a call")
        if "flood" in cases:
            [r] = run_children([["flood", str(args.flood_turns)]])
            grown = r["after"]["VmHWM"] - r["before"]["VmRSS"]
            print(f"flood: {r['turns']} turns recorded flat out while another process holds the store")
            print(f"  application: peak RSS over the RSS before: {mb(grown)} (queue_bytes {mb(r['bound'] / 1024)}; queue and rows "
                  f"held each bounded by it); dropped and counted: {r['dropped']} spans; held now {mb(r['queued_bytes'] / 1024)}")
            if r["writer"]:
                w_grown = r["writer"]["VmHWM"] - r["writer_before"]["VmRSS"]
                print(f"  writer process: peak RSS {mb(r['writer']['VmHWM'])}, over its RSS before: {mb(w_grown)}; "
                      f"together over theirs before: {mb(grown + w_grown)} (goal: under {mb(FLOOD_GOAL * r['bound'] / 1024)})")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
