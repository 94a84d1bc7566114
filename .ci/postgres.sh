#!/usr/bin/env bash
# CI: Debian's PostgreSQL server for the store's tests (tests/postgres_service.py runs initdb and
# pg_ctl as the postgres user in a folder of its own, on 127.0.0.1, and stops it). Idempotent:
# installs only what is missing; the package's own cluster is not started or used.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends postgresql >/dev/null
fi
