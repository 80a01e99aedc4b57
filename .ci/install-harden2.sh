#!/usr/bin/env bash
# Tools the reused-process-group tests (tests/it/supervisor.rs, `…stranger…`) need: `unshare`
# and `nsenter` (util-linux) to run the daemon in its own PID namespace and steer pid reuse
# there, and procps's `/bin/kill` to send the negative control's `killpg` (dash's builtin takes
# no negative pid). Idempotent and quiet; installs only what is missing.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
missing=()
command -v unshare >/dev/null 2>&1 && command -v nsenter >/dev/null 2>&1 || missing+=(util-linux)
[ -x /bin/kill ] || missing+=(procps)
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
