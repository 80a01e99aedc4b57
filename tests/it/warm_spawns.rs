//! Warm spawns (`--warm-spawns`): children started ahead in their own cgroups, each waiting in a
//! stub to exec the next process. A process started from a stub keeps every guarantee of a
//! supervised one (own session and group, own cgroup with its limits, clean environment); its
//! cgroup is removed after the exit is published; the pool refills; nothing of it (stubs, their
//! cgroups) survives the daemon's stop, and a SIGKILLed daemon's stubs end by themselves.

use std::path::PathBuf;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::{Value, json};

use crate::support::{Daemon, children_of, eventually, is_idle_stub, pid_alive, skip};

/// The daemon's stub children (`sandbox-agent spawn-stub <fd>`).
fn stubs_of(daemon: u32) -> Vec<u32> {
    children_of(daemon)
        .into_iter()
        .filter(|p| is_idle_stub(*p))
        .collect()
}

/// Where the v1 `pids` hierarchy shows the cgroup `path` (from `/proc/<pid>/cgroup`).
fn pids_dir(path: &str) -> Option<PathBuf> {
    v1_dir("pids", path)
}

/// Where the v1 hierarchy of `controller` shows the cgroup `path`.
fn v1_dir(controller: &str, path: &str) -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let left: Vec<&str> = left.split(' ').collect();
        let right: Vec<&str> = right.split(' ').collect();
        let v1 = right.first() == Some(&"cgroup")
            && right
                .get(2)
                .is_some_and(|o| o.split(',').any(|o| o == controller));
        if !v1 || left.len() < 5 {
            return None;
        }
        let rel = path.strip_prefix(left[3].trim_end_matches('/'))?;
        Some(PathBuf::from(left[4]).join(rel.trim_start_matches('/')))
    })
}

/// Skips unless the daemon put agents in a v1 `pids` hierarchy (root, cgroups writable).
fn pids_cgroups_or_skip(d: &Daemon) -> bool {
    if !crate::supervisor::cgroup_controller_or_skip(d, "pids") {
        return false;
    }
    if pids_dir("/").is_none() {
        skip("the daemon has no usable v1 `pids` cgroup hierarchy here");
        return false;
    }
    true
}

async fn run(d: &Daemon, body: Value) -> (u16, Value) {
    let r = d
        .client()
        .post(d.url("/v1/processes/run"))
        .json(&body)
        .send()
        .await
        .expect("run request");
    let status = r.status().as_u16();
    (status, r.json().await.expect("json body"))
}

fn wait_for_stubs(d: &Daemon, n: usize) -> Vec<u32> {
    eventually(Duration::from_secs(10), "warm stubs ready", || {
        let s = stubs_of(d.pid());
        (s.len() == n).then_some(s)
    })
}

#[tokio::test]
async fn a_run_starts_from_a_warm_stub_with_every_guarantee_and_leaves_nothing() {
    let mut d = Daemon::builder()
        .args(["--warm-spawns", "2", "--agent-pids-max", "77"])
        .start();
    if !pids_cgroups_or_skip(&d) {
        return;
    }
    let stubs = wait_for_stubs(&d, 2);

    // The pids hierarchy's mount point, for the script to read its own cgroup's limit.
    let mount = pids_dir("/").expect("pids mount");
    let script = "echo $$; cut -d' ' -f5,6 /proc/$$/stat; \
        cg=$(grep ':pids:' /proc/self/cgroup | cut -d: -f3); echo \"$cg\"; \
        cat \"$PIDS_MOUNT$cg/pids.max\"; \
        cpu=$(grep -E ':([a-z,]*,)?cpu(,[a-z,]*)?:' /proc/self/cgroup | cut -d: -f3); \
        cat \"$CPU_MOUNT$cpu/cpu.shares\" 2>/dev/null || echo none; env";
    // The cpu hierarchy's mount point: the stub started at the lowest CPU weight, the program
    // must run at the normal one.
    let cpu_mount = v1_dir("cpu", "/").unwrap_or_default();
    let (status, out) = run(
        &d,
        json!({"command": "sh", "args": ["-c", script],
               "env": {"PIDS_MOUNT": mount, "CPU_MOUNT": cpu_mount}}),
    )
    .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["exitCode"], 0, "{out}");
    let text = out["stdout"].as_str().expect("stdout");
    let mut lines = text.lines();
    let pid: u32 = lines.next().and_then(|l| l.parse().ok()).expect("pid");
    // The program is the stub itself, exec'd: its pid is one of the stubs'.
    assert!(stubs.contains(&pid), "pid {pid} is not a stub of {stubs:?}");
    // Its own session and process group.
    assert_eq!(
        lines.next(),
        Some(format!("{pid} {pid}").as_str()),
        "{text}"
    );
    // Its own cgroup beneath the daemon's, with the configured limit.
    let cgroup = lines.next().expect("pids cgroup line").to_string();
    assert!(cgroup.contains("/sandbox-agent/d"), "{cgroup}");
    assert_eq!(lines.next(), Some("77"), "{text}");
    let shares = lines.next().expect("cpu.shares line");
    assert!(
        shares == "1024" || shares == "none",
        "cpu.shares {shares}\n{text}"
    );
    let env: Vec<&str> = lines.collect();
    assert!(env.iter().any(|l| l.starts_with("PATH=")), "{env:?}");
    assert!(
        !env.iter()
            .any(|l| l.starts_with("SANDBOX_AGENT_") || l.starts_with("NOTIFY_SOCKET=")),
        "{env:?}"
    );

    // The cgroup is removed once the process has ended (after the answer, so soon, not at once).
    let dir = pids_dir(&cgroup).expect("pids dir");
    eventually(
        Duration::from_secs(5),
        "the ended run's cgroup removed",
        || (!dir.exists()).then_some(()),
    );

    // A program that cannot be exec'd fails as it does without stubs, and its cgroup goes too.
    let (status, bad) = run(&d, json!({"command": "no-such-program-warm-spawns"})).await;
    assert_eq!(status, 400, "{bad}");
    assert!(
        bad["detail"]
            .as_str()
            .is_some_and(|s| s.contains("No such file")),
        "{bad}"
    );

    // The pool refills with new stubs; the group of our daemon then holds exactly the stubs.
    let refilled = wait_for_stubs(&d, 2);
    let own = dir.parent().expect("the daemon's own cgroup").to_path_buf();
    eventually(
        Duration::from_secs(5),
        "only the stubs' cgroups left",
        || {
            let groups = std::fs::read_dir(&own)
                .ok()?
                .flatten()
                .filter(|e| e.path().is_dir())
                .count();
            (groups == stubs_of(d.pid()).len()).then_some(())
        },
    );

    // A graceful stop leaves no stub and no cgroup.
    assert_eq!(d.stop(Duration::from_secs(20)), 0);
    for p in refilled {
        assert!(!pid_alive(p), "stub {p} outlived the daemon");
    }
    assert!(!own.exists(), "{} left after the stop", own.display());
}

#[tokio::test]
async fn stubs_end_with_a_sigkilled_daemon_and_the_next_one_clears_their_cgroups() {
    let first = Daemon::builder()
        .args(["--warm-spawns", "3"])
        .expect_exit(None)
        .start();
    if !pids_cgroups_or_skip(&first) {
        return;
    }
    let stubs = wait_for_stubs(&first, 3);
    let cgroup = std::fs::read_to_string(format!("/proc/{}/cgroup", stubs[0])).expect("cgroup");
    let path = cgroup
        .lines()
        .find_map(|l| l.split_once(":pids:").map(|(_, p)| p.to_string()))
        .expect("pids line");
    let own = pids_dir(&path)
        .and_then(|d| d.parent().map(PathBuf::from))
        .expect("the daemon's own cgroup");
    assert!(own.exists());
    first.signal(Signal::SIGKILL);
    // Their control socket closed with the daemon: they exit by themselves.
    eventually(Duration::from_secs(5), "stubs gone with the daemon", || {
        stubs.iter().all(|p| !pid_alive(*p)).then_some(())
    });
    drop(first);
    // A start leaves alone an empty directory changed less than 10 s ago (a neighbour daemon
    // between creating and locking it); the dead daemon's is empty now, so let it age first.
    eventually(
        Duration::from_secs(20),
        "the dead daemon's cgroup 10 s old",
        || {
            let age = std::fs::metadata(&own)
                .ok()?
                .modified()
                .ok()?
                .elapsed()
                .ok()?;
            (age > Duration::from_secs(10)).then_some(())
        },
    );
    let second = Daemon::start();
    eventually(
        Duration::from_secs(15),
        "the dead daemon's cgroups cleared",
        || (!own.exists()).then_some(()),
    );
    drop(second);
}

#[tokio::test]
async fn a_stopped_stub_is_skipped_not_waited_on() {
    let d = Daemon::builder().args(["--warm-spawns", "2"]).start();
    if !pids_cgroups_or_skip(&d) {
        return;
    }
    let stubs = wait_for_stubs(&d, 2);
    // An agent of the same user could stop every stub; a start must not wait on them (the
    // launch would block for the whole stub timeout and then fail).
    for p in &stubs {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(*p as i32), Signal::SIGSTOP)
            .expect("SIGSTOP a stub");
    }
    eventually(Duration::from_secs(5), "the stubs stopped", || {
        stubs
            .iter()
            .all(|p| {
                std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|s| {
                    s.rsplit_once(')')
                        .is_some_and(|(_, r)| r.trim_start().starts_with('T'))
                })
            })
            .then_some(())
    });
    let started = std::time::Instant::now();
    let (status, out) = run(&d, json!({"command": "sh", "args": ["-c", "echo $$"]})).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["exitCode"], 0, "{out}");
    let pid: u32 = out["stdout"]
        .as_str()
        .and_then(|s| s.trim().parse().ok())
        .expect("pid");
    assert!(!stubs.contains(&pid), "a stopped stub ran the program");
    // Behavioural, not a speed claim: the stub timeout is 10 s, so a start that waited on a
    // stopped stub would take at least that long (and fail).
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the start waited on a stopped stub: {:?}",
        started.elapsed()
    );
    // The stopped stubs were discarded (killed and reaped).
    eventually(Duration::from_secs(10), "stopped stubs gone", || {
        stubs.iter().all(|p| !pid_alive(*p)).then_some(())
    });
}
