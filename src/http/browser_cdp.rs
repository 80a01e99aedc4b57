//! The DevTools proxy: `GET /v1/browser/cdp` upgraded to a WebSocket is joined to the browser
//! target of the Chromium the daemon started (`ws://127.0.0.1:<its port>/devtools/browser/<id>`,
//! never any other host or port), message for message; `GET /v1/browser/cdp/json/version` is
//! Chromium's discovery document with `webSocketDebuggerUrl` pointing back at the proxy, so that
//! `chromium.connectOverCDP('http://host:port/v1/browser/cdp', {headers: {Authorization}})`
//! (Playwright) or `puppeteer.connect({browserWSEndpoint})` work through the daemon's one port and
//! its token. Caps: `MAX_CONNECTIONS` sockets at once, messages up to `cdp::MAX_MESSAGE` from
//! Chromium and `MAX_CLIENT_MESSAGE` from the client. A socket ends when the browser stops.

use std::sync::atomic::Ordering;

use axum::Json;
use axum::extract::State;
use axum::extract::ws::{Message as AxMessage, WebSocket, WebSocketUpgrade};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message as TMessage;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use super::{AppState, Problem};
use crate::browser::cdp;

/// Proxy sockets open at once.
pub const MAX_CONNECTIONS: usize = 8;
/// Largest message a client may send through the proxy.
pub const MAX_CLIENT_MESSAGE: usize = 16 << 20;

/// The DevTools protocol of the daemon's browser as a WebSocket (the browser target).
#[utoipa::path(get, path = "/v1/browser/cdp", operation_id = "connectBrowserCdp", tag = "browser",
    responses(
        (status = 101, description = "Switched to the WebSocket protocol: CDP messages both ways"),
        (status = 400, description = "Not a WebSocket upgrade"),
        (status = 409, description = "The browser is not running"),
        (status = 429, description = "8 proxy connections are open"),
        (status = 503, description = "The browser's DevTools socket could not be opened"),
    ))]
pub async fn cdp_socket(
    State(st): State<AppState>,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, Problem> {
    let ep = st.browser.endpoint()?;
    let ws = ws.map_err(|e| Problem::bad_request(format!("not a WebSocket upgrade: {e}")))?;
    let count = st.browser.proxies.clone();
    if count.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
        count.fetch_sub(1, Ordering::SeqCst);
        return Err(Problem::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!("{MAX_CONNECTIONS} DevTools proxy connections are open"),
        ));
    }
    let guard = Slot(count);
    let tcp = match tokio::net::TcpStream::connect(("127.0.0.1", ep.port)).await {
        Ok(t) => t,
        Err(e) => {
            return Err(Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("cannot reach the browser: {e}"),
            ));
        }
    };
    let url = format!("ws://127.0.0.1:{}{}", ep.port, ep.browser_path);
    let config = WebSocketConfig::default()
        .max_message_size(Some(cdp::MAX_MESSAGE))
        .max_frame_size(Some(cdp::MAX_MESSAGE));
    let upstream = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        tokio_tungstenite::client_async_with_config(url, tcp, Some(config)),
    )
    .await
    .map_err(|_| {
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the browser did not answer",
        )
    })?
    .map_err(|e| {
        Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("cannot open the browser's DevTools socket: {e}"),
        )
    })?
    .0;
    let shutdown = st.shutdown.clone();
    let drain = st.tasks.token();
    Ok(ws
        .max_message_size(MAX_CLIENT_MESSAGE)
        .max_frame_size(MAX_CLIENT_MESSAGE)
        .on_upgrade(move |socket| async move {
            let _drain = drain;
            let _guard = guard;
            let _open = crate::metrics::WebSocketOpen::new();
            tokio::select! {
                _ = pump(socket, upstream) => {}
                _ = shutdown.cancelled() => {}
            }
        }))
}

struct Slot(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn pump(
    client: WebSocket,
    upstream: tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>,
) {
    let (mut c_tx, mut c_rx) = client.split();
    let (mut u_tx, mut u_rx) = upstream.split();
    let up = async {
        while let Some(Ok(m)) = c_rx.next().await {
            let m = match m {
                AxMessage::Text(t) => TMessage::text(t.as_str()),
                AxMessage::Binary(b) => TMessage::binary(b),
                AxMessage::Close(_) => break,
                _ => continue,
            };
            if u_tx.send(m).await.is_err() {
                break;
            }
        }
        let _ = u_tx.close().await;
    };
    let down = async {
        while let Some(Ok(m)) = u_rx.next().await {
            let m = match m {
                TMessage::Text(t) => AxMessage::Text(t.as_str().into()),
                TMessage::Binary(b) => AxMessage::Binary(b),
                TMessage::Close(_) => break,
                _ => continue,
            };
            if c_tx.send(m).await.is_err() {
                break;
            }
        }
        let _ = c_tx.close().await;
    };
    // Either side ending ends both.
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

/// Chromium's `/json/version`, with `webSocketDebuggerUrl` pointing at the proxy.
#[utoipa::path(get, path = "/v1/browser/cdp/json/version", operation_id = "getBrowserCdpVersion", tag = "browser",
    responses(
        (status = 200, description = "The discovery document (`Browser`, `Protocol-Version`, `webSocketDebuggerUrl`, …)", body = Object),
        (status = 409, description = "The browser is not running"),
    ))]
pub async fn cdp_version(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<Value>, Problem> {
    version(&st, &headers).await
}

/// The same with a final slash (what Playwright's `connectOverCDP` asks for).
#[utoipa::path(get, path = "/v1/browser/cdp/json/version/", operation_id = "getBrowserCdpVersionSlash", tag = "browser",
    responses(
        (status = 200, description = "The discovery document", body = Object),
        (status = 409, description = "The browser is not running"),
    ))]
pub async fn cdp_version_slash(
    State(st): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<Value>, Problem> {
    version(&st, &headers).await
}

async fn version(st: &AppState, headers: &HeaderMap) -> Result<Json<Value>, Problem> {
    let ep = st.browser.endpoint()?;
    let mut v = cdp::version(st.browser.http(), &ep).await?;
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| {
            h.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b))
        })
        .unwrap_or("127.0.0.1");
    let scheme = match headers
        .get("x-forwarded-proto")
        .and_then(|h| h.to_str().ok())
    {
        Some("https") => "wss",
        _ => "ws",
    };
    if let Some(o) = v.as_object_mut() {
        o.insert(
            "webSocketDebuggerUrl".into(),
            Value::String(format!("{scheme}://{host}/v1/browser/cdp")),
        );
    }
    Ok(Json(v))
}
