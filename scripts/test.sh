#!/usr/bin/env bash
# Run the test suite: set up the core venv (.venv) if needed, then scripts/test.py, which builds
# the stacks the selected tests need (tests/stacks.toml: one venv per integration, cached), installs
# the Debian packages they need (chromium for the browser tests), and runs pytest in each venv, in
# parallel, then the tests marked `serial` alone. Its last line sums every run; its exit code is the
# first failing run's. Arguments: test paths select tests (a path alone builds only the stacks its
# tests need: `tests/cli` builds none); `--stack NAME` runs one stack's tests; the rest goes to pytest.
#
#   ./scripts/test.sh                      # everything (what CI runs)
#   ./scripts/test.sh tests/cli -x         # one folder, stop at the first failure
#
# Under CI (CI=true) a stack or a browser that cannot be made fails the run instead of skipping
# the tests that need it. docs/testing.md says more.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/bootstrap.sh

ensure_venv test
if [[ "${CI:-}" == true || "${CI:-}" == 1 ]]; then
  export LOOPSCOPE_REQUIRE_BROWSER=1  # a missing browser fails the browser tests instead of skipping them
  export LOOPSCOPE_REQUIRE_STACKS=1   # a stack not built fails the tests that drive it instead of skipping them
fi
exec "$VENV/bin/python" scripts/test.py "$@"
