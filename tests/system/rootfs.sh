#!/usr/bin/env bash
# Builds (once per target dir) a minimal Debian bookworm tree with systemd, used both as the
# machine booted by systemd-nspawn and as the base image imported into podman. Usage:
# rootfs.sh ROOT. The tree is complete only when ROOT/.complete exists; a half-built one is redone.
set -euo pipefail
root=${1:?usage: rootfs.sh ROOT}
# What the tree holds; a tree made by an older version of this script is made again.
stamp="bookworm minbase systemd procps curl ca-certificates"
if [ "$(cat "$root/.complete" 2>/dev/null)" = "$stamp" ]; then
  exit 0
fi
mkdir -p "$(dirname "$root")"
# One build at a time: the packaging and the provider tests may ask for it at once.
exec 9>"$root.lock"
flock 9
if [ "$(cat "$root/.complete" 2>/dev/null)" = "$stamp" ]; then
  exit 0
fi
rm -rf "$root"
mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
mirror=${mirror:-http://deb.debian.org/debian}
# procps for pgrep/ps inside, curl to talk HTTP inside the machine's private network,
# ca-certificates so that the image built on this tree needs no network for them (docker/Dockerfile).
timeout 600 debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus,procps,curl,ca-certificates \
  bookworm "$root" "$mirror" >"$root.log" 2>&1 || { tail -20 "$root.log" >&2; exit 1; }
echo "$stamp" >"$root/.complete"
