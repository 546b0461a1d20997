#!/usr/bin/env bash
# Create or update the peers' venvs (benchmarks/.venv-peers, benchmarks/.venv-peers-pydantic-ai,
# benchmarks/.venv-agents-otel, benchmarks/.venv-agents-oi) that the live tests of other
# instrumentations drive (tests/ingest/test_foreign.py, test_stitch_foreign.py,
# test_agents_bridges.py): pip from PyPI, pinned (benchmarks/requirements-peers.txt,
# tests/fixtures/foreign/requirements-*.txt). Idempotent and cached: a stamp per venv,
# so an unchanged one costs a fraction of a second. scripts/test.sh runs it before pytest.
#   ./scripts/peers.sh                        # all four
#   ./scripts/peers.sh agents-otel agents-oi  # only these (also: peers, pydantic-ai)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/bootstrap.sh
ensure_venv test
exec "$VENV/bin/python" scripts/peers.py "$@"
