//! The edge seen from outside: browser rules (Host, Origin, Content-Type), the auth scheme,
//! connection timeouts and caps, the accept loop under descriptor exhaustion, HTTP/2 with prior
//! knowledge, and start-up validation of the edge's settings.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{BIN, Daemon, eventually, http};

/// One raw HTTP/1.1 exchange with `Connection: close`: status and the whole answer text.
fn raw(addr: &str, head: &str, body: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    (status, text)
}

fn get_with_host(addr: &str, path: &str, host: &str) -> (u16, String) {
    raw(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
        b"",
    )
}

fn assert_problem(text: &str, status: u16) {
    assert!(
        text.to_ascii_lowercase()
            .contains("content-type: application/problem+json"),
        "{text}"
    );
    assert!(text.contains(&format!("\"status\":{status}")), "{text}");
}

fn port(d: &Daemon) -> &str {
    d.addr.rsplit(':').next().unwrap()
}

#[test]
fn foreign_host_is_refused_without_a_token() {
    let d = Daemon::builder()
        .args(["--allowed-hosts", "box.internal,api.example:8443"])
        .start();
    let p = port(&d);
    for host in [
        "localhost".to_string(),
        format!("localhost:{p}"),
        format!("127.0.0.1:{p}"),
        "app.localhost".to_string(),
        "box.internal:9".to_string(),
        "api.example:8443".to_string(),
    ] {
        let (status, text) = get_with_host(&d.addr, "/v1/health", &host);
        assert_eq!(status, 200, "{host}: {text}");
    }
    // A DNS-rebinding page sends its own name; reads are refused as much as writes.
    for host in [
        "evil.example".to_string(),
        format!("evil.example:{p}"),
        "localhost.evil.example".to_string(),
        "api.example:8444".to_string(),
        "10.1.2.3".to_string(),
    ] {
        for path in ["/v1/health", "/v1/fs/entries?path=.", "/"] {
            let (status, text) = get_with_host(&d.addr, path, &host);
            assert_eq!(status, 403, "{host}{path}: {text}");
            assert_problem(&text, 403);
        }
    }
    // Nothing was written by the refused writes either.
    let (status, _) = raw(
        &d.addr,
        "POST /v1/fs/mkdir?path=rebound HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n",
        b"",
    );
    assert_eq!(status, 403);
    assert!(!d.path("rebound").exists());
}

#[test]
fn with_a_token_any_host_may_come_in_with_the_token() {
    let d = Daemon::builder().token("tok-123").start();
    let (status, _) = raw(
        &d.addr,
        "GET /v1/health HTTP/1.1\r\nHost: sandbox.example\r\nAuthorization: Bearer tok-123\r\nConnection: close\r\n\r\n",
        b"",
    );
    assert_eq!(status, 200);
    let (status, _) = get_with_host(&d.addr, "/v1/health", "sandbox.example");
    assert_eq!(status, 401);
}

#[test]
fn foreign_origin_is_refused_own_and_listed_origins_pass() {
    let d = Daemon::builder()
        .args(["--allowed-origins", "https://app.example"])
        .start();
    let p = port(&d);
    let req = |method: &str, origin: &str, extra: &str| {
        raw(
            &d.addr,
            &format!(
                "{method} /v1/health HTTP/1.1\r\nHost: localhost:{p}\r\nOrigin: {origin}\r\n{extra}Connection: close\r\n\r\n"
            ),
            b"",
        )
    };
    for evil in [
        "http://evil.example",
        "null",
        &format!("http://localhost:{}", 1),
    ] {
        let (status, text) = req("GET", evil, "");
        assert_eq!(status, 403, "{evil}: {text}");
        assert_problem(&text, 403);
    }
    // The daemon's own origin (the inspector page) needs no CORS and gets none.
    let (status, text) = req("GET", &format!("http://localhost:{p}"), "");
    assert_eq!(status, 200, "{text}");
    assert!(
        !text
            .to_ascii_lowercase()
            .contains("access-control-allow-origin")
    );
    // A listed origin gets its CORS answer, preflight included.
    let (status, text) = req("GET", "https://app.example", "");
    assert_eq!(status, 200, "{text}");
    assert!(
        text.to_ascii_lowercase()
            .contains("access-control-allow-origin: https://app.example"),
        "{text}"
    );
    let (status, text) = req(
        "OPTIONS",
        "https://app.example",
        "Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: content-type\r\n",
    );
    assert_eq!(status, 204, "{text}");
    let lower = text.to_ascii_lowercase();
    assert!(lower.contains("access-control-allow-methods:"), "{text}");
    assert!(lower.contains("content-type"), "{text}");
    let (status, _) = req(
        "OPTIONS",
        "https://other.example",
        "Access-Control-Request-Method: POST\r\n",
    );
    assert_eq!(status, 403);
}

#[test]
fn writes_with_cors_simple_or_missing_content_types_are_415() {
    let d = Daemon::start();
    let post = |path: &str, ct: Option<&str>, body: &[u8]| {
        let ct = ct
            .map(|c| format!("Content-Type: {c}\r\n"))
            .unwrap_or_default();
        raw(
            &d.addr,
            &format!(
                "POST {path} HTTP/1.1\r\nHost: localhost\r\n{ct}Content-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            ),
            body,
        )
    };
    // What `fetch(..., {mode: 'no-cors'})` can send: refused before any handler runs.
    for ct in [
        Some("text/plain"),
        Some("text/plain;charset=UTF-8"),
        Some("application/x-www-form-urlencoded"),
        Some("Multipart/Form-Data; boundary=x"),
        None,
    ] {
        let (status, text) = post("/v1/fs/upload-batch?path=dropped", ct, &[0u8; 1024]);
        assert_eq!(status, 415, "{ct:?}: {text}");
        assert_problem(&text, 415);
        // The detail names what the route takes, not a generic type.
        assert!(text.contains("send application/x-tar"), "{text}");
        let (status, text) = post("/v1/fs/mkdir?path=dropped2", ct.or(Some("text/plain")), b"");
        assert_eq!(status, 415, "{ct:?}");
        assert!(text.contains("send application/json"), "{text}");
    }
    let (status, text) = raw(
        &d.addr,
        "PUT /v1/fs/file?path=dropped.txt HTTP/1.1\r\nHost: localhost\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nConnection: close\r\n\r\n",
        b"hi",
    );
    assert_eq!(status, 415);
    // What `curl --data-binary @file -X PUT` sends by default: told which type to send instead.
    assert!(text.contains("send application/octet-stream"), "{text}");
    assert!(!d.path("dropped").exists() && !d.path("dropped2").exists());
    assert!(!d.path("dropped.txt").exists());
    // A bodiless POST needs no Content-Type; a typed body goes through.
    let (status, text) = post("/v1/fs/mkdir?path=made", None, b"");
    assert_eq!(status, 200, "{text}");
    assert!(d.path("made").is_dir());
    let (status, text) = raw(
        &d.addr,
        "PUT /v1/fs/file?path=typed.txt HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: 2\r\nConnection: close\r\n\r\n",
        b"ok",
    );
    assert_eq!(status, 200, "{text}");
}

#[tokio::test]
async fn bearer_scheme_is_case_insensitive() {
    let d = Daemon::builder().token("Case-Token").start();
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let r = http()
            .get(d.url("/v1/health"))
            .header("authorization", format!("{scheme} Case-Token"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{scheme}");
    }
    // The token itself stays case-sensitive, and other schemes are not bearer.
    for value in ["Bearer case-token", "Basic Case-Token", "BearerCase-Token"] {
        let r = http()
            .get(d.url("/v1/health"))
            .header("authorization", value)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{value}");
    }
}

fn run_to_exit(args: &[&str], envs: &[(&str, &str)]) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(BIN);
    cmd.arg("server")
        .args(["--port", "0", "--data-dir"])
        .arg(dir.path())
        .args(args)
        .env_remove("SANDBOX_AGENT_TOKEN")
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (status.code().unwrap_or(-1), err);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return (-1, "still running".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[tokio::test]
async fn boolean_variables_accept_the_usual_spellings() {
    for (value, on) in [
        ("1", true),
        ("yes", true),
        ("ON", true),
        ("True", true),
        ("0", false),
        ("no", false),
        ("off", false),
        ("FALSE", false),
    ] {
        let d = Daemon::builder()
            .env("SANDBOX_AGENT_REQUIRE_PREINSTALL", value)
            .env("SANDBOX_AGENT_JSONRPC_ERRORS", value)
            .start();
        // The one observable without a network: with JSON-RPC errors on, a request whose agent
        // dies is answered 200 + a JSON-RPC error instead of 502.
        let c = d.client();
        let post = |id: u64, method: &str, params: Value| {
            c.post(d.url("/v1/acp/b?agent=mock"))
                .json(&json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}))
                .send()
        };
        let r: Value = post(1, "session/new", json!({"cwd":"/","mcpServers":[]}))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let session = r["result"]["sessionId"].as_str().unwrap().to_string();
        let r = post(
            2,
            "session/prompt",
            json!({"sessionId": session, "prompt":[{"type":"text","text":"/crash 3"}]}),
        )
        .await
        .unwrap();
        let status = r.status().as_u16();
        assert_eq!(status, if on { 200 } else { 502 }, "{value}");
    }
    let (code, err) = run_to_exit(&[], &[("SANDBOX_AGENT_REQUIRE_PREINSTALL", "maybe")]);
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("maybe"), "{err}");
}

#[test]
fn bad_log_level_and_edge_settings_exit_78() {
    for (args, needle) in [
        (&["--log-level", "sandbox_agent=loud"][..], "log-level"),
        (&["--header-read-timeout", "0s"][..], "header-read-timeout"),
        (&["--max-connections", "0"][..], "max-connections"),
        (&["--allowed-origins", "example.com"][..], "allowed-origins"),
        (&["--worker-threads", "none"][..], "worker-threads"),
        (&["--token-file", "/nonexistent/token"][..], "token-file"),
    ] {
        let (code, err) = run_to_exit(args, &[]);
        assert_eq!(code, 78, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[tokio::test]
async fn http2_with_prior_knowledge_is_served_on_the_same_port() {
    let d = Daemon::start();
    // This client is built before any helper's: the TLS provider must be there (alone in its
    // process, as under nextest, the build panicked without it).
    sandbox_agent::install_crypto_provider();
    let h2 = reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let r = h2.get(d.url("/v1/health")).send().await.unwrap();
    assert_eq!(r.version(), reqwest::Version::HTTP_2);
    assert_eq!(r.status(), 200);
    // The guard reads :authority on HTTP/2 the same way it reads Host.
    let r = h2
        .post(d.url("/v1/fs/mkdir?path=h2dir"))
        .header("content-type", "text/plain")
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    let r = h2
        .post(d.url("/v1/fs/mkdir?path=h2dir"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = http().get(d.url("/v1/health")).send().await.unwrap();
    assert_eq!(r.version(), reqwest::Version::HTTP_11);
}

/// True when `tool` is on PATH.
fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// True once the peer closed `s` (EOF or reset); false while it stays open.
fn closed_by_peer(s: &mut TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 512];
    let r = loop {
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
            Err(_) => break true,
        }
    };
    s.set_nonblocking(false).unwrap();
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_is_cut_at_the_header_timeout_while_health_keeps_answering() {
    const SOCKETS: usize = 300;
    let d = Daemon::builder()
        .args(["--header-read-timeout", "2s", "--idle-timeout", "30s"])
        .start();
    let pid = d.pid();
    let baseline = crate::support::open_fds(pid);
    let addr = d.addr.clone();
    // Each attacker sends an unfinished head and then one more header line every 500 ms.
    let attackers = std::thread::spawn(move || {
        let mut socks: Vec<TcpStream> = (0..SOCKETS)
            .map(|_| {
                let mut s = TcpStream::connect(&addr).unwrap();
                s.write_all(b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\n")
                    .unwrap();
                s
            })
            .collect();
        let started = Instant::now();
        let mut cut = vec![false; SOCKETS];
        while started.elapsed() < Duration::from_secs(8) && cut.iter().any(|c| !c) {
            for (i, s) in socks.iter_mut().enumerate() {
                if !cut[i] && (s.write_all(b"X-Drip: 1\r\n").is_err() || closed_by_peer(s)) {
                    cut[i] = true;
                }
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        (cut.iter().filter(|c| **c).count(), started.elapsed())
    });
    // Meanwhile every health request is answered, each well within 2 s.
    let c = http();
    let mut latencies = Vec::new();
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let t = Instant::now();
        let r = tokio::time::timeout(Duration::from_secs(2), c.get(d.url("/v1/health")).send())
            .await
            .expect("health answered within 2 s")
            .unwrap();
        assert_eq!(r.status(), 200);
        latencies.push(t.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (cut, took) = tokio::task::spawn_blocking(move || attackers.join().unwrap())
        .await
        .unwrap();
    assert_eq!(
        cut, SOCKETS,
        "every dripping connection is cut (after {took:?})"
    );
    latencies.sort();
    let p99 = latencies[latencies.len() * 99 / 100];
    eprintln!(
        "health under a {SOCKETS}-socket slowloris: n={} p50={:?} p99={p99:?} max={:?}",
        latencies.len(),
        latencies[latencies.len() / 2],
        latencies.last().unwrap()
    );
    // Nothing is left behind once the attack ends.
    eventually(
        Duration::from_secs(5),
        "descriptors back to the baseline",
        || (crate::support::open_fds(pid) <= baseline + 2).then_some(()),
    );
}

#[tokio::test]
async fn idle_keepalives_close_but_sse_and_long_requests_do_not() {
    let d = Daemon::builder()
        .args(["--header-read-timeout", "1s", "--idle-timeout", "1s"])
        .args(["--keepalive", "30s"])
        .start();
    // An idle keep-alive connection (a request answered, then silence) is closed.
    let mut s = TcpStream::connect(&d.addr).unwrap();
    s.write_all(b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 1024];
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let n = s.read(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    eventually(Duration::from_secs(5), "the idle connection closed", || {
        closed_by_peer(&mut s).then_some(())
    });
    // A new connection that never sends a byte is idle, and closed at the idle timeout.
    let mut silent = TcpStream::connect(&d.addr).unwrap();
    eventually(
        Duration::from_secs(5),
        "the silent connection closed",
        || closed_by_peer(&mut silent).then_some(()),
    );

    // An SSE stream with nothing to say and a prompt that takes 3 s outlive both timeouts.
    let c = d.client();
    let post = |id: u64, method: &str, params: Value| {
        c.post(d.url("/v1/acp/long?agent=mock"))
            .json(&json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}))
            .send()
    };
    let r = post(0, "initialize", json!({"protocolVersion":1}))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r: Value = post(1, "session/new", json!({"cwd":"/","mcpServers":[]}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let session = r["result"]["sessionId"].as_str().unwrap().to_string();
    let mut sse = c
        .get(d.url("/v1/acp/long"))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(sse.status(), 200);
    // Drain the replayed history first.
    while let Ok(Ok(Some(_))) = tokio::time::timeout(Duration::from_millis(300), sse.chunk()).await
    {
    }
    let answer = post(
        2,
        "session/prompt",
        json!({"sessionId": session, "prompt":[{"type":"text","text":"/sleep 3000"}]}),
    )
    .await
    .unwrap();
    assert_eq!(answer.status(), 200);
    let v: Value = answer.json().await.unwrap();
    assert_eq!(v["result"]["stopReason"], "end_turn", "{v}");
    // The SSE stream, silent for the whole prompt, still delivers what comes next.
    // A plain prompt makes the mock send one update (an SSE event) before its answer.
    let r = post(
        3,
        "session/prompt",
        json!({"sessionId": session, "prompt":[{"type":"text","text":"after the quiet"}]}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let got = tokio::time::timeout(Duration::from_secs(10), sse.chunk()).await;
    let got = match got {
        Ok(Ok(Some(bytes))) => Some(bytes),
        other => panic!("the SSE stream gave nothing after the quiet: {other:?}"),
    };
    let got = String::from_utf8_lossy(&got.unwrap()).into_owned();
    assert!(got.contains("after the quiet"), "{got}");
}

/// Starts a mock instance `s` and opens `n` raw connections that each follow its SSE stream, so
/// each holds a request in flight for as long as it is open.
fn busy_connections(d: &Daemon, n: usize) -> Vec<TcpStream> {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}"#;
    let (status, text) = raw(
        &d.addr,
        &format!(
            "POST /v1/acp/s?agent=mock HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        ),
        body.as_bytes(),
    );
    assert_eq!(status, 200, "{text}");
    (0..n)
        .map(|_| {
            let mut s = TcpStream::connect(&d.addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(
                b"GET /v1/acp/s HTTP/1.1\r\nHost: localhost\r\nAccept: text/event-stream\r\n\r\n",
            )
            .unwrap();
            let mut head = Vec::new();
            let mut b = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                assert_eq!(s.read(&mut b).unwrap(), 1, "the SSE head");
                head.push(b[0]);
            }
            assert!(
                head.starts_with(b"HTTP/1.1 200"),
                "{}",
                String::from_utf8_lossy(&head)
            );
            s
        })
        .collect()
}

/// With a request in flight on every held connection, a new one is refused with the canned 503
/// — whole, although the client sent its request first (a plain close with those bytes unread
/// would reset the connection and destroy the answer) — and service resumes once some close.
#[test]
fn at_the_cap_with_every_connection_busy_the_refusal_arrives_whole() {
    let d = Daemon::builder().args(["--max-connections", "8"]).start();
    let held = busy_connections(&d, 8);
    for i in 0..40 {
        let mut s = TcpStream::connect(&d.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // Ignored: the daemon may have answered and shut its side already.
        let _ = s.write_all(b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\n\r\n");
        let mut out = Vec::new();
        let r = s.read_to_end(&mut out);
        let text = String::from_utf8_lossy(&out).into_owned();
        assert!(
            r.is_ok(),
            "attempt {i}: {r:?} after {} bytes: {text}",
            out.len()
        );
        assert!(text.starts_with("HTTP/1.1 503"), "attempt {i}: {text}");
        assert!(text.contains("retry-after: 1"), "{text}");
        assert_problem(&text, 503);
        assert!(text.ends_with("retry\"}"), "attempt {i}: cut short: {text}");
    }
    drop(held);
    eventually(Duration::from_secs(5), "service after the cap", || {
        let (status, _) = get_with_host(&d.addr, "/v1/health", "localhost");
        (status == 200).then_some(())
    });
}

/// Hundreds of connections that never send a byte cannot lock honest clients out: at the cap the
/// quietest idle connection is closed to admit the new one, so every honest request on a fresh
/// connection is served while the attack goes on, long before any idle connection would time out
/// (60 s here; each honest request gets 10 s). How fast is a benchmark's question: the latencies
/// are printed, not asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_at_the_cap_make_room_for_honest_clients() {
    const CAP: usize = 32;
    let d = Daemon::builder()
        .args([
            "--max-connections",
            &CAP.to_string(),
            "--idle-timeout",
            "60s",
        ])
        .start();
    let addr = d.addr.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let attack = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && held.len() < 600 {
                if let Ok(s) = TcpStream::connect(&addr) {
                    held.push(s);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            held.len()
        })
    };
    // Let the attack fill the cap first.
    tokio::time::sleep(Duration::from_millis(500)).await;
    sandbox_agent::install_crypto_provider();
    let c = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let mut latencies = Vec::new();
    for i in 0..100 {
        let t = Instant::now();
        let r = c.get(d.url("/v1/health")).send().await;
        let r = r.unwrap_or_else(|e| panic!("honest request {i}: {e}"));
        assert_eq!(r.status(), 200, "honest request {i}");
        latencies.push(t.elapsed());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let opened = tokio::task::spawn_blocking(move || attack.join().unwrap())
        .await
        .unwrap();
    assert!(opened > CAP * 4, "the attack opened only {opened} sockets");
    latencies.sort();
    let p99 = latencies[latencies.len() * 99 / 100];
    eprintln!(
        "health during {opened} idle sockets at a cap of {CAP}: p50={:?} p99={p99:?}",
        latencies[latencies.len() / 2]
    );
}

/// Under pressure (three quarters of the cap held) a new connection that sends nothing is closed
/// within seconds, while one opened before the pressure keeps the whole idle timeout.
#[test]
fn a_silent_connection_opened_under_pressure_is_closed_early() {
    let d = Daemon::builder()
        .args(["--max-connections", "16", "--idle-timeout", "60s"])
        .start();
    let mut early = TcpStream::connect(&d.addr).unwrap();
    // Make sure it was accepted before the others come.
    let (status, _) = get_with_host(&d.addr, "/v1/health", "localhost");
    assert_eq!(status, 200);
    let mut rest: Vec<TcpStream> = (0..12)
        .map(|_| TcpStream::connect(&d.addr).unwrap())
        .collect();
    let t = Instant::now();
    let last = rest.last_mut().unwrap();
    eventually(
        Duration::from_secs(10),
        "the late silent socket closed",
        || closed_by_peer(last).then_some(()),
    );
    let took = t.elapsed();
    assert!(took < Duration::from_secs(8), "closed after {took:?}");
    assert!(
        !closed_by_peer(&mut early),
        "the socket opened before the pressure stays"
    );
}

/// A request head is capped: a 100 KB header is answered 431, not buffered.
#[test]
fn a_huge_request_head_is_431() {
    let d = Daemon::start();
    let big = "a".repeat(100_000);
    let (status, text) = raw(
        &d.addr,
        &format!("GET /v1/health HTTP/1.1\r\nHost: localhost\r\nX-Big: {big}\r\n\r\n"),
        b"",
    );
    assert_eq!(status, 431, "{text}");
    let (status, _) = get_with_host(&d.addr, "/v1/health", "localhost");
    assert_eq!(status, 200);
}

/// The soft open-file limit is raised to the hard limit at start (and logged); agents get the
/// original soft limit back.
#[tokio::test]
async fn the_open_file_limit_is_raised_for_the_daemon_only() {
    if !have("prlimit") {
        crate::support::skip("prlimit (util-linux) is not installed");
        return;
    }
    let d = Daemon::builder()
        .wrapper(["prlimit", "--nofile=1024:8192", "--"])
        .start();
    let soft_of = |pid: u32| -> u64 {
        let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
        let line = limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .unwrap()
            .to_string();
        line.split_whitespace().nth(3).unwrap().parse().unwrap()
    };
    assert_eq!(soft_of(d.pid()), 8192);
    assert!(
        d.stderr().contains("raised the open-file limit"),
        "{}",
        d.stderr()
    );
    let r = d
        .client()
        .post(d.url("/v1/acp/lim?agent=mock"))
        .json(&json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let agent = d.servers().await[0]["pid"].as_u64().unwrap() as u32;
    assert_eq!(soft_of(agent), 1024, "the agent's soft limit");
}

/// CPU time (user + system, in clock ticks) of `pid` so far.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = stat.rsplit_once(") ").unwrap().1;
    let f: Vec<&str> = rest.split(' ').collect();
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after the name.
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

#[test]
fn out_of_descriptors_in_accept_backs_off_and_recovers() {
    if !have("prlimit") {
        crate::support::skip("prlimit (util-linux) is not installed");
        return;
    }
    // 64 descriptors in all: the daemon's own, then about 40 connections, then EMFILE.
    // Nothing else of the daemon opens or closes descriptors meanwhile: no warm-spawn pool
    // filling and no sweep of a dead daemon's agent cgroups in the background (each frees
    // descriptors when it ends, which lets the loop accept again and run out again: a second
    // burst, rightly warned about, but not the one this test counts).
    let d = Daemon::builder()
        .wrapper(["prlimit", "--nofile=64:64", "--"])
        .args(["--max-connections", "1000", "--header-read-timeout", "60s"])
        .args(["--warm-spawns", "0", "--agent-cgroups", "off"])
        .start();
    let pid = d.pid();
    let mut held = Vec::new();
    for _ in 0..120 {
        // The kernel completes handshakes into the backlog even when the daemon cannot accept.
        match TcpStream::connect(&d.addr) {
            Ok(s) => held.push(s),
            Err(_) => break,
        }
    }
    eventually(
        Duration::from_secs(5),
        "the accept loop out of descriptors",
        || {
            d.stderr()
                .contains("cannot accept connections")
                .then_some(())
        },
    );
    // Two seconds of a full backlog: a spinning loop would burn them all on the CPU.
    let before = cpu_ticks(pid);
    let t = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_ticks(pid) - before;
    let ticks_per_s = sandbox_agent::sys::clock_ticks();
    assert!(
        used * 4 < t.elapsed().as_secs() * ticks_per_s,
        "{used} ticks of CPU in {:?} while out of descriptors",
        t.elapsed()
    );
    let warnings = d.stderr().matches("cannot accept connections").count();
    assert_eq!(warnings, 1, "one warning per burst:\n{}", d.stderr());
    drop(held);
    eventually(Duration::from_secs(10), "service after the burst", || {
        let (status, _) = get_with_host(&d.addr, "/v1/health", "localhost");
        (status == 200).then_some(())
    });
    eventually(
        Duration::from_secs(5),
        "the end of the burst logged",
        || {
            d.stderr()
                .contains("accepting connections again")
                .then_some(())
        },
    );
}

/// What any local process (an agent) can read of `pid`'s command line and environment.
fn proc_text(pid: u32, what: &str) -> String {
    String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/{what}")).unwrap_or_default())
        .into_owned()
}

async fn health_with(d: &Daemon, token: &str) -> u16 {
    http()
        .get(d.url("/v1/health"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn the_token_is_not_left_in_proc_cmdline_or_environ() {
    for init in [false, true] {
        let mut b = Daemon::builder()
            .token("argv-secret-123")
            .env("SANDBOX_AGENT_TOKEN", "env-secret-456");
        if init {
            b = b.arg("--init");
        }
        let d = b.start();
        let mut pids = vec![d.pid()];
        if init {
            // The init parent and the daemon it forked.
            let kids = crate::support::children_of(d.pid());
            assert_eq!(kids.len(), 1, "{kids:?}");
            pids.extend(kids);
        }
        for pid in pids {
            let cmdline = proc_text(pid, "cmdline");
            let environ = proc_text(pid, "environ");
            assert!(cmdline.contains("--token"), "{cmdline:?}");
            assert!(!cmdline.contains("argv-secret"), "pid {pid}: {cmdline:?}");
            assert!(environ.contains("SANDBOX_AGENT_TOKEN="), "pid {pid}");
            assert!(!environ.contains("env-secret"), "pid {pid}: {environ:?}");
            assert!(!environ.contains("argv-secret"), "pid {pid}");
        }
        // The daemon still knows the token it read (the flag wins over the variable).
        assert_eq!(health_with(&d, "argv-secret-123").await, 200);
        assert_eq!(health_with(&d, "env-secret-456").await, 401);
    }
}

#[tokio::test]
async fn token_file_is_read_once_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "file-secret-789\n").unwrap();
    let d = Daemon::builder().arg("--token-file").arg(&file).start();
    assert_eq!(health_with(&d, "file-secret-789").await, 200);
    assert_eq!(health_with(&d, "file-secret-78").await, 401);
    // Read once: changing the file changes nothing until a restart.
    std::fs::write(&file, "another\n").unwrap();
    assert_eq!(health_with(&d, "file-secret-789").await, 200);
    assert!(!proc_text(d.pid(), "cmdline").contains("file-secret"));
    // An empty file is a configuration error, not an open daemon.
    std::fs::write(&file, "\n").unwrap();
    let (code, err) = run_to_exit(&["--token-file", file.to_str().unwrap()], &[]);
    assert_eq!(code, 78, "{err}");
}

#[test]
fn an_agent_of_the_same_user_cannot_read_the_daemons_environment() {
    if !crate::support::is_root() {
        crate::support::skip("needs root to run the daemon as another user");
        return;
    }
    if !have("setpriv") {
        crate::support::skip("setpriv (util-linux) is not installed");
        return;
    }
    // The daemon runs as uid 65534; a process of that same user (as an agent would be) tries to
    // read its environment. Non-dumpable makes /proc/<pid>/environ root's, so it cannot.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let as_nobody = ["--reuid=65534", "--regid=65534", "--clear-groups", "--"];
    let mut daemon = Command::new("setpriv")
        .args(as_nobody)
        .arg(BIN)
        .args(["server", "--host", "127.0.0.1", "--port", &port.to_string()])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--work-dir")
        .arg(dir.path())
        .current_dir(dir.path())
        .env("SANDBOX_AGENT_TOKEN", "nobody-secret-000")
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = daemon.id();
    let addr = format!("127.0.0.1:{port}");
    eventually(Duration::from_secs(10), "the daemon listening", || {
        TcpStream::connect(&addr).ok()
    });
    let read_as_nobody = |what: &str| {
        Command::new("setpriv")
            .args(as_nobody)
            .args(["cat", &format!("/proc/{pid}/{what}")])
            .output()
            .unwrap()
    };
    let environ = read_as_nobody("environ");
    let cmdline = read_as_nobody("cmdline");
    let _ = daemon.kill();
    let _ = daemon.wait();
    assert!(
        !environ.status.success(),
        "environ was readable by the same user"
    );
    assert!(!String::from_utf8_lossy(&environ.stdout).contains("nobody-secret"));
    // The command line stays public (it always is), without the token.
    assert!(cmdline.status.success());
    assert!(!String::from_utf8_lossy(&cmdline.stdout).contains("nobody-secret"));
}

/// Names of the threads of `pid`.
fn thread_names(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .map(|s| s.trim().to_string())
        .collect()
}

#[tokio::test]
async fn worker_threads_chooses_the_runtime() {
    // Three workers: tokio's multi-thread runtime, whose workers are named threads (the
    // blocking pool's are named `blocking`: the trim after the start and the warm-spawn stubs
    // use it).
    let d = Daemon::builder()
        .args(["--worker-threads", "3", "--warm-spawns", "0"])
        .start();
    assert_eq!(
        d.client()
            .get(d.url("/v1/health"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let workers = thread_names(d.pid())
        .iter()
        .filter(|n| n.starts_with("tokio-rt-worker"))
        .count();
    assert_eq!(workers, 3, "{:?}", thread_names(d.pid()));
    // One: the current-thread runtime on the main thread, no worker threads at all.
    let d = Daemon::builder()
        .args(["--worker-threads", "1", "--warm-spawns", "0"])
        .start();
    assert_eq!(
        d.client()
            .get(d.url("/v1/health"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let names = thread_names(d.pid());
    assert!(
        !names.iter().any(|n| n.starts_with("tokio-rt-worker")),
        "{names:?}"
    );
}

/// The status of a WebSocket handshake: 101 when it was accepted, else the refusal's status.
async fn ws_handshake(url: &str, headers: &[(&'static str, &str)]) -> u16 {
    use tokio_tungstenite::tungstenite::{Error, client::IntoClientRequest};
    let mut req = url.into_client_request().expect("request");
    for (name, value) in headers {
        req.headers_mut().insert(*name, value.parse().unwrap());
    }
    match tokio_tungstenite::connect_async(req).await {
        Ok((mut ws, resp)) => {
            let _ = ws.close(None).await;
            resp.status().as_u16()
        }
        Err(Error::Http(resp)) => resp.status().as_u16(),
        Err(e) => panic!("{url}: {e}"),
    }
}

/// Browsers cannot set headers on a WebSocket, so an upgrade of a WebSocket route may carry the
/// token as `?access_token=`; a wrong one is 401, no other request may carry it (401 even next to
/// a valid header), the Origin rule still applies, and the token reaches no log line.
#[tokio::test]
async fn websocket_upgrades_take_the_token_in_the_query_and_nothing_else_does() {
    use futures_util::StreamExt;
    let token = "query-secret-4711";
    let d = Daemon::builder()
        .token(token)
        .args(["--log-level", "debug"])
        .start();
    let c = d.client();
    let created = d
        .post_json(
            "/v1/processes",
            &json!({"command": "bash", "args": ["--norc", "--noprofile"], "tty": true, "interactive": true}),
        )
        .await;
    let id = created["id"].as_str().expect("a process id").to_string();
    let ws = |path: &str| format!("ws://{}{path}", d.addr);

    // The terminal socket with the token in its URL: accepted, and it works.
    let term = ws(&format!(
        "/v1/processes/{id}/terminal/ws?access_token={token}"
    ));
    let (mut sock, _) = tokio_tungstenite::connect_async(term.as_str())
        .await
        .expect("the terminal socket opens with ?access_token=");
    let first = sock.next().await.expect("a frame").expect("frame");
    let first: Value = serde_json::from_str(first.to_text().unwrap()).unwrap();
    assert_eq!(first["type"], "ready", "{first}");
    let _ = sock.close(None).await;
    // The ACP socket too; the rest of its query reaches the handler (`agent` creates the instance).
    let acp = ws(&format!("/v1/acp/qtok?agent=mock&access_token={token}"));
    assert_eq!(ws_handshake(&acp, &[]).await, 101);
    let servers = d.get_json("/v1/acp").await;
    assert!(servers.to_string().contains("\"qtok\""), "{servers}");
    // And the RFD transport's WebSocket profile.
    let rfd = ws(&format!("/v1/agents/mock/acp?access_token={token}"));
    assert_eq!(ws_handshake(&rfd, &[]).await, 101);
    // Percent-encoded, the same token is accepted.
    let encoded = ws(&format!(
        "/v1/processes/{id}/terminal/ws?access%5Ftoken=query%2Dsecret%2D4711"
    ));
    assert_eq!(ws_handshake(&encoded, &[]).await, 101);

    // Refused: a wrong token, an empty one, two of them, an upgrade of a route without WebSockets.
    for path in [
        format!("/v1/processes/{id}/terminal/ws?access_token=query-secret-4712"),
        format!("/v1/processes/{id}/terminal/ws?access_token="),
        format!("/v1/processes/{id}/terminal/ws?access_token={token}&access_token={token}"),
        format!("/v1/processes/{id}/terminal/ws"),
        format!("/v1/processes?access_token={token}"),
        format!("/v1/processes/{id}/logs?follow=true&access_token={token}"),
    ] {
        assert_eq!(ws_handshake(&ws(&path), &[]).await, 401, "{path}");
    }
    // A query token on plain requests is 401, even with a valid header beside it.
    for (path, header) in [
        (format!("/v1/processes/{id}?access_token={token}"), false),
        (
            format!("/v1/processes/{id}/terminal/ws?access_token={token}"),
            false,
        ),
        (format!("/v1/processes/{id}?access_token={token}"), true),
    ] {
        let auth = if header {
            format!("Authorization: Bearer {token}\r\n")
        } else {
            String::new()
        };
        let (status, text) = raw(
            &d.addr,
            &format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Connection: close\r\n\r\n"),
            b"",
        );
        assert_eq!(status, 401, "{path} (header: {header})");
        assert_problem(&text, 401);
        assert!(
            !text.contains(token),
            "the answer repeats the token: {text}"
        );
    }
    // Every credential given must be valid: a wrong query token next to a valid header is 401.
    let bearer = format!("Bearer {token}");
    let wrong = ws(&format!("/v1/processes/{id}/terminal/ws?access_token=nope"));
    assert_eq!(
        ws_handshake(&wrong, &[("authorization", bearer.as_str())]).await,
        401
    );
    let plain = ws(&format!("/v1/processes/{id}/terminal/ws"));
    assert_eq!(
        ws_handshake(&plain, &[("authorization", bearer.as_str())]).await,
        101
    );
    // The Origin rule still holds for an upgrade with a valid query token.
    let term = ws(&format!(
        "/v1/processes/{id}/terminal/ws?access_token={token}"
    ));
    assert_eq!(
        ws_handshake(&term, &[("origin", "http://evil.example")]).await,
        403
    );

    let _ = c
        .post(d.url(&format!("/v1/processes/{id}/kill?waitMs=5000")))
        .send()
        .await;
    let log = d.stderr();
    assert!(
        log.contains("/terminal/ws"),
        "the requests were logged:\n{log}"
    );
    assert!(
        !log.contains("query-secret"),
        "the token reached the log:\n{log}"
    );
    assert!(
        !log.contains("access_token"),
        "a query reached the log:\n{log}"
    );
}

/// The request-log lines of `d`'s log with `status`.
fn request_lines(d: &Daemon, status: u16) -> Vec<String> {
    d.stderr()
        .lines()
        .filter(|l| l.contains(": request ") && l.contains(&format!("status={status} ")))
        .map(str::to_string)
        .collect()
}

fn latency_us(line: &str) -> u64 {
    let v = line.split("latency_us=").nth(1).expect("latency_us");
    v.split_whitespace().next().unwrap().parse().unwrap()
}

/// By default a quick successful request writes no log line (a busy daemon must not flood its
/// log), while a refusal and a slow answer are still logged; `--access-log` logs every request.
/// The 404 is sent last: the log writer keeps the order, so once its line is there, every
/// earlier one would be too.
#[tokio::test]
async fn the_request_log_is_quiet_by_default_and_complete_with_access_log() {
    for access_log in [false, true] {
        let mut b = Daemon::builder().args(["--slow-request", "200ms"]);
        if access_log {
            b = b.arg("--access-log");
        }
        let d = b.start();
        let c = d.client();
        for _ in 0..20 {
            let r = c.get(d.url("/v1/health")).send().await.unwrap();
            assert_eq!(r.status(), 200);
        }
        let acp = d.url("/v1/acp/slow?agent=mock");
        for (id, method, params) in [
            (1, "initialize", json!({"protocolVersion": 1})),
            (2, "session/new", json!({"cwd": "/tmp", "mcpServers": []})),
            (
                3,
                "session/prompt",
                json!({"sessionId": "mock-1", "prompt": [{"type": "text", "text": "/sleep 400"}]}),
            ),
        ] {
            let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
            let r = c.post(&acp).json(&body).send().await.unwrap();
            assert_eq!(r.status(), 200, "{method}");
        }
        let r = c.get(d.url("/v1/no-such-route")).send().await.unwrap();
        assert_eq!(r.status(), 404);
        eventually(Duration::from_secs(10), "the 404's log line", || {
            (request_lines(&d, 404).len() == 1).then_some(())
        });
        let ok = request_lines(&d, 200);
        let health = ok.iter().filter(|l| l.contains("/v1/health")).count();
        let slow = ok
            .iter()
            .filter(|l| l.contains("/v1/acp/slow") && latency_us(l) >= 400_000)
            .count();
        assert_eq!(slow, 1, "the slow prompt is logged:\n{}", d.stderr());
        if access_log {
            assert_eq!(health, 20, "{}", d.stderr());
            assert_eq!(ok.len(), 23, "{}", d.stderr());
        } else {
            assert_eq!(health, 0, "{}", d.stderr());
            assert!(
                ok.iter().all(|l| latency_us(l) >= 200_000),
                "only slow answers are logged by default:\n{}",
                d.stderr()
            );
        }
    }
}
