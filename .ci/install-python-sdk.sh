#!/usr/bin/env bash
# Installs what the Python SDK's tests need (tests/it/python_sdk.rs runs pytest in sdks/python):
# a virtual environment at sdks/python/.venv (gitignored) with the SDK installed editable and its
# test tools at fixed versions (pytest, pytest-asyncio, mypy, build, uv, setuptools, wheel).
# Idempotent and quiet: re-installs only when pyproject.toml or this script changed.
set -euo pipefail
self=$(realpath "$0")
cd "$(dirname "$0")/../sdks/python"

venv=.venv
stamp=$venv/.install-python-sdk.sha256
want=$(cat pyproject.toml "$self" | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  exit 0
fi
rm -rf "$venv"
python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip --quiet --disable-pip-version-check)
"${pip[@]}" install 'pip==24.3.1' 'setuptools==75.6.0' 'wheel==0.45.1'
"${pip[@]}" install 'pytest==8.3.4' 'pytest-asyncio==0.25.0' 'websockets==15.0.1' 'mypy==1.13.0' 'build==1.2.2.post1' 'uv==0.5.11'
"${pip[@]}" install -e .
echo "$want" >"$stamp"
