//! In-place reload (SIGHUP): the daemon re-executes itself with the same pid and carries its
//! agents, processes, event and output logs, pending requests and the listening socket.

use std::io::{Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::{Value, json};

use crate::support::{BIN, Daemon, children_of, eventually, eventually_async, is_root, skip};
use crate::transports::{RFD, Stream, prompt, request, rfd_initialize, rfd_post};

/// Sends SIGHUP and waits for the reload's `RELOADING=1` then the new image's `READY=1`.
/// Returns the RELOADING message.
pub(crate) fn reload(d: &mut Daemon) -> String {
    let before = d.messages.len();
    d.signal(Signal::SIGHUP);
    wait_reloaded(d, before)
}

fn wait_reloaded(d: &mut Daemon, before: usize) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let new = &d.messages[before..];
        let reloading = new
            .iter()
            .position(|m| m.lines().any(|l| l == "RELOADING=1"));
        if let Some(i) = reloading
            && let Some(ready) = new[i..].iter().find(|m| m.lines().any(|l| l == "READY=1"))
        {
            assert!(
                ready.contains("STATUS=listening on"),
                "the reload failed: {ready:?}\nstderr:\n{}",
                d.stderr()
            );
            return new[i].clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no RELOADING=1 then READY=1 within 30 s: {:?}\nstderr:\n{}",
            &d.messages[before..],
            d.stderr()
        );
        d.read_notify();
    }
}

/// Sends SIGHUP and waits for the refusal (READY=1 with a "reload failed" status).
fn reload_refused(d: &mut Daemon) -> String {
    let before = d.messages.len();
    d.signal(Signal::SIGHUP);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(m) = d.messages[before..]
            .iter()
            .find(|m| m.contains("STATUS=reload failed"))
        {
            assert!(m.lines().any(|l| l == "READY=1"), "{m:?}");
            return m.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no refusal within 30 s: {:?}",
            &d.messages[before..]
        );
        d.read_notify();
    }
}

async fn post(d: &Daemon, server_id: &str, body: Value) -> (u16, Value) {
    post_with(d, server_id, body, &[]).await
}

async fn post_with(
    d: &Daemon,
    server_id: &str,
    body: Value,
    headers: &[(&str, &str)],
) -> (u16, Value) {
    let mut req = d
        .client()
        .post(d.url(&format!("/v1/acp/{server_id}?agent=mock")))
        .json(&body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Starts a mock agent under `server_id` with one session; returns the session id.
async fn mock_session(d: &Daemon, server_id: &str) -> String {
    let (s, _) = post(
        d,
        server_id,
        json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}),
    )
    .await;
    assert_eq!(s, 200);
    let (s, body) = post(
        d,
        server_id,
        json!({"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/tmp","mcpServers":[]}}),
    )
    .await;
    assert_eq!(s, 200, "{body}");
    body["result"]["sessionId"].as_str().unwrap().to_string()
}

async fn server(d: &Daemon, server_id: &str) -> Value {
    d.servers()
        .await
        .into_iter()
        .find(|s| s["serverId"] == server_id)
        .unwrap_or_else(|| panic!("no {server_id} in the listing"))
}

pub(crate) async fn create_process(d: &Daemon, script: &str) -> Value {
    let resp = d
        .client()
        .post(d.url("/v1/processes"))
        .json(&json!({"command": "sh", "args": ["-c", script]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.json().await.unwrap()
}

/// The whole output log of a process: (entries' sequence/data pairs, the bytes).
pub(crate) async fn process_log(d: &Daemon, id: &str) -> (Vec<(u64, Vec<u8>)>, Value) {
    use base64::Engine;
    let body = d.get_json(&format!("/v1/processes/{id}/logs")).await;
    let entries = body["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| {
            let data = base64::engine::general_purpose::STANDARD
                .decode(e["data"].as_str().unwrap())
                .unwrap();
            (e["sequence"].as_u64().unwrap(), data)
        })
        .collect();
    (entries, body)
}

/// The counter lines a process printed, checked to be 1, 2, 3, … with no byte lost or doubled
/// (and the log's offsets contiguous from 0).
fn counted(entries: &[(u64, Vec<u8>)]) -> u64 {
    let mut at = 0;
    let mut all = Vec::new();
    for (seq, data) in entries {
        assert_eq!(
            seq - data.len() as u64,
            at,
            "a gap or overlap in the offsets"
        );
        at = *seq;
        all.extend_from_slice(data);
    }
    let text = String::from_utf8(all).unwrap();
    let mut n = 0;
    for line in text.lines() {
        n += 1;
        assert_eq!(
            line,
            n.to_string(),
            "output lost or doubled around line {n}"
        );
    }
    n
}

const COUNTER: &str = "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); echo $i; sleep 0.005; done";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_and_processes_keep_their_pids_and_logs_across_reloads() {
    let mut d = Daemon::start();
    let daemon_pid = d.pid();
    let session = mock_session(&d, "s1").await;
    let agent_pid = server(&d, "s1").await["pid"].as_u64().unwrap();
    let proc = create_process(&d, COUNTER).await;
    let id = proc["id"].as_str().unwrap().to_string();
    let proc_pid = proc["pid"].as_u64().unwrap();
    eventually_async(
        Duration::from_secs(10),
        "output before the reload",
        || async {
            (d.get_json(&format!("/v1/processes/{id}")).await["logEnd"].as_u64()? > 20)
                .then_some(())
        },
    )
    .await;

    let reloading = reload(&mut d);
    assert!(
        reloading.lines().any(|l| l.starts_with("MONOTONIC_USEC=")),
        "RELOADING=1 comes with MONOTONIC_USEC: {reloading:?}"
    );
    // A second reload right away: the new image reloads as well as the first.
    reload(&mut d);

    assert_eq!(d.pid(), daemon_pid);
    assert!(d.child.as_mut().unwrap().try_wait().unwrap().is_none());
    let s1 = server(&d, "s1").await;
    assert_eq!(s1["pid"].as_u64().unwrap(), agent_pid, "{s1}");
    assert_eq!(s1["status"], "running");
    let p = d.get_json(&format!("/v1/processes/{id}")).await;
    assert_eq!(p["pid"].as_u64().unwrap(), proc_pid, "{p}");
    assert_eq!(p["status"], "running");
    // Both are still the daemon's children (nothing was re-spawned).
    let kids = children_of(daemon_pid);
    assert!(kids.contains(&(agent_pid as u32)) && kids.contains(&(proc_pid as u32)));

    // The agent answers on the same session, through the carried pipes.
    let (s, body) = post(
        &d,
        "s1",
        json!({"jsonrpc":"2.0","id":3,"method":"session/prompt",
               "params":{"sessionId":session,"prompt":[{"type":"text","text":"/stream 3"}]}}),
    )
    .await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["result"]["stopReason"], "end_turn");

    // The process's output went on through the reloads with no byte lost or doubled.
    let before = counted(&process_log(&d, &id).await.0);
    eventually_async(
        Duration::from_secs(20),
        "more output after the reload",
        || async {
            let n = counted(&process_log(&d, &id).await.0);
            (n > before + 50).then_some(())
        },
    )
    .await;

    // A new agent and a new process start as before.
    mock_session(&d, "s2").await;
    let p2 = create_process(&d, "echo hi").await;
    assert_ne!(p2["id"], proc["id"], "ids are not reused after a reload");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sse_reader_resumes_after_a_reload_with_no_gap_and_no_repeat() {
    let mut d = Daemon::start();
    let session = mock_session(&d, "s1").await;
    let (s, _) = post_with(
        &d,
        "s1",
        json!({"jsonrpc":"2.0","id":"long","method":"session/prompt",
               "params":{"sessionId":session,"prompt":[{"type":"text","text":"/stream 3000"}]}}),
        &[("prefer", "respond-async")],
    )
    .await;
    assert_eq!(s, 202);
    let mut frames: Vec<(u64, String)> = Vec::new();
    let mut first = read_sse(&d, "s1", None).await;
    // Read some, then reload while the rest is still to come.
    while frames.len() < 10 {
        frames.extend(first.next_frames().await.expect("the stream ended early"));
    }
    let before = d.messages.len();
    d.signal(Signal::SIGHUP);
    // The old stream ends cleanly when the reload quiesces.
    while let Some(more) = first.next_frames().await {
        frames.extend(more);
    }
    wait_reloaded(&mut d, before);
    let mut last = frames.last().map(|f| f.0);
    // Resume with Last-Event-ID until the prompt's answer arrives.
    let mut answered = frames.iter().any(|(_, data)| data.contains("\"long\""));
    for _ in 0..3 {
        if answered {
            break;
        }
        let mut sse = read_sse(&d, "s1", last).await;
        while let Some(more) = sse.next_frames().await {
            answered |= more.iter().any(|(_, data)| data.contains("\"long\""));
            frames.extend(more);
            if answered {
                break;
            }
        }
        last = frames.last().map(|f| f.0);
        if answered {
            break;
        }
    }
    assert!(
        answered,
        "the prompt's answer never arrived: {} frames, last {:?}; {}\nstderr:\n{}",
        frames.len(),
        frames.last(),
        server(&d, "s1").await,
        d.stderr()
    );
    for (i, (id, _)) in frames.iter().enumerate() {
        assert_eq!(
            *id,
            i as u64 + 1,
            "ids are contiguous from 1 (no gap, no repeat)"
        );
    }
    let chunks: Vec<u64> = frames
        .iter()
        .filter_map(|(_, data)| {
            let v: Value = serde_json::from_str(data).ok()?;
            let t = v["params"]["update"]["content"]["text"].as_str()?;
            t.strip_prefix("chunk ")?.split(' ').next()?.parse().ok()
        })
        .collect();
    assert_eq!(chunks, (1..=3000).collect::<Vec<u64>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_in_flight_is_answered_202_and_its_answer_reaches_the_stream() {
    let mut d = Daemon::start();
    let session = mock_session(&d, "s1").await;
    let client = d.client();
    let url = d.url("/v1/acp/s1");
    let prompt = json!({"jsonrpc":"2.0","id":77,"method":"session/prompt",
        "params":{"sessionId":session,"prompt":[{"type":"text","text":"/hang"}]}});
    let waiting = tokio::spawn(async move {
        let r = client.post(url).json(&prompt).send().await.unwrap();
        (r.status().as_u16(), r.text().await.unwrap())
    });
    eventually_async(Duration::from_secs(10), "the prompt pending", || async {
        (server(&d, "s1").await["pendingRequests"] == 1).then_some(())
    })
    .await;
    let before = d.messages.len();
    d.signal(Signal::SIGHUP);
    let (status, body) = waiting.await.unwrap();
    assert_eq!(
        status, 202,
        "the waiting POST is answered as respond-async: {body}"
    );
    wait_reloaded(&mut d, before);
    assert_eq!(server(&d, "s1").await["pendingRequests"], 1);
    // Cancelled after the reload: the agent answers, and the answer goes to the stream.
    let (s, _) = post(
        &d,
        "s1",
        json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":session}}),
    )
    .await;
    assert_eq!(s, 202);
    let mut sse = read_sse(&d, "s1", None).await;
    let mut seen = Vec::new();
    while let Some(more) = sse.next_frames().await {
        seen.extend(more);
        if let Some((_, data)) = seen.iter().find(|(_, d)| d.contains("\"id\":77")) {
            assert!(data.contains("cancelled"), "{data}");
            return;
        }
    }
    panic!("the answer never reached the stream: {seen:?}");
}

#[test]
fn health_probes_on_fresh_connections_lose_none_across_reloads() {
    let mut d = Daemon::start();
    let addr = d.addr.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
    let probe = {
        let (stop, ok, failures) = (stop.clone(), ok.clone(), failures.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match health(&addr) {
                    Ok(()) => {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => failures.lock().unwrap().push(e),
                }
                std::thread::sleep(Duration::from_millis(3));
            }
        })
    };
    for _ in 0..3 {
        reload(&mut d);
        let at = ok.load(Ordering::Relaxed);
        eventually(Duration::from_secs(10), "probes after the reload", || {
            (ok.load(Ordering::Relaxed) > at + 10).then_some(())
        });
    }
    stop.store(true, Ordering::Relaxed);
    probe.join().unwrap();
    let failures = failures.lock().unwrap();
    assert!(failures.is_empty(), "failed probes: {failures:?}");
}

/// One `GET /v1/health` on a new connection; the whole answer must arrive.
fn health(addr: &str) -> Result<(), String> {
    let mut s = std::net::TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)
        .map_err(|e| format!("read: {e}"))?;
    if answer.starts_with("HTTP/1.1 200") {
        Ok(())
    } else {
        Err(format!("answer: {:?}", answer.lines().next()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_config_or_binary_is_refused_and_the_daemon_serves_on() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("sandbox-agent");
    std::fs::copy(BIN, &bin).unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "event_buffer = 100\n").unwrap();
    let mut d = Daemon::builder()
        .binary(&bin)
        .arg("--config")
        .arg(&config)
        .start();
    mock_session(&d, "s1").await;
    let agent_pid = server(&d, "s1").await["pid"].clone();

    // A configuration the new image would refuse.
    std::fs::write(&config, "no_such_setting = 1\n").unwrap();
    reload_refused(&mut d);
    // The reason is in the log (never in `STATUS=`, which every user can read).
    eventually(Duration::from_secs(5), "the reason in the log", || {
        d.stderr()
            .contains("the configuration is not valid")
            .then_some(())
    });
    std::fs::write(&config, "event_buffer = 100\n").unwrap();

    // A binary that does not run, then none at all.
    let real = dir.path().join("real");
    std::fs::rename(&bin, &real).unwrap();
    std::fs::write(&bin, "#!/bin/sh\nexit 3\n").unwrap();
    std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    reload_refused(&mut d);
    std::fs::remove_file(&bin).unwrap();
    reload_refused(&mut d);

    // Through all of it: the same agent, serving.
    assert_eq!(server(&d, "s1").await["pid"], agent_pid);
    let (s, _) = post(
        &d,
        "s1",
        json!({"jsonrpc":"2.0","id":9,"method":"session/new","params":{"cwd":"/tmp","mcpServers":[]}}),
    )
    .await;
    assert_eq!(s, 200);

    // With the binary and the config right again, the reload happens.
    std::fs::rename(&real, &bin).unwrap();
    reload(&mut d);
    assert_eq!(server(&d, "s1").await["pid"], agent_pid);
}

fn inode(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().ino()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_replaced_on_disk_is_the_one_running_after_the_reload() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("sandbox-agent");
    std::fs::copy(BIN, &bin).unwrap();
    let mut d = Daemon::builder().binary(&bin).start();
    mock_session(&d, "s1").await;
    let agent_pid = server(&d, "s1").await["pid"].clone();
    let exe = format!("/proc/{}/exe", d.pid());
    let old = inode(&bin);
    assert_eq!(inode(Path::new(&exe)), old);

    // An upgrade: a new file renamed over the old one, as dpkg does.
    let staged = dir.path().join("sandbox-agent.new");
    std::fs::copy(BIN, &staged).unwrap();
    std::fs::rename(&staged, &bin).unwrap();
    let new = inode(&bin);
    assert_ne!(new, old);
    assert_eq!(inode(Path::new(&exe)), old, "the old image still runs");
    // The old image can still start the built-in agent (it runs the file at the path, not
    // the deleted /proc/self/exe).
    mock_session(&d, "s2").await;

    reload(&mut d);
    assert_eq!(
        inode(Path::new(&exe)),
        new,
        "the new binary runs after the reload"
    );
    assert_eq!(server(&d, "s1").await["pid"], agent_pid);
    mock_session(&d, "s3").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_is_carried_inside_the_hand_off_never_in_argv_or_the_environment() {
    let token = "reload-secret-token-4242";
    let mut d = Daemon::builder().env("SANDBOX_AGENT_TOKEN", token).start();
    d.token = Some(token.to_string());
    reload(&mut d);
    let anon = crate::support::http()
        .get(d.url("/v1/acp"))
        .send()
        .await
        .unwrap();
    assert_eq!(anon.status(), 401, "the token is still required");
    assert_eq!(
        d.client()
            .get(d.url("/v1/acp"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    if is_root() {
        for f in ["cmdline", "environ"] {
            let raw = std::fs::read(format!("/proc/{}/{f}", d.pid())).unwrap();
            let text = String::from_utf8_lossy(&raw);
            assert!(!text.contains(token), "the token is in /proc/<pid>/{f}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_pid1_a_reload_keeps_the_agents_and_the_init_forwards_it() {
    let available = is_root()
        && std::process::Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc", "true"])
            .status()
            .is_ok_and(|s| s.success());
    if !available {
        return skip("needs root and unshare --pid to run the daemon as PID 1");
    }
    let mut d = Daemon::builder()
        .wrapper(["unshare", "--pid", "--fork", "--mount-proc"])
        .expect_exit(None)
        .start();
    let init = eventually(Duration::from_secs(5), "the namespace's PID 1", || {
        children_of(d.pid()).first().copied()
    });
    let daemon = eventually(Duration::from_secs(5), "the daemon under our init", || {
        children_of(init).first().copied()
    });
    mock_session(&d, "s1").await;
    let agent_pid = server(&d, "s1").await["pid"].clone();
    // SIGHUP to PID 1 is forwarded to the daemon, which reloads in place.
    let before = d.messages.len();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(init as i32), Signal::SIGHUP).unwrap();
    wait_reloaded(&mut d, before);
    assert_eq!(
        children_of(init),
        vec![daemon],
        "the same daemon process under the init"
    );
    assert_eq!(server(&d, "s1").await["pid"], agent_pid);
    mock_session(&d, "s2").await;
    // Inside the container, `sandbox-agent reload --pid 1` goes through the init and waits for
    // the outcome.
    let init_ns = format!("--target={init}");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("nsenter")
            .args([
                init_ns.as_str(),
                "--pid",
                "--mount",
                "--",
                BIN,
                "reload",
                "--pid",
                "1",
            ])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "reload --pid 1 in the namespace: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(children_of(init), vec![daemon], "still the same daemon");
    assert_eq!(server(&d, "s1").await["pid"], agent_pid);
    // And it still stops cleanly through the init.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(init as i32), Signal::SIGTERM).unwrap();
    let mut child = d.child.take().unwrap();
    let status = eventually(Duration::from_secs(15), "the namespace to end", || {
        child.try_wait().unwrap()
    });
    assert_eq!(status.code(), Some(0), "stderr:\n{}", d.stderr());
}

/// A minimal SSE reader: frames with an id, returned as they arrive.
struct SseReader {
    resp: reqwest::Response,
    buf: String,
}

async fn read_sse(d: &Daemon, server_id: &str, last: Option<u64>) -> SseReader {
    let mut req = d
        .client()
        .get(d.url(&format!("/v1/acp/{server_id}")))
        .header("accept", "text/event-stream");
    if let Some(n) = last {
        req = req.header("last-event-id", n.to_string());
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    SseReader {
        resp,
        buf: String::new(),
    }
}

impl SseReader {
    /// The next complete frames (id, data); `None` when the stream ended or stayed silent 10 s.
    async fn next_frames(&mut self) -> Option<Vec<(u64, String)>> {
        loop {
            if let Some(end) = self.buf.rfind("\n\n") {
                let complete: String = self.buf.drain(..end + 2).collect();
                let frames: Vec<(u64, String)> = complete
                    .split("\n\n")
                    .filter_map(|block| {
                        let mut id = None;
                        let mut data = None;
                        for line in block.lines() {
                            assert_ne!(line, "event: gap", "a gap in the stream: {block}");
                            if let Some(v) = line.strip_prefix("id: ") {
                                id = v.parse().ok();
                            } else if let Some(v) = line.strip_prefix("data: ") {
                                data = Some(v.to_string());
                            }
                        }
                        Some((id?, data.unwrap_or_default()))
                    })
                    .collect();
                if !frames.is_empty() {
                    return Some(frames);
                }
            }
            match tokio::time::timeout(Duration::from_secs(10), self.resp.chunk()).await {
                Ok(Ok(Some(bytes))) => self.buf.push_str(&String::from_utf8_lossy(&bytes)),
                _ => return None,
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_still_going_when_the_drain_ends_is_killed_and_reaped_not_orphaned() {
    let mut d = Daemon::start();
    let daemon_pid = d.pid();
    let client = d.client();
    let url = d.url("/v1/processes/run");
    let run = tokio::spawn(async move {
        client
            .post(url)
            .json(&json!({"command": "sleep", "args": ["47"], "timeoutMs": 60000}))
            .send()
            .await
    });
    let sleeper = eventually(Duration::from_secs(10), "the run's process", || {
        children_of(daemon_pid).into_iter().find(|p| {
            std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| c.starts_with("sleep\u{0}47"))
        })
    });
    reload(&mut d);
    // Its request could not finish within the drain: answered with a problem that says the
    // reload cut it (never a 200 with `exitSignal: 9` as if the program had died), and its
    // process is gone for good (killed and reaped before the exec, not left as a child nobody
    // waits for).
    let resp = run
        .await
        .unwrap()
        .expect("the run is answered before the exec");
    assert_eq!(resp.status(), 503);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["title"], "Cut By Reload", "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("reloaded"),
        "{body}"
    );
    assert!(
        !std::path::Path::new(&format!("/proc/{sleeper}")).exists(),
        "the run's process outlived the reload (or is a zombie)"
    );
}

/// With a state dir, an instance carried across a reload keeps writing its serverId's durable
/// state: what its session streams after the reload is on disk, so a restart after the reload
/// still replays it (the new image's instance would otherwise have lost its tracking).
#[tokio::test]
async fn with_a_state_dir_events_after_a_reload_reach_the_disk() {
    use futures_util::StreamExt;
    let state = tempfile::tempdir().unwrap();
    let mut d = Daemon::builder()
        .arg("--state-dir")
        .arg(state.path())
        .args(["--state-sync", "every"])
        .start();
    let session = mock_session(&d, "kept").await;
    let pid = server(&d, "kept").await["pid"].clone();
    assert!(pid.is_u64(), "{pid}");
    reload(&mut d);
    let after = server(&d, "kept").await;
    assert_eq!(after["pid"], pid, "{after}");
    assert_eq!(after["status"], "running", "{after}");
    let (s, body) = post(
        &d,
        "kept",
        json!({"jsonrpc":"2.0","id":3,"method":"session/prompt",
            "params":{"sessionId": session, "prompt":[{"type":"text","text":"/stream 3"}]}}),
    )
    .await;
    assert_eq!(s, 200, "{body}");
    // A graceful stop (as `systemctl restart` does), then the daemon again on the same state dir.
    assert_eq!(
        d.stop(Duration::from_secs(20)),
        0,
        "stderr:\n{}",
        d.stderr()
    );
    let d2 = Daemon::builder()
        .arg("--state-dir")
        .arg(state.path())
        .start();
    let again = server(&d2, "kept").await;
    assert_eq!(again["exitReason"], "daemon_restart", "{again}");
    let resp = d2
        .client()
        .get(d2.url("/v1/acp/kept"))
        .header("accept", "text/event-stream")
        .header("last-event-id", "0")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let mut seen = String::new();
    let found = tokio::time::timeout(Duration::from_secs(15), async {
        while let Some(Ok(chunk)) = stream.next().await {
            seen.push_str(&String::from_utf8_lossy(&chunk));
            if seen.contains("chunk 3 of 3") {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    assert!(
        found,
        "the post-reload events were not replayed from disk:\n{seen}"
    );
}

/// Runs `sandbox-agent reload ARGS…` (what the unit's `ExecReload=` runs) to its end.
async fn reload_command(args: &[&str]) -> (Option<i32>, String) {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(BIN)
            .arg("reload")
            .args(&args)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reload_command_returns_once_the_new_image_serves_and_fails_when_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "event_buffer = 100\n").unwrap();
    let mut d = Daemon::builder().arg("--config").arg(&config).start();
    mock_session(&d, "s1").await;
    let agent_pid = server(&d, "s1").await["pid"].clone();
    let pid = d.pid().to_string();

    // It returns 0 only once the new image serves: its READY=1 was sent before the answer.
    let before = d.messages.len();
    let (code, stderr) = reload_command(&["--pid", &pid]).await;
    assert_eq!(code, Some(0), "{stderr}");
    d.read_notify();
    let new = &d.messages[before..];
    let reloading = new
        .iter()
        .position(|m| m.lines().any(|l| l == "RELOADING=1"))
        .unwrap_or_else(|| panic!("no RELOADING=1 before the command returned: {new:?}"));
    assert!(
        new[reloading..]
            .iter()
            .any(|m| m.lines().any(|l| l == "READY=1") && m.contains("STATUS=listening on")),
        "the command returned before the new image's READY=1: {new:?}"
    );
    assert_eq!(server(&d, "s1").await["pid"], agent_pid);

    // A configuration the new image would refuse: exit 1 with the reason; the daemon serves on.
    std::fs::write(&config, "no_such_setting = 1\n").unwrap();
    let (code, stderr) = reload_command(&["--pid", &pid]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("refused") && stderr.contains("configuration"),
        "{stderr}"
    );
    assert_eq!(server(&d, "s1").await["pid"], agent_pid);
    std::fs::write(&config, "event_buffer = 100\n").unwrap();

    // No such process, and a bad timeout: clear errors (a process that is not our daemon, and
    // forged answers: `reload_pid_refuses_a_process_that_is_not_a_sandbox_agent_daemon`,
    // `a_squatter_cannot_block_a_reload_and_a_child_of_the_daemon_cannot_forge_ready`).
    let (code, stderr) = reload_command(&["--pid", "2147483646"]).await;
    assert_eq!(code, Some(66), "{stderr}");
    let (code, stderr) = reload_command(&["--pid", &pid, "--timeout", "soon"]).await;
    assert_eq!(code, Some(64), "{stderr}");

    // And the daemon still reloads after all of that.
    let (code, stderr) = reload_command(&["--pid", &pid]).await;
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(server(&d, "s1").await["pid"], agent_pid);
}

// ---- RFD connections (`/v1/agents/{agent}/acp`) across a reload ----------------------------

/// The messages of an RFD stream until one satisfies `last` (inclusive), in order.
async fn rfd_until(s: &mut Stream, last: impl Fn(&Value) -> bool) -> Vec<Value> {
    let mut got = Vec::new();
    loop {
        let v = s.next().await.expect("the stream ended");
        let done = last(&v);
        got.push(v);
        if done {
            return got;
        }
    }
}

async fn rfd_send(d: &Daemon, conn: &str, body: Value) -> u16 {
    rfd_post(d, &[("acp-connection-id", conn)], &body.to_string())
        .await
        .status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rfd_connection_goes_on_across_a_reload_with_its_queued_and_pending_messages() {
    let mut d = Daemon::builder().start();
    let conn = rfd_initialize(&d).await;
    let server_id = format!("acp-conn-{conn}");
    let mut main = Stream::open(&d, &conn, None).await.unwrap();
    let new_session = request(
        json!(1),
        "session/new",
        json!({"cwd": "/tmp", "mcpServers": []}),
    );
    assert_eq!(rfd_send(&d, &conn, new_session).await, 202);
    let new = rfd_until(&mut main, |v| v["id"] == 1).await;
    let session = new.last().unwrap()["result"]["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    let agent_pid = server(&d, &server_id).await["pid"].clone();

    // Queued for the session's stream, which no one reads yet: a finished turn...
    let s = rfd_send(&d, &conn, prompt(json!(2), &session, "/stream 3")).await;
    assert_eq!(s, 202);
    eventually_async(Duration::from_secs(10), "the turn to end", || async {
        (server(&d, &server_id).await["pendingRequests"] == 0).then_some(())
    })
    .await;
    // ...and one still running when the reload happens (its answer must reach the session's
    // stream, not the connection's: the route of request 3 is carried).
    let s = rfd_send(&d, &conn, prompt(json!(3), &session, "/sleep 1500")).await;
    assert_eq!(s, 202);
    drop(main);

    reload(&mut d);

    // The same connection and agent, in the new image, with what was queued, in order.
    assert_eq!(server(&d, &server_id).await["pid"], agent_pid);
    let mut sess = Stream::open(&d, &conn, Some(&session)).await.unwrap();
    let got = rfd_until(&mut sess, |v| v["id"] == 3).await;
    let texts: Vec<&str> = got
        .iter()
        .filter_map(|v| v["params"]["update"]["content"]["text"].as_str())
        .collect();
    assert_eq!(texts, ["chunk 1 of 3", "chunk 2 of 3", "chunk 3 of 3"]);
    let answers: Vec<&Value> = got
        .iter()
        .filter(|v| v.get("result").is_some())
        .map(|v| &v["id"])
        .collect();
    assert_eq!(answers, [&json!(2), &json!(3)], "{got:?}");

    // It goes on: a new turn over the same connection, and the connection stream opens again.
    let mut main = Stream::open(&d, &conn, None).await.unwrap();
    let s = rfd_send(&d, &conn, prompt(json!(4), &session, "/stream 1")).await;
    assert_eq!(s, 202);
    let got = rfd_until(&mut sess, |v| v["id"] == 4).await;
    assert_eq!(
        got[0]["params"]["update"]["content"]["text"],
        "chunk 1 of 1"
    );
    // A second reload with the streams open: they end cleanly and the connection stays.
    reload(&mut d);
    assert_eq!(main.next().await, None, "the connection stream ended");
    assert_eq!(server(&d, &server_id).await["pid"], agent_pid);
    let s = rfd_send(&d, &conn, prompt(json!(5), &session, "hello")).await;
    assert_eq!(s, 202);
    let mut sess = Stream::open(&d, &conn, Some(&session)).await.unwrap();
    let got = rfd_until(&mut sess, |v| v["id"] == 5).await;
    assert_eq!(got[0]["params"]["update"]["content"]["text"], "hello");
    // DELETE still ends it: the instance goes away.
    let del = d
        .client()
        .delete(d.url(RFD))
        .header("acp-connection-id", &conn)
        .send()
        .await
        .unwrap();
    assert_eq!(del.status(), 202);
    eventually_async(Duration::from_secs(10), "the instance to go", || async {
        (!d.servers()
            .await
            .iter()
            .any(|s| s["serverId"] == server_id.as_str()))
        .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exited_instance_keeps_its_exit_and_history_across_a_reload() {
    let mut d = Daemon::builder().start();
    let session = mock_session(&d, "gone").await;
    let (s, _) = post(
        &d,
        "gone",
        json!({"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":session,
            "prompt":[{"type":"text","text":"/stream 2"}]}}),
    )
    .await;
    assert_eq!(s, 200);
    let (s, _) = post(
        &d,
        "gone",
        json!({"jsonrpc":"2.0","id":4,"method":"session/prompt","params":{"sessionId":session,
            "prompt":[{"type":"text","text":"/crash 3"}]}}),
    )
    .await;
    assert_eq!(s, 502);
    let before = eventually_async(
        Duration::from_secs(10),
        "the instance to be exited",
        || async {
            let s = server(&d, "gone").await;
            (s["status"] == "exited").then_some(s)
        },
    )
    .await;
    assert_eq!(before["exitCode"], 3);
    let (s, problem_before) = post(
        &d,
        "gone",
        json!({"jsonrpc":"2.0","id":5,"method":"session/new","params":{"cwd":"/tmp","mcpServers":[]}}),
    )
    .await;
    assert_eq!(s, 502);
    let mut sse = read_sse(&d, "gone", Some(0)).await;
    let mut history = Vec::new();
    while let Some(f) = sse.next_frames().await {
        history.extend(f);
    }
    assert!(history.len() >= 2, "{history:?}");

    reload(&mut d);

    // Listed as before, answered as before, its history readable as before.
    let after = server(&d, "gone").await;
    for k in [
        "status",
        "exitCode",
        "signal",
        "exitReason",
        "lastEventId",
        "agent",
        "createdAtMs",
    ] {
        assert_eq!(after[k], before[k], "{k}: {after} vs {before}");
    }
    let (s, problem_after) = post(
        &d,
        "gone",
        json!({"jsonrpc":"2.0","id":6,"method":"session/new","params":{"cwd":"/tmp","mcpServers":[]}}),
    )
    .await;
    assert_eq!(s, 502);
    assert_eq!(problem_after["detail"], problem_before["detail"]);
    let mut sse = read_sse(&d, "gone", Some(0)).await;
    let mut again = Vec::new();
    while let Some(f) = sse.next_frames().await {
        again.extend(f);
    }
    assert_eq!(again, history, "the same history after the reload");
    // DELETE still removes it; the serverId can be used again.
    let del = d
        .client()
        .delete(d.url("/v1/acp/gone"))
        .send()
        .await
        .unwrap();
    assert!(del.status().is_success(), "{}", del.status());
    assert!(!d.servers().await.iter().any(|s| s["serverId"] == "gone"));
    mock_session(&d, "gone").await;
}

// ---- The waiter channel and what a refusal says (no squatting, no forging, no leak) -------

/// A Python 3 interpreter a test can run as another user (not a shim under /root).
fn python3() -> Option<&'static str> {
    ["/usr/bin/python3", "/usr/local/bin/python3"]
        .into_iter()
        .find(|p| Path::new(p).exists())
}

/// Binds the abstract names given and prints every datagram that reaches one (`GOT:…`) until
/// its stdin closes; `bound N` first.
const SQUATTER: &str = r#"
import select, socket, sys
socks = []
for n in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        s.bind("\0" + n)
        socks.append(s)
    except OSError:
        pass
print("bound %d" % len(socks), flush=True)
while True:
    r, _, _ = select.select(socks + [sys.stdin], [], [])
    for s in r:
        if s is sys.stdin:
            if not sys.stdin.readline():
                sys.exit(0)
        else:
            d = s.recv(8192).decode("utf8", "replace").replace("\n", "|")
            print("GOT:" + d, flush=True)
"#;

struct Squatter {
    child: std::process::Child,
}

impl Squatter {
    /// Starts the squatter on `names` (as uid/gid 65534 when `as_nobody`), once it has bound.
    fn start(names: &[String], as_nobody: bool) -> Squatter {
        use std::io::BufRead;
        let py = python3().expect("python3");
        let mut cmd = if as_nobody {
            let mut c = std::process::Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--", py]);
            c
        } else {
            std::process::Command::new(py)
        };
        let mut child = cmd
            .arg("-c")
            .arg(SQUATTER)
            .args(names)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        std::io::BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut first)
            .unwrap();
        // The daemon's own name at least (the shared ones, the test process's pid and 1, may be
        // held by another test's squatter running at the same time).
        let bound: usize = first
            .trim()
            .trim_start_matches("bound ")
            .parse()
            .unwrap_or(0);
        assert!(bound >= 1, "the squatter bound nothing: {first:?}");
        Squatter { child }
    }

    /// Stops it; everything it received.
    fn finish(mut self) -> String {
        drop(self.child.stdin.take());
        let mut out = String::new();
        self.child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        let _ = self.child.wait();
        out
    }
}

/// The names the waiter channel used to answer on: the daemon's pid, its parent's, and 1.
fn old_waiter_names(d: &Daemon) -> Vec<String> {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", d.pid())).unwrap();
    let after_name = &stat[stat.rfind(')').unwrap() + 2..];
    let ppid: u32 = after_name.split(' ').nth(1).unwrap().parse().unwrap();
    [d.pid(), ppid, 1]
        .iter()
        .map(|p| format!("sandbox-agent/reload/{p}"))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_reload_names_the_file_and_line_and_no_other_user_sees_the_config() {
    if !is_root() || python3().is_none() {
        return skip("needs root (to listen as nobody) and python3");
    }
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "event_buffer = 100\n").unwrap();
    let mut d = Daemon::builder().arg("--config").arg(&config).start();
    mock_session(&d, "s1").await;
    let pid = d.pid().to_string();
    // Another user listens where the outcome used to be sent.
    let nobody = Squatter::start(&old_waiter_names(&d), true);

    // A TOML error on the token's line: its value must not come out anywhere.
    const SECRET: &str = "s3cr3t-0f-the-c0nfig";
    std::fs::write(
        &config,
        format!("event_buffer = 100\ntoken = \"{SECRET}\nport = 1\n"),
    )
    .unwrap();
    let before = d.messages.len();
    let (code, stderr) = reload_command(&["--pid", &pid]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("refused"), "{stderr}");
    assert!(
        stderr.contains(&config.display().to_string()) && stderr.contains("line 2"),
        "the refusal names the file and the line: {stderr}"
    );
    assert!(
        !stderr.contains(SECRET),
        "the waiter saw the config: {stderr}"
    );
    d.read_notify();
    let notes = d.messages[before..].join("\n");
    assert!(notes.contains("STATUS=reload failed"), "{notes}");
    assert!(
        !notes.contains(SECRET) && !notes.contains("token ="),
        "STATUS= leaks: {notes}"
    );
    assert!(
        !d.stderr().contains(SECRET),
        "the daemon's log quotes the config"
    );
    let heard = nobody.finish();
    assert!(heard.is_empty(), "another user received: {heard}");
    // Still serving the same agent.
    let (s, _) = post(
        &d,
        "s1",
        json!({"jsonrpc":"2.0","id":9,"method":"session/new","params":{"cwd":"/tmp","mcpServers":[]}}),
    )
    .await;
    assert_eq!(s, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_squatter_cannot_block_a_reload_and_a_child_of_the_daemon_cannot_forge_ready() {
    let Some(py) = python3() else {
        return skip("needs python3");
    };
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "event_buffer = 100\n").unwrap();
    let mut d = Daemon::builder().arg("--config").arg(&config).start();
    mock_session(&d, "s1").await;
    let agent_pid = server(&d, "s1").await["pid"].clone();
    let pid = d.pid().to_string();

    // A squatter bound first on every name the waiter used: the reload still happens.
    let squatter = Squatter::start(&old_waiter_names(&d), false);
    let before = d.messages.len();
    let (code, stderr) = reload_command(&["--pid", &pid]).await;
    assert_eq!(code, Some(0), "a squatter blocked the reload: {stderr}");
    d.read_notify();
    assert!(
        d.messages[before..]
            .iter()
            .any(|m| m.contains("RELOADING=1")),
        "no reload happened"
    );
    assert_eq!(server(&d, "s1").await["pid"], agent_pid);
    assert!(squatter.finish().is_empty());

    // A program the daemon started (through the process API) answers `ready` to every waiter
    // it can see, as fast as it can, while the daemon refuses the reload.
    let forger = format!(
        r#"exec {py} -c '
import socket, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
end = time.time() + 60
while time.time() < end:
    for line in open("/proc/net/unix"):
        p = line.split()
        if len(p) >= 8 and p[-1].startswith("@sandbox-agent/reload/"):
            try:
                s.sendto(b"ready", "\0" + p[-1][1:])
            except OSError:
                pass
    time.sleep(0.002)
'"#
    );
    let forger = create_process(&d, &forger).await;
    let forger_id = forger["id"].as_str().unwrap().to_string();
    std::fs::write(&config, "no_such_setting = 1\n").unwrap();
    let (code, stderr) = reload_command(&["--pid", &pid]).await;
    assert_eq!(code, Some(1), "a forged answer was taken: {stderr}");
    assert!(stderr.contains("refused"), "{stderr}");
    let resp = d
        .client()
        .post(d.url(&format!("/v1/processes/{forger_id}/kill")))
        .send()
        .await
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_pid_refuses_a_process_that_is_not_a_sandbox_agent_daemon() {
    let mut sleeper = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let (code, stderr) = reload_command(&["--pid", &sleeper.id().to_string()]).await;
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert_eq!(code, Some(64), "{stderr}");
    assert!(stderr.contains("is not a sandbox-agent daemon"), "{stderr}");
    // The sleep was not signalled (it would have died of SIGHUP).
    let (code, stderr) = reload_command(&["--pid", "2147483646"]).await;
    assert_eq!(code, Some(66), "{stderr}");
    assert!(stderr.contains("no process"), "{stderr}");

    // On a terminal, success says so.
    let mut d = Daemon::start();
    let pty = nix::pty::openpty(None, None).unwrap();
    let slave = std::fs::File::from(pty.slave);
    let pid = d.pid().to_string();
    let before = d.messages.len();
    let status = tokio::task::spawn_blocking(move || {
        std::process::Command::new(BIN)
            .args(["reload", "--pid", &pid])
            .stdout(slave)
            .status()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(status.success());
    let mut master = std::fs::File::from(pty.master);
    let mut buf = [0u8; 256];
    let n = master.read(&mut buf).unwrap();
    let said = String::from_utf8_lossy(&buf[..n]);
    assert!(said.contains("reloaded"), "{said:?}");
    wait_reloaded(&mut d, before);
}

#[test]
fn a_sighup_in_the_first_millisecond_does_not_kill_the_daemon() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    // The config file is a FIFO: the daemon's start stops in it (reading its configuration,
    // long before it serves) until this test writes it, so the SIGHUP below lands exactly there.
    let fifo = dir.path().join("config.toml");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let mut child = std::process::Command::new(BIN)
        .args(["server", "--host", "127.0.0.1", "--port", "0"])
        .arg("--config")
        .arg(&fifo)
        .arg("--data-dir")
        .arg(dir.path())
        .arg("--work-dir")
        .arg(dir.path())
        .env_remove("NOTIFY_SOCKET")
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Opening the FIFO for writing returns once the daemon has opened it to read its config.
    let mut config = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, Signal::SIGHUP).unwrap();
    config.write_all(b"event_buffer = 100\n").unwrap();
    drop(config);
    // The reload that SIGHUP asks for reads the config again: a plain file from now on.
    let plain = dir.path().join("plain.toml");
    std::fs::write(&plain, "event_buffer = 100\n").unwrap();
    std::fs::rename(&plain, &fifo).unwrap();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut log = String::new();
    let listening = lines.by_ref().map_while(Result::ok).any(|l| {
        log.push_str(&l);
        log.push('\n');
        l.contains("listening on")
    });
    let early = child.try_wait().unwrap();
    let _ = nix::sys::signal::kill(pid, Signal::SIGTERM);
    let status = child.wait().unwrap();
    assert!(
        listening && early.is_none(),
        "the daemon died of an early SIGHUP ({status:?}):\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_started_through_a_symlink_reloads_whatever_the_link_names_now() {
    let dir = tempfile::tempdir().unwrap();
    let (v1, v2, link) = (
        dir.path().join("v1"),
        dir.path().join("v2"),
        dir.path().join("sandbox-agent"),
    );
    std::fs::copy(BIN, &v1).unwrap();
    std::fs::copy(BIN, &v2).unwrap();
    std::os::unix::fs::symlink(&v1, &link).unwrap();
    let mut d = Daemon::builder().binary(&link).start();
    mock_session(&d, "s1").await;
    let agent_pid = server(&d, "s1").await["pid"].clone();
    let exe = |d: &Daemon| std::fs::read_link(format!("/proc/{}/exe", d.pid())).unwrap();
    assert_eq!(exe(&d), v1);
    // The package manager repoints the link; the reload runs what it names now.
    let tmp = dir.path().join("link.new");
    std::os::unix::fs::symlink(&v2, &tmp).unwrap();
    std::fs::rename(&tmp, &link).unwrap();
    reload(&mut d);
    assert_eq!(exe(&d), v2, "the reload executed the old target");
    assert_eq!(server(&d, "s1").await["pid"], agent_pid);
    // And again, through the same path.
    let tmp = dir.path().join("link.new");
    std::os::unix::fs::symlink(&v1, &tmp).unwrap();
    std::fs::rename(&tmp, &link).unwrap();
    reload(&mut d);
    assert_eq!(exe(&d), v1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_pid_from_the_host_reaches_a_daemon_in_a_pid_namespace() {
    let available = is_root()
        && std::process::Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc", "true"])
            .status()
            .is_ok_and(|s| s.success());
    if !available {
        return skip("needs root and unshare --pid");
    }
    let mut d = Daemon::builder()
        .wrapper(["unshare", "--pid", "--fork", "--mount-proc"])
        .expect_exit(None)
        .start();
    let init = eventually(Duration::from_secs(5), "the namespace's PID 1", || {
        children_of(d.pid()).first().copied()
    });
    let daemon = eventually(Duration::from_secs(5), "the daemon under our init", || {
        children_of(init).first().copied()
    });
    mock_session(&d, "s1").await;
    let agent_pid = server(&d, "s1").await["pid"].clone();
    // From the host, by the init's pid and by the daemon's: both wait for the real outcome.
    for target in [init, daemon] {
        let (code, stderr) = reload_command(&["--pid", &target.to_string()]).await;
        assert_eq!(
            code,
            Some(0),
            "reload --pid {target} from the host: {stderr}"
        );
        d.read_notify();
        assert_eq!(children_of(init), vec![daemon], "still the same daemon");
        assert_eq!(server(&d, "s1").await["pid"], agent_pid);
    }
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(init as i32), Signal::SIGTERM).unwrap();
    let mut child = d.child.take().unwrap();
    let status = eventually(Duration::from_secs(15), "the namespace to end", || {
        child.try_wait().unwrap()
    });
    assert_eq!(status.code(), Some(0), "stderr:\n{}", d.stderr());
}

// ---- Memory: the hand-off under a cgroup memory limit ----------------------------------------

/// This process's cgroup v1 memory directory, when it can make groups beneath it.
fn own_memory_cgroup() -> Option<std::path::PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = text.lines().find_map(|l| {
        let mut p = l.splitn(3, ':');
        let (_, c, path) = (p.next()?, p.next()?, p.next()?);
        c.split(',')
            .any(|c| c == "memory")
            .then(|| path.to_string())
    })?;
    let dir = Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'));
    dir.join("memory.limit_in_bytes").exists().then_some(dir)
}

fn cg_read(cg: &Path, file: &str) -> u64 {
    std::fs::read_to_string(cg.join(file))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_memory_limit_a_reload_fits_or_is_refused_never_oom_killed() {
    let Some(parent) = own_memory_cgroup().filter(|_| is_root()) else {
        return skip("needs root and a cgroup v1 memory controller");
    };
    let cg = parent.join(format!("sa-reload-mem-{}", std::process::id()));
    std::fs::create_dir(&cg).unwrap();
    std::fs::write(cg.join("memory.limit_in_bytes"), "2G").unwrap();
    let procs = cg.join("cgroup.procs");
    let mut d = Daemon::builder()
        .wrapper([
            "sh".to_string(),
            "-c".to_string(),
            format!("echo $$ > {} && exec \"$@\"", procs.display()),
            "sh".to_string(),
        ])
        .args(["--event-buffer", "1000000", "--event-buffer-bytes", "256M"])
        .start();
    // 8 agents, each with a few MiB of events in its log.
    let mut last = Vec::new();
    for i in 0..8 {
        let id = format!("m{i}");
        let session = mock_session(&d, &id).await;
        let (s, _) = post(&d, &id, prompt(json!(3), &session, "/stream 20000")).await;
        assert_eq!(s, 200);
        let info = server(&d, &id).await;
        last.push((info["pid"].clone(), info["lastEventId"].clone()));
    }
    let steady = cg_read(&cg, "memory.usage_in_bytes");

    // Twice the steady state: the reload fits, and nothing is OOM-killed.
    std::fs::write(cg.join("memory.limit_in_bytes"), (2 * steady).to_string()).unwrap();
    std::fs::write(cg.join("memory.max_usage_in_bytes"), "0").unwrap();
    reload(&mut d);
    let peak = cg_read(&cg, "memory.max_usage_in_bytes");
    let oom = std::fs::read_to_string(cg.join("memory.oom_control")).unwrap();
    assert!(
        !oom.lines()
            .any(|l| l.starts_with("oom_kill ") && l != "oom_kill 0"),
        "{oom}"
    );
    for (i, (pid, last_id)) in last.iter().enumerate() {
        let info = server(&d, &format!("m{i}")).await;
        assert_eq!((&info["pid"], &info["lastEventId"]), (pid, last_id));
    }
    eprintln!(
        "steady {} MiB, reload peak {} MiB",
        steady >> 20,
        peak >> 20
    );

    // Too little room for the hand-off: refused before anything changed; the daemon serves on.
    let now = cg_read(&cg, "memory.usage_in_bytes");
    std::fs::write(
        cg.join("memory.limit_in_bytes"),
        (now + (24 << 20)).to_string(),
    )
    .unwrap();
    reload_refused(&mut d);
    eventually(Duration::from_secs(5), "the reason in the log", || {
        d.stderr()
            .contains("not enough memory for the hand-off")
            .then_some(())
    });
    for (i, (pid, _)) in last.iter().enumerate() {
        assert_eq!(&server(&d, &format!("m{i}")).await["pid"], pid);
    }
    std::fs::write(cg.join("memory.limit_in_bytes"), "2G").unwrap();
    drop(d);
    eventually(Duration::from_secs(10), "the test cgroup removed", || {
        std::fs::remove_dir(&cg).ok()
    });
}

// ---- Transfers cut by a reload or a stop -----------------------------------------------------

/// Names in `dir` that are a transfer's temporaries.
fn temporaries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            n.starts_with(".sandbox-agent-write-") || n.starts_with(".sandbox-agent-upload-")
        })
        .collect()
}

/// Starts a PUT to `route` whose body sends 1 MiB and then never ends (the task holds it).
fn stalled_upload(d: &Daemon, route: &str) -> tokio::task::JoinHandle<()> {
    let client = d.client();
    let url = d.url(route);
    tokio::spawn(async move {
        let data = vec![b'x'; 1 << 20];
        let first =
            futures_util::stream::iter(vec![Ok::<_, std::io::Error>(bytes::Bytes::from(data))]);
        let stalled = futures_util::StreamExt::chain(first, futures_util::stream::pending());
        let _ = client
            .put(url)
            .header("content-type", "application/octet-stream")
            .body(reqwest::Body::wrap_stream(stalled))
            .send()
            .await;
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_cut_by_a_reload_or_a_stop_leave_no_temporaries() {
    let work = tempfile::tempdir().unwrap();
    let mut d = Daemon::builder().work_dir(work.path()).start();
    let put = stalled_upload(&d, "/v1/fs/file?path=cut.bin");
    eventually(Duration::from_secs(10), "the temporary", || {
        (temporaries(work.path()).len() == 1).then_some(())
    });
    reload(&mut d);
    assert_eq!(
        temporaries(work.path()),
        Vec::<String>::new(),
        "left by the reload"
    );
    put.abort();

    let put = stalled_upload(&d, "/v1/fs/file?path=cut2.bin");
    eventually(Duration::from_secs(10), "the temporary", || {
        (temporaries(work.path()).len() == 1).then_some(())
    });
    drop(d); // SIGTERM, and a clean exit
    assert_eq!(
        temporaries(work.path()),
        Vec::<String>::new(),
        "left by the stop"
    );
    put.abort();
}

/// Starts an upload-batch into `dest` whose tar body holds one whole entry and then never ends:
/// the upload's staging directory exists from its first whole entry on.
fn stalled_upload_batch(d: &Daemon, dest: &str) -> tokio::task::JoinHandle<()> {
    let client = d.client();
    let url = d.url(&format!("/v1/fs/upload-batch?path={dest}"));
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    let data = vec![b'y'; 64 << 10];
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    b.append_data(&mut h, "first.txt", &data[..]).unwrap();
    // The entry without the archive's end: more is always to come.
    let head = bytes::Bytes::from(b.get_ref().clone());
    tokio::spawn(async move {
        let first = futures_util::stream::iter(vec![Ok::<_, std::io::Error>(head)]);
        let stalled = futures_util::StreamExt::chain(first, futures_util::stream::pending());
        let _ = client
            .post(url)
            .header("content-type", "application/x-tar")
            .body(reqwest::Body::wrap_stream(stalled))
            .send()
            .await;
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_batch_cut_by_a_reload_leaves_no_staging_directory() {
    let work = tempfile::tempdir().unwrap();
    std::fs::create_dir(work.path().join("dest")).unwrap();
    let mut d = Daemon::builder().work_dir(work.path()).start();
    let up = stalled_upload_batch(&d, "dest");
    eventually(Duration::from_secs(10), "the staging directory", || {
        (temporaries(&work.path().join("dest")).len() == 1).then_some(())
    });
    reload(&mut d);
    assert_eq!(
        temporaries(&work.path().join("dest")),
        Vec::<String>::new(),
        "left by the reload"
    );
    // Nothing of the cut upload reached the destination either.
    assert!(!work.path().join("dest/first.txt").exists());
    up.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn temporaries_a_crash_left_are_removed_at_the_next_start_and_nothing_else() {
    let work = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    std::fs::create_dir(work.path().join("dest")).unwrap();
    // A user's files that only look like temporaries: never ours, never removed.
    let lookalike = work.path().join(".sandbox-agent-write-0123456789ab");
    std::fs::write(&lookalike, b"the user's").unwrap();
    let d = Daemon::builder()
        .work_dir(work.path())
        .data_dir(data.path())
        .start();
    let put = stalled_upload(&d, "/v1/fs/file?path=cut.bin");
    let batch = stalled_upload_batch(&d, "dest");
    eventually(Duration::from_secs(10), "both temporaries", || {
        (temporaries(work.path()).len() == 2 && temporaries(&work.path().join("dest")).len() == 1)
            .then_some(())
    });
    let left: Vec<String> = temporaries(work.path());
    d.signal(Signal::SIGKILL);
    let mut d = d;
    d.wait_exit(Duration::from_secs(10), "SIGKILL");
    put.abort();
    batch.abort();
    // The crash ran no destructor: the temporaries are still there.
    assert_eq!(temporaries(work.path()).len(), 2, "{left:?}");
    assert_eq!(temporaries(&work.path().join("dest")).len(), 1);

    let d = Daemon::builder()
        .work_dir(work.path())
        .data_dir(data.path())
        .start();
    assert_eq!(
        temporaries(work.path()),
        vec![".sandbox-agent-write-0123456789ab".to_string()],
        "only the user's look-alike is left"
    );
    assert_eq!(temporaries(&work.path().join("dest")), Vec::<String>::new());
    assert_eq!(std::fs::read(&lookalike).unwrap(), b"the user's");
    assert!(
        d.stderr()
            .contains("removed the temporaries of transfers a crashed run left"),
        "{}",
        d.stderr()
    );
    // The dead run's journal is gone; this run's is held.
    let journals: Vec<_> = std::fs::read_dir(data.path().join("temporaries"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(journals.len(), 1, "{journals:?}");
    assert!(
        journals[0].starts_with(&format!("{}-", d.pid())),
        "{journals:?}"
    );
}

/// The process hand-off waits for every output pump to stop before it takes the log: a pump
/// caught between a read and its append (the debug hook holds it there 300 ms) appends first,
/// so the bytes it took from the pipe are carried, not lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pump_caught_between_a_read_and_its_append_loses_nothing_across_a_reload() {
    let mut d = Daemon::builder()
        .env("SANDBOX_AGENT_TEST_PUMP_DELAY_MS", "300")
        .start();
    let proc = create_process(&d, COUNTER).await;
    let id = proc["id"].as_str().unwrap().to_string();
    for round in 0..3 {
        eventually_async(Duration::from_secs(10), "output", || async {
            (d.get_json(&format!("/v1/processes/{id}")).await["logEnd"].as_u64()?
                > 20 * (round + 1))
                .then_some(())
        })
        .await;
        reload(&mut d);
    }
    let before = counted(&process_log(&d, &id).await.0);
    eventually_async(
        Duration::from_secs(20),
        "output after the reloads",
        || async { (counted(&process_log(&d, &id).await.0) > before + 20).then_some(()) },
    )
    .await;
}

/// An agent the new image fails to take over is killed (before or after the supervisor adopted
/// it), never left running with no owner; the others are carried. The agent is one that outlives
/// its stdin (a mock followed by a long sleep in the same process), so only the kill ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_whose_adoption_fails_is_killed_not_orphaned() {
    let tmp = tempfile::tempdir().unwrap();
    let agents = tmp.path().join("agents.toml");
    std::fs::write(
        &agents,
        format!(
            "[[agent]]\nid = \"stubborn\"\ncommand = \"/bin/sh\"\n\
             args = [\"-c\", \"\\\"$0\\\" mock-agent; exec sleep 600\", \"{BIN}\"]\n"
        ),
    )
    .unwrap();
    for hook in ["lost", "lost:late"] {
        let mut d = Daemon::builder()
            .env("SANDBOX_AGENT_TEST_FAIL_ADOPTION", hook)
            .arg("--agents-file")
            .arg(&agents)
            .start();
        mock_session(&d, "kept").await;
        let r = d
            .client()
            .post(d.url("/v1/acp/lost?agent=stubborn"))
            .json(&json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let kept = server(&d, "kept").await["pid"].as_u64().unwrap() as u32;
        let lost = server(&d, "lost").await["pid"].as_u64().unwrap() as u32;
        reload(&mut d);
        eventually(Duration::from_secs(10), "the unadopted agent gone", || {
            (!crate::support::pid_alive(lost)).then_some(())
        });
        assert_eq!(
            server(&d, "kept").await["pid"].as_u64(),
            Some(kept as u64),
            "{hook}"
        );
        assert!(crate::support::pid_alive(kept), "{hook}");
        assert!(
            d.stderr()
                .contains("cannot take over an agent after the reload"),
            "{hook}: {}",
            d.stderr()
        );
    }
}
