#!/usr/bin/env bash
# Installs what the TypeScript SDK's tests need (tests/it/sdk.rs runs `npm test` in
# sdks/typescript): the workspace's npm packages, pinned by its package-lock.json (npm ci), and
# Debian's Chromium for the headless-browser test (driven by playwright-core, which never
# downloads a browser of its own). Idempotent and quiet; node_modules is gitignored.
set -euo pipefail
cd "$(dirname "$0")/../sdks/typescript"

if ! command -v chromium >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq chromium >/dev/null
fi

# Re-install when the lockfile changed since the last install (a stamp beside node_modules' content).
stamp=node_modules/.install-sdk-lock.sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error
  echo "$want" >"$stamp"
fi
