#!/usr/bin/env bash
# Installs the published npm client of /v1/acp (acp-http-client, pinned in tests/compat/package.json)
# for the compatibility test. Idempotent and quiet; node_modules is gitignored.
set -euo pipefail
cd "$(dirname "$0")/../tests/compat"
if [ ! -d node_modules/acp-http-client ]; then
  npm install --no-audit --no-fund --loglevel=error
fi
