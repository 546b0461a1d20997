#!/usr/bin/env bash
# Create or update the venvs of the OpenAI Agents SDK's two OpenTelemetry bridges
# (benchmarks/.venv-agents-otel, benchmarks/.venv-agents-oi) that tests/ingest/test_agents_bridges.py
# drives: pip from PyPI, pinned (tests/fixtures/foreign/requirements-agents-*.txt). Idempotent and
# cached (a stamp per venv). scripts/test.sh runs it before pytest.
#   ./scripts/peers-agents.sh          # both
#   ./scripts/peers-agents.sh otel     # only benchmarks/.venv-agents-otel (or: oi)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/bootstrap.sh
ensure_venv test
exec "$VENV/bin/python" scripts/peers_agents.py "$@"
