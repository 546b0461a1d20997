#!/usr/bin/env bash
# Arize Phoenix, a real OTLP tracing backend, in .venv-phoenix (its own venv: its
# dependencies are not loopscope's), for tests/export/test_phoenix.py, which runs this
# script itself when the venv is missing or holds another version. Prints the path of the
# `phoenix` command; says how long the install took (a few minutes on a fresh machine).
#
#   scripts/phoenix.sh            # install if needed, print .venv-phoenix/bin/phoenix
#
# The version is pinned here (PHOENIX_VERSION): Phoenix's reading of the GenAI conventions
# is what the test checks, and it changes between releases.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/bootstrap.sh

PHOENIX_VERSION="20.26.1"
PX="${LOOPSCOPE_PHOENIX_VENV:-$ROOT/.venv-phoenix}"  # another folder: for trying the install beside a working one
stamp="$PX/.phoenix-installed"

if [[ -x "$PX/bin/phoenix" && -f "$stamp" && "$(cat "$stamp")" == "$PHOENIX_VERSION" ]]; then
  echo "$PX/bin/phoenix"
  exit 0
fi
python="$(_find_python)"
_say "installing arize-phoenix==$PHOENIX_VERSION into .venv-phoenix with $python (a few minutes)"
started=$SECONDS
rm -rf "$PX"
"$python" -m venv "$PX" || _die "could not create $PX with $python"
log="$PX/pip-install.log"
if ! PIP_DISABLE_PIP_VERSION_CHECK=1 "$PX/bin/python" -m pip install "arize-phoenix==$PHOENIX_VERSION" >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  _die "installing arize-phoenix failed (full log: $log)"
fi
echo "$PHOENIX_VERSION" > "$stamp"
_say "arize-phoenix $PHOENIX_VERSION installed in $((SECONDS - started))s"
echo "$PX/bin/phoenix"
