#!/usr/bin/env bash
# Install Debian packages for a test tool, quietly: `scripts/apt_install.sh WHO PACKAGE...`.
# The install_*.sh scripts check first whether their tool is there and call this only when it
# is not. Needs root; on failure it shows apt's own words. --no-install-recommends: the tools
# need only their packages, never a web UI, docs or compose/buildx extras.
set -euo pipefail
who="$1"
shift
if [ "$(id -u)" -ne 0 ]; then
  echo "$who: $* missing and not root; run as root: $0 $who $*" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "$@"; } \
    >"$log" 2>&1; then
  cat "$log" >&2
  exit 1
fi
