//! Traces in a build without the `otel` feature: the same calls as `telemetry.rs`, none of which
//! makes a span, so the request path costs what it costs with traces off. A configured OTLP
//! endpoint is refused with one line on stderr at start (the daemon still starts).

use axum::http::HeaderMap;
use bytes::Bytes;
use tracing::Span;

use crate::config::Config;

/// The target every span meant for traces would have.
pub const TARGET: &str = "sandbox_agent::trace";

/// Never: this build exports no traces.
#[inline]
pub fn enabled() -> bool {
    false
}

/// Nothing to keep alive (a `Drop`, like the exporter's guard, so that the log's guard drops it
/// first in either build).
pub struct TelemetryGuard;

impl Drop for TelemetryGuard {
    fn drop(&mut self) {}
}

/// No layer; says so once when an endpoint was configured.
pub fn layer(config: &Config) -> Option<(tracing_subscriber::layer::Identity, TelemetryGuard)> {
    if let Some(endpoint) = &config.otlp_traces_endpoint {
        eprintln!(
            "sandbox-agent: traces are off: this build has no OpenTelemetry export (built without \
             the `otel` feature), so {endpoint} gets nothing"
        );
    }
    None
}

/// Nothing is buffered in this build.
pub fn flush(_timeout: std::time::Duration) {}

pub fn http_span(_method: &axum::http::Method, _route: &str, _headers: &HeaderMap) -> Span {
    Span::none()
}

pub fn http_done(_span: &Span, _status: u16) {}

pub fn acp_request(
    _line: &[u8],
    _header_parent: bool,
    _server_id: &str,
    _agent: &str,
) -> (Option<Bytes>, Span) {
    (None, Span::none())
}

pub fn acp_done(_span: &Span, _outcome: &str, _error: bool) {}

pub fn task_span(_name: &'static str, _what: &str) -> Span {
    Span::none()
}
