#!/usr/bin/env bash
# Run HERE (a machine that reaches PyPI), before scripts/gpu.sh is sent to a lent GPU machine:
# fetches into .whl/ (git-ignored) the wheels that machine lacks or has at an older version
# than our generated code demands (grpcio >= the gencode's 1.85.1, protobuf >= 7.35.1).
# The GPU machine's image runs CPython 3.12 on x86-64 and reaches no registry.
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER="${GPU_PYTHON_VERSION:-3.12}"
pin() { grep -E "^$1==" requirements.txt | head -1; }
mkdir -p .whl
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYVER" \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  "$(pin grpcio)" "$(pin protobuf)" "$(pin grpcio-health-checking)" "$(pin grpcio-reflection)"
ls -l .whl
echo "now: run(command='scripts/gpu.sh', carry=['.whl', 'service/format/assets'], timeout_s=420)"
