//! The upgrade itself: our extractor for HTTP/1.1 `Upgrade: websocket` and the HTTP/2 extended
//! CONNECT (RFC 8441), and the socket it makes, every read through `Metered`.

use std::future::Future;

use axum::body::Body;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::TokioIo;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};

use super::Metered;
use crate::http::{AppState, Problem};

fn body_limit(st: &AppState) -> usize {
    usize::try_from(st.config.body_limit).unwrap_or(usize::MAX)
}

/// The library zeroes its whole read buffer before every read (128 KiB by default, twice per
/// batch of frames: the read that brings them and the one that finds the socket empty), so the
/// buffer is resident for every idle socket. One page: an idle WebSocket costs the daemon 14.1
/// KiB (17.9 with 8 KiB, 39.6 with 32 KiB); 32 small messages in flight on one socket went ~5 %
/// slower than with 8 KiB, a single round trip not at all (docs/performance.md, "Density").
const READ_BUFFER: usize = 4 * 1024;

/// The socket a handler gets: the library's stream over the upgraded connection, every read
/// through `Metered`.
pub type Socket = WebSocketStream<Metered<TokioIo<hyper::upgrade::Upgraded>>>;

/// A checked WebSocket upgrade request: HTTP/1.1 `GET` with `Upgrade: websocket`, or an HTTP/2
/// extended CONNECT with `:protocol = websocket` (RFC 8441). Our own extractor rather than the
/// framework's, so that the socket's reads go through `Metered`.
pub struct Upgrade {
    on_upgrade: hyper::upgrade::OnUpgrade,
    /// `Sec-WebSocket-Key` (HTTP/1.1 only).
    key: Option<HeaderValue>,
}

/// Why a request is not a WebSocket upgrade we can serve.
#[derive(Debug)]
pub struct UpgradeRejection(&'static str);

impl std::fmt::Display for UpgradeRejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl IntoResponse for UpgradeRejection {
    fn into_response(self) -> Response {
        Problem::bad_request(format!("bad WebSocket upgrade: {}", self.0)).into_response()
    }
}

fn header_has_token(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| p.trim().eq_ignore_ascii_case(token))
}

impl<S: Send + Sync> FromRequestParts<S> for Upgrade {
    type Rejection = UpgradeRejection;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let key = if parts.method == Method::GET {
            if !header_has_token(&parts.headers, header::CONNECTION, "upgrade") {
                return Err(UpgradeRejection("`Connection` does not include `upgrade`"));
            }
            if !header_has_token(&parts.headers, header::UPGRADE, "websocket") {
                return Err(UpgradeRejection("`Upgrade` is not `websocket`"));
            }
            let Some(key) = parts.headers.get(header::SEC_WEBSOCKET_KEY) else {
                return Err(UpgradeRejection("`Sec-WebSocket-Key` is missing"));
            };
            Some(key.clone())
        } else if parts.method == Method::CONNECT {
            let protocol = parts.extensions.get::<hyper::ext::Protocol>();
            if !protocol.is_some_and(|p| p.as_str().eq_ignore_ascii_case("websocket")) {
                return Err(UpgradeRejection("`:protocol` is not `websocket`"));
            }
            None
        } else {
            return Err(UpgradeRejection("a WebSocket upgrade is a GET or CONNECT"));
        };
        if parts
            .headers
            .get(header::SEC_WEBSOCKET_VERSION)
            .is_none_or(|v| v.as_bytes() != b"13")
        {
            return Err(UpgradeRejection("`Sec-WebSocket-Version` is not 13"));
        }
        let Some(on_upgrade) = parts.extensions.remove::<hyper::upgrade::OnUpgrade>() else {
            return Err(UpgradeRejection("this connection cannot be upgraded"));
        };
        Ok(Upgrade { on_upgrade, key })
    }
}

impl Upgrade {
    /// Answers the upgrade (101, or 200 to an extended CONNECT) and, once the connection is
    /// handed over, runs `callback` with the socket: messages up to `--body-limit`, the read
    /// buffer above, reads metered against the in-flight budget (`Metered`).
    pub fn on_upgrade<F, Fut>(self, st: &AppState, callback: F) -> Response
    where
        F: FnOnce(Socket) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let limit = body_limit(st);
        let config = WebSocketConfig::default()
            .max_message_size(Some(limit))
            .max_frame_size(Some(limit))
            .read_buffer_size(READ_BUFFER);
        let budget = st.acp.inflight_budget().clone();
        let deadline = st.config.idle_timeout;
        let on_upgrade = self.on_upgrade;
        // On the daemon's tracker (`AppState::tasks`): the shutdown drain waits for the socket's
        // close frame like for any request in flight.
        st.tasks.spawn(async move {
            let _open = crate::metrics::WebSocketOpen::new();
            let upgraded = match on_upgrade.await {
                Ok(u) => u,
                Err(e) => {
                    tracing::debug!(error = %e, "a WebSocket upgrade did not complete");
                    return;
                }
            };
            let io = Metered::new(TokioIo::new(upgraded), budget, deadline);
            let socket = WebSocketStream::from_raw_socket(io, Role::Server, Some(config)).await;
            callback(socket).await;
        });
        match self.key {
            Some(key) => {
                let accept =
                    tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
                let mut resp = Response::new(Body::empty());
                *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
                let h = resp.headers_mut();
                h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
                h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
                if let Ok(v) = HeaderValue::from_str(&accept) {
                    h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
                }
                resp
            }
            // HTTP/2 (RFC 8441): a 2xx with no body opens the stream as the socket.
            None => Response::new(Body::empty()),
        }
    }
}
