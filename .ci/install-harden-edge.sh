#!/usr/bin/env bash
# Tools the edge tests (tests/it/edge.rs) need: `prlimit` (run the daemon with few descriptors)
# and `setpriv` (run the daemon and a reader as another user), both from util-linux. Idempotent
# and quiet; installs only what is missing.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
if ! command -v prlimit >/dev/null 2>&1 || ! command -v setpriv >/dev/null 2>&1; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends util-linux >/dev/null
fi
