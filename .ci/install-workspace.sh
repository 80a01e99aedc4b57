#!/usr/bin/env bash
# What the workspace tests run besides the daemon: git (with `git http-backend` and the https
# remote helper, both part of Debian's git package), python3 (the loopback https git server of
# `clone_over_https_with_credentials`, the port tests' `http.server`) and openssl (that server's
# self-signed certificate). Idempotent: installs only what is missing.
set -euo pipefail
need=()
command -v git >/dev/null 2>&1 || need+=(git)
command -v python3 >/dev/null 2>&1 || need+=(python3)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
if [ "${#need[@]}" -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
