//! `/v1/acp` and `/v1/acp/{serverId}` (spec 002 §3): content negotiation, envelope parsing and SSE
//! framing on the HTTP side of the proxy; everything else is `acp::AcpService`.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{AppState, Problem};
use crate::acp::events::KEEPALIVE_FRAME;
use crate::acp::{self, AcpError, Delivered, Kind, Next, Subscription};

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(stream, post_message, delete))
        // The WebSocket of `stream` over HTTP/2; its GET documents it (openapi-exempt: CONNECT)
        .route("/v1/acp/{serverId}", super::ws::on_connect(stream))
}

/// `GET /v1/acp`: every instance, sorted by serverId.
#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct ServerList {
    servers: Vec<super::wire::acp::ServerInfo>,
    /// Present when `limit` was given and the page is full: pass it as `cursor` for the next.
    #[serde(rename = "nextCursor", skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

/// One JSON-RPC 2.0 message (request, notification or response), passed through untouched: the
/// proxy reads only `id` and `method` to route it and never interprets ACP methods or params.
#[derive(utoipa::ToSchema)]
#[schema(as = JsonRpcMessage)]
#[allow(dead_code)] // only its schema is used: envelopes are forwarded as bytes
pub(super) struct JsonRpcMessage {
    #[schema(value_type = String, pattern = "^2\\.0$", example = "2.0")]
    jsonrpc: String,
    /// Present on requests and responses: a number or a string, echoed unchanged.
    #[schema(value_type = Object, nullable = false, required = false)]
    id: Option<serde_json::Value>,
    /// Present on requests and notifications.
    #[schema(nullable = false)]
    method: Option<String>,
    #[schema(value_type = Object, nullable = false, required = false)]
    params: Option<serde_json::Value>,
    #[schema(value_type = Object, nullable = false, required = false)]
    result: Option<serde_json::Value>,
    #[schema(value_type = Object, nullable = false, required = false)]
    error: Option<serde_json::Value>,
}

/// Every agent instance with its process status and figures.
#[utoipa::path(
    get,
    path = "/v1/acp",
    operation_id = "listAcpServers",
    tag = "acp",
    params(
        ("limit" = Option<u32>, Query, description = "At most this many instances (1..=1000); \
            without it, every instance", minimum = 1, maximum = 1000),
        ("cursor" = Option<String>, Query, description = "The `nextCursor` of the page before, \
            unchanged"),
    ),
    responses(
        (status = 200, description = "Every instance (or one page), sorted by serverId", body = ServerList),
        (status = 400, description = "A bad `limit` or `cursor`"),
    ),
)]
async fn list(
    State(st): State<AppState>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Response {
    let page = match super::paging::Page::from_query(&q) {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    let mut servers: Vec<super::wire::acp::ServerInfo> = st
        .acp
        .page(page.after.as_deref(), page.take())
        .await
        .into_iter()
        .map(Into::into)
        .collect();
    let next_cursor = page.next(servers.len(), servers.last().map(|s| s.server_id.as_str()));
    let mut bases = st
        .workspace
        .sessions
        .of_listed(servers.iter().map(|s| s.server_id.as_str()));
    for s in servers.iter_mut() {
        s.opencode = st
            .opencode
            .session_of_server(&s.server_id)
            .map(|(session_id, title)| super::wire::acp::OpenCodeLink { session_id, title });
        if let Some(list) = bases.remove(&s.server_id) {
            s.sessions = list
                .into_iter()
                .map(|b| super::wire::acp::SessionGitBase {
                    session_id: b.session_id,
                    cwd: b.cwd,
                    git_base: b.git_base,
                })
                .collect();
        }
    }
    axum::Json(ServerList {
        servers,
        next_cursor,
    })
    .into_response()
}

/// Envelopes larger than this are parsed off the runtime thread (parsing time grows with size).
const LARGE_ENVELOPE: usize = 256 * 1024;

/// On a POST answered with the agent's response: the id of the last event of the serverId's log
/// when the response was read (docs/acp.md, "Updates before the answer").
pub const LAST_EVENT_ID: header::HeaderName =
    header::HeaderName::from_static("sandbox-agent-last-event-id");

#[derive(serde::Deserialize)]
struct PostQuery {
    agent: Option<String>,
}

/// Sends one JSON-RPC message to the agent of `serverId`, starting (and if needed installing) the
/// agent on the first POST. A request is answered with the agent's response; a notification or
/// a response to an agent's request with 202 once written to the agent's stdin.
#[utoipa::path(
    post,
    path = "/v1/acp/{serverId}",
    operation_id = "postAcpMessage",
    tag = "acp",
    params(
        ("serverId" = String, Path, description = "Client-chosen instance id",
            pattern = "^[A-Za-z0-9._-]{1,128}$", min_length = 1, max_length = 128, example = "s1"),
        ("agent" = Option<String>, Query, description = "The agent to start (e.g. `mock`, \
            `claude`); needed on the first POST to a serverId, and must match on later ones. \
            An empty value counts as absent.", example = "mock"),
        ("Prefer" = Option<String>, Header, description = "RFC 7240 preferences: \
            `respond-async` answers a request 202 at once (its response goes to the SSE stream); \
            `jsonrpc-errors` answers an agent failure or timeout on a request with 200 and a \
            JSON-RPC error object (`code` -32603, `data` the problem) instead of 502/504.",
            example = "respond-async"),
    ),
    request_body(content = JsonRpcMessage, content_type = "application/json",
        description = "Exactly one JSON-RPC 2.0 object (no batches). `Content-Type` must be \
            `application/json` (parameters allowed).",
        example = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": 1, "clientCapabilities": {}}})),
    responses(
        (status = 200, description = "The agent's response to the request, its `id` unchanged \
            (or, with `jsonrpc-errors`, a JSON-RPC error object)", body = JsonRpcMessage,
            headers(("Sandbox-Agent-Last-Event-Id" = u64, description = "The id of the last \
                event of this serverId's log when the agent's response was read: everything the \
                agent wrote before its response (the prompt's `session/update`s) is on the SSE \
                stream at or below this id, so a client that has read up to it has every update \
                that preceded the answer. Absent on JSON-RPC errors made by the daemon.")),
            example = json!({"jsonrpc": "2.0", "id": 1, "result": {"protocolVersion": 1,
                "agentCapabilities": {}, "agentInfo": {"name": "mock"}, "authMethods": []}})),
        (status = 202, description = "A notification or a response was written to the agent, \
            or `Prefer: respond-async` was given; no body"),
        (status = 400, description = "Invalid serverId, missing or unknown `agent`, a body that \
            is not one JSON-RPC object (unparseable, not an object, a batch)",
            body = super::openapi::ProblemSchema, content_type = "application/problem+json",
            example = json!({"type": "urn:sandbox-agent:problem:unknown-agent",
                "title": "Unknown Agent", "status": 400,
                "detail": "unknown agent `nope`", "agent": "nope"})),
        (status = 404, description = "The instance was deleted while it was starting"),
        (status = 406, description = "`Accept` excludes `application/json`"),
        (status = 409, description = "The serverId is bound to another agent (Agent Mismatch), \
            a request with the same id is still in flight (Duplicate Request Id), or the agent \
            is not installed and `--require-preinstall` is set (`installCommand`)"),
        (status = 415, description = "`Content-Type` is not `application/json`"),
        (status = 502, description = "The agent is gone (exited, killed, failed to start or to \
            install); `exitCode`, `signal`, `exitReason`, `stderrTail` say how"),
        (status = 504, description = "The agent did not answer within the request timeout; its \
            late answer goes to the SSE stream (`timeoutMs`)"),
    )
)]
async fn post_message(
    State(st): State<AppState>,
    Path(server_id): Path<String>,
    Query(query): Query<PostQuery>,
    req: axum::extract::Request,
) -> Response {
    // The request taken whole: a `HeaderMap` extractor would clone the headers.
    let (parts, body) = req.into_parts();
    let headers = &parts.headers;
    if let Err(e) = acp::validate_server_id(&server_id) {
        return Problem::from(e).into_response();
    }
    if !is_json_content_type(headers) {
        return Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "POST a JSON-RPC object with Content-Type: application/json",
        )
        .with("serverId", server_id)
        .into_response();
    }
    if !accepts(headers, "application", "json") {
        return Problem::new(
            StatusCode::NOT_ACCEPTABLE,
            "the answer is application/json, which the Accept header excludes",
        )
        .with("serverId", server_id)
        .into_response();
    }
    let (body, inflight) = match read_body(&st, headers, body).await {
        Ok(b) => b,
        Err(p) => return p.with("serverId", server_id).into_response(),
    };
    // The daemon runs one runtime thread: a large envelope (an image, a big file) is parsed on the
    // blocking pool so that other requests and streams go on meanwhile.
    let parsed = if body.len() > LARGE_ENVELOPE {
        crate::sys::blocking(move || acp::jsonrpc::parse_envelope(body)).await
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
    let prefer = Prefer::parse(headers);
    let jsonrpc_errors = prefer.jsonrpc_errors || st.config.jsonrpc_errors;
    let raw_id = match (&envelope.kind, jsonrpc_errors) {
        (Kind::Request { raw_id, .. }, true) => Some(raw_id.clone()),
        _ => None,
    };
    let agent = query.agent.as_deref().filter(|a| !a.is_empty());
    // `gitBase`: a session/new or session/load whose cwd is in a repository records its HEAD as
    // of now, before the agent can change anything.
    let mut session_base = match &envelope.kind {
        Kind::Request { .. } => match crate::workspace::sessions::watch(&envelope.line) {
            Some(w) => st.workspace.git.head_of(&w.cwd).await.map(|head| (w, head)),
            None => None,
        },
        _ => None,
    };
    // With `Prefer: respond-async` the answer goes to the stream, not to this request: an
    // observer of the instance records it (the instance made first, as the POST would).
    let mut observed = None;
    if prefer.respond_async
        && let (Some((w, head)), Kind::Request { key, .. }) = (session_base.take(), &envelope.kind)
        && st.acp.open(&server_id, agent).is_ok()
        && crate::workspace::sessions::record_on_answer(
            &st.workspace,
            &st.acp,
            &server_id,
            key,
            w,
            head,
        )
    {
        observed = Some(key.clone());
    }
    let header_parent = headers.contains_key("traceparent");
    let posted = super::trace::post_traced(
        &st,
        &server_id,
        agent,
        envelope,
        prefer.respond_async,
        header_parent,
    )
    .await;
    if let (Some(key), Err(_)) = (&observed, &posted) {
        st.acp.forget_answer_to(&server_id, key);
    }
    match posted {
        Ok(Delivered::Response {
            line,
            last_event_id,
        }) => {
            if let Some((w, head)) = session_base
                && let Some((session_id, cwd)) =
                    crate::workspace::sessions::answered_session(w, &line)
            {
                st.workspace.sessions.record(
                    &server_id,
                    crate::workspace::sessions::SessionBase {
                        session_id,
                        cwd,
                        git_base: head,
                    },
                );
            }
            let mut resp = Response::new(Body::from(line));
            let h = resp.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            h.insert(LAST_EVENT_ID, HeaderValue::from(last_event_id));
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
/// together hold more than the budget; a body that stalls for `--idle-timeout` is 408.
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
            crate::metrics::refused(crate::metrics::Limit::BodyLimit);
            return Err(Problem::payload_too_large(limit));
        }
        if !held.grow(&budget, n) {
            return Err(full());
        }
        reserved = n;
    }
    // Grown as bytes arrive: a declared length is only a promise.
    let mut buf = bytes::BytesMut::with_capacity(declared.unwrap_or(0).min(1 << 20) as usize);
    let mut chunks = body.into_data_stream();
    // A client that stops sending mid-body would otherwise hold its share of the budget for good,
    // and one that trickles it a byte at a time would too: past the grace of `--idle-timeout` the
    // body must average `--body-min-rate`.
    let idle = st.config.idle_timeout;
    let min_rate = st.config.body_min_rate;
    let started = tokio::time::Instant::now();
    loop {
        let idle_due = tokio::time::Instant::now() + idle;
        let rate_due = crate::files::rate_deadline(started, idle, buf.len() as u64, min_rate);
        let due = rate_due.map_or(idle_due, |r| r.min(idle_due));
        let next = match tokio::time::timeout_at(due, chunks.next()).await {
            Ok(n) => n,
            Err(_) if due < idle_due => return Err(super::body_rate::too_slow(min_rate)),
            Err(_) => {
                return Err(Problem::new(
                    StatusCode::REQUEST_TIMEOUT,
                    format!(
                        "no body bytes for {} (--idle-timeout)",
                        humantime::format_duration(idle)
                    ),
                ));
            }
        };
        let Some(data) = next else { break };
        let data = data.map_err(|e| Problem::bad_request(format!("cannot read the body: {e}")))?;
        let total = (buf.len() + data.len()) as u64;
        if total > limit {
            crate::metrics::refused(crate::metrics::Limit::BodyLimit);
            return Err(Problem::payload_too_large(limit));
        }
        if total > reserved {
            if !held.grow(&budget, total - reserved) {
                return Err(full());
            }
            reserved = total;
        }
        buf.extend_from_slice(&data);
        // Hyper holds a body to its declared length: once it is all here, the stream's end is
        // not waited for (one poll, two clock reads and a timer less per request).
        if declared == Some(total) {
            break;
        }
    }
    Ok((buf.freeze(), held))
}

/// The agent's messages that are not POST answers, as Server-Sent Events: first every retained
/// event (after `Last-Event-ID`), then live ones.
#[utoipa::path(
    get,
    path = "/v1/acp/{serverId}",
    operation_id = "streamAcpEvents",
    tag = "acp",
    params(
        ("serverId" = String, Path, description = "Client-chosen instance id",
            pattern = "^[A-Za-z0-9._-]{1,128}$", min_length = 1, max_length = 128, example = "s1"),
        ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event id: \
            the retained events with a greater id are replayed first. A non-numeric value is 400.",
            pattern = "^\\s*[0-9]{1,19}\\s*$", example = "41"),
        ("Upgrade" = Option<String>, Header, description = "`websocket` (with the other RFC \
            6455 headers) asks for the same serverId over a WebSocket instead of SSE: JSON-RPC \
            text frames both ways, requests pipelined, every event of the log sent as a frame \
            (ids implicit and consecutive), `_sandboxagent/gap` when events were evicted, close \
            frames with a reason (docs/acp.md)", example = "websocket"),
        ("agent" = Option<String>, Query, description = "WebSocket only: the agent to start when \
            the serverId does not exist yet (as a first POST's `?agent=`)", example = "mock"),
        ("lastEventId" = Option<String>, Query, description = "WebSocket only: resume after this \
            event id, as `Last-Event-ID` on SSE", pattern = "^\\s*[0-9]{1,19}\\s*$",
            example = "41"),
    ),
    responses(
        (status = 200, description = "An endless `text/event-stream`. Each agent message that \
            is not a POST answer (notifications, agent-to-client requests, late responses) is \
            one event: `event: message`, `id: <n>` (per serverId, from 1, strictly increasing), \
            `data: <one JSON-RPC object on one line>`. When retained events were evicted before \
            the client read them, `event: gap` with `data: {\"from\":<first missing>,\"to\":<last \
            missing>}` comes first. A comment line `: keepalive` is sent when nothing else was \
            for `--keepalive`. The stream ends when the instance is deleted or its agent exited \
            and everything was delivered.",
            content_type = "text/event-stream", body = String,
            // One event as a parser yields it (the schema describes one event).
            example = json!({"event": "message", "id": "1", "data": "{\"jsonrpc\":\"2.0\",\"method\":\"session/update\",\"params\":{\"sessionId\":\"mock-1\",\"update\":{\"sessionUpdate\":\"agent_message_chunk\",\"content\":{\"type\":\"text\",\"text\":\"hello\"}}}}"})),
        (status = 101, description = "With `Upgrade: websocket`: the WebSocket (see the \
            `Upgrade` parameter). Over HTTP/2 the same socket is an extended CONNECT (RFC \
            8441, `:protocol` `websocket`) to this path, answered 200; OpenAPI has no CONNECT \
            operation (docs/acp.md)"),
        (status = 400, description = "Invalid serverId, or a `Last-Event-ID` (`lastEventId`) \
            that is not a number or is beyond the last event; with `Upgrade`, an unknown `agent` \
            or a bad upgrade request"),
        (status = 404, description = "No instance with this serverId"),
        (status = 406, description = "`Accept` excludes `text/event-stream`"),
        (status = 409, description = "With `Upgrade` and `agent`: the serverId runs another \
            agent"),
        (status = 410, description = "The agent exited and every event was delivered"),
    )
)]
async fn stream(
    State(st): State<AppState>,
    Path(server_id): Path<String>,
    method: axum::http::Method,
    headers: HeaderMap,
    uri: axum::http::Uri,
    hold: Option<axum::Extension<super::StreamHold>>,
    upgrade: Result<super::ws::Upgrade, super::ws::UpgradeRejection>,
) -> Response {
    if let Err(e) = acp::validate_server_id(&server_id) {
        return Problem::from(e).into_response();
    }
    // The same serverId over a WebSocket (`http::ws`).
    if super::ws::wants_upgrade(&method, &headers) {
        let hold = hold.map(|axum::Extension(h)| h);
        return super::ws::acp_socket(st, server_id, uri, upgrade, hold).await;
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
    super::sse_response(body)
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

/// Detaches the instance (no longer listed, its streams end) and stops its agent in the
/// background (TERM to the process group, grace, KILL). Idempotent.
#[utoipa::path(
    delete,
    path = "/v1/acp/{serverId}",
    operation_id = "deleteAcpServer",
    tag = "acp",
    params(
        ("serverId" = String, Path, description = "Client-chosen instance id",
            pattern = "^[A-Za-z0-9._-]{1,128}$", min_length = 1, max_length = 128, example = "s1"),
    ),
    responses(
        (status = 204, description = "Detached (or was not there); the stop runs on"),
        (status = 400, description = "Invalid serverId"),
    )
)]
async fn delete(State(st): State<AppState>, Path(server_id): Path<String>) -> Response {
    if let Err(e) = acp::validate_server_id(&server_id) {
        return Problem::from(e).into_response();
    }
    st.acp.delete(&server_id);
    StatusCode::NO_CONTENT.into_response()
}

pub(super) fn is_json_content_type(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
}

/// True when the Accept header (absent means anything) admits `kind/sub`.
pub(super) fn accepts(headers: &HeaderMap, kind: &str, sub: &str) -> bool {
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
