#!/usr/bin/env bash
# Make a headless browser and curl available for tests/service/rpc/http (the page in a real browser,
# the curl commands of docs/interop.md). Debian's chromium + chromium-driver: Selenium is
# pointed at /usr/bin/chromium and /usr/bin/chromedriver and never downloads a browser.
# Idempotent and quiet: does nothing when all three are there. Needs root for apt.
set -euo pipefail
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ] && command -v curl >/dev/null 2>&1; then
  exit 0
fi
"$(dirname "$0")/apt_install.sh" install_chromium chromium chromium-driver curl
echo "install_chromium: $(/usr/bin/chromium --version 2>/dev/null | head -n 1)"
