//! The reverse proxy behind `/v1/ports/{port}/proxy/…` and `/preview/<opaque>/…`: one HTTP/1.1
//! connection to `127.0.0.1:{port}` (or `[::1]`) per request, bodies streamed both ways (hyper's
//! backpressure bounds what is held), hop-by-hop headers dropped, `X-Forwarded-*` set (`-For`
//! appended to), the daemon's own port refused, a
//! WebSocket (any `Upgrade`) spliced through once the app answers 101. Invariant: the daemon's
//! own token is never sent to the app.

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, header};
use hyper_util::rt::TokioIo;
use tokio_util::sync::CancellationToken;

/// How long connecting to the app may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("nothing listens on port {port}")]
    NoListener { port: u16 },
    #[error("the app on port {port} failed: {reason}")]
    Upstream { port: u16, reason: String },
    #[error(
        "port {port} is this daemon's own: the proxy does not send requests back to the daemon"
    )]
    OwnPort { port: u16 },
}

/// Marks a response that comes from the app: the edge leaves its status and body alone (an
/// app's own 404 is not rewritten into problem+json).
#[derive(Clone, Copy)]
pub struct Passthrough;

const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
];

/// Removes the hop-by-hop headers, those the `Connection` header names included.
fn strip_hop_by_hop(h: &mut HeaderMap) {
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    for n in HOP_BY_HOP {
        h.remove(n);
    }
    h.remove(header::UPGRADE);
}

/// Appends `ip` to the request's `X-Forwarded-For` (one comma-separated list, whatever the
/// client sent as several header lines), or starts it.
fn forwarded_for(h: &mut HeaderMap, ip: std::net::IpAddr) {
    let mut list: Vec<String> = h
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect();
    list.push(ip.to_string());
    if let Ok(v) = HeaderValue::from_str(&list.join(", ")) {
        h.insert("x-forwarded-for", v);
    }
}

async fn connect(port: u16) -> Result<tokio::net::TcpStream, ProxyError> {
    let mut last = None;
    for addr in [
        std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        std::net::SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port)),
    ] {
        match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr)).await {
            Ok(Ok(s)) => return Ok(s),
            Ok(Err(e)) => last = Some(e.to_string()),
            Err(_) => last = Some("connect timed out".into()),
        }
    }
    tracing::debug!(port, error = ?last, "proxy connect failed");
    Err(ProxyError::NoListener { port })
}

pub struct Forward<'a> {
    pub port: u16,
    /// The path and query the app sees (starts with `/`).
    pub target: String,
    /// The path prefix the client used (`X-Forwarded-Prefix`).
    pub prefix: String,
    /// Drop the request's `Authorization` header (it carries the daemon's token).
    pub strip_authorization: bool,
    /// The client's address (appended to `X-Forwarded-For`), when known.
    pub peer: Option<std::net::SocketAddr>,
    /// The port the request came in on: the daemon's own, never a target.
    pub own_port: Option<u16>,
    /// Ends a spliced WebSocket at shutdown.
    pub shutdown: &'a CancellationToken,
    pub tasks: &'a tokio_util::task::TaskTracker,
}

pub async fn forward(f: Forward<'_>, mut req: Request<Body>) -> Result<Response<Body>, ProxyError> {
    let port = f.port;
    if f.own_port == Some(port) {
        return Err(ProxyError::OwnPort { port });
    }
    let stream = connect(port).await?;
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .handshake(TokioIo::new(stream))
        .await
        .map_err(|e| ProxyError::Upstream {
            port,
            reason: e.to_string(),
        })?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });

    let upgrade = req.headers().get(header::UPGRADE).cloned();
    let client_upgrade = upgrade.as_ref().map(|_| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    let original_host = parts.headers.get(header::HOST).cloned();
    strip_hop_by_hop(&mut parts.headers);
    if f.strip_authorization {
        parts.headers.remove(header::AUTHORIZATION);
    }
    if let Some(u) = &upgrade {
        parts
            .headers
            .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        parts.headers.insert(header::UPGRADE, u.clone());
    }
    if let Ok(h) = HeaderValue::from_str(&format!("127.0.0.1:{port}")) {
        parts.headers.insert(header::HOST, h);
    }
    if let Some(h) = original_host.or_else(|| {
        parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    }) {
        parts.headers.insert("x-forwarded-host", h);
    }
    parts
        .headers
        .insert("x-forwarded-proto", HeaderValue::from_static("http"));
    if let Some(peer) = f.peer {
        forwarded_for(&mut parts.headers, peer.ip());
    }
    if let Ok(p) = HeaderValue::from_str(&f.prefix) {
        parts.headers.insert("x-forwarded-prefix", p);
    }
    parts.uri = f.target.parse().map_err(|_| ProxyError::Upstream {
        port,
        reason: "the request path cannot be forwarded".into(),
    })?;
    // The app always gets HTTP/1.1, whatever the client spoke.
    parts.version = axum::http::Version::HTTP_11;
    let upstream_req = Request::from_parts(parts, body);
    let mut resp = sender
        .send_request(upstream_req)
        .await
        .map_err(|e| ProxyError::Upstream {
            port,
            reason: e.to_string(),
        })?;

    if resp.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(client_upgrade) = client_upgrade
    {
        let app_upgrade = hyper::upgrade::on(&mut resp);
        let shutdown = f.shutdown.clone();
        let token = f.tasks.token();
        tokio::spawn(async move {
            let _token = token;
            let (c, a) = tokio::join!(client_upgrade, app_upgrade);
            if let (Ok(c), Ok(a)) = (c, a) {
                let mut c = TokioIo::new(c);
                let mut a = TokioIo::new(a);
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut c, &mut a) => {}
                    _ = shutdown.cancelled() => {}
                }
            }
        });
        let (parts, _) = resp.into_parts();
        let mut out = Response::from_parts(parts, Body::empty());
        out.extensions_mut().insert(Passthrough);
        return Ok(out);
    }

    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    let mut out = Response::from_parts(parts, Body::new(body));
    out.extensions_mut().insert(Passthrough);
    Ok(out)
}
