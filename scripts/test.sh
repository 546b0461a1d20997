#!/usr/bin/env bash
# Set up .venv if needed, then run the test suite; pytest's exit code is this script's.
# Extra arguments go to pytest (e.g. tests/cli -x).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/bootstrap.sh
ensure_venv
exec .venv/bin/python -m pytest -q "$@"
