//! Hostile agents and hostile clients against the runtime (issue 10, part C), through the real
//! binary: agents that flood stderr while the daemon's own stderr is a pipe nobody reads, invalid
//! UTF-8 in both directions, the global caps (instances, subscribers, stdin queue, in-flight
//! bodies), and the smaller protocol edge cases. Each test checks that `/v1/health` keeps
//! answering while the attack runs. Agents here are real processes: the built-in mock, or small
//! shell scripts declared in an agents file.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::support::{Daemon, eventually_async, pid_alive};

/// Writes `agents.toml` declaring each `(id, shell script)` as a user agent run by `/bin/sh`.
fn agents_file(dir: &Path, agents: &[(&str, &str)]) -> PathBuf {
    let mut toml = String::new();
    for (id, script) in agents {
        let path = dir.join(format!("{id}.sh"));
        std::fs::write(&path, script).unwrap();
        toml.push_str(&format!(
            "[[agent]]\nid = \"{id}\"\ncommand = \"/bin/sh\"\nargs = [\"{}\"]\n\n",
            path.display()
        ));
    }
    let file = dir.join("agents.toml");
    std::fs::write(&file, toml).unwrap();
    file
}

/// `GET /v1/health` answers 200 within 5 s (the daemon is not frozen).
async fn health_ok(d: &Daemon) -> bool {
    let r = d
        .client()
        .get(d.url("/v1/health"))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    matches!(r, Ok(r) if r.status() == 200)
}

/// Keeps checking health for `dur`; panics on the first that does not answer within 5 s (a
/// frozen daemon never answers; 5 s is no latency claim). Returns how many answered.
async fn health_for(d: &Daemon, dur: Duration) -> usize {
    let until = Instant::now() + dur;
    let mut n = 0;
    while Instant::now() < until {
        assert!(health_ok(d).await, "/v1/health did not answer within 5 s");
        n += 1;
    }
    n
}

async fn post_raw(d: &Daemon, path: &str, body: Vec<u8>) -> (u16, String, String) {
    let r = d
        .client()
        .post(d.url(path))
        .header("content-type", "application/json")
        .body(body)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .expect("POST");
    let status = r.status().as_u16();
    let ct = r
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (status, ct, r.text().await.unwrap())
}

async fn post_json(d: &Daemon, path: &str, v: Value) -> (u16, String, String) {
    post_raw(d, path, v.to_string().into_bytes()).await
}

/// Starts `server_id` on `agent` with a notification (answered 202 once written).
async fn start_with_notification(d: &Daemon, server_id: &str, agent: &str) {
    let (status, _, text) = post_json(
        d,
        &format!("/v1/acp/{server_id}?agent={agent}"),
        json!({"jsonrpc": "2.0", "method": "hello"}),
    )
    .await;
    assert_eq!(status, 202, "{text}");
}

async fn initialize(d: &Daemon, server_id: &str, id: u64) -> (u16, String) {
    let (s, _, t) = post_json(
        d,
        &format!("/v1/acp/{server_id}?agent=mock"),
        json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {"protocolVersion": 1}}),
    )
    .await;
    (s, t)
}

async fn server(d: &Daemon, server_id: &str) -> Option<Value> {
    d.servers()
        .await
        .into_iter()
        .find(|s| s["serverId"] == server_id)
}

async fn delete(d: &Daemon, server_id: &str) {
    let r = d
        .client()
        .delete(d.url(&format!("/v1/acp/{server_id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
}

/// Reads the SSE stream of `server_id` until `needle` appears (or panics after 10 s).
async fn sse_until(d: &Daemon, server_id: &str, needle: &str) -> String {
    let resp = d
        .client()
        .get(d.url(&format!("/v1/acp/{server_id}")))
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !text.contains(needle) {
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(Some(Ok(chunk))) => text.push_str(&String::from_utf8_lossy(&chunk)),
            other => panic!("stream ended or stalled before {needle:?}: {other:?}; got {text}"),
        }
    }
    text
}

/// Writes stderr in a loop, as fast as it can (keeping a copy of its stdout open: an agent that
/// closes stdout is stopped).
const FLOOD: &str = "exec 3>&1\nexec yes 'flood-line: an agent that writes stderr in a loop, as fast as it can' >&2\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stderr_flood_with_an_unread_daemon_stderr_never_stalls_requests() {
    let dir = tempfile::tempdir().unwrap();
    let file = agents_file(
        dir.path(),
        &[
            ("flood", FLOOD),
            // 200 KB at once, then quiet: the write that used to block the runtime thread.
            (
                "burst",
                "head -c 200000 /dev/zero | tr '\\0' x >&2\necho >&2\nexec sleep 600\n",
            ),
        ],
    );
    let d = Daemon::builder()
        .stderr_unread_pipe()
        .arg("--agents-file")
        .arg(&file)
        .start();
    start_with_notification(&d, "burst", "burst").await;
    start_with_notification(&d, "flood", "flood").await;
    // Every request logs a line too, so the daemon's own log alone fills the pipe soon.
    health_for(&d, Duration::from_secs(3)).await;
    // A real ACP round trip during the flood.
    let (status, text) = initialize(&d, "m", 0).await;
    assert_eq!(status, 200, "{text}");
    delete(&d, "flood").await;
    delete(&d, "burst").await;
    assert!(health_ok(&d).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stderr_flood_reaches_the_log_within_its_budget_and_the_rest_is_counted() {
    let dir = tempfile::tempdir().unwrap();
    let file = agents_file(dir.path(), &[("flood", FLOOD)]);
    let d = Daemon::builder()
        .arg("--agents-file")
        .arg(&file)
        .args(["--agent-stderr-lines", "20"])
        .start();
    let started = Instant::now();
    start_with_notification(&d, "flood", "flood").await;
    // Two reports of held-back lines: the flood ran for more than a second.
    let log = eventually_async(Duration::from_secs(20), "two dropped-line reports", || {
        let log = d.stderr();
        async move { (log.matches("over its log budget").count() >= 2).then_some(log) }
    })
    .await;
    assert!(health_for(&d, Duration::from_millis(500)).await > 0);
    delete(&d, "flood").await;
    let elapsed = started.elapsed().as_secs_f64();
    let log = {
        // What was logged until the agent stopped (the final report included).
        let _ = log;
        d.stderr()
    };
    let logged = log.matches("flood-line").count();
    // The budget is 20 lines/s with a burst of one second's worth.
    let bound = (20.0 * (elapsed + 2.0)) as usize;
    assert!(
        logged <= bound,
        "{logged} flood lines logged in {elapsed:.1} s (bound {bound})"
    );
    let dropped: u64 = log
        .lines()
        .filter(|l| l.contains("over its log budget"))
        .filter_map(|l| l.split("dropped_lines=").nth(1))
        .filter_map(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    assert!(
        dropped > logged as u64 * 10,
        "the flood was counted: {dropped} dropped vs {logged} logged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn journald_mode_with_a_journal_that_never_reads_never_stalls_requests() {
    let dir = tempfile::tempdir().unwrap();
    let sock_path = dir.path().join("journal.sock");
    let journal = std::os::unix::net::UnixDatagram::bind(&sock_path).unwrap();
    let file = agents_file(dir.path(), &[("flood", FLOOD)]);
    let d = Daemon::builder()
        .arg("--agents-file")
        .arg(&file)
        .args(["--log-format", "journald"])
        .arg("--journal-socket")
        .arg(&sock_path)
        .start();
    start_with_notification(&d, "flood", "flood").await;
    health_for(&d, Duration::from_secs(3)).await;
    delete(&d, "flood").await;
    assert!(health_ok(&d).await);
    // The records that did arrive are journald native-protocol entries of ours.
    journal.set_nonblocking(true).unwrap();
    let mut buf = vec![0u8; 256 * 1024];
    let n = journal.recv(&mut buf).expect("at least one journal record");
    let rec = String::from_utf8_lossy(&buf[..n]);
    assert!(rec.contains("SYSLOG_IDENTIFIER=sandbox-agent\n"), "{rec}");
    assert!(rec.contains("PRIORITY="), "{rec}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_utf8_and_lone_surrogates_from_a_client_are_refused_and_the_agent_lives() {
    let d = Daemon::start();
    let (status, text) = initialize(&d, "u", 0).await;
    assert_eq!(status, 200, "{text}");
    let pid = server(&d, "u").await.unwrap()["pid"].as_u64().unwrap() as u32;
    let mut raw = br#"{"jsonrpc":"2.0","id":1,"method":"_mock/echo","params":{"t":""#.to_vec();
    raw.extend_from_slice(b"\xff\xfe");
    raw.extend_from_slice(b"\"}}");
    let bodies: Vec<Vec<u8>> = vec![
        raw,
        br#"{"jsonrpc":"2.0","id":2,"method":"_mock/echo","params":{"t":"\ud800"}}"#.to_vec(),
        br#"{"jsonrpc":"2.0","id":3,"method":"_mock/echo","params":{"t":"\udc00x"}}"#.to_vec(),
        br#"{"jsonrpc":"2.0","method":"note","params":["\ud83d"]}"#.to_vec(),
    ];
    for body in bodies {
        let (status, ct, text) = post_raw(&d, "/v1/acp/u", body).await;
        assert_eq!(status, 400, "{text}");
        assert_eq!(ct, "application/problem+json");
    }
    // A valid surrogate pair passes untouched, and the agent is the same process.
    let (status, _, text) = post_raw(
        &d,
        "/v1/acp/u",
        br#"{"jsonrpc":"2.0","id":4,"method":"_mock/echo","params":{"t":"\ud83d\ude00"}}"#.to_vec(),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["result"]["t"],
        "😀"
    );
    assert!(pid_alive(pid));
    assert_eq!(server(&d, "u").await.unwrap()["pid"], pid);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_lines_with_invalid_utf8_or_lone_surrogates_are_dropped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let script = concat!(
        "printf '{\"jsonrpc\":\"2.0\",\"method\":\"bad1\",\"params\":\"\\377\\376\"}\\n'\n",
        "printf '%s\\n' '{\"jsonrpc\":\"2.0\",\"method\":\"bad2\",\"params\":\"\\ud800\"}'\n",
        "printf '%s\\n' '{\"jsonrpc\":\"2.0\",\"method\":\"good\",\"params\":\"\\ud83d\\ude00\"}'\n",
        "exec sleep 600\n"
    );
    let file = agents_file(dir.path(), &[("liar", script)]);
    let d = Daemon::builder().arg("--agents-file").arg(&file).start();
    start_with_notification(&d, "liar", "liar").await;
    let text = sse_until(&d, "liar", "\"good\"").await;
    assert!(!text.contains("bad1") && !text.contains("bad2"), "{text}");
    assert!(
        text.contains("id: 1\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"good\""),
        "{text}"
    );
    let s = server(&d, "liar").await.unwrap();
    assert_eq!(s["invalidStdoutLines"], 2, "{s}");
    delete(&d, "liar").await;
}

/// One raw HTTP/1.1 exchange (for what reqwest would normalise or cannot send); returns the
/// status line's code and the whole answer.
fn raw_http(d: &Daemon, request: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(&d.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, text)
}

/// A `respond-async` request carrying `size` bytes of payload.
async fn post_big_async(
    d: &Daemon,
    server_id: &str,
    agent: &str,
    id: u64,
    size: usize,
) -> reqwest::Response {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "_mock/echo", "params": {"pad": "x".repeat(size)}});
    d.client()
        .post(d.url(&format!("/v1/acp/{server_id}?agent={agent}")))
        .header("content-type", "application/json")
        .header("prefer", "respond-async")
        .body(body.to_string())
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .expect("POST")
}

async fn assert_503_capacity(resp: reqwest::Response, capacity: &str) -> Value {
    assert_eq!(resp.status(), 503);
    assert_eq!(
        resp.headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap()),
        Some("1")
    );
    assert_eq!(
        resp.headers().get("content-type").unwrap(),
        "application/problem+json"
    );
    let body: Value = resp.json().await.unwrap();
    assert!(
        body["capacity"].as_str().unwrap().contains(capacity),
        "{body}"
    );
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_instances_beyond_the_cap_are_refused_until_one_is_deleted() {
    let d = Daemon::builder().args(["--max-agents", "3"]).start();
    for id in ["a", "b", "c"] {
        let (status, text) = initialize(&d, id, 0).await;
        assert_eq!(status, 200, "{text}");
    }
    let resp = d
        .client()
        .post(d.url("/v1/acp/d?agent=mock"))
        .header("content-type", "application/json")
        .body(r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}"#)
        .send()
        .await
        .unwrap();
    let body = assert_503_capacity(resp, "agent instances").await;
    assert_eq!(body["limit"], 3);
    assert_eq!(d.servers().await.len(), 3, "no fourth agent was started");
    assert!(health_ok(&d).await);
    delete(&d, "a").await;
    let (status, text) = initialize(&d, "d", 0).await;
    assert_eq!(status, 200, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_subscribers_are_capped_per_server_and_in_total() {
    let d = Daemon::builder()
        .args(["--max-subscribers", "2", "--max-subscribers-total", "3"])
        .args(["--keepalive", "100ms"])
        .start();
    for id in ["x", "y"] {
        let (status, text) = initialize(&d, id, 0).await;
        assert_eq!(status, 200, "{text}");
    }
    let open = |id: &'static str| {
        let req = d
            .client()
            .get(d.url(&format!("/v1/acp/{id}")))
            .header("accept", "text/event-stream");
        async move { req.send().await.unwrap() }
    };
    let x1 = open("x").await;
    let x2 = open("x").await;
    assert_eq!((x1.status().as_u16(), x2.status().as_u16()), (200, 200));
    assert_503_capacity(open("x").await, "of this serverId").await;
    let y1 = open("y").await;
    assert_eq!(y1.status(), 200);
    assert_503_capacity(open("y").await, "of all serverIds").await;
    assert_eq!(server(&d, "x").await.unwrap()["subscribers"], 2);
    assert!(health_ok(&d).await);
    // A subscriber that goes away gives its place back.
    drop(x1);
    let y2 = eventually_async(Duration::from_secs(10), "a free subscriber place", || {
        let req = open("y");
        async move {
            let r = req.await;
            (r.status() == 200).then_some(r)
        }
    })
    .await;
    drop((x2, y1, y2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_queued_for_an_agent_that_stopped_reading_is_capped_per_agent_and_in_total() {
    let dir = tempfile::tempdir().unwrap();
    // Never reads its stdin.
    let file = agents_file(dir.path(), &[("deaf", "exec sleep 600\n")]);
    let d = Daemon::builder()
        .arg("--agents-file")
        .arg(&file)
        .args(["--stdin-queue", "3M", "--stdin-queue-total", "3200K"])
        .start();
    const MIB: usize = 1 << 20;
    // Two fit in one agent's 3 MiB; the third does not.
    for id in 1..=2 {
        let r = post_big_async(&d, "a", "deaf", id, MIB).await;
        assert_eq!(r.status(), 202, "{}", r.text().await.unwrap());
    }
    assert_503_capacity(
        post_big_async(&d, "a", "deaf", 3, MIB).await,
        "this agent's stdin",
    )
    .await;
    // Another agent: its own queue has room, but not all of them together.
    let r = post_big_async(&d, "b", "deaf", 1, MIB / 2).await;
    assert_eq!(r.status(), 202);
    assert_503_capacity(
        post_big_async(&d, "b", "deaf", 2, MIB).await,
        "every agent's stdin",
    )
    .await;
    assert!(health_ok(&d).await);
    // Deleting the first agent gives its queued bytes back.
    delete(&d, "a").await;
    eventually_async(
        Duration::from_secs(15),
        "room in the total stdin queue",
        || async {
            let r = post_big_async(&d, "b", "deaf", rand_id(), MIB).await;
            (r.status() == 202).then_some(())
        },
    )
    .await;
}

fn rand_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(1000);
    N.fetch_add(1, Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_request_bodies_being_received_are_capped_in_total() {
    use std::io::Write;
    let d = Daemon::builder()
        .args(["--acp-inflight-bytes", "4M", "--body-limit", "8M"])
        .start();
    let (status, text) = initialize(&d, "m", 0).await;
    assert_eq!(status, 200, "{text}");
    // A client that declares 3 MiB and then stalls holds 3 MiB of the budget.
    let mut stalled = std::net::TcpStream::connect(&d.addr).unwrap();
    write!(
        stalled,
        "POST /v1/acp/m HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{{\"jsonrpc\":\"2.0\",",
        d.addr,
        3 << 20
    )
    .unwrap();
    let big = |size: usize| {
        let body = json!({"jsonrpc": "2.0", "id": 7, "method": "_mock/echo", "params": {"pad": "x".repeat(size)}});
        d.client()
            .post(d.url("/v1/acp/m"))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
    };
    let refused = eventually_async(
        Duration::from_secs(10),
        "the stalled body counted",
        || async {
            let r = big(2 << 20).await.unwrap();
            (r.status() == 503).then_some(r)
        },
    )
    .await;
    assert_503_capacity(refused, "request body bytes").await;
    // Small requests still get through, and a body over the limit is 413 as before.
    let (status, text) = initialize(&d, "m", 1).await;
    assert_eq!(status, 200, "{text}");
    // Declared over the limit: refused from the head alone. (A client that writes the whole
    // body may see the connection closed under its write before it reads the answer.)
    let mut over = std::net::TcpStream::connect(&d.addr).unwrap();
    write!(
        over,
        "POST /v1/acp/m HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        d.addr,
        9 << 20
    )
    .unwrap();
    over.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut head = [0u8; 64];
    let n = std::io::Read::read(&mut over, &mut head).unwrap();
    let line = String::from_utf8_lossy(&head[..n]);
    assert!(line.starts_with("HTTP/1.1 413"), "{line}");
    assert!(health_ok(&d).await);
    // The stalled client leaves: its share comes back.
    drop(stalled);
    eventually_async(Duration::from_secs(10), "the budget freed", || async {
        let r = big(2 << 20).await.unwrap();
        (r.status() == 200).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_event_id_beyond_the_log_is_400_and_never_a_bogus_gap() {
    let d = Daemon::start();
    let (status, text) = initialize(&d, "e", 0).await;
    assert_eq!(status, 200, "{text}");
    // No event yet: the last id issued is 0.
    let get = |last: &'static str| {
        d.client()
            .get(d.url("/v1/acp/e"))
            .header("accept", "text/event-stream")
            .header("last-event-id", last)
            .send()
    };
    for last in ["18446744073709551615", "1"] {
        let r = get(last).await.unwrap();
        assert_eq!(r.status(), 400, "Last-Event-ID {last}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["currentLastEventId"], 0, "{body}");
        assert_eq!(body["lastEventId"], last.parse::<u64>().unwrap(), "{body}");
    }
    let r = get("18446744073709551616").await.unwrap();
    assert_eq!(r.status(), 400, "not a u64");
    // The current last id itself is fine: nothing missed, no gap.
    let r = get("0").await.unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_ids_dot_and_dot_dot_are_refused() {
    let d = Daemon::start();
    for id in [".", ".."] {
        let body =
            r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}"#;
        let (code, text) = raw_http(
            &d,
            &format!(
                "POST /v1/acp/{id}?agent=mock HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                d.addr,
                body.len()
            ),
        );
        assert_eq!(code, 400, "{text}");
        assert!(text.contains("application/problem+json"), "{text}");
    }
    assert!(d.servers().await.is_empty());
    // `...` is an ordinary name.
    let (status, text) = initialize(&d, "...", 0).await;
    assert_eq!(status, 200, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_closes_its_stdout_is_listed_with_a_real_exit_reason() {
    let dir = tempfile::tempdir().unwrap();
    let file = agents_file(dir.path(), &[("mute", "exec >&-\nexec sleep 600\n")]);
    let d = Daemon::builder()
        .arg("--agents-file")
        .arg(&file)
        .args(["--agent-grace", "5s"])
        .start();
    start_with_notification(&d, "mute", "mute").await;
    let s = eventually_async(Duration::from_secs(15), "an exit reason", || async {
        let s = server(&d, "mute").await?;
        (!s["exitReason"].is_null()).then_some(s)
    })
    .await;
    assert_eq!(s["status"], "exited", "{s}");
    // `sleep` dies of our SIGTERM within the grace period.
    assert_eq!(s["exitReason"], "graceful", "{s}");
    assert_eq!(s["signal"], 15, "{s}");
    delete(&d, "mute").await;
}

/// The daemon's resident memory in MiB.
fn rss_mib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap()
        / 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_goes_back_down_after_a_load_of_large_messages() {
    let d = Daemon::start();
    for i in 0..4 {
        let (status, text) = initialize(&d, &format!("r{i}"), 0).await;
        assert_eq!(status, 200, "{text}");
    }
    let before = rss_mib(d.pid());
    // 8 concurrent 6 MB echoes over 4 agents: ~48 MB in and ~48 MB out through the daemon.
    let size = 6_000_000;
    let pad = "x".repeat(size);
    let load = (0..8u64).map(|i| {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{},"method":"_mock/echo","params":{{"pad":"{pad}"}}}}"#,
            i + 1
        );
        let req = d
            .client()
            .post(d.url(&format!("/v1/acp/r{}", i % 4)))
            .header("content-type", "application/json")
            .body(body);
        async move {
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            (status, r.bytes().await.unwrap().len())
        }
    });
    for (status, len) in futures_util::future::join_all(load).await {
        assert_eq!(status, 200);
        assert!(len > size, "the echo came back whole");
    }
    // Freed buffers go back to the system (the reader's big buffers are dropped, the heap is
    // trimmed); without that the daemon stayed tens of MiB above its start (docs/performance.md).
    eventually_async(
        Duration::from_secs(10),
        "RSS back near its start",
        || async {
            let now = rss_mib(d.pid());
            (now <= before + 16).then_some(now)
        },
    )
    .await;
    assert!(health_ok(&d).await);
}

/// A mock session's prompt (session `mock-1` exists after one `session/new`); returns the
/// POST's status.
async fn mock_prompt(d: &Daemon, server_id: &str, id: u64, text: &str) -> u16 {
    post_json(
        d,
        &format!("/v1/acp/{server_id}?agent=mock"),
        json!({"jsonrpc": "2.0", "id": id, "method": "session/prompt",
               "params": {"sessionId": "mock-1", "prompt": [{"type": "text", "text": text}]}}),
    )
    .await
    .0
}

/// The number after `forked ` in an SSE text.
fn forked(text: &str) -> u64 {
    text.split("forked ")
        .nth(1)
        .and_then(|t| t.split_whitespace().next()?.parse().ok())
        .expect("a fork count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pids_budget_of_all_agents_together_holds_across_agents() {
    if !crate::support::is_root() {
        crate::support::skip("needs root for cgroups");
        return;
    }
    let d = Daemon::builder()
        .args(["--agents-pids-max", "30", "--agent-pids-max", "max"])
        .start();
    let log = crate::support::eventually(Duration::from_secs(5), "the budget log line", || {
        let log = d.stderr();
        log.contains("budget of all agents together").then_some(log)
    });
    if log.contains("NOT") {
        crate::support::skip("the pids controller is not writable here");
        return;
    }
    let mut counts = Vec::new();
    for (id, n) in [("p1", 10), ("p2", 40)] {
        let (status, _, text) = post_json(
            &d,
            &format!("/v1/acp/{id}?agent=mock"),
            json!({"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {"cwd": "/", "mcpServers": []}}),
        )
        .await;
        assert_eq!(status, 200, "{id}: {text}");
        assert_eq!(mock_prompt(&d, id, 2, &format!("/fork {n}")).await, 200);
        counts.push(forked(&sse_until(&d, id, "forked ").await));
    }
    // The first fits; the second runs into what is left of the budget (without the budget it
    // would start all 40: its own limit is off).
    assert_eq!(counts[0], 10);
    assert!(counts[0] + counts[1] < 30, "{counts:?}");
    assert!(health_ok(&d).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_cgroups_the_rest_of_the_group_is_killed_after_the_leader_was_reaped() {
    // Once the leader is reaped its group id may be reused, so the daemon no longer sends
    // anything to that id: it kills the members it finds in the group instead.
    let dir = tempfile::tempdir().unwrap();
    let script = concat!(
        "sleep 600 &\n",
        "printf '{\"jsonrpc\":\"2.0\",\"method\":\"child\",\"params\":{\"pid\":%d}}\\n' $!\n",
        "read _hello\n",
        "read _go\n",
        "exit 3\n"
    );
    let file = agents_file(dir.path(), &[("leaver", script)]);
    let d = Daemon::builder()
        .arg("--agents-file")
        .arg(&file)
        .args(["--agent-cgroups", "off"])
        .start();
    start_with_notification(&d, "leaver", "leaver").await;
    let text = sse_until(&d, "leaver", "\"pid\":").await;
    let child: u32 = text
        .split("\"pid\":")
        .nth(1)
        .and_then(|t| t.split('}').next()?.trim().parse().ok())
        .expect("the child's pid");
    assert!(pid_alive(child));
    // The script read the first notification; one more line lets it exit by itself.
    let s = eventually_async(Duration::from_secs(10), "the agent ended", || async {
        let _ = post_json(
            &d,
            "/v1/acp/leaver",
            json!({"jsonrpc": "2.0", "method": "go"}),
        )
        .await;
        let s = server(&d, "leaver").await?;
        (s["status"] == "exited").then_some(s)
    })
    .await;
    assert_eq!(s["exitReason"], "exited", "{s}");
    assert_eq!(s["exitCode"], 3, "{s}");
    crate::support::eventually(Duration::from_secs(5), "the group member killed", || {
        (!pid_alive(child)).then_some(())
    });
    delete(&d, "leaver").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acp_body_that_stops_arriving_is_408_and_gives_its_share_back() {
    let d = Daemon::builder()
        .args(["--idle-timeout", "1s", "--acp-inflight-bytes", "1M"])
        .start();
    let (status, text) = initialize(&d, "m", 0).await;
    assert_eq!(status, 200, "{text}");
    // Declares the whole budget, sends a few bytes, then nothing.
    let (code, answer) = tokio::task::spawn_blocking({
        let addr = d.addr.clone();
        move || {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect(&addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            write!(
                s,
                "POST /v1/acp/m HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{{\"jsonrpc\":",
                1 << 20
            )
            .unwrap();
            let mut buf = vec![0u8; 4096];
            let n = s.read(&mut buf).unwrap_or(0);
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            let code: u16 = text
                .split_whitespace()
                .nth(1)
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            (code, text)
        }
    })
    .await
    .unwrap();
    assert_eq!(code, 408, "{answer}");
    assert!(answer.contains("application/problem+json"), "{answer}");
    // The budget is whole again: a body of 1 MiB minus a little fits.
    let pad = "x".repeat((1 << 20) - 200);
    let (status, _, text) = post_raw(
        &d,
        "/v1/acp/m",
        format!(r#"{{"jsonrpc":"2.0","id":9,"method":"_mock/echo","params":{{"p":"{pad}"}}}}"#)
            .into_bytes(),
    )
    .await;
    assert_eq!(status, 200, "{}", &text[..text.len().min(300)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_budget_of_all_agents_together_stops_a_hog_without_its_own_limit() {
    if !crate::support::is_root() {
        crate::support::skip("needs root for cgroups");
        return;
    }
    let d = Daemon::builder()
        .args(["--agents-memory-max", "96M", "--agent-memory-max", "max"])
        .start();
    let log = crate::support::eventually(Duration::from_secs(5), "the budget log line", || {
        let log = d.stderr();
        log.contains("budget of all agents together").then_some(log)
    });
    if log.contains("NOT") {
        crate::support::skip("the memory controller is not writable here");
        return;
    }
    let (status, _, text) = post_json(
        &d,
        "/v1/acp/hog?agent=mock",
        json!({"jsonrpc": "2.0", "id": 1, "method": "session/new", "params": {"cwd": "/", "mcpServers": []}}),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    // Its own limit is off; only the budget of all agents can stop it.
    let (status, _, text) = post_json(
        &d,
        "/v1/acp/hog",
        json!({"jsonrpc": "2.0", "id": 2, "method": "session/prompt",
               "params": {"sessionId": "mock-1", "prompt": [{"type": "text", "text": "/alloc 300"}]}}),
    )
    .await;
    assert_eq!(status, 502, "{text}");
    let body: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(body["exitReason"], "oom", "{body}");
    assert!(health_ok(&d).await);
}
