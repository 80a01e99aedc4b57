#!/usr/bin/env bash
# Builds docker/Dockerfile with podman without pulling anything (the base image is the debootstrap
# tree ROOT plus the host's node and npm, imported under a local name) and runs it: the daemon is
# PID 1, /v1/health answers with the token from the environment, the HEALTHCHECK passes, orphans
# are reaped, `podman stop` ends with exit 0 before the stop timeout. Each property is also checked
# on a control container whose PID 1 is `sleep` (no reaping, no SIGTERM handler, no server) and
# must fail there. Usage: podman-image.sh ROOT BINARY OUT. Prints ok:/FAIL: lines; exit = failures.
set -uo pipefail
root=${1:?ROOT} bin=${2:?BINARY} out=${3:?OUT}
repo=$(cd "$(dirname "$0")/../.." && pwd)
tag=$$
base=localhost/sandbox-agent-test-base:$tag
image=localhost/sandbox-agent-test:$tag
ctr=sandbox-agent-test-$tag
ctl=sandbox-agent-ctl-$tag
TOKEN=image-token-456
failures=0
ok() { echo "ok: $1"; }
fail() { echo "FAIL: $1: $2"; failures=$((failures + 1)); }
# The OCI runtime: runc when installed (crun, podman's usual default, fails on hosts with hybrid
# cgroups v1/v2 like the CI machine), else podman's own default. PODMAN_RUNTIME overrides.
runtime=${PODMAN_RUNTIME-$(command -v runc >/dev/null 2>&1 && echo runc)}
pm() { podman ${runtime:+--runtime "$runtime"} "$@"; }
mkdir -p "$out"

cleanup() {
  pm rm -f -t 0 "$ctr" "$ctl" >/dev/null 2>&1
  pm rmi -f "$image" "$base" >/dev/null 2>&1
}
trap cleanup EXIT

# --- base image: the debootstrap tree and the host's node/npm (nothing is pulled) ---
node=$(readlink -f "$(command -v node)")
npm_dir=$(dirname "$(dirname "$(readlink -f "$(command -v npm)")")")
# node and npm go where the official node images have them, wherever the host keeps them.
tar -C "$root" --exclude=./.complete \
  --transform "s|^${node#/}\$|usr/local/bin/node|" \
  --transform "s|^${npm_dir#/}|usr/local/lib/node_modules/npm|" \
  -cf - . -C / "${node#/}" "${npm_dir#/}" 2>"$out/tar.err" |
  pm import --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" - "$base" >"$out/import.log" 2>&1 ||
  { fail "import base image" "$(cat "$out/tar.err" "$out/import.log")"; exit 100; }
ctx=$(mktemp -d)
trap 'cleanup; rm -rf "$ctx"' EXIT
cp "$bin" "$ctx/sandbox-agent"
objcopy --strip-debug "$ctx/sandbox-agent" 2>/dev/null || true
# npm as its own installer sets it up: a link in the PATH to npm-cli.js.
cat >"$ctx/Dockerfile.base" <<DOCKERFILE
FROM $base
RUN ln -sf /usr/local/lib/node_modules/npm/bin/npm-cli.js /usr/local/bin/npm
DOCKERFILE
pm build -q --pull=never --network=none -f "$ctx/Dockerfile.base" -t "$base" "$ctx" >"$out/base.log" 2>&1 ||
  { fail "base image npm link" "$(tail "$out/base.log")"; exit 100; }

# --- the image itself, from the Dockerfile as shipped ---
if pm build --pull=never --network=none --format docker --build-arg "BASE=$base" \
  --build-arg SANDBOX_AGENT_BINARY=sandbox-agent -f "$repo/docker/Dockerfile" -t "$image" \
  "$ctx" >"$out/build.log" 2>&1; then ok "image builds without pulling"
else fail "image builds without pulling" "$(tail -15 "$out/build.log")"; exit 100; fi

run() { pm run -d 2>>"$out/run.err" --pull=never --network=none --ulimit nofile=20000:20000 \
  --ulimit nproc=32768:32768 --stop-timeout 20 "$@"; }
hostpid() { pm inspect -f '{{.State.Pid}}' "$1"; }
# curl from the host inside the container's network namespace (--network=none: loopback only).
in_net() { nsenter -t "$(hostpid "$1")" -n curl -s --max-time 5 "${@:2}"; }

# Without a token, 0.0.0.0 is refused: exit 78 at once, with the reason on stderr.
pm run --name "$ctl-notoken" --pull=never --network=none --ulimit nofile=20000:20000 \
  --ulimit nproc=32768:32768 "$image" >"$out/notoken.log" 2>&1
code=$?
pm rm -f "$ctl-notoken" >/dev/null 2>&1
if [ "$code" = 78 ] && grep -q 'without authentication' "$out/notoken.log"; then
  ok "no token: refuses to listen on 0.0.0.0 (exit 78)"
else fail "no token: refuses to listen on 0.0.0.0 (exit 78)" "exit $code: $(tail -3 "$out/notoken.log")"; fi

run --name "$ctr" -e SANDBOX_AGENT_TOKEN=$TOKEN "$image" >/dev/null
run --name "$ctl" --entrypoint /bin/sleep "$image" infinity >/dev/null
pid=$(hostpid "$ctr")
cpid=$(hostpid "$ctl")

comm=$(cat /proc/"$pid"/comm 2>/dev/null)
[ "$comm" = sandbox-init ] && ok "the daemon's init is PID 1" || fail "the daemon's init is PID 1" "PID 1 is '$comm'"

health=
for _ in $(seq 100); do
  health=$(in_net "$ctr" -H "Authorization: Bearer $TOKEN" http://127.0.0.1:2468/v1/health)
  [ -n "$health" ] && break
  sleep 0.1
done
unauth=$(in_net "$ctr" -o /dev/null -w '%{http_code}' http://127.0.0.1:2468/v1/health)
if case "$health" in '{"status":"ok",'*) true ;; *) false ;; esac && [ "$unauth" = 401 ]; then ok "/v1/health answers with the token"
else fail "/v1/health answers with the token" "with token: '$health', without: $unauth"; fi

# An agent through the proxy, so that the stop below has an agent to stop as well.
init=$(in_net "$ctr" -H "Authorization: Bearer $TOKEN" -H 'Content-Type: application/json' \
  -d '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}' \
  'http://127.0.0.1:2468/v1/acp/img-1?agent=mock')
agents=$(pgrep --ns "$pid" --nslist pid -f mock-agent | wc -l)
case "$init/$agents" in *'"protocolVersion"'*/1) ok "an agent runs in the container";;
  *) fail "an agent runs in the container" "answer '$init', $agents agent processes";; esac

healthy() { pm healthcheck run "$1" >/dev/null 2>&1; }
healthy "$ctr" && ok "HEALTHCHECK passes" || fail "HEALTHCHECK passes" "$(pm healthcheck run "$ctr" 2>&1)"
healthy "$ctl" && fail "control: HEALTHCHECK without a server fails" "passed" ||
  ok "control: HEALTHCHECK without a server fails"

# --- orphans: 50 short-lived grandchildren reparented to PID 1 must not stay zombies ---
# orphans PID1: makes the orphans, then polls (10 s at most) until PID 1 has no `sleep` child
# left (all reaped: prints 0) or holds all 50 as zombies; prints the zombies under PID 1.
orphans() {
  local z=0
  nsenter -t "$1" -p -m sh -c 'for i in $(seq 50); do (sleep 0.3 &); done'
  for _ in $(seq 100); do
    z=$(ps --ppid "$1" -o stat= | grep -c '^Z')
    if ! ps --ppid "$1" -o comm= | grep -q '^sleep' || [ "$z" -ge 50 ]; then break; fi
    sleep 0.1
  done
  echo "$z"
}
z=$(orphans "$pid")
[ "$z" = 0 ] && ok "orphans are reaped" || fail "orphans are reaped" "$z zombies under PID 1"
z=$(orphans "$cpid")
[ "$z" -gt 0 ] && ok "control: a PID 1 that does not reap leaves zombies" ||
  fail "control: a PID 1 that does not reap leaves zombies" "no zombie seen"

# --- stop: SIGTERM, graceful, exit 0 long before the 20 s stop timeout ---
stop() {
  local t0 t1
  t0=$(date +%s%N)
  pm stop -t "$2" "$1" >/dev/null 2>&1
  t1=$(date +%s%N)
  echo "$(pm inspect -f '{{.State.ExitCode}}' "$1") $(((t1 - t0) / 1000000))"
}
read -r code ms < <(stop "$ctr" 20)
echo "podman stop took ${ms} ms, exit ${code}"
[ "$code" = 0 ] && [ "$ms" -lt 15000 ] && ok "podman stop: exit 0 within the stop timeout" ||
  fail "podman stop: exit 0 within the stop timeout" "exit $code after $ms ms"
pm logs "$ctr" >"$out/daemon.log" 2>&1
read -r code ms < <(stop "$ctl" 2)
[ "$code" = 0 ] && fail "control: a PID 1 ignoring SIGTERM is killed" "exit 0" ||
  ok "control: a PID 1 ignoring SIGTERM is killed"

echo "failures: $failures"
exit "$failures"
