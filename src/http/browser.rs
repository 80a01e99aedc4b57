//! `/v1/browser/*`: the supervised Chromium (`crate::browser`): status, start, stop, tabs,
//! navigation, screenshots, content as text or markdown, the accessibility snapshot, and the
//! DevTools proxy (`browser_cdp.rs`). Errors: before `start` 409, bad input 400 naming the
//! field, an unknown tab 404, Chromium missing 503 naming the package, Chromium failing 502, a
//! wait running out 504. docs/browser.md.

use std::time::{Duration, UNIX_EPOCH};

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{AppState, Problem};
use crate::browser::page::{self, AxNode, ImageFormat, WaitUntil};
use crate::browser::{BrowserError, StartRequest, cdp};

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(status))
        .routes(routes!(start))
        .routes(routes!(stop))
        .routes(routes!(tabs, open_tab))
        .routes(routes!(close_tab))
        .routes(routes!(activate_tab))
        .routes(routes!(navigate))
        .routes(routes!(screenshot))
        .routes(routes!(content))
        .routes(routes!(accessibility))
        .routes(routes!(super::browser_cdp::cdp_socket))
        .routes(routes!(super::browser_cdp::cdp_version))
        .routes(routes!(super::browser_cdp::cdp_version_slash))
}

impl From<BrowserError> for Problem {
    fn from(e: BrowserError) -> Self {
        let detail = e.to_string();
        match e {
            BrowserError::NotRunning | BrowserError::Conflict(_) => {
                Problem::new(StatusCode::CONFLICT, detail)
            }
            BrowserError::Invalid { field, .. } => {
                Problem::bad_request(detail).with("field", field)
            }
            BrowserError::MissingChromium => Problem::new(StatusCode::SERVICE_UNAVAILABLE, detail)
                .with("tool", "chromium")
                .with("package", "chromium"),
            BrowserError::NotFound(_) => Problem::not_found(detail),
            BrowserError::Failed(_) => Problem::new(StatusCode::BAD_GATEWAY, detail),
            BrowserError::Unavailable(_) => Problem::new(StatusCode::SERVICE_UNAVAILABLE, detail),
            BrowserError::Timeout(_) => Problem::new(StatusCode::GATEWAY_TIMEOUT, detail),
        }
    }
}

type Answer<T> = Result<Json<T>, Problem>;

fn body<T: serde::de::DeserializeOwned + Default>(b: &Bytes) -> Result<T, Problem> {
    if b.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(b).map_err(|e| Problem::bad_request(format!("invalid JSON body: {e}")))
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BrowserLastError {
    pub code: String,
    pub message: String,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BrowserStatus {
    /// `inactive`, `starting`, `active`, `restarting` (Chromium died; the daemon starts it again
    /// after a back-off), `stopping` or `failed`.
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headless: Option<bool>,
    /// The X display it runs on (not headless).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub display: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Chromium's `Browser` string (e.g. `Chrome/131.0…`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Unix milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<BrowserLastError>,
    /// The Debian package to install when Chromium is missing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub missing_package: Option<String>,
    /// Times the daemon restarted Chromium after it died, since the last `start`.
    pub restarts: u32,
    /// Unix milliseconds of the pending restart (state `restarting`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_restart_at: Option<u64>,
}

fn unix_ms(t: std::time::SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn status_of(st: &AppState) -> BrowserStatus {
    let s = st.browser.status();
    BrowserStatus {
        state: s.state.as_str().into(),
        headless: s.headless,
        display: s.display,
        pid: s.pid,
        version: s.version,
        started_at: s.started_at.map(unix_ms),
        last_error: s
            .last_error
            .map(|(code, message)| BrowserLastError { code, message }),
        missing_package: s.missing.map(String::from),
        restarts: s.restarts,
        next_restart_at: s.next_restart_at.map(unix_ms),
    }
}

#[utoipa::path(get, path = "/v1/browser/status", operation_id = "getBrowserStatus", tag = "browser",
    responses((status = 200, description = "The browser's state", body = BrowserStatus)))]
async fn status(State(st): State<AppState>) -> Json<BrowserStatus> {
    Json(status_of(&st))
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BrowserStartRequest {
    /// Default true; false runs Chromium on the running desktop's display.
    pub headless: Option<bool>,
    /// Window (viewport) width, 64..=4096; default 1280.
    pub width: Option<u32>,
    /// 64..=4096; default 720.
    pub height: Option<u32>,
}

#[utoipa::path(post, path = "/v1/browser/start", operation_id = "startBrowser", tag = "browser",
    request_body(content = Option<BrowserStartRequest>, description = "Optional; every field has a default"),
    responses(
        (status = 200, description = "Started (or already running with these settings)", body = BrowserStatus),
        (status = 400, description = "A field out of range (named in `field`)"),
        (status = 409, description = "Starting or stopping, running with other settings, or not headless without a desktop"),
        (status = 503, description = "Chromium is not installed (package named) or did not start"),
    ))]
async fn start(State(st): State<AppState>, b: Bytes) -> Answer<BrowserStatus> {
    let req: BrowserStartRequest = body(&b)?;
    let desktop = st.desktop.display().ok().map(|d| d.name());
    st.browser
        .start(
            StartRequest {
                headful: req.headless == Some(false),
                width: req.width,
                height: req.height,
            },
            desktop,
        )
        .await?;
    Ok(Json(status_of(&st)))
}

#[utoipa::path(post, path = "/v1/browser/stop", operation_id = "stopBrowser", tag = "browser",
    responses(
        (status = 200, description = "Stopped: no Chromium process is left, its profile is removed", body = BrowserStatus),
        (status = 409, description = "Starting or stopping"),
    ))]
async fn stop(State(st): State<AppState>) -> Answer<BrowserStatus> {
    st.browser.stop().await?;
    Ok(Json(status_of(&st)))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct BrowserTab {
    pub id: String,
    pub url: String,
    pub title: String,
}

impl From<cdp::Tab> for BrowserTab {
    fn from(t: cdp::Tab) -> Self {
        BrowserTab {
            id: t.id,
            url: t.url,
            title: t.title,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct BrowserTabList {
    /// Most recently active first.
    pub tabs: Vec<BrowserTab>,
}

#[utoipa::path(get, path = "/v1/browser/tabs", operation_id = "listBrowserTabs", tag = "browser",
    responses(
        (status = 200, description = "The open tabs", body = BrowserTabList),
        (status = 409, description = "The browser is not running"),
    ))]
async fn tabs(State(st): State<AppState>) -> Answer<BrowserTabList> {
    let ep = st.browser.endpoint()?;
    let tabs = cdp::tabs(st.browser.http(), &ep).await?;
    Ok(Json(BrowserTabList {
        tabs: tabs.into_iter().map(Into::into).collect(),
    }))
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BrowserOpenTabRequest {
    /// http, https, about or data; default `about:blank`.
    pub url: Option<String>,
}

#[utoipa::path(post, path = "/v1/browser/tabs", operation_id = "openBrowserTab", tag = "browser",
    request_body(content = Option<BrowserOpenTabRequest>, description = "Optional"),
    responses(
        (status = 200, description = "The new tab", body = BrowserTab),
        (status = 400, description = "A URL that is not allowed"),
        (status = 409, description = "The browser is not running, or 32 tabs are open"),
    ))]
async fn open_tab(State(st): State<AppState>, b: Bytes) -> Answer<BrowserTab> {
    let req: BrowserOpenTabRequest = body(&b)?;
    let url = req.url.unwrap_or_else(|| "about:blank".into());
    page::check_url(&url)?;
    let ep = st.browser.endpoint()?;
    Ok(Json(cdp::open(st.browser.http(), &ep, &url).await?.into()))
}

#[utoipa::path(delete, path = "/v1/browser/tabs/{tabId}", operation_id = "closeBrowserTab", tag = "browser",
    params(("tabId" = String, Path, description = "A tab's id")),
    responses(
        (status = 204, description = "Closed"),
        (status = 400, description = "Not a tab id"),
        (status = 404, description = "No such tab"),
        (status = 409, description = "The browser is not running"),
    ))]
async fn close_tab(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, Problem> {
    let ep = st.browser.endpoint()?;
    cdp::close(st.browser.http(), &ep, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/v1/browser/tabs/{tabId}/activate", operation_id = "activateBrowserTab", tag = "browser",
    params(("tabId" = String, Path, description = "A tab's id")),
    responses(
        (status = 204, description = "Brought to the front"),
        (status = 400, description = "Not a tab id"),
        (status = 404, description = "No such tab"),
        (status = 409, description = "The browser is not running"),
    ))]
async fn activate_tab(
    State(st): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, Problem> {
    let ep = st.browser.endpoint()?;
    cdp::activate(st.browser.http(), &ep, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BrowserNavigateRequest {
    /// http, https, about or data (at most 8,192 bytes).
    pub url: String,
    /// The tab; default the most recently active one.
    pub tab_id: Option<String>,
    /// `commit`, `domcontentloaded` or `load` (default).
    pub wait_until: Option<String>,
    /// 1..=60000; default 30000.
    pub timeout_ms: Option<u64>,
}

#[utoipa::path(post, path = "/v1/browser/navigate", operation_id = "navigateBrowser", tag = "browser",
    request_body = BrowserNavigateRequest,
    responses(
        (status = 200, description = "Loaded: the tab's URL and title", body = BrowserTab),
        (status = 400, description = "A URL that is not allowed, or a field out of range"),
        (status = 404, description = "No such tab"),
        (status = 409, description = "The browser is not running"),
        (status = 502, description = "The navigation failed (e.g. the host could not be reached)"),
        (status = 504, description = "The page did not load in time"),
    ))]
async fn navigate(State(st): State<AppState>, b: Bytes) -> Answer<BrowserTab> {
    let req: BrowserNavigateRequest = serde_json::from_slice(&b)
        .map_err(|e| Problem::bad_request(format!("invalid JSON body: {e}")))?;
    page::check_url(&req.url)?;
    let wait = match req.wait_until.as_deref().unwrap_or("load") {
        "commit" => WaitUntil::Commit,
        "domcontentloaded" => WaitUntil::DomContentLoaded,
        "load" => WaitUntil::Load,
        other => {
            return Err(Problem::bad_request(format!(
                "waitUntil: {other:?} is not commit, domcontentloaded or load"
            ))
            .with("field", "waitUntil"));
        }
    };
    let timeout = match req.timeout_ms.unwrap_or(30_000) {
        t @ 1..=60_000 => Duration::from_millis(t),
        t => {
            return Err(
                Problem::bad_request(format!("timeoutMs: {t} is outside 1..=60000"))
                    .with("field", "timeoutMs"),
            );
        }
    };
    let ep = st.browser.endpoint()?;
    let tab = cdp::tab(st.browser.http(), &ep, req.tab_id.as_deref()).await?;
    Ok(Json(
        page::navigate(&ep, &tab, &req.url, wait, timeout)
            .await?
            .into(),
    ))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(rename_all = "camelCase")]
pub struct BrowserScreenshotQuery {
    pub tab_id: Option<String>,
    /// `png` (default) or `jpeg`.
    pub format: Option<String>,
    /// JPEG quality 1..=100.
    pub quality: Option<u32>,
    /// The whole page instead of the viewport (each side at most 16,384 CSS pixels; a longer
    /// page is cut there). Default false.
    pub full_page: Option<bool>,
}

#[utoipa::path(get, path = "/v1/browser/screenshot", operation_id = "getBrowserScreenshot", tag = "browser",
    params(BrowserScreenshotQuery),
    responses(
        (status = 200, description = "The tab's viewport, or the whole page with `fullPage=true` (at most 16 MiB)", content(("image/png"), ("image/jpeg"))),
        (status = 400, description = "A query value out of range"),
        (status = 404, description = "No such tab"),
        (status = 409, description = "The browser is not running"),
        (status = 502, description = "The capture failed or was too large"),
    ))]
async fn screenshot(
    State(st): State<AppState>,
    Query(q): Query<BrowserScreenshotQuery>,
) -> Result<Response, Problem> {
    let (format, ct) = match q.format.as_deref().unwrap_or("png") {
        "png" => (ImageFormat::Png, "image/png"),
        "jpeg" | "jpg" => (ImageFormat::Jpeg, "image/jpeg"),
        other => {
            return Err(
                Problem::bad_request(format!("format: {other:?} is not png or jpeg"))
                    .with("field", "format"),
            );
        }
    };
    if let Some(qv) = q.quality
        && !(1..=100).contains(&qv)
    {
        return Err(Problem::bad_request("quality: outside 1..=100").with("field", "quality"));
    }
    let ep = st.browser.endpoint()?;
    let tab = cdp::tab(st.browser.http(), &ep, q.tab_id.as_deref()).await?;
    let bytes =
        page::screenshot(&ep, &tab, format, q.quality, q.full_page.unwrap_or(false)).await?;
    Ok((
        [
            (header::CONTENT_TYPE, ct),
            (header::CACHE_CONTROL, "no-store"),
        ],
        Body::from(bytes),
    )
        .into_response())
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(rename_all = "camelCase")]
pub struct BrowserContentQuery {
    pub tab_id: Option<String>,
    /// `text` (default: the body's `innerText`) or `markdown`.
    pub format: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct BrowserContent {
    pub url: String,
    pub title: String,
    /// `text` or `markdown`.
    pub format: String,
    /// At most 2,000,000 characters.
    pub content: String,
    /// Whether `content` was cut at the cap.
    pub truncated: bool,
}

#[utoipa::path(get, path = "/v1/browser/content", operation_id = "getBrowserContent", tag = "browser",
    params(BrowserContentQuery),
    responses(
        (status = 200, description = "The page's text or markdown", body = BrowserContent),
        (status = 400, description = "A query value out of range"),
        (status = 404, description = "No such tab"),
        (status = 409, description = "The browser is not running"),
        (status = 502, description = "The page could not be read"),
    ))]
async fn content(
    State(st): State<AppState>,
    Query(q): Query<BrowserContentQuery>,
) -> Answer<BrowserContent> {
    let format = q.format.unwrap_or_else(|| "text".into());
    let markdown = match format.as_str() {
        "text" => false,
        "markdown" => true,
        other => {
            return Err(
                Problem::bad_request(format!("format: {other:?} is not text or markdown"))
                    .with("field", "format"),
            );
        }
    };
    let ep = st.browser.endpoint()?;
    let tab = cdp::tab(st.browser.http(), &ep, q.tab_id.as_deref()).await?;
    let (content, truncated) = page::content(&ep, &tab, markdown).await?;
    Ok(Json(BrowserContent {
        url: tab.url,
        title: tab.title,
        format,
        content,
        truncated,
    }))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(rename_all = "camelCase")]
pub struct BrowserAccessibilityQuery {
    pub tab_id: Option<String>,
    /// 1..=5000; default 5000.
    pub max_nodes: Option<usize>,
    /// 1..=64; default 64.
    pub max_depth: Option<usize>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct BrowserAccessibility {
    pub url: String,
    /// The tree in preorder; each node's `depth` places it under the nearest earlier node one
    /// level up. Ignored nodes and unnamed generic containers are left out (their children
    /// lifted).
    pub nodes: Vec<AxNode>,
    /// Whether the node or depth cap cut the tree.
    pub truncated: bool,
}

#[utoipa::path(get, path = "/v1/browser/accessibility", operation_id = "getBrowserAccessibility", tag = "browser",
    params(BrowserAccessibilityQuery),
    responses(
        (status = 200, description = "The accessibility snapshot", body = BrowserAccessibility),
        (status = 400, description = "A query value out of range"),
        (status = 404, description = "No such tab"),
        (status = 409, description = "The browser is not running"),
        (status = 502, description = "Chromium failed"),
    ))]
async fn accessibility(
    State(st): State<AppState>,
    Query(q): Query<BrowserAccessibilityQuery>,
) -> Answer<BrowserAccessibility> {
    let max_nodes = q.max_nodes.unwrap_or(page::MAX_AX_NODES);
    if !(1..=page::MAX_AX_NODES).contains(&max_nodes) {
        return Err(Problem::bad_request("maxNodes: outside 1..=5000").with("field", "maxNodes"));
    }
    let max_depth = q.max_depth.unwrap_or(page::MAX_AX_DEPTH);
    if !(1..=page::MAX_AX_DEPTH).contains(&max_depth) {
        return Err(Problem::bad_request("maxDepth: outside 1..=64").with("field", "maxDepth"));
    }
    let ep = st.browser.endpoint()?;
    let tab = cdp::tab(st.browser.http(), &ep, q.tab_id.as_deref()).await?;
    let (nodes, truncated) = page::accessibility(&ep, &tab, max_nodes, max_depth).await?;
    Ok(Json(BrowserAccessibility {
        url: tab.url,
        nodes,
        truncated,
    }))
}
