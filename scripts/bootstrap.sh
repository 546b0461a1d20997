#!/usr/bin/env bash
# Create ./.venv (if needed) and install loopscope into it: with its test extras by default,
# or loopscope alone for the demo.
#
#   ./scripts/bootstrap.sh        # pip install -e '.[test]'; then: source .venv/bin/activate
#   ./scripts/bootstrap.sh demo   # pip install -e . (what `loopscope demo` needs, nothing more)
#
# Each set of extras has its own stamp in .venv, so the demo then the tests installs the
# test extras once, and the tests then the demo installs nothing more (the test extras
# include everything the demo needs). A changed pyproject.toml reinstalls.
#
# Python: $LOOPSCOPE_PYTHON if set, else Python 3.12 (from pyenv, or python3.12 on PATH),
# else python3 if it is 3.10 or newer. With CI=true (or LOOPSCOPE_REQUIRE_312=1) only
# Python 3.12 is accepted and the script fails, saying so, when there is none.
# The other scripts in this folder source this one, so they work on a fresh clone.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
# one stamp per extras set ("" = loopscope alone), holding pyproject.toml's fingerprint
_stamp() { echo "$VENV/.loopscope-installed${1:+-$1}"; }

_say() { printf 'loopscope setup: %s\n' "$*" >&2; }
_die() { _say "error: $*"; exit 1; }

_require_312() {
  [[ "${LOOPSCOPE_REQUIRE_312:-}" == 1 || "${CI:-}" == true || "${CI:-}" == 1 ]]
}

# prints "major.minor" of an interpreter, or nothing if it does not run
_version_of() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true; }

_acceptable() {  # _acceptable VERSION
  local v="$1"
  [[ -n "$v" ]] || return 1
  if _require_312; then [[ "$v" == 3.12 ]]; return; fi
  local minor="${v#3.}"
  [[ "$v" == 3.* && "$minor" =~ ^[0-9]+$ && "$minor" -ge 10 ]]
}

_find_python() {
  local candidate version
  if [[ -n "${LOOPSCOPE_PYTHON:-}" ]]; then
    version="$(_version_of "$LOOPSCOPE_PYTHON")"
    _acceptable "$version" || _die "LOOPSCOPE_PYTHON=$LOOPSCOPE_PYTHON is Python ${version:-?}; need $(_require_312 && echo 3.12 || echo '>= 3.10')"
    echo "$LOOPSCOPE_PYTHON"; return
  fi
  # 1. pyenv: the newest installed 3.12.x (on these machines PYENV_VERSION=3.12.1)
  if command -v pyenv >/dev/null 2>&1; then
    local v312
    v312="$(pyenv versions --bare 2>/dev/null | grep -E '^3\.12(\.[0-9]+)?$' | sort -V | tail -n 1 || true)"
    if [[ -n "$v312" ]]; then
      candidate="$(PYENV_VERSION="$v312" pyenv which python 2>/dev/null || true)"
      if [[ -n "$candidate" && "$(_version_of "$candidate")" == 3.12 ]]; then echo "$candidate"; return; fi
    fi
  fi
  # 2. python3.12 on PATH (a pyenv shim that cannot run it prints nothing here)
  if command -v python3.12 >/dev/null 2>&1 && [[ "$(_version_of python3.12)" == 3.12 ]]; then
    command -v python3.12; return
  fi
  if _require_312; then
    _die "Python 3.12 not found (tried pyenv and python3.12 on PATH). Install it (e.g. 'pyenv install 3.12') or set LOOPSCOPE_PYTHON=/path/to/python3.12."
  fi
  # 3. python3 if it is new enough
  for candidate in python3 python; do
    if command -v "$candidate" >/dev/null 2>&1; then
      version="$(_version_of "$candidate")"
      if _acceptable "$version"; then command -v "$candidate"; return; fi
    fi
  done
  _die "no Python >= 3.10 found (tried pyenv 3.12, python3.12, python3). Install one or set LOOPSCOPE_PYTHON."
}

_venv_ok() {
  [[ -x "$VENV/bin/python" ]] || return 1
  _acceptable "$(_version_of "$VENV/bin/python")"
}

_fingerprint() { cat "$ROOT/pyproject.toml" | cksum | cut -d' ' -f1; }

_installed() {  # _installed EXTRAS: EXTRAS, or the test extras (which hold every other extra), match pyproject.toml
  local stamp
  for stamp in "$(_stamp "$1")" "$(_stamp test)"; do
    [[ -f "$stamp" && "$(cat "$stamp")" == "$(_fingerprint)" ]] && return 0
  done
  return 1
}

ensure_venv() {  # ensure_venv [EXTRAS]: EXTRAS "test" (the default) or "" (loopscope alone)
  local extras="${1-test}"
  local target="$ROOT${extras:+[$extras]}"
  if ! _venv_ok; then
    local python
    python="$(_find_python)"
    _say "creating .venv with $python (Python $(_version_of "$python"))"
    rm -rf "$VENV"
    "$python" -m venv "$VENV" || _die "could not create $VENV with $python"
  fi
  if ! _installed "$extras" || ! "$VENV/bin/python" -c 'import loopscope' >/dev/null 2>&1; then
    local what="pip install -e '.${extras:+[$extras]}'"
    _say "installing loopscope${extras:+ and its $extras extras} into .venv ($what)"
    export PIP_DISABLE_PIP_VERSION_CHECK=1
    local log="$VENV/pip-install.log"
    "$VENV/bin/python" -m pip install --upgrade pip >"$log" 2>&1 || true
    if ! "$VENV/bin/python" -m pip install -e "$target" >>"$log" 2>&1; then
      tail -n 40 "$log" >&2
      _die "$what failed (full log: $log)"
    fi
    _fingerprint > "$(_stamp "$extras")"
  fi
}

# run directly: set up and say how to use it; sourced: just define ensure_venv
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  case "${1:-test}" in
    test) ensure_venv test ;;
    demo) ensure_venv "" ;;
    *) _die "usage: ./scripts/bootstrap.sh [test|demo] (test: loopscope and its test extras, the default; demo: loopscope alone)" ;;
  esac
  _say "ready: $("$VENV/bin/python" --version) in $VENV (activate with: source .venv/bin/activate)"
fi
