#!/usr/bin/env bash
# Fetches and builds the official Rust ACP client for the transport interop tests
# (tests/it/transports.rs, rust_sdk_*_client_interop): `agent-client-protocol-http` 5.0.0 with
# feature `client`, pinned by tests/transports/rust/Cargo.lock. Built into target/interop-rust (kept
# with the other build outputs), so the tests only check that it is up to date. Idempotent: a
# second run is a no-op build. About 140 CPU-seconds cold on the project machine.
set -euo pipefail
cd "$(dirname "$0")/.."
manifest=tests/transports/rust/Cargo.toml
cargo fetch --locked --manifest-path "$manifest" --quiet
cargo build --locked --offline --quiet --manifest-path "$manifest" --target-dir target/interop-rust
