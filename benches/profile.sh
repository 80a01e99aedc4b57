#!/usr/bin/env bash
# CPU profile of the ACP proxy path: a release daemon started here, `perf record` on it while
# `cargo bench --bench acp` drives it in its profiling mode, then benches/flamegraph.py folds the
# samples into an SVG flame graph and prints the hottest functions and the share of samples under
# lock/futex frames (the contention figure).
#
# Usage: benches/profile.sh [c32|spread] [OUT_DIR]
#   c32     HTTP `_mock/echo` POSTs from 32 keep-alive connections to one serverId (default)
#   spread  ACP_BENCH_CONNS connections (128) over ACP_BENCH_AGENTS serverIds (64)
# Knobs: ACP_BENCH_SECS (8), PERF_FREQ (499 Hz), WORKER_THREADS (the daemon's --worker-threads,
# default auto). Needs perf (linux-perf) and permission to profile (root, or
# kernel.perf_event_paranoid ≤ 1). Writes OUT_DIR/<mode>.svg, <mode>.txt and the raw
# <mode>.perf-script (default OUT_DIR: target/profile).
set -euo pipefail
mode=${1:-c32}
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
out=${2:-$root/target/profile}
mkdir -p "$out"
cd "$root"
command -v perf >/dev/null || { echo "profile.sh: perf is not installed (apt-get install linux-perf)" >&2; exit 2; }
case "$mode" in
  c32) path= ;;
  spread) path=spread ;;
  *) echo "profile.sh: unknown mode $mode (c32|spread)" >&2; exit 2 ;;
esac

cargo build --release --quiet --bin sandbox-agent
cargo bench --bench acp --no-run --quiet
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
work=$(mktemp -d)
trap 'kill "$daemon" 2>/dev/null || true; wait "$daemon" 2>/dev/null || true; rm -rf "$work"' EXIT
target/release/sandbox-agent server --host 127.0.0.1 --port "$port" --no-token --log-level warn \
  --work-dir "$work" --data-dir "$work/data" --max-agents 512 \
  ${WORKER_THREADS:+--worker-threads "$WORKER_THREADS"} >/dev/null 2>"$work/daemon.log" &
daemon=$!
for _ in $(seq 200); do
  curl -fsS "http://127.0.0.1:$port/v1/health" >/dev/null 2>&1 && break
  sleep 0.05
done

secs=${ACP_BENCH_SECS:-8}
perf record -F "${PERF_FREQ:-499}" -g --call-graph dwarf,16384 -p "$daemon" -o "$work/perf.data" \
  -- sleep $((secs + 2)) 2>"$work/perf.log" &
perf_pid=$!
sleep 0.5
ACP_BENCH_PROFILE=$port ACP_BENCH_PROFILE_PATH=$path ACP_BENCH_N=2000 ACP_BENCH_SECS=$secs \
  cargo bench --bench acp --quiet 2>/dev/null | tee "$out/$mode.bench.txt"
wait "$perf_pid" || true
cpu=$(awk '{print $14+$15}' "/proc/$daemon/stat")
echo "daemon CPU (utime+stime): $cpu ticks" | tee -a "$out/$mode.bench.txt"
perf script -i "$work/perf.data" 2>/dev/null >"$out/$mode.perf-script"
python3 benches/flamegraph.py <"$out/$mode.perf-script" --title "sandbox-agent, $mode ($(git rev-parse --short HEAD))" \
      --svg "$out/$mode.svg" --folded "$out/$mode.folded" | tee "$out/$mode.txt"
echo "profile.sh: $out/$mode.svg, $out/$mode.txt"
