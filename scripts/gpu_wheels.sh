#!/usr/bin/env bash
# Run HERE (a machine that reaches PyPI), before scripts/gpu.sh is sent to a lent GPU machine:
# fetches into .whl/ (git-ignored) the wheels that machine lacks (the health and reflection
# services, orjson, OpenTelemetry) or has at an older version than our generated code demands
# (grpcio >= the gencode's 1.85.1, protobuf >= 7.35.1), at requirements.txt's pins. The GPU
# machine's image (CPython 3.12, x86-64) holds torch, numpy, safetensors, tiktoken, tokenizers,
# aiohttp, prometheus-client, pytest and its plugins, and reaches no registry.
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER="${GPU_PYTHON_VERSION:-3.12}"
pin() { grep -E "^$1==" requirements.txt | head -1; }
# Not in requirements.txt: opentelemetry-sdk pins it exactly (1.45.2 -> 0.66b2).
SEMCONV="opentelemetry-semantic-conventions==0.66b2"
mkdir -p .whl
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version "$PYVER" \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  "$(pin grpcio)" "$(pin protobuf)" "$(pin grpcio-health-checking)" "$(pin grpcio-reflection)" \
  "$(pin orjson)" "$(pin opentelemetry-api)" "$(pin opentelemetry-sdk)" "$SEMCONV"
ls -l .whl
echo "now: run(command='scripts/gpu.sh', carry=['.whl', 'service/format/assets'], timeout_s=480)"
