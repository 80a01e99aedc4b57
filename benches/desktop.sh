#!/usr/bin/env bash
# The desktop side by side with the reference (benches/desktop.mjs): fetches the reference's
# published Linux binary with `npm pack` (no install scripts) into target/reference/ as
# benches/reference.sh does, builds ours in release, and runs the bench. Needs the desktop's tools
# (.ci/install-desktop.sh) and sdks/typescript/node_modules (for `ws`). Loopback only once fetched.
set -euo pipefail
cd "$(dirname "$0")/.."
version=${REF_VERSION:-0.4.2}
dir=target/reference/$version
bin=$dir/package/bin/sandbox-agent
if [ ! -x "$bin" ]; then
  mkdir -p "$dir"
  (cd "$dir" && npm pack --silent "@sandbox-agent/cli-linux-x64@$version" >/dev/null && tar xzf ./*.tgz)
  chmod +x "$bin"
fi
ours=${OURS_BIN:-target/release/sandbox-agent}
if [ -z "${OURS_BIN:-}" ]; then cargo build --release --quiet --bin sandbox-agent; fi
exec node benches/desktop.mjs "$PWD/$ours" "$PWD/$bin"
