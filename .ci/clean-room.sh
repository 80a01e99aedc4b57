#!/usr/bin/env bash
# The clean-room proof of `.ci/run`: builds a fresh Debian bookworm root (debootstrap minbase: no
# node, npm, pip or python3, no C compiler, no git), copies in only the Rust toolchain, clones one
# commit of this repository into it and runs `CI=true bash .ci/run` there as root, chrooted (by
# pivot_root in a private mount namespace), with the host's real /proc, /sys (cgroups included,
# read-write), /dev and a tmpfs /run, in the host's PID namespace (no container), so that every
# tool the tests need must come from `.ci/install-*.sh`. Anything that fails here because the
# machine is fresh is a bug in those scripts or in a test, never something to add to this set-up.
#
# Invariants: nothing it mounts outlives it (the mounts live in the room's own mount namespace,
# and an EXIT/INT/TERM trap stops every process left in it; the root is deleted only when nothing
# is mounted beneath it, with --one-file-system); no systemd manager runs outside a
# `systemd-nspawn --boot` container (a policy-rc.d forbids services, and a watcher stops the run
# if one appears); the run is bounded by `timeout` (90 min by default).
#
# Usage (as root, on a Debian 12 machine with the Rust toolchain from rustup):
#   .ci/clean-room.sh [--rev REV] [--root DIR] [--log FILE] [--timeout MIN] [--keep]
#     --rev      commit or branch to test (default: HEAD of this checkout)
#     --root     where to build the root (default: /var/tmp/sandbox-agent-clean-room/root)
#     --log      the run's log (default: /var/tmp/sandbox-agent-clean-room/run-<UTC time>.log)
#     --timeout  minutes for `.ci/run` (default 90)
#     --keep     keep the root afterwards (default: delete it; its target/ is ~10 GB)
# Exits with `.ci/run`'s status (124 on timeout), or 2..9 when the clean room itself failed.
set -euo pipefail

# Everything is in one function that bash reads whole before running it, so that editing this file
# while a run is under way cannot change what the run does.
main() {

  repo=$(cd "$(dirname "$self")/.." && pwd)
  base=/var/tmp/sandbox-agent-clean-room
  rev=HEAD root=$base/root log= minutes=90 keep=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --rev) rev=$2; shift 2 ;;
      --root) root=$2; shift 2 ;;
      --log) log=$2; shift 2 ;;
      --timeout) minutes=$2; shift 2 ;;
      --keep) keep=1; shift ;;
      -h|--help) sed -n '2,/^set -euo/p' "$self" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
      *) echo "clean-room: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
  done
  [ "$(id -u)" = 0 ] || { echo "clean-room: must run as root (chroot, mounts, debootstrap)" >&2; exit 2; }
  case "$root" in /|/usr|/var|/tmp|/root|"") echo "clean-room: refusing root $root" >&2; exit 2 ;; esac
  mkdir -p "$base"
  log=${log:-$base/run-$(date -u +%Y%m%dT%H%M%SZ).log}
  commit=$(git -C "$repo" rev-parse --verify "$rev^{commit}")
  say() { echo "clean-room: $*" | tee -a "$log" >&2; }
  : >"$log"
  say "testing $commit ($rev) in $root; log $log"

  # --- teardown: runs on every exit, including Ctrl-C and `kill` -------------------------------
  watcher= run=
  mounted_under_root() { findmnt -rn -o TARGET | awk -v r="$root" 'index($0, r "/") == 1 || $0 == r'; }
  # The room's processes: those in its mount namespace (recorded in $ns_file when it is made), or
  # with a root directory in the tree as seen from here.
  ns_file=$base/room.mntns
  rm -f "$ns_file"
  our_processes() {
    local p room_ns
    room_ns=$(cat "$ns_file" 2>/dev/null || true)
    for p in /proc/[0-9]*; do
      if [ -n "$room_ns" ] && [ "$(readlink "$p/ns/mnt" 2>/dev/null)" = "$room_ns" ]; then
        echo "${p#/proc/}"; continue
      fi
      case "$(readlink "$p/root" 2>/dev/null)" in "$root"|"$root"/*) echo "${p#/proc/}" ;; esac
    done
  }
  teardown() {
    local status=$?
    trap - EXIT INT TERM
    if [ -n "$watcher" ]; then kill "$watcher" 2>/dev/null || true; fi
    if [ -n "$run" ]; then kill -TERM "$run" 2>/dev/null || true; fi
    local pids
    pids=$(our_processes)
    if [ -n "$pids" ]; then
      say "stopping what is left in the room: $(echo $pids)"
      kill -KILL $pids 2>/dev/null || true
      sleep 1
    fi
    # The room's mounts live in its own namespace and end with its last process; this only
    # matters if something was mounted here from outside. Deepest first, lazily if busy.
    mounted_under_root | sort -r | while read -r m; do
      umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || say "could not unmount $m"
    done
    if [ -n "$(mounted_under_root)" ]; then
      say "mounts remain under $root; not deleting it"
    elif [ "$keep" = 0 ] && [ -d "$root" ]; then
      rm -rf --one-file-system "$root"
    fi
    exit "$status"
  }
  trap teardown EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM

  # --- 1. a fresh minbase root ------------------------------------------------------------------
  if [ -n "$(mounted_under_root)" ]; then
    say "something is still mounted under $root (an earlier run?); unmount it first"; exit 3
  fi
  rm -rf --one-file-system "$root"
  export DEBIAN_FRONTEND=noninteractive
  if ! command -v debootstrap >/dev/null; then
    apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null
  fi
  # The Debian mirror this machine uses (deb822 or one-line sources), not third-party lists.
  mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null \
    | awk '/^URIs:/ && $2 ~ /debian\/?$/ {print $2; exit}')
  [ -n "$mirror" ] || mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
    | awk '$1 == "deb" && $3 == "bookworm" {print $2; exit}')
  mirror=${mirror:-http://deb.debian.org/debian}
  say "debootstrap --variant=minbase bookworm from $mirror"
  started=$(date +%s)
  timeout 900 debootstrap --variant=minbase bookworm "$root" "$mirror" >>"$log" 2>&1 \
    || { say "debootstrap failed (see $log)"; exit 4; }
  # The same Debian suites as this machine (bookworm, -updates, -security), nothing else.
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    cp /etc/apt/sources.list.d/debian.sources "$root/etc/apt/sources.list.d/debian.sources"
    rm -f "$root/etc/apt/sources.list"
  fi
  # No package may start a service here: invoke-rc.d asks policy-rc.d, 101 means "forbidden".
  printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
  chmod 755 "$root/usr/sbin/policy-rc.d"
  cp -L /etc/resolv.conf "$root/etc/resolv.conf"
  # This machine's network reaches the registries through a TLS-inspecting proxy: its certificate
  # authorities are site configuration (like resolv.conf), so they come along as local CAs. They
  # are trusted only once CI installs Debian's ca-certificates, as on any fresh machine here.
  if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
    mkdir -p "$root/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  fi
  echo sandbox-agent-clean-room >"$root/etc/hostname"

  # What a fresh machine of this kind lacks: show it, and refuse a room that is not clean.
  absent=() present=()
  for tool in node npm npx python3 pip pip3 git curl cc gcc ps ip unshare setfacl prlimit \
    chromium debootstrap systemd-nspawn podman; do
    if chroot "$root" /bin/sh -c "command -v $tool" >/dev/null 2>&1; then present+=("$tool"); else absent+=("$tool"); fi
  done
  say "absent in the room: ${absent[*]}"
  say "present in the room: ${present[*]:-(none of those)}"
  for tool in node npm npx python3 pip pip3; do
    case " ${present[*]:-} " in *" $tool "*) say "$tool is present: the room is not clean"; exit 5 ;; esac
  done

  # --- 2. the Rust toolchain only (no registry cache: crates come fresh from crates.io) ----------
  rustup_home=${RUSTUP_HOME:-/root/.rustup}
  cargo_home=${CARGO_HOME:-/root/.cargo}
  toolchain=$(awk -F'"' '/^default_toolchain/ {print $2}' "$rustup_home/settings.toml")
  [ -d "$rustup_home/toolchains/$toolchain" ] || { say "no default toolchain in $rustup_home"; exit 6; }
  mkdir -p "$root/root/.rustup/toolchains" "$root/root/.cargo"
  cp -a "$rustup_home/toolchains/$toolchain" "$root/root/.rustup/toolchains/"
  printf 'version = "12"\ndefault_toolchain = "%s"\nprofile = "default"\nauto_self_update = "disable"\n' \
    "$toolchain" >"$root/root/.rustup/settings.toml"
  cp -a "$cargo_home/bin" "$root/root/.cargo/bin"
  # As rustup-init leaves a login shell: cargo on PATH.
  echo '. "$HOME/.cargo/env"' >>"$root/root/.profile"
  cp "$cargo_home/env" "$root/root/.cargo/env"

  # --- 3. the repository at one commit, as a fresh clone (nothing untracked: no target/, no node_modules)
  src=/root/sandbox-agent
  git clone --quiet --no-local --no-checkout "$(git -C "$repo" rev-parse --path-format=absolute --git-common-dir)" "$root$src"
  git -C "$root$src" checkout --quiet -B clean-room "$commit"
  say "cloned $(git -C "$root$src" log -1 --format='%h %s')"

  # --- 4. the room: a private mount namespace whose root is the tree -----------------------------
  # pivot_root, not a plain chroot: tools that enter another process's mount namespace (nsenter,
  # `podman exec`, healthchecks) land on that namespace's root, which must be the tree as on a real
  # machine. There: the tree bound on itself (a mount point, as / is), /proc, the host's /sys with
  # its cgroup hierarchies read-write (rbind; the cgroup tests need the real ones, which nspawn
  # would make read-only), /dev with /dev/pts and /dev/shm (rbind) and a tmpfs on /run. The
  # namespace's mounts are private: nothing propagates back, and they all end with the room.
  mkdir -p "$root/.clean-room-old-root"
  # shellcheck disable=SC2016 # expanded by the inner shell
  enter='set -e
    r=$1 ns_file=$2; shift 2
    readlink /proc/self/ns/mnt >"$ns_file"
    mount --bind "$r" "$r"
    mount -t proc proc "$r/proc"
    mount --rbind /sys "$r/sys"
    mount --rbind /dev "$r/dev"
    mount -t tmpfs -o mode=755 tmpfs "$r/run"
    cd "$r"
    pivot_root . .clean-room-old-root
    umount -l /.clean-room-old-root
    rmdir /.clean-room-old-root
    exec "$@"'
  say "toolchain $toolchain (rustup default), no cargo registry"

  # --- 5. the run, and a watcher: a systemd manager may only be PID 1 of a systemd-nspawn container
  under_nspawn() {
    local p=$1 comm
    while [ "$p" -gt 1 ]; do
      p=$(awk '/^PPid:/ {print $2}' "/proc/$p/status" 2>/dev/null) || return 1
      [ -n "$p" ] || return 1
      comm=$(cat "/proc/$p/comm" 2>/dev/null) || return 1
      [ "$comm" = systemd-nspawn ] && return 0
    done
    return 1
  }
  # The machine's variables that point TLS clients (node, pip, curl, git) at the system CA bundle;
  # nothing else of this shell's environment goes in.
  ca_env=()
  for v in SSL_CERT_FILE SSL_CERT_DIR NODE_EXTRA_CA_CERTS PIP_CERT REQUESTS_CA_BUNDLE CURL_CA_BUNDLE \
    GIT_SSL_CAINFO; do
    if [ -n "${!v:-}" ]; then ca_env+=("$v=${!v}"); fi
  done
  say "CA variables passed in: ${ca_env[*]:-(none)}"
  setup=$(( $(date +%s) - started ))
  say "room ready in ${setup}s; running CI=true bash .ci/run (timeout ${minutes} min)"
  run_started=$(date +%s)
  timeout --kill-after=60 "${minutes}m" unshare --mount --propagation private \
    bash -c "$enter" enter "$root" "$ns_file" /usr/bin/env -i HOME=/root TERM=dumb CI=true \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "${ca_env[@]}" \
    /bin/bash -lc "cd $src && bash .ci/run" </dev/null >>"$log" 2>&1 &
  run=$!
  (
    trap - EXIT INT TERM
    while sleep 2; do
      for p in $(pgrep -x systemd || true); do
        # (A process that ended while its parents were read is no finding.)
        if ! under_nspawn "$p" && [ -e "/proc/$p" ]; then
          echo "clean-room: FATAL: a systemd manager outside nspawn (pid $p); stopping the run" >>"$log"
          # Ours if it is in the room (the teardown then stops the rest).
          if our_processes | grep -qx "$p"; then kill -KILL "$p" 2>/dev/null || true; fi
          kill -TERM "$run" 2>/dev/null || true
        fi
      done
    done
  ) &
  watcher=$!
  set +e
  wait "$run"
  status=$?
  set -e
  took=$(( $(date +%s) - run_started ))
  if grep -q 'clean-room: FATAL' "$log"; then
    say "a systemd manager appeared outside nspawn: the run does not count"; status=9
  fi
  say "commit $commit: .ci/run exited $status after $((took / 60)) min $((took % 60)) s ($(date -u +%FT%TZ))"
  grep -E '^== (no test was skipped|[0-9]+ test\(s\) SKIPPED)|^test result:' "$log" | tail -3 >&2 || true
  exit "$status"
}

self=$0
main "$@"
