//! The Python SDK (`sdks/python`, docs/sdk-python.md) and what the daemon offers it:
//! `--ready-fd` (how `start_local` learns the address of a daemon started on port 0), then the
//! SDK's pytest suite run against this build's binary (skips — and fails under
//! `SANDBOX_AGENT_TESTS_STRICT=1` — when the venv that `.ci/install-python-sdk.sh` makes is
//! missing).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{BIN, Daemon, eventually, http};

/// `--ready-fd 3` (here a file the wrapper opened as descriptor 3): one JSON line naming the
/// address the daemon listens on, and the descriptor is closed afterwards (neither kept by the
/// daemon nor handed to the agents it starts).
#[tokio::test]
async fn ready_fd_gets_one_json_line_with_the_bound_address_then_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ready");
    let d = Daemon::builder()
        .wrapper(["sh", "-c", "exec 3>\"$READY_FILE\"; exec \"$@\"", "sh"])
        .env("READY_FILE", &file)
        .args(["--ready-fd", "3"])
        .start();
    let line = eventually(Duration::from_secs(10), "the ready line", || {
        let s = std::fs::read_to_string(&file).ok()?;
        s.ends_with('\n').then_some(s)
    });
    assert_eq!(line.lines().count(), 1, "{line:?}");
    let v: serde_json::Value = serde_json::from_str(line.trim()).expect("one JSON object");
    let url = v["url"].as_str().unwrap();
    assert_eq!(url, format!("http://{}", d.addr));
    assert_eq!(v["host"], "127.0.0.1");
    assert_eq!(
        v["port"].as_u64().unwrap(),
        d.addr.rsplit(':').next().unwrap().parse::<u64>().unwrap()
    );
    assert_eq!(v["pid"].as_u64().unwrap(), u64::from(d.pid()));
    let health = http().get(format!("{url}/v1/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    // Closed once written: the daemon's descriptor 3 is something else or nothing.
    let fd3 = format!("/proc/{}/fd/3", d.pid());
    eventually(
        Duration::from_secs(10),
        "descriptor 3 closed",
        || match std::fs::read_link(&fd3) {
            Ok(target) if target == file => None,
            _ => Some(()),
        },
    );
}

/// A `--ready-fd` the daemon did not inherit is a usage error (78) at start, never a write
/// into whatever the number later names.
#[test]
fn ready_fd_that_is_not_open_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(BIN)
        .args([
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--ready-fd",
            "57",
        ])
        .arg("--data-dir")
        .arg(dir.path())
        .env_remove("SANDBOX_AGENT_TOKEN")
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the daemon did not refuse --ready-fd 57"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    use std::io::Read as _;
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(78), "{err}");
    assert!(err.contains("--ready-fd 57"), "{err}");

    // A flag only: a config file cannot name a descriptor of the process that starts the daemon.
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "ready_fd = 3\n").unwrap();
    let out = Command::new(BIN)
        .args(["server", "--host", "127.0.0.1", "--port", "0", "--config"])
        .arg(&file)
        .arg("--data-dir")
        .arg(dir.path())
        .env_remove("SANDBOX_AGENT_TOKEN")
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(err.contains("unknown key `ready_fd`"), "{err}");
    assert!(!err.contains("did you mean `ready_fd`"), "{err}");
}

/// The whole pytest suite takes ~2 min here (packaging included); bounded generously.
const SUITE_TIMEOUT: Duration = Duration::from_secs(900);

#[test]
fn python_sdk_pytest_passes_against_this_daemon() {
    use std::os::unix::process::CommandExt as _;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("sdks/python");
    let python = dir.join(".venv/bin/python");
    if !python.exists() {
        crate::support::skip("sdks/python/.venv is missing (.ci/install-python-sdk.sh makes it)");
        return;
    }
    let log = std::env::temp_dir().join(format!("python-sdk-pytest-{}.log", std::process::id()));
    let out = std::fs::File::create(&log).expect("log file");
    let mut child = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .current_dir(&dir)
        .env("SANDBOX_AGENT_BIN", BIN)
        .env_remove("SANDBOX_AGENT_TOKEN")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("log file"))
        .stderr(out)
        .process_group(0)
        .spawn()
        .expect("pytest starts");
    let deadline = Instant::now() + SUITE_TIMEOUT;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for pytest") {
            break Some(s);
        }
        if Instant::now() > deadline {
            // pytest and the daemons it started share the process group: end them all.
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let output = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    match status {
        Some(s) if s.success() => {
            assert!(
                output.contains(" passed")
                    && !output.contains(" failed")
                    && !output.contains(" skipped"),
                "pytest succeeded but its summary is not all passed?\n{output}"
            );
        }
        Some(s) => panic!("pytest failed ({s}):\n{output}"),
        None => panic!("pytest did not finish within {SUITE_TIMEOUT:?}:\n{output}"),
    }
}
