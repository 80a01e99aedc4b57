#!/usr/bin/env bash
# Installs what the OpenCode bridge's tests need (tests/it/opencode.rs): OpenCode's published
# clients in tests/opencode — @opencode-ai/sdk 1.1.x and 1.19.x and the `opencode` CLI
# (opencode-ai, whose platform binary comes as an optional dependency) — pinned by its
# package-lock.json (npm ci). Node and npm come from install-00-base.sh. Idempotent and quiet;
# node_modules is gitignored.
set -euo pipefail
cd "$(dirname "$0")/../tests/opencode"

# Re-install when the lockfile changed since the last install (a stamp beside node_modules' content).
stamp=node_modules/.install-opencode-lock.sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  npm ci --no-audit --no-fund --loglevel=error
  echo "$want" >"$stamp"
fi
