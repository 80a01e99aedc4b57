#!/usr/bin/env bash
# Builds docker/Dockerfile with podman, without pulling anything, under a tag named after what
# went into it (the binary, the Dockerfile and the base tree), so every test that needs the image
# reuses one build: a second call with the same inputs only prints the tag. The base image is
# kept across binaries; test images of earlier binaries older than an hour are removed. The base image is the
# debootstrap tree ROOT plus the host's node and npm, imported under a local name, as
# podman-image.sh does. Usage: build-image.sh ROOT BINARY. Prints the image name on stdout; the
# build's log goes to stderr when it fails.
set -euo pipefail
root=${1:?ROOT} bin=${2:?BINARY}
repo=$(cd "$(dirname "$0")/../.." && pwd)
# The OCI runtime: runc when installed (crun, podman's usual default, fails on hosts with hybrid
# cgroups v1/v2 like the CI machine), else podman's own default. PODMAN_RUNTIME overrides.
runtime=${PODMAN_RUNTIME-$(command -v runc >/dev/null 2>&1 && echo runc)}
pm() { podman ${runtime:+--runtime "$runtime"} "$@"; }
node=$(readlink -f "$(command -v node)")
npm_dir=$(dirname "$(dirname "$(readlink -f "$(command -v npm)")")")
base_sum=$({ sha256sum "$node" | cut -d' ' -f1; echo "$npm_dir"; stat -c %Y "$root/.complete"; } |
  sha256sum | cut -c1-16)
sum=$({ sha256sum "$bin" "$repo/docker/Dockerfile" | cut -d' ' -f1; echo "$base_sum"; } | sha256sum | cut -c1-16)
image=localhost/sandbox-agent:test-$sum
base=localhost/sandbox-agent-test-base:b$base_sum
if pm image exists "$image"; then
  echo "$image"
  exit 0
fi
# Only one build at a time (the Rust tests run in parallel).
exec 9>"${TMPDIR:-/tmp}/sandbox-agent-build-image.lock"
flock 9
if pm image exists "$image"; then
  echo "$image"
  exit 0
fi
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
log=$ctx/build.log
if ! pm image exists "$base"; then
  tar -C "$root" --exclude=./.complete \
    --transform "s|^${node#/}\$|usr/local/bin/node|" \
    --transform "s|^${npm_dir#/}|usr/local/lib/node_modules/npm|" \
    -cf - . -C / "${node#/}" "${npm_dir#/}" 2>>"$log" |
    pm import --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" - "$base.raw" >>"$log" 2>&1 ||
    { cat "$log" >&2; exit 1; }
  cat >"$ctx/Dockerfile.base" <<DOCKERFILE
FROM $base.raw
RUN ln -sf /usr/local/lib/node_modules/npm/bin/npm-cli.js /usr/local/bin/npm
DOCKERFILE
  pm build -q --pull=never --network=none -f "$ctx/Dockerfile.base" -t "$base" "$ctx" >>"$log" 2>&1 ||
    { cat "$log" >&2; exit 1; }
  pm rmi "$base.raw" >/dev/null 2>&1 || true
fi
cp "$bin" "$ctx/sandbox-agent"
objcopy --strip-debug "$ctx/sandbox-agent" 2>/dev/null || true
pm build -q --pull=never --network=none --format docker --build-arg "BASE=$base" \
  --build-arg SANDBOX_AGENT_BINARY=sandbox-agent -f "$repo/docker/Dockerfile" -t "$image" \
  "$ctx" >>"$log" 2>&1 || { cat "$log" >&2; exit 1; }
# Earlier builds (another binary) older than an hour go; one a container still uses stays.
for old in $(pm images --filter 'reference=localhost/sandbox-agent:test-*' \
  --filter 'reference=localhost/sandbox-agent-test-base:b*' --filter until=1h \
  --format '{{.Repository}}:{{.Tag}}'); do
  [ "$old" = "$image" ] || [ "$old" = "$base" ] || pm rmi "$old" >/dev/null 2>&1 || true
done
echo "$image"
