#!/usr/bin/env bash
# Set up .venv if needed, then run the offline demo agent and print what loopscope recorded.
# Writes ./loopscope.duckdb in the repository root (or $LOOPSCOPE_DB). Extra arguments
# go to `loopscope demo` (e.g. --db /tmp/demo.duckdb, --json).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/bootstrap.sh
ensure_venv
exec .venv/bin/loopscope demo "$@"
