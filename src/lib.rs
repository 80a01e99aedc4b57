//! Sandbox Agent: a daemon that supervises ACP coding agents inside a sandbox and serves them over
//! HTTP. `main.rs` only dispatches; everything lives in these modules (see docs/architecture.md).

/// Where the byte string literal `$needle` first occurs in `$hay` (`Option<usize>`), with the
/// searcher built once per call site: `memchr::memmem::find` builds one per call, which on the
/// short lines of the proxy's hot path cost more than the search (found in the flame graph,
/// docs/performance.md). Defined before the modules so that every module can use it.
macro_rules! find_bytes {
    ($hay:expr, $needle:literal) => {{
        static FINDER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
            std::sync::LazyLock::new(|| memchr::memmem::Finder::new($needle));
        FINDER.find($hay)
    }};
}

pub mod acp;
pub mod agents;
pub mod archive;
pub mod browser;
pub mod carried;
pub mod cli;
pub mod client;
pub mod config;
pub mod config_store;
pub mod daemon;
pub mod desktop;
pub mod files;
pub mod http;
pub mod http_client;
pub mod logging;
pub mod metrics;
pub mod opencode;
pub mod processes;
pub mod services;
pub mod state;
pub mod supervisor;
pub mod sys;
#[cfg(feature = "otel")]
pub mod telemetry;
/// Without the `otel` feature, the same calls, making no spans.
#[cfg(not(feature = "otel"))]
#[path = "telemetry_off.rs"]
pub mod telemetry;
pub mod workspace;

/// Installs the process-wide TLS crypto provider (ring) that reqwest needs before any client is
/// built. Idempotent.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
