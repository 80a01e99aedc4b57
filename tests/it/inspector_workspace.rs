//! The inspector's Changes and Ports tabs in headless Chromium (`ui/test/workspace-e2e.mjs`)
//! against the real daemon: a repository built here with a session whose `gitBase` the daemon
//! recorded, a commit and uncommitted changes after it; the tab shows the status and the patch
//! against HEAD, and, the session picked, against its base (the commit included). A real
//! `python3 -m http.server` is listed in the Ports tab, and its Preview link opens the app in a
//! browser context that has no token.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::json;

use crate::support::{self, Daemon, eventually_async, on_path};
use crate::workspace::git;

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn inspector_changes_and_ports_tabs_in_chromium() {
    let ui = Path::new(env!("CARGO_MANIFEST_DIR")).join("ui");
    if !on_path("node") || !ui.join("node_modules/playwright-core").exists() {
        return support::skip(
            "node or ui/node_modules/playwright-core is missing; run .ci/install-inspector.sh",
        );
    }
    if !Path::new("/usr/bin/chromium").exists() {
        return support::skip("/usr/bin/chromium is missing; run .ci/install-inspector.sh");
    }
    for tool in ["git", "python3"] {
        if !on_path(tool) {
            return support::skip(&format!("{tool} is missing; run .ci/install-workspace.sh"));
        }
    }
    let token = "workspace-e2e-token";
    let d = Daemon::builder().token(token).start();
    let repo = d.work_dir().join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("a.txt"), "one\ntwo\n").unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "first"]);
    let base = git(&repo, &["rev-parse", "HEAD"]);
    let repo_s = repo.display().to_string();

    // A session in the repository: its base is the first commit.
    let r = d
        .client()
        .post(d.url("/v1/acp/ui-gb?agent=mock"))
        .json(&json!({"jsonrpc":"2.0","id":1,"method":"session/new",
                      "params":{"cwd": repo_s,"mcpServers":[]}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // The agent commits a file, then leaves changes uncommitted.
    std::fs::write(repo.join("committed.txt"), "by the agent\n").unwrap();
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "agent"]);
    std::fs::write(repo.join("a.txt"), "one\nTWO\n").unwrap();
    std::fs::write(repo.join("new.txt"), "fresh\n").unwrap();

    // The app: a static server on a free port.
    let site = tempfile::tempdir().unwrap();
    std::fs::write(site.path().join("hello.txt"), "hello from the app\n").unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let _app = Kill(
        Command::new("python3")
            .args([
                "-m",
                "http.server",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
            ])
            .current_dir(site.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 starts"),
    );
    eventually_async(Duration::from_secs(20), "the app listed", || async {
        let v: serde_json::Value = d
            .client()
            .get(d.url("/v1/ports"))
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        v["ports"]
            .as_array()?
            .iter()
            .any(|p| p["port"] == port)
            .then_some(())
    })
    .await;

    let shots = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/ui-screenshots");
    let run = tokio::time::timeout(
        Duration::from_secs(150),
        tokio::process::Command::new("node")
            .arg("test/workspace-e2e.mjs")
            .arg(format!("http://{}", d.addr))
            .arg(token)
            .arg(&repo_s)
            .arg(&base)
            .arg(port.to_string())
            .arg(&shots)
            .current_dir(&ui)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("workspace-e2e.mjs finished in time")
    .expect("run node");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "workspace-e2e failed:\n{stdout}\n{stderr}"
    );
    let summary: serde_json::Value =
        serde_json::from_str(stdout.lines().last().unwrap_or("")).expect("a JSON summary");
    assert_eq!(
        summary["steps"],
        json!(["changes", "session", "ports", "preview"]),
        "{stdout}"
    );
}
