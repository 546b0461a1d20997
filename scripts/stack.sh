#!/usr/bin/env bash
# Build (or list) the test suite's stacks, the venvs of tests/stacks.toml, without running tests:
#   ./scripts/stack.sh build peers phoenix   # prints each venv's folder
#   ./scripts/stack.sh list                  # every stack, built or not, and its tests
# ./scripts/test.sh builds the ones the selected tests need by itself.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/bootstrap.sh
ensure_venv test
exec "$VENV/bin/python" tests/stacks.py "$@"
