#!/usr/bin/env bash
# Create or refresh .venv with everything the service, the training job and the tests need.
# Idempotent: a stamp of the requirement files' hash skips pip when nothing changed.
# Usage: scripts/setup.sh [runtime|dev]   (default: dev)
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${1:-dev}"
req="requirements.txt"
[ "$profile" = "dev" ] && req="requirements-dev.txt"
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
stamp=".venv/.stamp-$profile"
want="$(cat requirements.txt "$req" scripts/setup.sh | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing $req into .venv (torch pinned to the CPU build)"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip >/dev/null
  # torch is pinned inside the requirement file, in the same pip command, so pip never
  # resolves an unpinned torch to the multi-GB CUDA build.
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -r "$req"
  if [ "$profile" = "dev" ]; then
    # The real Triton client, for the OIP interop tests. --no-deps: its [grpc] extra pins
    # protobuf<7 although its generated code runs on our protobuf 7 (its deps are pinned
    # in requirements-dev.txt).
    .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps \
      tritonclient==2.73.0
  fi
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
  echo "$want" > "$stamp"
fi
.venv/bin/python scripts/fetch_tokenizer.py
