//! One socket served, whichever face opened it (ours or the RFD profile's, `http/rfd.rs`): the
//! reader that batches the client's frames to the agent, the writer that sends the event log.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{Message, Utf8Bytes};

use super::{MeterReport, Refusal, Socket};
use crate::acp::connection::ReaderGuard;
use crate::acp::frames::{LogItem, parse_frame};
use crate::acp::jsonrpc::parse_envelope;
use crate::acp::{self, AcpError, Connection, Subscription};
use crate::http::{AppState, Problem};

/// What one socket serves.
pub struct SocketPlan {
    pub server_id: String,
    pub sub: Subscription,
    /// The id of the last event before the first one this socket sends.
    pub after: u64,
    /// Announce evicted events with a `_sandboxagent/gap` notification (our endpoint); the RFD
    /// profile speaks plain ACP and only logs them.
    pub gap_notifications: bool,
    /// The RFD connection this socket is the reader of (its idle clock stops while it is open).
    pub connection: Option<(Arc<Connection>, ReaderGuard)>,
    /// Over HTTP/2: its connection's in-flight mark, held until the socket ends.
    pub hold: Option<crate::http::StreamHold>,
}

/// Why the daemon closes a socket.
fn close(code: u16, reason: impl Into<String>) -> Message {
    let mut reason: String = reason.into();
    // A close frame's payload is at most 125 bytes, two of which are the code.
    if reason.len() > 123 {
        let mut cut = 123;
        while !reason.is_char_boundary(cut) {
            cut -= 1;
        }
        reason.truncate(cut);
    }
    Message::Close(Some(CloseFrame {
        code: CloseCode::from(code),
        reason: Utf8Bytes::from(reason),
    }))
}

/// Serves one socket until either side ends it.
pub async fn run_socket(socket: Socket, st: AppState, plan: SocketPlan) {
    let report = socket.get_ref().report();
    let (sink, stream) = socket.split();
    // Frames the daemon itself answers (errors) go through the writer, so that one task writes.
    let (own_tx, own_rx) = mpsc::channel::<Message>(64);
    let reader = read_frames(stream, &st, &plan.server_id, own_tx, report);
    let writer = write_frames(sink, &st, &plan, own_rx);
    tokio::select! {
        _ = reader => {}
        _ = writer => {}
    }
    if let Some((conn, _guard)) = &plan.connection {
        tracing::debug!(connection_id = %conn.id, "ACP WebSocket closed");
    }
}

/// At most this many frames, or about this many bytes, that one read of the socket brought are
/// delivered to the agent together (one write to its stdin per 4 KiB instead of one per frame).
const BATCH_FRAMES: usize = 256;
const BATCH_BYTES: usize = 256 * 1024;

/// Forwards the client's frames to the agent, in order, without waiting for responses. Frames
/// that are already decoded when the first one is taken (a client that pipelines sends many per
/// TCP segment) are delivered as one batch.
async fn read_frames(
    mut stream: futures_util::stream::SplitStream<Socket>,
    st: &AppState,
    server_id: &str,
    own_tx: mpsc::Sender<Message>,
    report: Arc<MeterReport>,
) {
    use futures_util::FutureExt;
    let mut frames: Vec<Option<Message>> = Vec::new();
    let mut envelopes: Vec<acp::Envelope> = Vec::new();
    loop {
        // `None` stands for the end of the stream or a broken one.
        let first = stream.next().await.and_then(Result::ok);
        let mut bytes = first.as_ref().map_or(0, payload_len);
        frames.push(first);
        while frames.len() < BATCH_FRAMES && bytes < BATCH_BYTES {
            // Only what needs no wait: the library decodes it from bytes already read.
            let Some(next) = stream.next().now_or_never() else {
                break;
            };
            let next = next.and_then(Result::ok);
            bytes += next.as_ref().map_or(0, payload_len);
            let end = next.is_none();
            frames.push(next);
            if end {
                break;
            }
        }
        for frame in frames.drain(..) {
            let text = match frame {
                Some(Message::Text(t)) => Bytes::from(t),
                Some(Message::Close(_)) => {
                    // What came before the close still goes to the agent.
                    deliver(st, server_id, &mut envelopes, &own_tx).await;
                    // Let the writer complete the closing handshake (the library queued the
                    // reply), then end.
                    if own_tx.send(Message::Close(None)).await.is_ok() {
                        let _ = tokio::time::timeout(Duration::from_secs(1), own_tx.closed()).await;
                    }
                    return;
                }
                None => {
                    deliver(st, server_id, &mut envelopes, &own_tx).await;
                    // Ended by the meter: say why (the writer sends it, then the socket ends).
                    if let Some(why) = report.refusal() {
                        let frame = match why {
                            Refusal::BudgetFull => {
                                crate::metrics::refused(crate::metrics::Limit::AcpInflightBytes);
                                close(
                                    1013,
                                    "an unfinished message does not fit the daemon's in-flight budget; try again later",
                                )
                            }
                            Refusal::TooSlow => close(
                                1008,
                                format!(
                                    "a message was not completed within {} of its first frame (--idle-timeout)",
                                    humantime::format_duration(st.config.idle_timeout)
                                ),
                            ),
                        };
                        tracing::info!(server_id, refusal = ?why, "a WebSocket was closed for an unfinished message");
                        if own_tx.send(frame).await.is_ok() {
                            let _ =
                                tokio::time::timeout(Duration::from_secs(1), own_tx.closed()).await;
                        }
                    }
                    return;
                }
                // Binary frames are ignored (the RFD's rule); pings are answered by the library.
                Some(_) => continue,
            };
            let envelope = if text.len() > 256 * 1024 {
                crate::sys::blocking(move || parse_envelope(text)).await
            } else {
                parse_envelope(text)
            };
            match envelope {
                Ok(e) => envelopes.push(e),
                Err(e) => {
                    let code = match e {
                        acp::EnvelopeError::Json(_) => -32700,
                        _ => -32600,
                    };
                    let problem = Problem::from(AcpError::from(e)).with("serverId", server_id);
                    let frame = error_frame(serde_json::Value::Null, code, &problem);
                    if own_tx.send(frame).await.is_err() {
                        return;
                    }
                }
            }
        }
        if !deliver(st, server_id, &mut envelopes, &own_tx).await {
            return;
        }
    }
}

/// While traces are on, each request of a batch gets its ACP span and the agent its context as
/// `params._meta.traceparent` (a client's own `_meta.traceparent` is the parent: a WebSocket has
/// no request of its own to carry one). Empty while traces are off.
fn trace_batch(
    st: &AppState,
    server_id: &str,
    envelopes: &mut Vec<acp::Envelope>,
) -> Vec<(acp::IdKey, tracing::Span)> {
    if !crate::telemetry::enabled() {
        return Vec::new();
    }
    let mut spans = Vec::new();
    for env in std::mem::take(envelopes) {
        let (env, span) = crate::http::trace::trace_request(st, env, server_id, None, false);
        if let acp::Kind::Request { key, .. } = &env.kind
            && !span.is_none()
        {
            spans.push((key.clone(), span));
        }
        envelopes.push(env);
    }
    spans
}

/// Ends a batch's spans: a WebSocket does not wait for answers, so a request's span covers its
/// delivery (`sent`), or names why it was refused.
fn end_spans(
    spans: Vec<(acp::IdKey, tracing::Span)>,
    posted: &Result<Vec<(Option<acp::IdKey>, AcpError)>, AcpError>,
) {
    for (key, span) in spans {
        let refused = match posted {
            Err(e) => Some(e),
            Ok(refused) => refused
                .iter()
                .find(|(id, _)| id.as_ref() == Some(&key))
                .map(|(_, e)| e),
        };
        match refused {
            Some(e) => crate::telemetry::acp_done(&span, crate::http::trace::failure(e), true),
            None => crate::telemetry::acp_done(&span, "sent", false),
        }
    }
}

/// Delivers one batch (emptying `envelopes`); a request that could not be delivered is answered
/// with a JSON-RPC error. False when the socket should end (the agent cannot start, or the
/// writer is gone).
async fn deliver(
    st: &AppState,
    server_id: &str,
    envelopes: &mut Vec<acp::Envelope>,
    own_tx: &mpsc::Sender<Message>,
) -> bool {
    if envelopes.is_empty() {
        return true;
    }
    // `gitBase` of a session this batch creates or loads (rare: two substring scans a line).
    for env in envelopes.iter() {
        if let acp::Kind::Request { key, .. } = &env.kind {
            crate::workspace::sessions::watch_answer(
                &st.workspace,
                &st.acp,
                server_id,
                key,
                &env.line,
            )
            .await;
        }
    }
    let spans = trace_batch(st, server_id, envelopes);
    let posted = st.acp.post_batch(server_id, envelopes).await;
    if !spans.is_empty() {
        end_spans(spans, &posted);
    }
    let refused = match posted {
        Ok(r) => r,
        Err(e) => {
            // The agent cannot start (or the serverId is gone): nothing more can happen.
            let problem = Problem::from(e);
            for env in envelopes.drain(..) {
                if let acp::Kind::Request { key, .. } = env.kind
                    && own_tx
                        .send(error_frame(id_value(&key), -32603, &problem))
                        .await
                        .is_err()
                {
                    return false;
                }
            }
            let _ = own_tx.send(close(1011, problem.detail.clone())).await;
            return false;
        }
    };
    for (id, e) in refused {
        if let Some(id) = id {
            let problem = Problem::from(e);
            if own_tx
                .send(error_frame(id_value(&id), -32603, &problem))
                .await
                .is_err()
            {
                return false;
            }
        }
    }
    true
}

fn payload_len(m: &Message) -> usize {
    match m {
        Message::Text(t) => t.len(),
        Message::Binary(b) => b.len(),
        _ => 0,
    }
}

fn id_value(id: &acp::IdKey) -> serde_json::Value {
    serde_json::from_str(&id.0).unwrap_or(serde_json::Value::Null)
}

/// A JSON-RPC error response made by the daemon; `data` is the problem object.
fn error_frame(id: serde_json::Value, code: i64, problem: &Problem) -> Message {
    let body = json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": { "code": code, "message": problem.title, "data": problem.body() },
    });
    Message::Text(Utf8Bytes::from(body.to_string()))
}

/// Resolves once `sub` was cut off (polled: the log cuts a subscriber without waking a blocked
/// writer).
async fn cut_off(sub: &Subscription) {
    loop {
        if sub.is_cut() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Writes the event log (and the daemon's own frames) to the socket.
async fn write_frames(
    mut sink: futures_util::stream::SplitSink<Socket, Message>,
    st: &AppState,
    plan: &SocketPlan,
    mut own_rx: mpsc::Receiver<Message>,
) {
    let keepalive = st.config.keepalive.max(Duration::from_millis(10));
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + keepalive, keepalive);
    let mut last_sent = plan.after;
    let sub = &plan.sub;
    let mut batch: Vec<Message> = Vec::new();
    let mut frames: Vec<Bytes> = Vec::new();
    loop {
        let end: Option<Message> = tokio::select! {
            biased;
            _ = st.shutdown.cancelled() => Some(close(1001, "the daemon is shutting down")),
            own = own_rx.recv() => match own {
                Some(m @ Message::Close(_)) => Some(m),
                Some(m) => { batch.push(m); None }
                None => return,
            },
            next = sub.next_into(&mut frames) => match next {
                acp::Batch::Frames => {
                    for frame in frames.drain(..) {
                        match parse_frame(frame) {
                            Some(LogItem::Message { id, json, .. }) => {
                                last_sent = id;
                                batch.push(Message::Text(text_of(json)));
                            }
                            Some(LogItem::Gap { from, to }) => {
                                if plan.gap_notifications {
                                    let gap = json!({"jsonrpc": "2.0", "method": "_sandboxagent/gap",
                                        "params": {"from": from, "to": to}});
                                    batch.push(Message::Text(Utf8Bytes::from(gap.to_string())));
                                } else {
                                    tracing::warn!(server_id = %plan.server_id, from, to,
                                        "a WebSocket reader missed evicted events");
                                }
                            }
                            None => {}
                        }
                    }
                    None
                }
                acp::Batch::End => Some(close(1000, "the ACP server ended")),
                acp::Batch::CutOff => {
                    tracing::info!(server_id = %plan.server_id,
                        "a WebSocket reader fell behind and was disconnected");
                    Some(close(1008, format!("fell behind; resume with lastEventId={last_sent}")))
                }
            },
            _ = ping.tick() => { batch.push(Message::Ping(Bytes::new())); None }
        };
        if !batch.is_empty() {
            let n = batch.len();
            let mut frames = futures_util::stream::iter(batch.drain(..).map(Ok));
            // The send is polled first: when the socket takes the batch at once (the common
            // case), the cut-off watch and its timer are never set up.
            let sent = tokio::select! {
                biased;
                r = sink.send_all(&mut frames) => r.is_ok(),
                _ = cut_off(sub) => {
                    // The reader stopped reading: its queue is already dropped; drop the socket
                    // too (a close frame could not get through a full TCP buffer).
                    tracing::info!(server_id = %plan.server_id, pending = n,
                        "a WebSocket reader stopped reading and was disconnected");
                    return;
                }
                // A stop or a reload does not cut a write under way: the client gets the whole
                // message, then the close frame. The drain bounds the wait (the shutdown grace,
                // a reload's 5 s), after which the connection is dropped.
            };
            if !sent {
                return;
            }
        }
        if let Some(close_frame) = end {
            let _ = tokio::time::timeout(Duration::from_secs(1), sink.send(close_frame)).await;
            return;
        }
    }
}

fn text_of(json: Bytes) -> Utf8Bytes {
    match Utf8Bytes::try_from(json.clone()) {
        Ok(t) => t,
        // A text frame must be UTF-8; an agent line that is not is passed on with replacements.
        Err(_) => Utf8Bytes::from(String::from_utf8_lossy(&json).into_owned()),
    }
}
