#!/usr/bin/env bash
# Server entrypoint (also the container's). glibc's adaptive mmap threshold hands multi-MB
# response buffers back to the OS and page-faults them in again on every request; fixed
# thresholds keep them in the heap. One arena: a buffer built on the compute thread (a
# T=1024 JSON answer, 15 MB) came from that thread's own arena, whose heaps glibc unmaps
# once empty, and was faulted in again page by page on every answer. Must be set before
# the process starts.
set -euo pipefail
cd "$(dirname "$0")/.."
export GLIBC_TUNABLES="${GLIBC_TUNABLES:-glibc.malloc.mmap_threshold=268435456:glibc.malloc.trim_threshold=536870912:glibc.malloc.arena_max=1}"
exec "${PYTHON:-.venv/bin/python}" -m service "$@"
