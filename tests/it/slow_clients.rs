//! Slow and unfinished clients hold a bounded share of the daemon, through the real binary: a late
//! SSE subscriber that reserves no more than it is sent, and WebSocket messages that never get
//! their final frame. Each load-shaped attack checks that `/v1/health` keeps answering while it
//! runs and that an honest request of the same kind succeeds. How fast health answers under the
//! attack is a measurement, not a test: `cargo bench --bench edge` (docs/performance.md).

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::Daemon;

/// The daemon's peak virtual size in MiB (`VmPeak`: every reservation counts, even one never
/// touched).
fn vm_peak_mib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmPeak:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap()
        / 1024
}

/// Probes `GET /v1/health` one after the other until `stop` resolves and at least `MIN_PROBES`
/// were answered, asserting each is a 200; returns how many were. Each probe may take up to
/// 30 s: that bound only catches a daemon that stopped answering, it measures nothing (on a
/// loaded machine the window `stop` gives may hold fewer probes; the callers keep their attack
/// up until this returns).
async fn health_answers(d: &Daemon, stop: impl std::future::Future<Output = ()>) -> usize {
    const MIN_PROBES: usize = 20;
    let client = d.client();
    let url = d.url("/v1/health");
    let mut answered = 0;
    tokio::pin!(stop);
    loop {
        let probe = async {
            let r = client
                .get(&url)
                .timeout(Duration::from_secs(30))
                .send()
                .await
                .expect("/v1/health answers while the attack runs");
            assert_eq!(r.status(), 200);
        };
        tokio::select! {
            _ = &mut stop, if answered >= MIN_PROBES => return answered,
            _ = probe => answered += 1,
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_sse_subscriber_reserves_no_more_than_it_is_sent() {
    // One 62 KB event, then 16,000 small ones, then `done`; the agent then waits.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("burst.sh");
    std::fs::write(
        &script,
        "pad=$(head -c 62000 /dev/zero | tr '\\0' x)\n\
         printf '{\"jsonrpc\":\"2.0\",\"method\":\"big\",\"params\":{\"pad\":\"%s\"}}\\n' \"$pad\"\n\
         seq 16000 | sed 's/.*/{\"jsonrpc\":\"2.0\",\"method\":\"n\",\"params\":&}/'\n\
         echo '{\"jsonrpc\":\"2.0\",\"method\":\"done\"}'\n\
         exec sleep 600\n",
    )
    .unwrap();
    let agents = dir.path().join("agents.toml");
    std::fs::write(
        &agents,
        format!(
            "[[agent]]\nid = \"burst\"\ncommand = \"/bin/sh\"\nargs = [\"{}\"]\n",
            script.display()
        ),
    )
    .unwrap();
    let d = Daemon::builder()
        .arg("--agents-file")
        .arg(&agents)
        .args(["--event-buffer", "20000"])
        .start();
    let r = d
        .client()
        .post(d.url("/v1/acp/late?agent=burst"))
        .header("content-type", "application/json")
        .body(r#"{"jsonrpc":"2.0","method":"hello"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    crate::support::eventually_async(Duration::from_secs(20), "every event logged", || async {
        d.servers()
            .await
            .into_iter()
            .find(|s| s["serverId"] == "late")
            .filter(|s| s["lastEventId"].as_u64() >= Some(16002))
            .map(|_| ())
    })
    .await;
    let before = vm_peak_mib(d.pid());
    // Three late subscribers replay the whole log.
    for _ in 0..3 {
        let resp = d
            .client()
            .get(d.url("/v1/acp/late"))
            .header("accept", "text/event-stream")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let mut stream = futures_util::StreamExt::fuse(resp.bytes_stream());
        let mut tail = Vec::new();
        let mut total = 0usize;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let chunk =
                tokio::time::timeout_at(deadline, futures_util::StreamExt::next(&mut stream))
                    .await
                    .expect("the replay arrives")
                    .expect("the stream stays open")
                    .unwrap();
            total += chunk.len();
            tail.extend_from_slice(&chunk);
            if tail.windows(6).any(|w| w == b"\"done\"") {
                break;
            }
            let keep = tail.len().saturating_sub(16);
            tail.drain(..keep);
        }
        assert!(
            total > 62_000 + 16_000 * 40,
            "the whole log was replayed: {total}"
        );
    }
    let after = vm_peak_mib(d.pid());
    // Each replay's first wake-up used to reserve 62 KB × 16,001 ≈ 1 GB.
    assert!(
        after < before + 256,
        "VmPeak went from {before} MiB to {after} MiB"
    );
}

/// The daemon's resident memory in MiB.
fn rss_mib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map(|kib| kib / 1024)
}

/// An HTTP/1.1 WebSocket handshake on a raw TCP stream (frames are then written by hand).
async fn raw_socket(d: &Daemon, path: &str) -> tokio::net::TcpStream {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = d.url("").trim_start_matches("http://").to_string();
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let auth = d
        .token
        .as_ref()
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n{auth}\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut b).await.unwrap(), 1, "the handshake answer");
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    s
}

/// A masked (all-zero key) client frame header: `first` is FIN + opcode.
fn frame_header(first: u8, len: u64) -> Vec<u8> {
    let mut h = vec![first, 0x80 | 127];
    h.extend_from_slice(&len.to_be_bytes());
    h.extend_from_slice(&[0, 0, 0, 0]);
    h
}

/// Reads frames until a close frame (its code), the end of the stream (`None`) or `within`.
async fn close_code(s: &mut tokio::net::TcpStream, within: Duration) -> Option<u16> {
    use tokio::io::AsyncReadExt;
    let deadline = tokio::time::Instant::now() + within;
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        // Server frames are unmasked; only the lengths below 126 matter for control frames.
        while buf.len() >= 2 {
            let len = match buf[1] & 0x7f {
                126 if buf.len() >= 4 => (u16::from_be_bytes([buf[2], buf[3]]) as usize, 4),
                127 if buf.len() >= 10 => (
                    u64::from_be_bytes(buf[2..10].try_into().unwrap()) as usize,
                    10,
                ),
                126 | 127 => break,
                n => (n as usize, 2),
            };
            if buf.len() < len.1 + len.0 {
                break;
            }
            if buf[0] & 0x0f == 0x8 {
                let payload = &buf[len.1..len.1 + len.0];
                return Some(if payload.len() >= 2 {
                    u16::from_be_bytes([payload[0], payload[1]])
                } else {
                    1005
                });
            }
            buf.drain(..len.1 + len.0);
        }
        match tokio::time::timeout_at(deadline, s.read(&mut chunk)).await {
            Err(_) => panic!("the socket was neither closed nor ended within {within:?}"),
            Ok(Ok(0)) | Ok(Err(_)) => return None,
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A tokio-tungstenite client on an ACP WebSocket path.
async fn ws_client(
    d: &Daemon,
    path: &str,
) -> tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>> {
    let url = d.url(path).replacen("http://", "ws://", 1);
    let (ws, resp) = tokio_tungstenite::connect_async(url)
        .await
        .unwrap_or_else(|e| panic!("WebSocket to {path}: {e}"));
    assert_eq!(resp.status(), 101);
    ws
}

/// Sends `initialize` (id 1) as two fragments `gap` apart and waits for its answer.
async fn initialize_in_fragments<S>(ws: &mut tokio_tungstenite::WebSocketStream<S>, gap: Duration)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
    let text = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": 1}})
    .to_string();
    let (a, b) = text.split_at(text.len() / 2);
    ws.send(Message::Frame(Frame::message(
        a.as_bytes().to_vec(),
        OpCode::Data(Data::Text),
        false,
    )))
    .await
    .unwrap();
    tokio::time::sleep(gap).await;
    ws.send(Message::Frame(Frame::message(
        b.as_bytes().to_vec(),
        OpCode::Data(Data::Continue),
        true,
    )))
    .await
    .unwrap();
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(20), ws.next())
            .await
            .expect("an answer within 20 s")
            .expect("the socket stays open")
            .unwrap();
        if let Message::Text(t) = frame {
            let v: Value = serde_json::from_str(&t).unwrap();
            if v["id"] == 1 {
                assert_eq!(v["result"]["agentInfo"]["name"], "mock", "{v}");
                return;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_websocket_messages_hold_a_bounded_share_and_honest_messages_pass() {
    use tokio::io::AsyncWriteExt;
    let d = Daemon::builder()
        .args(["--acp-inflight-bytes", "4M", "--body-limit", "4M"])
        .start();
    // The instance the attack talks to exists first (its start is not part of the attack).
    let mut warm = ws_client(&d, "/v1/acp/atk?agent=mock").await;
    initialize_in_fragments(&mut warm, Duration::ZERO).await;
    let before = rss_mib(d.pid()).expect("the daemon's RSS");
    // 24 sockets, each a text message of 2 MiB sent as two 1 MiB frames, never finished: 48 MiB
    // (and the library's buffers around them) the daemon used to hold until the sockets closed.
    const SOCKETS: usize = 24;
    const MIB: usize = 1 << 20;
    let mut attackers = Vec::new();
    for _ in 0..SOCKETS {
        attackers.push(raw_socket(&d, "/v1/acp/atk").await);
    }
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let attack = tokio::spawn(async move {
        let sends = attackers.into_iter().map(|mut s| async move {
            let payload = vec![b' '; MIB];
            for i in 0..2 {
                let first = if i == 0 { 0x01 } else { 0x00 };
                if s.write_all(&frame_header(first, MIB as u64)).await.is_err()
                    || s.write_all(&payload).await.is_err()
                {
                    break;
                }
            }
            s
        });
        futures_util::future::join_all(sends).await
    });
    let pid = d.pid();
    let done_seen = done.clone();
    let peak = tokio::spawn(async move {
        let mut peak = 0;
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            peak = peak.max(rss_mib(pid).unwrap_or(0));
            if done_seen.load(std::sync::atomic::Ordering::Acquire) || Instant::now() > until {
                return peak;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let honest = async {
        // An honest client's WebSocket message (fragmented, even) goes through meanwhile.
        let mut ws = ws_client(&d, "/v1/acp/honest?agent=mock").await;
        initialize_in_fragments(&mut ws, Duration::from_millis(100)).await;
        attack.await.unwrap()
    };
    let (answered, mut sockets) = {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let probe = health_answers(&d, async {
            let _ = rx.await;
        });
        let run = async {
            let s = honest.await;
            // The attack goes on while its sockets are held: keep probing for a while.
            tokio::time::sleep(Duration::from_secs(2)).await;
            let _ = tx.send(());
            s
        };
        tokio::join!(probe, run)
    };
    assert!(answered >= 20, "only {answered} health probes answered");
    // Sockets past the budget were told why (1013) and closed.
    let mut refused = 0;
    for s in &mut sockets {
        if let Ok(Some(1013)) = tokio::time::timeout(
            Duration::from_millis(500),
            close_code(s, Duration::from_secs(5)),
        )
        .await
        {
            refused += 1;
        }
    }
    done.store(true, std::sync::atomic::Ordering::Release);
    let peak = peak.await.unwrap();
    assert!(refused > 0, "no socket was refused for the budget");
    assert!(
        peak < before + 40,
        "the daemon went from {before} MiB to {peak} MiB holding unfinished messages"
    );
    // Once the attackers hang up, their shares come back: a 2 MiB POST body fits again.
    drop(sockets);
    let body = json!({"jsonrpc": "2.0", "id": 9, "method": "_mock/echo",
        "params": {"pad": "x".repeat(2 << 20)}})
    .to_string();
    crate::support::eventually_async(
        Duration::from_secs(10),
        "the in-flight budget back",
        || async {
            let r = d
                .client()
                .post(d.url("/v1/acp/atk"))
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await
                .unwrap();
            (r.status() == 200).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unfinished_websocket_message_is_closed_at_its_deadline_on_every_socket_kind() {
    use tokio::io::AsyncWriteExt;
    let d = Daemon::builder()
        .token(crate::transports::TOKEN)
        .args(["--idle-timeout", "2s"])
        .start();
    // Our endpoint and the RFD profile over HTTP/1.1: a message begun, then silence.
    for path in ["/v1/acp/slow?agent=mock", "/v1/agents/mock/acp"] {
        let mut s = raw_socket(&d, path).await;
        s.write_all(&frame_header(0x01, 100)).await.unwrap();
        s.write_all(&[b' '; 40]).await.unwrap();
        let t = Instant::now();
        assert_eq!(
            close_code(&mut s, Duration::from_secs(15)).await,
            Some(1008),
            "{path}"
        );
        assert!(
            t.elapsed() >= Duration::from_millis(1500),
            "{path}: closed too early"
        );
    }
    // The same over HTTP/2 (extended CONNECT): a first fragment, then nothing.
    let mut h2 = crate::transports::H2::connect(&d).await;
    let (resp, ws) = h2.socket(&d, "/v1/acp/slow2?agent=mock").await;
    assert_eq!(resp.status(), 200);
    let mut ws = ws.unwrap();
    {
        use futures_util::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::Message;
        use tokio_tungstenite::tungstenite::protocol::frame::Frame;
        use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
        ws.send(Message::Frame(Frame::message(
            b"{\"jsonrpc\":".to_vec(),
            OpCode::Data(Data::Text),
            false,
        )))
        .await
        .unwrap();
        let code = loop {
            match tokio::time::timeout(Duration::from_secs(15), ws.next())
                .await
                .expect("closed within 15 s")
            {
                Some(Ok(Message::Close(Some(f)))) => break u16::from(f.code),
                Some(Ok(_)) => continue,
                other => panic!("ended without a close frame: {other:?}"),
            }
        };
        assert_eq!(code, 1008);
    }
    // A message whose fragments arrive within the deadline is answered, on every kind.
    let mut ws = ws_client_with_token(&d, "/v1/acp/ok?agent=mock").await;
    initialize_in_fragments(&mut ws, Duration::from_millis(500)).await;
    let (_, ws2) = h2.socket(&d, "/v1/acp/ok2?agent=mock").await;
    initialize_in_fragments(&mut ws2.unwrap(), Duration::from_millis(500)).await;
    drop(h2);
    tokio::task::spawn_blocking(move || drop(d)).await.unwrap();
}

async fn ws_client_with_token(
    d: &Daemon,
    path: &str,
) -> tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let url = d.url(path).replacen("http://", "ws://", 1);
    let mut req = url.into_client_request().unwrap();
    if let Some(t) = &d.token {
        req.headers_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    let (ws, resp) = tokio_tungstenite::connect_async(req).await.unwrap();
    assert_eq!(resp.status(), 101);
    ws
}
