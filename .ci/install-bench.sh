#!/usr/bin/env bash
# What the A/B bench step of .ci/run (benches/ab.sh) measures against: nginx serves the GET
# reference of benches/files.rs (`nginx-light` is enough: static files with sendfile). dd and tar
# come with every Debian. No service is started (the bench runs its own nginx, unprivileged port).
# Idempotent: installs only when missing.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends nginx-light >/dev/null
fi
# benches/workspace_grep.sh compares the daemon's grep with ripgrep's `rg`.
if ! command -v rg >/dev/null 2>&1; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends ripgrep >/dev/null
fi
