//! `GET /v1/fs/watch`: the live change feed of a directory (`crate::files::watch`) as Server-Sent
//! Events, or as a WebSocket when the request asks for an upgrade. Framing only: the feed decides
//! what is reported; this module numbers the changes (`id`, from 1 per stream) and writes them.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::wire::watch as wire;
use super::{AppState, Problem};
use crate::files::watch::{
    IgnoreSet, Next, OverflowReason, WatchChange, WatchItem, WatchRequest, WatchStream,
};

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(watch))
        // The WebSocket of `watch` over HTTP/2; its GET documents it (openapi-exempt: CONNECT)
        .route("/v1/fs/watch", super::ws::on_connect(watch))
}

fn params(uri: &Uri) -> Result<(String, bool, IgnoreSet), Problem> {
    let pairs: Vec<(String, String)> = match uri.query() {
        None => Vec::new(),
        Some(_) => {
            Query::<Vec<(String, String)>>::try_from_uri(uri)
                .map_err(|e| Problem::bad_request(format!("bad query string: {e}")))?
                .0
        }
    };
    let mut path = None;
    let mut recursive = false;
    let mut ignore = Vec::new();
    for (k, v) in &pairs {
        match k.as_str() {
            "path" => path = Some(v.clone()),
            "recursive" => {
                recursive = match v.as_str() {
                    "true" => true,
                    "false" => false,
                    _ => {
                        return Err(Problem::bad_request(format!(
                            "recursive must be true or false, not `{v}`"
                        )));
                    }
                }
            }
            "ignore" => ignore.push(v.as_str()),
            // The WebSocket's token travels as `access_token` (removed by the edge) and other
            // parameters are ignored, as on every route.
            _ => {}
        }
    }
    let path = path
        .filter(|p| !p.is_empty())
        .ok_or_else(|| Problem::bad_request("the `path` parameter is required"))?;
    let ignore = IgnoreSet::parse(ignore).map_err(|e| Problem::bad_request(e.to_string()))?;
    Ok((path, recursive, ignore))
}

/// Follows the changes beneath a directory as they happen.
#[utoipa::path(
    get,
    path = "/v1/fs/watch",
    operation_id = "watchFs",
    tag = "fs",
    params(
        ("path" = String, Query, min_length = 1,
            description = "The directory: absolute, or relative to the working root \
                (`--work-dir`)"),
        ("recursive" = Option<bool>, Query, description = "Also every directory beneath it, \
            including those made later (default false: only the directory's own entries)"),
        ("ignore" = Option<String>, Query, description = "Comma-separated globs of entries to \
            leave out (not watched, not reported), e.g. `.git,node_modules`: `*` and `?` within \
            a name, `**` for any number of directories; a pattern without `/` matches an \
            entry's name at any depth, one with `/` its path beneath the watched directory. At \
            most 64 patterns of 256 bytes; may be repeated.", example = ".git,node_modules"),
        ("Upgrade" = Option<String>, Header, description = "`websocket` (with the other RFC \
            6455 headers) asks for the same feed over a WebSocket: one text frame per event, \
            `{\"event\":…,\"id\"?:n,\"data\":…}` with the SSE event's name, id and data",
            example = "websocket"),
    ),
    responses(
        (status = 200, description = "An endless `text/event-stream`, answered once the kernel \
            watches are installed. First `event: ready` (no id, `data: {\"path\",\"recursive\"}`); \
            then one `event: change` per change, `id: <n>` (from 1 per stream), `data:` a \
            `WatchChange` (`kind` create|modify|remove|rename, absolute `path`, `entryType`, \
            `oldPath` for a rename). `event: overflow` (no id, `data: {\"reason\":\"kernel\"|\
            \"reader\"|\"scan\"}`) says changes were lost: the client must rescan; the feed goes \
            on. `event: error` (a problem as data) ends the stream when the tree can no longer be \
            watched whole (a watch limit). Writes to one file within 50 ms are one `modify`, sent \
            when the 50 ms are over. A comment `: keepalive` comes after `--keepalive` of \
            silence. When the watched directory itself goes, a `remove` of it ends the stream.",
            content_type = "text/event-stream", body = String,
            example = json!({"event": "change", "id": "1", "data": "{\"kind\":\"create\",\"path\":\"/work/src/main.rs\",\"entryType\":\"file\"}"})),
        (status = 101, description = "With `Upgrade: websocket`: the WebSocket (see the \
            `Upgrade` parameter). Over HTTP/2 the same socket is an extended CONNECT (RFC \
            8441)"),
        (status = 400, description = "Missing or invalid parameter, a bad ignore pattern, or a \
            file where a directory is needed"),
        (status = 403, description = "Outside the configured fs root, or permission denied \
            (on the directory or one beneath it)"),
        (status = 404, description = "No such directory"),
        (status = 406, description = "`Accept` excludes `text/event-stream`"),
        (status = 500, description = "An unexpected error"),
        (status = 503, description = "All `--max-watches` streams are in use (`limit`, with \
            `Retry-After`), or the tree needs more watches than the kernel \
            (`fs.inotify.max_user_watches`, `fs.inotify.max_user_instances`) or \
            `--watch-max-dirs` allow (`setting`, `limit`)"),
    )
)]
async fn watch(
    State(st): State<AppState>,
    method: Method,
    headers: HeaderMap,
    uri: Uri,
    hold: Option<axum::Extension<crate::http::StreamHold>>,
    upgrade: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Response {
    let socket = super::ws::wants_upgrade(&method, &headers);
    let upgrade = match (socket, upgrade) {
        (false, _) => None,
        (true, Ok(u)) => Some(u),
        (true, Err(e)) => {
            return Problem::bad_request(format!("bad WebSocket upgrade: {e}")).into_response();
        }
    };
    if !socket && !super::acp::accepts(&headers, "text", "event-stream") {
        return Problem::new(
            StatusCode::NOT_ACCEPTABLE,
            "the feed is text/event-stream, which the Accept header excludes",
        )
        .into_response();
    }
    let (path, recursive, ignore) = match params(&uri) {
        Ok(p) => p,
        Err(p) => return p.into_response(),
    };
    let stream = match st
        .files
        .watches
        .watch(WatchRequest {
            path: &path,
            recursive,
            ignore,
        })
        .await
    {
        Ok(s) => s,
        Err(e) => return Problem::from(e).into_response(),
    };
    if let Some(upgrade) = upgrade {
        let hold = hold.map(|axum::Extension(h)| h);
        let shutdown = st.shutdown.clone();
        let keepalive = st.config.keepalive;
        // The client's frames are only read to notice its close: small ones suffice.
        return upgrade
            .max_message_size(64 * 1024)
            .on_upgrade(move |socket| async move {
                let _open = crate::metrics::WebSocketOpen::new();
                run_socket(socket, stream, keepalive, shutdown).await;
                drop(hold);
            });
    }
    let body = Body::from_stream(sse_frames(stream, st.config.keepalive, st.shutdown.clone()));
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

/// One item as (event name, id, data as JSON text).
fn event_of(
    item: WatchItem,
    stream: &WatchStream,
    id: &mut u64,
) -> (&'static str, Option<u64>, String) {
    match item {
        WatchItem::Ready => (
            "ready",
            None,
            json!({"path": stream.root, "recursive": stream.recursive}).to_string(),
        ),
        WatchItem::Change(c) => {
            *id += 1;
            ("change", Some(*id), change_json(c))
        }
        WatchItem::Overflow(reason) => ("overflow", None, overflow_json(reason)),
        WatchItem::Failed(e) => ("error", None, Problem::from(e).body().to_string()),
    }
}

/// In the documented member order (kind, path, entryType, oldPath).
fn change_json(c: WatchChange) -> String {
    serde_json::to_string(&wire::WatchChange::from(c)).unwrap_or_else(|_| "{}".into())
}

fn overflow_json(reason: OverflowReason) -> String {
    json!({ "reason": wire::OverflowReason::from(reason) }).to_string()
}

/// The SSE frames of one stream: a batch of items per wake-up, a keepalive comment after
/// `keepalive` of silence, the end when the feed ends or the daemon shuts down.
fn sse_frames(
    stream: WatchStream,
    keepalive: Duration,
    shutdown: CancellationToken,
) -> impl futures_util::Stream<Item = Result<Bytes, Infallible>> + Send {
    let keepalive = keepalive.max(Duration::from_millis(10));
    futures_util::stream::unfold(Some((stream, 0u64)), move |state| {
        let shutdown = shutdown.clone();
        async move {
            let (stream, mut id) = state?;
            let next = tokio::select! {
                biased;
                _ = shutdown.cancelled() => return None,
                n = stream.next() => n,
                _ = tokio::time::sleep(keepalive) => {
                    let frame = Bytes::from_static(crate::acp::events::KEEPALIVE_FRAME);
                    return Some((Ok(frame), Some((stream, id))));
                }
            };
            let items = match next {
                Next::Items(items) => items,
                Next::End { .. } => return None,
            };
            let mut out = String::new();
            for item in items {
                let (event, n, data) = event_of(item, &stream, &mut id);
                out.push_str("event: ");
                out.push_str(event);
                if let Some(n) = n {
                    out.push_str("\nid: ");
                    out.push_str(&n.to_string());
                }
                out.push_str("\ndata: ");
                out.push_str(&data);
                out.push_str("\n\n");
            }
            Some((Ok(Bytes::from(out)), Some((stream, id))))
        }
    })
}

fn close(code: u16, reason: &'static str) -> Message {
    Message::Close(Some(CloseFrame {
        code,
        reason: Utf8Bytes::from_static(reason),
    }))
}

/// The feed over a WebSocket: one text frame per event; the client's frames are read only to
/// notice its close. A client that stops reading is cut off like an SSE reader (the feed ends
/// and the socket with it, even while a write to it is blocked).
async fn run_socket(
    socket: WebSocket,
    stream: WatchStream,
    keepalive: Duration,
    shutdown: CancellationToken,
) {
    let keepalive = keepalive.max(Duration::from_millis(10));
    let (mut sink, mut incoming) = socket.split();
    let mut id = 0u64;
    loop {
        let next = tokio::select! {
            biased;
            _ = shutdown.cancelled() => {
                let _ = sink.send(close(1001, "the daemon is shutting down")).await;
                return;
            }
            msg = incoming.next() => match msg {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                Some(Ok(_)) => continue,
            },
            n = stream.next() => n,
            _ = tokio::time::sleep(keepalive) => {
                if sink.send(Message::Ping(Bytes::new())).await.is_err() {
                    return;
                }
                continue;
            }
        };
        let items = match next {
            Next::Items(items) => items,
            Next::End { cut_off } => {
                let frame = if cut_off {
                    close(1008, "the reader fell behind and was cut off")
                } else {
                    close(1000, "the watch ended")
                };
                let _ = tokio::time::timeout(keepalive, sink.send(frame)).await;
                return;
            }
        };
        let frames: Vec<Message> = items
            .into_iter()
            .map(|item| {
                let (event, n, data) = event_of(item, &stream, &mut id);
                // `data` is JSON already; spliced in, not re-encoded.
                let text = match n {
                    Some(n) => format!("{{\"event\":\"{event}\",\"id\":{n},\"data\":{data}}}"),
                    None => format!("{{\"event\":\"{event}\",\"data\":{data}}}"),
                };
                Message::Text(Utf8Bytes::from(text))
            })
            .collect();
        let send = async {
            for f in frames {
                sink.feed(f).await?;
            }
            sink.flush().await
        };
        tokio::select! {
            r = send => if r.is_err() { return },
            _ = stream.cut_off() => return,
            _ = shutdown.cancelled() => return,
        }
    }
}
