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

async fn listing(d: &Daemon) -> Vec<Value> {
    let v: Value = d
        .client()
        .get(d.url("/v1/acp"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["servers"].as_array().unwrap().clone()
}

async fn server(d: &Daemon, server_id: &str) -> Option<Value> {
    listing(d)
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

const FLOOD: &str = "exec yes 'flood-line: an agent that writes stderr in a loop, as fast as it can' >&2\n";

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
