#!/usr/bin/env bash
# CI: Debian's chromium for the web dashboard's browser tests (tests/test_web_browser.py drives
# it with Playwright at /usr/bin/chromium; `playwright install` cannot download browsers here).
# Idempotent: installs only when it is missing.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

if ! command -v chromium >/dev/null 2>&1; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
chromium --version 2>&1 | head -1
