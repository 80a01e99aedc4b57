//! OpenTelemetry traces through the real binary: a receiver in the test decodes the OTLP/HTTP
//! protobuf export (the official messages, `opentelemetry-proto`) and checks the span tree of a
//! prompt — the client's `traceparent` as parent of the HTTP span, the ACP request span under it
//! with its attributes, and the `_meta.traceparent` the mock agent received naming that span.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::{Value, json};

use crate::support::{Daemon, eventually_async};

#[derive(Default)]
struct Received {
    spans: Vec<Span>,
    service_names: Vec<String>,
    content_types: Vec<String>,
}

type Shared = Arc<Mutex<Received>>;

async fn export(
    State(seen): State<Shared>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> axum::response::Response {
    let req = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf export");
    let mut seen = seen.lock().unwrap();
    if let Some(ct) = headers.get("content-type").and_then(|v| v.to_str().ok()) {
        seen.content_types.push(ct.to_string());
    }
    for rs in req.resource_spans {
        if let Some(r) = &rs.resource {
            for kv in &r.attributes {
                if kv.key == "service.name"
                    && let Some(AnyValue::StringValue(s)) =
                        kv.value.as_ref().and_then(|v| v.value.clone())
                {
                    seen.service_names.push(s);
                }
            }
        }
        for ss in rs.scope_spans {
            seen.spans.extend(ss.spans);
        }
    }
    let mut resp = axum::response::Response::new(axum::body::Body::from(
        ExportTraceServiceResponse::default().encode_to_vec(),
    ));
    resp.headers_mut().insert(
        "content-type",
        axum::http::HeaderValue::from_static("application/x-protobuf"),
    );
    resp
}

/// An OTLP/HTTP receiver on loopback: its base URL and what it received.
async fn receiver() -> (String, Shared) {
    let seen: Shared = Arc::default();
    let app = axum::Router::new()
        .route("/v1/traces", axum::routing::post(export))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), seen)
}

fn attr(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            AnyValue::StringValue(s) => Some(s.clone()),
            AnyValue::IntValue(i) => Some(i.to_string()),
            AnyValue::BoolValue(b) => Some(b.to_string()),
            AnyValue::DoubleValue(d) => Some(d.to_string()),
            _ => None,
        })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

async fn post(d: &Daemon, path: &str, body: Value, traceparent: Option<&str>) -> Value {
    let mut req = d
        .client()
        .post(d.url(path))
        .header("content-type", "application/json")
        .json(&body);
    if let Some(tp) = traceparent {
        req = req.header("traceparent", tp);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

#[tokio::test]
async fn a_prompt_is_one_trace_from_the_client_to_the_agent() {
    let (url, seen) = receiver().await;
    let d = Daemon::builder()
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &url)
        .env("OTEL_SERVICE_NAME", "sandbox-agent-under-test")
        .env("OTEL_TRACES_SAMPLER", "parentbased_always_on")
        .start();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}});
    post(&d, "/v1/acp/t1?agent=mock", init, None).await;
    let new = json!({"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {"cwd": "/", "mcpServers": []}});
    let session = post(&d, "/v1/acp/t1", new, None).await["result"]["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    let client_tp = format!("00-{TRACE}-{CLIENT_SPAN}-01");
    let prompt = json!({"jsonrpc": "2.0", "id": 3, "method": "session/prompt",
        "params": {"sessionId": session, "prompt": [{"type": "text", "text": "hello"}]}});
    let answer = post(&d, "/v1/acp/t1", prompt, Some(&client_tp)).await;
    // What the agent received: the trace continues, under a span of the daemon's.
    let received = answer["result"]["_meta"]["received"]["traceparent"]
        .as_str()
        .unwrap_or_else(|| panic!("the mock saw no _meta.traceparent: {answer}"))
        .to_string();
    let parts: Vec<&str> = received.split('-').collect();
    assert_eq!(parts.len(), 4, "{received}");
    assert_eq!(
        parts[1], TRACE,
        "the agent's traceparent keeps the client's trace"
    );
    assert_ne!(parts[2], CLIENT_SPAN, "its parent is the daemon's span");
    assert_eq!(parts[3], "01", "sampled");
    let agent_parent = parts[2].to_string();

    let (http, acp) = eventually_async(Duration::from_secs(30), "the prompt's spans", || {
        let seen = seen.clone();
        async move {
            let seen = seen.lock().unwrap();
            let ours: Vec<&Span> = seen
                .spans
                .iter()
                .filter(|s| hex(&s.trace_id) == TRACE)
                .collect();
            let http = ours.iter().find(|s| s.name == "POST /v1/acp/{serverId}")?;
            let acp = ours.iter().find(|s| s.name == "acp session/prompt")?;
            Some(((*http).clone(), (*acp).clone()))
        }
    })
    .await;
    // The HTTP span continues the client's span; the ACP span is its child; the agent was
    // handed the ACP span's context.
    assert_eq!(hex(&http.parent_span_id), CLIENT_SPAN);
    assert_eq!(http.kind, 2, "server span");
    assert_eq!(
        attr(&http, "http.route").as_deref(),
        Some("/v1/acp/{serverId}")
    );
    assert_eq!(attr(&http, "http.request.method").as_deref(), Some("POST"));
    assert_eq!(
        attr(&http, "http.response.status_code").as_deref(),
        Some("200")
    );
    assert_eq!(acp.parent_span_id, http.span_id);
    assert_eq!(hex(&acp.span_id), agent_parent);
    assert_eq!(attr(&acp, "rpc.method").as_deref(), Some("session/prompt"));
    assert_eq!(attr(&acp, "acp.server_id").as_deref(), Some("t1"));
    assert_eq!(attr(&acp, "rpc.jsonrpc.request_id").as_deref(), Some("3"));
    assert_eq!(attr(&acp, "acp.outcome").as_deref(), Some("ok"));
    assert!(acp.end_time_unix_nano > acp.start_time_unix_nano);

    let seen = seen.lock().unwrap();
    assert!(
        seen.service_names
            .iter()
            .all(|s| s == "sandbox-agent-under-test"),
        "{:?}",
        seen.service_names
    );
    assert!(
        seen.content_types
            .iter()
            .all(|c| c == "application/x-protobuf"),
        "{:?}",
        seen.content_types
    );
    // The first request came without a traceparent: a trace of its own, with its agent start.
    let root = seen
        .spans
        .iter()
        .find(|s| s.name == "acp initialize")
        .expect("the initialize span");
    assert_ne!(hex(&root.trace_id), TRACE);
    assert!(
        seen.spans
            .iter()
            .any(|s| s.name == "agent start" && s.trace_id == root.trace_id),
        "the agent's start is in the first request's trace"
    );
}

#[tokio::test]
async fn without_a_collector_requests_go_on_and_the_daemon_warns() {
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let d = Daemon::builder()
        .arg("--otlp-endpoint")
        .arg(format!("http://127.0.0.1:{port}"))
        .start();
    for i in 0..20 {
        let init = json!({"jsonrpc": "2.0", "id": i, "method": "initialize", "params": {"protocolVersion": 1}});
        post(&d, "/v1/acp/dead?agent=mock", init, None).await;
    }
    eventually_async(Duration::from_secs(30), "the export warning", || async {
        d.stderr().contains("cannot export traces").then_some(())
    })
    .await;
    // Still answering.
    let r = d.client().get(d.url("/v1/health")).send().await.unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn traces_are_off_by_default_and_the_envelope_is_untouched() {
    let d = Daemon::builder().start();
    let echo = json!({"jsonrpc": "2.0", "id": 1, "method": "_mock/echo", "params": {"a": 1}});
    let answer = post(
        &d,
        "/v1/acp/off?agent=mock",
        echo,
        Some(&format!("00-{TRACE}-{CLIENT_SPAN}-01")),
    )
    .await;
    assert_eq!(answer["result"], json!({"a": 1}));
}

/// The attribute's value as sent: to tell an integer from a string.
fn value(span: &Span, key: &str) -> Option<AnyValue> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.clone())
}

const OTHER_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const META_SPAN: &str = "b7ad6b7169203331";

/// Every face that sends envelopes (the POST route, the RFD transport, the WebSocket) makes an
/// `acp <method>` span naming the instance's agent, and hands the agent its context; a client's
/// own `_meta.traceparent` is the parent when no header says otherwise, and its tracestate
/// stays only in its own trace.
#[tokio::test]
async fn every_face_traces_its_envelopes_and_keeps_the_clients_context() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    let (url, seen) = receiver().await;
    let d = Daemon::builder()
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &url)
        .env("OTEL_TRACES_SAMPLER", "parentbased_always_on")
        .start();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}});
    post(&d, "/v1/acp/f1?agent=mock", init.clone(), None).await;

    // 1. A later POST (no `?agent=`), with a string id and the client's context in `_meta` only.
    let meta_tp = format!("00-{OTHER_TRACE}-{META_SPAN}-01");
    let echo = json!({"jsonrpc": "2.0", "id": "req-7", "method": "_mock/echo",
        "params": {"_meta": {"traceparent": meta_tp, "tracestate": "vendor=1"}, "n": 1}});
    let answer = post(&d, "/v1/acp/f1", echo, None).await;
    let got = &answer["result"]["_meta"];
    let tp = got["traceparent"]
        .as_str()
        .expect("a traceparent for the agent");
    assert_eq!(tp.split('-').nth(1), Some(OTHER_TRACE), "{answer}");
    assert_ne!(
        tp.split('-').nth(2),
        Some(META_SPAN),
        "under the daemon's span"
    );
    assert_eq!(got["tracestate"], "vendor=1", "same trace: tracestate kept");
    assert_eq!(answer["result"]["n"], 1);

    // 2. A header's trace wins over `_meta`'s, and the client's tracestate is then dropped.
    let header_tp = format!("00-{TRACE}-{CLIENT_SPAN}-01");
    let echo = json!({"jsonrpc": "2.0", "id": 8, "method": "_mock/echo",
        "params": {"_meta": {"traceparent": meta_tp, "tracestate": "vendor=1"}}});
    let answer = post(&d, "/v1/acp/f1", echo, Some(&header_tp)).await;
    let got = &answer["result"]["_meta"];
    assert_eq!(
        got["traceparent"]
            .as_str()
            .and_then(|t| t.split('-').nth(1)),
        Some(TRACE),
        "{answer}"
    );
    assert!(got.get("tracestate").is_none(), "{answer}");

    // 3. The RFD transport's POST.
    let resp = d
        .client()
        .post(d.url("/v1/agents/mock/acp"))
        .header("content-type", "application/json")
        .json(&init)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let rfd_server = d
        .client()
        .get(d.url("/v1/acp"))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    let rfd_server = rfd_server["servers"]
        .as_array()
        .and_then(|s| {
            s.iter()
                .map(|x| x["serverId"].as_str().unwrap_or_default().to_string())
                .find(|id| id != "f1")
        })
        .expect("the RFD connection's instance");

    // 4. The WebSocket: an echo whose `_meta.traceparent` names the client's span.
    let ws_url = d.url("/v1/acp/f1").replacen("http://", "ws://", 1);
    let (mut ws, _) = tokio_tungstenite::connect_async(ws_url).await.unwrap();
    let echo = json!({"jsonrpc": "2.0", "id": 9, "method": "_mock/echo",
        "params": {"_meta": {"traceparent": meta_tp}}});
    ws.send(Message::Text(echo.to_string().into()))
        .await
        .unwrap();
    let ws_answer: Value = loop {
        let Some(Ok(Message::Text(t))) = ws.next().await else {
            panic!("the WebSocket ended before the echo's answer");
        };
        let v: Value = serde_json::from_str(&t).unwrap();
        if v["id"] == 9 {
            break v;
        }
    };
    let ws_tp = ws_answer["result"]["_meta"]["traceparent"]
        .as_str()
        .expect("the agent got a traceparent over the WebSocket")
        .to_string();
    assert_eq!(ws_tp.split('-').nth(1), Some(OTHER_TRACE));

    let spans = eventually_async(Duration::from_secs(30), "the spans of every face", || {
        let seen = seen.clone();
        let rfd_server = rfd_server.clone();
        async move {
            let seen = seen.lock().unwrap();
            let echoes: Vec<Span> = seen
                .spans
                .iter()
                .filter(|s| s.name == "acp _mock/echo")
                .cloned()
                .collect();
            let rfd = seen.spans.iter().find(|s| {
                s.name == "acp initialize"
                    && attr(s, "acp.server_id").as_deref() == Some(rfd_server.as_str())
            })?;
            let rfd_http = seen
                .spans
                .iter()
                .find(|s| s.name == "POST /v1/agents/{agent}/acp")?;
            (echoes.len() >= 3).then(|| (echoes, rfd.clone(), rfd_http.clone(), seen.spans.clone()))
        }
    })
    .await;
    let (echoes, rfd, rfd_http, all) = spans;
    let by_id = |id: &str| {
        echoes
            .iter()
            .find(|s| attr(s, "rpc.jsonrpc.request_id").as_deref() == Some(id))
            .unwrap_or_else(|| panic!("no echo span with request id {id}"))
    };
    // The string id has no quotes; the agent is named though the POST did not name it.
    let first = by_id("req-7");
    assert_eq!(attr(first, "acp.agent").as_deref(), Some("mock"));
    assert_eq!(hex(&first.trace_id), OTHER_TRACE);
    assert_eq!(
        hex(&first.parent_span_id),
        META_SPAN,
        "the client's span is the parent"
    );
    assert_eq!(hex(&by_id("8").trace_id), TRACE);
    let ws_span = by_id("9");
    assert_eq!(attr(ws_span, "acp.agent").as_deref(), Some("mock"));
    assert_eq!(attr(ws_span, "acp.outcome").as_deref(), Some("sent"));
    assert_eq!(
        ws_tp.split('-').nth(2),
        Some(hex(&ws_span.span_id).as_str())
    );
    // The RFD POST: its ACP span under its HTTP span, with the agent.
    assert_eq!(rfd.parent_span_id, rfd_http.span_id);
    assert_eq!(attr(&rfd, "acp.agent").as_deref(), Some("mock"));
    // The status is an integer attribute, and no span carries code locations or thread names.
    let http = all
        .iter()
        .find(|s| s.name == "POST /v1/acp/{serverId}")
        .expect("an HTTP span");
    assert_eq!(
        value(http, "http.response.status_code"),
        Some(AnyValue::IntValue(200))
    );
    for s in &all {
        for kv in &s.attributes {
            assert!(
                !kv.key.starts_with("code.") && !kv.key.starts_with("thread."),
                "span {} carries {}",
                s.name,
                kv.key
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spans_of_the_last_requests_before_a_reload_are_exported_not_dropped() {
    let (url, seen) = receiver().await;
    let mut d = Daemon::builder()
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &url)
        .env("OTEL_TRACES_SAMPLER", "parentbased_always_on")
        .start();
    // A traced request, then at once a reload: its span is still in the exporter's batch (sent
    // every 500 ms), which the exec would drop.
    let trace = "5cf92f3577b34da6a3ce929d0e0e4737";
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}});
    post(
        &d,
        "/v1/acp/r1?agent=mock",
        init,
        Some(&format!("00-{trace}-{CLIENT_SPAN}-01")),
    )
    .await;
    crate::reload::reload(&mut d);
    eventually_async(Duration::from_secs(10), "the span exported", || async {
        seen.lock()
            .unwrap()
            .spans
            .iter()
            .any(|s| hex(&s.trace_id) == trace)
            .then_some(())
    })
    .await;
}
