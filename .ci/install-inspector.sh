#!/usr/bin/env bash
# What the inspector's tests (tests/it/inspector.rs) need: Debian's Chromium (the browser the
# end-to-end run drives; a test never downloads its own) and the pinned npm packages of ui/
# (esbuild to rebuild the bundle, typescript to typecheck, playwright-core to drive Chromium).
# Idempotent and quiet; node_modules is gitignored.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

# Node.js >= 20 and npm come from .ci/install-00-base.sh, which runs first.
command -v npm >/dev/null 2>&1 || { echo "install-inspector: npm is missing (see .ci/install-00-base.sh)" >&2; exit 1; }
if [ ! -x /usr/bin/chromium ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi

cd "$(dirname "$0")/../ui"
if [ ! -d node_modules/playwright-core ] || [ ! -d node_modules/esbuild ] || [ ! -d node_modules/typescript ] \
  || [ ! -d node_modules/@agentclientprotocol/sdk ]; then
  # playwright-core has no browser download step; esbuild's platform binary comes as an
  # optional dependency, so no install script is needed.
  PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error
fi
