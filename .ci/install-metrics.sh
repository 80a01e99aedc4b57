#!/usr/bin/env bash
# Installs what the metrics tests need (tests/it/metrics.rs): Debian's Prometheus server, which
# the test runs by hand against the daemon (the package's own service is never started here).
# Idempotent and quiet.
set -euo pipefail
if ! command -v prometheus >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
