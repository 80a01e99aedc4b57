//! The HTTP surface (axum only): routes, auth, request logging and the problem+json safety net.
//! Handlers translate HTTP into calls on the services and back; no business logic lives here.

pub mod acp;
pub mod agents;
pub mod auth;
mod body_rate;
pub mod browser;
mod browser_cdp;
pub mod bundle;
pub mod config;
pub mod desktop;
mod desktop_stream;
pub mod error;
pub mod files;
pub mod guard;
pub mod metrics;
pub mod openapi;
pub mod opencode;
pub mod paging;
pub mod processes;
pub mod rfd;
pub mod sessions;
mod trace;
pub mod ui;
pub mod watch;
pub mod wire;
pub mod workspace;
pub mod ws;

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::config::Config;
pub use error::Problem;

/// Everything a handler may reach: one shared allocation, so a clone (axum makes several per
/// request: the edge middleware's state, each `State` extractor) is one reference-count
/// increment. Cloning the services one by one cost a mutex round trip per request for the
/// `CancellationToken` alone (measured in docs/performance.md).
#[derive(Clone)]
pub struct AppState(pub(crate) Arc<Services>);

impl std::ops::Deref for AppState {
    type Target = Services;
    fn deref(&self) -> &Services {
        &self.0
    }
}

/// What `AppState` shares: defined below `http/` (`services.rs`), built by the daemon.
pub use crate::services::Services;

/// Keeps an HTTP/2 connection counted as busy while one of its streams serves a WebSocket: the
/// accept loop (`daemon/serve.rs`) puts one in the request's extensions, the socket task holds a
/// clone until it ends. Defined here because the handlers hold it; the daemon only makes it.
#[derive(Clone)]
pub struct StreamHold {
    _guard: Arc<dyn Send + Sync>,
}

impl StreamHold {
    pub fn new(guard: impl Send + Sync + 'static) -> Self {
        StreamHold {
            _guard: Arc::new(guard),
        }
    }
}

/// The response of every SSE route: `body` as `text/event-stream`, never cached, and marked so
/// that proxies in front of the sandbox do not buffer the stream.
pub(crate) fn sse_response(body: axum::body::Body) -> Response {
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("text/event-stream"),
    );
    h.insert(
        header::CACHE_CONTROL,
        axum::http::HeaderValue::from_static("no-cache"),
    );
    h.insert(
        "x-accel-buffering",
        axum::http::HeaderValue::from_static("no"),
    );
    resp
}

/// Every route, each registered with its OpenAPI description (`routes!` of a handler carrying
/// `#[utoipa::path]`). A feature adds one `.merge(feature::routes())` line here, its `routes()`
/// returning an `OpenApiRouter`; see "Adding a route" in docs/api.md.
pub fn api() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(openapi::base())
        .routes(routes!(root))
        .routes(routes!(health))
        .merge(openapi::routes())
        .merge(acp::routes())
        .merge(bundle::routes())
        .merge(rfd::routes())
        .merge(agents::routes())
        .merge(files::routes())
        .merge(watch::routes())
        .merge(config::routes())
        .merge(processes::routes())
        .merge(metrics::routes())
        .merge(workspace::routes())
        .merge(opencode::routes())
        .merge(sessions::routes())
        .merge(desktop::routes())
        .merge(browser::routes())
}

pub fn router(state: AppState) -> Router {
    let (routes, doc) = api().split_for_parts();
    // The route templates the request metrics may name (`crate::metrics::http`).
    crate::metrics::http::init(
        doc.paths
            .paths
            .keys()
            .cloned()
            .chain(ui::TEMPLATES.iter().map(|t| t.to_string())),
    );
    routes
        // The inspector's static files: not API routes, so not in the document (src/http/ui.rs).
        .merge(ui::routes())
        // Preview links: an app's pages, not API routes (src/http/workspace/ports.rs).
        .merge(workspace::preview_routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(state.config.body_limit as usize))
        // One layer for auth, the problem+json safety net and the request log (see `edge`).
        .layer(middleware::from_fn_with_state(state.clone(), edge))
        .with_state(state)
}

/// What this is; the one route that never needs the token (probes use it).
#[utoipa::path(
    get,
    path = "/",
    operation_id = "getRoot",
    tag = "meta",
    responses(
        (status = 200, description = "The daemon's name and version", body = RootInfo),
    )
)]
async fn root() -> axum::Json<RootInfo> {
    axum::Json(RootInfo {
        name: "Sandbox Agent",
        version: env!("CARGO_PKG_VERSION"),
    })
}

#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct RootInfo {
    #[schema(example = "Sandbox Agent")]
    name: &'static str,
    version: &'static str,
}

/// Liveness: answers while the daemon serves.
#[utoipa::path(
    get,
    path = "/v1/health",
    operation_id = "getHealth",
    tag = "meta",
    responses((status = 200, description = "The daemon serves", body = Health)),
)]
async fn health(State(state): State<AppState>) -> axum::Json<Health> {
    axum::Json(Health {
        status: "ok",
        data_dir: DataDirHealth {
            path: state.config.data_dir.display().to_string(),
            writable: state.data_dir_problem.is_none(),
            problem: state.data_dir_problem.clone(),
        },
        durable: state.state.as_ref().is_some_and(|s| s.is_durable()),
        state: state.state.as_ref().map(|s| StateHealth {
            path: s.dir().display().to_string(),
            problem: s.problem(),
        }),
    })
}

#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Health {
    /// Always `ok`.
    #[schema(example = "ok")]
    status: &'static str,
    /// The data directory (installed agents, upload spool), as checked at start.
    data_dir: DataDirHealth,
    /// True when events, sessions and processes are kept on disk (`--state-dir`) and survive a
    /// restart; false without a state dir, or once it could not be written (full disk, its size
    /// cap), when the daemon keeps state in memory only.
    durable: bool,
    /// The state dir, when one is configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    state: Option<StateHealth>,
}

#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct StateHealth {
    path: String,
    /// Why (part of) the state is kept in memory only, once something could not be written.
    #[serde(skip_serializing_if = "Option::is_none")]
    problem: Option<String>,
}

#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct DataDirHealth {
    path: String,
    /// False when a file could not be created there at start: installs will fail.
    writable: bool,
    /// Why it is not writable.
    #[serde(skip_serializing_if = "Option::is_none")]
    problem: Option<String>,
}

async fn not_found(req: Request) -> Problem {
    let path = req.uri().path();
    let detail = if path == "/v1/rpc" || path.starts_with("/v1/rpc/") {
        "/v1/rpc was removed; use /v1/acp/{serverId}".to_string()
    } else if path == "/opencode" || path.starts_with("/opencode/") {
        "the OpenCode compatibility surface is not served".to_string()
    } else {
        format!("no route for {path}")
    };
    Problem::not_found(detail)
}

async fn method_not_allowed(req: Request) -> Problem {
    Problem::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
}

/// What every request goes through, outermost first: the request log, the browser guard (Host,
/// Origin, Content-Type: `guard.rs`), the bearer token, the problem+json safety net. One middleware rather than three layers, because each
/// `from_fn_with_state` layer clones `AppState` and its inner service on every request.
async fn edge(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let method = req.method().clone();
    // A `Uri` clone shares its bytes; the path is only formatted if a line is logged.
    let uri = req.uri().clone();
    // The watchdog's own self-probe would otherwise log a line every few seconds.
    let probe = req
        .headers()
        .get(header::USER_AGENT)
        .is_some_and(|v| v.as_bytes() == b"sandbox-agent-watchdog");
    let started = Instant::now();
    let route = crate::metrics::http::route_of(&req);
    // Traces: a span per request (none while traces are off), child of the client's traceparent.
    let span = crate::telemetry::http_span(
        &method,
        crate::metrics::http::route_name(route),
        req.headers(),
    );
    let resp = match guard::check(&state.config, &req) {
        guard::Decision::Answer(answer) => answer,
        guard::Decision::Go(pass) => {
            let mut resp = match auth::check_token(&state, &mut req) {
                Some(refused) => refused,
                None => {
                    let inner = async {
                        if body_rate::applies(&req, state.config.body_min_rate) {
                            let min_rate = state.config.body_min_rate;
                            let (req, tripped) =
                                body_rate::wrap(req, state.config.idle_timeout, min_rate);
                            let resp = next.run(req).await;
                            if tripped.is_set() {
                                body_rate::too_slow(min_rate).into_response()
                            } else {
                                problem_safety_net(&state, resp).await
                            }
                        } else {
                            problem_safety_net(&state, next.run(req).await).await
                        }
                    };
                    if span.is_none() {
                        inner.await
                    } else {
                        tracing::Instrument::instrument(inner, span.clone()).await
                    }
                }
            };
            guard::finish(pass, &mut resp);
            resp
        }
    };
    let status = resp.status().as_u16();
    crate::telemetry::http_done(&span, status);
    let latency = started.elapsed();
    crate::metrics::http::record(route, &method, status, latency);
    log_request(&state.config, &method, uri.path(), probe, latency, status);
    resp
}

/// Any error answer that is not already problem+json (an axum extractor rejection, the body
/// limit, a 405 from the router) is rewritten into one, keeping its status and headers.
async fn problem_safety_net(state: &AppState, resp: Response) -> Response {
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error())
        || resp.extensions().get::<opencode::NativeError>().is_some()
    {
        return resp;
    }
    // An app's own answer through the port proxy is passed on as it is.
    if resp
        .extensions()
        .get::<crate::workspace::proxy::Passthrough>()
        .is_some()
    {
        return resp;
    }
    let is_problem = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(error::PROBLEM_JSON.as_bytes()));
    if is_problem {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, 64 * 1024)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&text).trim().to_string();
    let problem = if status == StatusCode::PAYLOAD_TOO_LARGE {
        crate::metrics::refused(crate::metrics::Limit::BodyLimit);
        Problem::payload_too_large(state.config.body_limit)
    } else if text.is_empty() {
        Problem::new(status, status.canonical_reason().unwrap_or("error"))
    } else {
        Problem::new(status, text)
    };
    let mut out = problem.into_response();
    for (name, value) in parts.headers.iter() {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            out.headers_mut().insert(name.clone(), value.clone());
        }
    }
    out
}

/// The request log: method, path (never the query or headers, so never the token), status and
/// latency to the response head. By default only what an operator must see is logged — a
/// server error (WARN), a refusal or client error (4xx, INFO), an answer slower than
/// `--slow-request` (INFO) — and every other request at DEBUG, so a busy daemon writes nothing
/// per request; `--access-log` logs every request at INFO. The watchdog's own probe is DEBUG.
fn log_request(
    config: &Config,
    method: &Method,
    path: &str,
    probe: bool,
    latency: std::time::Duration,
    status: u16,
) {
    let latency_us = latency.as_micros() as u64;
    match request_log_level(config, probe, latency, status) {
        tracing::Level::WARN => tracing::warn!(%method, path, status, latency_us, "request"),
        tracing::Level::INFO => tracing::info!(%method, path, status, latency_us, "request"),
        _ => tracing::debug!(%method, path, status, latency_us, "request"),
    }
}

fn request_log_level(
    config: &Config,
    probe: bool,
    latency: std::time::Duration,
    status: u16,
) -> tracing::Level {
    if probe {
        tracing::Level::DEBUG
    } else if status >= 500 {
        tracing::Level::WARN
    } else if config.access_log || status >= 400 || latency >= config.slow_request {
        tracing::Level::INFO
    } else {
        tracing::Level::DEBUG
    }
}
