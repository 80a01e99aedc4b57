#!/usr/bin/env bash
# The ACP proxy side by side with the reference implementation (benches/reference.rs). Fetches the
# reference's published Linux binary with npm (`npm pack`, no install scripts run) into
# target/reference/, gives it a home whose `mock` agent is our `sandbox-agent mock-agent` (the
# reference starts $HOME/.local/share/sandbox-agent/bin/agent_processes/mock-acp), and runs the
# bench. Loopback only once the package is fetched. Knobs: REF_VERSION (default 0.4.2),
# REF_BENCH_ROUNDS, REF_BENCH_N, REF_BENCH_SECS, REF_BENCH_PIN (1: daemon on core 0, client and agent
# on core 1, with taskset), REF_BENCH_PREVIOUS (a previous build of ours to run alongside); see
# benches/reference.rs.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${REF_VERSION:-0.4.2}
dir=target/reference/$version
bin=$dir/package/bin/sandbox-agent
if [ ! -x "$bin" ]; then
  mkdir -p "$dir"
  (cd "$dir" && npm pack --silent "@sandbox-agent/cli-linux-x64@$version" >/dev/null && tar xzf ./*.tgz)
  chmod +x "$bin"
fi
cargo build --release --quiet --bin sandbox-agent
home=$PWD/$dir/home
agents=$home/.local/share/sandbox-agent/bin/agent_processes
mkdir -p "$agents"
printf '#!/bin/sh\nexec %s mock-agent "$@"\n' "$PWD/target/release/sandbox-agent" > "$agents/mock-acp"
chmod +x "$agents/mock-acp"
REF_BIN=$PWD/$bin REF_HOME=$home exec cargo bench --bench reference "$@"
