"""Create or update the peers' venvs the live foreign-instrumentation tests drive
(tests/ingest/test_foreign.py, tests/ingest/test_stitch_foreign.py,
tests/ingest/test_agents_bridges.py), idempotently.

* ``benchmarks/.venv-peers``: ``benchmarks/requirements-peers.txt`` (official GenAI openai,
  OpenLLMetry, OpenInference), made exactly as ``benchmarks/bench_openai_overhead.py``
  makes it (the same stamp: neither rebuilds what the other built);
* ``benchmarks/.venv-peers-pydantic-ai``: ``tests/fixtures/foreign/requirements-pydantic-ai.txt``;
* ``benchmarks/.venv-agents-otel``: ``tests/fixtures/foreign/requirements-agents-otel.txt`` (the
  OpenAI Agents SDK's official OTel bridge, ``opentelemetry-instrumentation-openai-agents-v2``);
* ``benchmarks/.venv-agents-oi``: ``tests/fixtures/foreign/requirements-agents-oi.txt``
  (OpenInference's ``openinference-instrumentation-openai-agents``).

Each has a stamp of its requirements, the project venv's openai client stack and Python;
an unchanged one costs nothing (pip is not started). Run by ``scripts/peers.sh`` with the
project venv's Python; exit status 1 when a venv could not be made (the reason printed).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_openai_overhead import PEERS, Venv, ensure_venv  # benchmarks/ is no package: imported by path

FOREIGN = ROOT / "tests" / "fixtures" / "foreign"
VENVS = {
    "peers": PEERS,
    "pydantic-ai": Venv("peers-pydantic-ai", ROOT / "benchmarks" / ".venv-peers-pydantic-ai",
                        FOREIGN / "requirements-pydantic-ai.txt"),
    "agents-otel": Venv("agents-otel", ROOT / "benchmarks" / ".venv-agents-otel", FOREIGN / "requirements-agents-otel.txt"),
    "agents-oi": Venv("agents-oi", ROOT / "benchmarks" / ".venv-agents-oi", FOREIGN / "requirements-agents-oi.txt"),
}


def main(names: list[str]) -> int:
    failed = 0
    for name in names or list(VENVS):
        why = ensure_venv(VENVS[name], setup=True)
        if why is not None:
            print(f"loopscope setup: {VENVS[name].folder.relative_to(ROOT)}: {why}", file=sys.stderr)
            failed = 1
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
