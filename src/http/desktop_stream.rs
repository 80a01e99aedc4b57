//! `GET /v1/desktop/stream/frames`: the live view — a WebSocket of JPEG frames of the screen
//! (binary messages), with input events going back as JSON text messages. Through the daemon's
//! one port and its token (header, or `?access_token=` on the upgrade). Protocol in
//! docs/desktop.md, "Live view".

use std::time::Duration;

use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::response::Response;
use serde::Deserialize;
use serde_json::json;
use utoipa::IntoParams;

use super::wire::desktop::DesktopMouseButton;
use super::{AppState, Problem};
use crate::desktop::DesktopService;
use crate::desktop::x::{Format, MouseAction, Shot};

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StreamQuery {
    /// Frames per second, 1..=10; default 4. A slow reader gets fewer: the next frame is taken
    /// only once the last one was sent.
    pub fps: Option<u32>,
    /// JPEG quality 1..=100; default 60.
    pub quality: Option<u32>,
    /// 0 < scale <= 1; default 1.
    pub scale: Option<f32>,
}

/// The live view as a WebSocket: a `ready` text message (`{type, width, height}`), then one
/// binary message per frame (a JPEG image of the whole screen); the client sends input as JSON
/// text messages (`move`, `click`, `down`, `up`, `scroll`, `type`, `key`). Ends with the
/// desktop (an `end` text message) or the daemon.
#[utoipa::path(get, path = "/v1/desktop/stream/frames", operation_id = "connectDesktopStream", tag = "desktop",
    params(StreamQuery),
    responses(
        (status = 101, description = "Switched to the WebSocket protocol"),
        (status = 400, description = "Not a WebSocket upgrade, or a query value out of range"),
        (status = 409, description = "The desktop is not running"),
    ))]
pub async fn stream_frames(
    State(st): State<AppState>,
    Query(q): Query<StreamQuery>,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, Problem> {
    let fps = q.fps.unwrap_or(4);
    if !(1..=10).contains(&fps) {
        return Err(Problem::bad_request("fps: outside 1..=10").with("field", "fps"));
    }
    let quality = q.quality.unwrap_or(60);
    if !(1..=100).contains(&quality) {
        return Err(Problem::bad_request("quality: outside 1..=100").with("field", "quality"));
    }
    if let Some(s) = q.scale
        && !(s > 0.0 && s <= 1.0)
    {
        return Err(Problem::bad_request("scale: outside (0, 1]").with("field", "scale"));
    }
    let d = st.desktop.display()?;
    let ws = ws.map_err(|e| Problem::bad_request(format!("not a WebSocket upgrade: {e}")))?;
    let shot = Shot {
        format: Format::Jpeg,
        quality: Some(quality),
        scale: q.scale,
        show_cursor: true,
        region: None,
    };
    let desktop = st.desktop.clone();
    let shutdown = st.shutdown.clone();
    let drain = st.tasks.token();
    let ready = json!({"type": "ready", "width": d.screen.width, "height": d.screen.height});
    Ok(ws
        .max_message_size(64 << 10)
        .on_upgrade(move |socket| async move {
            let _drain = drain;
            let _open = crate::metrics::WebSocketOpen::new();
            let interval = Duration::from_millis(1000 / u64::from(fps));
            session(socket, desktop, shot, interval, ready, shutdown).await
        }))
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
enum Input {
    Move {
        x: i64,
        y: i64,
    },
    Click {
        x: i64,
        y: i64,
        button: Option<DesktopMouseButton>,
    },
    Down {
        x: i64,
        y: i64,
        button: Option<DesktopMouseButton>,
    },
    Up {
        x: i64,
        y: i64,
        button: Option<DesktopMouseButton>,
    },
    Scroll {
        x: i64,
        y: i64,
        #[serde(rename = "deltaX")]
        delta_x: Option<i64>,
        #[serde(rename = "deltaY")]
        delta_y: Option<i64>,
    },
    Type {
        text: String,
    },
    Key {
        key: String,
    },
}

async fn apply(desktop: &DesktopService, input: Input) -> Result<(), crate::desktop::DesktopError> {
    let b = |b: Option<DesktopMouseButton>| b.unwrap_or_default().x_button();
    let action = match input {
        Input::Type { text } => return desktop.type_text(&text, None).await,
        Input::Key { key } => return desktop.key("key", &key, &[]).await,
        Input::Move { x, y } => MouseAction::Move { x, y },
        Input::Click { x, y, button } => MouseAction::Click {
            x,
            y,
            button: b(button),
            count: 1,
        },
        Input::Down { x, y, button } => MouseAction::Down {
            at: Some((x, y)),
            button: b(button),
        },
        Input::Up { x, y, button } => MouseAction::Up {
            at: Some((x, y)),
            button: b(button),
        },
        Input::Scroll {
            x,
            y,
            delta_x,
            delta_y,
        } => MouseAction::Scroll {
            x,
            y,
            dx: delta_x.unwrap_or(0),
            dy: delta_y.unwrap_or(0),
        },
    };
    desktop.mouse(action).await.map(|_| ())
}

async fn session(
    mut socket: WebSocket,
    desktop: std::sync::Arc<DesktopService>,
    shot: Shot,
    interval: Duration,
    ready: serde_json::Value,
    shutdown: tokio_util::sync::CancellationToken,
) {
    if socket
        .send(Message::Text(ready.to_string().into()))
        .await
        .is_err()
    {
        return;
    }
    let mut next = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => {
                let _ = socket.send(Message::Close(None)).await;
                return;
            }
            _ = tokio::time::sleep_until(next) => {
                next = tokio::time::Instant::now() + interval;
                match desktop.screenshot(shot.clone()).await {
                    Ok(jpeg) => {
                        if socket.send(Message::Binary(jpeg.into())).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        let end = json!({"type": "end", "message": e.to_string()});
                        let _ = socket.send(Message::Text(end.to_string().into())).await;
                        let _ = socket.send(Message::Close(None)).await;
                        return;
                    }
                }
            }
            msg = socket.recv() => {
                let text = match msg {
                    None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                    Some(Ok(Message::Text(t))) => t,
                    Some(Ok(_)) => continue,
                };
                let result = match serde_json::from_str::<Input>(text.as_str()) {
                    Ok(input) => apply(&desktop, input).await.map_err(|e| e.to_string()),
                    Err(e) => Err(format!("invalid input message: {e}")),
                };
                if let Err(message) = result {
                    let err = json!({"type": "error", "message": message});
                    if socket.send(Message::Text(err.to_string().into())).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}
