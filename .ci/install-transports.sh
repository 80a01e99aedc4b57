#!/usr/bin/env bash
# Installs the official ACP clients for the transport interop tests (tests/it/transports.rs):
# the TypeScript SDK @agentclientprotocol/sdk 2.4.0 with `ws` (pinned in tests/transports/package.json
# and package-lock.json) and the Python SDK agent-client-protocol[http] 0.12.1 with its HTTP/WebSocket
# dependencies (pinned in tests/transports/requirements.txt). Idempotent and quiet; node_modules is
# gitignored.
set -euo pipefail
cd "$(dirname "$0")/../tests/transports"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null
fi
if [ ! -f node_modules/@agentclientprotocol/sdk/package.json ]; then
  npm ci --no-audit --no-fund --loglevel=error
fi
if ! command -v python3 >/dev/null; then
  apt-get update -qq && apt-get install -y -qq python3 python3-pip >/dev/null
fi
if ! python3 -c 'import acp.http.client, acp.ws.client' 2>/dev/null \
  || ! python3 -c 'import importlib.metadata as m; assert m.version("agent-client-protocol") == "0.12.1"' 2>/dev/null; then
  if ! python3 -m pip --version >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq python3-pip >/dev/null
  fi
  # Debian marks its Python as externally managed; the pinned set is small and test-only.
  python3 -m pip install --quiet --disable-pip-version-check --break-system-packages \
    -r requirements.txt 2>/dev/null \
    || python3 -m pip install --quiet --disable-pip-version-check -r requirements.txt
fi
