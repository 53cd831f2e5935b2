#!/usr/bin/env bash
# Make `promtool` available for tests/deploy (rules checks and rule unit tests).
# Debian's `prometheus` package ships it; nothing is downloaded outside the package manager.
# Idempotent and quiet: does nothing when promtool is already on PATH. Needs root for apt.
set -euo pipefail
if command -v promtool >/dev/null 2>&1; then
  exit 0
fi
"$(dirname "$0")/apt_install.sh" install_promtool prometheus
command -v promtool >/dev/null
echo "install_promtool: $(promtool --version 2>&1 | head -n 1)"
