#!/usr/bin/env bash
# Install the Node.js client's dependencies into client/node/node_modules, exactly as
# client/node/package-lock.json pins them (`npm ci`). Run by `make setup`.
# Idempotent: a stamp of the package files' hash skips npm when nothing changed, so a
# repeated `make test` needs no network. Without node/npm: as root, installs them
# (scripts/install_node.sh); otherwise warns and leaves tests/client/test_node_client.py to
# fail with the same advice (the rest of the setup still works).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup_node: node/npm missing; run: sudo scripts/install_node.sh" \
         "(the Node.js client tests fail until then)" >&2
    exit 0
  fi
  scripts/install_node.sh
fi
dir=client/node
stamp="$dir/node_modules/.stamp-lock"
want="$(cat "$dir/package.json" "$dir/package-lock.json" | sha256sum | cut -c1-16)"
# The packages themselves are checked too: a hand-deleted one is reinstalled.
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
    && [ -f "$dir/node_modules/@grpc/grpc-js/package.json" ] \
    && [ -f "$dir/node_modules/@grpc/proto-loader/package.json" ]; then
  exit 0
fi
echo "setup_node: npm ci in $dir (versions from package-lock.json)"
# --ignore-scripts: no package code runs at install (the only script in the tree,
# protobufjs's postinstall, checks its optional CLI's deps, which the client never uses).
# --prefer-offline: take what npm's cache already holds before asking the registry.
(cd "$dir" && npm ci --ignore-scripts --no-audit --no-fund --prefer-offline --loglevel=error)
echo "$want" > "$stamp"
