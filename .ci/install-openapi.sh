#!/usr/bin/env bash
# Installs the tools tests/it/openapi.rs drives against docs/openapi.json and the live daemon:
# openapi-spec-validator and schemathesis 4.x (PyPI), and openapi-typescript + typescript (npm,
# pinned in tests/openapi/package.json and package-lock.json). Idempotent; node_modules is
# gitignored.
set -euo pipefail
cd "$(dirname "$0")/.."

want_st=4.32.5
want_osv=0.9.0
have() { python3 -m pip show "$1" 2>/dev/null | awk '/^Version:/{print $2}'; }
if [ "$(have schemathesis)" != "$want_st" ] || [ "$(have openapi-spec-validator)" != "$want_osv" ]; then
  # Debian's python is "externally managed"; the flag is harmless elsewhere.
  python3 -m pip install --quiet --disable-pip-version-check --break-system-packages \
    "schemathesis==$want_st" "openapi-spec-validator==$want_osv"
fi

cd tests/openapi
if [ ! -x node_modules/.bin/openapi-typescript ] || [ ! -x node_modules/.bin/tsc ]; then
  npm ci --no-audit --no-fund --loglevel=error
fi
