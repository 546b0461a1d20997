#!/usr/bin/env bash
# Set up .venv if needed, then run the test suite; pytest's exit code is this script's.
# Extra arguments go to pytest (e.g. tests/cli -x).
#
# The web dashboard's browser tests drive Debian's chromium (/usr/bin/chromium) through
# playwright (installed with the test extras; it never downloads a browser). When
# chromium is missing this script installs it with apt-get if it can (as root, or under
# CI with passwordless sudo); otherwise those tests are skipped and say why. Under CI a
# browser that cannot be installed fails the run instead of skipping the tests.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/bootstrap.sh

CHROMIUM="${LOOPSCOPE_CHROMIUM:-/usr/bin/chromium}"

_in_ci() { [[ "${CI:-}" == true || "${CI:-}" == 1 ]]; }

ensure_chromium() {
  [[ -x "$CHROMIUM" ]] && return 0
  local sudo=()
  if [[ "$(id -u)" -ne 0 ]]; then
    if _in_ci && command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      sudo=(sudo -n)
    else
      _say "no $CHROMIUM: the browser tests will be skipped (install it with: sudo apt-get install chromium)"
      _in_ci && _die "CI needs chromium for the browser tests and cannot install it without root"
      return 0
    fi
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    _say "no $CHROMIUM and no apt-get to install it: the browser tests will be skipped"
    _in_ci && _die "CI needs chromium for the browser tests"
    return 0
  fi
  _say "installing Debian's chromium for the browser tests (apt-get install chromium)"
  local log
  log="$(mktemp)"
  if ! { "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q \
         && "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; } >"$log" 2>&1; then
    tail -n 30 "$log" >&2
    _in_ci && _die "apt-get install chromium failed (log above)"
    _say "apt-get install chromium failed: the browser tests will be skipped"
  fi
  rm -f "$log"
}

ensure_venv test
ensure_chromium
# the peers' venvs (other instrumentations, pinned, from PyPI) the live foreign-span tests drive;
# cached: an unchanged one costs nothing
if ! ./scripts/peers.sh; then
  _in_ci && _die "scripts/peers.sh could not make the peers' venvs (the live foreign-span tests need them)"
  _say "the peers' venvs could not be made: the live foreign-span tests will be skipped"
fi
if _in_ci; then
  export LOOPSCOPE_REQUIRE_BROWSER=1  # a missing browser fails the browser tests instead of skipping them
  export LOOPSCOPE_REQUIRE_PEERS=1  # a missing peers' venv fails the live foreign-span tests instead of skipping them
fi
exec .venv/bin/python -m pytest -q "$@"
