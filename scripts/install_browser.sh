#!/usr/bin/env bash
# Installs Debian's headless browser for the dashboard test (tests/api/test_e2e_dashboard.py):
# chromium and the matching chromium-driver, from the distribution (no browser download).
# Idempotent: does nothing when both are on PATH. Needs root and apt-get.
set -euo pipefail
if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  exit 0
fi
if ! command -v apt-get >/dev/null || [ "$(id -u)" != 0 ]; then
  echo "install_browser.sh: needs root and apt-get (apt-get install chromium chromium-driver)" >&2
  exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
chromium --version && chromedriver --version
