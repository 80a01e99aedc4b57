#!/usr/bin/env bash
# Installs the published npm client of /v1/acp (acp-http-client 0.4.2, pinned in
# tests/compat/package.json and package-lock.json) for the compatibility test
# `acp::npm_acp_http_client_drives_the_mock_agent`. Idempotent and quiet; node_modules is gitignored.
set -euo pipefail
cd "$(dirname "$0")/../tests/compat"
if [ ! -d node_modules/acp-http-client ]; then
  npm ci --no-audit --no-fund --loglevel=error
fi
