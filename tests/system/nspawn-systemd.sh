#!/usr/bin/env bash
# Boots a real systemd in a container (systemd-nspawn --boot, never on the host) on the
# debootstrapped tree ROOT, enters it and runs in-machine.sh against our .deb DEB. The tree itself
# stays untouched (--volatile=overlay). Usage: nspawn-systemd.sh ROOT DEB OUT.
# Prints the checks' lines; exits with their failure count (or 100+ when the machine itself failed).
set -euo pipefail
root=${1:?ROOT} deb=${2:?DEB} out=${3:?OUT}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
cp "$deb" "$out/sandbox-agent.deb"
cp "$here/in-machine.sh" "$out/in-machine.sh"

mkdir -p /run/systemd/nspawn
# A private mount namespace with a tmpfs on /run/systemd/nspawn, --register=no --keep-unit: what
# this host needs for nspawn to start at all (there is no systemd on the host).
timeout 300 unshare -m sh -c 'mount -t tmpfs tmpfs /run/systemd/nspawn && exec systemd-nspawn \
  -q -D "$0" --register=no --keep-unit --boot --console=passive --private-network \
  --volatile=overlay --bind="$1":/ci-out' "$root" "$out" >"$out/console.log" 2>&1 &
outer=$!

cleanup() {
  kill "$outer" 2>/dev/null || true
  wait "$outer" 2>/dev/null || true
  find /sys/fs/cgroup/{systemd,unified}/{payload,supervisor} -depth -type d -exec rmdir {} \; 2>/dev/null || true
}
trap cleanup EXIT

# The container's PID 1 is the process named systemd among the descendants of our timeout.
descendants() {
  local p
  for p in $(pgrep -P "$1"); do echo "$p"; descendants "$p"; done
}
init=
for _ in $(seq 300); do
  for p in $(descendants "$outer"); do
    if [ "$(cat /proc/"$p"/comm 2>/dev/null)" = systemd ]; then init=$p; break 2; fi
  done
  kill -0 "$outer" 2>/dev/null || break
  sleep 0.1
done
if [ -z "$init" ]; then
  echo "FAIL: machine did not boot"; cat "$out/console.log"; exit 101
fi

# systemctl can only connect once the manager has set up its socket: retry until it answers.
booted=
for _ in $(seq 300); do
  booted=$(timeout 60 nsenter -t "$init" -a env -i PATH=/usr/bin:/bin systemctl is-system-running --wait 2>&1 || true)
  case "$booted" in running|degraded) break;; esac
  kill -0 "$outer" 2>/dev/null || break
  sleep 0.2
done
echo "machine: $booted"
case "$booted" in running|degraded) ;; *)
  echo "FAIL: machine did not finish booting"; tail -30 "$out/console.log"; exit 102;; esac

set +e
timeout 180 nsenter -t "$init" -a env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 sh /ci-out/in-machine.sh
rc=$?
set -e
nsenter -t "$init" -a systemctl poweroff --no-block >/dev/null 2>&1 || true
for _ in $(seq 300); do kill -0 "$outer" 2>/dev/null || break; sleep 0.1; done
exit "$rc"
