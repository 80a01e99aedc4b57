//! Agents run as the agent user and cannot reach the daemon, through the real binary: warm-spawn
//! stubs an agent-user process can neither ptrace nor signal, a working directory entered as the
//! agent user on both spawn paths, the agent user's own HOME, and a warm pool that fills again
//! once its stubs can start.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{Daemon, children_of, eventually, is_idle_stub, is_root, skip};

/// Lets uid 65534 reach the daemon's directories (the work dir is a process's default cwd, the
/// data dir holds the agent user's HOME).
fn open_to_any_user(d: &Daemon) {
    for dir in [d.dir.path().to_path_buf(), d.work_dir(), d.data_dir()] {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
}

/// `POST /v1/processes/run`.
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

/// The daemon's idle warm-spawn stubs.
fn stubs_of(daemon: u32) -> Vec<u32> {
    children_of(daemon)
        .into_iter()
        .filter(|p| is_idle_stub(*p))
        .collect()
}

/// A daemon as root with `--agent-user nobody` and warm spawns; `None` (skipped) without root
/// or without cgroups (no cgroups, no warm spawns).
fn warm_daemon_as_nobody(extra: &[&str]) -> Option<(Daemon, Vec<u32>)> {
    if !is_root() {
        skip("needs root to switch the agent user");
        return None;
    }
    let d = Daemon::builder()
        .any_user_bin()
        .args(["--agent-user", "nobody", "--warm-spawns", "2"])
        .args(extra.iter().copied())
        .start();
    if !crate::supervisor::cgroup_controller_or_skip(&d, "pids") {
        return None;
    }
    open_to_any_user(&d);
    let stubs = eventually(Duration::from_secs(10), "two warm stubs", || {
        let s = stubs_of(d.pid());
        (s.len() == 2).then_some(s)
    });
    Some((d, stubs))
}

/// Run as the agent user: tries `PTRACE_ATTACH` and `kill(pid, 0)` on each pid; prints
/// `<pid> <ptrace errno> <kill errno>` per pid (0 = allowed).
const ATTACK: &str = r#"
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
for pid in map(int, sys.argv[1:]):
    ctypes.set_errno(0)
    r = libc.ptrace(16, pid, None, None)
    perr = 0 if r == 0 else ctypes.get_errno()
    if r == 0:
        os.waitpid(pid, getattr(os, "__WALL", 0x40000000))
        libc.ptrace(17, pid, None, None)
    try:
        os.kill(pid, 0)
        kerr = 0
    except PermissionError:
        kerr = 1
    print(pid, perr, kerr)
"#;

fn python() -> Option<&'static str> {
    // A system python the agent user can run (not a shim under /root).
    ["/usr/bin/python3", "/usr/local/bin/python3"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
}

#[tokio::test]
async fn no_agent_user_process_can_ptrace_or_signal_a_warm_stub() {
    let Some(py) = python() else {
        skip("no system python3 (.ci/install-00-base.sh installs it)");
        return;
    };
    let Some((d, stubs)) = warm_daemon_as_nobody(&[]) else {
        return;
    };
    // The control: a process of the agent user (a direct start: a terminal never takes a stub)
    // that the attack may trace, as ptrace between one user's processes is allowed here.
    let r = d
        .client()
        .post(d.url("/v1/processes"))
        .json(&json!({"command": "sleep", "args": ["30"], "tty": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let victim: Value = r.json().await.unwrap();
    let victim_pid = victim["pid"].as_u64().expect("pid") as u32;
    let mut args = vec!["-c".to_string(), ATTACK.to_string()];
    args.extend(stubs.iter().map(u32::to_string));
    args.push(victim_pid.to_string());
    // The attack itself takes one of the two stubs; the other is still idle while it runs.
    let (status, out) = run(&d, json!({"command": py, "args": args})).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["exitCode"], 0, "{out}");
    let text = out["stdout"].as_str().unwrap().to_string();
    let result = |pid: u32| -> (i64, i64) {
        let line = text
            .lines()
            .find(|l| l.split(' ').next() == Some(&pid.to_string()))
            .unwrap_or_else(|| panic!("no line for {pid}: {text}"));
        let f: Vec<i64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
        (f[1], f[2])
    };
    assert_eq!(result(victim_pid), (0, 0), "the control: {text}");
    let idle: Vec<u32> = stubs.iter().copied().filter(|p| is_idle_stub(*p)).collect();
    assert!(!idle.is_empty(), "a stub stayed idle during the attack");
    for pid in idle {
        // A stub waits as root, not as the agent user.
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
        assert_eq!(uid.split_whitespace().nth(1), Some("0"), "{uid}");
        // EPERM for the attach, and no permission to signal it either.
        assert_eq!(result(pid), (libc_eperm(), 1), "stub {pid}: {text}");
    }
}

fn libc_eperm() -> i64 {
    nix::errno::Errno::EPERM as i64
}

/// A 0700 root directory holding a 0755 subdirectory with a file in it: a path uid 65534
/// cannot reach, though the subdirectory itself would let it in.
fn unreachable_dir() -> (tempfile::TempDir, std::path::PathBuf) {
    let outer = tempfile::tempdir().unwrap();
    std::fs::set_permissions(outer.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let inner = outer.path().join("inner");
    std::fs::create_dir(&inner).unwrap();
    std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(inner.join("secret"), "root's").unwrap();
    std::fs::set_permissions(inner.join("secret"), std::fs::Permissions::from_mode(0o644)).unwrap();
    (outer, inner)
}

#[tokio::test]
async fn the_cwd_is_entered_as_the_agent_user_on_the_warm_and_the_direct_path() {
    let Some((d, _stubs)) = warm_daemon_as_nobody(&[]) else {
        return;
    };
    let (_outer, inner) = unreachable_dir();
    let inner = inner.to_str().unwrap();
    // Piped (from a warm stub) and terminal (always direct): both refuse the directory.
    let (status, out) = run(
        &d,
        json!({"command": "cat", "args": ["secret"], "cwd": inner}),
    )
    .await;
    assert!(status >= 400, "a run in {inner}: {status} {out}");
    assert!(
        out["detail"].as_str().unwrap_or("").contains("ermission"),
        "{out}"
    );
    let r = d
        .client()
        .post(d.url("/v1/processes"))
        .json(&json!({"command": "cat", "args": ["secret"], "cwd": inner, "tty": true}))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let body: Value = r.json().await.unwrap();
    assert!(status >= 400, "a terminal in {inner}: {status} {body}");
    assert!(
        body["detail"].as_str().unwrap_or("").contains("ermission"),
        "{body}"
    );
    // Directories the agent user may enter still work on both paths.
    let (status, out) = run(&d, json!({"command": "pwd", "cwd": "/tmp"})).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["stdout"], "/tmp\n", "{out}");
    let r = d
        .client()
        .post(d.url("/v1/processes"))
        .json(&json!({"command": "pwd", "cwd": "/tmp", "tty": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn an_agent_user_gets_its_own_home_not_the_daemons() {
    if !is_root() {
        skip("needs root to switch the agent user");
        return;
    }
    let d = Daemon::builder()
        .any_user_bin()
        .args(["--agent-user", "nobody"])
        .env("HOME", "/root")
        .start();
    open_to_any_user(&d);
    let (status, out) = run(
        &d,
        json!({"command": "sh", "args": ["-c", "echo \"$HOME\"; id -u; touch \"$HOME/x\" && echo writable"]}),
    )
    .await;
    assert_eq!(status, 200, "{out}");
    let text = out["stdout"].as_str().unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.get(1), Some(&"65534"), "{text}");
    assert_ne!(lines[0], "/root", "{text}");
    assert!(
        lines[0].starts_with(d.data_dir().to_str().unwrap()),
        "nobody's passwd home does not exist here, so its HOME is under the data dir: {text}"
    );
    assert_eq!(lines.get(2), Some(&"writable"), "{text}");
    let meta = std::fs::metadata(lines[0]).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o700);
    // `--agent-env HOME=…` still wins.
    drop(d);
    let d = Daemon::builder()
        .any_user_bin()
        .args(["--agent-user", "nobody", "--agent-env", "HOME=/tmp"])
        .start();
    open_to_any_user(&d);
    let (status, out) = run(
        &d,
        json!({"command": "sh", "args": ["-c", "echo \"$HOME\""]}),
    )
    .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["stdout"], "/tmp\n", "{out}");
}

#[tokio::test]
async fn a_warm_pool_whose_stubs_kept_failing_fills_again_once_they_can_start() {
    if !is_root() {
        skip("needs root for cgroups");
        return;
    }
    // A budget for all agents together far too small for any stub: every stub is OOM-killed as
    // it starts, many times in a row (it used to turn the pool off for the daemon's life).
    let d = Daemon::builder()
        .args(["--warm-spawns", "2", "--agents-memory-max", "1M"])
        .start();
    if !crate::supervisor::cgroup_controller_or_skip(&d, "memory") {
        return;
    }
    let log = d.stderr();
    let ready = log
        .lines()
        .find(|l| l.contains("agent cgroups ready"))
        .expect("cgroups ready")
        .to_string();
    let Some(dir) = ready
        .split('"')
        .find(|t| t.starts_with('/') && t.contains("memory"))
        .map(std::path::PathBuf::from)
    else {
        skip("the agents' cgroups have no memory hierarchy here");
        return;
    };
    let limit = dir.join("memory.limit_in_bytes");
    if !limit.exists() {
        skip("not a v1 memory hierarchy");
        return;
    }
    eventually(
        Duration::from_secs(30),
        "three stub failures in a row",
        || d.stderr().contains("stubs fail to start").then_some(()),
    );
    // Memory for the agents again: the pool must fill by itself, within its longest back-off.
    // (With swap accounting the memory+swap limit goes first: it may never be below the other.)
    let memsw = dir.join("memory.memsw.limit_in_bytes");
    if memsw.exists() {
        std::fs::write(&memsw, "-1").expect("lift the memory+swap budget");
    }
    std::fs::write(&limit, "-1").expect("lift the budget");
    eventually(Duration::from_secs(20), "the pool filled again", || {
        (stubs_of(d.pid()).len() == 2).then_some(())
    });
    // And starts take its stubs again (a stub seen may still be on its way into the pool, so
    // a start may take the direct path once); every run succeeds either way.
    crate::support::eventually_async(Duration::from_secs(10), "a run from a stub", || async {
        let stubs = stubs_of(d.pid());
        let (status, out) = run(
            &d,
            json!({"command": "sh", "args": ["-c", "echo $$"], "cwd": "/"}),
        )
        .await;
        assert_eq!(status, 200, "{out}");
        assert_eq!(out["exitCode"], 0, "{out}");
        let pid: u32 = out["stdout"].as_str().unwrap().trim().parse().unwrap();
        stubs.contains(&pid).then_some(())
    })
    .await;
}
