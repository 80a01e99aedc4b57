//! The process API (`/v1/processes`) through the real daemon: runs with exit codes and timeouts,
//! background processes whose output log is followed, cut and resumed by offset, stdin, terminals
//! (HTTP and WebSocket), stopping whole trees, many short processes without zombies, the caps, and
//! the published npm SDK driving it unchanged. Processes are checked in /proc.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

use crate::support::{Daemon, eventually_async, is_root, pid_alive, skip, zombies_among};

async fn post(d: &Daemon, path: &str, body: Value) -> (u16, Value) {
    let resp = d
        .client()
        .post(d.url(path))
        .json(&body)
        .send()
        .await
        .expect("POST");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn get(d: &Daemon, path: &str) -> (u16, Value) {
    let resp = d.client().get(d.url(path)).send().await.expect("GET");
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

async fn create(d: &Daemon, body: Value) -> String {
    let (status, info) = post(d, "/v1/processes", body).await;
    assert_eq!(status, 200, "{info}");
    info["id"].as_str().expect("id").to_string()
}

async fn wait_exited(d: &Daemon, id: &str) -> Value {
    eventually_async(Duration::from_secs(15), "the process to exit", || async {
        let (_, info) = get(d, &format!("/v1/processes/{id}")).await;
        (info["status"] == "exited").then_some(info)
    })
    .await
}

fn decode(entries: &Value) -> Vec<u8> {
    use base64::Engine;
    let mut out = Vec::new();
    for e in entries.as_array().expect("entries") {
        assert_eq!(e["encoding"], "base64");
        out.extend(
            base64::engine::general_purpose::STANDARD
                .decode(e["data"].as_str().expect("data"))
                .expect("base64"),
        );
    }
    out
}

async fn logs_text(d: &Daemon, id: &str) -> String {
    let (status, body) = get(d, &format!("/v1/processes/{id}/logs")).await;
    assert_eq!(status, 200, "{body}");
    String::from_utf8_lossy(&decode(&body["entries"])).into_owned()
}

/// One parsed SSE frame.
#[derive(Debug)]
struct Frame {
    event: String,
    id: Option<u64>,
    data: String,
}

/// Reads SSE frames from `resp` until `enough` says so or the stream ends.
async fn read_frames(
    resp: reqwest::Response,
    mut enough: impl FnMut(&[Frame]) -> bool,
) -> Vec<Frame> {
    let mut frames = Vec::new();
    let mut buf = String::new();
    let mut stream = resp.bytes_stream();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !enough(&frames) {
        let next = tokio::time::timeout_at(deadline, stream.next())
            .await
            .expect("SSE frames within 20 s");
        let Some(chunk) = next else { break };
        buf.push_str(&String::from_utf8_lossy(&chunk.expect("SSE chunk")));
        while let Some(i) = buf.find("\n\n") {
            let raw = buf[..i].to_string();
            buf.drain(..i + 2);
            let mut f = Frame {
                event: "message".into(),
                id: None,
                data: String::new(),
            };
            let mut comment = true;
            for line in raw.lines() {
                if let Some(v) = line.strip_prefix("event: ") {
                    f.event = v.to_string();
                    comment = false;
                } else if let Some(v) = line.strip_prefix("id: ") {
                    f.id = Some(v.parse().expect("numeric id"));
                } else if let Some(v) = line.strip_prefix("data: ") {
                    f.data.push_str(v);
                    comment = false;
                }
            }
            if !comment {
                frames.push(f);
            }
        }
    }
    frames
}

fn frames_text(frames: &[Frame]) -> Vec<u8> {
    let mut out = Vec::new();
    for f in frames.iter().filter(|f| f.event == "log") {
        let entry: Value = serde_json::from_str(&f.data).expect("entry JSON");
        assert_eq!(Some(entry["sequence"].as_u64().unwrap()), f.id);
        out.extend(decode(&json!([entry])));
    }
    out
}

#[tokio::test]
async fn run_reports_exit_codes_output_and_timeouts() {
    let d = Daemon::start();
    let (status, ok) = post(
        &d,
        "/v1/processes/run",
        json!({"command": "sh", "args": ["-c", "echo out; echo err >&2"]}),
    )
    .await;
    assert_eq!(status, 200, "{ok}");
    assert_eq!(ok["exitCode"], 0);
    assert_eq!(ok["stdout"], "out\n");
    assert_eq!(ok["stderr"], "err\n");
    assert_eq!(ok["timedOut"], false);

    let (_, three) = post(
        &d,
        "/v1/processes/run",
        json!({"command": "sh", "args": ["-c", "exit 3"]}),
    )
    .await;
    assert_eq!(three["exitCode"], 3, "{three}");

    // The timeout kills the whole tree, including a background child.
    let pidfile = d.work_dir().join("run-timeout.pid");
    let (_, slow) = post(
        &d,
        "/v1/processes/run",
        json!({"command": "sh", "args": ["-c", format!("sleep 60 & echo $! > {}; wait", pidfile.display())], "timeoutMs": 300}),
    )
    .await;
    assert_eq!(slow["timedOut"], true, "{slow}");
    assert_eq!(slow["exitCode"], Value::Null);
    let child: u32 = std::fs::read_to_string(&pidfile)
        .expect("pid file")
        .trim()
        .parse()
        .expect("pid");
    assert!(!pid_alive(child), "the timed-out run's child survived");

    // Output beyond the limit is cut and flagged.
    let (_, big) = post(
        &d,
        "/v1/processes/run",
        json!({"command": "head", "args": ["-c", "5000", "/dev/zero"], "maxOutputBytes": 100}),
    )
    .await;
    assert_eq!(big["stdout"].as_str().unwrap().len(), 100);
    assert_eq!(big["stdoutTruncated"], true);
    assert_eq!(big["exitCode"], 0);
}

#[tokio::test]
async fn follow_cut_and_resumed_with_last_event_id_loses_and_repeats_nothing() {
    let d = Daemon::start();
    let id = create(
        &d,
        json!({"command": "sh", "args": ["-c", "i=1; while [ $i -le 300 ]; do echo line $i; i=$((i+1)); sleep 0.005; done"]}),
    )
    .await;
    let expected: String = (1..=300).map(|i| format!("line {i}\n")).collect();
    let url = d.url(&format!("/v1/processes/{id}/logs?follow=true"));
    let first = d.client().get(&url).send().await.expect("follow");
    assert_eq!(first.status().as_u16(), 200);
    assert_eq!(
        first.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    // Read a few frames, then cut the connection (the response is dropped).
    let part1 = read_frames(first, |f| {
        f.iter().filter(|f| f.event == "log").count() >= 5
    })
    .await;
    let last_id = part1
        .iter()
        .filter_map(|f| f.id)
        .next_back()
        .expect("an id");
    let text1 = frames_text(&part1);
    assert_eq!(last_id, text1.len() as u64, "ids are byte offsets");
    let second = d
        .client()
        .get(&url)
        .header("last-event-id", last_id.to_string())
        .send()
        .await
        .expect("resume");
    // The stream ends by itself once the process has exited and everything was sent.
    let part2 = read_frames(second, |_| false).await;
    assert!(part2.iter().all(|f| f.event == "log"), "no gap expected");
    let ids: Vec<u64> = part2.iter().filter_map(|f| f.id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids increase");
    assert!(ids[0] > last_id);
    let mut all = text1;
    all.extend(frames_text(&part2));
    assert_eq!(String::from_utf8_lossy(&all), expected);
    // `since` in the JSON form follows the same rule.
    let (_, tail) = get(&d, &format!("/v1/processes/{id}/logs?since={last_id}")).await;
    assert_eq!(
        String::from_utf8_lossy(&decode(&tail["entries"])),
        expected[last_id as usize..]
    );
}

#[tokio::test]
async fn dropped_output_is_reported_as_a_gap_with_the_lost_range() {
    let d = Daemon::builder()
        .args(["--process-max-log-bytes", "1K"])
        .start();
    let id = create(
        &d,
        json!({"command": "sh", "args": ["-c", "i=0; while [ $i -lt 1000 ]; do echo 0123456789; i=$((i+1)); done"]}),
    )
    .await;
    wait_exited(&d, &id).await;
    let (_, logs) = get(&d, &format!("/v1/processes/{id}/logs")).await;
    let kept = decode(&logs["entries"]);
    assert!(kept.len() <= 1024 && !kept.is_empty());
    assert_eq!(logs["end"], 11000);
    assert_eq!(logs["gap"]["from"], 0);
    assert_eq!(
        logs["gap"]["to"].as_u64().unwrap(),
        11000 - kept.len() as u64
    );
    let resp = d
        .client()
        .get(d.url(&format!("/v1/processes/{id}/logs?follow=true")))
        .header("last-event-id", "100")
        .send()
        .await
        .expect("follow");
    let frames = read_frames(resp, |_| false).await;
    assert_eq!(frames[0].event, "gap");
    assert_eq!(frames[0].id, None, "a gap does not move the client's id");
    let gap: Value = serde_json::from_str(&frames[0].data).unwrap();
    assert_eq!(gap["from"], 100);
    assert_eq!(gap["to"], logs["gap"]["to"]);
    assert_eq!(frames_text(&frames[1..]), kept);
}

#[tokio::test]
async fn stdin_round_trip_through_cat() {
    let d = Daemon::start();
    let id = create(&d, json!({"command": "cat", "interactive": true})).await;
    let (status, w) = post(
        &d,
        &format!("/v1/processes/{id}/input"),
        json!({"data": "aGVsbG8gY2F0Cg==", "encoding": "base64"}),
    )
    .await;
    assert_eq!(status, 200, "{w}");
    assert_eq!(w["bytesWritten"], 10);
    let (_, w) = post(
        &d,
        &format!("/v1/processes/{id}/input"),
        json!({"data": "second line\n", "encoding": "utf8"}),
    )
    .await;
    assert_eq!(w["bytesWritten"], 12);
    eventually_async(Duration::from_secs(10), "cat's echo", || async {
        (logs_text(&d, &id).await == "hello cat\nsecond line\n").then_some(())
    })
    .await;
    // Without `interactive` there is no stdin to write to.
    let quiet = create(&d, json!({"command": "sleep", "args": ["30"]})).await;
    let (status, p) = post(
        &d,
        &format!("/v1/processes/{quiet}/input"),
        json!({"data": "eA==", "encoding": "base64"}),
    )
    .await;
    assert_eq!(status, 409, "{p}");
    let (_, stopped) = post(
        &d,
        &format!("/v1/processes/{id}/stop?waitMs=5000"),
        json!({}),
    )
    .await;
    assert_eq!(stopped["status"], "exited", "{stopped}");
    let (_, killed) = post(
        &d,
        &format!("/v1/processes/{quiet}/kill?waitMs=5000"),
        json!({}),
    )
    .await;
    assert_eq!(killed["status"], "exited");
    assert_eq!(killed["exitSignal"], 9, "{killed}");
}

#[tokio::test]
async fn pty_bash_answers_tty_with_a_pty_and_sees_a_resize() {
    let d = Daemon::start();
    let id = create(
        &d,
        json!({"command": "bash", "args": ["--norc", "--noprofile"], "tty": true, "interactive": true, "cols": 80, "rows": 24}),
    )
    .await;
    let send = |s: &'static str| {
        let d = &d;
        let id = id.clone();
        async move {
            let (status, body) = post(
                d,
                &format!("/v1/processes/{id}/input"),
                json!({"data": s, "encoding": "utf8"}),
            )
            .await;
            assert_eq!(status, 200, "{body}");
        }
    };
    send("tty; stty size\n").await;
    eventually_async(Duration::from_secs(10), "tty and size", || async {
        let t = logs_text(&d, &id).await;
        (t.contains("/dev/pts/") && t.contains("24 80")).then_some(())
    })
    .await;
    let (status, size) = post(
        &d,
        &format!("/v1/processes/{id}/terminal/resize"),
        json!({"cols": 100, "rows": 30}),
    )
    .await;
    assert_eq!(status, 200, "{size}");
    assert_eq!(size, json!({"cols": 100, "rows": 30}));
    // `stty size` asks the terminal itself, so it sees what TIOCSWINSZ set.
    send("stty size\n").await;
    eventually_async(Duration::from_secs(10), "the new size", || async {
        logs_text(&d, &id).await.contains("30 100").then_some(())
    })
    .await;
    send("exit 7\n").await;
    let info = wait_exited(&d, &id).await;
    assert_eq!(info["exitCode"], 7, "{info}");
    let (_, logs) = get(&d, &format!("/v1/processes/{id}/logs")).await;
    assert_eq!(logs["stream"], "pty");
}

#[tokio::test]
async fn terminal_websocket_carries_input_resize_output_and_exit() {
    let d = Daemon::start();
    let id = create(
        &d,
        json!({"command": "bash", "args": ["--norc", "--noprofile"], "tty": true, "interactive": true}),
    )
    .await;
    let url = format!("ws://{}/v1/processes/{id}/terminal/ws", d.addr);
    let (mut ws, _) = tokio_tungstenite::connect_async(url)
        .await
        .expect("WebSocket");
    let next_text = async |ws: &mut tokio_tungstenite::WebSocketStream<_>| -> Value {
        loop {
            match ws.next().await.expect("a frame").expect("frame") {
                Message::Text(t) => return serde_json::from_str(t.as_str()).expect("JSON"),
                Message::Binary(_) => continue,
                other => panic!("unexpected {other:?}"),
            }
        }
    };
    let ready: Value = next_text(&mut ws).await;
    assert_eq!(ready, json!({"type": "ready", "processId": id}));
    ws.send(Message::text(
        json!({"type": "resize", "cols": 111, "rows": 33}).to_string(),
    ))
    .await
    .unwrap();
    ws.send(Message::text(
        json!({"type": "input", "data": "tty; stty size; exit 5\n"}).to_string(),
    ))
    .await
    .unwrap();
    let mut output = Vec::new();
    let exit = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            match ws.next().await.expect("a frame").expect("frame") {
                Message::Binary(b) => output.extend_from_slice(&b),
                Message::Text(t) => {
                    let v: Value = serde_json::from_str(t.as_str()).unwrap();
                    if v["type"] == "exit" {
                        return v;
                    }
                    panic!("unexpected control frame {v}");
                }
                other => panic!("unexpected {other:?}"),
            }
        }
    })
    .await
    .expect("exit frame within 15 s");
    let text = String::from_utf8_lossy(&output);
    assert!(text.contains("/dev/pts/"), "{text}");
    assert!(text.contains("33 111"), "{text}");
    assert_eq!(exit["exitCode"], 5);
    // A pipe process has no terminal.
    let plain = create(&d, json!({"command": "sleep", "args": ["30"]})).await;
    let resp = d
        .client()
        .get(d.url(&format!("/v1/processes/{plain}/terminal/ws")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 409);
    post(&d, &format!("/v1/processes/{plain}/kill"), json!({})).await;
}

#[tokio::test]
async fn stop_takes_the_whole_tree_with_a_term_ignoring_setsid_grandchild() {
    if !is_root() {
        skip("needs root for cgroups (a setsid grandchild leaves the process group)");
        return;
    }
    let d = Daemon::builder().args(["--agent-grace", "1s"]).start();
    let pidfile = d.work_dir().join("grandchild.pid");
    let script = format!(
        "setsid sh -c 'trap \"\" TERM; echo $$ > {}; while :; do sleep 1; done' & wait",
        pidfile.display()
    );
    let id = create(&d, json!({"command": "sh", "args": ["-c", script]})).await;
    let grandchild: u32 =
        eventually_async(Duration::from_secs(10), "the grandchild's pid", || async {
            std::fs::read_to_string(&pidfile)
                .ok()
                .and_then(|s| s.trim().parse().ok())
        })
        .await;
    let (_, info) = get(&d, &format!("/v1/processes/{id}")).await;
    let top = info["pid"].as_u64().unwrap() as u32;
    assert!(info["stats"]["processes"].as_u64().unwrap() >= 2, "{info}");
    assert!(pid_alive(grandchild));
    let (status, stopped) = post(
        &d,
        &format!("/v1/processes/{id}/stop?waitMs=10000"),
        json!({}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(stopped["status"], "exited", "{stopped}");
    // The top process took its TERM; the grandchild, outside the process group, never got it
    // and was killed through the cgroup.
    assert_eq!(stopped["exitSignal"], 15, "{stopped}");
    assert!(!pid_alive(top));
    assert!(!pid_alive(grandchild), "the setsid grandchild survived");
    // Deleting the record is allowed now, and it is gone.
    let resp = d
        .client()
        .delete(d.url(&format!("/v1/processes/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 204);
    assert_eq!(get(&d, &format!("/v1/processes/{id}")).await.0, 404);
}

#[tokio::test]
async fn fifty_concurrent_short_processes_leave_no_zombie() {
    let d = Daemon::start();
    let creates = (0..50).map(|i| {
        let d = &d;
        async move {
            create(
                d,
                json!({"command": "sh", "args": ["-c", format!("echo $$ {i}")]}),
            )
            .await
        }
    });
    let ids = futures_util::future::join_all(creates).await;
    let mut pids = Vec::new();
    for id in &ids {
        wait_exited(&d, id).await;
        let text = logs_text(&d, id).await;
        let pid: u32 = text.split_whitespace().next().unwrap().parse().unwrap();
        pids.push(pid);
    }
    assert_eq!(pids.len(), 50);
    assert!(zombies_among(&pids).is_empty(), "zombies left");
    assert!(pids.iter().all(|p| !pid_alive(*p)));
    let daemon_children = crate::support::children_of(d.pid());
    assert!(
        zombies_among(&daemon_children).is_empty(),
        "the daemon has zombie children"
    );
    // 50 runs at once as well.
    let runs = (0..50).map(|_| post(&d, "/v1/processes/run", json!({"command": "true"})));
    for (status, r) in futures_util::future::join_all(runs).await {
        assert_eq!(status, 200, "{r}");
        assert_eq!(r["exitCode"], 0);
    }
    let daemon_children = crate::support::children_of(d.pid());
    assert!(zombies_among(&daemon_children).is_empty());
}

#[tokio::test]
async fn caps_answer_429_and_503_with_retry_after() {
    let d = Daemon::builder()
        .args([
            "--process-max-concurrent",
            "2",
            "--process-max-log-bytes",
            "1K",
            "--process-max-total-log-bytes",
            "2K",
        ])
        .start();
    let a = create(&d, json!({"command": "sleep", "args": ["30"]})).await;
    let b = create(&d, json!({"command": "sleep", "args": ["30"]})).await;
    let resp = d
        .client()
        .post(d.url("/v1/processes"))
        .json(&json!({"command": "sleep", "args": ["30"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 429);
    assert_eq!(resp.headers()["retry-after"], "1");
    assert_eq!(resp.headers()["content-type"], "application/problem+json");
    let (status, _) = post(&d, "/v1/processes/run", json!({"command": "true"})).await;
    assert_eq!(status, 429, "runs count against the same cap");
    // Once both have ended, their (empty) logs give the budget back... except what they hold.
    post(
        &d,
        &format!("/v1/processes/{a}/kill?waitMs=5000"),
        json!({}),
    )
    .await;
    post(
        &d,
        &format!("/v1/processes/{b}/kill?waitMs=5000"),
        json!({}),
    )
    .await;
    let c = create(&d, json!({"command": "sleep", "args": ["30"]})).await;
    let e = create(&d, json!({"command": "sleep", "args": ["30"]})).await;
    post(
        &d,
        &format!("/v1/processes/{c}/kill?waitMs=5000"),
        json!({}),
    )
    .await;
    // Two exited records holding 1K each fill the 2K budget.
    let filler = create(
        &d,
        json!({"command": "head", "args": ["-c", "4096", "/dev/zero"]}),
    )
    .await;
    wait_exited(&d, &filler).await;
    post(
        &d,
        &format!("/v1/processes/{e}/kill?waitMs=5000"),
        json!({}),
    )
    .await;
    let filler2 = create(
        &d,
        json!({"command": "head", "args": ["-c", "4096", "/dev/zero"]}),
    )
    .await;
    wait_exited(&d, &filler2).await;
    let resp = d
        .client()
        .post(d.url("/v1/processes"))
        .json(&json!({"command": "true"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 503);
    assert_eq!(resp.headers()["retry-after"], "5");
    // Deleting a record gives its bytes back.
    let resp = d
        .client()
        .delete(d.url(&format!("/v1/processes/{filler}")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 204);
    let last = create(&d, json!({"command": "true"})).await;
    wait_exited(&d, &last).await;
    // A run's capture comes out of the same budget: 2 × 1M does not fit in 2K, 2 × 100 does.
    let (status, r) = post(&d, "/v1/processes/run", json!({"command": "true"})).await;
    assert_eq!(status, 503, "{r}");
    let (status, r) = post(
        &d,
        "/v1/processes/run",
        json!({"command": "true", "maxOutputBytes": 100}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
}

#[tokio::test]
async fn bad_requests_are_problem_json() {
    let d = Daemon::start();
    let cases = [
        ("/v1/processes", json!({"command": ""}), 400),
        ("/v1/processes", json!({"args": []}), 400),
        ("/v1/processes", json!({"command": "/no/such/program"}), 400),
        // A name the kernel refuses (ENAMETOOLONG; found by schemathesis, was 502), a path
        // through a file (ENOTDIR): the request's fault, on every start path.
        ("/v1/processes", json!({"command": "a".repeat(300)}), 400),
        (
            "/v1/processes",
            json!({"command": "a".repeat(300), "tty": true}),
            400,
        ),
        (
            "/v1/processes/run",
            json!({"command": "a".repeat(300)}),
            400,
        ),
        ("/v1/processes", json!({"command": "/etc/passwd/x"}), 400),
        (
            "/v1/processes",
            json!({"command": "true", "cwd": "/no/such/dir"}),
            400,
        ),
        (
            "/v1/processes/config",
            json!({"maxConcurrentProcesses": 0, "defaultRunTimeoutMs": 1, "maxRunTimeoutMs": 1, "maxOutputBytes": 1, "maxLogBytesPerProcess": 1, "maxInputBytesPerRequest": 1}),
            400,
        ),
        ("/v1/processes/proc_999/stop", json!({}), 404),
        ("/v1/processes/nonsense/kill", json!({}), 404),
    ];
    for (path, body, want) in cases {
        let resp = d
            .client()
            .post(d.url(path))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), want, "{path} {body}");
        assert_eq!(resp.headers()["content-type"], "application/problem+json");
    }
    let id = create(&d, json!({"command": "cat", "interactive": true})).await;
    let (status, _) = post(
        &d,
        &format!("/v1/processes/{id}/input"),
        json!({"data": "not base64!"}),
    )
    .await;
    assert_eq!(status, 400);
    let (status, _) = post(
        &d,
        &format!("/v1/processes/{id}/input"),
        json!({"data": "x".repeat(70_000), "encoding": "utf8"}),
    )
    .await;
    assert_eq!(status, 413);
    let (status, _) = post(
        &d,
        &format!("/v1/processes/{id}/terminal/resize"),
        json!({"cols": 10, "rows": 10}),
    )
    .await;
    assert_eq!(status, 409, "not a terminal");
    let (status, _) = get(&d, &format!("/v1/processes/{id}/logs?since=abc")).await;
    assert_eq!(status, 400);
    let (status, _) = get(&d, &format!("/v1/processes/{id}/logs?stream=bogus")).await;
    assert_eq!(status, 400);
    let resp = d
        .client()
        .delete(d.url(&format!("/v1/processes/{id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 409, "still running");
    post(
        &d,
        &format!("/v1/processes/{id}/kill?waitMs=5000"),
        json!({}),
    )
    .await;
}

#[tokio::test]
async fn processes_get_the_agents_clean_environment() {
    let d = Daemon::builder()
        .token("proc-secret-token")
        .env("SANDBOX_AGENT_SOMETHING", "hidden")
        .start();
    let (status, r) = post(
        &d,
        "/v1/processes/run",
        json!({"command": "env", "env": {"MINE": "yes"}}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    let env = r["stdout"].as_str().unwrap();
    assert!(env.contains("MINE=yes"));
    assert!(!env.contains("proc-secret-token"), "{env}");
    assert!(!env.contains("SANDBOX_AGENT_"), "{env}");
    assert!(!env.contains("NOTIFY_SOCKET"), "{env}");
}

/// The published npm SDK (`sandbox-agent` 0.4.2), unchanged, drives the process API.
#[tokio::test]
async fn published_npm_sdk_drives_the_process_api() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/processes-compat");
    if !dir.join("node_modules/sandbox-agent").exists() || !dir.join("node_modules/ws").exists() {
        skip("tests/processes-compat/node_modules is missing; run .ci/install-processes.sh");
        return;
    }
    let d = Daemon::builder().token("compat-token").start();
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new("node")
            .arg(dir.join("drive.mjs"))
            .arg(format!("http://{}", d.addr))
            .arg("compat-token")
            .current_dir(&dir)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the SDK finished within 60 s")
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
    // The published client reads the installer's answer as `already_installed` (our own SDK and
    // the rest of the API spell it `alreadyInstalled`): both spellings stay for it.
    assert_eq!(seen["installMock"]["already_installed"], true, "{seen}");
    assert_eq!(seen["configSet"]["maxOutputBytes"], 4096);
    assert_eq!(seen["run"]["exitCode"], 3);
    assert_eq!(seen["run"]["stdout"], "out\n");
    assert_eq!(seen["run"]["stderr"], "err\n");
    assert_eq!(seen["runTimeout"]["timedOut"], true);
    assert_eq!(seen["runTruncated"]["stdoutLength"], 4096);
    assert_eq!(seen["runTruncated"]["stdoutTruncated"], true);
    assert_eq!(seen["created"]["status"], "running");
    assert_eq!(seen["input"]["bytesWritten"], 5);
    assert_eq!(seen["followedText"], "ping\n");
    assert_eq!(seen["listed"], json!([seen["created"]["id"]]));
    assert_eq!(seen["logs"]["stream"], "stdout");
    assert_eq!(seen["stopped"]["status"], "exited");
    assert_eq!(seen["afterDelete"], 404);
    assert_eq!(seen["resize"], json!({"cols": 123, "rows": 45}));
    assert!(seen["ttyText"].as_str().unwrap().contains("45 123"));
    assert_eq!(seen["killed"]["status"], "exited");
    assert_eq!(seen["deleteUnknown"], 404);
    // Its terminal WebSocket, which carries the token as `?access_token=`.
    assert_eq!(seen["wsReady"]["type"], "ready");
    assert_eq!(seen["wsReady"]["processId"], seen["ttyId"]);
    let ws_text = seen["wsText"].as_str().unwrap();
    assert!(ws_text.contains("/dev/pts/"), "{ws_text}");
    assert!(ws_text.contains("22 77"), "{ws_text}");
    assert!(
        !d.stderr().contains("compat-token"),
        "the token reached the daemon's log"
    );
}
