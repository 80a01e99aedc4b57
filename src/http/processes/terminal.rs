//! `GET /v1/processes/{id}/terminal/ws`: a process's terminal over a WebSocket — raw terminal
//! bytes as binary frames, JSON control frames (`ready`, `exit`, `error`; `input`, `resize`,
//! `close`) as text.

use super::*;

/// The terminal as a WebSocket: binary frames are terminal output (server to client) or raw
/// input; text frames are JSON control frames (`ready`, `exit`, `error` from the server;
/// `input`, `resize`, `close` from the client).
#[utoipa::path(
    get,
    path = "/v1/processes/{id}/terminal/ws",
    operation_id = "connectProcessTerminal",
    tag = "processes",
    params(
        ("id" = String, Path, description = "Process id", example = "proc_1"),
    ),
    responses(
        (status = 101, description = "Switched to the WebSocket protocol"),
        (status = 400, description = "Not a WebSocket upgrade request"),
        (status = 404, description = "No such process"),
        (status = 409, description = "The process has no terminal"),
        (status = 429, description = "16 readers follow this process already (`Retry-After`)"),
    )
)]
pub(super) async fn terminal_ws(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, Problem> {
    let slot = st.processes.reader(&id)?;
    if !slot.process.tty {
        return Err(ProcessError::Conflict {
            id,
            reason: "the process has no terminal (not started with `tty`)",
        }
        .into());
    }
    let ws = ws.map_err(|e| Problem::bad_request(format!("not a WebSocket upgrade: {e}")))?;
    // A control frame holds at most one input request (base64 is 4/3 larger) plus its framing.
    let max = (st.processes.max_input_bytes() as usize).saturating_mul(2) + 4096;
    let shutdown = st.shutdown.clone();
    let limit = st.processes.max_input_bytes();
    // The socket's task is held in the daemon's drain (see `AppState::tasks`).
    let drain = st.tasks.token();
    Ok(ws
        .max_message_size(max)
        .max_frame_size(max)
        .on_upgrade(move |socket| async move {
            let _drain = drain;
            let _open = crate::metrics::WebSocketOpen::new();
            terminal_session(socket, slot, limit, shutdown).await
        }))
}

#[derive(serde::Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum ClientFrame {
    Input {
        data: String,
        #[serde(default)]
        encoding: Option<String>,
    },
    Resize {
        cols: u32,
        rows: u32,
    },
    Close,
}

/// One terminal socket: `ready`, then the terminal's output (retained output first) as binary
/// frames, `exit` once the process has ended and all output was sent; input and resize frames
/// the other way. Bad frames are answered with an `error` frame and do not end the session.
async fn terminal_session(
    mut socket: WebSocket,
    slot: ReaderSlot,
    input_limit: u64,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let p = slot.process.clone();
    let ready = json!({ "type": "ready", "processId": p.id }).to_string();
    if socket.send(Message::Text(ready.into())).await.is_err() {
        return;
    }
    let mut rx = p.log.subscribe();
    let mut cursor = 0u64;
    loop {
        rx.borrow_and_update();
        let read = p.log.read_after(cursor, StreamFilter::Pty, BATCH_BYTES);
        cursor = read.cursor;
        for c in read.chunks {
            if socket.send(Message::Binary(c.data)).await.is_err() {
                return;
            }
        }
        if read.finished {
            let exit = p.ended().map(|(e, _)| e);
            let frame = json!({
                "type": "exit",
                "exitCode": exit.as_ref().and_then(|e| e.code),
                "signal": exit.as_ref().and_then(|e| e.signal),
            });
            let _ = socket.send(Message::Text(frame.to_string().into())).await;
            let _ = socket.send(Message::Close(None)).await;
            return;
        }
        if read.more {
            continue;
        }
        tokio::select! {
            _ = shutdown.cancelled() => {
                let _ = socket.send(Message::Close(None)).await;
                return;
            }
            changed = rx.changed() => if changed.is_err() { return },
            msg = socket.recv() => {
                let text = match msg {
                    None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                    Some(Ok(Message::Text(t))) => t,
                    Some(Ok(Message::Binary(b))) => {
                        // Raw bytes are input as they are.
                        if let Err(e) = crate::processes::write_input(&p, &b, input_limit).await {
                            let _ = send_error(&mut socket, &e.to_string()).await;
                        }
                        continue;
                    }
                    Some(Ok(_)) => continue,
                };
                let frame: ClientFrame = match serde_json::from_str(text.as_str()) {
                    Ok(f) => f,
                    Err(e) => {
                        if send_error(&mut socket, &format!("invalid frame: {e}")).await.is_err() {
                            return;
                        }
                        continue;
                    }
                };
                let result = match frame {
                    ClientFrame::Close => {
                        let _ = socket.send(Message::Close(None)).await;
                        return;
                    }
                    // The SDK sends text without an encoding and bytes as base64.
                    ClientFrame::Input { data, encoding } => {
                        match decode_input(&data, encoding.as_deref(), false) {
                            Ok(bytes) => crate::processes::write_input(&p, &bytes, input_limit)
                                .await
                                .map(|_| ())
                                .map_err(|e| e.to_string()),
                            Err(problem) => Err(problem.detail),
                        }
                    }
                    ClientFrame::Resize { cols, rows } => {
                        crate::processes::resize(&p, cols, rows).map_err(|e| e.to_string())
                    }
                };
                if let Err(message) = result
                    && send_error(&mut socket, &message).await.is_err()
                {
                    return;
                }
            }
        }
    }
}

async fn send_error(socket: &mut WebSocket, message: &str) -> Result<(), axum::Error> {
    let frame = json!({ "type": "error", "message": message }).to_string();
    socket.send(Message::Text(frame.into())).await
}
