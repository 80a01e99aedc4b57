//! OpenCode's TUI attaches to the daemon: `opencode attach URL -p TOKEN` runs in a
//! pseudo-terminal (driven by tests/opencode/tui_attach.py), draws its prompt box with the
//! daemon's provider and model, loads what it needs from `/opencode/*` (its event stream and the
//! session list among them), and a prompt typed into it becomes a session whose turn the mock
//! answers; the TUI ends on SIGTERM and leaves no process behind.

use std::process::{Command, Stdio};

use serde_json::Value;

use crate::opencode::{TOKEN, call, opencode_dir, text_of};
use crate::support::{Daemon, on_path, skip};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_tui_attaches_with_the_token_and_runs_a_turn() {
    let Some(dir) = opencode_dir() else { return };
    if !on_path("python3") {
        skip("python3 is not installed (.ci/install-00-base.sh installs it)");
        return;
    }
    let d = Daemon::builder().token(TOKEN).arg("--access-log").start();
    let home = tempfile::tempdir().unwrap();
    let prompt = "typed-into-the-opencode-tui";
    let out = {
        let (dir, url, home) = (dir.clone(), d.url("/opencode"), home.path().to_path_buf());
        tokio::task::spawn_blocking(move || {
            Command::new("python3")
                .arg(dir.join("tui_attach.py"))
                .arg("--opencode")
                .arg(dir.join("node_modules/opencode-linux-x64/bin/opencode"))
                .args(["--url", &url, "--password", TOKEN, "--prompt", prompt])
                .arg("--home")
                .arg(&home)
                .args(["--seconds", "90"])
                .stdin(Stdio::null())
                .output()
                .expect("python3 runs the driver")
        })
        .await
        .unwrap()
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "the driver said ({e}):\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let screen = report["screen"].as_str().unwrap_or_default();
    assert_eq!(report["drawn"], true, "the TUI never drew:\n{screen}");
    assert!(
        screen.contains("Mock"),
        "the TUI shows the daemon's model:\n{screen}"
    );
    assert_eq!(report["replied"], true, "no reply drawn:\n{screen}");
    // Ended by SIGTERM, on its own, with nothing of it left.
    assert_eq!(report["killed"], false, "{report}");
    assert!(report["exit"].is_u64(), "{report}");
    assert_eq!(report["leftovers"], serde_json::json!([]), "{report}");

    // What it asked the daemon, with the token as its password.
    let log = d.stderr();
    for (method, path) in [
        ("GET", "/opencode/global/event"),
        ("GET", "/opencode/session"),
        ("GET", "/opencode/config/providers"),
        ("POST", "/opencode/session"),
    ] {
        assert!(
            log.contains(&format!("method={method} path=\"{path}\" status=200")),
            "no {method} {path} answered 200 in the daemon's log:\n{log}"
        );
    }
    assert!(!log.contains("status=401"), "{log}");

    // The prompt it sent is a session of ours, its turn answered by the mock.
    let (_, list) = call(&d, "GET", "/session", None).await;
    let list = list.as_array().expect("sessions").clone();
    assert_eq!(list.len(), 1, "{list:?}");
    let s = list[0]["id"].as_str().unwrap();
    let (_, msgs) = call(&d, "GET", &format!("/session/{s}/message"), None).await;
    let msgs = msgs.as_array().expect("messages").clone();
    assert_eq!(msgs.len(), 2, "{msgs:?}");
    assert_eq!(text_of(&msgs[0]), prompt);
    assert_eq!(msgs[1]["info"]["role"], "assistant");
    assert!(
        msgs[1]["info"]["time"]["completed"].is_u64(),
        "{:?}",
        msgs[1]
    );
    assert_eq!(text_of(&msgs[1]), prompt);
}
