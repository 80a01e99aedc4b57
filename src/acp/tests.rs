//! The proxy in process: `AcpService` and `Connections` with real agent processes (small `sh -c`
//! agents from an agents file), each test a behaviour a client can observe through them.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use super::jsonrpc::parse_envelope;
use super::{AcpError, AcpService, Connections, Delivered, Next, ServerInfo, Status};
use crate::agents::Agents;
use crate::config::{AgentCgroups, Config};
use crate::supervisor::Supervisor;

pub(crate) struct Proxy {
    pub acp: Arc<AcpService>,
    pub connections: Arc<Connections>,
    pub supervisor: Arc<Supervisor>,
    _dir: tempfile::TempDir,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // Nothing a test started outlives it.
        self.supervisor.emergency_kill_all();
    }
}

/// A proxy whose agents file defines each `(id, shell script)` as a user agent running
/// `/bin/sh -c <script>`; `tweak` adjusts the configuration first.
pub(crate) fn proxy(agents: &[(&str, &str)], tweak: impl FnOnce(&mut Config)) -> Proxy {
    let dir = tempfile::tempdir().unwrap();
    let mut file = String::new();
    for (id, script) in agents {
        let program = if script.is_empty() {
            "/nonexistent/agent"
        } else {
            "/bin/sh"
        };
        file.push_str(&format!(
            "[[agent]]\nid = {id:?}\ncommand = {program:?}\nargs = [\"-c\", {script:?}]\n"
        ));
    }
    let path = dir.path().join("agents.toml");
    std::fs::write(&path, file).unwrap();
    let mut config = Config::defaults();
    config.agents_file = Some(path);
    config.data_dir = dir.path().join("data");
    config.work_dir = dir.path().to_path_buf();
    config.agent_base_env = vec![("PATH".into(), "/usr/bin:/bin".into())];
    config.warm_spawns = 0;
    config.agent_cgroups = AgentCgroups::Off;
    config.agent_grace = Duration::from_secs(2);
    tweak(&mut config);
    let config = Arc::new(config);
    let supervisor = Arc::new(Supervisor::new(&config));
    let agents = Arc::new(Agents::new(config.clone()).unwrap());
    let acp = Arc::new(AcpService::new(
        config.clone(),
        supervisor.clone(),
        agents.clone(),
        CancellationToken::new(),
    ));
    let connections = Arc::new(Connections::new(acp.clone(), agents, &config));
    Proxy {
        acp,
        connections,
        supervisor,
        _dir: dir,
    }
}

pub(crate) fn envelope(json: &str) -> super::Envelope {
    parse_envelope(Bytes::from(json.to_string())).unwrap()
}

fn notification() -> super::Envelope {
    envelope(r#"{"jsonrpc":"2.0","method":"x/ping"}"#)
}

async fn info(acp: &AcpService, server_id: &str) -> Option<ServerInfo> {
    acp.list()
        .await
        .into_iter()
        .find(|i| i.server_id == server_id)
}

/// Polls `check` until it gives a value, for at most `secs` seconds.
pub(crate) async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    secs: u64,
    what: &str,
    mut check: impl FnMut() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A client that subscribed while the agent was being prepared learns that the start failed
/// (its stream ends, its subscriber share comes back), and the serverId is free for a new start.
#[tokio::test]
async fn a_subscriber_of_a_failed_start_gets_its_end() {
    let p = proxy(&[("broken", ""), ("sh", "exec cat")], |_| {});
    p.acp.open("s1", Some("broken")).unwrap();
    let sub = p.acp.subscribe("s1", None).unwrap();
    let err = p
        .acp
        .post("s1", None, notification(), false)
        .await
        .err()
        .expect("the start fails");
    assert!(matches!(err, AcpError::Launch { .. }), "{err:?}");
    let next = tokio::time::timeout(Duration::from_secs(5), sub.next()).await;
    assert!(
        matches!(next, Ok(Next::End)),
        "the subscriber of a failed start was not ended"
    );
    drop(sub);
    assert!(p.acp.list().await.is_empty(), "the failed instance stayed");
    // A retry is a new instance: its subscriber sees its events.
    p.acp.open("s1", Some("sh")).unwrap();
    let sub = p.acp.subscribe("s1", None).unwrap();
    let echoed = r#"{"jsonrpc":"2.0","method":"x/echo"}"#;
    p.acp
        .post("s1", None, envelope(echoed), false)
        .await
        .unwrap();
    match tokio::time::timeout(Duration::from_secs(5), sub.next()).await {
        Ok(Next::Frames(f)) => assert!(String::from_utf8_lossy(&f).contains("x/echo"), "{f:?}"),
        _ => panic!("the new instance's subscriber got nothing"),
    }
}

/// An RFD connection whose subscription is refused (the global subscriber cap) leaves no
/// instance behind, so failed connects cannot use up `--max-agents`.
#[tokio::test]
async fn a_failed_connect_leaves_no_instance() {
    let p = proxy(&[("sh", "exec cat")], |c| {
        c.max_subscribers_total = 0;
        c.max_agents = 2;
    });
    for _ in 0..3 {
        let e = p.connections.create("sh", true).err().expect("refused");
        assert!(e.to_string().contains("subscribers"), "{e}");
    }
    assert!(
        p.acp.list().await.is_empty(),
        "a failed connect left its instance"
    );
    assert_eq!(p.connections.count(), 0);
    p.acp.open("plain", Some("sh")).unwrap();
}

/// A POST cancelled while it waits for room in a full stdin queue (its client went away) leaves
/// no pending id behind: `pendingRequests` counts exactly the requests that reached the queue.
#[tokio::test]
async fn a_request_cancelled_while_the_stdin_queue_is_full_leaves_no_pending_id() {
    // The agent never reads its stdin: the pipe fills, then the writer's queue.
    let p = proxy(&[("deaf", "exec sleep 1000")], |_| {});
    let pad = "x".repeat(1000);
    let mut accepted = 0;
    let mut cancelled = None;
    for i in 0..5000 {
        let env = envelope(&format!(
            r#"{{"jsonrpc":"2.0","id":{i},"method":"x/slow","params":{{"pad":"{pad}"}}}}"#
        ));
        let post = p.acp.post("s1", Some("deaf"), env, true);
        match tokio::time::timeout(Duration::from_millis(500), post).await {
            Ok(Ok(Delivered::Accepted)) => accepted += 1,
            Ok(other) => panic!("unexpected answer: {:?}", other.err()),
            Err(_) => {
                cancelled = Some(i);
                break;
            }
        }
    }
    let cancelled = cancelled.expect("the stdin queue never filled");
    let shown = info(&p.acp, "s1").await.unwrap();
    assert_eq!(
        shown.pending_requests, accepted,
        "request {cancelled} was cancelled before it reached the queue but stays pending"
    );
}

/// An agent that writes without ever ending its line: the line is counted as soon as it is over
/// `--max-line` (nothing buffered whole), and once the agent is killed it is never shown as
/// running with an exit.
#[tokio::test]
async fn an_agent_that_never_ends_its_line_is_counted_and_shown_exited() {
    let p = proxy(&[("yes", "yes | tr -d '\\n'")], |c| c.max_line = 64 << 10);
    p.acp
        .post("s1", Some("yes"), notification(), false)
        .await
        .unwrap();
    let pid = eventually(10, "the endless line to be counted", || async {
        info(&p.acp, "s1")
            .await
            .filter(|i| i.invalid_stdout_lines >= 1)
            .and_then(|i| i.pid)
    })
    .await;
    nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let shown = eventually(10, "the killed agent to be shown exited", || async {
        let i = info(&p.acp, "s1").await.unwrap();
        assert!(
            !(i.status == Status::Running && i.exit_reason.is_some()),
            "shown running with an exit: {i:?}"
        );
        (i.status == Status::Exited).then_some(i)
    })
    .await;
    assert!(shown.exit_reason.is_some(), "{shown:?}");
    assert_eq!(shown.signal, Some(9), "{shown:?}");
}

/// An agent that closes its stdout but lives on can no longer answer, yet it is `running` until
/// its stop has cleared it, and only then `exited`.
#[tokio::test]
async fn an_agent_that_closed_its_stdout_is_running_until_its_process_is_gone() {
    // Ignores SIGTERM, so it lives through the whole grace (2 s) after its stop begins.
    let p = proxy(&[("mute", "trap '' TERM; exec >&-; sleep 1000")], |_| {});
    p.acp
        .post("s1", Some("mute"), notification(), false)
        .await
        .unwrap();
    eventually(10, "the POSTs to be refused", || async {
        let r = p.acp.post("s1", None, notification(), false).await;
        matches!(r, Err(AcpError::AgentGone { .. })).then_some(())
    })
    .await;
    let shown = info(&p.acp, "s1").await.unwrap();
    assert_eq!(shown.status, Status::Running, "{shown:?}");
    assert!(shown.exit_reason.is_none(), "{shown:?}");
    let shown = eventually(15, "the agent to be stopped", || async {
        info(&p.acp, "s1")
            .await
            .filter(|i| i.status == Status::Exited)
    })
    .await;
    assert!(shown.exit_reason.is_some(), "{shown:?}");
}
