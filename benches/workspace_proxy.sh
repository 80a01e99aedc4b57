#!/usr/bin/env bash
# Download throughput through the port proxy (GET /v1/ports/{port}/proxy/…) against a direct
# connection to the same app (`python3 -m http.server`, which sends the file with sendfile), a
# 256 MiB file, median of RUNS runs each. Usage: benches/workspace_proxy.sh [sandbox-agent].
set -euo pipefail
BIN=${1:-target/release/sandbox-agent}
RUNS=${RUNS:-5}
MIB=${MIB:-256}
DIR=$(mktemp -d)
trap 'kill "$DPID" "$APID" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$DIR"' EXIT
head -c "$((MIB << 20))" /dev/urandom > "$DIR/big.bin"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
APORT=$(free_port); PORT=$(free_port)
python3 -m http.server "$APORT" --bind 127.0.0.1 --directory "$DIR" >/dev/null 2>&1 &
APID=$!
"$BIN" server --port "$PORT" --data-dir "$DIR/data" --work-dir "$DIR" --log-format text 2>"$DIR/daemon.log" &
DPID=$!
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$PORT/v1/health" >/dev/null && curl -sfI "http://127.0.0.1:$APORT/big.bin" >/dev/null && break
  sleep 0.1
done
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
rate() { curl -s -o /dev/null -w '%{speed_download}\n' "$1"; }
for name in direct proxy; do
  if [ "$name" = direct ]; then URL="http://127.0.0.1:$APORT/big.bin"; else URL="http://127.0.0.1:$PORT/v1/ports/$APORT/proxy/big.bin"; fi
  rate "$URL" >/dev/null
  r=$(for _ in $(seq "$RUNS"); do rate "$URL"; done | median)
  echo "$name: $(python3 -c "print(round($r / (1 << 20)))") MiB/s (median of $RUNS, $MIB MiB)"
done
echo "daemon peak RSS: $(awk '/VmHWM/ {print $2, $3}' /proc/$DPID/status)"
