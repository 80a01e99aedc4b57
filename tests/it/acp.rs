//! The ACP proxy seen from an HTTP client: `/v1/acp/{serverId}` against the real built-in mock
//! agent (`?agent=mock`), with every status code of spec 002 §3.6 and the contract, SSE framing,
//! replay, gaps, slow subscribers, agent exits, timeouts and DELETE.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{Daemon, eventually_async, pid_alive};

/// One POST: status, content type and body text.
struct Answer {
    status: u16,
    content_type: String,
    text: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.text))
    }

    fn assert_problem(&self, status: u16) -> Value {
        assert_eq!(self.status, status, "body: {}", self.text);
        assert_eq!(self.content_type, "application/problem+json");
        let body = self.json();
        assert_eq!(body["status"], status);
        assert!(
            body["title"].is_string() && body["detail"].is_string() && body["type"].is_string()
        );
        body
    }
}

async fn post_with(
    d: &Daemon,
    path: &str,
    body: impl Into<reqwest::Body>,
    headers: &[(&str, &str)],
) -> Answer {
    let mut req = d.client().post(d.url(path));
    let mut has_ct = false;
    for (k, v) in headers {
        has_ct |= k.eq_ignore_ascii_case("content-type");
        req = req.header(*k, *v);
    }
    if !has_ct {
        req = req.header("content-type", "application/json");
    }
    let resp = req.body(body).send().await.expect("POST");
    let status = resp.status().as_u16();
    let content_type = resp
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let text = resp.text().await.unwrap();
    Answer {
        status,
        content_type,
        text,
    }
}

async fn post(d: &Daemon, path: &str, msg: Value) -> Answer {
    post_with(d, path, msg.to_string(), &[]).await
}

fn request(id: Value, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

fn prompt(id: Value, session: &str, text: &str) -> Value {
    request(
        id,
        "session/prompt",
        json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]}),
    )
}

/// Starts `server_id` on the mock agent and opens a session; returns the session id.
async fn start_session(d: &Daemon, server_id: &str) -> String {
    let init = post(
        d,
        &format!("/v1/acp/{server_id}?agent=mock"),
        request(json!(0), "initialize", json!({"protocolVersion": 1})),
    )
    .await;
    assert_eq!(init.status, 200, "{}", init.text);
    let new = post(
        d,
        &format!("/v1/acp/{server_id}"),
        request(
            json!(1),
            "session/new",
            json!({"cwd": "/", "mcpServers": []}),
        ),
    )
    .await;
    assert_eq!(new.status, 200, "{}", new.text);
    new.json()["result"]["sessionId"]
        .as_str()
        .unwrap()
        .to_string()
}

async fn server_info(d: &Daemon, server_id: &str) -> Option<Value> {
    d.servers()
        .await
        .into_iter()
        .find(|s| s["serverId"] == server_id)
}

/// A parsed SSE event.
#[derive(Debug, Clone, PartialEq)]
struct Event {
    event: String,
    id: Option<u64>,
    data: Value,
}

/// An open SSE stream, read incrementally.
struct Sse {
    resp: reqwest::Response,
    raw: Vec<u8>,
    ended: bool,
}

impl Sse {
    async fn open(d: &Daemon, server_id: &str, last_event_id: Option<u64>) -> Sse {
        let resp = Self::get(d, server_id, last_event_id).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        Sse {
            resp,
            raw: Vec::new(),
            ended: false,
        }
    }

    async fn get(d: &Daemon, server_id: &str, last_event_id: Option<u64>) -> reqwest::Response {
        let mut req = d
            .client()
            .get(d.url(&format!("/v1/acp/{server_id}")))
            .header("accept", "text/event-stream");
        if let Some(n) = last_event_id {
            req = req.header("last-event-id", n.to_string());
        }
        req.send().await.unwrap()
    }

    /// Reads one more chunk; false at the end of the stream or after `timeout`.
    async fn read_chunk(&mut self, timeout: Duration) -> bool {
        if self.ended {
            return false;
        }
        match tokio::time::timeout(timeout, self.resp.chunk()).await {
            Ok(Ok(Some(bytes))) => {
                self.raw.extend_from_slice(&bytes);
                true
            }
            Ok(Ok(None)) | Ok(Err(_)) => {
                self.ended = true;
                false
            }
            Err(_) => false,
        }
    }

    fn text(&self) -> String {
        String::from_utf8(self.raw.clone()).expect("SSE is UTF-8")
    }

    /// Every complete event received so far (comments skipped).
    fn events(&self) -> Vec<Event> {
        let text = self.text();
        let complete = match text.rfind("\n\n") {
            Some(i) => &text[..i + 2],
            None => "",
        };
        complete
            .split("\n\n")
            .filter(|block| !block.is_empty() && !block.starts_with(':'))
            .map(|block| {
                let mut ev = Event {
                    event: String::new(),
                    id: None,
                    data: Value::Null,
                };
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event: ") {
                        ev.event = v.to_string();
                    } else if let Some(v) = line.strip_prefix("id: ") {
                        ev.id = Some(v.parse().unwrap());
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        ev.data = serde_json::from_str(v).expect("event data is one JSON object");
                    } else {
                        panic!("unexpected SSE line {line:?} in {block:?}");
                    }
                }
                ev
            })
            .collect()
    }

    /// Reads until `n` events arrived (panics after `timeout`).
    async fn wait_events(&mut self, n: usize, timeout: Duration) -> Vec<Event> {
        let deadline = Instant::now() + timeout;
        loop {
            let evs = self.events();
            if evs.len() >= n {
                return evs;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || (!self.read_chunk(left).await && self.ended) {
                panic!(
                    "wanted {n} events within {timeout:?}, got {}: {}",
                    evs.len(),
                    self.text()
                );
            }
        }
    }

    /// Reads until the server ends the stream (panics after `timeout`).
    async fn wait_end(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.ended {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                panic!("the stream did not end within {timeout:?}: {}", self.text());
            }
            self.read_chunk(left).await;
        }
    }
}

fn chunk_text(ev: &Event) -> &str {
    ev.data["params"]["update"]["content"]["text"]
        .as_str()
        .unwrap_or("")
}

const SECS5: Duration = Duration::from_secs(5);

#[tokio::test]
async fn duplicate_in_flight_id_is_409() {
    let d = Daemon::start();
    let session = start_session(&d, "dup").await;
    let slow = post(&d, "/v1/acp/dup", prompt(json!(5), &session, "/sleep 800"));
    let second = async {
        // Wait until the first is really pending, then reuse its id.
        eventually_async(SECS5, "the first request pending", || async {
            let s = server_info(&d, "dup").await?;
            (s["pendingRequests"] == 1).then_some(())
        })
        .await;
        post(
            &d,
            "/v1/acp/dup",
            request(json!(5), "_mock/echo", json!({})),
        )
        .await
        .assert_problem(409);
        // A string "5" is another id.
        let a = post(
            &d,
            "/v1/acp/dup",
            request(json!("5"), "_mock/echo", json!({})),
        )
        .await;
        assert_eq!(a.status, 200);
    };
    let (first, ()) = tokio::join!(slow, second);
    assert_eq!(first.status, 200);
    assert_eq!(first.json()["result"]["stopReason"], "end_turn");
    // Once answered, the id is free again.
    let a = post(
        &d,
        "/v1/acp/dup",
        request(json!(5), "_mock/echo", json!({})),
    )
    .await;
    assert_eq!(a.status, 200);
}

#[tokio::test]
async fn fifty_concurrent_requests_each_get_their_own_answer() {
    let d = Daemon::start();
    let session = start_session(&d, "many").await;
    let calls = (0..50).map(|i| {
        let d = &d;
        let session = session.clone();
        async move {
            // Mixed: echoes and short prompts, numeric and string ids.
            let id = if i % 2 == 0 {
                json!(1000 + i)
            } else {
                json!(format!("r{i}"))
            };
            let msg = if i % 5 == 0 {
                prompt(id.clone(), &session, &format!("/sleep {}", 50 + i))
            } else {
                request(id.clone(), "_mock/echo", json!({"i": i}))
            };
            let a = post(d, "/v1/acp/many", msg).await;
            assert_eq!(a.status, 200, "{}", a.text);
            let body = a.json();
            assert_eq!(body["id"], id);
            if i % 5 != 0 {
                assert_eq!(body["result"], json!({"i": i}));
            }
        }
    });
    futures_util::future::join_all(calls).await;
    let info = server_info(&d, "many").await.unwrap();
    assert_eq!(info["pendingRequests"], 0);
}

#[tokio::test]
async fn concurrent_first_posts_start_one_process() {
    let d = Daemon::start();
    let calls = (0..8).map(|i| {
        let d = &d;
        async move {
            post(
                d,
                "/v1/acp/race?agent=mock",
                request(json!(i), "_mock/echo", json!(i)),
            )
            .await
        }
    });
    for a in futures_util::future::join_all(calls).await {
        assert_eq!(a.status, 200, "{}", a.text);
    }
    let servers = d.servers().await;
    assert_eq!(servers.len(), 1);
    let pid = servers[0]["pid"].as_u64().unwrap() as u32;
    let mocks: Vec<u32> = crate::support::children_of(d.pid())
        .into_iter()
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| c.windows(10).any(|w| w == b"mock-agent"))
        })
        .collect();
    assert_eq!(mocks, vec![pid], "exactly one agent process");
}

#[tokio::test]
async fn two_server_ids_are_isolated() {
    let d = Daemon::start();
    let sa = start_session(&d, "server-a").await;
    let sb = start_session(&d, "server-b").await;
    // Both agents number sessions themselves: separate processes.
    assert_eq!((sa.as_str(), sb.as_str()), ("mock-1", "mock-1"));
    let a = post(&d, "/v1/acp/server-a", prompt(json!(2), &sa, "/stream 3")).await;
    assert_eq!(a.status, 200);
    let b = post(&d, "/v1/acp/server-b", prompt(json!(2), &sb, "only b")).await;
    assert_eq!(b.status, 200);
    let mut ea = Sse::open(&d, "server-a", None).await;
    let mut eb = Sse::open(&d, "server-b", None).await;
    let evs = ea.wait_events(3, SECS5).await;
    assert_eq!(
        evs.iter()
            .map(|e| (e.id.unwrap(), chunk_text(e).to_string()))
            .collect::<Vec<_>>(),
        vec![
            (1, "chunk 1 of 3".to_string()),
            (2, "chunk 2 of 3".to_string()),
            (3, "chunk 3 of 3".to_string())
        ]
    );
    let evs = eb.wait_events(1, SECS5).await;
    assert_eq!(evs.len(), 1);
    assert_eq!((evs[0].id, chunk_text(&evs[0])), (Some(1), "only b"));
    let servers = d.servers().await;
    let ids: Vec<&str> = servers
        .iter()
        .map(|s| s["serverId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["server-a", "server-b"]);
    assert_ne!(servers[0]["pid"], servers[1]["pid"]);
    // Deleting one leaves the other working.
    let r = d
        .client()
        .delete(d.url("/v1/acp/server-a"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    ea.wait_end(SECS5).await;
    let b = post(
        &d,
        "/v1/acp/server-b",
        request(json!(9), "_mock/echo", json!(9)),
    )
    .await;
    assert_eq!(b.status, 200);
}

#[tokio::test]
async fn sse_framing_is_exact() {
    let d = Daemon::builder().args(["--keepalive", "300ms"]).start();
    let session = start_session(&d, "frame").await;
    let a = post(
        &d,
        "/v1/acp/frame",
        prompt(json!(2), &session, "hello there"),
    )
    .await;
    assert_eq!(a.status, 200);
    let mut sse = Sse::open(&d, "frame", None).await;
    // The first event, then (nothing happening) keepalive comments.
    let deadline = Instant::now() + SECS5;
    while !sse.text().contains(": keepalive\n\n") && Instant::now() < deadline {
        sse.read_chunk(SECS5).await;
    }
    let text = sse.text();
    // What the agent itself writes for the same prompt, straight from its stdout: the frame must
    // carry exactly those bytes.
    let agent_line = {
        use std::io::{BufRead, Write};
        let mut mock = std::process::Command::new(crate::support::BIN)
            .arg("mock-agent")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = mock.stdin.take().unwrap();
        let new = request(
            json!(1),
            "session/new",
            json!({"cwd": "/", "mcpServers": []}),
        );
        let msg = prompt(json!(2), &session, "hello there");
        writeln!(stdin, "{new}\n{msg}").unwrap();
        let mut out = std::io::BufReader::new(mock.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap(); // the session/new answer
        line.clear();
        out.read_line(&mut line).unwrap();
        drop(stdin);
        mock.wait().unwrap();
        line.trim_end_matches('\n').to_string()
    };
    assert!(agent_line.contains("agent_message_chunk"), "{agent_line}");
    let expected = format!("event: message\nid: 1\ndata: {agent_line}\n\n: keepalive\n\n");
    assert!(
        text.starts_with(&expected),
        "got {text:?}\nwanted it to start with {expected:?}"
    );
    // After the event, nothing but keepalive comments.
    assert!(
        text[expected.len()..]
            .split_inclusive("\n\n")
            .all(|c| c == ": keepalive\n\n" || ": keepalive\n\n".starts_with(c)),
        "{text:?}"
    );
    // The POST's own response never appears on the stream.
    assert!(!text.contains("end_turn"));
}

#[tokio::test]
async fn sse_replays_after_last_event_id() {
    let d = Daemon::start();
    let session = start_session(&d, "replay").await;
    let a = post(
        &d,
        "/v1/acp/replay",
        prompt(json!(2), &session, "/stream 5"),
    )
    .await;
    assert_eq!(a.status, 200);
    // Without Last-Event-ID: everything retained.
    let mut all = Sse::open(&d, "replay", None).await;
    let evs = all.wait_events(5, SECS5).await;
    assert_eq!(
        evs.iter().map(|e| e.id.unwrap()).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5]
    );
    // After 3: 4 and 5, then live events continue with 6.
    let mut after = Sse::open(&d, "replay", Some(3)).await;
    let evs = after.wait_events(2, SECS5).await;
    assert_eq!(
        evs.iter().map(|e| e.id.unwrap()).collect::<Vec<_>>(),
        [4, 5]
    );
    assert_eq!(chunk_text(&evs[0]), "chunk 4 of 5");
    let a = post(&d, "/v1/acp/replay", prompt(json!(3), &session, "live")).await;
    assert_eq!(a.status, 200);
    let evs = after.wait_events(3, SECS5).await;
    assert_eq!((evs[2].id, chunk_text(&evs[2])), (Some(6), "live"));
    let evs = all.wait_events(6, SECS5).await;
    assert_eq!(evs[5].id, Some(6), "every subscriber sees every event");
    // Up to date: nothing replayed, the stream stays open.
    let mut none = Sse::open(&d, "replay", Some(6)).await;
    assert!(!none.read_chunk(Duration::from_millis(300)).await || none.events().is_empty());
}

#[tokio::test]
async fn sse_reports_a_gap_after_the_ring_overran() {
    let d = Daemon::builder().args(["--event-buffer", "5"]).start();
    let session = start_session(&d, "gap").await;
    let a = post(&d, "/v1/acp/gap", prompt(json!(2), &session, "/stream 20")).await;
    assert_eq!(a.status, 200);
    let mut sse = Sse::open(&d, "gap", None).await;
    let evs = sse.wait_events(6, SECS5).await;
    assert_eq!(evs[0].event, "gap");
    assert_eq!(evs[0].id, None);
    assert_eq!(evs[0].data, json!({"from": 1, "to": 15}));
    assert_eq!(
        evs[1..].iter().map(|e| e.id.unwrap()).collect::<Vec<_>>(),
        [16, 17, 18, 19, 20]
    );
    let mut sse = Sse::open(&d, "gap", Some(10)).await;
    let evs = sse.wait_events(6, SECS5).await;
    assert_eq!(evs[0].data, json!({"from": 11, "to": 15}));
    assert_eq!(evs[1].id, Some(16));
    // Nothing missing after 15.
    let mut sse = Sse::open(&d, "gap", Some(15)).await;
    let evs = sse.wait_events(5, SECS5).await;
    assert_eq!(evs[0].id, Some(16));
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test]
async fn slow_subscriber_is_cut_off_while_another_keeps_receiving() {
    let d = Daemon::builder()
        .args(["--event-buffer", "100000", "--event-buffer-bytes", "4M"])
        .start();
    let session = start_session(&d, "slow").await;
    let stalled = Sse::open(&d, "slow", None).await;
    let mut reader = Sse::open(&d, "slow", None).await;
    eventually_async(SECS5, "two subscribers", || async {
        let s = server_info(&d, "slow").await?;
        (s["subscribers"] == 2).then_some(())
    })
    .await;
    let rss_before = rss_kib(d.pid());
    // ~30 MB of events: far more than the socket buffers and the stalled subscriber's queue
    // (twice the ring's 4 MB).
    let n = 150_000;
    let post_prompt = post(
        &d,
        "/v1/acp/slow",
        prompt(json!(2), &session, &format!("/stream {n}")),
    );
    let read_all = async {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last_id = 0;
        let mut seen = 0usize;
        while last_id < n && Instant::now() < deadline {
            if !reader.read_chunk(Duration::from_secs(10)).await {
                break;
            }
            // Count events incrementally (the full parse would be quadratic).
            let text = String::from_utf8_lossy(&reader.raw[seen..]).into_owned();
            if let Some(end) = text.rfind("\n\n") {
                for block in text[..end].split("\n\n") {
                    if let Some(id) = block.lines().find_map(|l| l.strip_prefix("id: ")) {
                        let id: u64 = id.parse().unwrap();
                        assert_eq!(id, last_id + 1, "no event skipped");
                        last_id = id;
                    }
                }
                seen += end + 2;
            }
        }
        last_id
    };
    let (a, last) = tokio::join!(post_prompt, read_all);
    assert_eq!(a.status, 200);
    assert_eq!(last, n, "the reading subscriber got every event");
    let info = server_info(&d, "slow").await.unwrap();
    assert_eq!(info["subscribers"], 1, "the stalled subscriber was cut off");
    let grown = rss_kib(d.pid()).saturating_sub(rss_before);
    eprintln!("daemon RSS grew by {grown} KiB while streaming ~30 MB");
    assert!(grown < 40 * 1024, "daemon RSS grew by {grown} KiB");
    drop(stalled);
}

#[tokio::test]
async fn crash_is_answered_502_at_once_with_exit_details() {
    let d = Daemon::start();
    let session = start_session(&d, "crash").await;
    let a = post(
        &d,
        "/v1/acp/crash",
        prompt(json!(2), &session, "/stderr last words"),
    )
    .await;
    assert_eq!(a.status, 200);
    let waiting = post(
        &d,
        "/v1/acp/crash",
        prompt(json!(3), &session, "/sleep 30000"),
    );
    let crash = async {
        // The crash must find the other request waiting.
        eventually_async(SECS5, "the first request pending", || async {
            let s = server_info(&d, "crash").await?;
            (s["pendingRequests"] == 1).then_some(())
        })
        .await;
        let started = Instant::now();
        let a = post(&d, "/v1/acp/crash", prompt(json!(4), &session, "/crash 3")).await;
        (a, started.elapsed())
    };
    let (w, (a, took)) = tokio::join!(waiting, crash);
    assert!(took < Duration::from_secs(1), "502 took {took:?}");
    for answer in [&w, &a] {
        let p = answer.assert_problem(502);
        assert_eq!(p["exitCode"], 3);
        assert_eq!(p["exitReason"], "exited");
        assert_eq!(p["serverId"], "crash");
        assert!(
            p["stderrTail"].as_str().unwrap().contains("last words"),
            "{p}"
        );
    }
    let info = server_info(&d, "crash").await.unwrap();
    assert_eq!(info["status"], "exited");
    assert_eq!(info["exitCode"], 3);
    assert_eq!(info["exitReason"], "exited");
    // Later POSTs keep answering 502, notifications too.
    post(
        &d,
        "/v1/acp/crash",
        request(json!(5), "_mock/echo", json!({})),
    )
    .await
    .assert_problem(502);
    post(&d, "/v1/acp/crash", json!({"jsonrpc":"2.0","method":"x"}))
        .await
        .assert_problem(502);
}

#[tokio::test]
async fn exited_instance_streams_what_remains_then_410() {
    let d = Daemon::start();
    let session = start_session(&d, "ended").await;
    let mut live = Sse::open(&d, "ended", None).await;
    let a = post(&d, "/v1/acp/ended", prompt(json!(2), &session, "/stream 2")).await;
    assert_eq!(a.status, 200);
    post(&d, "/v1/acp/ended", prompt(json!(3), &session, "/crash"))
        .await
        .assert_problem(502);
    // A live stream delivers what remains, then ends.
    live.wait_end(SECS5).await;
    assert_eq!(live.events().len(), 2);
    // A new stream without Last-Event-ID replays, then ends.
    let mut replay = Sse::open(&d, "ended", None).await;
    replay.wait_end(SECS5).await;
    assert_eq!(replay.events().len(), 2);
    // Nothing left after 2: 410.
    let r = Sse::get(&d, "ended", Some(2)).await;
    assert_eq!(r.status(), 410);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
}

#[tokio::test]
async fn timeout_is_504_and_the_late_answer_reaches_sse() {
    let d = Daemon::builder()
        .args(["--request-timeout", "400ms"])
        .start();
    let session = start_session(&d, "slowagent").await;
    let mut sse = Sse::open(&d, "slowagent", None).await;
    let started = Instant::now();
    let p = post(
        &d,
        "/v1/acp/slowagent",
        prompt(json!("late"), &session, "/sleep 2500"),
    )
    .await
    .assert_problem(504);
    // Answered at the 400 ms timeout, not when the agent answers (2.5 s); the margin is for a
    // loaded CI machine.
    assert!(started.elapsed() < Duration::from_millis(2000));
    assert_eq!(p["serverId"], "slowagent");
    let evs = sse.wait_events(1, SECS5).await;
    assert_eq!(evs[0].data["id"], "late");
    assert_eq!(evs[0].data["result"]["stopReason"], "end_turn");
    // /hang never answers: 504; cancelling it sends the cancelled answer to the stream.
    post(&d, "/v1/acp/slowagent", prompt(json!(7), &session, "/hang"))
        .await
        .assert_problem(504);
    let a = post(
        &d,
        "/v1/acp/slowagent",
        json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId": session}}),
    )
    .await;
    assert_eq!(a.status, 202);
    let evs = sse.wait_events(2, SECS5).await;
    assert_eq!(evs[1].data["id"], 7);
    assert_eq!(evs[1].data["result"]["stopReason"], "cancelled");
}

#[tokio::test]
async fn client_disconnect_sends_the_answer_to_sse() {
    let d = Daemon::start();
    let session = start_session(&d, "gone").await;
    let mut sse = Sse::open(&d, "gone", None).await;
    let req = d
        .client()
        .post(d.url("/v1/acp/gone"))
        .header("content-type", "application/json")
        .body(prompt(json!(11), &session, "/sleep 500").to_string())
        .timeout(Duration::from_millis(150))
        .send()
        .await;
    assert!(req.is_err(), "the client gave up");
    let evs = sse.wait_events(1, SECS5).await;
    assert_eq!(evs[0].data["id"], 11);
}

#[tokio::test]
async fn respond_async_is_202_and_the_answer_goes_to_sse() {
    let d = Daemon::start();
    let session = start_session(&d, "async").await;
    let a = post_with(
        &d,
        "/v1/acp/async",
        prompt(json!(3), &session, "/stream 2").to_string(),
        &[("prefer", "respond-async")],
    )
    .await;
    assert_eq!((a.status, a.text.as_str()), (202, ""));
    let mut sse = Sse::open(&d, "async", None).await;
    let evs = sse.wait_events(3, SECS5).await;
    assert_eq!(chunk_text(&evs[0]), "chunk 1 of 2");
    assert_eq!(chunk_text(&evs[1]), "chunk 2 of 2");
    assert_eq!(evs[2].data["id"], 3);
    assert_eq!(evs[2].data["result"]["stopReason"], "end_turn");
}

#[tokio::test]
async fn permission_round_trip_through_sse_and_a_posted_response() {
    let d = Daemon::start();
    let session = start_session(&d, "perm").await;
    let mut sse = Sse::open(&d, "perm", None).await;
    let prompt_call = post(
        &d,
        "/v1/acp/perm",
        prompt(json!(2), &session, "/permission"),
    );
    let answer = async {
        let evs = sse.wait_events(1, SECS5).await;
        let req = &evs[0].data;
        assert_eq!(req["method"], "session/request_permission");
        assert_eq!(req["params"]["sessionId"], session.as_str());
        let kinds: Vec<&str> = req["params"]["options"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["kind"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["allow_once", "allow_always", "reject_once"]);
        let option = req["params"]["options"][1]["optionId"].clone();
        let a = post(
            &d,
            "/v1/acp/perm",
            json!({"jsonrpc":"2.0","id": req["id"],
                   "result":{"outcome":{"outcome":"selected","optionId": option}}}),
        )
        .await;
        assert_eq!(a.status, 202);
        option
    };
    let (p, option) = tokio::join!(prompt_call, answer);
    assert_eq!(p.status, 200);
    assert_eq!(p.json()["result"]["stopReason"], "end_turn");
    let evs = sse.wait_events(2, SECS5).await;
    assert_eq!(
        chunk_text(&evs[1]),
        format!("permission: {}", option.as_str().unwrap())
    );
}

#[tokio::test]
async fn invalid_stdout_lines_are_dropped_and_counted() {
    // 260 bytes: the mock's session/new answer (~245 bytes, with its model option) passes.
    let d = Daemon::builder().args(["--max-line", "260"]).start();
    // Straight to session/new: the answer to initialize would be over the maximum.
    let a = post(
        &d,
        "/v1/acp/dirty?agent=mock",
        request(
            json!(1),
            "session/new",
            json!({"cwd": "/", "mcpServers": []}),
        ),
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text);
    let session = a.json()["result"]["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    let a = post(&d, "/v1/acp/dirty", prompt(json!(2), &session, "/garbage")).await;
    assert_eq!(a.status, 200);
    assert_eq!(a.json()["result"]["stopReason"], "end_turn");
    // The echo of a 300-character prompt is one chunk notification over the 260-byte maximum.
    let long = "x".repeat(300);
    for id in 3..6 {
        let a = post(&d, "/v1/acp/dirty", prompt(json!(id), &session, &long)).await;
        assert_eq!(a.status, 200);
    }
    let info = server_info(&d, "dirty").await.unwrap();
    assert_eq!(info["invalidStdoutLines"], 4);
    assert_eq!(info["lastEventId"], 0, "nothing was forwarded");
    let stderr = d.stderr();
    assert!(stderr.contains("dropped an agent stdout line"), "{stderr}");
    assert!(stderr.contains("this line is not JSON"));
}

#[tokio::test]
async fn delete_twice_is_204_and_the_process_is_gone() {
    let d = Daemon::start();
    start_session(&d, "del").await;
    let pid = server_info(&d, "del").await.unwrap()["pid"]
        .as_u64()
        .unwrap() as u32;
    assert!(pid_alive(pid));
    let mut sse = Sse::open(&d, "del", None).await;
    let started = Instant::now();
    let r = d
        .client()
        .delete(d.url("/v1/acp/del"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(server_info(&d, "del").await.is_none(), "no longer listed");
    sse.wait_end(SECS5).await;
    let r = d
        .client()
        .delete(d.url("/v1/acp/del"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let r = d
        .client()
        .delete(d.url("/v1/acp/never"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    crate::support::eventually(SECS5, "the agent process gone", || {
        (!std::path::Path::new(&format!("/proc/{pid}")).exists()).then_some(())
    });
    assert_eq!(Sse::get(&d, "del", None).await.status(), 404);
    // The serverId can be used again, with a new process.
    start_session(&d, "del").await;
    let pid2 = server_info(&d, "del").await.unwrap()["pid"]
        .as_u64()
        .unwrap() as u32;
    assert_ne!(pid, pid2);
}

#[tokio::test]
async fn sandboxagent_methods_pass_through_untouched() {
    let d = Daemon::start();
    start_session(&d, "ext").await;
    let a = post(
        &d,
        "/v1/acp/ext",
        request(json!(2), "_sandboxagent/session/list", json!({})),
    )
    .await;
    assert_eq!(a.status, 200);
    // The mock does not know it, so the agent's own "method not found" comes back.
    let body = a.json();
    assert_eq!(body["error"]["code"], -32601);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("_sandboxagent/session/list")
    );
    // Params travel unchanged (echo), including `_meta` keys the old server interpreted.
    let params = json!({"_meta": {"sandboxagent.dev": {"x": 1}}, "k": [1, "2", null]});
    let a = post(
        &d,
        "/v1/acp/ext",
        request(json!(3), "_mock/echo", params.clone()),
    )
    .await;
    assert_eq!(a.json()["result"], params);
    let a = post(
        &d,
        "/v1/acp/ext",
        json!({"jsonrpc":"2.0","method":"_sandboxagent/ping"}),
    )
    .await;
    assert_eq!(a.status, 202);
}

#[tokio::test]
async fn jsonrpc_errors_turn_failures_into_json_rpc_error_objects() {
    let d = Daemon::builder()
        .args(["--request-timeout", "300ms"])
        .start();
    let session = start_session(&d, "rpcerr").await;
    let a = post_with(
        &d,
        "/v1/acp/rpcerr",
        prompt(json!(4), &session, "/hang").to_string(),
        &[("prefer", "jsonrpc-errors")],
    )
    .await;
    assert_eq!(a.status, 200, "{}", a.text);
    let body = a.json();
    assert_eq!(body["id"], 4);
    assert_eq!(body["error"]["code"], -32603);
    assert_eq!(body["error"]["data"]["status"], 504);
    assert_eq!(body["error"]["message"], body["error"]["data"]["title"]);
    // Client errors stay HTTP errors.
    post_with(
        &d,
        "/v1/acp/rpcerr?agent=claude",
        prompt(json!(5), &session, "x").to_string(),
        &[("prefer", "jsonrpc-errors")],
    )
    .await
    .assert_problem(409);
    drop(d);

    let d = Daemon::builder().arg("--jsonrpc-errors").start();
    let session = start_session(&d, "rpcerr2").await;
    let a = post(
        &d,
        "/v1/acp/rpcerr2",
        prompt(json!("c"), &session, "/crash 9"),
    )
    .await;
    assert_eq!(a.status, 200);
    let body = a.json();
    assert_eq!(body["id"], "c");
    assert_eq!(body["error"]["code"], -32603);
    assert_eq!(body["error"]["data"]["status"], 502);
    assert_eq!(body["error"]["data"]["exitCode"], 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_answers_waiting_posts_ends_streams_and_stops_agents() {
    let d = Daemon::start();
    let session = start_session(&d, "bye").await;
    let pid = server_info(&d, "bye").await.unwrap()["pid"]
        .as_u64()
        .unwrap() as u32;
    let mut sse = Sse::open(&d, "bye", None).await;
    let (client, url) = (d.client(), d.url("/v1/acp/bye"));
    let body = prompt(json!(2), &session, "/hang").to_string();
    let waiting = tokio::spawn(async move {
        let r = client
            .post(url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("an answer, not a dropped connection");
        let status = r.status().as_u16();
        (status, r.json::<Value>().await.unwrap())
    });
    eventually_async(SECS5, "the prompt pending", || async {
        let s = server_info(&d, "bye").await?;
        (s["pendingRequests"] == 1).then_some(())
    })
    .await;
    let mut d = d;
    let (code, d) = tokio::task::spawn_blocking(move || (d.stop(Duration::from_secs(15)), d))
        .await
        .unwrap();
    assert_eq!(code, 0, "{}", d.stderr());
    let (status, problem) = waiting.await.unwrap();
    assert_eq!(status, 502, "{problem}");
    assert_eq!(problem["exitReason"], "graceful");
    sse.wait_end(SECS5).await;
    assert!(!pid_alive(pid), "the agent was stopped with the daemon");
}

#[tokio::test]
async fn listing_shows_live_figures() {
    let d = Daemon::start();
    assert!(d.servers().await.is_empty());
    let session = start_session(&d, "figs").await;
    let a = post(&d, "/v1/acp/figs", prompt(json!(2), &session, "/stream 2")).await;
    assert_eq!(a.status, 200);
    let _sse = Sse::open(&d, "figs", None).await;
    let info = eventually_async(SECS5, "one subscriber", || async {
        let s = server_info(&d, "figs").await?;
        (s["subscribers"] == 1).then_some(s)
    })
    .await;
    assert_eq!(info["agent"], "mock");
    assert_eq!(info["status"], "running");
    assert_eq!(info["lastEventId"], 2);
    assert_eq!(info["pendingRequests"], 0);
    assert_eq!(info["invalidStdoutLines"], 0);
    assert!(info["pid"].as_u64().unwrap() > 1);
    assert!(info["createdAtMs"].as_u64().unwrap() > 1_600_000_000_000);
    assert!(info["exitCode"].is_null() && info["exitReason"].is_null());
    for k in ["rssBytes", "cpuMs", "processes", "openFds", "signal"] {
        assert!(info.get(k).is_some(), "{k} is listed");
    }
    // Figures read from /proc for the agent's processes: a live mock has memory, one process at
    // least, and at least its three stdio descriptors open.
    assert!(info["rssBytes"].as_u64().unwrap() > 0, "{info}");
    assert!(info["processes"].as_u64().unwrap() >= 1, "{info}");
    assert!(info["openFds"].as_u64().unwrap() >= 3, "{info}");
    assert!(info["cpuMs"].is_u64(), "{info}");
}

/// The published npm client of this API, unchanged, drives the mock agent end to end.
#[tokio::test]
async fn npm_acp_http_client_drives_the_mock_agent() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/compat");
    if !dir.join("node_modules/acp-http-client").exists() {
        crate::support::skip("tests/compat/node_modules is missing; run .ci/install-acp.sh");
        return;
    }
    let d = Daemon::builder().token("compat-token").start();
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new("node")
            .arg(dir.join("drive.mjs"))
            .arg(format!("http://{}", d.addr))
            .arg("sdk-mock-0f1e2d3c")
            .arg("compat-token")
            .current_dir(&dir)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the npm client finished within 60 s")
    .expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "node failed ({}):\n{stdout}\n{stderr}\ndaemon:\n{}",
        out.status,
        d.stderr()
    );
    let seen: Value = serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap();
    assert_eq!(seen["agentName"], "mock");
    assert_eq!(seen["protocolVersion"], 1);
    assert_eq!(seen["sessionId"], "mock-1");
    assert_eq!(
        seen["stopReasons"],
        json!(["end_turn", "end_turn", "end_turn", "end_turn"])
    );
    let chunks: Vec<&str> = seen["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert_eq!(chunks[0], "hello from npm");
    for c in [
        "chunk 1 of 3",
        "chunk 2 of 3",
        "chunk 3 of 3",
        "permission: allow-once",
    ] {
        assert!(chunks.contains(&c), "{c} in {chunks:?}");
    }
    assert_eq!(chunks.len(), 5, "each update exactly once: {chunks:?}");
    assert_eq!(seen["permissionRequests"], 1);
    // Its disconnect() DELETEd the serverId.
    assert!(d.servers().await.is_empty());
}

#[tokio::test]
async fn large_messages_round_trip_in_both_directions() {
    let d = Daemon::start();
    start_session(&d, "big").await;
    // Lines over the pipe's atomic size go through the writer task; small ones racing with them
    // must still each get their own answer.
    let big = "x".repeat(1 << 20);
    let calls = (0..12).map(|i| {
        let d = &d;
        let payload = if i % 3 == 0 {
            big.clone()
        } else {
            format!("small {i}")
        };
        async move {
            let a = post(
                d,
                "/v1/acp/big",
                request(json!(100 + i), "_mock/echo", json!({"p": payload})),
            )
            .await;
            assert_eq!(a.status, 200);
            let body = a.json();
            assert_eq!(body["id"], 100 + i);
            assert_eq!(body["result"]["p"].as_str().unwrap(), payload);
        }
    });
    futures_util::future::join_all(calls).await;
    // A notification carrying a large body is written whole as well.
    let a = post(
        &d,
        "/v1/acp/big",
        json!({"jsonrpc":"2.0","method":"_mock/ignored","params":{"p": big}}),
    )
    .await;
    assert_eq!(a.status, 202);
    let a = post(
        &d,
        "/v1/acp/big",
        request(json!(1), "_mock/echo", json!("after")),
    )
    .await;
    assert_eq!(a.json()["result"], "after");
}

/// A POST answered with the agent's response names the last event logged before it: a client
/// that read the stream up to that id has every update that preceded the answer, with no
/// `GET /v1/acp` (the SDK's `prompt()` waits for exactly that).
#[tokio::test]
async fn a_response_names_the_last_event_logged_before_it() {
    let d = Daemon::start();
    let post_id = |body: Value| {
        let req = d
            .client()
            .post(d.url("/v1/acp/lastid?agent=mock"))
            .header("content-type", "application/json")
            .body(body.to_string());
        async move {
            let resp = req.send().await.unwrap();
            let status = resp.status().as_u16();
            let id = resp
                .headers()
                .get("sandbox-agent-last-event-id")
                .map(|v| v.to_str().unwrap().parse::<u64>().unwrap());
            (status, id, resp.text().await.unwrap())
        }
    };
    let (status, id, _) = post_id(request(
        json!(0),
        "initialize",
        json!({"protocolVersion": 1}),
    ))
    .await;
    assert_eq!((status, id), (200, Some(0)), "nothing logged yet");
    let (_, _, new) = post_id(request(
        json!(1),
        "session/new",
        json!({"cwd": "/", "mcpServers": []}),
    ))
    .await;
    let session: Value = serde_json::from_str(&new).unwrap();
    let session = session["result"]["sessionId"].as_str().unwrap().to_string();
    let (status, id, body) = post_id(prompt(json!(2), &session, "/stream 5")).await;
    assert_eq!((status, id), (200, Some(5)), "{body}");
    let (_, id, _) = post_id(prompt(json!(3), &session, "live")).await;
    assert_eq!(id, Some(6));
    // Every update of the prompts is on the stream at or below the ids the answers named.
    let mut sse = Sse::open(&d, "lastid", None).await;
    let evs = sse.wait_events(6, SECS5).await;
    assert_eq!(chunk_text(&evs[4]), "chunk 5 of 5");
    assert_eq!((evs[5].id, chunk_text(&evs[5])), (Some(6), "live"));
    // Answered 202 (respond-async): no response, no header.
    let resp = d
        .client()
        .post(d.url("/v1/acp/lastid"))
        .header("content-type", "application/json")
        .header("prefer", "respond-async")
        .body(prompt(json!(4), &session, "later").to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202);
    assert!(resp.headers().get("sandbox-agent-last-event-id").is_none());
}
