//! `/v1/desktop/*`: the supervised X desktop (`crate::desktop`), with the reference
//! implementation's routes, bodies and status codes (docs/desktop.md). Errors: input before
//! `start` is 409, bad input 400 naming the field, a missing tool 503 naming its package, a
//! tool that failed 502.

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::files::json_problem;
use super::wire::desktop::*;
use super::{AppState, Problem};
use crate::desktop::x::{self, MouseAction, Shot, WindowOp};
use crate::desktop::{DesktopError, StartRequest};

/// The answers of every operation on the running desktop besides its own: 409 before `start`,
/// 503 when a program it needs is missing.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // only described, never built
enum NeedsDesktop {
    #[response(status = 409, description = "The desktop is not running")]
    NotRunning,
    #[response(
        status = 503,
        description = "A tool is missing (named with its Debian package)"
    )]
    MissingTool,
}

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(status))
        .routes(routes!(start))
        .routes(routes!(stop))
        .routes(routes!(display_info))
        .routes(routes!(screenshot))
        .routes(routes!(screenshot_region))
        .routes(routes!(mouse_position))
        .routes(routes!(mouse_move))
        .routes(routes!(mouse_click))
        .routes(routes!(mouse_down))
        .routes(routes!(mouse_up))
        .routes(routes!(mouse_drag))
        .routes(routes!(mouse_scroll))
        .routes(routes!(keyboard_type))
        .routes(routes!(keyboard_press))
        .routes(routes!(keyboard_down))
        .routes(routes!(keyboard_up))
        .routes(routes!(windows))
        .routes(routes!(focused_window))
        .routes(routes!(window_focus))
        .routes(routes!(window_move))
        .routes(routes!(window_resize))
        .routes(routes!(clipboard_get, clipboard_set))
        .routes(routes!(launch))
        .routes(routes!(open))
        .routes(routes!(recording_start))
        .routes(routes!(recording_stop))
        .routes(routes!(recordings))
        .routes(routes!(recording_get, recording_delete))
        .routes(routes!(recording_download))
        .routes(routes!(stream_status))
        .routes(routes!(stream_start))
        .routes(routes!(stream_stop))
        .routes(routes!(stream_signaling))
        .routes(routes!(super::desktop_stream::stream_frames))
}

impl From<DesktopError> for Problem {
    fn from(e: DesktopError) -> Self {
        let detail = e.to_string();
        match e {
            DesktopError::NotRunning | DesktopError::Conflict(_) => {
                Problem::new(StatusCode::CONFLICT, detail)
            }
            DesktopError::Invalid { field, .. } => {
                Problem::bad_request(detail).with("field", field)
            }
            DesktopError::MissingTool { tool, package } => {
                Problem::new(StatusCode::SERVICE_UNAVAILABLE, detail)
                    .with("tool", tool)
                    .with("package", package)
            }
            DesktopError::NotFound(_) => Problem::not_found(detail),
            DesktopError::Failed(_) => Problem::new(StatusCode::BAD_GATEWAY, detail),
            DesktopError::Unavailable(_) => Problem::new(StatusCode::SERVICE_UNAVAILABLE, detail),
        }
    }
}

fn json<T>(body: Result<Json<T>, JsonRejection>) -> Result<T, Problem> {
    body.map(|Json(b)| b).map_err(json_problem)
}

/// A body that may be absent (the reference's SDK sends none to some routes): empty is the
/// default.
fn optional<T: DeserializeOwned + Default>(body: &Bytes) -> Result<T, Problem> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body)
        .map_err(|e| Problem::bad_request(format!("invalid JSON body: {e}")))
}

type Answer<T> = Result<Json<T>, Problem>;

fn ok() -> Answer<DesktopActionResponse> {
    Ok(Json(DesktopActionResponse { ok: true }))
}

async fn status_of(state: &AppState) -> DesktopStatusResponse {
    let s = state.desktop.status();
    let windows = if s.state == crate::desktop::State::Active {
        state.desktop.windows().await.unwrap_or_default()
    } else {
        Vec::new()
    };
    DesktopStatusResponse::new(s, windows)
}

#[utoipa::path(get, path = "/v1/desktop/status", operation_id = "get_v1_desktop_status", tag = "desktop",
    responses((status = 200, description = "The desktop's state", body = DesktopStatusResponse)))]
async fn status(State(state): State<AppState>) -> Json<DesktopStatusResponse> {
    Json(status_of(&state).await)
}

#[utoipa::path(post, path = "/v1/desktop/start", operation_id = "post_v1_desktop_start", tag = "desktop",
    request_body(content = Option<DesktopStartRequest>, description = "Optional; every field has a default"),
    responses(
        (status = 200, description = "Started (or already running with these settings)", body = DesktopStatusResponse),
        (status = 400, description = "A field out of range (named in `field`)"),
        (status = 409, description = "Starting or stopping, running with other settings, or the display number is in use"),
        (status = 503, description = "A tool is missing (its package named) or the display server did not start"),
    ))]
async fn start(State(state): State<AppState>, body: Bytes) -> Answer<DesktopStatusResponse> {
    let req: DesktopStartRequest = optional(&body)?;
    state
        .desktop
        .start(StartRequest {
            display_num: req.display_num,
            width: req.width,
            height: req.height,
            dpi: req.dpi,
        })
        .await?;
    Ok(Json(status_of(&state).await))
}

#[utoipa::path(post, path = "/v1/desktop/stop", operation_id = "post_v1_desktop_stop", tag = "desktop",
    responses(
        (status = 200, description = "Stopped: no process of the desktop is left", body = DesktopStatusResponse),
        (status = 409, description = "Starting or stopping"),
    ))]
async fn stop(State(state): State<AppState>) -> Answer<DesktopStatusResponse> {
    state.desktop.stop().await?;
    Ok(Json(status_of(&state).await))
}

#[utoipa::path(get, path = "/v1/desktop/display/info", operation_id = "get_v1_desktop_display_info", tag = "desktop",
    responses(
        (status = 200, description = "The display", body = DesktopDisplayInfoResponse),
        NeedsDesktop,
        (status = 502, description = "A tool failed or timed out"),
    ))]
async fn display_info(State(state): State<AppState>) -> Answer<DesktopDisplayInfoResponse> {
    let d = state.desktop.display()?;
    Ok(Json(DesktopDisplayInfoResponse {
        display: d.name(),
        resolution: DesktopResolution {
            width: d.screen.width,
            height: d.screen.height,
            dpi: Some(d.screen.dpi),
        },
    }))
}

fn format_of(f: Option<&str>) -> Result<x::Format, Problem> {
    match f.unwrap_or("png") {
        "png" => Ok(x::Format::Png),
        "jpeg" | "jpg" => Ok(x::Format::Jpeg),
        "webp" => Ok(x::Format::Webp),
        other => Err(
            Problem::bad_request(format!("format: {other:?} is not png, jpeg or webp"))
                .with("field", "format"),
        ),
    }
}

async fn shot(state: &AppState, shot: Shot) -> Result<Response, Problem> {
    let ct = shot.format.content_type();
    let bytes = state.desktop.screenshot(shot).await?;
    Ok((
        [
            (header::CONTENT_TYPE, ct),
            (header::CACHE_CONTROL, "no-store"),
        ],
        Body::from(bytes),
    )
        .into_response())
}

#[utoipa::path(get, path = "/v1/desktop/screenshot", operation_id = "get_v1_desktop_screenshot", tag = "desktop",
    params(DesktopScreenshotQuery),
    responses(
        (status = 200, description = "The whole screen", content(("image/png"), ("image/jpeg"), ("image/webp"))),
        (status = 400, description = "A query value out of range"),
        NeedsDesktop,
        (status = 502, description = "The capture failed"),
    ))]
async fn screenshot(
    State(state): State<AppState>,
    Query(q): Query<DesktopScreenshotQuery>,
) -> Result<Response, Problem> {
    let s = Shot {
        format: format_of(q.format.as_deref())?,
        quality: q.quality,
        scale: q.scale,
        show_cursor: q.show_cursor.unwrap_or(false),
        region: None,
    };
    shot(&state, s).await
}

#[utoipa::path(get, path = "/v1/desktop/screenshot/region", operation_id = "get_v1_desktop_screenshot_region", tag = "desktop",
    params(DesktopRegionScreenshotQuery),
    responses(
        (status = 200, description = "The region", content(("image/png"), ("image/jpeg"), ("image/webp"))),
        (status = 400, description = "The region is not wholly on the screen, or a value is out of range"),
        NeedsDesktop,
        (status = 502, description = "The capture failed"),
    ))]
async fn screenshot_region(
    State(state): State<AppState>,
    Query(q): Query<DesktopRegionScreenshotQuery>,
) -> Result<Response, Problem> {
    let s = Shot {
        format: format_of(q.format.as_deref())?,
        quality: q.quality,
        scale: q.scale,
        show_cursor: q.show_cursor.unwrap_or(false),
        region: Some((q.x, q.y, q.width, q.height)),
    };
    shot(&state, s).await
}

#[utoipa::path(get, path = "/v1/desktop/mouse/position", operation_id = "get_v1_desktop_mouse_position", tag = "desktop",
    responses(
        (status = 200, description = "The pointer", body = DesktopMousePositionResponse),
        NeedsDesktop,
        (status = 502, description = "xdotool failed"),
    ))]
async fn mouse_position(State(state): State<AppState>) -> Answer<DesktopMousePositionResponse> {
    Ok(Json(state.desktop.mouse_position().await?.into()))
}

async fn mouse(state: &AppState, a: MouseAction) -> Answer<DesktopMousePositionResponse> {
    Ok(Json(state.desktop.mouse(a).await?.into()))
}

macro_rules! mouse_route {
    ($name:ident, $path:literal, $op:literal, $body:ty, $what:literal, |$b:ident| $action:expr) => {
        #[utoipa::path(post, path = $path, operation_id = $op, tag = "desktop",
            request_body = $body,
            responses(
                (status = 200, description = $what, body = DesktopMousePositionResponse),
                (status = 400, description = "A coordinate off the screen or a value out of range (named in `field`)"),
                NeedsDesktop,
                (status = 502, description = "xdotool failed"),
    ))]
        async fn $name(
            State(state): State<AppState>,
            body: Result<Json<$body>, JsonRejection>,
        ) -> Answer<DesktopMousePositionResponse> {
            let $b = json(body)?;
            mouse(&state, $action).await
        }
    };
}

fn button(b: Option<DesktopMouseButton>) -> u8 {
    b.unwrap_or_default().x_button()
}

fn at(x: Option<i64>, y: Option<i64>) -> Result<Option<(i64, i64)>, Problem> {
    match (x, y) {
        (Some(x), Some(y)) => Ok(Some((x, y))),
        (None, None) => Ok(None),
        _ => Err(Problem::bad_request("x and y go together").with("field", "x")),
    }
}

mouse_route!(
    mouse_move,
    "/v1/desktop/mouse/move",
    "post_v1_desktop_mouse_move",
    DesktopMouseMoveRequest,
    "The pointer after the move",
    |b| MouseAction::Move { x: b.x, y: b.y }
);
mouse_route!(
    mouse_click,
    "/v1/desktop/mouse/click",
    "post_v1_desktop_mouse_click",
    DesktopMouseClickRequest,
    "The pointer after the click",
    |b| MouseAction::Click {
        x: b.x,
        y: b.y,
        button: button(b.button),
        count: b.click_count.unwrap_or(1)
    }
);
mouse_route!(
    mouse_down,
    "/v1/desktop/mouse/down",
    "post_v1_desktop_mouse_down",
    DesktopMouseButtonRequest,
    "The pointer after the press",
    |b| MouseAction::Down {
        at: at(b.x, b.y)?,
        button: button(b.button)
    }
);
mouse_route!(
    mouse_up,
    "/v1/desktop/mouse/up",
    "post_v1_desktop_mouse_up",
    DesktopMouseButtonRequest,
    "The pointer after the release",
    |b| MouseAction::Up {
        at: at(b.x, b.y)?,
        button: button(b.button)
    }
);
mouse_route!(
    mouse_drag,
    "/v1/desktop/mouse/drag",
    "post_v1_desktop_mouse_drag",
    DesktopMouseDragRequest,
    "The pointer after the drag",
    |b| MouseAction::Drag {
        from: (b.start_x, b.start_y),
        to: (b.end_x, b.end_y),
        button: button(b.button)
    }
);
mouse_route!(
    mouse_scroll,
    "/v1/desktop/mouse/scroll",
    "post_v1_desktop_mouse_scroll",
    DesktopMouseScrollRequest,
    "The pointer after the scroll",
    |b| MouseAction::Scroll {
        x: b.x,
        y: b.y,
        dx: b.delta_x.unwrap_or(0),
        dy: b.delta_y.unwrap_or(0)
    }
);

#[utoipa::path(post, path = "/v1/desktop/keyboard/type", operation_id = "post_v1_desktop_keyboard_type", tag = "desktop",
    request_body = DesktopKeyboardTypeRequest,
    responses(
        (status = 200, description = "Typed", body = DesktopActionResponse),
        (status = 400, description = "Text too long or delay out of range"),
        NeedsDesktop,
        (status = 502, description = "xdotool failed"),
    ))]
async fn keyboard_type(
    State(state): State<AppState>,
    body: Result<Json<DesktopKeyboardTypeRequest>, JsonRejection>,
) -> Answer<DesktopActionResponse> {
    let b = json(body)?;
    state.desktop.type_text(&b.text, b.delay_ms).await?;
    ok()
}

#[utoipa::path(post, path = "/v1/desktop/keyboard/press", operation_id = "post_v1_desktop_keyboard_press", tag = "desktop",
    request_body = DesktopKeyboardPressRequest,
    responses(
        (status = 200, description = "Pressed and released", body = DesktopActionResponse),
        (status = 400, description = "Not a key name X knows"),
        NeedsDesktop,
        (status = 502, description = "xdotool failed"),
    ))]
async fn keyboard_press(
    State(state): State<AppState>,
    body: Result<Json<DesktopKeyboardPressRequest>, JsonRejection>,
) -> Answer<DesktopActionResponse> {
    let b = json(body)?;
    let m = b.modifiers.unwrap_or_default();
    let mods: Vec<&str> = [
        (m.ctrl, "ctrl"),
        (m.shift, "shift"),
        (m.alt, "alt"),
        (m.cmd, "super"),
    ]
    .into_iter()
    .filter(|(on, _)| on.unwrap_or(false))
    .map(|(_, k)| k)
    .collect();
    state.desktop.key("key", &b.key, &mods).await?;
    ok()
}

#[utoipa::path(post, path = "/v1/desktop/keyboard/down", operation_id = "post_v1_desktop_keyboard_down", tag = "desktop",
    request_body = DesktopKeyboardKeyRequest,
    responses(
        (status = 200, description = "Held down", body = DesktopActionResponse),
        (status = 400, description = "Not a key name X knows"),
        NeedsDesktop,
        (status = 502, description = "xdotool failed"),
    ))]
async fn keyboard_down(
    State(state): State<AppState>,
    body: Result<Json<DesktopKeyboardKeyRequest>, JsonRejection>,
) -> Answer<DesktopActionResponse> {
    state.desktop.key("keydown", &json(body)?.key, &[]).await?;
    ok()
}

#[utoipa::path(post, path = "/v1/desktop/keyboard/up", operation_id = "post_v1_desktop_keyboard_up", tag = "desktop",
    request_body = DesktopKeyboardKeyRequest,
    responses(
        (status = 200, description = "Released", body = DesktopActionResponse),
        (status = 400, description = "Not a key name X knows"),
        NeedsDesktop,
        (status = 502, description = "xdotool failed"),
    ))]
async fn keyboard_up(
    State(state): State<AppState>,
    body: Result<Json<DesktopKeyboardKeyRequest>, JsonRejection>,
) -> Answer<DesktopActionResponse> {
    state.desktop.key("keyup", &json(body)?.key, &[]).await?;
    ok()
}

#[utoipa::path(get, path = "/v1/desktop/windows", operation_id = "get_v1_desktop_windows", tag = "desktop",
    responses(
        (status = 200, description = "The window manager's client windows", body = DesktopWindowListResponse),
        NeedsDesktop,
        (status = 502, description = "The query failed"),
    ))]
async fn windows(State(state): State<AppState>) -> Answer<DesktopWindowListResponse> {
    let windows = state.desktop.windows().await?;
    Ok(Json(DesktopWindowListResponse {
        windows: windows.into_iter().map(Into::into).collect(),
    }))
}

#[utoipa::path(get, path = "/v1/desktop/windows/focused", operation_id = "get_v1_desktop_windows_focused", tag = "desktop",
    responses(
        (status = 200, description = "The focused window", body = DesktopWindowInfo),
        (status = 404, description = "No window has the focus"),
        NeedsDesktop,
        (status = 502, description = "A tool failed or timed out"),
    ))]
async fn focused_window(State(state): State<AppState>) -> Answer<DesktopWindowInfo> {
    Ok(Json(state.desktop.focused_window().await?.into()))
}

#[utoipa::path(post, path = "/v1/desktop/windows/{id}/focus", operation_id = "post_v1_desktop_window_focus", tag = "desktop",
    params(("id" = String, Path, description = "X window id (decimal or 0x hex)")),
    responses(
        (status = 200, description = "The window after the focus", body = DesktopWindowInfo),
        (status = 404, description = "No such window"),
        NeedsDesktop,
        (status = 502, description = "A tool failed or timed out"),
    ))]
async fn window_focus(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Answer<DesktopWindowInfo> {
    Ok(Json(
        state.desktop.window_op(&id, WindowOp::Focus).await?.into(),
    ))
}

#[utoipa::path(post, path = "/v1/desktop/windows/{id}/move", operation_id = "post_v1_desktop_window_move", tag = "desktop",
    params(("id" = String, Path, description = "X window id")),
    request_body = DesktopWindowMoveRequest,
    responses(
        (status = 200, description = "The window after the move", body = DesktopWindowInfo),
        (status = 400, description = "A coordinate out of range"),
        (status = 404, description = "No such window"),
        NeedsDesktop,
        (status = 502, description = "A tool failed or timed out"),
    ))]
async fn window_move(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Result<Json<DesktopWindowMoveRequest>, JsonRejection>,
) -> Answer<DesktopWindowInfo> {
    let b = json(body)?;
    let op = WindowOp::Move { x: b.x, y: b.y };
    Ok(Json(state.desktop.window_op(&id, op).await?.into()))
}

#[utoipa::path(post, path = "/v1/desktop/windows/{id}/resize", operation_id = "post_v1_desktop_window_resize", tag = "desktop",
    params(("id" = String, Path, description = "X window id")),
    request_body = DesktopWindowResizeRequest,
    responses(
        (status = 200, description = "The window after the resize", body = DesktopWindowInfo),
        (status = 400, description = "A side outside 1..=8192"),
        (status = 404, description = "No such window"),
        NeedsDesktop,
        (status = 502, description = "A tool failed or timed out"),
    ))]
async fn window_resize(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Result<Json<DesktopWindowResizeRequest>, JsonRejection>,
) -> Answer<DesktopWindowInfo> {
    let b = json(body)?;
    let op = WindowOp::Resize {
        width: b.width,
        height: b.height,
    };
    Ok(Json(state.desktop.window_op(&id, op).await?.into()))
}

#[utoipa::path(get, path = "/v1/desktop/clipboard", operation_id = "get_v1_desktop_clipboard", tag = "desktop",
    params(DesktopClipboardQuery),
    responses(
        (status = 200, description = "The selection's text (empty when nothing owns it)", body = DesktopClipboardResponse),
        (status = 400, description = "Not a selection name"),
        NeedsDesktop,
        (status = 502, description = "xclip failed"),
    ))]
async fn clipboard_get(
    State(state): State<AppState>,
    Query(q): Query<DesktopClipboardQuery>,
) -> Answer<DesktopClipboardResponse> {
    let sel = x::check_selection(q.selection.as_deref())?;
    let text = state.desktop.clipboard_get(sel).await?;
    Ok(Json(DesktopClipboardResponse {
        selection: sel.into(),
        text,
    }))
}

#[utoipa::path(post, path = "/v1/desktop/clipboard", operation_id = "post_v1_desktop_clipboard", tag = "desktop",
    request_body = DesktopClipboardWriteRequest,
    responses(
        (status = 200, description = "The selection holds the text", body = DesktopActionResponse),
        (status = 400, description = "Text over 64 KiB or not a selection name"),
        NeedsDesktop,
        (status = 502, description = "xclip failed"),
    ))]
async fn clipboard_set(
    State(state): State<AppState>,
    body: Result<Json<DesktopClipboardWriteRequest>, JsonRejection>,
) -> Answer<DesktopActionResponse> {
    let b = json(body)?;
    let sel = x::check_selection(b.selection.as_deref())?;
    state.desktop.clipboard_set(sel, &b.text).await?;
    ok()
}

#[utoipa::path(post, path = "/v1/desktop/launch", operation_id = "post_v1_desktop_launch", tag = "desktop",
    request_body = DesktopLaunchRequest,
    responses(
        (status = 200, description = "Started on the desktop", body = DesktopLaunchResponse),
        (status = 400, description = "Too many arguments"),
        (status = 404, description = "No such program"),
        (status = 409, description = "The desktop is not running, or 64 programs run on it"),
        (status = 502, description = "A tool failed or timed out"),
        (status = 503, description = "A tool is missing (named with its Debian package)"),
    ))]
async fn launch(
    State(state): State<AppState>,
    body: Result<Json<DesktopLaunchRequest>, JsonRejection>,
) -> Answer<DesktopLaunchResponse> {
    let b = json(body)?;
    let args = b.args.unwrap_or_default();
    let (id, pid, window) = state
        .desktop
        .launch(&b.app, &args, b.wait.unwrap_or(false))
        .await?;
    Ok(Json(DesktopLaunchResponse {
        process_id: id,
        pid: Some(pid),
        window_id: window,
    }))
}

#[utoipa::path(post, path = "/v1/desktop/open", operation_id = "post_v1_desktop_open", tag = "desktop",
    request_body = DesktopOpenRequest,
    responses(
        (status = 200, description = "Handed to xdg-open", body = DesktopOpenResponse),
        (status = 400, description = "An empty or over-long target"),
        (status = 409, description = "The desktop is not running"),
        (status = 503, description = "xdg-open is not installed (package xdg-utils)"),
        (status = 502, description = "A tool failed or timed out"),
    ))]
async fn open(
    State(state): State<AppState>,
    body: Result<Json<DesktopOpenRequest>, JsonRejection>,
) -> Answer<DesktopOpenResponse> {
    let b = json(body)?;
    if b.target.is_empty() || b.target.len() > 8192 || b.target.starts_with('-') {
        return Err(
            Problem::bad_request("target: a path or URL of 1..=8192 bytes, not an option")
                .with("field", "target"),
        );
    }
    let d = state.desktop.display()?;
    if crate::desktop::which(&d.env, "xdg-open").is_none() {
        return Err(DesktopError::MissingTool {
            tool: "xdg-open",
            package: "xdg-utils",
        }
        .into());
    }
    let (id, pid, _) = state.desktop.launch("xdg-open", &[b.target], false).await?;
    Ok(Json(DesktopOpenResponse {
        process_id: id,
        pid: Some(pid),
    }))
}

#[utoipa::path(post, path = "/v1/desktop/recording/start", operation_id = "post_v1_desktop_recording_start", tag = "desktop",
    request_body(content = Option<DesktopRecordingStartRequest>, description = "Optional"),
    responses(
        (status = 200, description = "Recording", body = DesktopRecordingInfo),
        (status = 400, description = "fps outside 1..=60"),
        (status = 409, description = "The desktop is not running, a recording runs, or 32 are kept"),
        (status = 502, description = "ffmpeg did not start"),
        (status = 503, description = "A tool is missing (named with its Debian package)"),
    ))]
async fn recording_start(
    State(state): State<AppState>,
    body: Bytes,
) -> Answer<DesktopRecordingInfo> {
    let b: DesktopRecordingStartRequest = optional(&body)?;
    Ok(Json(state.desktop.start_recording(b.fps).await?.into()))
}

#[utoipa::path(post, path = "/v1/desktop/recording/stop", operation_id = "post_v1_desktop_recording_stop", tag = "desktop",
    responses(
        (status = 200, description = "The finished recording", body = DesktopRecordingInfo),
        (status = 409, description = "No recording runs"),
    ))]
async fn recording_stop(State(state): State<AppState>) -> Answer<DesktopRecordingInfo> {
    Ok(Json(state.desktop.stop_recording().await?.into()))
}

#[utoipa::path(get, path = "/v1/desktop/recordings", operation_id = "get_v1_desktop_recordings", tag = "desktop",
    responses((status = 200, description = "Every kept recording", body = DesktopRecordingListResponse)))]
async fn recordings(State(state): State<AppState>) -> Json<DesktopRecordingListResponse> {
    Json(DesktopRecordingListResponse {
        recordings: state
            .desktop
            .recordings
            .list()
            .into_iter()
            .map(Into::into)
            .collect(),
    })
}

#[utoipa::path(get, path = "/v1/desktop/recordings/{id}", operation_id = "get_v1_desktop_recording", tag = "desktop",
    params(("id" = String, Path, description = "Recording id")),
    responses(
        (status = 200, description = "The recording", body = DesktopRecordingInfo),
        (status = 404, description = "No such recording"),
    ))]
async fn recording_get(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Answer<DesktopRecordingInfo> {
    Ok(Json(state.desktop.recordings.get(&id)?.into()))
}

#[utoipa::path(delete, path = "/v1/desktop/recordings/{id}", operation_id = "delete_v1_desktop_recording", tag = "desktop",
    params(("id" = String, Path, description = "Recording id")),
    responses(
        (status = 204, description = "Removed with its file"),
        (status = 404, description = "No such recording"),
        (status = 409, description = "Still recording"),
    ))]
async fn recording_delete(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, Problem> {
    state.desktop.recordings.delete(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/v1/desktop/recordings/{id}/download", operation_id = "get_v1_desktop_recording_download", tag = "desktop",
    params(("id" = String, Path, description = "Recording id")),
    responses(
        (status = 200, description = "The MP4 file", content_type = "video/mp4"),
        (status = 404, description = "No such recording"),
        (status = 409, description = "Still recording"),
    ))]
async fn recording_download(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, Problem> {
    let r = state.desktop.recordings.get(&id)?;
    if r.status == crate::desktop::recording::RecStatus::Recording {
        return Err(
            DesktopError::Conflict("the recording is still running; stop it first".into()).into(),
        );
    }
    let file = tokio::fs::File::open(&r.path)
        .await
        .map_err(|e| DesktopError::NotFound(format!("the recording's file is gone: {e}")))?;
    let len = file.metadata().await.map(|m| m.len()).unwrap_or(0);
    let body = Body::from_stream(tokio_util::io::ReaderStream::new(file));
    Ok((
        [
            (header::CONTENT_TYPE, "video/mp4".to_string()),
            (header::CONTENT_LENGTH, len.to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{}\"", r.file_name),
            ),
        ],
        body,
    )
        .into_response())
}

#[utoipa::path(get, path = "/v1/desktop/stream/status", operation_id = "get_v1_desktop_stream_status", tag = "desktop",
    responses((status = 200, description = "The reference's WebRTC stream is not served: always inactive", body = DesktopStreamStatusResponse)))]
async fn stream_status() -> Json<DesktopStreamStatusResponse> {
    Json(DesktopStreamStatusResponse {
        active: false,
        process_id: None,
        window_id: None,
    })
}

/// The reference's WebRTC (neko) stream is not served: its routes answer a 501 problem that
/// names the live view this daemon serves instead (`alternative`), rather than a 200 that would
/// leave a client waiting for media that never comes.
fn webrtc_not_served() -> Problem {
    Problem::new(
        StatusCode::NOT_IMPLEMENTED,
        "the WebRTC desktop stream is not served; the live view is the WebSocket GET /v1/desktop/stream/frames (JPEG frames, input back)",
    )
    .with("alternative", "/v1/desktop/stream/frames")
}

#[utoipa::path(post, path = "/v1/desktop/stream/start", operation_id = "post_v1_desktop_stream_start", tag = "desktop",
    responses((status = 501, description = "The WebRTC stream is not served; `alternative` names the live view (`/v1/desktop/stream/frames`)", body = super::openapi::ProblemSchema, content_type = "application/problem+json")))]
async fn stream_start() -> Problem {
    webrtc_not_served()
}

#[utoipa::path(post, path = "/v1/desktop/stream/stop", operation_id = "post_v1_desktop_stream_stop", tag = "desktop",
    responses((status = 501, description = "The WebRTC stream is not served; `alternative` names the live view (`/v1/desktop/stream/frames`)", body = super::openapi::ProblemSchema, content_type = "application/problem+json")))]
async fn stream_stop() -> Problem {
    webrtc_not_served()
}

#[utoipa::path(get, path = "/v1/desktop/stream/signaling", operation_id = "get_v1_desktop_stream_ws", tag = "desktop",
    responses((status = 501, description = "WebRTC signaling is not served; `alternative` names the live view (`/v1/desktop/stream/frames`)", body = super::openapi::ProblemSchema, content_type = "application/problem+json")))]
async fn stream_signaling() -> Problem {
    webrtc_not_served()
}
