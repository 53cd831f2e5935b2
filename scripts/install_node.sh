#!/usr/bin/env bash
# Make `node` (>= 18) and `npm` available for the Node.js client (client/node) and its tests.
# Debian's `nodejs` and `npm` packages; nothing is downloaded outside the package manager.
# Idempotent and quiet: does nothing when both are already on PATH. Needs root for apt.
set -euo pipefail
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
  exit 0
fi
"$(dirname "$0")/apt_install.sh" install_node nodejs npm
major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$major" -lt 18 ]; then
  echo "install_node: node $(node --version) is too old; the client needs >= 18" >&2
  exit 1
fi
echo "install_node: node $(node --version), npm $(npm --version)"
