#!/usr/bin/env bash
# The tests that touch spans, against the oldest opentelemetry-sdk loopscope supports (the
# lower bound of its requirement in pyproject.toml); the whole suite runs against the newest
# in .venv (scripts/test.sh). Sets up .venv-oldsdk if needed: loopscope, pytest, hypothesis,
# the two SDKs test_internal_errors drives, and the OpenTelemetry API, SDK and exporter at
# that version. pytest's exit code is this script's. Extra arguments go to pytest.
#
# On that SDK the span fast paths of loopscope/_otel_sdk.py are off (its probes find spans
# built otherwise), so these tests run the SDK's public path; LOOPSCOPE_EXPECT_SDK_FAST_PATH
# tells tests/recorder/test_spans.py so.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/bootstrap.sh

OLD="$ROOT/.venv-oldsdk"
TESTS=(
  tests/recorder tests/test_sdk_door.py tests/storage/test_writer_batches.py tests/storage/test_writer_losses.py
  tests/hardening/test_internal_errors.py tests/export/test_export.py
)

oldest() {  # the version in "opentelemetry-sdk>=X" of pyproject.toml's dependencies
  "$1" - "$ROOT/pyproject.toml" <<'PY'
import re, sys, tomllib
with open(sys.argv[1], "rb") as f:
    deps = tomllib.load(f)["project"]["dependencies"]
(version,) = [m.group(1) for d in deps if (m := re.fullmatch(r"opentelemetry-sdk>=([\d.]+)", d.replace(" ", "")))]
print(version)
PY
}

if [[ ! -x "$OLD/bin/python" ]] || ! _acceptable "$(_version_of "$OLD/bin/python")"; then
  python="$(_find_python)"
  _say "creating .venv-oldsdk with $python (Python $(_version_of "$python"))"
  rm -rf "$OLD"
  "$python" -m venv "$OLD" || _die "could not create $OLD with $python"
fi
version="$(oldest "$OLD/bin/python")" || _die "no opentelemetry-sdk>=X.Y in pyproject.toml's dependencies"
stamp="$OLD/.loopscope-installed"
fingerprint="$(cat "$ROOT/pyproject.toml" "${BASH_SOURCE[0]}" | cksum | cut -d' ' -f1)"
if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$fingerprint" ]]; then
  pins=("opentelemetry-api==$version.*" "opentelemetry-sdk==$version.*" "opentelemetry-exporter-otlp==$version.*")
  _say "installing loopscope with opentelemetry-sdk $version.* into .venv-oldsdk"
  export PIP_DISABLE_PIP_VERSION_CHECK=1
  log="$OLD/pip-install.log"
  if ! "$OLD/bin/python" -m pip install -e "$ROOT" pytest hypothesis "openai>=3" "anthropic>=2" "${pins[@]}" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    _die "installing into .venv-oldsdk failed (full log: $log)"
  fi
  echo "$fingerprint" > "$stamp"
fi
installed="$("$OLD/bin/python" -c 'from opentelemetry.sdk.version import __version__; print(__version__)')"
[[ "$installed" == "$version".* ]] || _die ".venv-oldsdk has opentelemetry-sdk $installed, not $version.*"
_say "the tests that touch spans, against opentelemetry-sdk $installed"
export LOOPSCOPE_EXPECT_SDK_FAST_PATH=0
exec "$OLD/bin/python" -m pytest -q -p no:cacheprovider "${TESTS[@]}" "$@"
