//! `/v1/ports*`: the listeners, their change feed, the reverse proxy, and the preview links
//! (`POST /v1/ports/{port}/preview`, `/preview/<opaque>/…`).

use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouterExt};
use utoipa_axum::routes;

use super::super::{AppState, Problem};
use crate::workspace::ports::{Listener, PortEvent};
use crate::workspace::preview::{DEFAULT_TTL, MAX_TTL, PreviewError};
use crate::workspace::proxy::{self, Forward};

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_ports))
        .routes(routes!(port_events))
        .routes(
            routes!(
                proxy_get,
                proxy_post,
                proxy_put,
                proxy_patch,
                proxy_delete,
                proxy_head,
                proxy_options
            )
            .layer(DefaultBodyLimit::disable()),
        )
        .routes(
            routes!(
                proxy_root_get,
                proxy_root_post,
                proxy_root_put,
                proxy_root_patch,
                proxy_root_delete,
                proxy_root_head,
                proxy_root_options
            )
            .layer(DefaultBodyLimit::disable()),
        )
        .routes(routes!(create_preview))
}

/// `/preview/<opaque>/…`: an app's pages behind a signed link, outside the API document (like
/// the inspector's files) and outside the token check (the link is the credential).
pub fn preview_routes() -> axum::Router<AppState> {
    // openapi-exempt: the preview routes below, each exempted on its own line.
    use axum::routing::{any, get};
    axum::Router::new()
        // openapi-exempt: an app's pages behind a preview link, not an API route (docs/workspace.md).
        .route("/preview/{opaque}", get(preview_bare))
        // openapi-exempt: as above.
        .route("/preview/{opaque}/", any(preview_root))
        // openapi-exempt: as above.
        .route("/preview/{opaque}/{*path}", any(preview_path))
        .layer(DefaultBodyLimit::disable())
}

#[derive(Serialize, ToSchema, Clone)]
#[serde(rename_all = "camelCase")]
pub struct PortInfo {
    port: u16,
    /// The address it listens on (`0.0.0.0`, `127.0.0.1`, `::`, …).
    address: String,
    pid: Option<u32>,
    /// The owning process's command line.
    command: Option<String>,
    /// The `/v1/processes` process it belongs to (itself or an ancestor).
    #[serde(skip_serializing_if = "Option::is_none")]
    process_id: Option<String>,
    /// The agent instance it belongs to.
    #[serde(skip_serializing_if = "Option::is_none")]
    server_id: Option<String>,
}

impl From<Listener> for PortInfo {
    fn from(l: Listener) -> Self {
        PortInfo {
            port: l.port,
            address: l.address,
            pid: l.pid,
            command: l.command,
            process_id: l.process_id,
            server_id: l.server_id,
        }
    }
}

#[derive(Serialize, ToSchema)]
pub struct PortList {
    ports: Vec<PortInfo>,
    /// Present when `limit` was given and the page is full: pass it as `cursor` for the next.
    #[serde(rename = "nextCursor", skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

/// TCP listeners inside the sandbox (the daemon's own excluded).
#[utoipa::path(
    get,
    path = "/v1/ports",
    operation_id = "listPorts",
    tag = "ports",
    params(
        ("limit" = Option<u32>, Query, description = "At most this many listeners (1..=1000), \
            by port and address; without it, every listener", minimum = 1, maximum = 1000),
        ("cursor" = Option<String>, Query, description = "The `nextCursor` of the page before, \
            unchanged"),
    ),
    responses(
        (status = 200, description = "The listeners (or one page, by port and address)", body = PortList),
        (status = 400, description = "A bad `limit` or `cursor`"),
    )
)]
async fn list_ports(
    State(s): State<AppState>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Result<Json<PortList>, Problem> {
    let page = super::super::paging::Page::from_query(&q)?;
    let ports = s.workspace.ports.list().await;
    // Zero-padded, so that the text order of the keys is the numeric order of the ports.
    let (ports, next_cursor) = page.slice(ports, |l| format!("{:05} {}", l.port, l.address));
    Ok(Json(PortList {
        ports: ports.into_iter().map(Into::into).collect(),
        next_cursor,
    }))
}

fn sse_frame(event: &str, l: Listener) -> bytes::Bytes {
    let data = serde_json::to_string(&PortInfo::from(l)).unwrap_or_default();
    bytes::Bytes::from(format!("event: {event}\ndata: {data}\n\n"))
}

/// Listeners opening and closing, as SSE.
#[utoipa::path(
    get,
    path = "/v1/ports/events",
    operation_id = "portEvents",
    tag = "ports",
    responses((status = 200, description = "`event: open` for every listener at the start, \
        then `event: open` / `event: close` within 2 s of each change (data: the port object); \
        `: keepalive` comments", content_type = "text/event-stream", body = String))
)]
async fn port_events(State(s): State<AppState>) -> Response {
    let (now, rx) = s.workspace.ports.subscribe().await;
    let initial: std::collections::VecDeque<bytes::Bytes> =
        now.into_iter().map(|l| sse_frame("open", l)).collect();
    let keepalive = s.config.keepalive.max(Duration::from_millis(100));
    let shutdown = s.shutdown.clone();
    let stream = futures_util::stream::unfold(
        (initial, rx, shutdown),
        move |(mut initial, mut rx, shutdown)| async move {
            if let Some(f) = initial.pop_front() {
                return Some((Ok::<_, std::io::Error>(f), (initial, rx, shutdown)));
            }
            let frame = tokio::select! {
                _ = shutdown.cancelled() => return None,
                _ = tokio::time::sleep(keepalive) => bytes::Bytes::from_static(b": keepalive\n\n"),
                ev = rx.recv() => match ev {
                    Ok(PortEvent::Open(l)) => sse_frame("open", l),
                    Ok(PortEvent::Close(l)) => sse_frame("close", l),
                    // Too slow a reader: it reconnects and gets the whole list again.
                    Err(_) => return None,
                },
            };
            Some((Ok(frame), (initial, rx, shutdown)))
        },
    );
    super::super::sse_response(Body::from_stream(stream))
}

/// Everything after `/v1/ports/{port}/proxy` (or a preview's prefix), with the query.
fn target_of(uri: &axum::http::Uri, prefix: &str) -> String {
    let rest = uri.path().strip_prefix(prefix).unwrap_or("/");
    let rest = if rest.is_empty() { "/" } else { rest };
    match uri.query() {
        Some(q) => format!("{rest}?{q}"),
        None => rest.to_string(),
    }
}

async fn proxy_to(
    s: &AppState,
    port: u16,
    prefix: String,
    strip_auth: bool,
    req: Request,
) -> Response {
    if port == 0 {
        return Problem::bad_request("port 0 is not a port").into_response();
    }
    let target = target_of(req.uri(), &prefix);
    let addrs = req
        .extensions()
        .get::<crate::http::guard::ConnAddrs>()
        .copied();
    let f = Forward {
        port,
        target,
        prefix,
        strip_authorization: strip_auth,
        peer: addrs.map(|a| a.peer),
        own_port: addrs.map(|a| a.local.port()),
        shutdown: &s.shutdown,
        tasks: &s.tasks,
    };
    match proxy::forward(f, req).await {
        Ok(r) => r,
        Err(e) => Problem::from(e).into_response(),
    }
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // documents the path; the handler reads the raw URI
struct ProxyPath {
    port: u16,
    path: String,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
struct PortPath {
    port: u16,
}

async fn proxy_port(s: AppState, port: u16, req: Request) -> Response {
    let prefix = format!("/v1/ports/{port}/proxy");
    let strip = s.config.token.is_some();
    proxy_to(&s, port, prefix, strip, req).await
}

/// One documented operation per method (an operation id is unique per method), for the path
/// below the port and for the app's root.
macro_rules! proxy_operations {
    ($($method:ident: $with_path:ident $id:literal, $root:ident $root_id:literal;)*) => {$(
        /// Reverse proxy to `127.0.0.1:{port}/{path}?query`: bodies streamed both ways,
        /// WebSocket upgrades passed through, the token never forwarded.
        #[utoipa::path(
            $method,
            path = "/v1/ports/{port}/proxy/{*path}",
            operation_id = $id,
            tag = "ports",
            params(ProxyPath),
            responses(
                (status = 200, description = "Whatever the app answers, passed on as it is"),
                (status = 400, description = "Invalid port"),
                (status = 502, description = "Nothing listens on the port, or the app failed"),
            )
        )]
        async fn $with_path(
            State(s): State<AppState>,
            Path((port, _path)): Path<(u16, String)>,
            req: Request,
        ) -> Response {
            proxy_port(s, port, req).await
        }

        /// The app's root (`/`) through the proxy.
        #[utoipa::path(
            $method,
            path = "/v1/ports/{port}/proxy/",
            operation_id = $root_id,
            tag = "ports",
            params(PortPath),
            responses(
                (status = 200, description = "Whatever the app answers, passed on as it is"),
                (status = 400, description = "Invalid port"),
                (status = 502, description = "Nothing listens on the port, or the app failed"),
            )
        )]
        async fn $root(State(s): State<AppState>, Path(p): Path<PortPath>, req: Request) -> Response {
            proxy_port(s, p.port, req).await
        }
    )*};
}

proxy_operations! {
    get: proxy_get "proxyPortGet", proxy_root_get "proxyPortRootGet";
    post: proxy_post "proxyPortPost", proxy_root_post "proxyPortRootPost";
    put: proxy_put "proxyPortPut", proxy_root_put "proxyPortRootPut";
    patch: proxy_patch "proxyPortPatch", proxy_root_patch "proxyPortRootPatch";
    delete: proxy_delete "proxyPortDelete", proxy_root_delete "proxyPortRootDelete";
    head: proxy_head "proxyPortHead", proxy_root_head "proxyPortRootHead";
    options: proxy_options "proxyPortOptions", proxy_root_options "proxyPortRootOptions";
}

#[derive(Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct PreviewRequest {
    /// How long the link works (humantime: `10m`, `2h`; default 1h, at most 7 days).
    ttl: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Preview {
    /// `/preview/<opaque>/`, relative to the daemon's address; needs no token.
    url: String,
    /// RFC 3339.
    expires_at: String,
}

/// A signed, expiring link to one port that works without the token.
#[utoipa::path(
    post,
    path = "/v1/ports/{port}/preview",
    operation_id = "createPreview",
    tag = "ports",
    params(PortPath),
    request_body(content = PreviewRequest, description = "Optional"),
    responses(
        (status = 201, description = "The link", body = Preview),
        (status = 400, description = "Invalid ttl or port"),
    )
)]
async fn create_preview(
    State(s): State<AppState>,
    Path(p): Path<PortPath>,
    body: axum::body::Bytes,
) -> Result<Response, Problem> {
    if p.port == 0 {
        return Err(Problem::bad_request("port 0 is not a port"));
    }
    let req: PreviewRequest = if body.iter().all(u8::is_ascii_whitespace) {
        PreviewRequest::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| Problem::bad_request(format!("invalid JSON body: {e}")))?
    };
    let ttl = match req.ttl.as_deref() {
        None => DEFAULT_TTL,
        Some(t) => humantime::parse_duration(t)
            .map_err(|e| Problem::bad_request(format!("invalid ttl {t:?}: {e}")))?,
    };
    if ttl.is_zero() || ttl > MAX_TTL {
        return Err(Problem::bad_request("ttl must be between 1s and 7 days"));
    }
    let (opaque, expires) = s.workspace.previews.sign(p.port, ttl);
    let at = std::time::UNIX_EPOCH + Duration::from_secs(expires);
    Ok((
        StatusCode::CREATED,
        Json(Preview {
            url: format!("/preview/{opaque}/"),
            expires_at: humantime::format_rfc3339_seconds(at).to_string(),
        }),
    )
        .into_response())
}

// ---------------------------------------------------------------- preview links

fn preview_port(s: &AppState, opaque: &str) -> Result<u16, Box<Response>> {
    s.workspace.previews.verify(opaque).map_err(|e| {
        Box::new(
            match e {
                PreviewError::Invalid => Problem::new(
                    StatusCode::FORBIDDEN,
                    "this preview link is not valid (altered, or made before the daemon restarted)",
                ),
                PreviewError::Expired => {
                    Problem::new(StatusCode::GONE, "this preview link expired")
                }
            }
            .into_response(),
        )
    })
}

async fn preview_bare(State(s): State<AppState>, Path(opaque): Path<String>) -> Response {
    if let Err(r) = preview_port(&s, &opaque) {
        return *r;
    }
    Redirect::permanent(&format!("/preview/{opaque}/")).into_response()
}

async fn preview_root(
    State(s): State<AppState>,
    Path(opaque): Path<String>,
    req: Request,
) -> Response {
    preview(s, opaque, req).await
}

async fn preview_path(
    State(s): State<AppState>,
    Path((opaque, _)): Path<(String, String)>,
    req: Request,
) -> Response {
    preview(s, opaque, req).await
}

async fn preview(s: AppState, opaque: String, req: Request) -> Response {
    let port = match preview_port(&s, &opaque) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let prefix = format!("/preview/{opaque}");
    let mut resp = proxy_to(&s, port, prefix, false, req).await;
    // The app's pages are not the daemon's: keep them from being framed by other origins'
    // pages only if the app says so; never cache a link's answers in shared caches.
    resp.headers_mut()
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("private"));
    resp
}
