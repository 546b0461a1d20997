"""Create or update the venvs of the OpenAI Agents SDK's two OpenTelemetry bridges that
tests/ingest/test_agents_bridges.py drives, idempotently:

* ``benchmarks/.venv-agents-otel``: ``tests/fixtures/foreign/requirements-agents-otel.txt``
  (the official ``opentelemetry-instrumentation-openai-agents-v2``);
* ``benchmarks/.venv-agents-oi``: ``tests/fixtures/foreign/requirements-agents-oi.txt``
  (OpenInference's ``openinference-instrumentation-openai-agents``).

Made as ``benchmarks/bench_openai_overhead.py`` makes the peers' venvs (``-e .``, the project
venv's openai client stack pinned, a stamp: an unchanged venv costs nothing, pip is not
started). Run by ``scripts/peers-agents.sh`` with the project venv's Python; exit status 1
when a venv could not be made (the reason printed).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_openai_overhead import Venv, ensure_venv

FOREIGN = ROOT / "tests" / "fixtures" / "foreign"
VENVS = {
    "otel": Venv("agents-otel", ROOT / "benchmarks" / ".venv-agents-otel", FOREIGN / "requirements-agents-otel.txt"),
    "oi": Venv("agents-oi", ROOT / "benchmarks" / ".venv-agents-oi", FOREIGN / "requirements-agents-oi.txt"),
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
