#!/usr/bin/env bash
# CI: Debian's Prometheus server for the /metrics test (tests/test_metrics.py starts it in the
# foreground on 127.0.0.1 with a config of its own, scraping the daemon's app, and stops it).
# Idempotent: installs only what is missing; the package's own service is not started or used.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

if ! command -v prometheus >/dev/null 2>&1; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
prometheus --version 2>&1 | head -1
