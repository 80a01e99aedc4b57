#!/bin/bash
# Reload memory benchmark (docs/performance.md, "Reload: memory"): a daemon in a cgroup v1 memory
# group of its own, AGENTS mock agents each holding about MIB MiB of events, then one reload.
# Prints the group's steady usage, its peak during the reload (memory.max_usage_in_bytes, reset
# just before the SIGHUP) and the reload's duration (SIGHUP to the new image listening).
# Usage: benches/reload-memory.sh BINARY [BINARY…]   (root; knobs: AGENTS=8 MIB=30)
# Run it with the previous build's binary and this one for an A/B.
set -euo pipefail
AGENTS=${AGENTS:-8}
MIB=${MIB:-30}
# One mock update is a ~190-byte SSE frame.
N=$((MIB * 1024 * 1024 / 190))
own=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ {print $3}' /proc/self/cgroup)
for bin in "$@"; do
  cg=/sys/fs/cgroup/memory$own/sa-reload-bench-$$
  mkdir "$cg"
  echo 4G > "$cg/memory.limit_in_bytes"
  dir=$(mktemp -d)
  port=$((30000 + RANDOM % 20000))
  u=http://127.0.0.1:$port
  sh -c "echo \$\$ > $cg/cgroup.procs && exec \"\$@\"" sh "$bin" server --host 127.0.0.1 \
    --port $port --data-dir "$dir/data" --work-dir "$dir" --event-buffer 10000000 \
    --event-buffer-bytes 256M 2>"$dir/log" &
  pid=$!
  for _ in $(seq 200); do curl -sf $u/v1/health >/dev/null && break; sleep 0.05; done
  for i in $(seq $AGENTS); do
    post() { curl -sf -X POST -H 'content-type: application/json' "$u/v1/acp/m$i$1" -d "$2" >/dev/null; }
    post "?agent=mock" '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}'
    post "" '{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/tmp","mcpServers":[]}}'
    post "" "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"session/prompt\",\"params\":{\"sessionId\":\"mock-1\",\"prompt\":[{\"type\":\"text\",\"text\":\"/stream $N\"}]}}"
  done
  sleep 2
  steady=$(cat "$cg/memory.usage_in_bytes")
  echo 0 > "$cg/memory.max_usage_in_bytes"
  t0=$(date +%s%N)
  kill -HUP $pid
  for _ in $(seq 1200); do grep -q "reloaded; listening" "$dir/log" && break; sleep 0.05; done
  t1=$(date +%s%N)
  ok=yes; grep -q "reloaded; listening" "$dir/log" || ok=no
  peak=$(cat "$cg/memory.max_usage_in_bytes")
  oom=$(awk '$1=="oom_kill"{print $2}' "$cg/memory.oom_control")
  printf '%s: agents=%s events/agent=%s steady=%d MiB reload-peak=%d MiB (+%d MiB, %.2fx) reload=%d ms reloaded=%s oom_kill=%s\n' \
    "$bin" $AGENTS $N $((steady >> 20)) $((peak >> 20)) $(((peak - steady) >> 20)) \
    "$(echo "$peak / $steady" | bc -l)" $(((t1 - t0) / 1000000)) $ok "${oom:-?}"
  grep -o 'reload: executing the new image.*' "$dir/log" | head -1 || true
  kill -TERM $pid 2>/dev/null || true
  wait $pid 2>/dev/null || true
  for _ in $(seq 50); do rmdir "$cg" 2>/dev/null && break; sleep 0.1; done
  rm -rf "$dir"
done
