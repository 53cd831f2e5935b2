#!/usr/bin/env bash
# `make image-test`: build the CPU image from the real deploy/docker/Dockerfile out of a clean
# clone (committed files only), run it as docs/deploy.md says over a model repository written
# by another user, and check what it serves (tests/deploy/image_check.py); then build
# Dockerfile.cuda the same way and check its contents (no GPU here to serve from).
#
# Stand-ins, each used only when the real thing cannot be reached:
#   - base image: python:3.11-slim is pulled if a registry answers; otherwise a base made from
#     Debian bookworm packages (debootstrap --variant=minbase with python3, python3-venv,
#     python3-pip, ca-certificates; then `docker import`) is passed as PYTHON_IMAGE, with this
#     machine's CA bundle and site pip configuration (/etc/pip.conf) copied in;
#   - PyTorch's CPU index: used if it answers; otherwise the CPU torch wheel from the wheel
#     directory pip's configuration here names (find-links) is served on 127.0.0.1 as a
#     one-package index and passed as TORCH_INDEX_URL, the Dockerfile's own argument for it.
#
# The engine: scripts/install_docker.sh (Debian's docker.io, as root), then dockerd is started
# if none runs (default options; else --iptables=false --bridge=none; else also the vfs
# storage driver). Builds and containers use the host network. Prints "SKIPPED: <reason>" and
# exits 0 only when no Docker engine can run at all. Everything it made (containers, images,
# the dockerd it started, temp dirs) is removed on exit; IMAGE_TEST_KEEP_BASE=1 keeps the
# stand-in base for the next run. IMAGE_TEST_CUDA=0 leaves out the CUDA image (~6 GB);
# IMAGE_TEST_SCENARIO=0 leaves out the Kubernetes scenario (tests/deploy/k8s_scenario.py).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
PY="${PY:-$ROOT/.venv/bin/python}"
RUN_ID="embed-image-test-$$"
LABEL="embed-image-test=$RUN_ID"
CUDA="${IMAGE_TEST_CUDA:-1}"
T0=$(date +%s)
WORK="$(mktemp -d /tmp/embed-image-test.XXXXXX)"
STARTED_DOCKERD=""
INDEX_PID=""
STANDIN=""

step() { printf '\n== [%4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }
skip() { echo "SKIPPED: $*"; exit 0; }
engine_up() { timeout 20 docker info >/dev/null 2>&1; }

cleanup() {
  local rc=$?
  set +e
  if engine_up; then
    ids="$(docker ps -aq --filter "label=$LABEL")"
    [ -n "$ids" ] && docker rm -f $ids >/dev/null
    ids="$(docker images -q --filter "label=$LABEL" | sort -u)"
    [ -n "$ids" ] && docker rmi -f $ids >/dev/null
    if [ -n "$STANDIN" ] && [ "${IMAGE_TEST_KEEP_BASE:-0}" != 1 ]; then
      docker rmi -f "$STANDIN" >/dev/null 2>&1
    fi
    docker image prune -f --filter "label=$LABEL" >/dev/null 2>&1
  fi
  [ -n "$INDEX_PID" ] && kill "$INDEX_PID" 2>/dev/null
  if [ -n "$STARTED_DOCKERD" ]; then
    kill "$STARTED_DOCKERD" 2>/dev/null
    for _ in $(seq 30); do kill -0 "$STARTED_DOCKERD" 2>/dev/null || break; sleep 1; done
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT

# --- the engine --------------------------------------------------------------------------
step "Docker engine"
if [ "$(id -u)" -eq 0 ]; then
  scripts/install_docker.sh
fi
command -v docker >/dev/null || skip "no docker command, and not root to install docker.io"
if ! engine_up; then
  if [ "$(id -u)" -ne 0 ] || ! command -v dockerd >/dev/null; then
    skip "no Docker engine runs and this user cannot start dockerd (needs root)"
  fi
  reasons=""
  for opts in "" "--iptables=false --bridge=none" \
              "--iptables=false --bridge=none --storage-driver=vfs"; do
    log="$WORK/dockerd${opts:+-$(echo "$opts" | tr -dc 'a-z')}.log"
    echo "starting dockerd ${opts:-(default options)}; log $log"
    # Niced: the image build runs under the daemon, and this machine is shared. Every
    # inherited descriptor above 2 is closed first: run under `flock LOCK make image-test`,
    # a dockerd that kept the lock's descriptor would hold the lock for as long as it lives.
    # shellcheck disable=SC2086
    ( for fd in $(ls /proc/self/fd); do
        [ "$fd" -gt 2 ] && eval "exec $fd>&-"
      done 2>/dev/null
      exec nice -n 10 dockerd --host unix:///var/run/docker.sock $opts ) >"$log" 2>&1 &
    pid=$!
    for _ in $(seq 60); do engine_up && break; kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    if engine_up; then STARTED_DOCKERD="$pid"; break; fi
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true
    reasons="$reasons [dockerd ${opts:-default}: $(grep -iE 'level=(fatal|error)|failed' "$log" | tail -n 1 | cut -c1-200)]"
  done
  [ -n "$STARTED_DOCKERD" ] || skip "no Docker engine could start:$reasons"
fi
docker version --format 'engine {{.Server.Version}}, client {{.Client.Version}}'
docker info --format 'storage driver {{.Driver}}, cgroup {{.CgroupVersion}}'

# --- the base image ----------------------------------------------------------------------
step "base image"
BASE="$(sed -n 's/^ARG PYTHON_IMAGE=//p' deploy/docker/Dockerfile)"
if docker image inspect "$BASE" >/dev/null 2>&1 || timeout 120 docker pull -q "$BASE" >"$WORK/pull.log" 2>&1; then
  echo "using $BASE"
else
  echo "cannot pull $BASE ($(tail -n 1 "$WORK/pull.log" | cut -c1-160)): stand-in from Debian bookworm packages"
  [ "$(id -u)" -eq 0 ] || skip "no base image: $BASE cannot be pulled and debootstrap needs root"
  PACKAGES="python3,python3-venv,python3-pip,ca-certificates"
  CA=/etc/ssl/certs/ca-certificates.crt
  key="$( { echo "$PACKAGES"; sha256sum "$CA"; cat /etc/pip.conf 2>/dev/null; } | sha256sum | cut -c1-12)"
  STANDIN="embed-standin-python:3.11-bookworm-$key"
  if docker image inspect "$STANDIN" >/dev/null 2>&1; then
    echo "reusing $STANDIN"
  else
    ts=$(date +%s)
    rootfs="$WORK/rootfs"
    if ! nice -n 10 debootstrap --variant=minbase --include="$PACKAGES" bookworm "$rootfs" \
        "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$WORK/debootstrap.log" 2>&1; then
      tail -n 20 "$WORK/debootstrap.log" >&2
      echo "debootstrap failed" >&2
      exit 1
    fi
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/tmp/*
    # This machine's CA bundle (its egress re-signs TLS) and site pip configuration. The
    # user-level pip configuration names this machine's wheel directory and file:// indexes,
    # which do not exist in the image: the torch wheel reaches the build as TORCH_INDEX_URL.
    cp "$CA" "$rootfs/etc/ssl/certs/ca-certificates.crt"
    if [ -f /etc/pip.conf ]; then cp /etc/pip.conf "$rootfs/etc/pip.conf"
    else printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$rootfs/etc/pip.conf"; fi
    tar -C "$rootfs" --numeric-owner -c . | docker import \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$STANDIN" >/dev/null
    rm -rf "$rootfs"
    echo "made $STANDIN in $(( $(date +%s) - ts )) s"
  fi
  BASE="$STANDIN"
fi
docker run --rm --network none "$BASE" python3 -c 'import sys; print("base python", sys.version.split()[0])'

# --- the CPU torch index -----------------------------------------------------------------
step "CPU torch index"
TORCH_INDEX="$(sed -n 's/^ARG TORCH_INDEX_URL=//p' deploy/docker/Dockerfile)"
TORCH_ARGS=()
if curl -sf --max-time 15 -o /dev/null "$TORCH_INDEX/torch/"; then
  echo "using $TORCH_INDEX"
else
  version="$(sed -n 's/^torch==\([0-9][0-9.]*\).*/\1/p' requirements.txt)"
  abi="$(docker run --rm --network none "$BASE" python3 -c 'import sys; print("cp%d%d" % sys.version_info[:2])')"
  dirs="$("$PY" -m pip config list 2>/dev/null | sed -n "s/^[^=]*find-links='\(.*\)'$/\1/p") ${PIP_FIND_LINKS:-}"
  wheel=""
  for d in $dirs; do
    d="${d#file://}"
    for f in "$d"/torch-"$version"+cpu-"$abi"-"$abi"-*linux*x86_64.whl; do
      [ -f "$f" ] && wheel="$f" && break 2
    done
  done
  if [ -z "$wheel" ]; then
    echo "$TORCH_INDEX cannot be reached and no torch-$version+cpu $abi wheel in pip's find-links ($dirs)" >&2
    exit 1
  fi
  mkdir -p "$WORK/index/torch"
  ln -s "$wheel" "$WORK/index/torch/$(basename "$wheel")"
  port="$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
  "$PY" -m http.server --bind 127.0.0.1 --directory "$WORK/index" "$port" >"$WORK/index.log" 2>&1 &
  INDEX_PID=$!
  for _ in $(seq 30); do curl -sf -o /dev/null "http://127.0.0.1:$port/torch/" && break; sleep 0.2; done
  TORCH_ARGS=(--build-arg "TORCH_INDEX_URL=http://127.0.0.1:$port/")
  echo "$TORCH_INDEX cannot be reached: serving $wheel as http://127.0.0.1:$port/torch/"
fi

# --- a clean clone -----------------------------------------------------------------------
step "clean clone"
SHA="$(git rev-parse HEAD)"
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  echo "note: uncommitted changes are NOT in the image (it is built from commit $SHA)"
fi
git clone --quiet --no-checkout "$ROOT" "$WORK/src"
git -C "$WORK/src" checkout --quiet --detach "$SHA"
echo "$(git -C "$WORK/src" log -1 --format='%h %s' | cut -c1-100)"

build() {  # build FILE TAG [build args...]: prints the build's own output, then the time
  local file="$1" tag="$2" ts
  shift 2
  ts=$(date +%s)
  # The classic builder: Debian's docker.io has no buildx plugin (BuildKit would need it).
  DOCKER_BUILDKIT=0 docker build --network host --pull=false --label "$LABEL" \
    -f "$file" -t "$tag" --build-arg "PYTHON_IMAGE=$BASE" "$@" "$WORK/src"
  BUILD_S=$(( $(date +%s) - ts ))
}

# --- the CPU image -----------------------------------------------------------------------
step "build deploy/docker/Dockerfile (CPU)"
CPU_IMAGE="embedding-service:image-test-cpu-$$"
build deploy/docker/Dockerfile "$CPU_IMAGE" "${TORCH_ARGS[@]}"
CPU_BUILD_S=$BUILD_S
CPU_SIZE="$(docker image inspect --format '{{.Size}}' "$CPU_IMAGE")"
echo "CPU image built in ${CPU_BUILD_S} s, size $(( CPU_SIZE / 1000000 )) MB"

step "run and check the CPU image"
status=0
"$PY" -m tests.deploy.image_check "$CPU_IMAGE" --label "$LABEL" --kind cpu \
  --figures "$WORK/cpu.json" || status=1

# The Kubernetes path from the rendered manifests: server replicas, the elastic training job
# (a worker killed mid-run), roll forward, rollback, the importer Job, the KServe runtime.
SCENARIO_LINE="k8s scenario: left out (IMAGE_TEST_SCENARIO=0)"
if [ "${IMAGE_TEST_SCENARIO:-1}" != 0 ]; then
  step "the Kubernetes manifests' pods on this engine (tests/deploy/k8s_scenario.py)"
  ts=$(date +%s)
  "$PY" -m tests.deploy.k8s_scenario "$CPU_IMAGE" --label "$LABEL" \
    --figures "$WORK/scenario.json" || status=1
  SCENARIO_LINE="k8s scenario: $(( $(date +%s) - ts )) s: $(cat "$WORK/scenario.json" 2>/dev/null || echo '{}')"
fi
docker rmi -f "$CPU_IMAGE" >/dev/null

# --- the CUDA image ----------------------------------------------------------------------
CUDA_LINE="CUDA image: left out (IMAGE_TEST_CUDA=0)"
if [ "$CUDA" != 0 ]; then
  step "build deploy/docker/Dockerfile.cuda (same base; torch's CUDA wheels from PyPI)"
  CUDA_IMAGE="embedding-service:image-test-cuda-$$"
  build deploy/docker/Dockerfile.cuda "$CUDA_IMAGE"
  CUDA_BUILD_S=$BUILD_S
  CUDA_SIZE="$(docker image inspect --format '{{.Size}}' "$CUDA_IMAGE")"
  echo "CUDA image built in ${CUDA_BUILD_S} s, size $(( CUDA_SIZE / 1000000 )) MB"
  step "check the CUDA image's contents (no GPU here: not served)"
  "$PY" -m tests.deploy.image_check "$CUDA_IMAGE" --label "$LABEL" --kind cuda || status=1
  docker rmi -f "$CUDA_IMAGE" >/dev/null
  CUDA_LINE="CUDA image: built in ${CUDA_BUILD_S} s, $(( CUDA_SIZE / 1000000 )) MB"
fi

step "summary"
echo "base: $BASE${STANDIN:+ (stand-in)}; torch index: ${TORCH_ARGS[*]:-$TORCH_INDEX}"
echo "CPU image: built in ${CPU_BUILD_S} s, $(( CPU_SIZE / 1000000 )) MB; run: $(cat "$WORK/cpu.json" 2>/dev/null || echo '{}')"
echo "$SCENARIO_LINE"
echo "$CUDA_LINE"
echo "image test total $(( $(date +%s) - T0 )) s: $([ "$status" = 0 ] && echo PASSED || echo FAILED)"
exit "$status"
