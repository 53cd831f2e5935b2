#!/usr/bin/env bash
# Make `node` (>= 18) and `npm` available for the Node.js client (client/node) and its tests.
# Debian's `nodejs` and `npm` packages; nothing is downloaded outside the package manager.
# Idempotent and quiet: does nothing when both are already on PATH. Needs root for apt.
set -euo pipefail
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install_node: node/npm missing and not root; run: sudo $0" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
# Quiet on success; on failure show apt's own words. Debian packages npm separately
# (NodeSource's nodejs bundles it, hence the check for both above).
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends nodejs npm; } \
    >"$log" 2>&1; then
  cat "$log" >&2
  exit 1
fi
major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$major" -lt 18 ]; then
  echo "install_node: node $(node --version) is too old; the client needs >= 18" >&2
  exit 1
fi
echo "install_node: node $(node --version), npm $(npm --version)"
