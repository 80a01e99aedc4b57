#!/usr/bin/env bash
# Installs the published npm SDK `sandbox-agent` 0.4.2 and `ws` (its terminal WebSocket on Node 20),
# pinned in tests/processes-compat/package.json and package-lock.json, for
# `processes::published_npm_sdk_drives_the_process_api`. Optional dependencies (the reference
# daemon's platform binaries) are left out: the test drives our daemon.
# Also bash and coreutils' stty/tty, which the terminal tests run. Idempotent; node_modules is
# gitignored.
set -euo pipefail
for tool in bash stty tty setsid; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq bash coreutils util-linux >/dev/null
    break
  fi
done
cd "$(dirname "$0")/../tests/processes-compat"
if [ ! -d node_modules/sandbox-agent ] || [ ! -d node_modules/ws ]; then
  npm ci --omit=optional --no-audit --no-fund --loglevel=error
fi
