//! The desktop API's bodies (`/v1/desktop/*`), shaped as the reference implementation's
//! (sandbox-agent 0.4.2) so that its SDK works unchanged: camelCase fields, the same names.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::desktop::{self, x};

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DesktopStartRequest {
    /// The X display number (`:N`); default 99. Honoured exactly: a display in use is 409.
    pub display_num: Option<u32>,
    /// Screen width, 16..=8192; default 1440.
    pub width: Option<u32>,
    /// Screen height, 16..=8192; default 900.
    pub height: Option<u32>,
    /// 10..=1000; default 96.
    pub dpi: Option<u32>,
    /// Accepted for compatibility; recordings take their rate at their own start.
    pub recording_fps: Option<i32>,
    /// Accepted for compatibility and ignored (the daemon's data dir is used).
    pub state_dir: Option<String>,
    /// Accepted for compatibility and ignored (the live view is `/v1/desktop/stream/frames`).
    pub stream_audio_codec: Option<String>,
    /// Accepted for compatibility and ignored.
    pub stream_frame_rate: Option<i32>,
    /// Accepted for compatibility and ignored.
    pub stream_video_codec: Option<String>,
    /// Accepted for compatibility and ignored.
    pub webrtc_port_range: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DesktopResolution {
    pub width: u32,
    pub height: u32,
    pub dpi: Option<u32>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DesktopErrorInfo {
    pub code: String,
    pub message: String,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DesktopProcessInfo {
    pub name: String,
    pub pid: Option<u32>,
    pub running: bool,
    /// Always null: the children's stderr goes to the daemon's log.
    pub log_path: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DesktopStatusResponse {
    /// `inactive`, `install_required`, `starting`, `active`, `stopping` or `failed`.
    pub state: String,
    pub display: Option<String>,
    pub resolution: Option<DesktopResolution>,
    pub started_at: Option<String>,
    pub last_error: Option<DesktopErrorInfo>,
    /// Debian packages of the tools missing from PATH.
    pub missing_dependencies: Vec<String>,
    pub install_command: Option<String>,
    pub processes: Vec<DesktopProcessInfo>,
    pub runtime_log_path: Option<String>,
    /// The visible windows, when the desktop is active.
    pub windows: Vec<DesktopWindowInfo>,
}

impl DesktopStatusResponse {
    pub fn new(s: desktop::Status, windows: Vec<x::Window>) -> Self {
        let state = if s.state == desktop::State::Inactive && !s.missing.is_empty() {
            "install_required"
        } else {
            s.state.as_str()
        };
        DesktopStatusResponse {
            state: state.into(),
            display: s.display,
            resolution: s.screen.map(|r| DesktopResolution {
                width: r.width,
                height: r.height,
                dpi: Some(r.dpi),
            }),
            started_at: s
                .started_at
                .map(|t| humantime::format_rfc3339_seconds(t).to_string()),
            last_error: s
                .last_error
                .map(|(code, message)| DesktopErrorInfo { code, message }),
            install_command: (!s.missing.is_empty())
                .then(|| format!("apt-get install -y {}", s.missing.join(" "))),
            missing_dependencies: s.missing.iter().map(|p| p.to_string()).collect(),
            processes: s
                .processes
                .into_iter()
                .map(|p| DesktopProcessInfo {
                    name: p.name,
                    pid: p.pid,
                    running: p.running,
                    log_path: None,
                })
                .collect(),
            runtime_log_path: None,
            windows: windows.into_iter().map(Into::into).collect(),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DesktopDisplayInfoResponse {
    pub display: String,
    pub resolution: DesktopResolution,
}

#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum DesktopScreenshotFormat {
    Png,
    Jpeg,
    Webp,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct DesktopScreenshotQuery {
    /// `png` (default), `jpeg` or `webp`.
    pub format: Option<String>,
    /// 1..=100 (JPEG, WebP); default 85.
    pub quality: Option<u32>,
    /// 0 < scale <= 1.
    pub scale: Option<f32>,
    /// Draw the pointer; default false.
    pub show_cursor: Option<bool>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct DesktopRegionScreenshotQuery {
    pub x: i64,
    pub y: i64,
    /// The region must lie wholly on the screen (else 400).
    pub width: i64,
    pub height: i64,
    pub format: Option<String>,
    pub quality: Option<u32>,
    pub scale: Option<f32>,
    pub show_cursor: Option<bool>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DesktopMousePositionResponse {
    pub x: i64,
    pub y: i64,
    pub screen: Option<i64>,
    pub window: Option<String>,
}

impl From<x::MousePosition> for DesktopMousePositionResponse {
    fn from(p: x::MousePosition) -> Self {
        DesktopMousePositionResponse {
            x: p.x,
            y: p.y,
            screen: p.screen,
            window: p.window,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum DesktopMouseButton {
    #[default]
    Left,
    Middle,
    Right,
}

impl DesktopMouseButton {
    pub fn x_button(self) -> u8 {
        match self {
            DesktopMouseButton::Left => 1,
            DesktopMouseButton::Middle => 2,
            DesktopMouseButton::Right => 3,
        }
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DesktopMouseMoveRequest {
    pub x: i64,
    pub y: i64,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DesktopMouseClickRequest {
    pub x: i64,
    pub y: i64,
    pub button: Option<DesktopMouseButton>,
    /// 1..=10; default 1.
    pub click_count: Option<i64>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DesktopMouseButtonRequest {
    pub x: Option<i64>,
    pub y: Option<i64>,
    pub button: Option<DesktopMouseButton>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DesktopMouseDragRequest {
    pub start_x: i64,
    pub start_y: i64,
    pub end_x: i64,
    pub end_y: i64,
    pub button: Option<DesktopMouseButton>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DesktopMouseScrollRequest {
    pub x: i64,
    pub y: i64,
    /// Wheel clicks, -100..=100; negative is left.
    pub delta_x: Option<i64>,
    /// Wheel clicks, -100..=100; negative is up.
    pub delta_y: Option<i64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DesktopActionResponse {
    pub ok: bool,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DesktopKeyboardTypeRequest {
    /// Any Unicode text, at most 64 KiB.
    pub text: String,
    /// Between keystrokes, 0..=1000; default 12.
    pub delay_ms: Option<u32>,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DesktopKeyModifiers {
    pub ctrl: Option<bool>,
    pub shift: Option<bool>,
    pub alt: Option<bool>,
    /// The Super key.
    pub cmd: Option<bool>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DesktopKeyboardPressRequest {
    /// An X key name (`Return`, `a`, `F5`, `ctrl+c`); an unknown name is 400.
    pub key: String,
    pub modifiers: Option<DesktopKeyModifiers>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DesktopKeyboardKeyRequest {
    pub key: String,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DesktopWindowInfo {
    /// The X window id, in decimal.
    pub id: String,
    pub title: String,
    pub x: i64,
    pub y: i64,
    pub width: i64,
    pub height: i64,
    pub is_active: bool,
}

impl From<x::Window> for DesktopWindowInfo {
    fn from(w: x::Window) -> Self {
        DesktopWindowInfo {
            id: w.id,
            title: w.title,
            x: w.x,
            y: w.y,
            width: w.width,
            height: w.height,
            is_active: w.active,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DesktopWindowListResponse {
    pub windows: Vec<DesktopWindowInfo>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DesktopWindowMoveRequest {
    pub x: i64,
    pub y: i64,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DesktopWindowResizeRequest {
    /// 1..=8192.
    pub width: i64,
    /// 1..=8192.
    pub height: i64,
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DesktopClipboardQuery {
    /// `clipboard` (default), `primary` or `secondary`.
    pub selection: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DesktopClipboardResponse {
    pub selection: String,
    pub text: String,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DesktopClipboardWriteRequest {
    /// At most 64 KiB.
    pub text: String,
    pub selection: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DesktopLaunchRequest {
    /// A program name found in PATH, or an absolute path.
    pub app: String,
    pub args: Option<Vec<String>>,
    /// Wait up to 10 s for a window of the new process.
    pub wait: Option<bool>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DesktopLaunchResponse {
    pub process_id: String,
    pub pid: Option<u32>,
    pub window_id: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DesktopOpenRequest {
    /// A file path or URL, handed to `xdg-open`.
    pub target: String,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DesktopOpenResponse {
    pub process_id: String,
    pub pid: Option<u32>,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DesktopRecordingStartRequest {
    /// 1..=60; default 30.
    pub fps: Option<u32>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DesktopRecordingInfo {
    pub id: String,
    pub file_name: String,
    pub bytes: u64,
    pub started_at: String,
    pub ended_at: Option<String>,
    /// `recording`, `completed` or `failed`.
    pub status: String,
    pub process_id: Option<String>,
}

impl From<desktop::recording::Recording> for DesktopRecordingInfo {
    fn from(r: desktop::recording::Recording) -> Self {
        let t = |t| humantime::format_rfc3339_seconds(t).to_string();
        DesktopRecordingInfo {
            process_id: Some(r.id.clone()),
            id: r.id,
            file_name: r.file_name,
            bytes: r.bytes,
            started_at: t(r.started_at),
            ended_at: r.ended_at.map(t),
            status: r.status.as_str().into(),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DesktopRecordingListResponse {
    pub recordings: Vec<DesktopRecordingInfo>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DesktopStreamStatusResponse {
    pub active: bool,
    pub process_id: Option<String>,
    pub window_id: Option<String>,
}
