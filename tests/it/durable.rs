//! Durable state (`--state-dir`): the daemon killed outright (in a PID namespace, so its agents
//! die with it) and started again on the same state dir lists its serverIds as
//! `daemon_restart`, replays their events with their ids, resumes `Last-Event-ID` across the
//! restart, and restores the mock agent's sessions with `session/load` on the next POST.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{Daemon, children_of, eventually, is_root, skip};

const SECS10: Duration = Duration::from_secs(10);

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

/// POSTs one message; (status, body as JSON).
pub(crate) async fn post(d: &Daemon, path: &str, msg: &Value) -> (u16, Value) {
    let resp = d
        .client()
        .post(d.url(path))
        .header("content-type", "application/json")
        .body(msg.to_string())
        .send()
        .await
        .expect("POST");
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// `initialize` + `session/new` on the mock agent; the session id.
async fn start_session(d: &Daemon, server_id: &str, agent: &str) -> String {
    let (s, b) = post(
        d,
        &format!("/v1/acp/{server_id}?agent={agent}"),
        &request(
            json!(0),
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": {}}),
        ),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let (s, b) = post(
        d,
        &format!("/v1/acp/{server_id}"),
        &request(
            json!(1),
            "session/new",
            json!({"cwd": "/", "mcpServers": []}),
        ),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    b["result"]["sessionId"].as_str().unwrap().to_string()
}

#[derive(Debug, Clone)]
pub(crate) struct Event {
    pub(crate) kind: String,
    pub(crate) id: Option<u64>,
    pub(crate) data: Value,
}

/// An SSE reader of `GET /v1/acp/{serverId}`.
pub(crate) struct Sse {
    resp: reqwest::Response,
    raw: String,
}

impl Sse {
    pub(crate) async fn open(d: &Daemon, server_id: &str, last: Option<u64>) -> Sse {
        let mut req = d
            .client()
            .get(d.url(&format!("/v1/acp/{server_id}")))
            .header("accept", "text/event-stream");
        if let Some(l) = last {
            req = req.header("last-event-id", l.to_string());
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), 200);
        Sse {
            resp,
            raw: String::new(),
        }
    }

    fn events(&self) -> Vec<Event> {
        let complete = match self.raw.rfind("\n\n") {
            Some(i) => &self.raw[..i + 2],
            None => "",
        };
        complete
            .split("\n\n")
            .filter(|b| !b.is_empty() && !b.starts_with(':'))
            .map(|block| {
                let mut ev = Event {
                    kind: String::new(),
                    id: None,
                    data: Value::Null,
                };
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event: ") {
                        ev.kind = v.to_string();
                    } else if let Some(v) = line.strip_prefix("id: ") {
                        ev.id = Some(v.parse().unwrap());
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        ev.data = serde_json::from_str(v).unwrap();
                    }
                }
                ev
            })
            .collect()
    }

    /// Reads until `done` holds for the events so far (panics after `timeout`).
    pub(crate) async fn until(
        &mut self,
        timeout: Duration,
        done: impl Fn(&[Event]) -> bool,
    ) -> Vec<Event> {
        let deadline = Instant::now() + timeout;
        loop {
            let evs = self.events();
            if done(&evs) {
                return evs;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.resp.chunk()).await {
                Ok(Ok(Some(b))) => self.raw.push_str(std::str::from_utf8(&b).unwrap()),
                other => panic!(
                    "stream ended or timed out ({}): {}",
                    other.is_ok(),
                    self.raw
                ),
            }
        }
    }
}

pub(crate) fn chunk_text(ev: &Event) -> &str {
    ev.data["params"]["update"]["content"]["text"]
        .as_str()
        .unwrap_or("")
}

pub(crate) fn unshare_available() -> bool {
    is_root()
        && Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc", "true"])
            .status()
            .is_ok_and(|s| s.success())
}

/// Host pid of the process that is PID 1 inside the namespace `unshare --fork` made.
fn namespace_init(unshare_pid: u32) -> u32 {
    eventually(Duration::from_secs(5), "the namespace's PID 1", || {
        children_of(unshare_pid).first().copied()
    })
}

/// Kills the whole PID namespace of `d` at once (SIGKILL to its PID 1: the kernel kills every
/// process in it, the agents included), as a crash or a power cut would.
pub(crate) fn crash(d: &mut Daemon) {
    let init = namespace_init(d.pid());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(init as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let mut child = d.child.take().unwrap();
    eventually(SECS10, "the namespace to end", || child.try_wait().unwrap());
}

pub(crate) fn state_args(state: &Path) -> Vec<String> {
    vec![
        "--state-dir".into(),
        state.display().to_string(),
        "--state-sync".into(),
        "every".into(),
    ]
}

pub(crate) async fn server(d: &Daemon, id: &str) -> Value {
    d.servers()
        .await
        .into_iter()
        .find(|s| s["serverId"] == id)
        .unwrap_or_else(|| panic!("{id} is not listed"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_stream_then_restart_replays_resumes_and_restores_the_session() {
    if !unshare_available() {
        return skip("needs root and unshare --pid to crash the daemon with its agents");
    }
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let work = tmp.path().join("work");
    let mut a = Daemon::builder()
        .wrapper(["unshare", "--pid", "--fork", "--mount-proc"])
        .work_dir(&work)
        .args(state_args(&state))
        .expect_exit(None)
        .start();
    assert_eq!(a.get_json("/v1/health").await["durable"], true);
    let session = start_session(&a, "s1", "mock").await;
    let mut sse = Sse::open(&a, "s1", None).await;
    let (s, b) = post(&a, "/v1/acp/s1", &prompt(json!(2), &session, "/stream 40")).await;
    assert_eq!(s, 200, "{b}");
    // Mid-stream: a turn that is still running when the daemon dies.
    let client = a.client();
    let url = a.url("/v1/acp/s1");
    let hanging = tokio::spawn(async move {
        let _ = client
            .post(url)
            .header("content-type", "application/json")
            .body(prompt(json!(3), "mock-1", "/hang").to_string())
            .send()
            .await;
    });
    let before = sse
        .until(SECS10, |e| {
            e.iter()
                .filter(|e| chunk_text(e).starts_with("chunk "))
                .count()
                == 40
        })
        .await;
    let last = before.last().unwrap().id.unwrap();
    let ids: Vec<u64> = before.iter().filter_map(|e| e.id).collect();
    crash(&mut a);
    hanging.abort();
    drop(sse);

    let b = Daemon::builder()
        .work_dir(&work)
        .args(state_args(&state))
        .start();
    // Listed, exited for the restart, with its last id.
    let row = server(&b, "s1").await;
    assert_eq!(row["status"], "exited", "{row}");
    assert_eq!(row["exitReason"], "daemon_restart", "{row}");
    assert_eq!(row["agent"], "mock");
    assert!(row["lastEventId"].as_u64().unwrap() >= last, "{row}");

    // The whole retained log replays with its original ids.
    let mut all = Sse::open(&b, "s1", None).await;
    let replay = all.until(SECS10, |e| e.len() >= ids.len()).await;
    let replay_ids: Vec<u64> = replay.iter().filter_map(|e| e.id).collect();
    assert_eq!(&replay_ids[..ids.len()], &ids[..], "replayed ids");
    assert_eq!(
        replay[..ids.len()]
            .iter()
            .map(|e| e.data.clone())
            .collect::<Vec<_>>(),
        before.iter().map(|e| e.data.clone()).collect::<Vec<_>>()
    );

    // Last-Event-ID resumes across the restart without a gap.
    let from = ids[ids.len() - 10];
    let mut resumed = Sse::open(&b, "s1", Some(from)).await;
    let r = resumed.until(SECS10, |e| e.len() >= 9).await;
    assert!(r.iter().all(|e| e.kind == "message"), "no gap: {r:?}");
    assert_eq!(
        r.iter().filter_map(|e| e.id).collect::<Vec<_>>(),
        ids[ids.len() - 9..].to_vec()
    );

    // A prompt on the old session id works: the agent is started again and loads the session.
    let (s, body) = post(&b, "/v1/acp/s1", &prompt(json!(4), &session, "/history")).await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["result"]["stopReason"], "end_turn");
    let after = resumed
        .until(SECS10, |e| {
            e.iter().any(|e| chunk_text(e).starts_with("history:"))
        })
        .await;
    let restored = after
        .iter()
        .find(|e| e.data["method"] == "_sandboxagent/restored")
        .expect("a restored notification");
    assert_eq!(
        restored.data["params"]["sessions"],
        json!([{"sessionId": session, "how": "session/load"}]),
        "{:?}",
        restored.data
    );
    let history = after
        .iter()
        .find(|e| chunk_text(e).starts_with("history:"))
        .unwrap();
    assert_eq!(chunk_text(history), "history: /stream 40");
    // The agent's replay of the session while it loaded was not added to the stream.
    assert!(
        !after
            .iter()
            .any(|e| e.data["params"]["update"]["sessionUpdate"] == "user_message_chunk"),
        "{after:?}"
    );
    // New events continue the numbering: strictly increasing, none reused.
    let new_ids: Vec<u64> = after.iter().filter_map(|e| e.id).collect();
    assert!(new_ids.windows(2).all(|w| w[0] < w[1]), "{new_ids:?}");
    assert!(new_ids.iter().filter(|i| **i > last).count() >= 2);
    let row = server(&b, "s1").await;
    assert_eq!(row["status"], "running", "{row}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_cut_at_a_random_byte_is_recovered_up_to_the_cut() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let work = tmp.path().join("work");
    let mut a = Daemon::builder()
        .work_dir(&work)
        .args(state_args(&state))
        .start();
    let session = start_session(&a, "cut", "mock").await;
    let (s, _) = post(&a, "/v1/acp/cut", &prompt(json!(2), &session, "/stream 30")).await;
    assert_eq!(s, 200);
    let last = server(&a, "cut").await["lastEventId"].as_u64().unwrap();
    assert!(last >= 30);
    // A graceful stop keeps the state (and writes everything out).
    assert_eq!(a.stop(SECS10), 0);
    let log: PathBuf = state.join("acp/cut/events.log");
    let bytes = std::fs::read(&log).unwrap();
    // Anywhere past the first record's header, never at its end: a partial record.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as usize;
    let mut cut = 20 + nanos % (bytes.len() - 21);
    // Never on a record boundary (a record: 16 bytes of header, then its length), so that the
    // tail really is a partial record.
    let mut at = 0;
    while at < bytes.len() {
        if at == cut {
            cut += 1;
        }
        at += 16 + u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    }
    std::fs::write(&log, &bytes[..cut]).unwrap();

    let b = Daemon::builder()
        .work_dir(&work)
        .args(state_args(&state))
        .start();
    let row = server(&b, "cut").await;
    assert_eq!(row["exitReason"], "daemon_restart");
    let kept = row["lastEventId"].as_u64().unwrap();
    let mut sse = Sse::open(&b, "cut", None).await;
    let evs = sse
        .until(SECS10, |e| e.last().and_then(|e| e.id) >= Some(1))
        .await;
    // The events before the cut, 1.. in order, none after it.
    let ids: Vec<u64> = evs.iter().filter_map(|e| e.id).collect();
    assert_eq!(ids, (1..=ids.len() as u64).collect::<Vec<_>>());
    assert!((ids.len() as u64) < last, "cut at {cut} of {}", bytes.len());
    // Listed: the last event that exists, not an id the restart skipped.
    assert_eq!(kept, *ids.last().unwrap(), "lastEventId is a real event");
    assert!(b.stderr().contains("cut a corrupt or truncated tail"));
    assert!(std::fs::metadata(&log).unwrap().len() < cut as u64 + 1);
    // New events are numbered past every id issued before the restart.
    let (s, body) = post(&b, "/v1/acp/cut", &prompt(json!(9), &session, "after")).await;
    assert_eq!(s, 200, "{body}");
    let now = server(&b, "cut").await["lastEventId"].as_u64().unwrap();
    assert!(
        now > last,
        "numbering continues beyond every id issued before"
    );
}

/// An agent that cannot load sessions: a POST naming an old session gets a 409 that says which
/// capability is missing, at once (no hang), and a new session works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_load_session_an_old_session_gets_a_clear_409() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let work = tmp.path().join("work");
    let agents = tmp.path().join("agents.toml");
    std::fs::write(
        &agents,
        format!(
            "[[agent]]\nid = \"noload\"\ncommand = \"{}\"\nargs = [\"mock-agent\", \"--no-load-session\"]\n",
            env!("CARGO_BIN_EXE_sandbox-agent")
        ),
    )
    .unwrap();
    let args = |b: crate::support::DaemonBuilder| {
        b.work_dir(&work)
            .args(state_args(&state))
            .arg("--agents-file")
            .arg(&agents)
    };
    let mut a = args(Daemon::builder()).start();
    let session = start_session(&a, "nl", "noload").await;
    assert_eq!(a.stop(SECS10), 0);

    let b = args(Daemon::builder()).start();
    let mut sse = Sse::open(&b, "nl", None).await;
    let started = Instant::now();
    let (s, body) = post(&b, "/v1/acp/nl", &prompt(json!(5), &session, "hello")).await;
    assert_eq!(s, 409, "{body}");
    assert_eq!(body["missingCapability"], "loadSession", "{body}");
    assert_eq!(body["sessionId"], session.as_str());
    assert!(body["detail"].as_str().unwrap().contains("loadSession"));
    assert!(started.elapsed() < SECS10);
    let evs = sse
        .until(SECS10, |e| {
            e.iter()
                .any(|e| e.data["method"] == "_sandboxagent/restored")
        })
        .await;
    let note = evs
        .iter()
        .find(|e| e.data["method"] == "_sandboxagent/restored")
        .unwrap();
    assert_eq!(note.data["params"]["missingCapability"], "loadSession");
    assert_eq!(
        note.data["params"]["failed"][0]["sessionId"],
        session.as_str()
    );
    // Other requests go through to the restarted agent.
    let (s, body) = post(
        &b,
        "/v1/acp/nl",
        &request(
            json!(6),
            "session/new",
            json!({"cwd": "/", "mcpServers": []}),
        ),
    )
    .await;
    assert_eq!(s, 200, "{body}");
}

/// Without `--state-dir` nothing is durable; a deleted serverId's state is gone after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_says_whether_state_is_durable_and_delete_forgets() {
    let d = Daemon::start();
    assert_eq!(d.get_json("/v1/health").await["durable"], false);
    drop(d);

    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let mut a = Daemon::builder().args(state_args(&state)).start();
    start_session(&a, "keep", "mock").await;
    start_session(&a, "gone", "mock").await;
    let resp = a
        .client()
        .delete(a.url("/v1/acp/gone"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
    assert_eq!(a.stop(SECS10), 0);
    let b = Daemon::builder().args(state_args(&state)).start();
    let ids: Vec<String> = b
        .servers()
        .await
        .iter()
        .map(|s| s["serverId"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, vec!["keep".to_string()]);
    let health = b.get_json("/v1/health").await;
    assert_eq!(health["durable"], true, "{health}");
    assert_eq!(health["state"]["path"], state.display().to_string());
}

/// A state dir on a full disk (a 256 KiB tmpfs): the daemon goes on in memory, says so in a WARN
/// and in `/v1/health`, and the stream keeps every event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_degrades_to_memory_only_with_a_warning() {
    if !is_root() {
        return skip("needs root to mount a small tmpfs as a full disk");
    }
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let script = format!(
        "mount -t tmpfs -o size=256k tmpfs {} && exec \"$@\"",
        state.display()
    );
    let d = Daemon::builder()
        .wrapper(["unshare", "-m", "sh", "-c", &script, "sh"])
        .args(state_args(&state))
        .start();
    assert_eq!(d.get_json("/v1/health").await["durable"], true);
    let session = start_session(&d, "full", "mock").await;
    let mut sse = Sse::open(&d, "full", None).await;
    // About 600 KiB of events: more than the disk holds.
    let (s, _) = post(
        &d,
        "/v1/acp/full",
        &prompt(json!(2), &session, "/stream 6000"),
    )
    .await;
    assert_eq!(s, 200);
    let evs = sse
        .until(Duration::from_secs(30), |e| {
            e.iter().any(|e| chunk_text(e) == "chunk 6000 of 6000")
        })
        .await;
    assert_eq!(evs.iter().filter(|e| e.kind == "gap").count(), 0);
    let health = crate::support::eventually_async(SECS10, "durable: false", || async {
        let h = d.get_json("/v1/health").await;
        (h["durable"] == false).then_some(h)
    })
    .await;
    assert!(
        health["state"]["problem"]
            .as_str()
            .is_some_and(|p| p.contains("No space left")),
        "{health}"
    );
    assert!(d.stderr().contains("kept in memory only"), "{}", d.stderr());
    // The API goes on.
    let (s, _) = post(
        &d,
        "/v1/acp/full",
        &prompt(json!(3), &session, "still here"),
    )
    .await;
    assert_eq!(s, 200);
}

async fn get(d: &Daemon, path: &str) -> Value {
    d.get_json(path).await
}

fn log_text(logs: &Value) -> String {
    use base64::Engine;
    let mut out = Vec::new();
    for e in logs["entries"].as_array().expect("entries") {
        out.extend(
            base64::engine::general_purpose::STANDARD
                .decode(e["data"].as_str().unwrap())
                .unwrap(),
        );
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Processes survive a crash as records: the one that had ended keeps its exit, the one that
/// still ran is `daemon_restart`; both keep their output; none is restarted; ids are not reused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_are_listed_after_a_crash_with_their_output() {
    if !unshare_available() {
        return skip("needs root and unshare --pid to crash the daemon with its processes");
    }
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let mut a = Daemon::builder()
        .wrapper(["unshare", "--pid", "--fork", "--mount-proc"])
        .args(state_args(&state))
        .expect_exit(None)
        .start();
    let (s, done) = post(
        &a,
        "/v1/processes",
        &json!({"command": "sh", "args": ["-c", "echo done-a; exit 3"]}),
    )
    .await;
    assert_eq!(s, 200, "{done}");
    let (s, running) = post(
        &a,
        "/v1/processes",
        &json!({"command": "sh", "args": ["-c", "echo started-b; exec sleep 1000"]}),
    )
    .await;
    assert_eq!(s, 200, "{running}");
    let (done, running) = (
        done["id"].as_str().unwrap().to_string(),
        running["id"].as_str().unwrap().to_string(),
    );
    crate::support::eventually_async(SECS10, "the first to exit, the second to print", || {
        let (a, done, running) = (&a, &done, &running);
        async move {
            let d = get(a, &format!("/v1/processes/{done}")).await;
            let r = get(a, &format!("/v1/processes/{running}/logs")).await;
            (d["status"] == "exited" && log_text(&r).contains("started-b")).then_some(())
        }
    })
    .await;
    // The writer syncs every batch (`every`): the output is on disk once it was logged.
    crash(&mut a);

    let b = Daemon::builder().args(state_args(&state)).start();
    let d = get(&b, &format!("/v1/processes/{done}")).await;
    assert_eq!(d["status"], "exited", "{d}");
    assert_eq!(d["exitReason"], "exited", "{d}");
    assert_eq!(d["exitCode"], 3, "{d}");
    let logs = get(&b, &format!("/v1/processes/{done}/logs")).await;
    assert_eq!(log_text(&logs), "done-a\n");
    let r = get(&b, &format!("/v1/processes/{running}")).await;
    assert_eq!(r["status"], "exited", "{r}");
    assert_eq!(r["exitReason"], "daemon_restart", "{r}");
    assert!(r.get("pid").is_none(), "{r}");
    let logs = get(&b, &format!("/v1/processes/{running}/logs")).await;
    assert_eq!(log_text(&logs), "started-b\n");
    // Not restarted, and a stop of it is an answer, not a hang.
    let (s, _) = post(&b, &format!("/v1/processes/{running}/stop"), &json!({})).await;
    assert!(s == 200 || s == 409, "{s}");
    let (s, fresh) = post(&b, "/v1/processes", &json!({"command": "true"})).await;
    assert_eq!(s, 200);
    assert_ne!(fresh["id"], done.as_str());
    assert_ne!(fresh["id"], running.as_str());
    // Deleting a recovered record removes it for good.
    let resp = b
        .client()
        .delete(b.url(&format!("/v1/processes/{done}")))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 204);
}

/// An empty `SANDBOX_AGENT_STATE_DIR` (how an operator turns off the packaged unit's state dir)
/// is "off"; a bad `--state-sync` is a configuration error (78) that names the flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_flags_empty_dir_is_off_and_a_bad_policy_is_refused() {
    let d = Daemon::builder().env("SANDBOX_AGENT_STATE_DIR", "").start();
    assert_eq!(d.get_json("/v1/health").await["durable"], false);
    let out = Command::new(env!("CARGO_BIN_EXE_sandbox-agent"))
        .args(["server", "--port", "0", "--state-sync", "sometimes"])
        .env_remove("NOTIFY_SOCKET")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--state-sync") && err.contains("sometimes"),
        "{err}"
    );
}

/// Runs `sandbox-agent server` with `args` outside the harness: its exit code (`None` if it
/// still ran after 10 s, then it is killed) and its stderr.
fn run_server(args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_sandbox-agent"))
        .arg("server")
        .args(["--port", "0"])
        .args(args)
        .env_remove("NOTIFY_SOCKET")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + SECS10;
    let code = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    use std::io::Read;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    (code, err)
}

/// The state dir is one daemon's: a second daemon on it refuses to start (75, naming the
/// holder); a dir that is not a state dir (a project tree, a symlinked `acp/`) is refused (78)
/// and left exactly as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_state_dir_one_daemon_and_nothing_that_is_not_ours() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let data = tmp.path().join("data2");
    let data_s = data.display().to_string();
    let mut a = Daemon::builder().args(state_args(&state)).start();
    start_session(&a, "held", "mock").await;
    let (code, err) = run_server(&[
        "--data-dir",
        &data_s,
        "--state-dir",
        &state.display().to_string(),
    ]);
    assert_eq!(code, Some(75), "{err}");
    assert!(err.contains("in use by another sandbox-agent"), "{err}");
    assert!(err.contains(&format!("pid {}", a.pid())), "{err}");
    // The first one was not disturbed.
    assert_eq!(server(&a, "held").await["status"], "running");
    assert_eq!(a.stop(SECS10), 0);

    // A project tree: refused, nothing in it touched, nothing added.
    let project = tmp.path().join("project");
    let src = project.join("processes/billing/src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("main.py"), b"print('billing')\n").unwrap();
    let (code, err) = run_server(&[
        "--data-dir",
        &data_s,
        "--state-dir",
        &project.display().to_string(),
    ]);
    assert_eq!(code, Some(78), "{err}");
    assert!(err.contains("refusing"), "{err}");
    assert_eq!(
        std::fs::read(src.join("main.py")).unwrap(),
        b"print('billing')\n"
    );
    let names: Vec<String> = std::fs::read_dir(&project)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["processes".to_string()]);

    // Our own dir whose `acp/` was replaced by a symlink: refused, the tree behind it intact.
    let victim = tmp.path().join("victim");
    std::fs::create_dir_all(victim.join("x")).unwrap();
    std::fs::write(victim.join("x/keep.txt"), b"keep").unwrap();
    let moved = tmp.path().join("acp-old");
    std::fs::rename(state.join("acp"), &moved).unwrap();
    std::os::unix::fs::symlink(&victim, state.join("acp")).unwrap();
    let (code, err) = run_server(&[
        "--data-dir",
        &data_s,
        "--state-dir",
        &state.display().to_string(),
    ]);
    assert_eq!(code, Some(78), "{err}");
    assert!(err.contains("not a directory"), "{err}");
    assert_eq!(std::fs::read(victim.join("x/keep.txt")).unwrap(), b"keep");
    // An entry that does not read back is moved aside, not deleted.
    std::fs::remove_file(state.join("acp")).unwrap();
    std::fs::rename(&moved, state.join("acp")).unwrap();
    std::fs::create_dir_all(state.join("acp/junk")).unwrap();
    std::fs::write(state.join("acp/junk/notes.txt"), b"mine").unwrap();
    let b = Daemon::builder().args(state_args(&state)).start();
    assert_eq!(server(&b, "held").await["status"], "exited");
    let q: Vec<PathBuf> = std::fs::read_dir(state.join("quarantine"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(q.len(), 1, "{q:?}");
    assert_eq!(std::fs::read(q[0].join("notes.txt")).unwrap(), b"mine");
    assert!(b.stderr().contains("moved an unreadable state entry aside"));
}

/// Every file of the state dir is 0600 and every directory 0700 even under umask 000, so the
/// user `nobody` reads nothing of it; the MCP credentials a client passed (`env`, `headers`) are
/// nowhere on disk in clear, and still reach the agent's `session/load` after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_is_private_and_mcp_credentials_are_sealed() {
    use std::os::unix::fs::PermissionsExt;
    if !is_root() || Command::new("setpriv").arg("--version").output().is_err() {
        return skip("needs root and setpriv to read the state dir as nobody");
    }
    let tmp = tempfile::tempdir().unwrap();
    // Only the state dir's own modes may keep `nobody` out.
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let state = tmp.path().join("state");
    let data = tmp.path().join("data");
    let work = tmp.path().join("work");
    let build = |b: crate::support::DaemonBuilder| {
        b.wrapper(["sh", "-c", "umask 000; exec \"$@\"", "sh"])
            .data_dir(&data)
            .work_dir(&work)
            .args(state_args(&state))
    };
    let mut a = build(Daemon::builder()).start();
    let (s, b) = post(
        &a,
        "/v1/acp/sec?agent=mock",
        &request(
            json!(0),
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": {}}),
        ),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let servers = json!([
        {"name": "gh", "command": "/bin/true", "args": [],
         "env": [{"name": "GITHUB_TOKEN", "value": "ghp_SEKRET1"}]},
        {"type": "http", "name": "web", "url": "http://127.0.0.1:9/",
         "headers": [{"name": "Authorization", "value": "Bearer SEKRET2"}]}
    ]);
    let (s, b) = post(
        &a,
        "/v1/acp/sec",
        &request(
            json!(1),
            "session/new",
            json!({"cwd": "/", "mcpServers": servers}),
        ),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let session = b["result"]["sessionId"].as_str().unwrap().to_string();
    let (s, _) = post(&a, "/v1/acp/sec", &prompt(json!(2), &session, "/stream 3")).await;
    assert_eq!(s, 200);
    assert_eq!(a.stop(SECS10), 0);

    // Modes, and no secret in clear, in every file.
    let mut stack = vec![state.clone()];
    let mut files = 0;
    while let Some(p) = stack.pop() {
        let m = std::fs::symlink_metadata(&p).unwrap();
        let mode = m.permissions().mode() & 0o777;
        if m.is_dir() {
            assert_eq!(mode, 0o700, "{}", p.display());
            for e in std::fs::read_dir(&p).unwrap() {
                stack.push(e.unwrap().path());
            }
        } else {
            assert_eq!(mode, 0o600, "{}", p.display());
            let bytes = std::fs::read(&p).unwrap();
            for secret in ["ghp_SEKRET1", "SEKRET2"] {
                assert!(
                    memchr_find(&bytes, secret.as_bytes()).is_none(),
                    "{secret} in {}",
                    p.display()
                );
            }
            files += 1;
        }
    }
    assert!(files >= 4, "{files}");
    let meta = state.join("acp/sec/meta.json");
    let as_nobody = |args: &[&str]| {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .args(args)
            .output()
            .unwrap()
    };
    let out = as_nobody(&["cat", &meta.display().to_string()]);
    assert!(!out.status.success(), "nobody read the meta");
    let out = as_nobody(&["ls", &state.join("acp").display().to_string()]);
    assert!(!out.status.success(), "nobody listed the entries");

    // After a restart the agent's session/load gets the credentials back.
    let b = build(Daemon::builder()).start();
    let (s, body) = post(&b, "/v1/acp/sec", &prompt(json!(3), &session, "/history")).await;
    assert_eq!(s, 200, "{body}");
    let loaded =
        std::fs::read_to_string(work.join(format!(".mock-agent-sessions/{session}.mcp.json")))
            .expect("the mock recorded its session/load");
    let loaded: Value = serde_json::from_str(&loaded).unwrap();
    assert_eq!(loaded, servers);
}

fn memchr_find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The records of an `events.log` (length, CRC, id, payload), read by the test itself.
fn read_log(path: &Path) -> Vec<(u64, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let mut out = Vec::new();
    let mut at = 0;
    while at + 16 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        let id = u64::from_le_bytes(bytes[at + 8..at + 16].try_into().unwrap());
        if at + 16 + len > bytes.len() {
            break;
        }
        out.push((id, bytes[at + 16..at + 16 + len].to_vec()));
        at += 16 + len;
    }
    out
}

/// A burst of 200,000 updates from the agent (far more than any queue) stays durable: the
/// daemon, killed outright as PID 1 of its own PID namespace the moment the turn is answered,
/// has every update on disk, and the restart replays them with their ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_200000_updates_survives_kill_9_whole() {
    if !unshare_available() {
        return skip("needs root and unshare --pid to crash the daemon with its agents");
    }
    const N: usize = 200_000;
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let work = tmp.path().join("work");
    let big = [
        "--event-buffer",
        "300000",
        "--event-buffer-bytes",
        "256MiB",
        "--state-max-bytes",
        "1GiB",
    ];
    let mut a = Daemon::builder()
        .wrapper(["unshare", "--pid", "--fork", "--mount-proc"])
        .work_dir(&work)
        .args(state_args(&state))
        .args(big)
        .expect_exit(None)
        .start();
    let session = start_session(&a, "burst", "mock").await;
    let (s, b) = post(
        &a,
        "/v1/acp/burst",
        &prompt(json!(2), &session, &format!("/stream {N}")),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let listed = server(&a, "burst").await["lastEventId"].as_u64().unwrap();
    crash(&mut a);

    let records = read_log(&state.join("acp/burst/events.log"));
    let mut seen = vec![false; N + 1];
    for (_, p) in &records {
        let v: Value = serde_json::from_slice(p).unwrap();
        if let Some(t) = v["params"]["update"]["content"]["text"].as_str()
            && let Some(n) = t.strip_prefix("chunk ").and_then(|r| r.split(' ').next())
        {
            seen[n.parse::<usize>().unwrap()] = true;
        }
    }
    let missing = seen[1..].iter().filter(|s| !**s).count();
    assert_eq!(missing, 0, "updates missing from the disk after kill -9");
    assert_eq!(
        records.last().unwrap().0,
        listed,
        "the last event the client could see"
    );

    let b = Daemon::builder()
        .work_dir(&work)
        .args(state_args(&state))
        .args(big)
        .start();
    assert_eq!(
        server(&b, "burst").await["lastEventId"].as_u64(),
        Some(listed)
    );
    let mut tail = Sse::open(&b, "burst", Some(listed - 5)).await;
    let evs = tail.until(SECS10, |e| e.len() >= 5).await;
    assert!(evs.iter().all(|e| e.kind == "message"), "{evs:?}");
    assert_eq!(
        evs.iter().filter_map(|e| e.id).collect::<Vec<_>>(),
        (listed - 4..=listed).collect::<Vec<_>>()
    );
}

/// After restarts the numbering skips once past the last id written, however many restarts
/// came before; the listed `lastEventId` is a real event; a serverId with an empty log gets no
/// gap frame.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_skip_ids_once_and_show_no_false_gap() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let work = tmp.path().join("work");
    let start = || {
        Daemon::builder()
            .work_dir(&work)
            .args(state_args(&state))
            .start()
    };
    let mut a = start();
    let session = start_session(&a, "n", "mock").await;
    start_session(&a, "empty", "mock").await;
    let (s, _) = post(&a, "/v1/acp/n", &prompt(json!(2), &session, "/stream 5")).await;
    assert_eq!(s, 200);
    let last = server(&a, "n").await["lastEventId"].as_u64().unwrap();
    assert_eq!(server(&a, "empty").await["lastEventId"], 0);
    assert_eq!(a.stop(SECS10), 0);
    // Two restarts in which nothing happened.
    for _ in 0..2 {
        let mut b = start();
        assert_eq!(server(&b, "n").await["lastEventId"].as_u64(), Some(last));
        assert_eq!(server(&b, "empty").await["lastEventId"], 0);
        assert_eq!(b.stop(SECS10), 0);
    }
    let c = start();
    // The empty log: its first event after the restart comes without a gap before it.
    let mut sse = Sse::open(&c, "empty", None).await;
    let (s, body) = post(
        &c,
        "/v1/acp/empty",
        &request(
            json!(7),
            "session/new",
            json!({"cwd": "/", "mcpServers": []}),
        ),
    )
    .await;
    assert_eq!(s, 200, "{body}");
    let evs = sse.until(SECS10, |e| !e.is_empty()).await;
    assert_eq!(evs[0].kind, "message", "{evs:?}");
    // The other: its first new id is one skip past the last id written, not two or three.
    let mut sse = Sse::open(&c, "n", Some(last)).await;
    let (s, body) = post(&c, "/v1/acp/n", &prompt(json!(3), &session, "hi")).await;
    assert_eq!(s, 200, "{body}");
    let evs = sse.until(SECS10, |e| !e.is_empty()).await;
    assert_eq!(
        evs[0].kind, "message",
        "no gap where nothing was lost: {evs:?}"
    );
    assert_eq!(evs[0].id, Some(last + 16_385 + 1), "{evs:?}");
}

/// A recovered serverId whose agent cannot be started keeps its state (events and sessions)
/// for a later start; recovered serverIds do not count against `--max-agents` until started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_start_forgets_nothing_and_recovered_ids_do_not_count() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let work = tmp.path().join("work");
    let agents = tmp.path().join("agents.toml");
    let write_agents = |command: &str| {
        std::fs::write(
            &agents,
            format!(
                "[[agent]]\nid = \"flaky\"\ncommand = \"{command}\"\nargs = [\"mock-agent\"]\n"
            ),
        )
        .unwrap();
    };
    write_agents(env!("CARGO_BIN_EXE_sandbox-agent"));
    let start = |max: &str| {
        Daemon::builder()
            .work_dir(&work)
            .args(state_args(&state))
            .args(["--max-agents", max])
            .arg("--agents-file")
            .arg(&agents)
            .start()
    };
    let mut a = start("2");
    let session = start_session(&a, "f", "flaky").await;
    let (s, _) = post(&a, "/v1/acp/f", &prompt(json!(2), &session, "remember me")).await;
    assert_eq!(s, 200);
    // (Only `initialize`: a session of another mock would share the sessions dir.)
    let (s, body) = post(
        &a,
        "/v1/acp/g?agent=mock",
        &request(
            json!(0),
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": {}}),
        ),
    )
    .await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(a.stop(SECS10), 0);

    // The agent's program is gone: its start fails.
    write_agents(&tmp.path().join("no-such-program").display().to_string());
    let mut b = start("2");
    let (s, body) = post(&b, "/v1/acp/f", &prompt(json!(3), &session, "/history")).await;
    assert!(s >= 500, "{s} {body}");
    let row = server(&b, "f").await;
    assert_eq!(row["status"], "exited", "{row}");
    // Two recovered serverIds and --max-agents 2: a new one still gets its agent (only
    // `initialize`: a session of its mock would share the sessions dir of the others).
    let (s, body) = post(
        &b,
        "/v1/acp/new?agent=mock",
        &request(
            json!(0),
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": {}}),
        ),
    )
    .await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(b.stop(SECS10), 0);
    assert!(state.join("acp/f/meta.json").exists());

    write_agents(env!("CARGO_BIN_EXE_sandbox-agent"));
    let c = start("4");
    let (s, body) = post(&c, "/v1/acp/f", &prompt(json!(4), &session, "/history")).await;
    assert_eq!(s, 200, "{body}");
    let mut sse = Sse::open(&c, "f", None).await;
    let evs = sse
        .until(SECS10, |e| {
            e.iter().any(|e| chunk_text(e).starts_with("history:"))
        })
        .await;
    let h = evs
        .iter()
        .find(|e| chunk_text(e).starts_with("history:"))
        .unwrap();
    assert_eq!(chunk_text(h), "history: remember me");
}

/// Waits for a reload's `RELOADING=1` then `READY=1` (with "listening") after message `before`.
fn wait_reloaded(d: &mut Daemon, before: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let new = &d.messages[before..];
        if let Some(i) = new
            .iter()
            .position(|m| m.lines().any(|l| l == "RELOADING=1"))
            && let Some(ready) = new[i..].iter().find(|m| m.lines().any(|l| l == "READY=1"))
        {
            assert!(
                ready.contains("STATUS=listening on"),
                "{ready:?}\n{}",
                d.stderr()
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no reload within 30 s:\n{}",
            d.stderr()
        );
        d.read_notify();
    }
}

/// A reload then a crash: the restart skips ids once past the last id written (a reload adds no
/// skip of its own), and a prompt the reload answered 202 whose answer the crash cut is answered
/// on the stream with an error and named in `_sandboxagent/restored`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_then_a_crash_skips_ids_once_and_answers_what_was_promised() {
    if !unshare_available() {
        return skip("needs root and unshare --pid to crash the daemon with its agents");
    }
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let work = tmp.path().join("work");
    let mut a = Daemon::builder()
        .wrapper(["unshare", "--pid", "--fork", "--mount-proc"])
        .work_dir(&work)
        .args(state_args(&state))
        .expect_exit(None)
        .start();
    let session = start_session(&a, "r", "mock").await;
    let (s, _) = post(&a, "/v1/acp/r", &prompt(json!(2), &session, "/stream 5")).await;
    assert_eq!(s, 200);
    let client = a.client();
    let url = a.url("/v1/acp/r");
    let hang = prompt(json!("p-hang"), &session, "/hang");
    let hanging = tokio::spawn(async move {
        client
            .post(url)
            .header("content-type", "application/json")
            .body(hang.to_string())
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    crate::support::eventually_async(SECS10, "the prompt to be pending", || {
        let a = &a;
        async move { (server(a, "r").await["pendingRequests"] == 1).then_some(()) }
    })
    .await;
    let init = namespace_init(a.pid());
    let before = a.messages.len();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(init as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    wait_reloaded(&mut a, before);
    assert_eq!(hanging.await.unwrap().unwrap(), 202);
    let (s, _) = post(&a, "/v1/acp/r", &prompt(json!(3), &session, "/stream 3")).await;
    assert_eq!(s, 200);
    let last = server(&a, "r").await["lastEventId"].as_u64().unwrap();
    crash(&mut a);

    let b = Daemon::builder()
        .work_dir(&work)
        .args(state_args(&state))
        .start();
    let mut sse = Sse::open(&b, "r", Some(last)).await;
    let evs = sse.until(SECS10, |e| !e.is_empty()).await;
    assert_eq!(evs[0].kind, "message", "{evs:?}");
    assert_eq!(evs[0].data["id"], "p-hang", "{evs:?}");
    assert_eq!(
        evs[0].data["error"]["message"],
        "the daemon restarted before the agent answered"
    );
    assert_eq!(
        evs[0].id,
        Some(last + 16_385 + 1),
        "one skip past the last id written"
    );
    let (s, body) = post(&b, "/v1/acp/r", &prompt(json!(4), &session, "again")).await;
    assert_eq!(s, 200, "{body}");
    let evs = sse
        .until(SECS10, |e| {
            e.iter()
                .any(|e| e.data["method"] == "_sandboxagent/restored")
        })
        .await;
    let note = evs
        .iter()
        .find(|e| e.data["method"] == "_sandboxagent/restored")
        .unwrap();
    assert_eq!(
        note.data["params"]["unanswered"],
        json!(["p-hang"]),
        "{:?}",
        note.data
    );
}

/// A serverId recovered after a restart and not used yet keeps its pending restore across a
/// reload: its first POST after the reload still loads its sessions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovered_server_id_keeps_its_restore_across_a_reload() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let work = tmp.path().join("work");
    let start = || {
        Daemon::builder()
            .work_dir(&work)
            .args(state_args(&state))
            .start()
    };
    let mut a = start();
    let session = start_session(&a, "k", "mock").await;
    let (s, _) = post(
        &a,
        "/v1/acp/k",
        &prompt(json!(2), &session, "remember this"),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(a.stop(SECS10), 0);
    let mut b = start();
    let before = b.messages.len();
    b.signal(nix::sys::signal::Signal::SIGHUP);
    wait_reloaded(&mut b, before);
    let mut sse = Sse::open(&b, "k", None).await;
    let (s, body) = post(&b, "/v1/acp/k", &prompt(json!(3), &session, "/history")).await;
    assert_eq!(s, 200, "{body}");
    let evs = sse
        .until(SECS10, |e| {
            e.iter().any(|e| chunk_text(e).starts_with("history:"))
        })
        .await;
    assert!(
        evs.iter()
            .any(|e| e.data["method"] == "_sandboxagent/restored"),
        "{evs:?}"
    );
    let h = evs
        .iter()
        .find(|e| chunk_text(e).starts_with("history:"))
        .unwrap();
    assert_eq!(chunk_text(h), "history: remember this");
}

/// A restart then a reload: the listed `lastEventId`s stay real events (0 for a log that never
/// had one, not the restart's skipped floor) and a reader from the start gets the same gap and
/// the same events as before the reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_then_a_reload_keeps_last_ids_real_and_the_same_gaps() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let work = tmp.path().join("work");
    let start = || {
        Daemon::builder()
            .work_dir(&work)
            .args(state_args(&state))
            .args(["--event-buffer", "3"])
            .start()
    };
    let mut a = start();
    let session = start_session(&a, "n", "mock").await;
    start_session(&a, "empty", "mock").await;
    let init = request(json!(1), "initialize", json!({"protocolVersion": 1}));
    let (s, body) = post(&a, "/v1/acp/bare?agent=mock", &init).await;
    assert_eq!(s, 200, "{body}");
    let (s, _) = post(&a, "/v1/acp/n", &prompt(json!(2), &session, "/stream 6")).await;
    assert_eq!(s, 200);
    let last = server(&a, "n").await["lastEventId"].as_u64().unwrap();
    assert!(last >= 6, "{last}");
    assert_eq!(a.stop(SECS10), 0);

    let mut b = start();
    let before_reload = read_from_start(&b, last).await;
    assert_eq!(before_reload[0].0, "gap", "{before_reload:?}");
    // A recovered serverId started again that has said nothing: its agent runs, its log is
    // empty, its next id is past the restart's skip.
    let (s, body) = post(&b, "/v1/acp/bare?agent=mock", &init).await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(server(&b, "n").await["lastEventId"].as_u64(), Some(last));
    assert_eq!(server(&b, "empty").await["lastEventId"], 0);
    // Its one event (`_sandboxagent/restored`) is past the skip.
    let bare_last = server(&b, "bare").await["lastEventId"].as_u64().unwrap();

    let n = b.messages.len();
    b.signal(nix::sys::signal::Signal::SIGHUP);
    wait_reloaded(&mut b, n);
    assert_eq!(server(&b, "n").await["lastEventId"].as_u64(), Some(last));
    assert_eq!(
        server(&b, "empty").await["lastEventId"],
        0,
        "an empty log's last id after a restart and a reload"
    );
    assert_eq!(
        server(&b, "bare").await["lastEventId"].as_u64(),
        Some(bare_last)
    );
    assert_eq!(read_from_start(&b, last).await, before_reload);
}

/// Serverid `n`'s stream from its start up to event `last`: (kind, id, data) of each frame.
async fn read_from_start(d: &Daemon, last: u64) -> Vec<(String, Option<u64>, Value)> {
    let mut sse = Sse::open(d, "n", None).await;
    sse.until(SECS10, |e| e.iter().any(|e| e.id == Some(last)))
        .await
        .into_iter()
        .map(|e| (e.kind, e.id, e.data))
        .collect()
}
