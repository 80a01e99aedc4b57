#!/usr/bin/env bash
# The density bench (benches/scale.rs) with the open-file limit raised to the hard limit first:
# 10,000 idle client sockets here and as many in the daemon. Loopback only; every phase is bounded.
# Knobs (environment): SCALE_AGENTS=500,1000 SCALE_LISTED=5000 SCALE_FULL=50
# SCALE_SUBSCRIBERS=10000 SCALE_CONNS=10000 SCALE_H2=2000 SCALE_WS=2000 SCALE_PROCS=1000 SCALE_WATCH=100,
# SANDBOX_AGENT_WORKER_THREADS, SCALE_ARGS (extra daemon flags), SANDBOX_AGENT_BIN (another build).
set -euo pipefail
cd "$(dirname "$0")/.."
ulimit -n "$(ulimit -Hn)"
exec cargo bench --bench scale "$@"
