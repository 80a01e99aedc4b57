//! `/v1/acp` and `/v1/acp/{serverId}` (spec 002 §3): content negotiation, envelope parsing and SSE
//! framing on the HTTP side of the proxy; everything else is `acp::AcpService`.

use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;

use super::{AppState, Problem};
use crate::acp::events::KEEPALIVE_FRAME;
use crate::acp::{self, AcpError, Delivered, Kind, Next, Subscription};

pub fn routes() -> Router<AppState> {
    Router::new().route("/v1/acp", get(list)).route(
        "/v1/acp/{server_id}",
        get(stream).post(post_message).delete(delete),
    )
}

async fn list(State(st): State<AppState>) -> Response {
    axum::Json(json!({ "servers": st.acp.list().await })).into_response()
}

/// Envelopes larger than this are parsed off the runtime thread (parsing time grows with size).
const LARGE_ENVELOPE: usize = 256 * 1024;

#[derive(serde::Deserialize)]
struct PostQuery {
    agent: Option<String>,
}

async fn post_message(
    State(st): State<AppState>,
    Path(server_id): Path<String>,
    Query(query): Query<PostQuery>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if let Err(e) = acp::validate_server_id(&server_id) {
        return Problem::from(e).into_response();
    }
    if !is_json_content_type(&headers) {
        return Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "POST a JSON-RPC object with Content-Type: application/json",
        )
        .with("serverId", server_id)
        .into_response();
    }
    if !accepts(&headers, "application", "json") {
        return Problem::new(
            StatusCode::NOT_ACCEPTABLE,
            "the answer is application/json, which the Accept header excludes",
        )
        .with("serverId", server_id)
        .into_response();
    }
    let (body, inflight) = match read_body(&st, &headers, body).await {
        Ok(b) => b,
        Err(p) => return p.with("serverId", server_id).into_response(),
    };
    // The daemon runs one runtime thread: a large envelope (an image, a big file) is parsed on the
    // blocking pool so that other requests and streams go on meanwhile.
    let parsed = if body.len() > LARGE_ENVELOPE {
        tokio::task::spawn_blocking(move || acp::jsonrpc::parse_envelope(body))
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
    } else {
        acp::jsonrpc::parse_envelope(body)
    };
    let envelope = match parsed {
        Ok(e) => e,
        Err(e) => {
            return Problem::from(AcpError::from(e))
                .with("serverId", server_id)
                .into_response();
        }
    };
    // The body is now the envelope's line; if it has to wait for the agent, the stdin queue's
    // budget accounts for it from here on.
    drop(inflight);
    let prefer = Prefer::parse(&headers);
    let jsonrpc_errors = prefer.jsonrpc_errors || st.config.jsonrpc_errors;
    let raw_id = match (&envelope.kind, jsonrpc_errors) {
        (Kind::Request { raw_id, .. }, true) => Some(raw_id.clone()),
        _ => None,
    };
    let agent = query.agent.as_deref().filter(|a| !a.is_empty());
    match st
        .acp
        .post(&server_id, agent, envelope, prefer.respond_async)
        .await
    {
        Ok(Delivered::Response(line)) => {
            let mut resp = Response::new(Body::from(line));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            resp
        }
        Ok(Delivered::Accepted) => StatusCode::ACCEPTED.into_response(),
        Err(e) => {
            let problem = Problem::from(e);
            match raw_id {
                Some(id) if problem.status.is_server_error() => {
                    // The npm SDK treats a non-2xx answer as fatal but handles a JSON-RPC error.
                    let body = json!({
                        "jsonrpc": "2.0",
                        "id": id,
                        "error": {
                            "code": -32603,
                            "message": problem.title,
                            "data": problem.body(),
                        }
                    });
                    tracing::warn!(server_id, status = problem.status.as_u16(),
                        detail = %problem.detail, "request failed; answered as a JSON-RPC error");
                    axum::Json(body).into_response()
                }
                _ => problem.into_response(),
            }
        }
    }
}

/// Receives a POST body within the body limit (413) and the daemon-wide budget of ACP bodies
/// being received (`--acp-inflight-bytes`, 503 with `Retry-After`): a declared length is reserved
/// before anything is read, a chunked body as it arrives, so many slow large uploads cannot
/// together hold more than the budget.
async fn read_body(
    st: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Bytes, acp::caps::Reservation), Problem> {
    use futures_util::StreamExt;
    let limit = st.config.body_limit;
    let budget = st.acp.inflight_budget().clone();
    let full = || {
        Problem::from(AcpError::Capacity {
            what: "ACP request body bytes being received",
            limit: budget.limit(),
            server_id: None,
        })
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let mut reserved = 0u64;
    let mut held = acp::caps::Reservation::default();
    if let Some(n) = declared {
        if n > limit {
            return Err(Problem::payload_too_large(limit));
        }
        if !held.grow(&budget, n) {
            return Err(full());
        }
        reserved = n;
    }
    let mut buf = bytes::BytesMut::with_capacity(declared.unwrap_or(0) as usize);
    let mut chunks = body.into_data_stream();
    while let Some(data) = chunks.next().await {
        let data = data.map_err(|e| Problem::bad_request(format!("cannot read the body: {e}")))?;
        let total = (buf.len() + data.len()) as u64;
        if total > limit {
            return Err(Problem::payload_too_large(limit));
        }
        if total > reserved {
            if !held.grow(&budget, total - reserved) {
                return Err(full());
            }
            reserved = total;
        }
        buf.extend_from_slice(&data);
    }
    Ok((buf.freeze(), held))
}

async fn stream(
    State(st): State<AppState>,
    Path(server_id): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Err(e) = acp::validate_server_id(&server_id) {
        return Problem::from(e).into_response();
    }
    if !accepts(&headers, "text", "event-stream") {
        return Problem::new(
            StatusCode::NOT_ACCEPTABLE,
            "the stream is text/event-stream, which the Accept header excludes",
        )
        .with("serverId", server_id)
        .into_response();
    }
    let last_event_id = match headers.get("last-event-id") {
        None => None,
        Some(v) => match v.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok()) {
            Some(n) => Some(n),
            None => {
                return Problem::bad_request("Last-Event-ID must be a non-negative integer")
                    .with("serverId", server_id)
                    .into_response();
            }
        },
    };
    let sub = match st.acp.subscribe(&server_id, last_event_id) {
        Ok(s) => s,
        Err(e) => return Problem::from(e).into_response(),
    };
    let body = Body::from_stream(sse_frames(
        sub,
        server_id,
        st.config.keepalive,
        st.shutdown.clone(),
    ));
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // Proxies in front of the sandbox must not buffer the stream.
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

/// The frames of one subscription, a keepalive comment whenever `keepalive` passes without one,
/// ending when the log ends, the subscriber is cut off, or the daemon shuts down.
fn sse_frames(
    sub: Subscription,
    server_id: String,
    keepalive: Duration,
    shutdown: tokio_util::sync::CancellationToken,
) -> impl futures_util::Stream<Item = Result<Bytes, Infallible>> + Send {
    let keepalive = keepalive.max(Duration::from_millis(10));
    let next_ka = tokio::time::Instant::now() + keepalive;
    futures_util::stream::unfold(
        Some((sub, next_ka, shutdown, server_id)),
        move |state| async move {
            let (sub, mut next_ka, shutdown, server_id) = state?;
            let frame = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return None,
                next = sub.next() => match next {
                    Next::Frames(b) => b,
                    Next::End => return None,
                    Next::CutOff => {
                        tracing::info!(%server_id, "an SSE subscriber fell behind and was disconnected");
                        return None;
                    }
                },
                _ = tokio::time::sleep_until(next_ka) => Bytes::from_static(KEEPALIVE_FRAME),
            };
            next_ka = tokio::time::Instant::now() + keepalive;
            Some((Ok(frame), Some((sub, next_ka, shutdown, server_id))))
        },
    )
}

async fn delete(State(st): State<AppState>, Path(server_id): Path<String>) -> Response {
    if let Err(e) = acp::validate_server_id(&server_id) {
        return Problem::from(e).into_response();
    }
    st.acp.delete(&server_id);
    StatusCode::NO_CONTENT.into_response()
}

fn is_json_content_type(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
}

/// True when the Accept header (absent means anything) admits `kind/sub`.
fn accepts(headers: &HeaderMap, kind: &str, sub: &str) -> bool {
    let mut values = headers.get_all(header::ACCEPT).iter().peekable();
    if values.peek().is_none() {
        return true;
    }
    values
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|range| {
            let mut parts = range.split(';');
            let media = parts.next().unwrap_or("").trim();
            let refused = parts.any(|p| {
                let p = p.trim();
                p.strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    .is_some_and(|q| q <= 0.0)
            });
            if refused {
                return false;
            }
            let (t, s) = media.split_once('/').unwrap_or((media, ""));
            (t == "*" && s == "*")
                || (t.eq_ignore_ascii_case(kind) && (s == "*" || s.eq_ignore_ascii_case(sub)))
        })
}

/// The `Prefer` preferences this API honours (RFC 7240).
#[derive(Default)]
struct Prefer {
    respond_async: bool,
    jsonrpc_errors: bool,
}

impl Prefer {
    fn parse(headers: &HeaderMap) -> Prefer {
        let mut p = Prefer::default();
        for v in headers
            .get_all("prefer")
            .iter()
            .filter_map(|v| v.to_str().ok())
        {
            for pref in v.split(',') {
                let name = pref.split([';', '=']).next().unwrap_or("").trim();
                if name.eq_ignore_ascii_case("respond-async") {
                    p.respond_async = true;
                } else if name.eq_ignore_ascii_case("jsonrpc-errors") {
                    p.jsonrpc_errors = true;
                }
            }
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    fn check_accept(accept: Option<&'static str>, json: bool, sse: bool) {
        let h = headers(&accept.map(|a| vec![("accept", a)]).unwrap_or_default());
        assert_eq!(accepts(&h, "application", "json"), json, "{accept:?} json");
        assert_eq!(accepts(&h, "text", "event-stream"), sse, "{accept:?} sse");
    }

    #[test]
    fn accept_ranges() {
        check_accept(None, true, true);
        check_accept(Some("*/*"), true, true);
        check_accept(Some("application/json"), true, false);
        check_accept(Some("text/event-stream"), false, true);
        check_accept(Some("text/*"), false, true);
        check_accept(Some("application/json, text/event-stream"), true, true);
        check_accept(Some("Application/JSON;q=0.5"), true, false);
        check_accept(Some("application/json;q=0, */*;q=0"), false, false);
        check_accept(Some("text/html"), false, false);
    }

    #[test]
    fn content_type_and_prefer() {
        assert!(is_json_content_type(&headers(&[(
            "content-type",
            "application/json; charset=utf-8"
        )])));
        assert!(!is_json_content_type(&headers(&[(
            "content-type",
            "application/jsonl"
        )])));
        assert!(!is_json_content_type(&headers(&[])));
        let p = Prefer::parse(&headers(&[("prefer", "wait=5, Respond-Async")]));
        assert!(p.respond_async && !p.jsonrpc_errors);
        let p = Prefer::parse(&headers(&[
            ("prefer", "return=minimal"),
            ("prefer", "jsonrpc-errors"),
        ]));
        assert!(!p.respond_async && p.jsonrpc_errors);
    }
}
