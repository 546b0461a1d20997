"""Where 1 MiB values could live in a DuckDB store, in plain DuckDB (issue 30: the byte bound
does not bound memory).

The writer's pattern without loopscope: ``--values`` tool results of ``--value-kib`` KiB, 3
event rows a call (input, tool call, tool result), written ``--batch`` calls at a time (16: a
quarter of the 64 MiB ``queue_bytes`` in 1 MiB values, the writer's ``BATCH_SHARE``), each
batch in one transaction of its own attach (``ATTACH``, insert from Arrow, ``COMMIT``,
``DETACH``), its rows left in the WAL until DuckDB's ``checkpoint_threshold`` (16 MiB) makes
the commit checkpoint, as the writer does for batches of large values. One child process a
case and run (RSS is a process's). Layouts (``--cases``):

- ``today``: the value in ``events.content``, as the store has it;
- ``table``: the value whole in a table of its own (``id, text``), the event row's content NULL;
- ``parts``: the value in ``--part-kib`` KiB parts in a table of its own (``id, part, text``);
- ``parts-rg``: ``parts`` with the file attached ``(ROW_GROUP_SIZE 2048)``, DuckDB's smallest;
- ``rg``, ``zstd``: today's layout with ``ROW_GROUP_SIZE 2048`` / ``force_compression='zstd'``
  (the cheap knobs);
- ``file``: the value appended to a segment file beside the store, the row holding its offset
  and length (the floor: no DuckDB page holds a value, but no view can read it either).

Printed per case, medians of ``--runs`` runs: the peak RSS (``VmHWM``) of the writes over the
RSS before them; MiB a second of values written; the file's MiB; the seconds to read every
value back whole through a view (``events_v``: the event rows with the value put back where it
lives elsewhere) and whether all came back equal; the milliseconds of a read that needs no
value (one session's rows by index, through the same view). DuckDB rewrites a table's last row
group whole at each checkpoint, values and all, and holds a vector's worth of rows at a time:
what bounds the peak is the bytes one row group (and one vector, 2,048 rows) can hold.

    .venv/bin/python benchmarks/bench_value_layout.py                       # 300 values, 3 runs
    .venv/bin/python benchmarks/bench_value_layout.py --values 600 --cases today parts-rg
    .venv/bin/python benchmarks/bench_value_layout.py --smoke               # checks that it runs
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

CASES = ("today", "table", "parts", "parts-rg", "rg", "zstd", "file")

CHILD = textwrap.dedent(r"""
    import base64, hashlib, json, os, sys, time
    import duckdb, pyarrow as pa

    case, folder, values, batch, size, part, kind = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7]), sys.argv[7]
    path = os.path.join(folder, "store.duckdb")
    seg_path = os.path.join(folder, "store.duckdb.values")
    filler = ("tool result row " * (size // 16 + 1))[:size]

    def value(i):
        if kind == "same":  # bench_big_values.py's values: one letter repeated
            return json.dumps(chr(97 + i % 26) * (size - 2))
        return json.dumps(base64.b64encode(os.urandom((size - 2) * 3 // 4)).decode())  # DuckDB cannot compress these

    def status(key):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) / 1024

    home = duckdb.connect(":memory:")
    home.execute("SET threads = 1; SET allocator_flush_threshold = '8MiB'; SET allocator_bulk_deallocation_flush_threshold = '8MiB'")
    if case == "zstd":
        home.execute("SET force_compression = 'zstd'")
    options = " (ROW_GROUP_SIZE 2048)" if case in ("rg", "parts-rg") else ""
    home.execute(f"ATTACH '{path}' AS s{options}")
    home.execute("CREATE TABLE s.events (id VARCHAR, session_id VARCHAR, idx BIGINT, type VARCHAR, content JSON)")
    if case in ("parts", "parts-rg"):
        home.execute("CREATE TABLE s.loopscope_values (id VARCHAR NOT NULL, part INTEGER NOT NULL, text VARCHAR NOT NULL)")
    elif case == "table":
        home.execute("CREATE TABLE s.loopscope_values (id VARCHAR NOT NULL, text VARCHAR NOT NULL)")
    home.execute("USE memory; DETACH s")
    segment = open(seg_path, "ab") if case == "file" else None
    digest = hashlib.md5()
    before = status("VmRSS")
    start = time.perf_counter()
    for first in range(0, values, batch):
        ids, sessions, idx, types, content, value_ids, value_parts, value_texts = [], [], [], [], [], [], [], []
        for n in range(first, min(values, first + batch)):
            for kind_of in ("input", "tool_call", "tool_result"):
                ids.append(f"e{n}-{kind_of}"); sessions.append(f"s{n % 8}"); idx.append(n); types.append(kind_of)
                if kind_of != "tool_result":
                    content.append(json.dumps({"n": n}))
                    continue
                text = value(n)
                digest.update(text.encode())
                if case == "file":
                    data = text.encode()
                    content.append(json.dumps({"offset": segment.tell(), "length": len(data)}))
                    segment.write(data)
                elif case in ("parts", "parts-rg"):
                    for p, at in enumerate(range(0, len(text), part)):
                        value_ids.append(ids[-1]); value_parts.append(p); value_texts.append(text[at:at + part])
                    content.append(None)
                elif case == "table":
                    value_ids.append(ids[-1]); value_texts.append(text); content.append(None)
                else:
                    content.append(text)
                del text
        if segment is not None:
            segment.flush(); os.fsync(segment.fileno())
        rows = pa.table({"id": ids, "session_id": sessions, "idx": idx, "type": types, "content": content})
        script = ["BEGIN", "INSERT INTO events SELECT * FROM rows"]
        if value_ids:
            columns = {"id": value_ids, "part": pa.array(value_parts, pa.int32()), "text": value_texts} if value_parts else {"id": value_ids, "text": value_texts}
            parts_table = pa.table(columns)
            script.append("INSERT INTO loopscope_values SELECT * FROM parts_table")
        del content, value_texts
        home.execute(f"ATTACH '{path}' AS s{options}")
        home.execute("USE s; RESET checkpoint_threshold; PRAGMA disable_checkpoint_on_shutdown")
        home.execute(";\n".join(script + ["COMMIT"]))
        home.execute("USE memory; DETACH s")
        del rows
        parts_table = None
    took = time.perf_counter() - start
    peak = status("VmHWM")
    if segment is not None:
        segment.close()
    size_mib = (os.path.getsize(path) + (os.path.getsize(path + ".wal") if os.path.exists(path + ".wal") else 0)
                + (os.path.getsize(seg_path) if case == "file" else 0)) / (1 << 20)

    # read back: every value whole through a view that puts it back where it lives elsewhere
    home.execute(f"ATTACH '{path}' AS s (READ_ONLY)")
    home.execute("USE s")
    if case in ("parts", "parts-rg"):
        view = ("SELECT e.* REPLACE (coalesce(e.content, v.text) AS content) FROM events e LEFT JOIN "
                "(SELECT id, string_agg(text, '' ORDER BY part)::JSON AS text FROM loopscope_values GROUP BY id) v USING (id)")
    elif case == "table":
        view = "SELECT e.* REPLACE (coalesce(e.content, v.text::JSON) AS content) FROM events e LEFT JOIN loopscope_values v USING (id)"
    else:
        view = "SELECT * FROM events"
    home.execute(f"CREATE TEMP VIEW events_v AS {view}")
    t0 = time.perf_counter()
    back = hashlib.md5()
    cursor = home.execute("SELECT content::VARCHAR FROM events_v WHERE type = 'tool_result' ORDER BY idx")
    with open(seg_path, "rb") if case == "file" else open(os.devnull, "rb") as side:
        while chunk := cursor.fetchmany(16):
            for (text,) in chunk:
                if case == "file":
                    ref = json.loads(text)
                    side.seek(ref["offset"]); text = side.read(ref["length"]).decode()
                back.update(text.encode())
    read_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    home.execute("SELECT id, type, idx FROM events_v WHERE session_id = 's1' ORDER BY idx").fetchall()
    meta_ms = (time.perf_counter() - t0) * 1000
    home.execute("USE memory; DETACH s")
    print(json.dumps({"peak_mib": peak - before, "mib_s": values * size / (1 << 20) / took, "file_mib": size_mib,
                      "read_s": read_s, "equal": back.digest() == digest.digest(), "meta_ms": meta_ms}))
""")


def run(case: str, values: int, batch: int, size: int, part: int, kind: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "child.py"
        script.write_text(CHILD)
        done = subprocess.run(
            [sys.executable, str(script), case, folder, str(values), str(batch), str(size), str(part), kind],
            capture_output=True,
            text=True,
            timeout=3600,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"{case} exited {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--values", type=int, default=300)
    parser.add_argument("--value-kib", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=16, help="values a batch (16: a quarter of 64 MiB)")
    parser.add_argument("--part-kib", type=int, default=16)
    parser.add_argument("--kind", choices=("random", "same"), default="random")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--smoke", action="store_true", help="20 values of 64 KiB, one run: checks that it runs")
    args = parser.parse_args()
    if args.smoke:
        args.values, args.value_kib, args.runs, args.batch = 20, 64, 1, 4
    size, part = args.value_kib << 10, args.part_kib << 10
    print(
        f"{args.values} values of {args.value_kib} KiB ({args.kind}), {args.batch} a batch, {args.runs} runs a case "
        f"(medians); load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'layout':9} {'write peak MiB':>14} {'MiB/s':>6} {'file MiB':>8} {'read back s':>11} {'equal':>5} {'no-value read ms':>16}"
    )
    results = {case: [] for case in args.cases}  # type: dict[str, list[dict[str, float]]]
    for _ in range(args.runs):  # the cases take turns: a change of load falls on all of them
        for case in args.cases:
            results[case].append(run(case, args.values, args.batch, size, part, args.kind))
    for case, runs in results.items():

        def median(key: str, runs: list[dict[str, float]] = runs) -> float:
            return statistics.median(r[key] for r in runs)

        print(
            f"{case:9} {median('peak_mib'):14.0f} {median('mib_s'):6.1f} {median('file_mib'):8.0f} {median('read_s'):11.2f} "
            f"{'yes' if all(r['equal'] for r in runs) else 'NO':>5} {median('meta_ms'):16.1f}"
        )
    print(f"load average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
