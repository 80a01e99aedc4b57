//! `ProcessService` in process, with real children (`/bin/sh -c`): what a client of the process
//! API observes, without HTTP in between.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{CreateRequest, ProcessError, ProcessService, RunRequest};
use crate::config::{AgentCgroups, Config};
use crate::supervisor::Supervisor;

struct Service {
    processes: ProcessService,
    supervisor: Arc<Supervisor>,
    _dir: tempfile::TempDir,
}

impl Drop for Service {
    fn drop(&mut self) {
        self.supervisor.emergency_kill_all();
    }
}

fn config_in(dir: &std::path::Path) -> Config {
    let mut config = Config::defaults();
    config.data_dir = dir.join("data");
    config.work_dir = dir.to_path_buf();
    config.agent_base_env = vec![("PATH".into(), "/usr/bin:/bin".into())];
    config.warm_spawns = 0;
    config.agent_cgroups = AgentCgroups::Off;
    config
}

fn service(tweak: impl FnOnce(&mut Config)) -> Service {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config_in(dir.path());
    tweak(&mut config);
    let supervisor = Arc::new(Supervisor::new(&config));
    let processes = ProcessService::new(&config, supervisor.clone(), CancellationToken::new());
    Service {
        processes,
        supervisor,
        _dir: dir,
    }
}

fn sh(script: &str) -> RunRequest {
    RunRequest {
        command: "/bin/sh".into(),
        args: vec!["-c".into(), script.into()],
        ..RunRequest::default()
    }
}

fn alive(pid: u32) -> bool {
    // A zombie is gone for our purpose (nothing runs), and only its parent could reap it.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

#[tokio::test]
async fn run_captures_both_streams_and_the_exit_code() {
    let s = service(|_| {});
    let r = s
        .processes
        .run(sh("echo out; echo err >&2; exit 3"))
        .await
        .unwrap();
    assert_eq!(r.exit_code, Some(3));
    assert!(!r.timed_out);
    assert_eq!(r.stdout, "out\n");
    assert_eq!(r.stderr, "err\n");
}

/// A run that outlives its timeout is killed with everything it started.
#[tokio::test]
async fn a_run_past_its_timeout_is_killed_with_its_children() {
    let s = service(|_| {});
    let mut req = sh("sleep 1000 & echo $!; wait");
    req.timeout_ms = Some(500);
    let r = s.processes.run(req).await.unwrap();
    assert!(r.timed_out, "{r:?}");
    let child: u32 = r.stdout.trim().parse().expect("the child's pid");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while alive(child) {
        assert!(
            std::time::Instant::now() < deadline,
            "the run's child {child} outlived it"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A background process holds its place under the running cap until it is gone; then the place
/// is free again.
#[tokio::test]
async fn a_process_counts_against_the_cap_until_it_is_gone() {
    let s = service(|c| c.process_max_concurrent = 1);
    let req = |script: &str| CreateRequest {
        command: "/bin/sh".into(),
        args: vec!["-c".into(), script.into()],
        cwd: None,
        env: Default::default(),
        tty: false,
        interactive: false,
        cols: None,
        rows: None,
    };
    let first = s.processes.create(req("exec sleep 1000")).await.unwrap();
    let refused = s.processes.create(req("exit 0")).await.err();
    assert!(
        matches!(refused, Some(ProcessError::TooManyProcesses { limit: 1 })),
        "{refused:?}"
    );
    let info = s
        .processes
        .kill(&first.id, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(info.exit_signal, Some(9), "{info:?}");
    let second = s.processes.create(req("exit 0")).await.unwrap();
    let (exit, _) = second.wait_ended().await;
    assert_eq!(exit.code, Some(0));
}

/// A hand-off written by a build that did not carry exited records still parses.
#[test]
fn a_hand_off_without_exited_records_parses() {
    let old = r#"{"next_id": 4, "next_run": 2, "processes": []}"#;
    let s: super::ProcessesState = serde_json::from_str(old).unwrap();
    assert_eq!(s.next_id, 4);
    assert!(s.exited.is_empty());
}
