#!/usr/bin/env bash
# Create or refresh .venv. Profiles:
#   runtime  requirements.txt: the server and the training job (`make run`, the images);
#            no progress bars or plots (training prints plain-text progress and skips plots)
#   dev      requirements-dev.txt: runtime + requirements-train.txt (tqdm, matplotlib) +
#            tests, lint, type checks, proto tools, the Triton client
# Idempotent: a stamp of the requirement files' hash skips pip when nothing changed.
# Usage: scripts/setup.sh [runtime|dev]   (default: dev)
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${1:-dev}"
case "$profile" in
  runtime) req="requirements.txt" ;;
  dev) req="requirements-dev.txt" ;;
  *) echo "setup: unknown profile '$profile' (runtime|dev)" >&2; exit 2 ;;
esac
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $($PY --version)"
  "$PY" -m venv .venv
fi
stamp=".venv/.stamp-$profile"
# Every requirement file: dev's reaches requirements.txt through requirements-train.txt.
want="$(cat requirements*.txt scripts/setup.sh | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing $req into .venv (torch pinned to the CPU build)"
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip >/dev/null
  # torch is pinned inside requirements.txt, which every profile's file includes (-r), so it
  # is in the same pip command and pip never resolves an unpinned torch to the CUDA build.
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
# The one-pass CPU lookup (service/engine/lookup.c): built now where a C compiler is; the
# server builds it on first use otherwise, and serves torch's path where it cannot.
if command -v cc >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1; then
  # (-c, not -m: the package imports the module first, and runpy would warn about it)
  .venv/bin/python -c "from service.engine.kernel import build; build()"
fi
