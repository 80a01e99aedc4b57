//! OpenTelemetry traces (docs/observability.md, "Traces"): off unless an OTLP endpoint is configured.
//!
//! The spans are ordinary `tracing` spans of the target `sandbox_agent::trace`, made only while
//! tracing is on (`enabled()`, one relaxed load otherwise), and turned into OpenTelemetry spans
//! by `tracing-opentelemetry`. Export is the SDK's batch processor: its own thread, a bounded
//! queue (spans beyond it are dropped), the blocking reqwest client with a timeout, so a dead or
//! slow collector never blocks the runtime and costs at most the queue; failed exports are
//! logged as a WARN at most once a minute.
//!
//! Trace context: a W3C `traceparent` on a request continues the client's trace (the HTTP
//! span's parent); the ACP request span's context goes to the agent as `_meta.traceparent` in
//! the forwarded envelope's `params`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

use axum::http::HeaderMap;
use bytes::Bytes;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider, SpanData, SpanExporter,
};
use serde_json::value::RawValue;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::config::{Config, TraceSampler};

/// The target of every span meant for traces.
pub const TARGET: &str = "sandbox_agent::trace";

/// Spans waiting for export; more are dropped.
const QUEUE: usize = 2048;
/// One export's deadline.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

static ENABLED: AtomicBool = AtomicBool::new(false);
/// The provider, for a reload's flush before its exec (which would drop the batch).
static PROVIDER: std::sync::OnceLock<SdkTracerProvider> = std::sync::OnceLock::new();

/// Exports what the batch processor holds (at most `timeout`; the export goes on in the
/// background past it): a reload calls this before its `execve`, which would drop the buffered
/// spans. Blocks the calling thread.
pub fn flush(timeout: Duration) {
    let Some(provider) = PROVIDER.get().cloned() else {
        return;
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("otel-flush".into())
        .spawn(move || {
            let _ = provider.force_flush();
            let _ = tx.send(());
        });
    if spawned.is_ok() {
        let _ = rx.recv_timeout(timeout);
    }
}

/// Whether traces are made.
#[inline]
pub fn enabled() -> bool {
    ENABLED.load(Relaxed)
}

/// Keeps the exporter alive; dropping it flushes what is queued (bounded by the export timeout).
pub struct TelemetryGuard {
    provider: SdkTracerProvider,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        ENABLED.store(false, Relaxed);
        let _ = self.provider.shutdown_with_timeout(Duration::from_secs(2));
    }
}

/// The tracing layer that makes OpenTelemetry spans, when an endpoint is configured. Built before
/// the async runtime starts (the blocking HTTP client must not be made inside it).
pub fn layer<S>(
    config: &Config,
) -> Option<(
    tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::SdkTracer>,
    TelemetryGuard,
)>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let endpoint = config.otlp_traces_endpoint.as_deref()?;
    crate::install_crypto_provider();
    // A plain `http://` collector needs no CA certificates (a minimal image has none).
    let mut builder = reqwest::blocking::Client::builder()
        .timeout(EXPORT_TIMEOUT)
        .no_proxy();
    if crate::http_client::is_plain_http(endpoint) {
        builder = crate::http_client::plain_http_blocking(builder);
    }
    let client = match builder.build() {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "sandbox-agent: traces are off: cannot build the OTLP client: {}",
                crate::http_client::build_error(&e)
            );
            return None;
        }
    };
    let exporter = match opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(client)
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(endpoint)
        .with_timeout(EXPORT_TIMEOUT)
        .build()
    {
        Ok(e) => e,
        Err(e) => {
            eprintln!("sandbox-agent: traces are off: {e}");
            return None;
        }
    };
    let processor = BatchSpanProcessor::builder(Warned {
        inner: exporter,
        endpoint: endpoint.to_string(),
        last_warning: Mutex::new(None),
    })
    .with_batch_config(
        BatchConfigBuilder::default()
            .with_max_queue_size(QUEUE)
            .with_scheduled_delay(Duration::from_millis(500))
            .build(),
    )
    .build();
    let sampler = match config.otel_sampler {
        TraceSampler::Ratio(r) => ratio_sampler(r),
        TraceSampler::ParentBased(r) => Sampler::ParentBased(Box::new(ratio_sampler(r))),
    };
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(sampler)
        .with_resource(
            opentelemetry_sdk::Resource::builder_empty()
                .with_service_name(config.otel_service_name.clone())
                .with_attribute(opentelemetry::KeyValue::new(
                    "service.version",
                    env!("CARGO_PKG_VERSION"),
                ))
                .build(),
        )
        .build();
    let tracer = provider.tracer("sandbox-agent");
    let _ = PROVIDER.set(provider.clone());
    ENABLED.store(true, Relaxed);
    Some((
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_tracked_inactivity(false)
            // Source locations and thread names of the daemon's own code are noise to whoever
            // reads a request's trace.
            .with_location(false)
            .with_threads(false),
        TelemetryGuard { provider },
    ))
}

fn ratio_sampler(r: f64) -> Sampler {
    if r >= 1.0 {
        Sampler::AlwaysOn
    } else if r <= 0.0 {
        Sampler::AlwaysOff
    } else {
        Sampler::TraceIdRatioBased(r)
    }
}

/// The OTLP exporter, with a WARN (at most once a minute) when an export fails.
#[derive(Debug)]
struct Warned<E> {
    inner: E,
    endpoint: String,
    last_warning: Mutex<Option<Instant>>,
}

impl<E: SpanExporter> SpanExporter for Warned<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len();
        let result = self.inner.export(batch).await;
        if let Err(e) = &result {
            let mut last = crate::sys::lock(&self.last_warning);
            if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                *last = Some(Instant::now());
                tracing::warn!(endpoint = %self.endpoint, spans = n, error = %e,
                    "cannot export traces; spans are dropped while the collector is unreachable");
            }
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// The span of one HTTP request (`Span::none()` while tracing is off): a server span named
/// `METHOD route`, child of the client's `traceparent` when it sent one.
pub fn http_span(method: &axum::http::Method, route: &str, headers: &HeaderMap) -> Span {
    if !enabled() {
        return Span::none();
    }
    let span = tracing::info_span!(
        target: TARGET,
        "http request",
        otel.name = format!("{method} {route}"),
        otel.kind = "server",
        http.request.method = %method,
        http.route = route,
        http.response.status_code = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    if headers.contains_key("traceparent") {
        let parent = TraceContextPropagator::new().extract(&Headers(headers));
        let _ = span.set_parent(parent);
    }
    span
}

/// Records the answer's status on an HTTP span.
pub fn http_done(span: &Span, status: u16) {
    if span.is_none() {
        return;
    }
    // An integer attribute, as the semantic conventions say (a `u16` would be recorded as
    // its `Debug` string: tracing-opentelemetry has no unsigned attributes).
    span.record("http.response.status_code", i64::from(status));
    if status >= 500 {
        span.record("otel.status_code", "ERROR");
    }
}

/// What an ACP request envelope says about itself, read for its span: the method, the id and
/// the trace context the client put in `params._meta` (if any).
#[derive(serde::Deserialize)]
struct RequestHead<'a> {
    method: String,
    #[serde(borrow)]
    id: &'a RawValue,
    #[serde(default)]
    params: Option<ParamsHead>,
}

#[derive(serde::Deserialize)]
struct ParamsHead {
    #[serde(default, rename = "_meta")]
    meta: Option<MetaHead>,
}

#[derive(serde::Deserialize)]
struct MetaHead {
    #[serde(default)]
    traceparent: Option<String>,
    #[serde(default)]
    tracestate: Option<String>,
}

/// The span of one ACP request from the POST (or the WebSocket frame) to the agent's answer,
/// and the envelope to send instead of `line`, with the span's context as
/// `params._meta.traceparent` (`None`: send `line` unchanged). `(None, Span::none())` while
/// traces are off and for anything but a request.
///
/// The parent: the current span (the HTTP request's, itself a child of a `traceparent` header)
/// when `header_parent`; otherwise the client's own `params._meta.traceparent` when it sent one
/// (a client that propagates context inside the envelope, as ACP clients do), else the current
/// span. A client's `_meta.tracestate` is kept only while the envelope stays in its trace.
pub fn acp_request(
    line: &[u8],
    header_parent: bool,
    server_id: &str,
    agent: &str,
) -> (Option<Bytes>, Span) {
    if !enabled() {
        return (None, Span::none());
    }
    let Ok(head) = serde_json::from_slice::<RequestHead>(line) else {
        return (None, Span::none());
    };
    let span = tracing::info_span!(
        target: TARGET,
        "acp request",
        otel.name = format!("acp {}", head.method),
        otel.kind = "client",
        rpc.system = "jsonrpc",
        rpc.method = head.method.as_str(),
        rpc.jsonrpc.request_id = request_id(head.id).as_str(),
        acp.server_id = server_id,
        acp.agent = agent,
        acp.outcome = tracing::field::Empty,
        otel.status_code = tracing::field::Empty,
    );
    let meta = head.params.and_then(|p| p.meta);
    let client_tp = meta.as_ref().and_then(|m| m.traceparent.clone());
    if !header_parent && let Some(tp) = &client_tp {
        let mut carrier: HashMap<String, String> = HashMap::new();
        carrier.insert("traceparent".into(), tp.clone());
        if let Some(ts) = meta.as_ref().and_then(|m| m.tracestate.clone()) {
            carrier.insert("tracestate".into(), ts);
        }
        let parent = TraceContextPropagator::new().extract(&carrier);
        if parent.span().span_context().is_valid() {
            let _ = span.set_parent(parent);
        }
    }
    let Some(ours) = traceparent(&span) else {
        return (None, span);
    };
    // The client's tracestate belongs to the client's trace: dropped when the agent is handed
    // another one (a header's trace, or a new root).
    let same_trace = client_tp
        .as_deref()
        .is_some_and(|tp| trace_id_of(tp).is_some() && trace_id_of(tp) == trace_id_of(&ours));
    let has_state = meta.as_ref().is_some_and(|m| m.tracestate.is_some());
    let remove: &[&str] = if has_state && !same_trace {
        &["tracestate"]
    } else {
        &[]
    };
    (with_meta(line, &[("traceparent", &ours)], remove), span)
}

/// A JSON-RPC id as an attribute: a string id without its JSON quotes, a number as written.
fn request_id(raw: &RawValue) -> String {
    match serde_json::from_str::<String>(raw.get()) {
        Ok(s) => s,
        Err(_) => raw.get().to_string(),
    }
}

/// The trace id of a W3C `traceparent` (`version-traceid-spanid-flags`).
fn trace_id_of(traceparent: &str) -> Option<&str> {
    traceparent.split('-').nth(1).filter(|t| t.len() == 32)
}

/// Records how an ACP request ended: `ok` (the agent answered), else the problem's status.
pub fn acp_done(span: &Span, outcome: &str, error: bool) {
    if span.is_none() {
        return;
    }
    span.record("acp.outcome", outcome);
    if error {
        span.record("otel.status_code", "ERROR");
    }
}

/// A span around an agent's start, an install or a process start (`Span::none()` when off).
pub fn task_span(name: &'static str, what: &str) -> Span {
    if !enabled() {
        return Span::none();
    }
    tracing::info_span!(target: TARGET, "task", otel.name = name, subject = what)
}

/// The W3C `traceparent` of `span` (`None` when it records nothing).
fn traceparent(span: &Span) -> Option<String> {
    if span.is_none() {
        return None;
    }
    let cx = span.context();
    let mut carrier: HashMap<String, String> = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    carrier.remove("traceparent")
}

/// The envelope `line` with each of `set` put into `params._meta` and each of `remove` taken out
/// of it (other `_meta` members and every other member kept byte for byte), or `None` when
/// `params` is not an object (nothing to add it to) or the line is not an object.
fn with_meta(line: &[u8], set: &[(&str, &str)], remove: &[&str]) -> Option<Bytes> {
    type Members = serde_json::Map<String, serde_json::Value>;
    let mut top: Vec<(String, Box<RawValue>)> = raw_members(line)?;
    let params = top.iter_mut().find(|(k, _)| k == "params")?;
    let mut inner = raw_members(params.1.get().as_bytes())?;
    let mut m: Members = match inner.iter().find(|(k, _)| k == "_meta") {
        Some((_, meta)) => serde_json::from_str(meta.get()).ok()?,
        None => Members::new(),
    };
    for key in remove {
        m.remove(*key);
    }
    for (key, value) in set {
        m.insert(
            (*key).to_string(),
            serde_json::Value::String((*value).to_string()),
        );
    }
    let meta = serde_json::value::to_raw_value(&m).ok()?;
    match inner.iter_mut().find(|(k, _)| k == "_meta") {
        Some((_, slot)) => *slot = meta,
        None => inner.push(("_meta".into(), meta)),
    }
    params.1 = RawValue::from_string(write_members(&inner)).ok()?;
    Some(Bytes::from(write_members(&top)))
}

/// An object's members in order, their values as written.
fn raw_members(text: &[u8]) -> Option<Vec<(String, Box<RawValue>)>> {
    struct V;
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = Vec<(String, Box<RawValue>)>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            while let Some((k, v)) = map.next_entry::<String, Box<RawValue>>()? {
                out.push((k, v));
            }
            Ok(out)
        }
    }
    let mut de = serde_json::Deserializer::from_slice(text);
    serde::de::Deserializer::deserialize_map(&mut de, V).ok()
}

fn write_members(members: &[(String, Box<RawValue>)]) -> String {
    let mut out = String::from("{");
    for (i, (k, v)) in members.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&serde_json::to_string(k).unwrap_or_default());
        out.push(':');
        out.push_str(v.get());
    }
    out.push('}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn traceparent_goes_into_params_meta_and_nothing_else_changes() {
        let line = br#"{"jsonrpc":"2.0","id":1.50,"method":"session/prompt","params":{"sessionId":"s","prompt":[{"type":"text","text":"\u00e9"}]}}"#;
        let out = with_meta(line, &[("traceparent", TP)], &[]).unwrap();
        let text = std::str::from_utf8(&out).unwrap();
        assert!(text.contains(r#""id":1.50"#), "{text}");
        assert!(text.contains(r#""text":"\u00e9""#), "{text}");
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["params"]["_meta"]["traceparent"], TP);
        assert_eq!(v["params"]["sessionId"], "s");
        assert!(!text.contains('\n'));
    }

    #[test]
    fn an_existing_meta_keeps_its_members() {
        let line = br#"{"id":"a","method":"x","params":{"_meta":{"k":1,"traceparent":"old"}}}"#;
        let v: serde_json::Value =
            serde_json::from_slice(&with_meta(line, &[("traceparent", TP)], &[]).unwrap()).unwrap();
        assert_eq!(v["params"]["_meta"]["k"], 1);
        assert_eq!(v["params"]["_meta"]["traceparent"], TP);
    }

    #[test]
    fn without_object_params_nothing_is_added() {
        assert!(with_meta(br#"{"id":1,"method":"x"}"#, &[("traceparent", TP)], &[]).is_none());
        assert!(
            with_meta(
                br#"{"id":1,"method":"x","params":[1]}"#,
                &[("traceparent", TP)],
                &[]
            )
            .is_none()
        );
    }

    #[test]
    fn a_removed_meta_member_is_gone_and_the_others_stay() {
        let line = br#"{"id":1,"method":"x","params":{"_meta":{"tracestate":"k=v","a":2}}}"#;
        let v: serde_json::Value = serde_json::from_slice(
            &with_meta(line, &[("traceparent", TP)], &["tracestate"]).unwrap(),
        )
        .unwrap();
        assert_eq!(
            v["params"]["_meta"],
            serde_json::json!({"a": 2, "traceparent": TP})
        );
    }

    #[test]
    fn string_ids_lose_their_quotes_and_numbers_stay_as_written() {
        let id = |s: &str| request_id(&RawValue::from_string(s.to_string()).unwrap());
        assert_eq!(id(r#""abc""#), "abc");
        assert_eq!(id("7"), "7");
        assert_eq!(id("1.50"), "1.50");
    }
}
