#!/usr/bin/env bash
# CI: the Debian packages the Docker executor's tests need: dockerd (docker.io), a statically
# linked busybox for the FROM-scratch test image (busybox-static) and debootstrap for the Python
# test image. Idempotent: installs only what is missing. The tests start and stop dockerd.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

missing=()
for pkg in docker.io busybox-static debootstrap; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
