#!/usr/bin/env bash
# Set up .venv if needed (loopscope alone: the demo needs none of the test extras), then run
# the offline demo agent and print what loopscope recorded.
# Writes ./loopscope.duckdb in the repository root (or $LOOPSCOPE_DB). Extra arguments
# go to `loopscope demo` (e.g. --db /tmp/demo.duckdb, --json).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/bootstrap.sh
ensure_venv ""
status=0
.venv/bin/loopscope demo "$@" || status=$?
# the demo's "Next:" commands call `loopscope`: say how to get it when this shell lacks it
if [[ $status -eq 0 && "$(command -v loopscope || true)" != "$VENV/bin/loopscope" ]]; then
  _say "to run the commands under \"Next:\" here, first: source .venv/bin/activate"
fi
exit $status
