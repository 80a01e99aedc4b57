//! The remote transports: WebSocket on `/v1/acp/{serverId}` (ordering under pipelining, resume
//! with `lastEventId`, cut-off of a reader that stops reading, one event log shared with SSE), the
//! ACP RFD transport at `/v1/agents/{agent}/acp` (status codes, streams, idle stop), WebSockets
//! over HTTP/2 (extended CONNECT), and interop with the official TypeScript, Python and Rust ACP
//! clients, unmodified (`tests/transports/`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

use crate::support::{self, Daemon, eventually, eventually_async};

pub(crate) type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

pub(crate) const TOKEN: &str = "transport-test-token";

/// A daemon with a token; RFD connections without a reader go after 3 s (unless `extra` says
/// otherwise), so that the tests of a closed WebSocket do not wait the default 30 s.
pub(crate) fn daemon(extra: &[&str]) -> Daemon {
    let mut b = Daemon::builder().token(TOKEN);
    if !extra.contains(&"--acp-connection-idle") {
        b = b.args(["--acp-connection-idle", "3s"]);
    }
    b.args(extra.iter().copied()).start()
}

pub(crate) fn request(id: Value, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

pub(crate) fn prompt(id: Value, session: &str, text: &str) -> Value {
    request(
        id,
        "session/prompt",
        json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]}),
    )
}

pub(crate) async fn connect(d: &Daemon, path: &str) -> Socket {
    let url = d.url(path).replacen("http://", "ws://", 1);
    let mut req = url.into_client_request().unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    let (ws, resp) = tokio_tungstenite::connect_async(req)
        .await
        .unwrap_or_else(|e| panic!("WebSocket to {path}: {e}"));
    assert_eq!(resp.status(), 101);
    ws
}

pub(crate) async fn send(ws: &mut Socket, msg: &Value) {
    ws.send(Message::text(msg.to_string())).await.unwrap();
}

/// The next text frame as JSON (pings skipped); `None` when the socket ended.
pub(crate) async fn next_json(ws: &mut Socket) -> Option<Value> {
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(20), ws.next())
            .await
            .expect("a frame within 20 s");
        match frame {
            Some(Ok(Message::Text(t))) => return Some(serde_json::from_str(&t).unwrap()),
            Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return None,
            Some(Ok(_)) => continue,
        }
    }
}

/// Frames until (and including) the response with `id`.
pub(crate) async fn until_response(ws: &mut Socket, id: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    loop {
        let m = next_json(ws).await.expect("the socket ended early");
        let done = m.get("method").is_none() && m["id"] == *id;
        out.push(m);
        if done {
            return out;
        }
    }
}

#[tokio::test]
async fn ws_pipelined_requests_are_all_answered_in_order() {
    let d = daemon(&[]);
    let mut ws = connect(&d, "/v1/acp/pipe?agent=mock").await;
    send(
        &mut ws,
        &request(json!(0), "initialize", json!({"protocolVersion": 1})),
    )
    .await;
    // 1,000 requests without waiting for any answer.
    for i in 1..=1000 {
        send(&mut ws, &request(json!(i), "_mock/echo", json!({"n": i}))).await;
    }
    let init = next_json(&mut ws).await.unwrap();
    assert_eq!(init["id"], 0);
    assert_eq!(init["result"]["agentInfo"]["name"], "mock");
    for i in 1..=1000 {
        let m = next_json(&mut ws).await.unwrap();
        assert_eq!(
            m["id"], i,
            "answers arrive in the order the agent wrote them"
        );
        assert_eq!(m["result"], json!({"n": i}));
    }
    // Every answer was an event of the serverId's log.
    let info = d.servers().await;
    assert_eq!(info[0]["lastEventId"], 1001);
    assert_eq!(info[0]["pendingRequests"], 0);
}

/// Frames that arrive together are written to the agent's stdin as one batch; this drives every
/// branch of that path (small lines packed together, lines over the 4 KiB atomic pipe write, more
/// than the pipe holds so the rest waits in the queue, a notification, an id that is already
/// pending) and checks that order, answers and the error of the one refused request survive.
#[tokio::test]
async fn ws_batched_frames_of_every_size_keep_order_through_the_stdin_queue() {
    let d = daemon(&[]);
    let mut ws = connect(&d, "/v1/acp/batch?agent=mock").await;
    send(
        &mut ws,
        &request(json!(0), "initialize", json!({"protocolVersion": 1})),
    )
    .await;
    assert_eq!(next_json(&mut ws).await.unwrap()["id"], 0);
    // 600 requests of 40 B to 9 KiB (about 1.5 MiB, far more than a pipe holds), sent with one
    // flush so that the daemon reads many per read. Request 7 is a prompt that hangs until
    // cancelled, so its id stays pending: a later request with id 7 must be refused.
    let padding = |i: u64| "x".repeat([10, 1500, 4090, 9000][(i % 4) as usize]);
    let mut sent = Vec::new();
    for i in 1..=600u64 {
        let msg = if i == 7 {
            prompt(json!(7), "hang", "/hang")
        } else {
            sent.push(i);
            request(json!(i), "_mock/echo", json!({"n": i, "pad": padding(i)}))
        };
        ws.feed(Message::text(msg.to_string())).await.unwrap();
        if i == 300 {
            let dup = request(json!(7), "_mock/echo", json!({"n": 7}));
            ws.feed(Message::text(dup.to_string())).await.unwrap();
        }
        if i % 100 == 0 {
            // A notification in the middle (no answer; it names no running prompt).
            let note = json!({"jsonrpc": "2.0", "method": "session/cancel",
                "params": {"sessionId": "none"}});
            ws.feed(Message::text(note.to_string())).await.unwrap();
        }
    }
    ws.flush().await.unwrap();
    let mut answered = Vec::new();
    let mut refused = Vec::new();
    while answered.len() < sent.len() {
        let m = next_json(&mut ws).await.expect("the socket ended early");
        if m.get("error").is_some() {
            refused.push(m);
            continue;
        }
        let n = m["result"]["n"].as_u64().unwrap();
        assert_eq!(m["id"], n);
        assert_eq!(m["result"]["pad"].as_str().unwrap().len(), padding(n).len());
        answered.push(n);
    }
    assert_eq!(
        answered, sent,
        "every request answered once, in the order sent"
    );
    assert_eq!(
        refused.len(),
        1,
        "only the duplicate is refused: {refused:?}"
    );
    assert_eq!(refused[0]["id"], 7);
    assert_eq!(refused[0]["error"]["data"]["status"], 409);
    // The first request 7 is still the agent's; cancelling it answers it.
    let cancel = json!({"jsonrpc": "2.0", "method": "session/cancel",
        "params": {"sessionId": "hang"}});
    send(&mut ws, &cancel).await;
    let end = until_response(&mut ws, &json!(7)).await;
    assert_eq!(end.last().unwrap()["result"]["stopReason"], "cancelled");
    let info = d.servers().await;
    assert_eq!(info[0]["pendingRequests"], 0);
    assert_eq!(info[0]["invalidStdoutLines"], 0);
}

/// Reads the whole SSE log of `server_id` until a message with response id `last`.
async fn sse_log(d: &Daemon, server_id: &str, last: &Value) -> Vec<(u64, Value)> {
    let mut resp = d
        .client()
        .get(d.url(&format!("/v1/acp/{server_id}")))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut raw = String::new();
    let mut out = Vec::new();
    loop {
        let chunk = tokio::time::timeout(Duration::from_secs(20), resp.chunk())
            .await
            .expect("SSE within 20 s")
            .unwrap()
            .expect("the stream ended early");
        raw.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(end) = raw.find("\n\n") {
            let frame: String = raw.drain(..end + 2).collect();
            let id = frame
                .lines()
                .find_map(|l| l.strip_prefix("id: "))
                .map(|v| v.parse::<u64>().unwrap());
            let data = frame.lines().find_map(|l| l.strip_prefix("data: "));
            if let (Some(id), Some(data)) = (id, data) {
                let v: Value = serde_json::from_str(data).unwrap();
                let done = v.get("method").is_none() && v["id"] == *last;
                out.push((id, v));
                if done {
                    return out;
                }
            }
        }
    }
}

#[tokio::test]
async fn ws_resume_after_a_dropped_socket_loses_nothing() {
    let d = daemon(&[]);
    let mut ws = connect(&d, "/v1/acp/resume?agent=mock").await;
    send(
        &mut ws,
        &request(json!(0), "initialize", json!({"protocolVersion": 1})),
    )
    .await;
    send(
        &mut ws,
        &request(
            json!(1),
            "session/new",
            json!({"cwd": "/", "mcpServers": []}),
        ),
    )
    .await;
    let mut seen = until_response(&mut ws, &json!(1)).await;
    assert_eq!(seen.len(), 2);
    send(&mut ws, &prompt(json!(2), "mock-1", "/stream 200")).await;
    // Take a few events of the stream, then lose the socket without a close handshake.
    for _ in 0..10 {
        seen.push(next_json(&mut ws).await.unwrap());
    }
    drop(ws);
    let last_id = seen.len() as u64;
    let mut ws = connect(&d, &format!("/v1/acp/resume?lastEventId={last_id}")).await;
    seen.extend(until_response(&mut ws, &json!(2)).await);
    // The SSE face of the same serverId shows the same log: the WebSocket frames are exactly its
    // events, in order, ids implicit and consecutive.
    let log = sse_log(&d, "resume", &json!(2)).await;
    assert_eq!(
        log.len(),
        seen.len(),
        "one frame per event, none lost or repeated"
    );
    for (i, (id, event)) in log.iter().enumerate() {
        assert_eq!(*id, i as u64 + 1);
        assert_eq!(*event, seen[i], "event {id}");
    }
    let chunks = seen
        .iter()
        .filter(|m| m["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .count();
    assert_eq!(chunks, 200);
}

#[tokio::test]
async fn ws_gap_is_announced_when_events_were_evicted() {
    let d = daemon(&["--event-buffer", "5"]);
    // The events come from POSTs to the same serverId: one log for every face.
    let post = |msg: Value| {
        d.client()
            .post(d.url("/v1/acp/gap?agent=mock"))
            .header("content-type", "application/json")
            .body(msg.to_string())
            .send()
    };
    assert_eq!(
        post(request(json!(0), "initialize", json!({})))
            .await
            .unwrap()
            .status(),
        200
    );
    let new = post(request(
        json!(1),
        "session/new",
        json!({"cwd": "/", "mcpServers": []}),
    ));
    assert_eq!(new.await.unwrap().status(), 200);
    let done = post(prompt(json!(2), "mock-1", "/stream 20"))
        .await
        .unwrap();
    assert_eq!(done.status(), 200);
    // 20 events (the chunks); the ring keeps the last 5 (16..=20).
    let mut ws = connect(&d, "/v1/acp/gap?lastEventId=3").await;
    let gap = next_json(&mut ws).await.unwrap();
    assert_eq!(gap["method"], "_sandboxagent/gap");
    assert_eq!(gap["params"], json!({"from": 4, "to": 15}));
    for n in 16..=20 {
        let m = next_json(&mut ws).await.unwrap();
        assert_eq!(
            m["params"]["update"]["content"]["text"],
            format!("chunk {n} of 20")
        );
    }
}

/// The daemon's resident memory, from /proc.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap()
        * 1024
}

#[tokio::test]
async fn ws_reader_that_stops_reading_is_cut_off_with_memory_bounded() {
    let d = daemon(&["--event-buffer", "100", "--event-buffer-bytes", "64K"]);
    let mut ws = connect(&d, "/v1/acp/slow?agent=mock").await;
    send(
        &mut ws,
        &request(json!(0), "initialize", json!({"protocolVersion": 1})),
    )
    .await;
    send(
        &mut ws,
        &request(
            json!(1),
            "session/new",
            json!({"cwd": "/", "mcpServers": []}),
        ),
    )
    .await;
    until_response(&mut ws, &json!(1)).await;
    let before = rss_bytes(d.pid());
    // About 25 MB of updates, far more than the socket buffers hold; this client reads nothing.
    send(&mut ws, &prompt(json!(2), "mock-1", "/stream 100000")).await;
    eventually_async(Duration::from_secs(60), "the prompt to finish", || async {
        let info = d.servers().await;
        (info[0]["pendingRequests"] == 0 && info[0]["lastEventId"].as_u64() > Some(100_000))
            .then_some(())
    })
    .await;
    let info = d.servers().await;
    assert_eq!(info[0]["subscribers"], 0, "the silent reader was cut off");
    let grown = rss_bytes(d.pid()).saturating_sub(before);
    assert!(
        grown < 24 << 20,
        "the daemon grew by {grown} bytes while a reader did not read 25 MB"
    );
    // The daemon dropped the socket: after what was already in flight, the stream ends.
    let mut frames = 0u64;
    loop {
        match tokio::time::timeout(Duration::from_secs(20), ws.next())
            .await
            .expect("the socket ends")
        {
            Some(Ok(Message::Close(frame))) => {
                if let Some(f) = frame {
                    assert_eq!(u16::from(f.code), 1008, "{f:?}");
                    assert!(f.reason.contains("lastEventId="), "{f:?}");
                }
                break;
            }
            Some(Ok(_)) => frames += 1,
            Some(Err(_)) | None => break,
        }
    }
    assert!(
        frames < 100_000,
        "the reader got {frames} frames, so it was never cut off"
    );
}

/// The shutdown drain waits for an open WebSocket: its client gets the close frame (1001)
/// before the daemon exits, never a cut connection.
#[tokio::test]
async fn shutdown_sends_an_open_websocket_its_close_frame() {
    let d = Daemon::start();
    let mut ws = connect(&d, "/v1/acp/drain?agent=mock").await;
    send(
        &mut ws,
        &request(json!(1), "initialize", json!({"protocolVersion": 1})),
    )
    .await;
    until_response(&mut ws, &json!(1)).await;
    d.signal(nix::sys::signal::Signal::SIGTERM);
    let close = loop {
        match tokio::time::timeout(Duration::from_secs(20), ws.next())
            .await
            .expect("the socket ends")
        {
            Some(Ok(Message::Close(frame))) => break frame,
            Some(Ok(_)) => continue,
            other => panic!("the socket was cut without a close frame: {other:?}"),
        }
    };
    let code = close.map(|f| u16::from(f.code));
    assert_eq!(code, Some(1001));
    // Reading on sends the close reply; then the daemon exits by itself (dropping `d` checks
    // that it exited 0).
    while let Ok(Some(Ok(_))) = tokio::time::timeout(Duration::from_secs(20), ws.next()).await {}
    let pid = d.pid();
    eventually_async(Duration::from_secs(20), "the daemon to exit", || async {
        (!support::pid_alive(pid)).then_some(())
    })
    .await;
}

/// Bytes the daemon has queued and not yet sent on its side of the connections to `port`
/// (`/proc/net/tcp`'s tx_queue of the sockets whose local port is the daemon's).
fn unsent_bytes_from(port: u16) -> u64 {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let local_port = u16::from_str_radix(f.get(1)?.rsplit(':').next()?, 16).ok()?;
            let tx = u64::from_str_radix(f.get(4)?.split(':').next()?, 16).ok()?;
            (local_port == port).then_some(tx)
        })
        .sum()
}

/// The drain waits for a socket that is still writing: a client that reads a large answer late
/// still gets all of it, then the close frame. (A socket task outside the daemon's tracker would
/// be cut in the middle of the frame when the daemon exits after stopping its agents.)
#[tokio::test]
async fn shutdown_waits_for_a_socket_still_writing_a_large_answer() {
    let d = Daemon::start();
    let port: u16 = d
        .url("")
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap();
    let mut ws = connect(&d, "/v1/acp/late?agent=mock").await;
    send(
        &mut ws,
        &request(json!(1), "initialize", json!({"protocolVersion": 1})),
    )
    .await;
    until_response(&mut ws, &json!(1)).await;
    let agent = d.servers().await[0]["pid"].as_u64().unwrap() as u32;
    // A 12 MiB answer the client does not read yet: the daemon's side of the socket fills up
    // and its socket task waits to write the rest.
    let pad = "x".repeat(12 << 20);
    send(
        &mut ws,
        &request(json!(2), "_mock/echo", json!({"pad": pad})),
    )
    .await;
    eventually(
        Duration::from_secs(20),
        "the daemon to be blocked writing",
        || (unsent_bytes_from(port) > 1 << 20).then_some(()),
    );
    d.signal(nix::sys::signal::Signal::SIGTERM);
    eventually(Duration::from_secs(20), "the agent to be stopped", || {
        (!support::pid_alive(agent)).then_some(())
    });
    // The daemon has nothing left to do but this socket: it must still be there.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        support::pid_alive(d.pid()),
        "the daemon exited with a socket still writing"
    );
    let mut got_answer = false;
    let close = loop {
        match tokio::time::timeout(Duration::from_secs(20), ws.next())
            .await
            .expect("the socket ends")
        {
            Some(Ok(Message::Text(t))) => {
                let v: Value = serde_json::from_str(&t).unwrap();
                if v["id"] == 2 {
                    assert_eq!(v["result"]["pad"].as_str().map(str::len), Some(12 << 20));
                    got_answer = true;
                }
            }
            Some(Ok(Message::Close(frame))) => break frame,
            Some(Ok(_)) => continue,
            other => panic!("the socket was cut without a close frame: {other:?}"),
        }
    };
    assert!(got_answer, "the large answer came whole before the close");
    assert_eq!(close.map(|f| u16::from(f.code)), Some(1001));
}

#[tokio::test]
async fn ws_upgrade_refusals_are_problems() {
    let d = daemon(&[]);
    let client = d.client();
    let upgrade = |path: &str| {
        client
            .get(d.url(path))
            .header("connection", "upgrade")
            .header("upgrade", "websocket")
            .header("sec-websocket-version", "13")
            .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
    };
    for (path, status) in [
        ("/v1/acp/nothing-here", 404),
        ("/v1/acp/x?agent=no-such-agent", 400),
        ("/v1/acp/x?agent=mock&lastEventId=soon", 400),
        ("/v1/acp/bad%20id?agent=mock", 400),
    ] {
        let resp = upgrade(path).send().await.unwrap();
        assert_eq!(resp.status().as_u16(), status, "{path}");
        assert_eq!(
            resp.headers()["content-type"],
            "application/problem+json",
            "{path}"
        );
    }
    // Without the token: 401 like every /v1 route.
    let resp = reqwest::Client::new()
        .get(d.url("/v1/acp/x?agent=mock"))
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    // A deleted serverId ends its sockets with a close frame and a reason.
    let mut ws = connect(&d, "/v1/acp/closing?agent=mock").await;
    send(
        &mut ws,
        &request(json!(0), "initialize", json!({"protocolVersion": 1})),
    )
    .await;
    until_response(&mut ws, &json!(0)).await;
    let del = client
        .delete(d.url("/v1/acp/closing"))
        .send()
        .await
        .unwrap();
    assert_eq!(del.status(), 204);
    match tokio::time::timeout(Duration::from_secs(10), ws.next())
        .await
        .unwrap()
    {
        Some(Ok(Message::Close(Some(f)))) => {
            assert_eq!(u16::from(f.code), 1000);
            assert_eq!(f.reason.as_str(), "the ACP server ended");
        }
        other => panic!("expected a close frame, got {other:?}"),
    }
}

// ---- the RFD transport -------------------------------------------------------------------

pub(crate) const RFD: &str = "/v1/agents/mock/acp";

pub(crate) struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub text: String,
}

pub(crate) async fn rfd_post(d: &Daemon, headers: &[(&str, &str)], body: &str) -> Answer {
    let mut req = d
        .client()
        .post(d.url(RFD))
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.body(body.to_string()).send().await.unwrap();
    Answer {
        status: resp.status().as_u16(),
        headers: resp.headers().clone(),
        text: resp.text().await.unwrap(),
    }
}

pub(crate) async fn rfd_initialize(d: &Daemon) -> String {
    let a = rfd_post(
        d,
        &[],
        &request(json!(0), "initialize", json!({"protocolVersion": 1})).to_string(),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text);
    let body: Value = serde_json::from_str(&a.text).unwrap();
    assert_eq!(body["id"], 0);
    assert_eq!(body["result"]["agentInfo"]["name"], "mock");
    a.headers["acp-connection-id"].to_str().unwrap().to_string()
}

/// An open RFD SSE stream.
pub(crate) struct Stream {
    resp: reqwest::Response,
    raw: String,
}

impl Stream {
    pub(crate) async fn open(d: &Daemon, conn: &str, session: Option<&str>) -> Result<Stream, u16> {
        let mut req = d
            .client()
            .get(d.url(RFD))
            .header("accept", "text/event-stream")
            .header("acp-connection-id", conn);
        if let Some(s) = session {
            req = req.header("acp-session-id", s);
        }
        let resp = req.send().await.unwrap();
        if resp.status() != 200 {
            return Err(resp.status().as_u16());
        }
        Ok(Stream {
            resp,
            raw: String::new(),
        })
    }

    /// The next message (keepalives skipped); `None` when the stream ended.
    pub(crate) async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(end) = self.raw.find("\n\n") {
                let frame: String = self.raw.drain(..end + 2).collect();
                if let Some(data) = frame.lines().find_map(|l| l.strip_prefix("data: ")) {
                    return Some(serde_json::from_str(data).unwrap());
                }
                continue;
            }
            let chunk = tokio::time::timeout(Duration::from_secs(20), self.resp.chunk())
                .await
                .expect("SSE within 20 s")
                .ok()??;
            self.raw.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }
}

#[tokio::test]
async fn rfd_http_flow_routes_responses_and_holds_session_messages() {
    let d = daemon(&[]);
    let conn = rfd_initialize(&d).await;
    // The connection is an ordinary instance, listed under a serverId derived from its id.
    let info = d.servers().await;
    assert_eq!(info.len(), 1);
    assert_eq!(info[0]["serverId"], format!("acp-conn-{conn}"));
    assert_eq!(info[0]["agent"], "mock");

    let mut main = Stream::open(&d, &conn, None).await.unwrap();
    let h = [("acp-connection-id", conn.as_str())];
    let a = rfd_post(
        &d,
        &h,
        &request(
            json!(1),
            "session/new",
            json!({"cwd": "/", "mcpServers": []}),
        )
        .to_string(),
    )
    .await;
    assert_eq!(a.status, 202, "{}", a.text);
    assert!(a.text.is_empty());
    let new = main.next().await.unwrap();
    assert_eq!(
        new["id"], 1,
        "session/new is answered on the connection stream"
    );
    let session = new["result"]["sessionId"].as_str().unwrap().to_string();

    // The prompt goes out before the session's stream is open (as the Python client may do):
    // the session's messages are held until its reader attaches.
    let a = rfd_post(&d, &h, &prompt(json!(2), &session, "/stream 3").to_string()).await;
    assert_eq!(a.status, 202);
    eventually_async(
        Duration::from_secs(10),
        "the prompt to be answered",
        || async { (d.servers().await[0]["pendingRequests"] == 0).then_some(()) },
    )
    .await;
    let mut sess = Stream::open(&d, &conn, Some(&session))
        .await
        .unwrap_or_else(|s| panic!("{s}: {}", d.stderr()));
    for i in 1..=3 {
        let m = sess.next().await.unwrap();
        assert_eq!(m["method"], "session/update");
        assert_eq!(
            m["params"]["update"]["content"]["text"],
            format!("chunk {i} of 3")
        );
    }
    let done = sess.next().await.unwrap();
    assert_eq!(done["id"], 2);
    assert_eq!(done["result"]["stopReason"], "end_turn");

    // A second reader of a stream that has one: 409.
    assert_eq!(
        Stream::open(&d, &conn, Some(&session)).await.err(),
        Some(409)
    );
    assert_eq!(Stream::open(&d, &conn, None).await.err(), Some(409));

    // A permission request goes to the session stream; the answer may come without
    // Acp-Session-Id (as the Python client sends it).
    let a = rfd_post(
        &d,
        &h,
        &prompt(json!(3), &session, "/permission").to_string(),
    )
    .await;
    assert_eq!(a.status, 202);
    let ask = sess.next().await.unwrap();
    assert_eq!(ask["method"], "session/request_permission");
    let answer = json!({"jsonrpc": "2.0", "id": ask["id"],
        "result": {"outcome": {"outcome": "selected", "optionId": "reject-once"}}});
    let a = rfd_post(&d, &h, &answer.to_string()).await;
    assert_eq!(a.status, 202);
    let chunk = sess.next().await.unwrap();
    assert_eq!(
        chunk["params"]["update"]["content"]["text"],
        "permission: reject-once"
    );
    assert_eq!(sess.next().await.unwrap()["id"], 3);

    // DELETE ends the connection: 202, streams end, the instance goes away.
    let del = d
        .client()
        .delete(d.url(RFD))
        .header("acp-connection-id", &conn)
        .send()
        .await
        .unwrap();
    assert_eq!(del.status(), 202);
    assert_eq!(main.next().await, None);
    assert_eq!(sess.next().await, None);
    assert!(d.servers().await.is_empty());
    let again = d
        .client()
        .delete(d.url(RFD))
        .header("acp-connection-id", &conn)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 404);
}

#[tokio::test]
async fn rfd_streamable_http_over_h2c_with_prior_knowledge() {
    // The RFD requires HTTP/2 for Streamable HTTP: POSTs and the long-lived GET multiplexed on
    // one h2c connection, on the same port as HTTP/1.1.
    let d = daemon(&[]);
    sandbox_agent::install_crypto_provider();
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .no_proxy()
        .build()
        .unwrap();
    let auth = format!("Bearer {TOKEN}");
    let init = h2
        .post(d.url(RFD))
        .header("authorization", &auth)
        .header("content-type", "application/json")
        .body(request(json!(0), "initialize", json!({"protocolVersion": 1})).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(init.version(), reqwest::Version::HTTP_2);
    assert_eq!(init.status(), 200);
    let conn = init.headers()["acp-connection-id"]
        .to_str()
        .unwrap()
        .to_string();
    let mut stream = h2
        .get(d.url(RFD))
        .header("authorization", &auth)
        .header("accept", "text/event-stream")
        .header("acp-connection-id", &conn)
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    assert_eq!(stream.version(), reqwest::Version::HTTP_2);
    for id in 1..=3 {
        let a = h2
            .post(d.url(RFD))
            .header("authorization", &auth)
            .header("content-type", "application/json")
            .header("acp-connection-id", &conn)
            .body(request(json!(id), "_mock/echo", json!({"n": id})).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(a.status(), 202);
    }
    let mut raw = String::new();
    let mut answered = Vec::new();
    while answered.len() < 3 {
        let chunk = tokio::time::timeout(Duration::from_secs(20), stream.chunk())
            .await
            .expect("an answer within 20 s")
            .unwrap()
            .expect("the stream stays open");
        raw.push_str(std::str::from_utf8(&chunk).unwrap());
        while let Some(end) = raw.find("\n\n") {
            let frame: String = raw.drain(..end + 2).collect();
            if let Some(data) = frame.lines().find_map(|l| l.strip_prefix("data: ")) {
                let v: Value = serde_json::from_str(data).unwrap();
                answered.push(v["id"].as_u64().unwrap());
            }
        }
    }
    assert_eq!(answered, [1, 2, 3]);
    drop(stream);
    drop(h2);
    // The daemon's drop waits for its exit; meanwhile this runtime must keep running the h2
    // client's connection task, which answers the daemon's GOAWAY and closes the connection.
    tokio::task::spawn_blocking(move || drop(d)).await.unwrap();
}

/// An HTTP/2 (h2c, prior knowledge) client doing RFC 8441 extended CONNECT, as a browser or an
/// HTTP/2-only client would for a WebSocket.
pub(crate) struct H2 {
    pub(crate) send: hyper::client::conn::http2::SendRequest<axum::body::Body>,
}

impl H2 {
    pub(crate) async fn connect(d: &Daemon) -> H2 {
        let addr = d.url("").trim_start_matches("http://").to_string();
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (send, conn) =
            hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .handshake(hyper_util::rt::TokioIo::new(tcp))
                .await
                .unwrap();
        let mut conn = Box::pin(conn);
        // The server announces extended CONNECT in its SETTINGS; drive the connection until
        // they arrived.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !conn.is_extended_connect_protocol_enabled() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the daemon never enabled extended CONNECT"
            );
            let _ = tokio::time::timeout(Duration::from_millis(10), conn.as_mut()).await;
        }
        tokio::spawn(conn);
        H2 { send }
    }

    /// `CONNECT path` with `:protocol websocket`; the response and, on 200, the socket.
    pub(crate) async fn socket(
        &mut self,
        d: &Daemon,
        path: &str,
    ) -> (
        axum::http::Response<hyper::body::Incoming>,
        Option<
            tokio_tungstenite::WebSocketStream<hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>>,
        >,
    ) {
        let req = axum::http::Request::builder()
            .method(axum::http::Method::CONNECT)
            .uri(d.url(path))
            .extension(hyper::ext::Protocol::from_static("websocket"))
            .header("sec-websocket-version", "13")
            .header("authorization", format!("Bearer {TOKEN}"))
            .body(axum::body::Body::empty())
            .unwrap();
        let mut resp = self.send.send_request(req).await.unwrap();
        if resp.status() != 200 {
            return (resp, None);
        }
        let io = hyper::upgrade::on(&mut resp).await.unwrap();
        let ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
            hyper_util::rt::TokioIo::new(io),
            tokio_tungstenite::tungstenite::protocol::Role::Client,
            None,
        )
        .await;
        (resp, Some(ws))
    }
}

/// Sends `msg` and returns the frames up to its answer.
async fn h2_round_trip<S>(ws: &mut tokio_tungstenite::WebSocketStream<S>, msg: &Value) -> Value
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    ws.send(Message::text(msg.to_string())).await.unwrap();
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(20), ws.next())
            .await
            .expect("a frame within 20 s")
            .expect("the socket stays open")
            .unwrap();
        if let Message::Text(t) = frame {
            let v: Value = serde_json::from_str(&t).unwrap();
            if v["id"] == msg["id"] {
                return v;
            }
        }
    }
}

#[tokio::test]
async fn ws_over_http2_extended_connect_on_both_endpoints() {
    // Short idle and header timeouts and long pings: the h2 connection must stay up while a
    // WebSocket on it is open, although no ordinary request is in flight, and the socket's
    // frames (which look like the start of a next request to the connection's clock) or its
    // silence would otherwise close it within a second.
    let d = daemon(&[
        "--idle-timeout",
        "1s",
        "--header-read-timeout",
        "1s",
        "--keepalive",
        "60s",
    ]);
    let mut h2 = H2::connect(&d).await;
    let (resp, ws) = h2.socket(&d, "/v1/acp/h2?agent=mock").await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.version(), axum::http::Version::HTTP_2);
    let mut ws = ws.unwrap();
    let init = request(json!(0), "initialize", json!({"protocolVersion": 1}));
    let answer = h2_round_trip(&mut ws, &init).await;
    assert_eq!(answer["result"]["agentInfo"]["name"], "mock");
    // A second socket on the same connection: the RFD profile, announcing its connection.
    let (resp, rfd) = h2.socket(&d, RFD).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().contains_key("acp-connection-id"));
    let mut rfd = rfd.unwrap();
    let answer = h2_round_trip(&mut rfd, &init).await;
    assert_eq!(answer["result"]["agentInfo"]["name"], "mock");
    // Twice the idle timeout with nothing moving (this waits for something that must not
    // happen, so there is no state to poll for).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let echo = request(json!(1), "_mock/echo", json!({"n": 1}));
    assert_eq!(
        h2_round_trip(&mut ws, &echo).await["result"],
        json!({"n": 1})
    );
    assert_eq!(
        h2_round_trip(&mut rfd, &echo).await["result"],
        json!({"n": 1})
    );
    // A bad upgrade (no `sec-websocket-version`) is a problem, like its HTTP/1.1 form.
    let req = axum::http::Request::builder()
        .method(axum::http::Method::CONNECT)
        .uri(d.url("/v1/acp/h2"))
        .extension(hyper::ext::Protocol::from_static("websocket"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .body(axum::body::Body::empty())
        .unwrap();
    let resp = h2.send.send_request(req).await.unwrap();
    assert_eq!(resp.status(), 400);
    assert_eq!(resp.headers()["content-type"], "application/problem+json");
    ws.close(None).await.unwrap();
    rfd.close(None).await.unwrap();
    drop(h2);
    // The daemon's drop waits for its exit; meanwhile this runtime keeps running the h2
    // connection task, which answers the daemon's GOAWAY.
    tokio::task::spawn_blocking(move || drop(d)).await.unwrap();
}

#[tokio::test]
async fn rfd_refusals_are_problems() {
    let d = daemon(&[]);
    let init = request(json!(0), "initialize", json!({"protocolVersion": 1})).to_string();
    let check = |a: &Answer, status: u16| {
        assert_eq!(a.status, status, "{}", a.text);
        assert_eq!(a.headers["content-type"], "application/problem+json");
    };
    // Not initialize without a connection: 400. Unknown connection: 404. Batch: 400.
    let a = rfd_post(
        &d,
        &[],
        &request(json!(1), "session/new", json!({})).to_string(),
    )
    .await;
    check(&a, 400);
    let a = rfd_post(&d, &[("acp-connection-id", "nope")], &init).await;
    check(&a, 404);
    let a = rfd_post(&d, &[], &format!("[{init}]")).await;
    check(&a, 400);
    // Wrong content type 415; Accept without JSON 406.
    let resp = d
        .client()
        .post(d.url(RFD))
        .header("content-type", "text/plain")
        .body(init.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 415);
    let a = rfd_post(&d, &[("accept", "text/html")], &init).await;
    check(&a, 406);
    // Unknown agent: 404 (the path names it).
    let resp = d
        .client()
        .post(d.url("/v1/agents/no-such-agent/acp"))
        .header("content-type", "application/json")
        .body(init.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    // GET without the header 400, unknown 404, wrong Accept 406; DELETE without it 400.
    let get = |conn: Option<&str>, accept: &str| {
        let mut r = d.client().get(d.url(RFD)).header("accept", accept);
        if let Some(c) = conn {
            r = r.header("acp-connection-id", c);
        }
        r
    };
    assert_eq!(
        get(None, "text/event-stream")
            .send()
            .await
            .unwrap()
            .status(),
        400
    );
    assert_eq!(
        get(Some("nope"), "text/event-stream")
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    let conn = rfd_initialize(&d).await;
    assert_eq!(
        get(Some(&conn), "application/json")
            .send()
            .await
            .unwrap()
            .status(),
        406
    );
    assert_eq!(
        d.client().delete(d.url(RFD)).send().await.unwrap().status(),
        400
    );
    // The connection belongs to its agent.
    let resp = d
        .client()
        .get(d.url("/v1/agents/claude/acp"))
        .header("accept", "text/event-stream")
        .header("acp-connection-id", &conn)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 409);
    // Without the token: 401 like every /v1 route.
    let resp = reqwest::Client::new()
        .post(d.url(RFD))
        .header("content-type", "application/json")
        .body(init)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
}

#[tokio::test]
async fn rfd_connection_without_a_reader_is_stopped_after_the_idle_time() {
    let d = daemon(&["--acp-connection-idle", "1s"]);
    let conn = rfd_initialize(&d).await;
    let pid = d.servers().await[0]["pid"].as_u64().unwrap() as u32;
    // Nobody opens a stream: 1 s after the initialize POST the agent is stopped.
    eventually_async(
        Duration::from_secs(30),
        "the idle connection to go",
        || async { d.servers().await.is_empty().then_some(()) },
    )
    .await;
    eventually_async(
        Duration::from_secs(30),
        "the agent process to exit",
        || async { (!support::pid_alive(pid)).then_some(()) },
    )
    .await;
    let resp = d
        .client()
        .get(d.url(RFD))
        .header("accept", "text/event-stream")
        .header("acp-connection-id", &conn)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
}

#[tokio::test]
async fn rfd_connection_whose_agent_exited_reports_the_exit_then_goes() {
    let d = daemon(&[]);
    let conn = rfd_initialize(&d).await;
    let h = [("acp-connection-id", conn.as_str())];
    let mut main = Stream::open(&d, &conn, None).await.unwrap();
    let new = request(
        json!(1),
        "session/new",
        json!({"cwd": "/", "mcpServers": []}),
    );
    assert_eq!(rfd_post(&d, &h, &new.to_string()).await.status, 202);
    assert_eq!(main.next().await.unwrap()["id"], 1);
    let crash = prompt(json!(2), "mock-1", "/crash 3");
    assert_eq!(rfd_post(&d, &h, &crash.to_string()).await.status, 202);
    // The stream ends with the agent; a later POST learns how it ended.
    assert_eq!(main.next().await, None);
    let a = rfd_post(
        &d,
        &h,
        &request(json!(3), "_mock/echo", json!({})).to_string(),
    )
    .await;
    assert_eq!(a.status, 502, "{}", a.text);
    let body: Value = serde_json::from_str(&a.text).unwrap();
    assert_eq!(body["exitCode"], 3);
    // With no reader left, the connection and its instance go after the idle time.
    eventually_async(
        Duration::from_secs(30),
        "the exited connection to go",
        || async { d.servers().await.is_empty().then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn rfd_websocket_profile_announces_its_connection_and_ends_with_the_socket() {
    let d = daemon(&[]);
    let url = d.url(RFD).replacen("http://", "ws://", 1);
    let mut req = url.into_client_request().unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    let (mut ws, resp) = tokio_tungstenite::connect_async(req).await.unwrap();
    let conn = resp.headers()["acp-connection-id"]
        .to_str()
        .unwrap()
        .to_string();
    send(
        &mut ws,
        &request(json!(0), "initialize", json!({"protocolVersion": 1})),
    )
    .await;
    send(
        &mut ws,
        &request(
            json!(1),
            "session/new",
            json!({"cwd": "/", "mcpServers": []}),
        ),
    )
    .await;
    send(&mut ws, &prompt(json!(2), "mock-1", "/stream 2")).await;
    let frames = until_response(&mut ws, &json!(2)).await;
    assert_eq!(frames[0]["id"], 0);
    assert_eq!(frames[1]["id"], 1);
    assert_eq!(frames.len(), 5);
    assert_eq!(d.servers().await[0]["serverId"], format!("acp-conn-{conn}"));
    // Closing the socket sends no DELETE; the connection ends after the idle time.
    ws.close(None).await.unwrap();
    eventually_async(Duration::from_secs(30), "the connection to go", || async {
        d.servers().await.is_empty().then_some(())
    })
    .await;
}

// ---- the official clients ----------------------------------------------------------------

fn interop_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/transports")
}

fn tool_works(cmd: &str, args: &[&str]) -> bool {
    std::process::Command::new(cmd)
        .args(args)
        .current_dir(interop_dir())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs one official client against a fresh daemon and checks what it saw, then that its
/// instance is gone. `script` is the file an interpreter runs (none for the Rust binary).
async fn interop(program: &str, script: Option<&str>, mode: &str) {
    let d = daemon(&[]);
    let out = tokio::process::Command::new(program)
        .args(script)
        .arg(mode)
        .arg(d.url(""))
        .arg(TOKEN)
        .current_dir(interop_dir())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), out)
        .await
        .expect("the client finishes within 60 s")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{program} {script:?} {mode} failed ({}):\n{stdout}\n{}\ndaemon:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        d.stderr()
    );
    let seen: Value = serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap();
    assert_eq!(seen["agent"], "mock");
    assert_eq!(seen["streamedStop"], "end_turn");
    assert_eq!(
        seen["texts"],
        json!([
            "chunk 1 of 3",
            "chunk 2 of 3",
            "chunk 3 of 3",
            "permission: allow-once"
        ]),
        "streamed updates and the permission answer"
    );
    assert_eq!(seen["permissionAsked"], 1);
    assert_eq!(seen["permissionStop"], "end_turn");
    assert_eq!(seen["cancelledStop"], "cancelled");
    // Closed: by DELETE (HTTP) or by the socket's end and the idle time (WebSocket).
    eventually_async(
        Duration::from_secs(30),
        "the connection's instance to go",
        || async { d.servers().await.is_empty().then_some(()) },
    )
    .await;
}

fn ts_ready() -> bool {
    if !tool_works("node", &["--version"]) {
        support::skip("node is not installed (.ci/install-transports.sh)");
        return false;
    }
    if !interop_dir()
        .join("node_modules/@agentclientprotocol/sdk/package.json")
        .exists()
    {
        support::skip("tests/transports/node_modules is missing (.ci/install-transports.sh)");
        return false;
    }
    true
}

fn python_ready() -> bool {
    if !tool_works("python3", &["-c", "import acp.http.client, acp.ws.client"]) {
        support::skip(
            "python3 with agent-client-protocol[http] is missing (.ci/install-transports.sh)",
        );
        return false;
    }
    true
}

#[tokio::test]
async fn typescript_sdk_http_client_interop() {
    if ts_ready() {
        interop("node", Some("ts-client.mjs"), "http").await;
    }
}

#[tokio::test]
async fn typescript_sdk_websocket_client_interop() {
    if ts_ready() {
        interop("node", Some("ts-client.mjs"), "ws").await;
    }
}

#[tokio::test]
async fn python_sdk_http_client_interop() {
    if python_ready() {
        interop("python3", Some("py-client.py"), "http").await;
    }
}

#[tokio::test]
async fn python_sdk_websocket_client_interop() {
    if python_ready() {
        interop("python3", Some("py-client.py"), "ws").await;
    }
}

/// The Rust client (`tests/transports/rust`, its own project and lock file), built offline into
/// `target/interop-rust` from the crates `.ci/install-wsperf.sh` fetched (and built); a skip when
/// they were not fetched. Built once per test process.
fn rust_client() -> Option<PathBuf> {
    static BUILT: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let manifest = interop_dir().join("rust/Cargo.toml");
            let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/interop-rust");
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
            let fetched = std::process::Command::new(&cargo)
                .args(["fetch", "--locked", "--offline", "--manifest-path"])
                .arg(&manifest)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !fetched {
                return None;
            }
            let out = std::process::Command::new(&cargo)
                .args([
                    "build",
                    "--locked",
                    "--offline",
                    "--quiet",
                    "--manifest-path",
                ])
                .arg(&manifest)
                .arg("--target-dir")
                .arg(&target)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "building the Rust ACP client failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            Some(target.join("debug/acp-interop-rust"))
        })
        .clone()
}

fn rust_ready() -> Option<String> {
    let bin = rust_client();
    if bin.is_none() {
        support::skip("the crates of the Rust ACP client are not fetched (.ci/install-wsperf.sh)");
    }
    bin.map(|b| b.to_string_lossy().into_owned())
}

#[tokio::test]
async fn rust_sdk_http_client_interop() {
    if let Some(bin) = rust_ready() {
        interop(&bin, None, "http").await;
    }
}

#[tokio::test]
async fn rust_sdk_websocket_client_interop() {
    if let Some(bin) = rust_ready() {
        interop(&bin, None, "ws").await;
    }
}
