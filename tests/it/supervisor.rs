//! Agent supervision through the real daemon: limits (pids, memory), stopping whole trees
//! (setsid escapees, TERM-ignoring agents), daemon shutdown with many agents, clean environment,
//! stderr kept off the protocol, and leftovers of a SIGKILLed daemon. Agents are the built-in
//! mock (`?agent=mock`); processes are checked in /proc. Cgroup cases skip where the daemon
//! reports no usable controller (not root, or cgroups not delegated).

use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::{Value, json};

use crate::support::{Daemon, eventually, eventually_async, is_root, pid_alive, skip};

/// Sends one JSON-RPC request to `server_id` (creating it with the mock agent); (status, body).
async fn rpc(d: &Daemon, server_id: &str, id: u64, method: &str, params: Value) -> (u16, Value) {
    let resp = d
        .client()
        .post(d.url(&format!("/v1/acp/{server_id}?agent=mock")))
        .json(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
        .send()
        .await
        .expect("POST reaches the daemon");
    let status = resp.status().as_u16();
    let body = resp.json::<Value>().await.unwrap_or(Value::Null);
    (status, body)
}

/// Runs a mock prompt and returns the POST's (status, body).
async fn prompt(d: &Daemon, server_id: &str, id: u64, text: &str) -> (u16, Value) {
    rpc(
        d,
        server_id,
        id,
        "session/prompt",
        json!({"sessionId": "mock-1", "prompt": [{"type": "text", "text": text}]}),
    )
    .await
}

/// Starts an agent and opens a session; returns its pid from the listing.
async fn start_agent(d: &Daemon, server_id: &str) -> u32 {
    let (status, body) = rpc(
        d,
        server_id,
        1,
        "session/new",
        json!({"cwd": "/", "mcpServers": []}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    server(d, server_id).await["pid"]
        .as_u64()
        .expect("listing has the pid") as u32
}

/// The listing row of `server_id` (Null when not listed).
async fn server(d: &Daemon, server_id: &str) -> Value {
    d.get_json("/v1/acp").await["servers"]
        .as_array()
        .and_then(|s| s.iter().find(|e| e["serverId"] == server_id).cloned())
        .unwrap_or(Value::Null)
}

/// Reads the SSE stream of `server_id` until `needle` appears; returns everything read.
async fn sse_until(d: &Daemon, server_id: &str, needle: &str) -> String {
    let mut resp = d
        .client()
        .get(d.url(&format!("/v1/acp/{server_id}")))
        .header("accept", "text/event-stream")
        .send()
        .await
        .expect("GET stream");
    assert_eq!(resp.status().as_u16(), 200);
    let mut seen = String::new();
    let read = async {
        while let Some(chunk) = resp.chunk().await.expect("stream reads") {
            seen.push_str(&String::from_utf8_lossy(&chunk));
            if seen.contains(needle) {
                return;
            }
        }
    };
    if tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .is_err()
    {
        panic!("`{needle}` not on the stream of {server_id}; got:\n{seen}");
    }
    seen
}

/// The number after `prefix` in `text` (e.g. "orphan pid 1234").
/// `DELETE /v1/acp/{server_id}`.
async fn delete(d: &Daemon, server_id: &str) -> reqwest::Response {
    d.client()
        .delete(d.url(&format!("/v1/acp/{server_id}")))
        .send()
        .await
        .expect("DELETE")
}

fn number_after(text: &str, prefix: &str) -> u64 {
    let at = text
        .find(prefix)
        .unwrap_or_else(|| panic!("`{prefix}` in {text}"))
        + prefix.len();
    text[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .expect("a number")
}

/// True when the daemon's start-up log says agent cgroups carry `controller`; else prints why
/// the test is skipped.
pub(crate) fn cgroup_controller_or_skip(d: &Daemon, controller: &str) -> bool {
    if !is_root() {
        skip("needs root for cgroups");
        return false;
    }
    let log = eventually(Duration::from_secs(5), "cgroup set-up in the log", || {
        let log = d.stderr();
        (log.contains("agent cgroups ready") || log.contains("cgroups are not writable"))
            .then_some(log)
    });
    let ready = log
        .lines()
        .find(|l| l.contains("agent cgroups ready"))
        .unwrap_or("");
    if ready.contains(&format!("\"{controller}\"")) {
        true
    } else {
        skip(&format!(
            "the daemon has no usable `{controller}` cgroup controller here"
        ));
        false
    }
}

fn session_of(pid: u32) -> Option<i64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(") ")?.1;
    rest.split_whitespace().nth(3)?.parse().ok()
}

#[tokio::test]
async fn fork_bomb_is_capped_by_the_pids_limit_while_the_daemon_and_other_agents_stay_healthy() {
    let d = Daemon::builder().args(["--agent-pids-max", "20"]).start();
    if !cgroup_controller_or_skip(&d, "pids") {
        return;
    }
    start_agent(&d, "bomb").await;
    start_agent(&d, "bystander").await;
    let (status, body) = prompt(&d, "bomb", 2, "/fork 200").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["stopReason"], "end_turn");
    let stream = sse_until(&d, "bomb", "forked ").await;
    let forked = number_after(&stream, "forked ");
    assert!(forked < 20, "the pids limit let {forked} children start");
    let procs = server(&d, "bomb").await["processes"]
        .as_u64()
        .expect("processes");
    assert!(procs <= 20, "{procs} processes in a cgroup capped at 20");
    // The daemon and the other agent are unaffected; the capped agent itself still answers.
    let health = d
        .client()
        .get(d.url("/v1/health"))
        .send()
        .await
        .expect("health");
    assert_eq!(health.status().as_u16(), 200);
    for id in ["bystander", "bomb"] {
        let (status, body) = rpc(&d, id, 3, "_mock/echo", json!({"still": "here"})).await;
        assert_eq!((status, &body["result"]), (200, &json!({"still": "here"})));
    }
    let (status, body) = prompt(&d, "bystander", 4, "/fork 5").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        sse_until(&d, "bystander", "forked 5 of 5")
            .await
            .contains("forked 5 of 5")
    );
}

#[tokio::test]
async fn memory_hog_is_killed_and_reported_as_oom() {
    let d = Daemon::builder()
        .args(["--agent-memory-max", "64M"])
        .start();
    if !cgroup_controller_or_skip(&d, "memory") {
        return;
    }
    let pid = start_agent(&d, "hog").await;
    let (status, body) = prompt(&d, "hog", 2, "/alloc 512").await;
    assert_eq!(status, 502, "the agent died under the limit: {body}");
    let row = eventually_async(Duration::from_secs(10), "hog listed as exited", || async {
        let row = server(&d, "hog").await;
        (row["status"] == "exited").then_some(row)
    })
    .await;
    assert_eq!(row["exitReason"], "oom", "{row}");
    assert_eq!(row["signal"], 9, "{row}");
    assert!(!pid_alive(pid));
    // A normal agent next to it is fine.
    start_agent(&d, "calm").await;
    let (status, _) = prompt(&d, "calm", 2, "/alloc 8").await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn setsid_orphan_is_gone_after_delete() {
    let d = Daemon::start();
    if !cgroup_controller_or_skip(&d, "pids") {
        return;
    }
    let pid = start_agent(&d, "orphaner").await;
    let (status, body) = prompt(&d, "orphaner", 2, "/spawn-orphan").await;
    assert_eq!(status, 200, "{body}");
    let orphan = number_after(
        &sse_until(&d, "orphaner", "orphan pid ").await,
        "orphan pid ",
    ) as u32;
    assert!(pid_alive(orphan));
    assert_ne!(
        session_of(orphan),
        session_of(pid),
        "the orphan left the agent's session"
    );
    let resp = delete(&d, "orphaner").await;
    assert_eq!(resp.status().as_u16(), 204);
    eventually(Duration::from_secs(10), "agent and orphan gone", || {
        (!pid_alive(pid) && !pid_alive(orphan)).then_some(())
    });
}

#[tokio::test]
async fn agent_ignoring_term_is_killed_after_the_grace_period() {
    let d = Daemon::builder().args(["--agent-grace", "1s"]).start();
    let pid = start_agent(&d, "stubborn").await;
    let (status, _) = prompt(&d, "stubborn", 2, "/ignore-term").await;
    assert_eq!(status, 200);
    let resp = delete(&d, "stubborn").await;
    assert_eq!(
        resp.status().as_u16(),
        204,
        "DELETE answers before the stop ends"
    );
    eventually(Duration::from_secs(10), "agent killed", || {
        (!pid_alive(pid)).then_some(())
    });
    eventually(Duration::from_secs(5), "exit reason in the log", || {
        d.stderr()
            .lines()
            .find(|l| l.contains("agent ended") && l.contains(&format!("pid={pid}")))
            .map(|l| assert!(l.contains("reason=\"forced\""), "{l}"))
    });
}

#[tokio::test]
async fn agent_exit_reasons_are_listed() {
    let d = Daemon::start();
    start_agent(&d, "crasher").await;
    let (status, _) = prompt(&d, "crasher", 2, "/crash 7").await;
    assert_eq!(status, 502);
    let row = eventually_async(Duration::from_secs(10), "crasher exited", || async {
        let row = server(&d, "crasher").await;
        (row["status"] == "exited").then_some(row)
    })
    .await;
    assert_eq!(
        (&row["exitReason"], &row["exitCode"]),
        (&json!("exited"), &json!(7)),
        "{row}"
    );
}

#[tokio::test]
async fn sigterm_with_20_running_agents_stops_them_all_and_exits_0() {
    let grace = Duration::from_secs(2);
    let mut d = Daemon::builder()
        .args(["--shutdown-grace", "2s", "--agent-grace", "1s"])
        .start();
    let mut pids = Vec::new();
    for i in 0..20 {
        let id = format!("agent-{i}");
        pids.push(start_agent(&d, &id).await);
        // Half of them make it hard: ignore TERM, or leave a child behind.
        let text = if i % 2 == 0 {
            "/ignore-term"
        } else {
            "/fork 2"
        };
        let (status, _) = prompt(&d, &id, 2, text).await;
        assert_eq!(status, 200);
    }
    for p in pids.clone() {
        pids.extend(crate::support::children_of(p));
    }
    assert!(pids.len() >= 30 && pids.iter().all(|p| pid_alive(*p)));
    let code = d.stop(grace + Duration::from_secs(1));
    assert_eq!(code, 0, "stderr:\n{}", d.stderr());
    let left: Vec<u32> = pids.iter().copied().filter(|p| pid_alive(*p)).collect();
    assert!(
        left.is_empty(),
        "agent processes outlived the daemon: {left:?}"
    );
}

#[tokio::test]
async fn agent_environment_has_no_token_no_notify_socket_and_no_extra_fds() {
    let d = Daemon::builder()
        .token("tok-7d1e-secret")
        .env("SANDBOX_AGENT_ACP_REGISTRY_URL", "http://127.0.0.1:9/none")
        .env("KEEP_ME", "kept")
        .start();
    let pid = start_agent(&d, "env").await;
    let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("read environ");
    let vars: Vec<String> = environ
        .split(|b| *b == 0)
        .map(|v| String::from_utf8_lossy(v).into_owned())
        .collect();
    assert!(vars.iter().any(|v| v == "KEEP_ME=kept"), "{vars:?}");
    for v in &vars {
        assert!(!v.contains("tok-7d1e-secret"), "token leaked: {v}");
        assert!(!v.starts_with("NOTIFY_SOCKET="), "{v}");
        assert!(!v.starts_with("SANDBOX_AGENT_"), "{v}");
        assert!(
            !v.starts_with("LISTEN_") && !v.starts_with("WATCHDOG_"),
            "{v}"
        );
    }
    let mut fds: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fd dir")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    fds.sort();
    assert_eq!(fds, vec![0, 1, 2], "the agent inherited descriptors");
}

#[tokio::test]
async fn agent_stderr_goes_to_the_log_never_to_the_stream() {
    let d = Daemon::builder().args(["--log-format", "json"]).start();
    let pid = start_agent(&d, "noisy").await;
    let marker = "stderr-marker-5f2c";
    let (status, _) = prompt(&d, "noisy", 2, &format!("/stderr {marker}")).await;
    assert_eq!(status, 200);
    let (status, _) = prompt(&d, "noisy", 3, "after the noise").await;
    assert_eq!(status, 200);
    let stream = sse_until(&d, "noisy", "after the noise").await;
    assert!(
        !stream.contains(marker),
        "stderr reached the stream:\n{stream}"
    );
    let entry: Value = eventually(Duration::from_secs(5), "stderr line in the log", || {
        d.stderr()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|e| e["message"] == marker)
    });
    assert_eq!(entry["server_id"], "noisy", "{entry}");
    assert_eq!(entry["agent"], "mock", "{entry}");
    assert_eq!(entry["pid"], pid, "{entry}");
    assert_eq!(entry["target"], "sandbox_agent::agent_stderr", "{entry}");
}

#[tokio::test]
async fn restart_after_sigkill_clears_the_dead_daemons_agents() {
    let first = Daemon::builder().expect_exit(None).start();
    if !cgroup_controller_or_skip(&first, "pids") {
        return;
    }
    let pid = start_agent(&first, "left-behind").await;
    let (status, _) = prompt(&first, "left-behind", 2, "/spawn-orphan").await;
    assert_eq!(status, 200);
    let orphan = number_after(
        &sse_until(&first, "left-behind", "orphan pid ").await,
        "orphan pid ",
    ) as u32;
    let (status, _) = prompt(&first, "left-behind", 3, "/fork 3").await;
    assert_eq!(status, 200);
    let mut left = crate::support::children_of(pid);
    if !left.contains(&orphan) {
        left.push(orphan);
    }
    assert!(left.len() >= 4, "{left:?}");
    first.signal(Signal::SIGKILL);
    eventually(Duration::from_secs(5), "first daemon dead", || {
        (!pid_alive(first.pid())).then_some(())
    });
    // Nothing stopped them: the daemon died without a word (the mock itself ends on stdin EOF).
    assert!(left.iter().all(|p| pid_alive(*p)), "{left:?}");
    drop(first);
    let second = Daemon::start();
    eventually(Duration::from_secs(10), "leftovers killed", || {
        left.iter().all(|p| !pid_alive(*p)).then_some(())
    });
    drop(second);
}

#[tokio::test]
async fn without_cgroups_memory_is_capped_per_process_and_the_log_says_so_once() {
    let d = Daemon::builder()
        .args(["--agent-cgroups", "off", "--agent-memory-max", "64M"])
        .start();
    start_agent(&d, "first").await;
    start_agent(&d, "second").await;
    let (status, body) = prompt(&d, "second", 2, "/alloc 512").await;
    assert_eq!(status, 502, "{body}");
    assert!(
        body["stderrTail"]
            .as_str()
            .unwrap_or("")
            .contains("memory allocation"),
        "{body}"
    );
    let row = eventually_async(Duration::from_secs(10), "second exited", || async {
        let row = server(&d, "second").await;
        (row["status"] == "exited").then_some(row)
    })
    .await;
    assert_eq!(
        (&row["exitReason"], &row["signal"]),
        (&json!("crashed"), &json!(6)),
        "{row}"
    );
    // Small allocations still work under the cap.
    let (status, _) = prompt(&d, "first", 2, "/alloc 8").await;
    assert_eq!(status, 200);
    let log = d.stderr();
    assert_eq!(log.matches("RLIMIT_DATA").count(), 1, "{log}");
}

/// Without cgroups the listing finds each agent's processes through its process group, from one
/// `/proc` scan that all the agents of one listing share: each still counts only its own tree.
#[tokio::test]
async fn without_cgroups_one_listing_counts_each_agents_own_process_group() {
    let d = Daemon::builder().args(["--agent-cgroups", "off"]).start();
    start_agent(&d, "plain").await;
    start_agent(&d, "forks").await;
    start_agent(&d, "other").await;
    let (status, body) = prompt(&d, "forks", 2, "/fork 5").await;
    assert_eq!(status, 200, "{body}");
    let list = d.get_json("/v1/acp").await;
    let count = |id: &str| {
        list["servers"]
            .as_array()
            .and_then(|s| s.iter().find(|e| e["serverId"] == id))
            .and_then(|e| e["processes"].as_u64())
    };
    assert_eq!(
        (count("plain"), count("forks"), count("other")),
        (Some(1), Some(6), Some(1)),
        "{list}"
    );
}

#[tokio::test]
async fn v2_hierarchy_tracks_the_tree_and_reports_missing_controllers() {
    if !is_root() || !std::path::Path::new("/sys/fs/cgroup/unified/cgroup.procs").exists() {
        skip("needs root and a hybrid cgroup2 mount at /sys/fs/cgroup/unified");
        return;
    }
    let d = Daemon::builder().args(["--agent-cgroups", "v2"]).start();
    let log = eventually(Duration::from_secs(5), "cgroup set-up", || {
        let log = d.stderr();
        log.contains("agent cgroups ready").then_some(log)
    });
    let controllers =
        std::fs::read_to_string("/sys/fs/cgroup/unified/cgroup.controllers").unwrap_or_default();
    if !controllers.contains("pids") {
        assert!(
            log.contains("not enforced") && log.contains("controller=\"pids\""),
            "a v2 group without the pids controller must be reported:\n{log}"
        );
    }
    let pid = start_agent(&d, "v2").await;
    let (status, _) = prompt(&d, "v2", 2, "/spawn-orphan").await;
    assert_eq!(status, 200);
    let orphan = number_after(&sse_until(&d, "v2", "orphan pid ").await, "orphan pid ") as u32;
    let resp = delete(&d, "v2").await;
    assert_eq!(resp.status().as_u16(), 204);
    eventually(Duration::from_secs(10), "agent and orphan gone", || {
        (!pid_alive(pid) && !pid_alive(orphan)).then_some(())
    });
}

#[tokio::test]
async fn agents_run_as_the_configured_user() {
    if !is_root() {
        skip("needs root to switch the agent user");
        return;
    }
    // The agent is the daemon's own executable, which uid 65534 must be able to run.
    let d = Daemon::builder()
        .any_user_bin()
        .args(["--agent-user", "nobody"])
        .start();
    // The agent user must be able to enter its working directory.
    for dir in [d.dir.path().to_path_buf(), d.work_dir()] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let pid = start_agent(&d, "as-nobody").await;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
            .unwrap_or_default()
    };
    assert_eq!(field("Uid:"), vec!["65534"; 4], "{status}");
    assert_eq!(field("Gid:"), vec!["65534"; 4], "{status}");
    assert!(!field("Groups:").contains(&"0".to_string()), "{status}");
}

#[tokio::test]
async fn a_second_stop_signal_kills_every_agent_at_once() {
    let mut d = Daemon::builder()
        .args(["--shutdown-grace", "60s", "--agent-grace", "60s"])
        .start();
    let pid = start_agent(&d, "stubborn").await;
    let (status, _) = prompt(&d, "stubborn", 2, "/ignore-term").await;
    assert_eq!(status, 200);
    let (status, _) = prompt(&d, "stubborn", 3, "/fork 2").await;
    assert_eq!(status, 200);
    let mut tree = crate::support::children_of(pid);
    tree.push(pid);
    d.signal(Signal::SIGTERM);
    d.wait_notify("STOPPING=1", Duration::from_secs(5));
    // The graceful stop would wait a minute for this agent; a second signal cuts it short.
    assert!(pid_alive(pid));
    d.signal(Signal::SIGTERM);
    let code = d.wait_exit(Duration::from_secs(10), "the second SIGTERM");
    assert_eq!(code, 128 + 15);
    eventually(Duration::from_secs(5), "agent tree killed", || {
        tree.iter().all(|p| !pid_alive(*p)).then_some(())
    });
}

/// The second stop signal is read on a thread of its own, so it ends the daemon and its agents
/// even when no task can run any more: the test hook blocks every runtime worker after the first
/// signal (the daemon then answers nothing, the control), and the second one still exits at once.
#[tokio::test]
async fn a_second_stop_signal_works_while_the_runtime_is_wedged() {
    let mut d = Daemon::builder()
        .args([
            "--shutdown-grace",
            "60s",
            "--agent-grace",
            "60s",
            "--worker-threads",
            "1",
        ])
        .env("SANDBOX_AGENT_TEST_WEDGE_ON_STOP", "1")
        .start();
    let pid = start_agent(&d, "wedged").await;
    let (status, _) = prompt(&d, "wedged", 2, "/ignore-term").await;
    assert_eq!(status, 200);
    d.signal(Signal::SIGTERM);
    d.wait_notify("STOPPING=1", Duration::from_secs(5));
    // Wedged: a fresh connection is accepted by the kernel but never answered.
    let probe = reqwest::Client::new()
        .get(d.url("/v1/health"))
        .timeout(Duration::from_secs(1))
        .send()
        .await;
    assert!(probe.is_err(), "the runtime still answers: {probe:?}");
    assert!(pid_alive(pid));
    d.signal(Signal::SIGTERM);
    let code = d.wait_exit(Duration::from_secs(10), "the second SIGTERM");
    assert_eq!(code, 128 + 15, "stderr:\n{}", d.stderr());
    eventually(Duration::from_secs(5), "agent killed", || {
        (!pid_alive(pid)).then_some(())
    });
}

/// A DELETE answers at once and stops its agent in the background. A stop signal that comes
/// while that stop is still in its grace period waits for it: the daemon exits 0 only once the
/// deleted agent's whole tree is gone and the stop has run its course (grace, then KILL, logged
/// as forced before the daemon's last line).
#[tokio::test]
async fn sigterm_waits_for_a_delete_whose_agent_is_still_stopping() {
    let mut d = Daemon::builder()
        .args([
            "--shutdown-grace",
            "30s",
            "--agent-grace",
            "3s",
            "--log-format",
            "json",
        ])
        .start();
    let pid = start_agent(&d, "leaving").await;
    let (status, _) = prompt(&d, "leaving", 2, "/ignore-term").await;
    assert_eq!(status, 200);
    let (status, _) = prompt(&d, "leaving", 3, "/fork 2").await;
    assert_eq!(status, 200);
    let mut tree = crate::support::children_of(pid);
    tree.push(pid);
    assert!(tree.len() >= 3, "{tree:?}");
    assert_eq!(delete(&d, "leaving").await.status().as_u16(), 204);
    // The agent ignores TERM, so its stop is now waiting out the 3 s grace.
    assert!(
        pid_alive(pid),
        "the DELETE's stop had not reached its KILL yet"
    );
    let code = d.stop(Duration::from_secs(30));
    assert_eq!(code, 0, "stderr:\n{}", d.stderr());
    // No polling here: at the daemon's exit the tree must already be gone.
    let left: Vec<u32> = tree.iter().copied().filter(|p| pid_alive(*p)).collect();
    assert!(
        left.is_empty(),
        "the deleted agent outlived the daemon: {left:?}"
    );
    let log: Vec<Value> = d
        .stderr()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let at = |pred: &dyn Fn(&Value) -> bool| log.iter().position(pred);
    let stopped = at(&|e| e["message"] == "agent ended" && e["server_id"] == "leaving")
        .unwrap_or_else(|| panic!("the DELETE's stop was not awaited:\n{}", d.stderr()));
    assert_eq!(log[stopped]["reason"], "forced", "{}", log[stopped]);
    // One stop, one line: nothing else reports the same end.
    let ends = log
        .iter()
        .filter(|e| e["server_id"] == "leaving" && e["reason"].is_string())
        .count();
    assert_eq!(ends, 1, "{}", d.stderr());
    // Killing after the grace is worth a warning.
    let killed = at(&|e| {
        e["server_id"] == "leaving"
            && e["message"] == "agent still running after the grace period; killing it"
    })
    .unwrap_or_else(|| panic!("no kill line:\n{}", d.stderr()));
    assert_eq!(log[killed]["level"], "WARN", "{}", log[killed]);
    let last = at(&|e| e["message"] == "stopped").expect("the daemon's last line");
    assert!(stopped < last, "{}", d.stderr());
}

/// Runs `script` with `sh -c` inside the PID and mount namespaces of `ns_init` (host pid).
fn in_namespace(ns_init: u32, script: &str) -> std::process::Command {
    let mut cmd = std::process::Command::new("nsenter");
    cmd.args(["-t", &ns_init.to_string(), "-p", "-m", "sh", "-c", script]);
    cmd
}

/// `(state, pgrp)` of namespace-local `pid`, read inside the namespace.
fn state_and_group(ns_init: u32, pid: u32) -> Option<(String, u32)> {
    let out = in_namespace(ns_init, &format!("cat /proc/{pid}/stat"))
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (_, rest) = text.rsplit_once(") ")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some((f.first()?.to_string(), f.get(2)?.parse().ok()?))
}

/// The host pid of a namespace's PID 1. Dropped while armed (a failed test), it kills that
/// init, which ends the namespace: `unshare` does not pass SIGTERM on, so the daemon's own drop
/// would wait for it in vain.
struct NsInit {
    pid: u32,
    armed: bool,
}

impl Drop for NsInit {
    fn drop(&mut self) {
        if self.armed {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// A daemon that is PID 1 of its own PID namespace (so the test can steer which pid the kernel
/// hands out next), without cgroups (where only the process group tells a tree apart), with a
/// 5 s agent grace; and the host pid of the namespace's PID 1. `None` (skipped) without root,
/// `unshare --pid` and `nsenter`.
fn daemon_in_pid_namespace() -> Option<(Daemon, NsInit)> {
    let unshare_works = is_root()
        && std::process::Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc", "true"])
            .status()
            .is_ok_and(|s| s.success());
    if !unshare_works {
        skip("needs root, unshare --pid and nsenter to steer pid reuse");
        return None;
    }
    let d = Daemon::builder()
        .wrapper(["unshare", "--pid", "--kill-child", "--mount-proc"])
        .args(["--agent-cgroups", "off", "--agent-grace", "5s"])
        .expect_exit(None)
        .start();
    let ns_init = eventually(Duration::from_secs(5), "the namespace's PID 1", || {
        crate::support::children_of(d.pid()).first().copied()
    });
    Some((
        d,
        NsInit {
            pid: ns_init,
            armed: true,
        },
    ))
}

/// Starts `sh -c script` through the process API; (id, namespace-local pid).
async fn start_process(d: &Daemon, script: &str) -> (String, u32) {
    let resp = d
        .client()
        .post(d.url("/v1/processes"))
        .json(&json!({"command": "sh", "args": ["-c", script]}))
        .send()
        .await
        .expect("POST /v1/processes");
    assert_eq!(resp.status().as_u16(), 200);
    let info: Value = resp.json().await.unwrap();
    (
        info["id"].as_str().unwrap().to_string(),
        info["pid"].as_u64().unwrap() as u32,
    )
}

/// `POST /v1/processes/{id}/{action}?waitMs=…`; the status.
async fn process_action(d: &Daemon, id: &str, action: &str, wait_ms: u64) -> u16 {
    d.client()
        .post(d.url(&format!("/v1/processes/{id}/{action}?waitMs={wait_ms}")))
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn process_info(d: &Daemon, id: &str) -> Value {
    d.client()
        .get(d.url(&format!("/v1/processes/{id}")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The stranger: inside the namespace, forks until the kernel hands it `pid` (steering
/// `ns_last_pid`), which then sits in its own session, so its process group id is `pid`. Gives
/// up after 20 s (exit 1).
fn spawn_stranger(ns_init: u32, pid: u32) -> std::process::Child {
    let script = format!(
        "end=$(( $(date +%s) + 20 )); \
         while [ $(date +%s) -lt $end ]; do \
           echo {} > /proc/sys/kernel/ns_last_pid; \
           setsid sleep 120 </dev/null >/dev/null 2>&1 & p=$!; \
           if [ $p = {pid} ]; then exit 0; fi; \
           kill $p 2>/dev/null; wait $p 2>/dev/null; \
         done; exit 1",
        pid - 1
    );
    in_namespace(ns_init, &script).spawn().expect("nsenter")
}

async fn stranger_placed(stranger: std::process::Child, pid: u32) {
    let status = tokio::task::spawn_blocking(move || stranger.wait_with_output())
        .await
        .unwrap()
        .unwrap()
        .status;
    assert!(status.success(), "the stranger never got pid {pid} in 20 s");
}

/// The stranger is alive and still leads group `pid`; then the negative control: a naive
/// `killpg(pid)` kills it, so the id really named a live group the daemon could have hit.
/// Last, the namespace's init stops the daemon and the namespace ends with it.
fn stranger_survived_then_control(mut d: Daemon, mut ns: NsInit, pid: u32) {
    let ns_init = ns.pid;
    let stranger = state_and_group(ns_init, pid);
    assert!(
        matches!(&stranger, Some((state, pgrp)) if state != "Z" && *pgrp == pid),
        "the stranger holding group {pid} was killed by the daemon: {stranger:?}\n{}",
        d.stderr()
    );
    let naive = in_namespace(ns_init, &format!("/bin/kill -KILL -- -{pid}"))
        .status()
        .unwrap();
    assert!(naive.success());
    eventually(Duration::from_secs(5), "the naive killpg to hit", || {
        state_and_group(ns_init, pid)
            .is_none_or(|(state, _)| state == "Z")
            .then_some(())
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(ns_init as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let mut unshare = d.child.take().expect("the wrapper process");
    let status = eventually(Duration::from_secs(15), "the namespace to end", || {
        unshare.try_wait().unwrap()
    });
    ns.armed = false;
    assert_eq!(status.code(), Some(0), "stderr:\n{}", d.stderr());
}

/// The reused-process-group race, after the end: a process group's id is its top process's pid,
/// and once that pid is free the kernel may give it to an unrelated process that starts its own
/// group. Here a stranger is made to take it after the tree ended by itself; a stop and a kill
/// of the ended process that followed must not reach it (a naive `killpg` does: the control).
#[tokio::test]
async fn stop_and_kill_after_the_end_never_signal_a_stranger_with_the_old_group_id() {
    let Some((d, ns)) = daemon_in_pid_namespace() else {
        return;
    };
    let ns_init = ns.pid;
    let (id, top) = start_process(&d, "sleep 0.2; exit 3").await;
    let ended = eventually_async(Duration::from_secs(10), "the process to end", || async {
        let info = process_info(&d, &id).await;
        (info["status"] == "exited").then_some(info)
    })
    .await;
    assert_eq!(ended["exitCode"], 3, "{ended}");
    stranger_placed(spawn_stranger(ns_init, top), top).await;
    assert_eq!(process_action(&d, &id, "stop", 2000).await, 200);
    assert_eq!(process_action(&d, &id, "kill", 2000).await, 200);
    stranger_survived_then_control(d, ns, top);
}

/// The same race during a stop: the tree dies by other hands while the daemon's stop waits out
/// its grace, and a stranger is ready to take the top process's pid the moment it is free. The
/// daemon holds that pid (the top process stays unreaped) until its stop has sent its last
/// signal, so the stranger survives the stop.
#[tokio::test]
async fn a_stop_never_signals_a_stranger_that_reuses_the_group_id() {
    let Some((d, ns)) = daemon_in_pid_namespace() else {
        return;
    };
    let ns_init = ns.pid;
    // A TERM-ignoring top process with a TERM-ignoring child in its group.
    let pidfile = d.work_dir().join("child.pid");
    let script = format!(
        "trap '' TERM; sleep 1000 & echo $! > {}; wait",
        pidfile.display()
    );
    let (id, top) = start_process(&d, &script).await;
    let child: u32 = eventually(Duration::from_secs(10), "the child's pid", || {
        std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse().ok())
    });
    // TERM to the group (ignored by both), then up to 5 s of grace.
    assert_eq!(process_action(&d, &id, "stop", 0).await, 200);
    let stranger = spawn_stranger(ns_init, top);
    // The top process first, then its child (reaped by the namespace's init): the pid is free
    // as soon as the daemon no longer holds the top process unreaped.
    let killed = in_namespace(ns_init, &format!("kill -KILL {top} && kill -KILL {child}"))
        .status()
        .unwrap();
    assert!(killed.success());
    stranger_placed(stranger, top).await;
    let ended = eventually_async(Duration::from_secs(15), "the stop to finish", || async {
        let info = process_info(&d, &id).await;
        (info["status"] == "exited").then_some(info)
    })
    .await;
    assert_eq!(ended["exitSignal"], 9, "{ended}");
    stranger_survived_then_control(d, ns, top);
}

/// The daemon blocks its stop and reload signals in every thread (a signalfd reads them); what
/// it starts must not inherit that mask, or an agent would ignore the SIGTERM of its own stop.
#[tokio::test]
async fn agents_and_processes_start_with_no_signal_blocked() {
    let d = Daemon::start();
    let blocked = |pid: u32| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("SigBlk:"))
            .map(|v| v.trim().to_string())
            .unwrap()
    };
    let daemon_mask = blocked(d.pid());
    assert_ne!(
        u64::from_str_radix(&daemon_mask, 16).unwrap(),
        0,
        "the daemon's main thread blocks the stop signals"
    );
    let agent = start_agent(&d, "mask").await;
    assert_eq!(blocked(agent), "0000000000000000", "the agent");
    for tty in [false, true] {
        let created = d
            .post_json(
                "/v1/processes",
                &json!({"command": "sleep", "args": ["30"], "tty": tty}),
            )
            .await;
        let pid = created["pid"].as_u64().expect("a pid") as u32;
        assert_eq!(blocked(pid), "0000000000000000", "a process, tty {tty}");
    }
}
