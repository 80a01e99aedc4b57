//! Helpers every benchmark uses (`mod common;` in each bench; not a bench itself: the manifest
//! sets `autobenches = false`). A bench that does not use one of them must not warn about it.
#![allow(dead_code)]

use std::time::Duration;

/// The environment variable `name` parsed, or `default` when unset or unparsable.
pub fn knob<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A loopback port free at the time of asking.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The `p` quantile (0..=1) of `sorted`, nearest rank; zero for no samples.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}
