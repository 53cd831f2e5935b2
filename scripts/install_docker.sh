#!/usr/bin/env bash
# Make a Docker engine available for `make image-test` (scripts/image_test.sh): Debian's
# `docker.io` (dockerd, containerd, runc) and `debootstrap` (the stand-in base image), from the
# package manager only. Idempotent and quiet: does nothing when both are already installed.
# Needs root for apt. Starting the engine is scripts/image_test.sh's job, not this script's.
set -euo pipefail
if command -v dockerd >/dev/null 2>&1 && command -v debootstrap >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install_docker: dockerd/debootstrap missing and not root; run: sudo $0" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
# Quiet on success; on failure show apt's own words. --no-install-recommends: no docker
# compose/buildx extras, no man pages' dependencies.
if ! { apt-get update -qq \
       && apt-get install -y -qq --no-install-recommends docker.io debootstrap; } \
    >"$log" 2>&1; then
  cat "$log" >&2
  exit 1
fi
command -v dockerd >/dev/null
echo "install_docker: $(dockerd --version), debootstrap $(dpkg-query -W -f='${Version}' debootstrap)"
