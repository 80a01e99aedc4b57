//! `/v1/agents/{agent}/acp`: the ACP "Streamable HTTP & WebSocket" transport (the RFD), framed
//! onto the proxy's ordinary instances. POST delivers (the `initialize` that opens a connection is
//! answered in the body with `Acp-Connection-Id`; everything later is 202 and answered on a
//! stream), GET opens the connection stream or a session's stream (SSE) or, with `Upgrade`, the
//! WebSocket profile, DELETE ends the connection. Bookkeeping lives in `acp::connection`.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::value::RawValue;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::acp::{accepts, is_json_content_type};
use super::ws::{SocketPlan, Upgrade, UpgradeRejection, run_socket, wants_upgrade};
use super::{AppState, Problem};
use crate::acp::connection::session_of;
use crate::acp::events::KEEPALIVE_FRAME;
use crate::acp::{self, AcpError, ConnectionError, Delivered, Kind, Next, StreamReader};

pub const CONNECTION_ID: &str = "acp-connection-id";
pub const SESSION_ID: &str = "acp-session-id";

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(open_stream, post_message, delete))
        // The WebSocket profile over HTTP/2; the GET documents it (openapi-exempt: CONNECT)
        .route("/v1/agents/{agent}/acp", super::ws::on_connect(open_stream))
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, Problem> {
    match headers.get(name) {
        None => Ok(None),
        Some(v) => match v.to_str() {
            Ok(s) if !s.trim().is_empty() => Ok(Some(s.trim())),
            _ => Err(Problem::bad_request(format!(
                "the {name} header must be visible ASCII"
            ))),
        },
    }
}

/// What routing needs from a client message: its method and `params.sessionId`.
#[derive(Deserialize)]
struct Probe<'a> {
    #[serde(default)]
    method: Option<String>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
}

/// The RFD transport's POST: `initialize` without `Acp-Connection-Id` opens a connection.
#[utoipa::path(
    post,
    path = "/v1/agents/{agent}/acp",
    operation_id = "postAcpConnectionMessage",
    tag = "acp",
    params(
        ("agent" = String, Path, description = "A known agent id", example = "mock"),
        ("Acp-Connection-Id" = Option<String>, Header, description = "The connection, from \
            `initialize`'s answer; absent only on the `initialize` that opens a connection"),
        ("Acp-Session-Id" = Option<String>, Header, description = "The session of a \
            session-scoped message; optional (`params.sessionId` says the same)"),
    ),
    request_body(content = super::acp::JsonRpcMessage, content_type = "application/json",
        description = "Exactly one JSON-RPC 2.0 object (no batches)",
        example = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": 1, "clientCapabilities": {}}})),
    responses(
        (status = 200, description = "`initialize` without `Acp-Connection-Id`: the agent's \
            answer; the new connection's id is in the `Acp-Connection-Id` header",
            body = super::acp::JsonRpcMessage,
            headers(("Acp-Connection-Id" = String, description = "The new connection (32 hex digits)"))),
        (status = 202, description = "Written to the agent; a request's response arrives on the \
            connection's stream or its session's stream"),
        (status = 400, description = "No `Acp-Connection-Id` on a message other than \
            `initialize`, a bad header, or a body that is not one JSON-RPC object"),
        (status = 404, description = "Unknown agent, or unknown connection"),
        (status = 406, description = "`Accept` excludes `application/json`"),
        (status = 409, description = "The connection belongs to another agent, or a request \
            with the same id is in flight"),
        (status = 415, description = "`Content-Type` is not `application/json`"),
        (status = 502, description = "The agent is gone or could not start"),
        (status = 504, description = "The agent did not answer `initialize` in time"),
    )
)]
async fn post_message(
    State(st): State<AppState>,
    Path(agent): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !is_json_content_type(&headers) {
        return Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "POST a JSON-RPC object with Content-Type: application/json",
        )
        .into_response();
    }
    if !accepts(&headers, "application", "json") {
        return Problem::new(
            StatusCode::NOT_ACCEPTABLE,
            "the answer is application/json, which the Accept header excludes",
        )
        .into_response();
    }
    let (connection_id, session_header) = match (
        header_str(&headers, CONNECTION_ID),
        header_str(&headers, SESSION_ID),
    ) {
        (Ok(c), Ok(s)) => (c.map(str::to_string), s.map(str::to_string)),
        (Err(p), _) | (_, Err(p)) => return p.into_response(),
    };
    let parsed = if body.len() > 256 * 1024 {
        crate::sys::blocking(move || acp::jsonrpc::parse_envelope(body)).await
    } else {
        acp::jsonrpc::parse_envelope(body)
    };
    let envelope = match parsed {
        Ok(e) => e,
        Err(e) => return Problem::from(AcpError::from(e)).into_response(),
    };
    let probe: Probe<'_> = match serde_json::from_slice(&envelope.line) {
        Ok(p) => p,
        // `method` is not a string: no ACP method; the agent answers it as it sees fit.
        Err(_) => Probe {
            method: None,
            params: None,
        },
    };
    let conns = &st.connections;
    let Some(connection_id) = connection_id else {
        // No connection yet: only `initialize` may open one.
        let is_initialize = matches!(envelope.kind, Kind::Request { .. })
            && probe.method.as_deref() == Some("initialize");
        if !is_initialize {
            return Problem::from(ConnectionError::NotInitialize).into_response();
        }
        let (conn, _) = match conns.create(&agent, true) {
            Ok(c) => c,
            Err(e) => return Problem::from(e).into_response(),
        };
        // A POST in progress counts as a reader: the idle clock must not stop an agent that is
        // still being installed or answering `initialize`.
        let _busy = conn.hold();
        let traced = headers.contains_key("traceparent");
        let posted =
            super::trace::post_traced(&st, &conn.server_id, None, envelope, false, traced).await;
        return match posted {
            Ok(Delivered::Response { line, .. }) => {
                tracing::info!(connection_id = %conn.id, server_id = %conn.server_id, %agent,
                    "ACP connection opened");
                let mut resp = Response::new(Body::from(line));
                let h = resp.headers_mut();
                h.insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                if let Ok(v) = HeaderValue::from_str(&conn.id) {
                    h.insert(CONNECTION_ID, v);
                }
                resp
            }
            Ok(Delivered::Accepted) => StatusCode::ACCEPTED.into_response(),
            Err(e) => {
                // A connection whose initialize failed is of no use to anyone.
                conns.delete(&conn);
                Problem::from(e).into_response()
            }
        };
    };
    let conn = match conns.get(&connection_id, &agent) {
        Ok(c) => c,
        Err(e) => return Problem::from(e).into_response(),
    };
    let _busy = conn.hold();
    // A session-scoped request's response goes to that session's stream. The session is the
    // one in `params.sessionId`, else the header's (the RFD requires the header on
    // session-scoped POSTs; we accept it missing, since the body says the same).
    let route = match &envelope.kind {
        Kind::Request { key, .. } => session_of(probe.params)
            .or(session_header)
            .map(|s| (key.clone(), s)),
        _ => None,
    };
    if let Some((key, session)) = &route {
        conn.route_request(key.clone(), session.clone());
    }
    if let Kind::Request { key, .. } = &envelope.kind {
        crate::workspace::sessions::watch_answer(
            &st.workspace,
            &st.acp,
            &conn.server_id,
            key,
            &envelope.line,
        )
        .await;
    }
    let traced = headers.contains_key("traceparent");
    match super::trace::post_traced(&st, &conn.server_id, None, envelope, true, traced).await {
        Ok(_) => StatusCode::ACCEPTED.into_response(),
        Err(e) => {
            if let Some((key, _)) = &route {
                conn.unroute_request(key);
            }
            Problem::from(e)
                .with("connectionId", conn.id.clone())
                .into_response()
        }
    }
}

/// The RFD transport's GET: an SSE stream, or with `Upgrade: websocket` the WebSocket profile.
#[utoipa::path(
    get,
    path = "/v1/agents/{agent}/acp",
    operation_id = "openAcpConnectionStream",
    tag = "acp",
    params(
        ("agent" = String, Path, description = "A known agent id", example = "mock"),
        ("Acp-Connection-Id" = Option<String>, Header, description = "SSE: the connection \
            (required); ignored with `Upgrade`, which opens a new connection"),
        ("Acp-Session-Id" = Option<String>, Header, description = "SSE: that session's stream \
            instead of the connection stream"),
        ("Upgrade" = Option<String>, Header, description = "`websocket`: the RFD's WebSocket \
            profile, one new connection per socket, JSON-RPC text frames both ways",
            example = "websocket"),
    ),
    responses(
        (status = 101, description = "The WebSocket profile; the new connection's id is in \
            the `Acp-Connection-Id` header. Over HTTP/2 the same socket is an extended CONNECT \
            (RFC 8441, `:protocol` `websocket`) to this path, answered 200; OpenAPI has no \
            CONNECT operation (docs/acp.md)",
            headers(("Acp-Connection-Id" = String, description = "The new connection"))),
        (status = 200, description = "An endless `text/event-stream`: `event: message`, `id`, \
            `data: <one JSON-RPC object>` for each message routed to this stream; `: keepalive` \
            comments", content_type = "text/event-stream", body = String),
        (status = 400, description = "No `Acp-Connection-Id` (SSE), a bad header or session id, \
            or a bad upgrade request"),
        (status = 404, description = "Unknown agent, or unknown connection"),
        (status = 406, description = "`Accept` excludes `text/event-stream`"),
        (status = 409, description = "The stream already has a reader, or the connection \
            belongs to another agent"),
        (status = 429, description = "The connection has its most session streams"),
    )
)]
async fn open_stream(
    State(st): State<AppState>,
    Path(agent): Path<String>,
    method: axum::http::Method,
    headers: HeaderMap,
    hold: Option<axum::Extension<super::StreamHold>>,
    upgrade: Result<Upgrade, UpgradeRejection>,
) -> Response {
    if wants_upgrade(&method, &headers) {
        return open_socket(st, agent, upgrade, hold.map(|axum::Extension(h)| h));
    }
    if !accepts(&headers, "text", "event-stream") {
        return Problem::new(
            StatusCode::NOT_ACCEPTABLE,
            "the stream is text/event-stream, which the Accept header excludes",
        )
        .into_response();
    }
    let (connection_id, session) = match (
        header_str(&headers, CONNECTION_ID),
        header_str(&headers, SESSION_ID),
    ) {
        (Ok(Some(c)), Ok(s)) => (c.to_string(), s.map(str::to_string)),
        (Ok(None), _) => {
            return Problem::from(ConnectionError::MissingConnectionId).into_response();
        }
        (Err(p), _) | (_, Err(p)) => return p.into_response(),
    };
    let conn = match st.connections.get(&connection_id, &agent) {
        Ok(c) => c,
        Err(e) => return Problem::from(e).into_response(),
    };
    let reader = match conn.attach(session.as_deref()) {
        Ok(r) => r,
        Err(e) => return Problem::from(e).into_response(),
    };
    let body = Body::from_stream(sse_frames(reader, st.config.keepalive, st.shutdown.clone()));
    super::sse_response(body)
}

/// The WebSocket profile: a new connection per socket, announced in the 101's header.
fn open_socket(
    st: AppState,
    agent: String,
    upgrade: Result<Upgrade, UpgradeRejection>,
    hold: Option<super::StreamHold>,
) -> Response {
    let upgrade = match upgrade {
        Ok(u) => u,
        Err(e) => {
            return Problem::bad_request(format!("bad WebSocket upgrade: {e}")).into_response();
        }
    };
    let (conn, sub) = match st.connections.create(&agent, false) {
        Ok((c, Some(sub))) => (c, sub),
        Ok((c, None)) => {
            st.connections.delete(&c);
            return Problem::new(StatusCode::INTERNAL_SERVER_ERROR, "no subscription")
                .into_response();
        }
        Err(e) => return Problem::from(e).into_response(),
    };
    let guard = conn.hold();
    let id = conn.id.clone();
    tracing::info!(connection_id = %conn.id, server_id = %conn.server_id, %agent,
        "ACP WebSocket connection opened");
    let plan = SocketPlan {
        server_id: conn.server_id.clone(),
        sub,
        after: 0,
        gap_notifications: false,
        connection: Some((conn, guard)),
        hold,
    };
    let mut resp = upgrade.on_upgrade(&st.clone(), move |socket| run_socket(socket, st, plan));
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert(CONNECTION_ID, v);
    }
    resp
}

/// The RFD transport's DELETE: ends the connection and stops its agent in the background.
#[utoipa::path(
    delete,
    path = "/v1/agents/{agent}/acp",
    operation_id = "deleteAcpConnection",
    tag = "acp",
    params(
        ("agent" = String, Path, description = "A known agent id", example = "mock"),
        ("Acp-Connection-Id" = String, Header, description = "The connection to end"),
    ),
    responses(
        (status = 202, description = "Detached; its streams end and its agent is stopped in the \
            background"),
        (status = 400, description = "No `Acp-Connection-Id`"),
        (status = 404, description = "Unknown connection"),
        (status = 409, description = "The connection belongs to another agent"),
    )
)]
async fn delete(
    State(st): State<AppState>,
    Path(agent): Path<String>,
    headers: HeaderMap,
) -> Response {
    let connection_id = match header_str(&headers, CONNECTION_ID) {
        Ok(Some(c)) => c.to_string(),
        Ok(None) => return Problem::from(ConnectionError::MissingConnectionId).into_response(),
        Err(p) => return p.into_response(),
    };
    match st.connections.get(&connection_id, &agent) {
        Ok(conn) => {
            tracing::info!(connection_id = %conn.id, "ACP connection deleted");
            st.connections.delete(&conn);
            StatusCode::ACCEPTED.into_response()
        }
        Err(e) => Problem::from(e).into_response(),
    }
}

/// The frames of one RFD stream, with keepalive comments, until the connection ends, the reader
/// is cut off, or the daemon shuts down.
fn sse_frames(
    reader: StreamReader,
    keepalive: Duration,
    shutdown: tokio_util::sync::CancellationToken,
) -> impl futures_util::Stream<Item = Result<Bytes, Infallible>> + Send {
    let keepalive = keepalive.max(Duration::from_millis(10));
    let next_ka = tokio::time::Instant::now() + keepalive;
    futures_util::stream::unfold(Some((reader, next_ka, shutdown)), move |state| async move {
        let (reader, mut next_ka, shutdown) = state?;
        let frame = tokio::select! {
            biased;
            _ = shutdown.cancelled() => return None,
            next = reader.next() => match next {
                Next::Frames(b) => b,
                Next::End | Next::CutOff => return None,
            },
            _ = tokio::time::sleep_until(next_ka) => Bytes::from_static(KEEPALIVE_FRAME),
        };
        next_ka = tokio::time::Instant::now() + keepalive;
        Some((Ok(frame), Some((reader, next_ka, shutdown))))
    })
}
