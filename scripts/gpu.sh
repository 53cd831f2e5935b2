#!/usr/bin/env bash
# GPU check for a lent machine, in about 7 minutes: the serving tests with the tables on the
# GPU, the benchmark with the service on the GPU, then the lookup's bandwidth against the
# GPU's own copy ceiling (bench.suites.gpu_gather). Results go to $OUT (flat: 8 files at most).
#
#   here, once:  scripts/gpu_wheels.sh          (grpcio/protobuf wheels for the GPU image -> .whl/)
#   there:       run(command="scripts/gpu.sh", carry=[".whl", "service/format/assets"], timeout_s=480)
#   then, warm:  run(command="STAGES=cpubench scripts/gpu.sh", carry=[...same], timeout_s=300)
#   CUDA shared memory (issue 39), a call of its own (3 files in $OUT):
#                run(command="STAGES=cuda scripts/gpu.sh", carry=[...same], timeout_s=480)
#   dry run:     DEVICE=cpu PYTHON=.venv/bin/python QUICK=1 SKIP_WHEELS=1 scripts/gpu.sh
#
# Env: DEVICE (cuda), PYTHON (python3 with torch), OUT (bench/results/gpu), QUICK=1 (smoke
# sizes), SKIP_WHEELS=1 (use PYTHON's own packages), STAGES (of "tests bench gather
# cpubench cuda"; the first three by default), BENCH_ARGS (more `python -m bench` flags, e.g.
# "--modes unary"), TEST_TIMEOUT / BENCH_TIMEOUT / GATHER_TIMEOUT / CUDA_TIMEOUT /
# CUDA_BENCH_TIMEOUT (seconds per stage). A failing stage does not stop the next one; the
# exit status is non-zero if any stage failed.
set -uo pipefail
cd "$(dirname "$0")/.."
DEVICE="${DEVICE:-cuda}"
OUT="${OUT:-bench/results/gpu}"
TEST_TIMEOUT="${TEST_TIMEOUT:-150}"
BENCH_TIMEOUT="${BENCH_TIMEOUT:-200}"
GATHER_TIMEOUT="${GATHER_TIMEOUT:-60}"
STAGES="${STAGES:-tests bench gather}"
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

# Nothing can be fetched on the GPU machine: install the wheels carried in .whl/, if any,
# into the interpreter's own environment (the machine is thrown away after), so that every
# child process sees them whatever PYTHONPATH it is given; where that environment is not
# writable, into a folder on PYTHONPATH instead.
if [ -z "${SKIP_WHEELS:-}" ] && compgen -G ".whl/*.whl" >/dev/null; then
  pipi=("$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade)
  if ! "${pipi[@]}" .whl/*.whl 2>>"$OUT/gpu_env.txt"; then
    "${pipi[@]}" --target "$WORK/site" .whl/*.whl || { say "installing .whl/ failed"; exit 2; }
    export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"
  fi
fi
# The repo itself, without `pip install -e` (which would need setuptools and a writable env).
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

say "device=$DEVICE python=$PY ($("$PY" --version 2>&1))"
"$PY" - "$DEVICE" >>"$OUT/gpu_env.txt" 2>&1 <<'PYEOF'
import importlib, sys
device = sys.argv[1]
missing = []
for name in ("torch", "numpy", "grpc", "grpc_health.v1", "grpc_reflection.v1alpha",
             "google.protobuf", "safetensors", "tiktoken", "prometheus_client", "pytest", "genproto.embedding.v1.embedding_pb2_grpc", "service.server",
             "service.rpc.http", "service.tracing", "orjson", "opentelemetry.sdk.trace"):
    try:
        mod = importlib.import_module(name)
        print(f"{name}: {getattr(mod, '__version__', 'ok')}")
    except Exception as e:  # a missing or too-old package: say which, then stop
        missing.append(f"{name} ({type(e).__name__}: {e})")
try:  # optional (the bench extra): without it the bench writes no serving.png
    import matplotlib
    print(f"matplotlib: {matplotlib.__version__}")
except ImportError:
    print("matplotlib: not installed (no serving.png)")
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
has() { [[ " $STAGES " == *" $1 "* ]]; }

# 1. Tests, tables on $DEVICE (tests/conftest.py reads EMBED_TEST_DEVICE).
if has tests; then
xdist=()
"$PY" -c "import xdist" 2>/dev/null && [ -z "${QUICK:-}" ] && xdist=(-n 8 --dist loadfile)
# The serving path with the tables on the device (native, OIP, shared memory, batching,
# status codes, shared tables, the bench's own checks), not the whole suite: the node
# client, tritonclient, selenium (the REST page's tests) and the k8s validators are not on
# the GPU image, and nothing in them touches the device.
tests=(tests/service/rpc tests/service/engine tests/service/test_lifecycle.py
       tests/service/format/test_shared_tables.py tests/service/engine/test_big_table.py
       tests/bench)
[ -n "${QUICK:-}" ] && tests=(tests/bench/test_bench_smoke.py tests/service/engine/test_shm.py)
for t in "${tests[@]}"; do [ -e "$t" ] || { say "test path $t is gone: fix the list"; exit 2; }; done
say "tests: ${tests[*]} ${xdist[*]} (timeout ${TEST_TIMEOUT}s)"
# tritonclient (the Triton client's own conformance driver) and promtool are not on the image.
# The CUDA shared-memory tests that start GPU servers of their own run in the cuda stage.
timeout "$TEST_TIMEOUT" "$PY" -m pytest -q -p no:cacheprovider "${xdist[@]}" "${tests[@]}" \
  --ignore tests/service/rpc/oip/test_oip_triton.py \
  --ignore tests/service/rpc/oip/test_oip_cuda_shm.py \
  --ignore tests/service/engine/test_cuda_shm_gpu.py \
  --ignore tests/bench/test_cuda_shm_bench.py \
  --deselect tests/service/test_lifecycle.py::test_promtool_accepts_metrics \
  >"$OUT/tests.log" 2>&1
rc=$?; tail -3 "$OUT/tests.log"; say "tests rc=$rc"; [ $rc -eq 0 ] || status=1
fi

# 2. Benchmark (the service on $1), its table into $OUT/$2.txt, JSON and plot beside it.
run_bench() {
  local bench=(--suites serving --reps 3 --duration 0.4 --warmup 0.15 ${BENCH_ARGS:-})
  [ -n "${QUICK:-}" ] && bench=(--suites serving --quick)
  say "bench: ${bench[*]} --device $1 (timeout ${BENCH_TIMEOUT}s)"
  timeout "$BENCH_TIMEOUT" "$PY" -m bench "${bench[@]}" --device "$1" --out "$WORK/$2" \
    --model-cache "$WORK/model" >"$OUT/$2.txt" 2>&1
  rc=$?; cat "$OUT/$2.txt"; say "bench $1 rc=$rc"; [ $rc -eq 0 ] || status=1
  for f in bench.json serving.png logs/service.log; do
    [ -f "$WORK/$2/$f" ] && cp "$WORK/$2/$f" "$OUT/$2.$(basename "${f#bench.}")"
  done
}
has bench && run_bench "$DEVICE" bench

# 3. The lookup's bandwidth on the device against its own copy ceiling (bench.suites.gpu_gather).
if has gather; then
gather=(--reps 20)
[ -n "${QUICK:-}" ] && gather=(--reps 2 --scale 64 --cases 1x64 2x64)
say "gather: ${gather[*]} --device $DEVICE (timeout ${GATHER_TIMEOUT}s)"
timeout "$GATHER_TIMEOUT" "$PY" -m bench.suites.gpu_gather "${gather[@]}" --device "$DEVICE" \
  --out "$OUT/gather.json" >"$OUT/gather.txt" 2>&1
rc=$?; cat "$OUT/gather.txt"; say "gather rc=$rc"; [ $rc -eq 0 ] || status=1
fi

# 4. (a second call, STAGES=cpubench) The same benchmark with the service on the CPU, on a
# machine with 16 cores: the CPU targets where client and servers do not share two cores.
has cpubench && run_bench cpu bench_cpu

# 5. (a call of its own, STAGES=cuda) CUDA shared-memory output: its tests on the device (a
# region of the test process filled by a GPU server in a child process, bit for bit the host
# path's bytes for every dtype x compose x family rule; tenancy, bounds, REST; the example),
# then bench.suites.cuda_shm's row: cuda vs host output at T=1024 fp32 c=16 (target >= 5x) and a
# 16 x 1024 batch into the region against the device's copy ceiling (target >= 0.5).
# Everything into cuda.txt, the figures into cuda_shm.json.
if has cuda; then
CUDA_TIMEOUT="${CUDA_TIMEOUT:-300}"
CUDA_BENCH_TIMEOUT="${CUDA_BENCH_TIMEOUT:-180}"
cuda_tests=(tests/service/engine/test_cuda_shm_gpu.py tests/service/engine/test_cuda_shm.py
            tests/service/engine/test_cuda_shm_families.py tests/service/engine/test_cuda_ipc.py
            tests/service/rpc/test_cuda_shm_native.py tests/bench/test_cuda_shm_bench.py)
[ -n "${QUICK:-}" ] && cuda_tests=(tests/service/engine/test_cuda_shm_gpu.py)
# Each needs a package the GPU image may lack; without it, say so rather than fail on import.
if "$PY" -c "import transformers" 2>/dev/null; then
  cuda_tests+=(tests/examples/test_cuda_inputs_embeds.py)
else
  say "cuda: tests/examples/test_cuda_inputs_embeds.py left out: no transformers on this image"
fi
if "$PY" -c "import tritonclient.grpc" 2>/dev/null; then
  cuda_tests+=(tests/service/rpc/oip/test_oip_cuda_shm.py)
else
  say "cuda: tests/service/rpc/oip/test_oip_cuda_shm.py left out: no tritonclient on this image"
fi
for t in "${cuda_tests[@]}"; do [ -e "$t" ] || { say "test path $t is gone: fix the list"; exit 2; }; done
say "cuda tests: ${cuda_tests[*]} (timeout ${CUDA_TIMEOUT}s)"
timeout "$CUDA_TIMEOUT" "$PY" -m pytest -q -p no:cacheprovider -rs "${cuda_tests[@]}" \
  >"$WORK/cuda_tests.log" 2>&1
rc=$?; tail -40 "$WORK/cuda_tests.log" >"$OUT/cuda.txt"; tail -3 "$WORK/cuda_tests.log"
say "cuda tests rc=$rc"; [ $rc -eq 0 ] || status=1
cuda_bench=()
[ -n "${QUICK:-}" ] && cuda_bench=(--tokens 64 --batch 2 --concurrency 2 --seconds 0.5 --reps 3)
say "cuda bench: ${cuda_bench[*]} (timeout ${CUDA_BENCH_TIMEOUT}s)"
timeout "$CUDA_BENCH_TIMEOUT" "$PY" -m bench.suites.cuda_shm "${cuda_bench[@]}" \
  --model-cache "$WORK/cuda_model" --out "$OUT/cuda_shm.json" >>"$OUT/cuda.txt" 2>&1
rc=$?; tail -12 "$OUT/cuda.txt"; say "cuda bench rc=$rc"; [ $rc -eq 0 ] || status=1
fi
rm -rf "$WORK"
exit $status
