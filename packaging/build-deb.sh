#!/usr/bin/env bash
# Builds the Debian package with plain dpkg-deb (no debhelper needed): the binary, both systemd
# units, the default config, a sysusers.d entry for the service user and the maintainer scripts.
# Installing the package starts nothing; see docs/operations.md.
#
# Usage: packaging/build-deb.sh [BINARY] [OUTDIR]
#   BINARY  defaults to target/release/sandbox-agent (build it first: cargo build --release)
#   OUTDIR  defaults to target/debian
# Prints the path of the .deb it wrote. STRIP=0 keeps debug info in the packaged binary.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
bin=${1:-$repo/target/release/sandbox-agent}
out=${2:-$repo/target/debian}
[ -x "$bin" ] || { echo "build-deb: $bin is not an executable (cargo build --release?)" >&2; exit 1; }

version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -1)
arch=$(dpkg --print-architecture)
name=sandbox-agent
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
pkg=$stage/$name

install -d "$pkg/DEBIAN" "$pkg/usr/bin" "$pkg/lib/systemd/system" "$pkg/usr/lib/sysusers.d" \
  "$pkg/etc/sandbox-agent" "$pkg/etc/default" "$pkg/usr/share/doc/$name"
install -m 0755 "$bin" "$pkg/usr/bin/$name"
if [ "${STRIP:-1}" = 1 ] && command -v objcopy >/dev/null 2>&1; then
  objcopy --strip-debug "$pkg/usr/bin/$name"
fi
install -m 0644 "$repo/systemd/sandbox-agent.service" "$repo/systemd/sandbox-agent.socket" \
  "$pkg/lib/systemd/system/"
install -m 0644 "$here/config.toml" "$pkg/etc/sandbox-agent/config.toml"
install -m 0600 "$here/debian/default" "$pkg/etc/default/$name"
install -m 0644 "$here/debian/sysusers.conf" "$pkg/usr/lib/sysusers.d/$name.conf"
# Every page of docs/ ships, so that the links between them (operations.md → supervision.md,
# config.md, …) resolve in the installed copy too.
install -m 0644 "$repo/README.md" "$pkg/usr/share/doc/$name/"
install -d -m 0755 "$pkg/usr/share/doc/$name/docs"
install -m 0644 "$repo"/docs/*.md "$pkg/usr/share/doc/$name/docs/"
for script in postinst prerm postrm; do
  install -m 0755 "$here/debian/$script" "$pkg/DEBIAN/$script"
done
printf '/etc/sandbox-agent/config.toml\n/etc/default/%s\n' "$name" >"$pkg/DEBIAN/conffiles"

size=$(du -sk --exclude=DEBIAN "$pkg" | cut -f1)
cat >"$pkg/DEBIAN/control" <<CONTROL
Package: $name
Version: $version
Architecture: $arch
Maintainer: Sandbox Agent maintainers <maintainers@sandbox-agent.invalid>
Installed-Size: $size
Depends: libc6 (>= 2.34), libgcc-s1, passwd, procps
Recommends: nodejs, npm, systemd
Section: devel
Priority: optional
Description: supervises ACP coding agents in a sandbox and serves them over HTTP
 Sandbox Agent runs inside a VM or container and lets programs outside drive
 coding agents (Claude Code, Codex, OpenCode, Gemini, ...) that speak the Agent
 Client Protocol: JSON-RPC over HTTP POST, agent output as server-sent events.
 The package ships systemd units (service and socket) but enables nothing;
 run "systemctl enable --now sandbox-agent" to start it.
CONTROL

mkdir -p "$out"
deb=$out/${name}_${version}_${arch}.deb
dpkg-deb --root-owner-group -Zxz -z1 --build "$pkg" "$deb" >/dev/null
echo "$deb"
