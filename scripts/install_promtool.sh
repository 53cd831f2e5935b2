#!/usr/bin/env bash
# Make `promtool` available for tests/deploy (rules checks and rule unit tests).
# Debian's `prometheus` package ships it; nothing is downloaded outside the package manager.
# Idempotent and quiet: does nothing when promtool is already on PATH. Needs root for apt.
set -euo pipefail
if command -v promtool >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install_promtool: promtool missing and not root; run: sudo $0" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
# Quiet on success; on failure show apt's own words.
# --no-install-recommends: promtool needs only the package itself, not its web-UI extras.
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus; } \
    >"$log" 2>&1; then
  cat "$log" >&2
  exit 1
fi
command -v promtool >/dev/null
echo "install_promtool: $(promtool --version 2>&1 | head -n 1)"
