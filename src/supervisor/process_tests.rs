//! The supervisor against real processes (`sh`, `sleep`, `tail`): stops, escapees, self exits,
//! limits. Cgroup cases skip with a message where cgroups are not writable (not root).

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};

use super::*;

fn supervisor(tweak: impl FnOnce(&mut Config)) -> Arc<Supervisor> {
    let mut config = Config::defaults();
    config.agent_base_env = vec![("PATH".into(), "/usr/bin:/bin".into())];
    // A warm stub is the daemon binary (`/proc/self/exe`), which a unit-test binary is not:
    // these cases take the direct path; tests/it covers the warm one with the real binary.
    config.warm_spawns = 0;
    tweak(&mut config);
    Arc::new(Supervisor::new(&config))
}

fn sh(script: &str, id: &str) -> SpawnSpec {
    SpawnSpec {
        program: "/bin/sh".into(),
        args: vec!["-c".into(), script.into()],
        env: vec![("EXTRA".into(), "1".into())],
        cwd: std::env::temp_dir(),
        name: id.into(),
        agent: "sh".into(),
    }
}

/// The numbers the script prints on its first stdout line.
async fn first_line(p: &mut AgentProcess) -> Vec<i32> {
    let mut line = String::new();
    let mut reader = BufReader::new(&mut p.stdout);
    tokio::time::timeout(Duration::from_secs(5), reader.read_line(&mut line))
        .await
        .expect("script prints in time")
        .expect("read stdout");
    line.split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect()
}

fn alive(pid: i32) -> bool {
    // A zombie is not alive for our purposes: its reaper may be slow (init of the machine).
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

async fn gone_soon(pid: i32) -> bool {
    for _ in 0..200 {
        if !alive(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

async fn removed_soon(dir: &std::path::Path) -> bool {
    for _ in 0..200 {
        if !dir.exists() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test]
async fn stop_ends_the_group_gracefully_and_kills_a_setsid_escapee() {
    let sup = supervisor(|_| {});
    let mut p = sup
        .start(sh(
            "setsid sleep 1000 </dev/null >/dev/null 2>&1 & echo $! $$; exec sleep 1000",
            "escapee",
        ))
        .await
        .expect("spawn");
    let pids = first_line(&mut p).await;
    let escapee = pids[0];
    assert!(alive(escapee));
    let info = p.handle.stop(Duration::from_secs(5)).await;
    assert_eq!(info.reason, ExitReason::Graceful, "{info:?}");
    assert_eq!(info.signal, Some(libc::SIGTERM));
    if sup.cgroups_enabled() {
        assert!(
            gone_soon(escapee).await,
            "escapee {escapee} survived the stop"
        );
        // The cgroup is removed after the exit is published (deferred, tracked).
        let dir = p.handle.cgroup_path().expect("a cgroup").to_path_buf();
        assert!(removed_soon(&dir).await, "{} left behind", dir.display());
    } else {
        eprintln!("SKIPPED (escapee part): cgroups are not writable here");
        let _ = nix::sys::signal::kill(Pid::from_raw(escapee), Signal::SIGKILL);
    }
    // Idempotent, and the same answer for every caller.
    assert_eq!(p.handle.stop(Duration::from_secs(1)).await, info);
    assert_eq!(p.handle.exit(), Some(info));
}

#[tokio::test]
async fn a_process_ignoring_term_is_killed_after_the_grace_period() {
    let sup = supervisor(|_| {});
    let mut p = sup
        .start(sh(
            "trap '' TERM; echo $$; while :; do sleep 0.05; done",
            "ignore-term",
        ))
        .await
        .expect("spawn");
    let top = first_line(&mut p).await[0];
    let started = std::time::Instant::now();
    let info = p.handle.stop(Duration::from_millis(300)).await;
    assert_eq!(info.reason, ExitReason::Forced, "{info:?}");
    assert_eq!(info.signal, Some(libc::SIGKILL));
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(!alive(top));
}

#[tokio::test]
async fn a_self_exit_is_reported_and_its_children_are_cleared() {
    let sup = supervisor(|_| {});
    let mut p = sup
        .start(sh(
            "sleep 1000 & echo $!; echo 'last words' >&2; exit 3",
            "self-exit",
        ))
        .await
        .expect("spawn");
    let child = first_line(&mut p).await[0];
    let info = p.handle.wait().await;
    assert_eq!(
        info,
        ExitInfo {
            reason: ExitReason::Exited,
            code: Some(3),
            signal: None
        }
    );
    assert!(gone_soon(child).await, "child {child} outlived its agent");
    assert!(p.handle.stderr_tail().contains("last words"));
    assert!(
        !sup.live().iter().any(|h| h.pid() == p.handle.pid()),
        "ended agents leave the registry"
    );
}

#[tokio::test]
async fn a_crash_by_signal_is_crashed() {
    let sup = supervisor(|_| {});
    let p = sup
        .start(sh("kill -SEGV $$", "crash"))
        .await
        .expect("spawn");
    let info = p.handle.wait().await;
    assert_eq!(info.reason, ExitReason::Crashed);
    assert_eq!(info.signal, Some(libc::SIGSEGV));
}

#[tokio::test]
async fn environment_is_the_clean_base_plus_the_spec() {
    let sup = supervisor(|c| c.agent_env = vec![("FROM_CONFIG".into(), "yes".into())]);
    let mut p = sup
        .start(sh(
            "echo $(env | grep -v -e '^PWD=' -e '^SHLVL=' -e '^_=' | sort | tr '\\n' ' ')",
            "env",
        ))
        .await
        .expect("spawn");
    let mut line = String::new();
    BufReader::new(&mut p.stdout)
        .read_line(&mut line)
        .await
        .expect("read");
    assert_eq!(line.trim(), "EXTRA=1 FROM_CONFIG=yes PATH=/usr/bin:/bin");
    p.handle.wait().await;
}

#[tokio::test]
async fn figures_count_every_process_of_the_agent() {
    let sup = supervisor(|_| {});
    let mut p = sup
        .start(sh("sleep 1000 & sleep 1000 & echo go; wait", "stats"))
        .await
        .expect("spawn");
    first_line(&mut p).await;
    let stats = p.handle.stats();
    assert_eq!(stats.processes, 3, "{stats:?}");
    assert!(stats.rss_bytes > 0 && stats.open_fds >= 3, "{stats:?}");
    p.handle.stop(Duration::from_secs(2)).await;
    assert_eq!(p.handle.stats().processes, 0);
}

#[tokio::test]
async fn the_pids_limit_caps_a_fork_loop() {
    let sup = supervisor(|c| c.agent_pids_max = Some(5));
    if !sup.cgroups_enabled() {
        eprintln!("SKIPPED: cgroups are not writable here");
        return;
    }
    let mut p = sup
        .start(sh(
            "n=0; for i in $(seq 20); do sleep 1000 & n=$((n+1)); done 2>/dev/null; echo $(jobs -p | wc -l)",
            "pids",
        ))
        .await
        .expect("spawn");
    first_line(&mut p).await;
    let stats = p.handle.stats();
    assert!(stats.processes <= 5, "{stats:?}");
    p.handle.stop(Duration::from_secs(2)).await;
}

#[tokio::test]
async fn a_memory_hog_is_reported_as_oom() {
    let sup = supervisor(|c| c.agent_memory_max = Some(32 << 20));
    if !sup.cgroups_enabled() {
        eprintln!("SKIPPED: cgroups are not writable here");
        return;
    }
    // tail buffers a line that never ends: it grows until the limit stops it.
    let p = sup
        .start(sh("exec tail /dev/zero", "oom"))
        .await
        .expect("spawn");
    let info = tokio::time::timeout(Duration::from_secs(30), p.handle.wait())
        .await
        .expect("the hog is stopped by the limit");
    assert_eq!(info.reason, ExitReason::Oom, "{info:?}");
    assert_eq!(info.signal, Some(libc::SIGKILL));
}

#[tokio::test]
async fn stop_all_stops_every_agent_in_parallel() {
    let sup = supervisor(|_| {});
    let mut handles = Vec::new();
    for i in 0..5 {
        let mut p = sup
            .start(sh("trap '' TERM; echo 1; sleep 1000", &format!("all-{i}")))
            .await
            .expect("spawn");
        first_line(&mut p).await;
        handles.push(p.handle);
    }
    let started = std::time::Instant::now();
    sup.stop_all(Instant::now() + Duration::from_secs(1)).await;
    // Five agents ignoring TERM: one grace period, not five.
    assert!(started.elapsed() < Duration::from_secs(3));
    for h in handles {
        assert_eq!(h.exit().map(|i| i.reason), Some(ExitReason::Forced));
        // Removal is deferred past the exit, but `stop_all` waits for it: nothing is left the
        // moment it returns, the daemon's own directories included.
        if let Some(dir) = h.cgroup_path() {
            assert!(!dir.exists(), "{} left after stop_all", dir.display());
        }
    }
    for dir in sup.cgroups.own_dirs() {
        assert!(!dir.exists(), "{} left after stop_all", dir.display());
    }
}

#[tokio::test]
async fn spawn_failures_name_their_cause_and_leave_no_cgroup() {
    let sup = supervisor(|_| {});
    let mut spec = sh("true", "bad-cwd");
    spec.cwd = "/nonexistent/sandbox-agent-test".into();
    let start_error = async |spec| {
        sup.start(spec)
            .await
            .err()
            .expect("spawn fails")
            .to_string()
    };
    let err = start_error(spec).await;
    assert!(err.contains("working directory"), "{err}");
    let mut spec = sh("true", "bad-program");
    spec.program = "/nonexistent/agent".into();
    let err = start_error(spec).await;
    assert!(err.contains("/nonexistent/agent"), "{err}");
    assert!(sup.live().is_empty());
    for dir in sup.cgroups.own_dirs() {
        let agents: Vec<_> = std::fs::read_dir(&dir)
            .expect("own cgroup dir")
            .flatten()
            .filter(|e| e.path().is_dir())
            .collect();
        assert!(
            agents.is_empty(),
            "cgroups left in {}: {agents:?}",
            dir.display()
        );
    }
}

/// The start runs on the blocking pool; a caller that goes away before taking the child (a
/// client that disconnects mid-start) leaves nothing behind: the child is killed and reaped.
#[tokio::test]
async fn a_start_whose_caller_went_away_is_killed() {
    let sup = supervisor(|_| {});
    let dir = tempfile::tempdir().expect("tempdir");
    let started = dir.path().join("started");
    let script = format!("echo $$ > '{}'; exec sleep 1000", started.display());
    let mut fut = Box::pin(sup.start(sh(&script, "abandoned")));
    // One poll hands the start to the blocking pool…
    assert!(
        futures_util::poll!(&mut fut).is_pending(),
        "a start completed within its first poll"
    );
    // …which goes on without the caller: the child runs (and says its pid) while nobody polls.
    let mut pid = None;
    for _ in 0..500 {
        pid = std::fs::read_to_string(&started)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok());
        if pid.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let pid = pid.expect("the start ran on the blocking pool");
    assert!(alive(pid));
    // The caller goes away without taking it: the child is killed, reaped, and unregistered.
    drop(fut);
    assert!(gone_soon(pid).await, "the abandoned child {pid} runs on");
    let left = sup.live_after(Duration::from_secs(5)).await;
    assert!(left.is_empty(), "an abandoned start left agents: {left:?}");
}
