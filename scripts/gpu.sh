#!/usr/bin/env bash
# GPU check for a lent machine, in under 5 minutes: the test suite with the tables on the GPU,
# then the benchmark with the service on the GPU. Results go to $OUT (flat: at most 8 files).
#
#   here, once:  scripts/gpu_wheels.sh          (grpcio/protobuf wheels for the GPU image -> .whl/)
#   there:       run(command="scripts/gpu.sh", carry=[".whl", "service/format/assets"], timeout_s=420)
#   dry run:     DEVICE=cpu PYTHON=.venv/bin/python QUICK=1 SKIP_WHEELS=1 scripts/gpu.sh
#
# Env: DEVICE (cuda), PYTHON (python3 with torch), OUT (bench/results/gpu), QUICK=1 (smoke
# sizes), SKIP_WHEELS=1 (use PYTHON's own packages), TEST_TIMEOUT / BENCH_TIMEOUT (seconds per stage). A failing stage does not stop the
# next one; the exit status is non-zero if any stage failed.
set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE="${DEVICE:-cuda}"
OUT="${OUT:-bench/results/gpu}"
TEST_TIMEOUT="${TEST_TIMEOUT:-150}"
BENCH_TIMEOUT="${BENCH_TIMEOUT:-170}"
WORK="$(mktemp -d /tmp/embed-gpu.XXXXXX)"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 EMBED_TEST_DEVICE="$DEVICE"
say() { echo "gpu.sh: $*" | tee -a "$OUT/gpu_env.txt"; }

# The image's python3 holds the CUDA torch; .venv (made on a CPU machine) would not see a GPU.
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  for c in python3 .venv/bin/python; do
    if command -v "$c" >/dev/null && "$c" -c "import torch" 2>/dev/null; then PY="$c"; break; fi
  done
fi
[ -n "$PY" ] || { say "no python with torch found"; exit 2; }

# Nothing can be fetched on the GPU machine: install the wheels carried in .whl/, if any.
if [ -z "${SKIP_WHEELS:-}" ] && compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$WORK/site" .whl/*.whl || { say "installing .whl/ failed"; exit 2; }
  export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
fi
# The repo itself, without `pip install -e` (which would need setuptools and a writable env).
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

say "device=$DEVICE python=$PY ($("$PY" --version 2>&1))"
"$PY" - "$DEVICE" >>"$OUT/gpu_env.txt" 2>&1 <<'PYEOF'
import importlib, sys
device = sys.argv[1]
missing = []
for name in ("torch", "numpy", "grpc", "grpc_health.v1", "grpc_reflection.v1alpha",
             "google.protobuf", "safetensors", "tiktoken", "prometheus_client", "pytest", "genproto.embedding.v1.embedding_pb2_grpc", "service.server"):
    try:
        mod = importlib.import_module(name)
        print(f"{name}: {getattr(mod, '__version__', 'ok')}")
    except Exception as e:  # a missing or too-old package: say which, then stop
        missing.append(f"{name} ({type(e).__name__}: {e})")
try:  # optional (the bench extra): without it the bench writes no bench.png
    import matplotlib
    print(f"matplotlib: {matplotlib.__version__}")
except ImportError:
    print("matplotlib: not installed (no bench.png)")
import torch
print("cuda available:", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
if device.startswith("cuda") and not torch.cuda.is_available():
    missing.append("a CUDA device for torch")
if missing:
    sys.exit("missing: " + "; ".join(missing))
PYEOF
[ $? -eq 0 ] || { cat "$OUT/gpu_env.txt"; say "preflight failed"; exit 2; }
[ -f service/format/assets/gpt2.tiktoken ] || say "service/format/assets/gpt2.tiktoken missing: carry it (tests need it)"

status=0
# 1. Tests, tables on $DEVICE (tests/conftest.py reads EMBED_TEST_DEVICE).
xdist=()
"$PY" -c "import xdist" 2>/dev/null && [ -z "${QUICK:-}" ] && xdist=(-n 8 --dist loadfile)
# The serving path with the tables on the device (native, OIP, shared memory, batching,
# status codes), not the whole suite: the node client, tritonclient, the k8s validators and
# hypothesis are not on the GPU image, and nothing in them touches the device.
tests=(tests/service/test_embed.py tests/service/test_batcher.py tests/service/test_shm.py
       tests/service/test_status_codes.py tests/service/test_lifecycle.py
       tests/oip/test_oip_native.py tests/bench)
[ -n "${QUICK:-}" ] && tests=(tests/bench tests/service/test_shm.py)
say "tests: ${tests[*]} ${xdist[*]} (timeout ${TEST_TIMEOUT}s)"
timeout "$TEST_TIMEOUT" "$PY" -m pytest -q -p no:cacheprovider "${xdist[@]}" "${tests[@]}" \
  >"$OUT/tests.log" 2>&1
rc=$?; tail -3 "$OUT/tests.log"; say "tests rc=$rc"; [ $rc -eq 0 ] || status=1

# 2. Benchmark, service on $DEVICE. Shorter cells than `make bench`: 16 cores, 5-minute budget.
bench=(--reps 3 --duration 0.5 --warmup 0.2)
[ -n "${QUICK:-}" ] && bench=(--quick)
say "bench: ${bench[*]} --device $DEVICE (timeout ${BENCH_TIMEOUT}s)"
timeout "$BENCH_TIMEOUT" "$PY" -m bench "${bench[@]}" --device "$DEVICE" --out "$WORK/bench" \
  --model-cache "$WORK/model" >"$OUT/bench.txt" 2>&1
rc=$?; cat "$OUT/bench.txt"; say "bench rc=$rc"; [ $rc -eq 0 ] || status=1
for f in bench.json bench.png logs/service.log; do
  [ -f "$WORK/bench/$f" ] && cp "$WORK/bench/$f" "$OUT/$(basename "$f")"
done
rm -rf "$WORK"
exit $status
