#!/usr/bin/env bash
# What the SDK provider tests (tests/it/providers.rs) need: podman with runc (rootful; its
# `podman system service` is the Docker-compatible engine the `docker` provider talks to),
# debootstrap (the image's base tree: nothing can be pulled), util-linux's unshare and flock, and
# the npm packages: `@kubernetes/client-node` in sdks/typescript (its lockfile, installed by
# .ci/install-sdk.sh; the `docker` provider needs no engine client package) and the published `sandbox-agent` 0.4.2 SDK with `dockerode`
# and `get-port` in tests/compat (pinned in its package-lock.json; its .npmrc omits optional packages, so the
# published SDK's own daemon binaries are not downloaded). No cluster is installed: the Kubernetes
# provider's test runs only where KUBECONFIG names one. Idempotent and quiet.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
need=()
for pair in podman:podman runc:runc debootstrap:debootstrap unshare:util-linux flock:util-linux \
  objcopy:binutils; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
done
if [ "${#need[@]}" -gt 0 ]; then
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $(printf '%s\n' "${need[@]}" | sort -u) >/dev/null
fi

command -v npm >/dev/null 2>&1 || { echo "install-providers: npm is missing (see .ci/install-00-base.sh)" >&2; exit 1; }
cd "$(dirname "$0")/.."
if [ ! -d tests/compat/node_modules/sandbox-agent ] || [ ! -d tests/compat/node_modules/dockerode ]; then
  (cd tests/compat && npm ci --no-audit --no-fund --loglevel=error)
fi
