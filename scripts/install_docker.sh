#!/usr/bin/env bash
# Make a Docker engine available for `make image-test` (scripts/image_test.sh): Debian's
# `docker.io` (dockerd, containerd, runc) and `debootstrap` (the stand-in base image), from the
# package manager only. Idempotent and quiet: does nothing when both are already installed.
# Needs root for apt. Starting the engine is scripts/image_test.sh's job, not this script's.
set -euo pipefail
if command -v dockerd >/dev/null 2>&1 && command -v debootstrap >/dev/null 2>&1; then
  exit 0
fi
"$(dirname "$0")/apt_install.sh" install_docker docker.io debootstrap
command -v dockerd >/dev/null
echo "install_docker: $(dockerd --version), debootstrap $(dpkg-query -W -f='${Version}' debootstrap)"
