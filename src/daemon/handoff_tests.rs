//! What a reload carries of the services, written and read back through the hand-off's real
//! wire format (a memfd, as `reload.rs` writes it). These tests live with the daemon because the
//! format is the daemon's: the services below it never import `daemon/`.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::config::{AgentCgroups, Config};
use crate::processes::{CreateRequest, ProcessError, ProcessService};
use crate::supervisor::Supervisor;

/// Kills whatever the test's supervisor still runs when the test ends, even on a failure.
struct Killer(Arc<Supervisor>);

impl Drop for Killer {
    fn drop(&mut self) {
        self.0.emergency_kill_all();
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

fn sh_create(script: &str) -> CreateRequest {
    CreateRequest {
        command: "/bin/sh".into(),
        args: vec!["-c".into(), script.into()],
        ..CreateRequest::default()
    }
}

/// A record recovered from the state dir (it has no process) is carried by a reload's hand-off
/// like any exited record: same id, exit and log offsets, and it can be deleted after.
#[tokio::test]
async fn a_record_recovered_from_the_state_dir_is_carried_by_a_reload() {
    use crate::state::StateStore;
    let dir = tempfile::tempdir().unwrap();
    let config = config_in(dir.path());
    let s = Killer(Arc::new(Supervisor::new(&config)));
    let state = dir.path().join("state");
    let (store, recovered) = StateStore::open(&config, &state).unwrap();
    let a = ProcessService::new(&config, s.0.clone(), CancellationToken::new())
        .with_state(store.clone(), recovered.processes);
    let p = a
        .create(sh_create("echo out; echo err >&2; exit 3"))
        .await
        .unwrap();
    let id = p.id.clone();
    p.wait_ended().await;
    assert!(store.flush_blocking(Duration::from_secs(10)));

    // The next start reads it back: an exited record with no process. The first store lets
    // go of the dir's lock once nothing holds it any more.
    drop((p, a, store));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let (store2, recovered) = loop {
        match StateStore::open(&config, &state) {
            Ok(s) => break s,
            Err(crate::state::StateError::Locked { .. })
                if std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    let b = ProcessService::new(&config, s.0.clone(), CancellationToken::new())
        .with_state(store2, recovered.processes);
    let before = b.get(&id).unwrap().info().await;
    let log_before = b.logs(&id, None, None, None).unwrap();
    assert_eq!(before.exit_code, Some(3));
    assert!(log_before.end > 0);

    // Its hand-off, through the memfd as the reload writes it, into an image without a state dir.
    let mut keep = Vec::new();
    let handoff = b.export(&mut keep).await.unwrap();
    assert!(keep.is_empty() && handoff.processes.is_empty());
    assert_eq!(handoff.exited.len(), 1);
    let handoff = super::reload::processes_through_a_memfd(handoff);
    let c = ProcessService::new(&config, s.0.clone(), CancellationToken::new());
    c.adopt(&handoff, &mut |_| unreachable!("no descriptor to take"));
    let after = c.get(&id).unwrap().info().await;
    assert_eq!(after, before);
    let log_after = c.logs(&id, None, None, None).unwrap();
    assert_eq!(log_after.end, log_before.end);
    let pairs = |l: &crate::processes::Logs| -> Vec<(u64, bytes::Bytes)> {
        l.chunks.iter().map(|c| (c.start, c.data.clone())).collect()
    };
    assert_eq!(pairs(&log_after), pairs(&log_before));
    c.delete(&id).unwrap();
    assert!(matches!(c.get(&id), Err(ProcessError::NotFound { .. })));
    // A new process after it does not reuse its id.
    let fresh = c.create(sh_create("exit 0")).await.unwrap();
    assert_ne!(fresh.id, id);
    fresh.wait_ended().await;
}
